"""CUDA policy: where a Triton kernel beats the torch composition (cuBLAS / cuDNN / SDPA), the constants each op's
`use_triton_*` rule compares against.  "Use your own kernel where it beats the library": the numbers are the
measured speed-ups in `docs/performance.md#cuda-policy` (kernel ÷ composition, medians; >1 = the kernel wins).

Measured (GPUs, library versions and scripts: docs/performance.md), and the rule taken:
- channel_idle_ffn: fp32 0.40–0.57× everywhere (the ieee tl.dot runs on CUDA cores); bf16 at batch 1–8
  (≤ 1576 rows) 0.33–0.45× (launch-bound); bf16 at batch 64 (12608 rows), θ 0.5 / 0.75, three runs: DeiT-B
  (C 768) 1.10–1.27×, won all six, DeiT-S (C 384) lost four of six (median 0.78×)
  → Triton in fp16/bf16 from TRITON_FFN_MIN_ROWS rows and TRITON_FFN_MIN_WIDTH channels.
- xwx_attention: fp32 0.14–0.48×; fp16 DeiT-Ti (C 192) 1.25–1.54×; fp16 DeiT-S (C 384) 0.86–1.25×, no
  consistent win → Triton in fp16/bf16 up to TRITON_XWX_MAX_WIDTH channels.
- dwconv_attention: fp32, 24×24 tokens, batch 1/8: 0.15–0.58× everywhere → always the composition.
- attention: the Triton kernel (kernels/attention.py) is untimed against SDPA → SDPA (vitfast/ops/attention.py
  `use_triton_attention`); the Triton block path uses the kernel (one launch: its five-launch budget).
- gated_mhsa / gated_ffn (DeiT-S, half the sub-blocks closed; time relative to the ungated model, lower is better):
  fp32 gated kernels 166% / 116% (batch 8 / 64), compute + gate_select 118% / 108%; fp16 gated kernels
  157% / 112%, gate_select 192% / 144% → the gated kernels in fp16/bf16, gate_select in fp32.

`VITFAST_CUDA_KERNELS` (`vitfast._env.get_cuda_kernels`) "triton" / "torch" forces one path over every rule.
"blocks" opts whole fused ViT blocks into the five-launch Triton block path (kernels/vit_block.py: LayerNorm folded
into the GEMMs, residual epilogues emitting the next LayerNorm's statistics); it is not the default because it has
not been timed on a GPU yet.  Every other op keeps the "auto" rules under it.
"""
from __future__ import annotations

from typing import Optional

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)

# channel_idle_ffn: rows (tokens × batch) and model width (x's channels) from which the Triton kernel wins.
TRITON_FFN_MIN_ROWS = 8192
TRITON_FFN_MIN_WIDTH = 768
# xwx_attention: the widest model (C) up to which the Triton kernel wins.
TRITON_XWX_MAX_WIDTH = 256


def forced(policy: str) -> Optional[bool]:
    """True / False when VITFAST_CUDA_KERNELS forces the Triton kernels / the composition; None for "auto"."""
    return {"triton": True, "torch": False}.get(policy)


def use_triton_blocks(policy: str) -> bool:
    """Whether whole fused ViT blocks run on the Triton block path: only when VITFAST_CUDA_KERNELS=blocks opts in."""
    return policy == "blocks"
