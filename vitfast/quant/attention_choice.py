"""Where an int8 model's attention score/value products run on int8: `attention="auto"`, `vitfast.quantize`'s
default with dynamic activations.

int8 products (`torch.ops.vitfast.attention_int8`) pay only where the int8 kernel's gain on Q·Kᵀ and P·V outweighs
quantizing Q, K, P and V on every call, and that depends on the kernel, the token count N and the head dim D.
Measured per int8 kernel (`benchmarks/attention_variants.py --grid`, table `attention_crossover` of
benchmarks/results/2026-11-29-intel-r-xeon-avx512.json: fp32 attention ÷ attention_int8, one thread, paired rounds,
batch 1 and 8, N 17-577, D 16-64), a rule below holds where both batches measured at least 1.05×:

* amx_int8: D ≥ 64 from N = 65 (1.1-1.3× there, 1.8-2.0× at DeiT shapes, N = 197; 0.7× at N = 17); D ≥ 24 only
  at N = 577 (1.10-1.24×; a 64-byte AMX tile row holds D int8 values, mostly empty below D = 64).
* avx512_vnni: D ≥ 64 at any N (1.1× at N = 17, 1.6-1.7× at DeiT shapes), D ≥ 24 from N = 101, D ≥ 16 from
  N = 197.
* avx_vnni (the AVX2 path's kernel on a CPU with AVX-VNNI; table `attention_crossover` of
  benchmarks/results/2026-12-01-amd-epyc-avx512.json, the only AVX-VNNI CPU measured):
  D ≥ 64 from N = 50 (1.2-1.3× there, 1.8-1.9× at DeiT shapes; 0.9× at N = 17), D ≥ 24 from N = 65, D ≥ 16
  from N = 197.
* avx2: D ≥ 64 from N = 197 (1.17-1.21× at DeiT shapes on the Intel Xeon's core, table of
  benchmarks/results/2026-12-02-intel-r-xeon-avx512.json; 1.25-1.28× on a Zen 4's, 2026-12-01).  No int8
  dot-product instruction (three instructions per 16 multiply-adds against the fp32 kernel's one FMA per 8), and
  Q·Kᵀ needs the sign trick; P·V runs in the kernel's unsigned-A form (P's codes are never negative), which took
  the Intel core from 1.00-1.04× (2026-11-29) to the above.  D = 24-32 from N = 197 measured 1.09-1.15× there too
  but 0.93-0.96× in the 2026-11-29 table, before that form: the rule keeps what holds on every table.

Kernels without a measurement (neon_dot, scalar; the reference without the extension) keep int8 products, which
was the default before this rule.  The choice is made once, at quantize time, for the CPU it runs on and the
model's own token count (patch grid + class/register tokens; 197 when the model does not say); the saved file
keeps it (per attention), so a file runs the same products wherever it is loaded: quantize again on the target
CPU to re-choose.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch.nn as nn

# int8 kernel -> ((minimum head dim, minimum tokens), ...): int8 products pay where any pair is met.
RULES: Dict[str, Tuple[Tuple[int, int], ...]] = {
    "amx_int8": ((64, 65), (24, 577)),
    "avx512_vnni": ((64, 1), (24, 101), (16, 197)),
    "avx_vnni": ((64, 50), (24, 65), (16, 197)),
    "avx2": ((64, 197),),
}
# The token count assumed for a model that does not give one (DeiT/ViT at 224 pixels, patch 16).
DEFAULT_TOKENS = 197


def model_tokens(model: nn.Module) -> Optional[int]:
    """Tokens per image the model's attentions see at its configured input size (timm's VisionTransformer: patch
    grid + class/register tokens), or None when the model does not say."""
    patches = getattr(getattr(model, "patch_embed", None), "num_patches", None)
    if not isinstance(patches, int) or patches <= 0:
        return None
    prefix = getattr(model, "num_prefix_tokens", 0)
    return patches + (prefix if isinstance(prefix, int) and prefix > 0 else 0)


def products_dim(attn: nn.Module) -> int:
    """The head dim the rule reads for an attention: its head dim (a fused MHSA), or for a projected non-deep
    attention (vitfast.nn.xwx.ProjectedXWXAttention) the smaller of its score width (R + key bias column, or C + it in
    the full form) and value width D.  Measured for those heads (`benchmarks/bench_xwx_heads_int8.py`, avx512_vnni,
    one thread, batch 1, xwx_heads ÷ xwx_heads_int8): 0.89× at N = 17 and width 48, 1.21× at N = 65, 1.4-2.4× at
    N = 197 from width 32; on the avx2 path 1.08-1.20× at N = 197-577, width 64-128.  The multi-head rule with that
    width is never wrong there, only conservative (N = 65 at width 48 and the avx2 cells keep fp32)."""
    if hasattr(attn, "head_dim"):
        return int(attn.head_dim)
    kb = int(attn.has_key_bias)
    score = (attn.score_rank if attn.score_form == "factored" else attn.dim) + kb
    return int(min(score, attn.value_dim))


def int8_attention_pays(tokens: Optional[int], head_dim: int, kernel: str) -> bool:
    """Whether `attention_int8` measured faster than fp32 attention on `kernel` (vitfast.ops.int8_kernel()) at this
    token count (None: not known, DEFAULT_TOKENS) and head dim."""
    if kernel not in RULES:
        return True  # not measured: int8, as before the rule
    tokens = DEFAULT_TOKENS if tokens is None else tokens
    return any(head_dim >= d and tokens >= n for d, n in RULES[kernel])


def why(tokens: Optional[int], head_dim: int, kernel: str, pays: bool) -> str:
    """One sentence for `describe`: what attention="auto" chose, for which shape and kernel."""
    shape = f"{tokens} tokens, head dim {head_dim}" if tokens is not None else f"head dim {head_dim}"
    if kernel not in RULES:
        return f"attention='auto' put the score/value products on int8 ({kernel}: not measured, int8 kept)"
    if pays:
        return f"attention='auto' put the score/value products on int8 (they pay at {shape} on {kernel})"
    return f"attention='auto' kept the score/value products fp32 (int8 ones do not pay at {shape} on {kernel})"
