"""Int8 weights in an exported QDQ graph: QuantizeLinear of a constant weight folded into an int8 initializer.

The exporters write a quantized weight as what it is in the traced graph — its fp32 values (qweight · scale) through
QuantizeLinear → DequantizeLinear (vitfast/reference/_int8_qdq.py) — so the file held 4 bytes per weight.  Here each
QuantizeLinear whose input is a constant (an initializer or a Constant node) and whose scale and zero point are
constants is evaluated once, with ONNX's definition: saturate(round_half_even(x / scale) + zero_point) along `axis`
(in fp32, as ONNX Runtime computes it), and replaced by its int8 result feeding the same DequantizeLinear: the standard
QDQ layout for weights, 1 byte per weight, and the same values at run time (the constants were exactly q · scale, so
x / scale rounds back to q).  Activations' QuantizeLinear nodes (non-constant inputs) are left alone.
"""
from __future__ import annotations

from typing import Dict

__all__ = ["fold_weight_quantize", "ort_int8_saturates"]

# ONNX Runtime's x86 int8 GEMM without VNNI multiplies u8 activations by s8 weights with vpmaddubsw, which sums each
# pair of products into int16 with saturation: exact only while 2 · 255 · |w| <= 32767, i.e. |w| <= 64 — its
# documented remedy is 7-bit weights (`reduce_range`), here `vitfast.quantize(weight_bits=7)`, whose codes are
# within reference._int8.WEIGHT_QMAX[7] = 64.  With VNNI (vpdpbusd sums into int32) it is exact.


def fold_weight_quantize(proto) -> int:
    """Folds every constant-input QuantizeLinear of `proto` (an onnx.ModelProto, changed in place); returns how many."""
    import numpy as np
    from onnx import numpy_helper

    graph = proto.graph
    consts: Dict[str, "np.ndarray"] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    const_nodes = {}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            for attr in node.attribute:
                if attr.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(attr.t)
                    const_nodes[node.output[0]] = node
    folded, keep = 0, []
    new_inits = []
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or not all(name in consts for name in node.input):
            keep.append(node)
            continue
        x = consts[node.input[0]].astype(np.float32)
        scale = consts[node.input[1]].astype(np.float32)
        zero = consts[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and x.ndim > 0:  # per-axis: scale and zero point broadcast along `axis`
            shape = [1] * x.ndim
            shape[axis % x.ndim] = scale.shape[0]
            scale, zero = scale.reshape(shape), np.asarray(zero).reshape(shape)
        info = np.iinfo(np.asarray(zero).dtype)
        # A channel of zero weights has scale 0 (s = max|w| / qmax): its codes are the zero point (x / 0 was NaN,
        # whose cast to int8 is undefined; DequantizeLinear multiplied it by 0 again, with a numpy warning).
        ratio = np.where(scale == 0, np.float32(0), x / np.where(scale == 0, np.float32(1), scale))
        q = np.clip(np.rint(ratio) + zero.astype(np.float32), info.min, info.max).astype(np.asarray(zero).dtype)
        new_inits.append(numpy_helper.from_array(q, node.output[0]))
        folded += 1
    if not folded:
        return 0
    del graph.node[:]
    graph.node.extend(keep)
    graph.initializer.extend(new_inits)
    # Weights (and Constant nodes) nothing reads any more.
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in used]
    for t in unused:
        graph.initializer.remove(t)
    dead = [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]
    for n in dead:
        graph.node.remove(n)
    return folded


def ort_int8_saturates(flags=None) -> bool:
    """True on an x86-64 CPU without AVX512_VNNI or AVX-VNNI (module doc), from the kernel's CPU flags (`flags`, or
    /proc/cpuinfo's); False where they cannot be read (the export check then stays strict)."""
    import platform

    from ._env import host_cpu_flags

    if flags is None:
        if platform.machine() not in ("x86_64", "AMD64"):
            return False
        flags = host_cpu_flags()
        if not flags:
            return False
    return not ({"avx512_vnni", "avx_vnni"} & set(flags))
