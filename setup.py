"""Build vitfast: the Python package, `vitfast.kernels` (Triton, from top-level `kernels/`) and the CPU
extension `vitfast._C` (C++ from `csrc/`).

Install torch first, then `pip install --no-build-isolation -e .` (an isolated build would pull a second torch).

CPU code paths: the scalar path is always compiled; on x86-64 the AVX2/FMA files enable those ISAs per
function (`#pragma GCC target` inside the file) and are chosen at run time with cpuid + XGETBV, so the
binary runs on any x86-64; on aarch64 the NEON files are compiled (NEON is baseline there).  Never
`-march=native`.
"""
import glob
import os
import platform
import sys

from setuptools import find_packages, setup

from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def cpu_sources():
    machine = platform.machine().lower()
    sources = _rel(glob.glob(os.path.join(ROOT, "csrc", "kernels", "*.cpp")))
    if machine in ("x86_64", "amd64", "i686", "x86"):
        sources += _rel(glob.glob(os.path.join(ROOT, "csrc", "kernels", "x86", "*.cpp")))
    elif machine in ("aarch64", "arm64"):
        sources += _rel(glob.glob(os.path.join(ROOT, "csrc", "kernels", "arm", "*.cpp")))
    sources += _rel(glob.glob(os.path.join(ROOT, "csrc", "ops", "*.cpp")))
    sources.append(os.path.join("csrc", "module.cpp"))
    return sources


# at::parallel_for is an inline template: with torch's OpenMP backend its `#pragma omp parallel` is compiled
# into *our* object files, so without -fopenmp the CPU ops silently run on one thread.  Linking -fopenmp
# resolves to the libgomp.so.1 torch has already loaded (same soname), so there is one OpenMP runtime and
# torch.set_num_threads applies to our kernels too.
OPENMP_FLAGS = ["-fopenmp"] if sys.platform.startswith("linux") else []

# Link the shared C++ runtime libtorch itself uses (soname libstdc++.so.6), by name and after our objects.  A
# toolchain whose driver links libstdc++ statically (seen: the GPU machine's /opt/gcc g++ 13 wrapper, its
# default CXX) otherwise puts a second copy of the runtime inside _C.so; any error message with a number in it
# (c10::str → ostringstream → locale facets of the wrong copy) then segfaults instead of raising ValueError.
# A plain `-lstdc++` is not enough there: that driver finds only libstdc++.a first.
SHARED_CXX_RUNTIME = ["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else []

ext_modules = [
    CppExtension(
        name="vitfast._C",
        sources=cpu_sources(),
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args=["-O3", "-fno-math-errno", "-Wall", "-Wno-unused-function"] + OPENMP_FLAGS,
        extra_link_args=OPENMP_FLAGS + SHARED_CXX_RUNTIME,
    )
]

setup(
    name="vitfast",
    version="0.1.0",
    description="Structurally reparameterized Vision Transformers on fused CPU (C++) and GPU (Triton) kernels",
    # every subpackage (ops, reference, nn, methods.*, io, training, cli, demos), plus the Triton kernels
    packages=find_packages(include=["vitfast", "vitfast.*"]) + ["vitfast.kernels"],
    package_dir={"vitfast": "vitfast", "vitfast.kernels": "kernels"},
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.4",
        "numpy",
        "timm>=1.0.29",  # checked: 1.0.29 and 1.0.31; 1.0.20 lacks device= in LayerScale, 1.0.15 timm.layers.attention
        "safetensors>=0.4",
        "tqdm",
        "scikit-learn",
    ],
    extras_require={
        "test": ["pytest", "pytest-benchmark"],
        "bench": ["onnx", "onnxruntime", "onnxscript", "matplotlib"],
    },
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={"console_scripts": ["vitfast=vitfast.cli:main"]},
    zip_safe=False,
)
