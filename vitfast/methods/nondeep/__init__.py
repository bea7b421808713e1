"""Non-deep ViTs by progressive branch joining ("Rethinking Vision Transformer Depth via Structural Reparameterization",
arXiv 2511.19718): L/n blocks of n parallel branches whose attention scores join into the XWXᵀ form as λ(t) goes 0 →
1.

Train-time `NonDeepBlock` (`NonDeepAttention`, `NonDeepMlp`, `JoinSchedule`: modules.py), conversion from timm
(convert.py), the collapse at λ = 1 into `vitfast.nn.FusedXWXBlock` (fold.py), attention-map distillation from a
teacher (attn_distill.py).  Its entry in the train-time file is part of `vitfast.io.trainable`.
"""
from .attn_distill import (AttentionDistillation, AttentionDistillTrainer, attention_map_loss, default_layer_map,
                           teacher_attention_maps)
from .convert import convert_timm
from .fold import fold_nondeep_attention
from .modules import NonDeepAttention, NonDeepBlock, NonDeepMlp, branch_diversity
from .schedule import JOIN_SCHEDULES, JoinSchedule, join_lambda

__all__ = ["NonDeepBlock", "NonDeepAttention", "NonDeepMlp", "JoinSchedule", "JOIN_SCHEDULES", "join_lambda",
           "branch_diversity", "convert_timm", "fold_nondeep_attention", "AttentionDistillation",
           "AttentionDistillTrainer", "attention_map_loss", "default_layer_map", "teacher_attention_maps"]
