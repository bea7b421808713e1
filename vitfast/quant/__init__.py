"""Low precision for fused models: `quantize` (int8 / bf16 copies), `describe`, and the file record (`structure`).

See vitfast/quant/quantize.py for the options and docs/quantization.md for the guide and measured figures.
"""
from .quantize import describe, quantizable_layers, quantize

__all__ = ["quantize", "describe", "quantizable_layers"]
