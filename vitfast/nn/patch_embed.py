"""The patch embedding of a fused ViT as one GEMM on the vitfast kernels.

timm's `PatchEmbed` projects non-overlapping p×q patches with a Conv2d whose kernel equals its stride.  That
convolution is exactly a dense layer over the flattened patches: out[b, n, :] = W · patch(b, n) + bias with
W = weight.reshape(C_out, C_in·p·q), and patch(b, n) ordered (channel, row, column) like the conv weight.
On the CPU oneDNN runs it at ~61 GFLOP/s at DeiT-Ti's shape; one copy of the image into patch rows plus
`ops.linear` (packed weight, AVX-512 GEMM) is 13% faster (one thread, batch 1, 224²: DeiT-Ti 0.63 → 0.55 ms,
DeiT-S 1.24 → 1.08 ms, DeiT-B 2.49 → 2.14 ms).

`GemmPatchProjection` is that Conv2d with the same parameters and state-dict keys (checkpoints only add its
kind, "gemm_patch_projection", to the config of `patch_embed.proj`): its forward returns the conv's [B, C_out, H/p, W/q] result as a view of the token-major
[B, N, C_out] GEMM output, so timm's `flatten(2).transpose(1, 2)` (or Swin's NHWC permute) gives a contiguous
tensor back without a copy (with gradients too: `ops.linear` differentiates its reference).

On CUDA in fp16/bf16 the same patch rows go through cuBLAS (`F.linear`, bias in its epilogue): cuDNN picked
`implicit_convolve_sgemm` for this conv and took 1.66 ms of an 8.8 ms forward (RePa-DeiT-S/0.75, batch 256, bf16, an
H200; profiler table of benchmarks/gpu_profile_blocks.py), plus a separate bias add, where the copy into patch rows
and the GEMM are ~0.1 ms of memory traffic and 30 GFLOP.  fp32 keeps the conv there: cuDNN's convolutions follow
`torch.backends.cudnn.allow_tf32` (on by default) and matmuls `torch.backends.cuda.matmul.allow_tf32` (off), so the
GEMM would change the default precision, and its speed there is unmeasured.  Anything else — another device,
tracing / torch.compile / ONNX export (standard ops there), VITFAST_BACKEND=reference, an input not divisible into
whole patches — runs the Conv2d itself.

Memory formats.  The GEMM's columns follow the input's layout: (channel, row, column) for an NCHW image, (row,
column, channel) for a channels_last one (gathering NCHW pixels in that order took 180 µs instead of 36 at 224²,
DeiT's 16×16 patches).  The weight matrix is a view of the conv weight when its layout matches (a contiguous weight
for NCHW input, a channels_last one — `model.to(memory_format=torch.channels_last)` — for channels_last input);
otherwise one re-ordered copy is kept per weight version, so the packed-weight cache packs it once (inside a CUDA-graph
capture the copy is captured instead: replays read the parameters in place).  Re-ordering on
every call instead made a new tensor each time, repacked on every call (DeiT-Ti's projection 374 µs instead of 263,
one thread, batch 1), and under torch.inference_mode the copy was an inference tensor, so the op warned that the
*weights* were.  Under CPU autocast a low-precision weight's fp32 matrix is kept the same way.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from ..ops._autocast import autocast_enabled
from .._derived import DerivedCache
from ._base import ConfigReader, cpu_kernel_applies, tracing
from .registry import register_fused

# The GEMM's column order: each patch as the conv weight's (channel, row, column), or as (row, column, channel).
_CHW, _HWC = "chw", "hwc"

# The kept [C_out, C_in·p·q] copies of weights stored in the other layout (or dtype) than the input's, per weight
# version, order and dtype (see the module doc; vitfast/_derived.py: when a copy goes stale).
_reordered = DerivedCache()


@register_fused("gemm_patch_projection")
class GemmPatchProjection(nn.Conv2d):
    """A patch-embedding Conv2d (kernel = stride, no padding, no dilation, one group) that runs as a GEMM on
    the CPU kernels; see the module doc.  `vitfast.fuse` turns timm's projection into one
    (`use_gemm_patch_projection`); checkpoints record it as kind "gemm_patch_projection", so a saved model
    loads with the projection it was saved with (round trips stay bit-exact)."""

    def __init__(self, in_channels: int, out_channels: int, patch_size, bias: bool = True, device=None,
                 dtype=None) -> None:
        patch = tuple(patch_size) if isinstance(patch_size, (tuple, list)) else (patch_size, patch_size)
        super().__init__(in_channels, out_channels, kernel_size=patch, stride=patch, bias=bias, device=device,
                         dtype=dtype)

    def vitfast_config(self) -> dict:
        return {
            "kind": self.vitfast_kind,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "patch_size": list(self.kernel_size),
            "bias": self.bias is not None,
        }

    @classmethod
    def from_vitfast_config(cls, cfg: dict, *, device=None, dtype=None) -> "GemmPatchProjection":
        read = ConfigReader(cfg, "gemm_patch_projection", ("in_channels", "out_channels", "patch_size", "bias"))
        return cls(read.int("in_channels"), read.int("out_channels"), read.pair("patch_size", 1),
                   bias=read.bool("bias"), device=device, dtype=dtype)

    def _whole_patches(self, x: torch.Tensor) -> bool:
        return (
            x.dim() == 4
            and x.shape[1] == self.in_channels
            and x.shape[2] % self.kernel_size[0] == 0
            and x.shape[3] % self.kernel_size[1] == 0
        )

    def _gemm_applies(self, x: torch.Tensor) -> bool:
        return cpu_kernel_applies(x, self.weight) and self._whole_patches(x)

    def _cuda_gemm_applies(self, x: torch.Tensor) -> bool:
        # fp16/bf16 only: the module doc says why fp32 keeps cuDNN's conv.
        return (
            not tracing()
            and x.is_cuda
            and x.dtype == self.weight.dtype
            and x.dtype in (torch.float16, torch.bfloat16)
            and ops.get_backend() != "reference"
            and self._whole_patches(x)
        )

    def _weight_matrix(self, order: str, dtype: torch.dtype) -> torch.Tensor:
        """The weight as the [C_out, C_in·p·q] matrix of `dtype` whose columns run in `order`: a view when the
        weight is stored that way, else the kept copy (see the module doc)."""
        w = self.weight
        ordered = w if order == _CHW else w.permute(0, 2, 3, 1)
        if ordered.is_contiguous() and w.dtype == dtype:
            return ordered.reshape(self.out_channels, -1)  # a view: the cache keys on the weight's own storage
        if w.is_cuda and torch.cuda.is_current_stream_capturing():
            # Captured into the CUDA graph: replays read the parameters in place (vitfast.cuda_graph), so a kept
            # copy would go stale after an in-place update, and a replaced one would leave the graph reading freed
            # memory.
            return ordered.to(dtype).reshape(self.out_channels, -1)
        if w.is_inference() or (torch.is_grad_enabled() and w.requires_grad):
            # An inference tensor has no version to key a kept copy on (the op then warns that the weight is one,
            # which is the cause); a training step must differentiate through the copy (and the op's autocast
            # rule casts it).
            return ordered.reshape(self.out_channels, -1)
        def reorder(d: torch.Tensor) -> torch.Tensor:
            d = d if order == _CHW else d.permute(0, 2, 3, 1)
            return d.to(dtype=dtype, memory_format=torch.contiguous_format).reshape(self.out_channels, -1)

        return _reordered.get(w, (order, dtype), reorder)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._cuda_gemm_applies(x):
            order = _input_order(x)
            patches, grid = patch_rows(x, self.kernel_size, order)
            return tokens_as_conv_output(F.linear(patches, self._weight_matrix(order, x.dtype), self.bias), grid)
        if not self._gemm_applies(x):
            return super().forward(x)
        order = _input_order(x)
        patches, grid = patch_rows(x, self.kernel_size, order)
        # Under CPU autocast the op runs in fp32 (ops/_autocast.py): a low-precision weight's fp32 matrix is kept
        # too, as the rule keeps a parameter's (the flattened view is no parameter: it was cast, so packed, per call).
        dtype = torch.float32 if autocast_enabled("cpu") else self.weight.dtype
        return tokens_as_conv_output(ops.linear(patches, self._weight_matrix(order, dtype), self.bias), grid)

    def vitfast_prepack(self) -> bool:
        """Pack the weight matrix for the CPU GEMM now (see `vitfast.ops.prepack`), in the column order of NCHW
        input (the usual one); False when not on CPU."""
        if not self.weight.is_cpu or not ops.extension_loaded():
            return False
        w = self._weight_matrix(_CHW, self.weight.dtype)
        ops.linear(w.new_zeros(1, w.shape[1]), w, self.bias)
        return True

def _input_order(x: torch.Tensor) -> str:
    """Each patch's values in the order the input's memory layout reads fastest."""
    return _HWC if x.shape[1] > 1 and x.is_contiguous(memory_format=torch.channels_last) else _CHW


def patch_rows(x: torch.Tensor, patch_size, order: str = _CHW) -> tuple:
    """([B, rows·cols, C·p·q] patch rows of the image x [B, C, H, W], (rows, cols)): one copy, each patch's values in
    `order` ("chw": the conv weight's (channel, row, column); "hwc": (row, column, channel)).  Pixels past the last
    whole patch are dropped, as the strided convolution drops them."""
    batch, channels, height, width = x.shape
    p, q = patch_size
    rows, cols = height // p, width // q
    if height != rows * p or width != cols * q:
        x = x[:, :, : rows * p, : cols * q]
    grid = x.reshape(batch, channels, rows, p, cols, q)
    grid = grid.permute(0, 2, 4, 1, 3, 5) if order == _CHW else grid.permute(0, 2, 4, 3, 5, 1)
    return grid.reshape(batch, rows * cols, channels * p * q), (rows, cols)


def tokens_as_conv_output(tokens: torch.Tensor, grid: tuple) -> torch.Tensor:
    """The token-major GEMM output [B, rows·cols, C_out] as the conv's [B, C_out, rows, cols] (a view: timm's
    `flatten(2).transpose(1, 2)`, or Swin's NHWC permute, gives the contiguous tokens back without a copy)."""
    batch, _, out_channels = tokens.shape
    return tokens.transpose(1, 2).reshape(batch, out_channels, *grid)


def is_patch_projection(conv: nn.Module) -> bool:
    """A non-overlapping patch convolution (kernel = stride, no padding, dilation or groups): an nn.Conv2d or a
    `GemmPatchProjection`, whichever the model holds."""
    return (
        type(conv) in (nn.Conv2d, GemmPatchProjection)
        and tuple(conv.kernel_size) == tuple(conv.stride)
        and tuple(conv.padding) == (0, 0)
        and tuple(conv.dilation) == (1, 1)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
    )


def _is_patch_conv(conv: nn.Module) -> bool:
    return type(conv) is nn.Conv2d and is_patch_projection(conv)


def patch_projection(model: nn.Module):
    """`model.patch_embed.proj` (timm ViT/Swin) when it is a plain non-overlapping patch Conv2d, else None."""
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    return proj if proj is not None and _is_patch_conv(proj) else None


def use_gemm_patch_projection(model: nn.Module) -> bool:
    """Turn `model.patch_embed.proj` (timm ViT/Swin) into a `GemmPatchProjection` in place when it is a plain
    non-overlapping patch Conv2d.  The parameters, hooks and state-dict keys stay the same objects (the class
    adds no state).  Returns whether it did."""
    proj = patch_projection(model)
    if proj is None:
        return False
    proj.__class__ = GemmPatchProjection
    return True
