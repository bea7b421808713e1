"""The `torch.ops.vitfast` namespace: one module per op, each built from one spec (`_spec.define_op`).

Each op module holds the op's schema, the use of its argument check (`check_<op>_args`, defined with the op's
reference formula in `vitfast/reference/<op>.py`, where the Triton launchers below the ops find it too), fake impl,
CUDA impl and CUDA policy, and its Python entry `vitfast.ops.<op>`: linear, layer_norm, attention,
channel_idle_ffn, vit_block, xwx_attention, xwx_heads, xwx_heads_int8, xwx_heads_bf16, dwconv_attention, dwconv_heads, batch_gate (batch_gate + gate_select), gated
(gated_mhsa + gated_ffn).

CPU impl   = the C++ kernels in `vitfast._C` (`_extension.py`; the reference where there is none).
CUDA impl  = the Triton launchers in `vitfast.kernels` (imported lazily: `import vitfast` never needs a GPU) where
             they beat the torch composition (thresholds: `_policy.py`), else that composition.
Fake impl  = shape/dtype propagation so `torch.compile(fullgraph=True)` and `torch.export` trace the ops.

`vitfast.ops.warmup(model, batch_sizes=...)` runs a CUDA model once per batch size so its Triton kernels compile and
autotune before serving (`warmup.py`).  `import vitfast.ops.triton_ops` registers the Triton block path's launchers
as `torch.ops.vitfast.ln_linear_triton` / `vit_block_triton` (torch.library.triton_op where torch has it; not
imported with vitfast.ops: registering a triton_op imports triton, which `import vitfast` never does).

`vitfast.ops.<op>` is the Python entry (a function): it shadows the module of the same name, which
`importlib.import_module("vitfast.ops.<op>")` reaches.
"""
from __future__ import annotations

from .. import reference
from .._env import get_backend, get_cuda_kernels
from ._autocast import _fp32_weights, autocast_enabled as _autocast_enabled
from ._policy import TRITON_FFN_MIN_ROWS, TRITON_FFN_MIN_WIDTH, TRITON_XWX_MAX_WIDTH
from ._spec import SCHEMAS, onnx_exporting
from .attention import attention
from .attention_bf16 import attention_bf16
from .attention_int8 import attention_int8
from .batch_gate import batch_gate, gate_select
from .channel_idle_ffn import channel_idle_ffn, use_triton_channel_idle_ffn
from .channel_idle_ffn import _channel_idle_ffn_cuda
from .channel_idle_ffn_int8 import channel_idle_ffn_int8
from .dwconv_attention import dwconv_attention, use_triton_dwconv_attention
from .dwconv_heads import dwconv_heads
from .gated import gated_ffn, gated_mhsa, use_gated_cuda_kernels
from .layer_norm import layer_norm
from .linear import linear
from .linear_int8 import linear_int8
from .vit_block import _vit_block_composed, vit_block, vit_block_cuda_eager
from .warmup import warmup
from .xwx_attention import _xwx_attention_cuda, use_triton_xwx_attention, xwx_attention
from .xwx_heads import xwx_heads
from .xwx_heads_bf16 import xwx_heads_bf16
from .xwx_heads_int8 import xwx_heads_int8
from ._extension import (_C, _REFERENCE_CPU_FALLBACKS, bf16_kernel, clear_output_cache, clear_weight_cache,
                         cpu_extensions, cpu_isa, extension_loaded, int8_kernel, prepack)

__all__ = ["attention", "channel_idle_ffn", "layer_norm", "linear", "xwx_attention", "extension_loaded", "cpu_isa",
           "batch_gate", "gate_select", "prepack", "clear_weight_cache", "clear_output_cache", "vit_block",
           "dwconv_attention",
           "gated_mhsa", "gated_ffn", "onnx_exporting", "linear_int8", "channel_idle_ffn_int8", "attention_int8",
           "attention_bf16", "xwx_heads", "xwx_heads_int8", "xwx_heads_bf16", "dwconv_heads",
           "int8_kernel", "bf16_kernel", "cpu_extensions", "warmup"]
