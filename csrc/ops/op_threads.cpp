#include "ops/op_threads.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

namespace vitfast {
namespace ops {

namespace {
thread_local bool serial_ops = false;
}  // namespace

int64_t parallel_block_macs_scale() {
  // The OpenMP runtime reads its wait policy at start; read it the same way, once: OMP_WAIT_POLICY=PASSIVE, or
  // libgomp's GOMP_SPINCOUNT=0 (no spinning under any policy).
  static const int64_t scale = [] {
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    if (spin != nullptr && std::string(spin) == "0") return int64_t(8);
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    if (policy == nullptr) return int64_t(1);
    std::string v(policy);
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
    return v == "passive" ? int64_t(8) : int64_t(1);
  }();
  return scale;
}

int64_t op_threads() { return serial_ops ? int64_t(1) : std::max<int64_t>(1, at::get_num_threads()); }

SerialOps::SerialOps(bool on) : previous_(serial_ops) { serial_ops = previous_ || on; }

SerialOps::~SerialOps() { serial_ops = previous_; }

}  // namespace ops
}  // namespace vitfast
