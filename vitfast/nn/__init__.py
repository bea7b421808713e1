"""Modules: train-time (reference paths, autograd) and fused inference modules (call torch.ops.vitfast.*)."""
from .registry import fused_kinds, fused_module_from_config, is_fused_module, register_fused  # noqa: F401
