#include "ops/op_threads.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace vitfast {
namespace ops {

namespace {
thread_local bool serial_ops = false;
}  // namespace

int64_t op_threads() { return serial_ops ? int64_t(1) : std::max<int64_t>(1, at::get_num_threads()); }

SerialOps::SerialOps(bool on) : previous_(serial_ops) { serial_ops = previous_ || on; }

SerialOps::~SerialOps() { serial_ops = previous_; }

}  // namespace ops
}  // namespace vitfast
