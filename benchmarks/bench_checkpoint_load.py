"""What the checkpoint safeguards cost and save: `vitfast.load` of a fused DeiT-B with and without checksum
verification (interleaved rounds, medians), and the time a config bomb takes to be refused.

    python benchmarks/bench_checkpoint_load.py [--rounds 7] [--record]

--record writes the tables `checkpoint_checksum` and `checkpoint_bombs` into benchmarks/results/ (results_file.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _fused_deit_b(path: str) -> None:
    import timm

    import vitfast
    from vitfast.convert import from_timm

    torch.manual_seed(0)
    model = timm.create_model("deit_base_patch16_224", pretrained=False).eval()
    vitfast.save(vitfast.fuse(from_timm(model, channel_idle=0.75).eval()), path)


def checksum_cost(path: str, rounds: int) -> dict:
    import vitfast
    from vitfast.io import _checksum

    vitfast.load(path)  # warm: imports, page cache
    times = {True: [], False: []}
    for r in range(rounds):
        for verify in ((True, False) if r % 2 == 0 else (False, True)):  # alternate the order: no drift bias
            t0 = time.perf_counter()
            vitfast.load(path, verify=verify)
            times[verify].append(time.perf_counter() - t0)
    from safetensors.torch import load_file

    tensors = load_file(path)
    t0 = time.perf_counter()
    for t in tensors.values():
        _checksum.tensor_crc(t)
    crc_s = time.perf_counter() - t0
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"file_mb": os.path.getsize(path) / 1e6, "verify_s": on, "no_verify_s": off,
            "overhead": on / off - 1.0, "crc_only_s": crc_s}


BOMBS = {
    "depth=10^5": lambda c: c["architecture"]["kwargs"].update(depth=10**5),
    "depth=10^9": lambda c: c["architecture"]["kwargs"].update(depth=10**9),
    "embed_dim=2^40": lambda c: c["architecture"]["kwargs"].update(embed_dim=2**40),
    "num_classes=10^7": lambda c: c["architecture"]["kwargs"].update(num_classes=10**7),
    "mlp_ratio=10^5": lambda c: c["architecture"]["kwargs"].update(mlp_ratio=1e5),
}


def bomb_times(directory: str) -> list:
    import timm
    from safetensors import safe_open
    from safetensors.torch import save_file

    import vitfast
    from vitfast.convert import from_timm
    from vitfast.io import _checksum

    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5).eval()
    base = os.path.join(directory, "tiny.safetensors")
    vitfast.save(vitfast.fuse(from_timm(vit, channel_idle=0.75).eval()), base)
    vitfast.load(base)
    rows = []
    with safe_open(base, framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    for name, change in BOMBS.items():
        config = json.loads(meta["config"])
        change(config)
        bad_meta = dict(meta, config=json.dumps(config))
        bad_meta["checksum"] = _checksum.record(tensors, bad_meta["config"])  # re-signed: the range checks decide
        path = os.path.join(directory, "bomb.safetensors")
        save_file(tensors, path, metadata=bad_meta)
        t0 = time.perf_counter()
        try:
            vitfast.load(path)
            outcome = "LOADED"
        except ValueError as e:
            outcome = str(e).split(": ", 1)[1][:110]
        rows.append({"config": name, "file_kb": round(os.path.getsize(path) / 1024, 1),
                     "seconds": round(time.perf_counter() - t0, 4), "outcome": outcome})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "deit_b.safetensors")
        _fused_deit_b(path)
        cost = checksum_cost(path, args.rounds)
        bombs = bomb_times(directory)
    print(f"fused DeiT-B/0.75 file {cost['file_mb']:.0f} MB: load with verify {cost['verify_s'] * 1e3:.0f} ms, "
          f"without {cost['no_verify_s'] * 1e3:.0f} ms (+{cost['overhead'] * 100:.1f}%); CRC-32 of every tensor alone "
          f"{cost['crc_only_s'] * 1e3:.0f} ms")
    for row in bombs:
        print(f"{row['config']:18s} {row['file_kb']:6.1f} KB  {row['seconds'] * 1e3:7.1f} ms  {row['outcome']}")
    if args.record:
        from results_file import record

        command = "python benchmarks/bench_checkpoint_load.py --record"
        record("checkpoint_checksum", {
            "title": "vitfast.load of a fused DeiT-B/0.75 with and without checksum verification",
            "script": "benchmarks/bench_checkpoint_load.py", "command": command,
            "conditions": f"random weights, prepack on, {torch.get_num_threads()} threads, medians of {args.rounds} "
                          f"interleaved rounds, file in the page cache",
            "columns": [
                {"label": "file (MB)", "fmt": "{file_mb:.0f}"},
                {"label": "load, verify (ms)", "fmt": "{verify_ms:.0f}"},
                {"label": "load, verify=False (ms)", "fmt": "{no_verify_ms:.0f}"},
                {"label": "overhead", "fmt": "{overhead_pct:+.1f}%"},
                {"label": "CRC-32 alone (ms)", "fmt": "{crc_ms:.0f}"},
            ],
            "rows": [{"file_mb": round(cost["file_mb"], 1), "verify_ms": round(cost["verify_s"] * 1e3, 1),
                      "no_verify_ms": round(cost["no_verify_s"] * 1e3, 1),
                      "overhead_pct": round(cost["overhead"] * 100, 2), "crc_ms": round(cost["crc_only_s"] * 1e3, 1)}],
        })
        path = record("checkpoint_bombs", {
            "title": "Time to refuse a re-signed config bomb (tiny fused ViT file)",
            "script": "benchmarks/bench_checkpoint_load.py", "command": command,
            "conditions": "in-process vitfast.load after a warm-up load; the checksum record recomputed, so the "
                          "range and tensor checks decide",
            "columns": [{"label": "config", "fmt": "{config}"}, {"label": "file (KB)", "fmt": "{file_kb}"}, {"label": "refused in (s)", "fmt": "{seconds}"},
                        {"label": "message", "fmt": "{outcome}"}],
            "rows": bombs,
        })
        print(f"recorded in {path}")


if __name__ == "__main__":
    main()
