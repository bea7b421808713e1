"""Triton kernels (GPU).  Installed as `vitfast.kernels`; never imported by `import vitfast` itself.

Each module holds a `_<op>_kernel` (or several) and a `<op>_triton(...)` launcher with the op's signature.
On CPU they run only under the Triton interpreter (`TRITON_INTERPRET=1` set before triton is imported).
"""
