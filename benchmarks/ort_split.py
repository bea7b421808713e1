"""Where vitfast and ONNX Runtime differ on the same fused model: the transformer blocks, or everything else.

    .venv/bin/python benchmarks/ort_split.py                                # DeiT-Ti/S/B θ=0.75, batch 1, 1 thread
    .venv/bin/python benchmarks/ort_split.py --models deit_tiny --rounds 300

For each model, one process times six callables interleaved (one call of each per round, in rotating order):
the whole fused model in ORT and in vitfast, the same model with its blocks removed (patch embedding, cls/pos
tokens, final norm, head) in both, and one block alone (block 5, exported on its own) in both.  Every ONNX graph
is exported through vitfast's reference path (`vitfast.export`), as `vitfast bench`'s "ORT fused" provider is.
It prints latency medians and, per part, the median over the rounds of ORT time ÷ vitfast time in the same round
(> 1: vitfast faster), with p10–p90.  "blocks (difference)" is whole minus no-blocks, from the medians.  On a
shared 2-core machine, whole-model paired ratios of two runs moments apart differed by up to 6%; compare parts of
one run.  Not a pytest suite: a report.  `--record NAME` also writes the table into
benchmarks/results/<date>-<machine>.json (see results_file.py), from which docs/performance.md's table is made.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cputime_vs_ort import build  # noqa: E402  (the same baseline/fused/ONNX construction)
from results_file import command_line, record  # noqa: E402

from vitfast.bench import paired_speedups  # noqa: E402
from vitfast.export import ort_session, reference_backend, to_onnx  # noqa: E402


def export_block(block: nn.Module, tokens: torch.Tensor, path: str) -> None:
    with torch.no_grad(), reference_backend():
        torch.onnx.export(block, (tokens,), path, opset_version=17, dynamo=False, input_names=["x"],
                          output_names=["y"])


def measure(model_key: str, theta: float, rounds: int, workdir: str) -> None:
    _, fused, full_path = build(model_key, theta, workdir)
    no_blocks = copy.deepcopy(fused)
    no_blocks.blocks = nn.Sequential()
    no_blocks_path = os.path.join(workdir, f"{model_key}_no_blocks.onnx")
    to_onnx(no_blocks, no_blocks_path, input_shape=(3, 224, 224))
    block = fused.blocks[min(5, len(fused.blocks) - 1)]
    tokens = torch.randn(1, fused.patch_embed.num_patches + fused.num_prefix_tokens, fused.embed_dim)
    block_path = os.path.join(workdir, f"{model_key}_block.onnx")
    export_block(block, tokens, block_path)
    x = torch.randn(1, 3, 224, 224)
    sessions = {part: ort_session(p, 1) for part, p in
                (("whole", full_path), ("no blocks", no_blocks_path), ("one block", block_path))}
    feeds = {"whole": x.numpy(), "no blocks": x.numpy(), "one block": tokens.numpy()}
    ours = {"whole": lambda: fused(x), "no blocks": lambda: no_blocks(x), "one block": lambda: block(tokens)}
    calls = {}
    for part, session in sessions.items():
        name = session.get_inputs()[0].name
        calls[("ort", part)] = (lambda s=session, n=name, f=feeds[part]: s.run(None, {n: f}))
        calls[("vitfast", part)] = ours[part]
    keys = list(calls)
    times = {k: [] for k in keys}
    with torch.inference_mode():
        for _ in range(3):
            for f in calls.values():
                f()
        for r in range(rounds):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                t0 = time.perf_counter()
                calls[k]()
                times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{model_key}, batch 1, 1 thread, {rounds} rounds")
    print(f"  {'part':20s} {'ORT ms':>9s} {'vitfast ms':>11s}  ORT / vitfast, paired (p10-p90)")
    for part in sessions:
        ratio, p10, p90 = paired_speedups(times[("ort", part)], times[("vitfast", part)])
        print(f"  {part:20s} {med[('ort', part)]:9.3f} {med[('vitfast', part)]:11.3f}  {ratio:.3f} ({p10:.3f}-{p90:.3f})")
    ort_blocks = med[("ort", "whole")] - med[("ort", "no blocks")]
    our_blocks = med[("vitfast", "whole")] - med[("vitfast", "no blocks")]
    print(f"  {'blocks (difference)':20s} {ort_blocks:9.3f} {our_blocks:11.3f}  {ort_blocks / our_blocks:.3f} "
          "(from the medians)", flush=True)
    whole = paired_speedups(times[("ort", "whole")], times[("vitfast", "whole")])
    rest = paired_speedups(times[("ort", "no blocks")], times[("vitfast", "no blocks")])[0]
    one = paired_speedups(times[("ort", "one block")], times[("vitfast", "one block")])[0]
    return {"model": model_key, "whole": round(whole[0], 3), "whole_p10": round(whole[1], 2),
            "whole_p90": round(whole[2], 2), "blocks": round(ort_blocks / our_blocks, 3), "one_block": round(one, 3),
            "rest": round(rest, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="deit_tiny,deit_small,deit_base")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--theta", type=float, default=0.75)
    parser.add_argument("--record", metavar="NAME", help="also write the table NAME into benchmarks/results/")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: expected a positive int, got {args.rounds}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="vitfast-ort-split-") as workdir:
        rows = [measure(model_key.strip(), args.theta, args.rounds, workdir) for model_key in args.models.split(",")]
    if args.record:
        print(record(args.record, {
            "title": "ONNX Runtime against vitfast, split into the blocks and the rest of the model",
            "script": "benchmarks/ort_split.py", "command": command_line(),
            "conditions": f"batch 1, one thread, θ = {args.theta}; paired ORT ÷ vitfast medians over {args.rounds} "
                          "interleaved rounds (above 1 vitfast is faster); 'rest' = patch embedding, tokens, final "
                          "norm, head; 'blocks' = whole − rest, from the medians",
            "columns": [
                {"label": "model", "fmt": "{model}"},
                {"label": "whole model (p10–p90)", "fmt": "{whole:.3f} ({whole_p10:.2f}–{whole_p90:.2f})"},
                {"label": "blocks", "fmt": "{blocks:.3f}"},
                {"label": "one block alone", "fmt": "{one_block:.3f}"},
                {"label": "rest", "fmt": "{rest:.3f}"},
            ],
            "rows": rows,
        }))


if __name__ == "__main__":
    main()
