"""vitfast: train Vision Transformers in reparameterizable shapes, fuse them exactly, run them on fused kernels.

    import vitfast
    model = vitfast.convert.from_timm(timm_model, channel_idle=0.75)   # train-time model
    ...train (vitfast.training.Trainer)...
    fused = vitfast.fuse(model)                                          # exact, smaller
    vitfast.save(fused, "fused.safetensors")
    model = vitfast.load("fused.safetensors").cuda()                    # forward -> torch.ops.vitfast.*
    model = vitfast.cuda_graph(model)                                    # optional: replay CUDA graphs (batch 1)

`import vitfast` is light: it registers the ops (and loads the prebuilt C++ extension); the model tools are
imported on first use.
"""
from __future__ import annotations

# First, before anything imports torch: libgomp reads OMP_WAIT_POLICY once, when torch loads it, and the
# `vitfast` commands that train want it passive (vitfast._threads)
from ._threads import default_wait_policy

default_wait_policy()

from . import ops, reference  # noqa: F401,E402  (ops registers torch.ops.vitfast.*)
from ._lazy import lazy_attributes
from ._env import get_backend, get_cuda_kernels, set_backend, set_cuda_kernels  # noqa: F401
from ._version import __version__  # noqa: F401

# public name -> (module, attribute or None for the module itself).  Older module names (train, usdc, distill,
# student, head_selection, data, distributed) stay as names for the packages that now hold them.
_LAZY = {
    "nn": ("vitfast.nn", None),
    "convert": ("vitfast.convert", None),
    "methods": ("vitfast.methods", None),
    "io": ("vitfast.io", None),
    "export": ("vitfast.export", None),  # ONNX export (onnx, onnxruntime, onnxscript: the `export` extra)
    "training": ("vitfast.training", None),
    "train": ("vitfast.training", None),
    "data": ("vitfast.training.data", None),
    "distributed": ("vitfast.training.distributed", None),
    "fuse": ("vitfast.fusion", "fuse"),
    "save": ("vitfast.io.fused", "save"),
    "load": ("vitfast.io.fused", "load"),
    "patch_timm": ("vitfast.patch", "patch_timm"),
    "quantize": ("vitfast.quant", "quantize"),  # int8 / bf16 copies of a fused model (vitfast.quant)
    "quant": ("vitfast.quant", None),
    "list_models": ("vitfast.models", "list_models"),
    "usdc": ("vitfast.methods.usdc", None),
    "distill": ("vitfast.methods.distill", None),
    "student": ("vitfast.methods.distill.student", None),
    "head_selection": ("vitfast.methods.dwconv", None),
    # GPU inference replayed from CUDA graphs (the module is cuda_graphs: a submodule named like the function
    # would replace it as the package attribute once imported)
    "cuda_graph": ("vitfast.cuda_graphs", "cuda_graph"),
    "CudaGraphModule": ("vitfast.cuda_graphs", "CudaGraphModule"),
}

__all__ = ["ops", "reference", "get_backend", "set_backend", "get_cuda_kernels", "set_cuda_kernels", "__version__", *_LAZY]


__getattr__ = lazy_attributes(__name__, _LAZY)
