// The Python module `vitfast._C`.  Importing it loads this shared object, which registers the CPU kernels
// (TORCH_LIBRARY_IMPL blocks in csrc/ops/*.cpp) with the dispatcher; the schemas live in vitfast/ops.py.
#include <torch/extension.h>

#include "kernels/cpu_features.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "vitfast CPU kernels (registered under torch.ops.vitfast)";
  m.def("cpu_isa", []() { return std::string(vitfast::cpu_isa_name(vitfast::active_cpu_isa())); },
        "The CPU code path chosen at run time: 'avx2', 'neon' or 'scalar' (override: VITFAST_CPU_ISA).");
}
