"""Accuracy of `attention_int8` against fp32 `attention` on real activations: the digits demo model
(/tmp/demo-out/fused.safetensors by default, made by the demo), its qkv inputs captured per block on the 360
validation images, and end to end: the int8 model (vitfast.quantize) with its attention swapped for attention_int8.

    PYTHONPATH=. python benchmarks/attention_int8_accuracy.py [path] [--variants]

--variants also runs the reference with the fp32-sum normalisation (the alternative to the quantized row sum).
"""
from __future__ import annotations

import sys

import torch

import vitfast
from vitfast.reference.attention_int8 import attention_int8_unchecked
from vitfast.training.data import digits_loaders


def _val_batches():
    _, val = digits_loaders(img_size=32, batch_size=64, seed=0)
    return [(x, y) for x, y in val]


def _run(model, batches, attention_fn=None):
    import vitfast.nn.block as block_mod
    import vitfast.ops as ops_mod
    saved, saved_whole = ops_mod.attention, block_mod.whole_block_args
    # the fp32 fused blocks run as one vit_block op: off, so that every block's heads go through ops.attention
    block_mod.whole_block_args = lambda *args: None
    calls = [0]
    if attention_fn is not None:
        def patched(qkv, num_heads, scale=None):
            calls[0] += 1
            return attention_fn(qkv, num_heads, scale)
        ops_mod.attention = patched
    try:
        with torch.inference_mode():
            logits = torch.cat([model(x) for x, _ in batches])
    finally:
        ops_mod.attention, block_mod.whole_block_args = saved, saved_whole
    return logits, calls[0]


def main(argv):
    path = next((a for a in argv if not a.startswith("--")), "/tmp/demo-out/fused.safetensors")
    torch.manual_seed(0)
    model = vitfast.load(path).eval()
    batches = _val_batches()
    labels = torch.cat([y for _, y in batches])
    captured = []

    def capture(qkv, num_heads, scale=None):
        captured.append((qkv.detach().clone(), num_heads, scale))
        return torch.ops.vitfast.attention(qkv, num_heads, scale)

    fp32_logits, n_calls = _run(model, batches, capture)
    print(f"fp32 fused: top-1 {(fp32_logits.argmax(1) == labels).float().mean():.4f} ({len(labels)} images, "
          f"{n_calls} attention calls)")
    blocks = n_calls // len(batches)
    variants = {"op": lambda q, h, s: torch.ops.vitfast.attention_int8(q, h, s)} if hasattr(torch.ops.vitfast, "attention_int8") and "--no-op" not in argv else {}
    if "--variants" in argv:
        variants["ref quantized-sum"] = lambda q, h, s: attention_int8_unchecked(q, h, s, _norm="quantized")
        variants["ref fp32-sum"] = lambda q, h, s: attention_int8_unchecked(q, h, s, _norm="fp32")
    print("per-block relative error ||int8 - fp32|| / ||fp32|| (all val images):")
    for name, fn in variants.items():
        errs = []
        for b in range(blocks):
            num, den = 0.0, 0.0
            for i in range(b, len(captured), blocks):
                qkv, h, s = captured[i]
                ref = torch.ops.vitfast.attention(qkv, h, s)
                num += float((fn(qkv, h, s) - ref).double().pow(2).sum())
                den += float(ref.double().pow(2).sum())
            errs.append((num / den) ** 0.5)
        print(f"  {name:20s} " + " ".join(f"{e:.4f}" for e in errs))
    qmodel = vitfast.quantize(vitfast.load(path).eval(), attention="int8")
    q_logits, _ = _run(qmodel, batches)
    fp32_pred = fp32_logits.argmax(1)

    def report(name, logits):
        pred = logits.argmax(1)
        print(f"  {name:34s} top-1 {(pred == labels).float().mean():.4f}  agreement vs fp32 fused "
              f"{(pred == fp32_pred).float().mean():.4f}")

    print("end to end (360 val images):")
    report("int8 model, fp32 attention", q_logits)
    for name, fn in variants.items():
        logits = _run(qmodel, batches, fn)[0]
        report(f"int8 model, attention_int8 [{name}]", logits)
        print(f"    vs the int8 model with fp32 attention: argmax agreement "
              f"{(logits.argmax(1) == q_logits.argmax(1)).float().mean():.4f}, logits relative error "
              f"{float((logits - q_logits).norm() / q_logits.norm()):.4f}")
        report(f"fp32 model, attention_int8 [{name}]", _run(model, batches, fn)[0])


if __name__ == "__main__":
    main(sys.argv[1:])
