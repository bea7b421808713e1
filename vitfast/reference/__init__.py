"""Reference implementations: the ground truth for every `torch.ops.vitfast.*` op, one module per op.

Each `vitfast/reference/<op>.py` holds the op's contract, `check_<op>_args` (what inputs are valid; every message
names the argument, what was expected and what was given; the C++ bindings in `csrc/ops/<op>.cpp` repeat the same
checks in the same words), and its formula: same signature as the op, plain PyTorch (autograd works), computed in
the input dtype.  Tests compare every kernel against these, benchmarks use them as the eager baseline, and
`VITFAST_BACKEND=reference` routes fused modules through them.  The op modules (`vitfast.ops`) and the Triton
launchers (`kernels/`) import the checks from here, so nothing here imports either of them.
"""
from .attention import attention, attention_unchecked, check_attention_args
from .attention_bf16 import attention_bf16, check_attention_bf16_args
from .attention_int8 import attention_int8, check_attention_int8_args
from .batch_gate import (GATE_ACTS, batch_gate, batch_gate_logits, check_batch_gate_args, check_gate_select_args,
                         gate_select)
from .channel_idle_ffn import channel_idle_ffn, channel_idle_ffn_unchecked, check_channel_idle_ffn_args
from .channel_idle_ffn_int8 import channel_idle_ffn_int8, check_channel_idle_ffn_int8_args
from .dwconv_attention import check_dwconv_attention_args, dwconv_attention
from .dwconv_heads import check_dwconv_heads_args, dwconv_heads
from .gated import check_gated_ffn_args, check_gated_mhsa_args, gated_ffn, gated_mhsa
from .layer_norm import check_layer_norm_args, layer_norm, layer_norm_unchecked
from .linear import check_linear_args, linear, linear_unchecked
from .ln_linear import ln_linear
from .linear_int8 import check_linear_int8_args, linear_int8
from .vit_block import check_vit_block_args, compose_vit_block, vit_block
from .xwx_attention import check_xwx_attention_args, xwx_attention
from .xwx_heads import check_xwx_heads_args, xwx_heads
from .xwx_heads_bf16 import check_xwx_heads_bf16_args, xwx_heads_bf16
from .xwx_heads_int8 import check_xwx_heads_int8_args, xwx_heads_int8

__all__ = ["attention", "channel_idle_ffn", "layer_norm", "linear", "ln_linear", "vit_block", "xwx_attention", "dwconv_attention",
           "batch_gate", "batch_gate_logits", "gate_select", "gated_mhsa", "gated_ffn", "linear_int8",
           "channel_idle_ffn_int8", "xwx_heads", "xwx_heads_int8", "xwx_heads_bf16",
           "dwconv_heads"]
