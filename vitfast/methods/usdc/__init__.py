"""USDC ("USDC: Unified Static and Dynamic Compression for Visual Transformer", arXiv 2310.11117): per-layer decision
networks that skip whole MHSA / FFN sub-blocks for a batch, searched over G0…G6, plus static pruning of heads, FFN
channels and blocks under a FLOPs resource loss.

Gate networks and their search (gates.py), the train-time `USDCBlock` (modules.py), conversion, pruning, the
resource loss and the method's entry in the train-time file (compression.py).  The fused form is
`vitfast.nn.FusedGatedBlock` with `vitfast.nn.FusedBatchGate`.
"""
from .compression import (
                          RESOURCE_GAMMA,
                          USDCResourceLoss,
                          arch_optimizer,
                          arch_parameters,
                          build_usdc,
                          convert_timm,
                          describe_usdc,
                          gate_rates,
                          model_macs,
                          prune,
                          usdc_blocks,
)
from .gates import (
                          GATE_KINDS,
                          GATE_LEVELS,
                          GATE_TAU,
                          SEARCH_TAU,
                          GateNet,
                          GateSearch,
                          group_assignment,
                          group_features,
                          group_ids,
                          group_mean,
                          group_sizes,
                          hard_gates,
)
from .modules import USDCBlock

__all__ = ["USDCBlock", "GateNet", "GateSearch", "GATE_KINDS", "GATE_LEVELS", "GATE_TAU", "SEARCH_TAU",
           "group_sizes", "group_ids", "group_assignment", "group_mean", "group_features", "hard_gates",
           "USDCResourceLoss", "RESOURCE_GAMMA", "convert_timm", "prune", "gate_rates", "arch_parameters", "arch_optimizer",
           "describe_usdc", "build_usdc", "usdc_blocks", "model_macs"]
