"""CUDA policy: where a Triton kernel beats the torch composition (cuBLAS / cuDNN / SDPA), the constants each op's
`use_triton_*` rule compares against.  "Use your own kernel where it beats the library": the numbers are the
measured speed-ups in `docs/performance.md#cuda-policy` (kernel ÷ composition, medians; >1 = the kernel wins).

| op                | measured (GPUs, versions and scripts: see docs/performance.md)           | rule                      |
|-------------------|--------------------------------------------------------------------------|---------------------------|
| channel_idle_ffn  | fp32: 0.40–0.57× (ieee tl.dot on CUDA cores) everywhere.                 | fp16/bf16 only,           |
|                   | bf16 batch 1–8 (≤ 1576 rows): 0.33–0.45× (launch-bound).                 | rows ≥ TRITON_FFN_MIN_ROWS|
|                   | bf16 batch 64 (12608 rows), θ 0.5 / 0.75, three runs: DeiT-B (C 768)      | and width ≥               |
|                   | 1.10–1.27×, won all six; DeiT-S (C 384) lost four of six (median 0.78×). | TRITON_FFN_MIN_WIDTH      |
| xwx_attention     | fp32: 0.14–0.48×.  fp16 DeiT-Ti (C 192): 1.25–1.54×;                     | fp16/bf16 and             |
|                   | fp16 DeiT-S (C 384): 0.86–1.25×, no consistent win.                      | C ≤ TRITON_XWX_MAX_WIDTH  |
| dwconv_attention  | fp32, 24×24 tokens, batch 1/8: 0.15–0.58× everywhere.                    | never (the composition)   |
| gated_mhsa/ffn    | DeiT-S, half the sub-blocks closed, vs ungated (lower is better):        | fp16/bf16: gated kernels, |
|                   | fp32 gated kernels 166% / 116% (b8 / b64), gate_select 118% / 108%;      | fp32: compute +           |
|                   | fp16 gated kernels 157% / 112%, gate_select 192% / 144%.                 | gate_select               |

`VITFAST_CUDA_KERNELS` (`vitfast._env.get_cuda_kernels`) "triton" / "torch" forces one path over every rule.
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
