"""Low precision for fused models: `quantize` (int8 / bf16 copies), `describe`, and the file record (`structure`).

See vitfast/quant/quantize.py for the options and docs/quantization.md for the guide and measured figures.
"""
from .quantize import describe, quantizable_layers, quantize

# The accuracy a low-precision copy must keep against its fp32 source (docs/quantization.md, Accuracy): at most this
# many top-1 points below it, and at least this argmax agreement.  `vitfast verify`'s defaults; the demo's verdict.
MAX_TOP1_DROP_POINTS = 0.3
MIN_ARGMAX_AGREEMENT = 0.995

__all__ = ["MAX_TOP1_DROP_POINTS", "MIN_ARGMAX_AGREEMENT", "quantize", "describe", "quantizable_layers"]
