"""vitfast: train Vision Transformers in reparameterizable shapes, fuse them exactly, run them on fused kernels.

    import vitfast
    model = vitfast.convert.from_timm(timm_model, channel_idle=0.75)   # train-time model
    ...train (vitfast.train.Trainer)...
    fused = vitfast.fuse(model)                                          # exact, smaller
    vitfast.save(fused, "fused.safetensors")
    model = vitfast.load("fused.safetensors").cuda()                    # forward -> torch.ops.vitfast.*
    model = vitfast.cuda_graph(model)                                    # optional: replay CUDA graphs (batch 1)

`import vitfast` is light: it registers the ops (and loads the prebuilt C++ extension); the model tools are
imported on first use.
"""
from __future__ import annotations

import importlib

from . import ops, reference  # noqa: F401  (ops registers torch.ops.vitfast.*)
from ._env import get_backend, get_cuda_kernels, set_backend, set_cuda_kernels  # noqa: F401

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "nn": ("vitfast.nn", None),
    "convert": ("vitfast.convert", None),
    "train": ("vitfast.train", None),
    "data": ("vitfast.data", None),
    "fuse": ("vitfast.fusion", "fuse"),
    "save": ("vitfast.checkpoint", "save"),
    "load": ("vitfast.checkpoint", "load"),
    "patch_timm": ("vitfast.patch", "patch_timm"),
    "usdc": ("vitfast.usdc", None),
    "distill": ("vitfast.distill", None),
    "student": ("vitfast.student", None),
    "distributed": ("vitfast.distributed", None),
    # GPU inference replayed from CUDA graphs (the module is cuda_graphs: a submodule named like the function
    # would replace it as the package attribute once imported)
    "cuda_graph": ("vitfast.cuda_graphs", "cuda_graph"),
    "CudaGraphModule": ("vitfast.cuda_graphs", "CudaGraphModule"),
}

# Drop-in depthwise convolution: Σ_h head ranking and DSP gating (vitfast.head_selection).
_LAZY["head_selection"] = ("vitfast.head_selection", None)

__all__ = ["ops", "reference", "get_backend", "set_backend", "get_cuda_kernels", "set_cuda_kernels", "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vitfast' has no attribute {name!r}")
