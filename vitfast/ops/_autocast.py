"""The ops' autocast rule: inside an autocast region every op takes fp32 inputs and runs in fp32.

Under torch.autocast the activations reaching an op can be bf16/fp16 (SDPA, a timm Linear such as Swin's patch
merging) while the module's weights stay fp32, and every op refuses mixed dtypes: fused blocks crashed where
timm runs.  Casting to fp32 is exact, and fp32 weights are not copied, so the packed-weight cache still hits.  This
is torch.library.register_autocast(op, device, torch.float32), registered by hand on the Autocast dispatch keys:
torch 2.4 has no register_autocast, and its plain `.float()` of a bf16/fp16 weight made a new tensor every call,
which the packed-weight cache (keyed on tensor identity) repacked every call: a bf16 DeiT-S block under autocast
ran 2.2x slower.
"""
from __future__ import annotations

import torch

from .._derived import DerivedCache
from . import _autograd

_fp32_weights = DerivedCache()  # the fp32 copies of low-precision parameters, one per parameter version


def autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch 2.4: no device argument
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def _fp32_weight(p: torch.Tensor) -> torch.Tensor:
    """The fp32 copy of a low-precision parameter, made once per parameter version and kept while it lives, so
    that the packed-weight cache sees the same tensor on every call (vitfast/_derived.py: when it goes stale)."""
    return _fp32_weights.get(p, None, torch.Tensor.float)


def autocast_input(a: torch.Tensor) -> torch.Tensor:
    """One floating op input under the autocast rule: in fp32."""
    if a.dtype == torch.float32:
        return a
    # A CPU parameter that autograd does not track (inference) keeps one fp32 copy, for the packed-weight cache;
    # anything else is cast per call: a training step must differentiate through the cast, inference tensors have
    # no version to check, and on CUDA (no packed cache) a kept copy would only hold memory.
    if (isinstance(a, torch.nn.Parameter) and a.device.type == "cpu" and not a.is_inference()
            and not (torch.is_grad_enabled() and a.requires_grad)):
        try:
            return _fp32_weight(a)
        except RuntimeError:  # a fake/functional tensor under torch.compile / torch.export: no storage to key on
            pass
    return a.float()


def register_autocast_fp32(lib: torch.library.Library, name: str, device: str) -> None:
    """A kernel on the Autocast<device> key: floating inputs on `device` to fp32 (`autocast_input`; a gate keeps
    its dtype, see _autograd.AUTOCAST_KEEP), then the op with autocast off (which also excludes the key, so the
    call goes on to the backend kernel)."""
    op = getattr(torch.ops.vitfast, name).default

    def kernel(*args, **kwargs):
        with torch.autocast(device, enabled=False):
            # (keyword arguments, if the dispatcher passes any, by name: the gate keeps its dtype)
            named = {k: v if k == "gate" else _autograd.autocast_args("", [v], device, autocast_input)[0]
                     for k, v in kwargs.items()}
            return op(*_autograd.autocast_args(name, args, device, autocast_input), **named)

    lib.impl(name, kernel, "Autocast" + device.upper())
