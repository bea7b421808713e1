"""Build vitfast: the Python package, `vitfast.kernels` (Triton, from top-level `kernels/`) and the CPU
extension `vitfast._C` (C++ from `csrc/`).  The metadata (name, version, dependencies, extras) is in
pyproject.toml; this file only says what to compile and how.

Install torch first, then `pip install --no-build-isolation .` (`-e .` for development): the extension is compiled
against that torch.  Wheels get no debug info (0.7 MB instead of 28 MB); editable builds keep it for gdb.  Next to
the extension the build writes vitfast/ops/_torch_build.py, the torch it was compiled against, which
vitfast/ops/_extension.py compares with the running torch before loading it.

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

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    # pip's default isolated build environment has no torch: one line saying what to run, not a traceback.
    sys.exit("vitfast: install torch first, then build with `pip install --no-build-isolation .` (the C++ extension "
             "is compiled against the installed torch; an isolated build environment has none)")

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


def _torch_build_record() -> str:
    return (
        '"""The torch vitfast._C was compiled against (written by setup.py; vitfast/ops/_extension.py reads it)."""\n'
        f"TORCH_VERSION = {str(torch.__version__)!r}\n"
        f"CXX11_ABI = {bool(torch._C._GLIBCXX_USE_CXX11_ABI)!r}\n"
    )


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension, plus: no debug info in wheels, and the torch-version record next to the extension."""

    in_source_tree = False

    def build_extensions(self):
        if not self.in_source_tree:
            # -g comes from Python's own CFLAGS; debug info is 97% of the file and useless to a wheel's user.
            for ext in self.extensions:
                ext.extra_compile_args = list(ext.extra_compile_args) + ["-g0"]
                ext.extra_link_args = list(ext.extra_link_args) + ["-Wl,--strip-debug"]
        super().build_extensions()

    def run(self):
        # Editable installs (-e: editable_mode sets inplace) put _C.so into vitfast/; setuptools clears `inplace`
        # while it compiles, so read it here.
        self.in_source_tree = bool(self.inplace)
        super().run()
        package_dir = os.path.join(ROOT if self.in_source_tree else self.build_lib, "vitfast")
        with open(os.path.join(package_dir, "ops", "_torch_build.py"), "w") as f:
            f.write(_torch_build_record())


setup(
    # every subpackage (ops, reference, nn, methods.*, io, training, cli, demos), plus the Triton kernels
    packages=find_packages(include=["vitfast", "vitfast.*"]) + ["vitfast.kernels"],
    package_dir={"vitfast": "vitfast", "vitfast.kernels": "kernels"},
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
