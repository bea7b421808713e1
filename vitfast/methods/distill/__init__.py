"""Distillation-based compression ("Distillation-Based Model Compression Framework for Swin Transformer", EasyChair
Preprint 15433): a shallower student copied from the teacher's blocks before the cut point, trained with MSE (or KL)
on the teacher's logits plus hard-label cross-entropy.

Losses and α schedules (losses.py), `DistillTrainer` (trainer.py), students (student.py).  The student is an
ordinary timm model: it converts and fuses like any other.
"""
from .losses import (
                     DISTILL_LOSSES,
                     hard_label_loss,
                     harmonic_mean_loss,
                     joint_loss,
                     kl_logits_loss,
                     linear_alpha,
                     mse_logits_loss,
)
from .student import make_student, student_cut
from .trainer import DistillTrainer, check_teacher_input

__all__ = ["DistillTrainer", "check_teacher_input", "make_student", "student_cut", "DISTILL_LOSSES",
           "hard_label_loss", "mse_logits_loss", "kl_logits_loss", "joint_loss", "harmonic_mean_loss", "linear_alpha"]
