"""Drop-in depthwise-convolution heads ("Accelerating Vision Foundation Models with Drop-in Depthwise Convolution",
arXiv 2605.22132): the least useful attention heads become a value projection and a k×k depthwise convolution over
the token grid.

Train-time `DWConvAttention` / `DWConvBlock` and the fold into `vitfast.nn.FusedDWConvBlock` (modules.py), head
scoring Σ_h (head_selection.py), DSP Gumbel top-k gating (dsp.py), conversion from timm (convert.py) and the
method's entry in the train-time file (recipe.py), the frozen-backbone second stage (stages.py).  The ranking file
itself is `vitfast.io.head_ranking`.
"""
from ...io.head_ranking import HeadRanking
from .convert import convert_timm, remove_prefix_tokens, replace_dwconv_blocks
from .dsp import DSPGate, DSPGatedAttention, attach_dsp, finalize_dsp, gumbel_topk_relaxed
from .head_selection import attention_maps, attention_std_scores
from .modules import KERNEL_FORMS, DWConvAttention, DWConvBlock, dwconv_heads, fold_dwconv_attention
from .recipe import build_dwconv, describe_dwconv
from .stages import freeze_backbone, set_gamma_weight_decay

__all__ = ["DWConvAttention", "DWConvBlock", "fold_dwconv_attention", "dwconv_heads", "KERNEL_FORMS", "HeadRanking",
           "attention_maps", "attention_std_scores", "DSPGate", "DSPGatedAttention", "attach_dsp", "finalize_dsp",
           "gumbel_topk_relaxed", "convert_timm", "remove_prefix_tokens", "replace_dwconv_blocks", "describe_dwconv",
           "build_dwconv", "freeze_backbone", "set_gamma_weight_decay"]
