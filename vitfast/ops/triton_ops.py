"""The block path's Triton launchers as registered ops, so the compiler can see them.

    torch.ops.vitfast.ln_linear_triton(x, weight, bias, eps, stats, stats_tile, gelu_cols, bias2, add, residual,
                                       emit_stats, norm, split_k) -> (out, stats_out)
    torch.ops.vitfast.vit_block_triton(<vit_block's 13 arguments>, stats, stats_tile) -> (out, stats_out)

The arguments are `kernels.ln_linear.ln_linear_triton`'s and `kernels.vit_block.vit_block_triton`'s, flattened to
schema types: x's `RowStats` as its partials tensor (or None) and its tile width, `split_k` 0 for the heuristic.
`stats_out` is the output's RowStats partials (float32 [2, T, M], T = ⌈N / STAT_TILE⌉, tile STAT_TILE) when
statistics are emitted — always for vit_block_triton, per `emit_stats` for ln_linear_triton, else a [2, 0, M] tensor.

Registration (`register()`, run by `import vitfast.ops.triton_ops`, once; `import vitfast` does not import this
module, since registering a triton_op imports triton):
- torch with `torch.library.triton_op` and `wrap_triton` (2.6 and later): each op is a triton_op whose body is the
  launcher with every launch wrapped by `wrap_triton`.  torch.compile then traces into the op and sees the Triton
  kernels themselves (the attention one included), not an opaque call; the fake impl is the same body run on fake
  tensors, where the wrapped launches do nothing.
- older torch (2.4, 2.5), and under the Triton interpreter: `torch.library.custom_op` around the same launchers,
  with a fake impl giving the shapes; the compiler sees an opaque op (no graph break: fullgraph works).
Under the wrap the split-K tile counters are a fresh zeroed tensor per call (a traced graph cannot hold the
launcher's cached buffer), i.e. one memset more per split GEMM than the eager launchers.

These ops are for code that compiles around the Triton block path; the fused model itself keeps its own routing
(`vitfast.nn.block.whole_block_args` leaves the whole-block path when tracing).  Unmeasured on a GPU: whether
inductor's scheduling around the wrapped kernels beats the eager launchers is for a GPU run to say.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["HAS_TRITON_OP", "USES_TRITON_OP", "register"]

HAS_TRITON_OP = hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
# Under the Triton interpreter (TRITON_INTERPRET=1, read as kernels/_common.py reads it) wrap_triton hands back the
# interpreted kernel unwrapped, so a triton_op's traced fake impl would run the kernel on fake tensors: the
# custom_op form (opaque, with its fake impl) is registered there instead.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
USES_TRITON_OP = HAS_TRITON_OP and not _INTERPRET
_REGISTERED: list = []


def _stats_in(stats: Optional[torch.Tensor], tile: int, width: int):
    from ..kernels.ln_linear import RowStats

    return None if stats is None else RowStats(stats, tile, width)


def _stats_out(result, emitted: bool, out: torch.Tensor):
    if emitted:
        return result[1].partials
    m = out.numel() // out.shape[-1] if out.shape[-1] else 0
    return out.new_empty((2, 0, m), dtype=torch.float32)


def _ln_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: Optional[float],
               stats: Optional[torch.Tensor], stats_tile: int, gelu_cols: int, bias2: Optional[torch.Tensor],
               add: Optional[torch.Tensor], residual: Optional[torch.Tensor], emit_stats: bool, norm: str,
               split_k: int, wrap=None) -> tuple[torch.Tensor, torch.Tensor]:
    from ..kernels.ln_linear import ln_linear_triton

    result = ln_linear_triton(x, weight, bias, eps=eps, stats=_stats_in(stats, stats_tile, x.shape[-1]),
                              gelu_cols=gelu_cols, bias2=bias2, add=add, residual=residual, emit_stats=emit_stats,
                              norm=norm, split_k=split_k or None, _wrap=wrap)
    out = result[0] if emit_stats else result
    return out, _stats_out(result, emit_stats, out)


def _vit_block(x: torch.Tensor, norm1_eps: float, w_qkv: torch.Tensor, b_qkv: Optional[torch.Tensor], num_heads: int,
               w_proj: torch.Tensor, b_proj: Optional[torch.Tensor], ffn_norm_eps: Optional[float],
               w_in: torch.Tensor, b_in: Optional[torch.Tensor], w_out: torch.Tensor, b_out: Optional[torch.Tensor],
               ffn_residual: bool, stats: Optional[torch.Tensor], stats_tile: int,
               wrap=None) -> tuple[torch.Tensor, torch.Tensor]:
    from ..kernels.vit_block import vit_block_triton

    out, out_stats = vit_block_triton(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in,
                                      w_out, b_out, ffn_residual, stats=_stats_in(stats, stats_tile, x.shape[-1]),
                                      _wrap=wrap)
    return out, out_stats.partials


def _stat_tiles(n: int) -> int:
    from ..kernels.ln_linear import STAT_TILE

    return -(-n // STAT_TILE)


def _ln_linear_fake(x, weight, bias, eps, stats, stats_tile, gelu_cols, bias2, add, residual, emit_stats, norm,
                    split_k):
    n = weight.shape[0]
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    out = x.new_empty(tuple(x.shape[:-1]) + (n,))
    return out, x.new_empty((2, _stat_tiles(n) if emit_stats else 0, m), dtype=torch.float32)


def _vit_block_fake(x, *args):
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_empty(x.shape), x.new_empty((2, _stat_tiles(x.shape[-1]), m), dtype=torch.float32)


def _with_wrap(fn, wrap):
    # The registered body: the schema's arguments only (infer_schema reads these annotations), `wrap` bound here.
    def body(*args):
        return fn(*args, wrap=wrap)

    return body


def register() -> None:
    """Define torch.ops.vitfast.ln_linear_triton and .vit_block_triton (module docstring); idempotent."""
    if _REGISTERED:
        return
    import inspect

    for name, fn, fake in (("ln_linear_triton", _ln_linear, _ln_linear_fake),
                           ("vit_block_triton", _vit_block, _vit_block_fake)):
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "wrap"]
        body = _with_wrap(fn, torch.library.wrap_triton if USES_TRITON_OP else None)
        body.__signature__ = inspect.Signature(params, return_annotation=tuple[torch.Tensor, torch.Tensor])
        body.__annotations__ = {p.name: p.annotation for p in params} | {"return": tuple[torch.Tensor, torch.Tensor]}
        body.__name__ = name
        if USES_TRITON_OP:
            op = torch.library.triton_op(f"vitfast::{name}", body, mutates_args=())
        else:
            op = torch.library.custom_op(f"vitfast::{name}", body, mutates_args=())
            op.register_fake(fake)
        _REGISTERED.append(op)


register()
