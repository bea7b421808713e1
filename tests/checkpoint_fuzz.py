"""Checkpoint fuzzer: mutates a fused file's header, config and data and loads each mutant in a worker process.

Each mutant is classified:
  clean error   a ValueError/TypeError naming the file (what vitfast.load promises for any bad file)
  equal load    loaded, and the model's output equals the original's bit for bit
  loaded as declared   (re-signed config mutants only) loaded a model that differs as its edited config says
                (other outputs, or other inputs: a forward of the original input may then fail)
  unclean error any other exception, or one that does not name the file
  silent wrong  loaded with other outputs from a file whose checksum record was *not* recomputed
  hang          no answer within the per-case timeout
  crash         the worker process died
  huge alloc    the worker's peak RSS grew by more than the bound while loading it

Mutation families (seeded, so a failure reproduces by its seed and index):
  header   a random byte of the safetensors JSON header, the 8-byte length prefix, or a tensor entry's shape,
           dtype or offsets (parsed and re-encoded)
  config   a random value inside the config replaced by an "interesting" one (0, -1, huge ints, 1e308, wrong
           types, ...) or a key removed/added; stale checksum record
  resigned the same config mutations with the checksum record recomputed, as a deliberate editor would do: the
           range and tensor checks behind the checksum must hold on their own
  data     one random bit of the tensor data flipped

Run standalone for a longer campaign: python tests/checkpoint_fuzz.py --cases 2000 --seed 1
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

WORKER = r'''
import faulthandler, json, os, resource, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent dumps a hung worker's stacks
import torch
import vitfast
torch.set_num_threads(1)
# Warm up on the intact bases first (imports, lazy modules, first-call set-up), so a case's time is its own.
refs = {}
for base in sys.argv[1:]:
    refs[base] = torch.load(base + ".out.pt")
    vitfast.load(base, prepack=False)(refs[base][0])
print("READY", flush=True)
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
for line in sys.stdin:
    case = json.loads(line)
    x, expected = refs[case["base"]]
    before, t0 = rss(), time.perf_counter()
    print("START", case["index"], flush=True)
    if case.get("simulate") == "crash":  # the harness's own test: a dying and a stuck worker are classified
        os._exit(3)
    if case.get("simulate") == "hang":
        time.sleep(3600)
    try:
        model = vitfast.load(case["path"], verify=case["verify"], prepack=False)
        try:
            with torch.no_grad():
                out = model(x)
            same = out.shape == expected.shape and torch.equal(out, expected)
            kind, message = ("equal load" if same else "loaded differently"), ""
        except Exception as e:  # a model that loaded but takes other inputs (a re-signed img_size, say)
            kind, message = "loaded differently", f"forward: {type(e).__name__}: {e}"
    except (ValueError, TypeError) as e:
        message = str(e)
        kind = "clean error" if case["path"] in message and "\n" not in message.strip() else "unclean error"
    except BaseException as e:  # noqa: BLE001 - classified, not hidden
        kind, message = "unclean error", f"{type(e).__name__}: {e}"
    print("RESULT", json.dumps({"index": case["index"], "kind": kind, "seconds": time.perf_counter() - t0,
                                "rss_growth": rss() - before, "message": message[:300]}), flush=True)
'''

INTERESTING = [0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**9, 10**30, 1e308, -1e308, 0.5, 1e-300, True, False, None, "x", "",
               [], {}, [0, 0], [10**9, 10**9], [1, 2, 3]]


def make_base_files(directory: str) -> List[str]:
    """Small real fused models (channel-idle ViT, Swin, a dwconv-attention ViT) and their outputs on one input."""
    import timm
    import torch

    import vitfast
    from vitfast.convert import from_timm

    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5).eval()
    swin = timm.models.swin_transformer.SwinTransformer(
        img_size=32, patch_size=4, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5).eval()
    models = {"vit": vitfast.fuse(from_timm(vit, channel_idle=0.75).eval()), "swin": vitfast.fuse(from_timm(swin).eval())}
    models["dwconv"] = vitfast.fuse(from_timm(vit, dwconv_blocks=[1]).eval())
    paths = []
    x = torch.randn(2, 3, 32, 32)
    for name, model in models.items():
        path = os.path.join(directory, f"{name}.safetensors")
        vitfast.save(model, path)
        with torch.no_grad():
            torch.save((x, vitfast.load(path, prepack=False)(x)), path + ".out.pt")
        paths.append(path)
    return paths


def _split(data: bytes):
    n = int.from_bytes(data[:8], "little")
    return n, json.loads(data[8:8 + n]), data[8 + n:]


def _join(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + body


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, path + (i,))
    yield path


def _set(root, path, value):
    for key in path[:-1]:
        root = root[key]
    root[path[-1]] = value


def _mutate_config(config: dict, rng: random.Random) -> None:
    paths = [p for p in _leaves(config) if p and p[0] in ("architecture", "modules", "aliases", "dtype", "buffer_dtypes")]
    path = rng.choice(paths)
    op = rng.random()
    if op < 0.15 and len(path) > 1 and isinstance(_get(config, path[:-1]), dict):
        del _get(config, path[:-1])[path[-1]]
    elif op < 0.25 and isinstance(_get(config, path[:-1]), dict):
        _get(config, path[:-1])["unexpected_" + str(rng.randrange(100))] = rng.choice(INTERESTING)
    else:
        old = _get(config, path)
        if isinstance(old, (int, float)) and not isinstance(old, bool) and rng.random() < 0.4:
            new = rng.choice([old * 2, old + 1, old - 1, old * 1000, -old, old / 2])
        else:
            new = rng.choice(INTERESTING)
        _set(config, path, new)


def _get(root, path):
    for key in path:
        root = root[key]
    return root


def mutate(base: bytes, family: str, rng: random.Random) -> bytes:
    from vitfast.io import _checksum

    n, header, body = _split(base)
    if family == "header":
        choice = rng.random()
        if choice < 0.4:
            data = bytearray(base)
            data[8 + rng.randrange(n)] = rng.randrange(256)
            return bytes(data)
        if choice < 0.5:
            data = bytearray(base)
            data[rng.randrange(8)] = rng.randrange(256)
            return bytes(data)
        name = rng.choice([k for k in header if k != "__metadata__"])
        field = rng.choice(["shape", "dtype", "data_offsets"])
        entry = header[name]
        if field == "dtype":
            entry["dtype"] = rng.choice(["F16", "BF16", "F64", "I64", "U8", "BOOL", "F8_E4M3", "Q4", ""])
        elif field == "shape":
            shape = entry["shape"]
            if shape and rng.random() < 0.7:
                shape[rng.randrange(len(shape))] = rng.choice([0, 1, 2, 10**6, 2**40])
            else:
                entry["shape"] = shape + [rng.choice([1, 2])]
        else:
            start, end = entry["data_offsets"]
            entry["data_offsets"] = rng.choice([[start, end + 4], [start + 4, end], [end, start], [0, end - start],
                                                [start, 2**62]])
        return _join(header, body)
    if family in ("config", "resigned"):
        meta = header["__metadata__"]
        config = json.loads(meta["config"])
        _mutate_config(config, rng)
        meta["config"] = json.dumps(config, sort_keys=True)
        if family == "resigned":
            from safetensors.torch import load as st_load

            meta[_checksum.KEY] = _checksum.record(st_load(base), meta["config"])
        return _join(header, body)
    if family == "data":
        data = bytearray(base)
        pos = 8 + n + rng.randrange(len(body))
        data[pos] ^= 1 << rng.randrange(8)
        return bytes(data)
    raise ValueError(f"family: expected header, config, resigned or data, got {family!r}")


class Worker:
    """One warm loader process.  Its stdout is read by a thread into a queue, so every wait has a timeout (select()
    on the pipe would miss lines already sitting in the reader's buffer)."""

    def __init__(self, bases: List[str]) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        # stderr to a file, not a pipe: an undrained pipe fills up (timm/torch log lines) and blocks the worker.
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the worker
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, *bases], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env, bufsize=1)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        line = self._next(300)
        if line is None or line.strip() != "READY":
            raise RuntimeError(f"the fuzz worker did not start: {line!r} {self.stacks()}")

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # EOF: the worker exited

    def _next(self, timeout: float) -> Optional[str]:
        try:
            return self.lines.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def run(self, case: dict, timeout: float) -> dict:
        """The worker's result, or {"kind": "hang"/"crash"} (the worker is then dead)."""
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        dead = {"index": case["index"], "seconds": timeout, "rss_growth": 0}
        line = self._next(60)  # a warm worker picks a case up at once
        while line is not None and line.startswith("START"):
            line = self._next(timeout)
        if line is None:
            return {**dead, "kind": "hang", "message": self.stacks()}
        if line == "":
            return {**dead, "kind": "crash", "message": f"worker exited with {self.proc.wait()}: {self.stacks()}"}
        return json.loads(line[len("RESULT "):])

    def stacks(self) -> str:
        """The worker's Python stacks (faulthandler on SIGUSR1) and stderr tail; the worker is killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            self.proc.kill()
        self.proc.wait()
        self.stderr.seek(0)
        text = self.stderr.read()[-3000:]
        self.stderr.close()
        return text

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        if not self.stderr.closed:
            self.stderr.close()


def run_campaign(directory: str, cases, seed: int, timeout: float = 10.0,
                 families=("header", "config", "resigned", "data"), keep: bool = False) -> Dict[str, object]:
    """Mutate, load and classify `cases` files; returns counts per family and class, and the failures."""
    bases = make_base_files(directory)
    raw = {b: Path(b).read_bytes() for b in bases}
    counts: Dict[str, collections.Counter] = {f: collections.Counter() for f in families}
    failures: List[dict] = []
    slowest = 0.0
    worker = Worker(bases)
    try:
        for index in (range(cases) if isinstance(cases, int) else cases):
            family = families[index % len(families)]
            rng = random.Random(f"{seed}-{index}")  # one stream per case: a failure reproduces alone
            base = bases[rng.randrange(len(bases))]
            path = os.path.join(directory, f"case{index}.safetensors")
            with open(path, "wb") as f:
                f.write(mutate(raw[base], family, rng))
            bound = 64 * 2**20 + 16 * len(raw[base])  # "a small multiple of the file's size", plus slack
            result = worker.run({"index": index, "path": path, "base": base, "verify": True}, timeout)
            if result["kind"] in ("hang", "crash"):
                worker = Worker(bases)
            kind = result["kind"]
            if result.get("rss_growth", 0) > bound:
                kind = "huge alloc"
            if kind == "loaded differently":
                kind = "loaded as declared" if family == "resigned" else "silent wrong"
            slowest = max(slowest, result.get("seconds", 0.0))
            counts[family][kind] += 1
            if kind not in ("clean error", "equal load", "loaded as declared"):
                failures.append({"index": index, "family": family, "base": os.path.basename(base), "kind": kind,
                                 "message": result.get("message", "")})
            if not keep:
                os.unlink(path)
    finally:
        worker.close()
    return {"counts": {f: dict(c) for f, c in counts.items()}, "failures": failures, "slowest_case_s": slowest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--only", type=int, nargs="*", help="run these case indices and keep their files in --dir")
    parser.add_argument("--dir", help="where --only leaves the mutated files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.dir or scratch
        t0 = time.perf_counter()
        result = run_campaign(directory, args.only if args.only else args.cases, args.seed, args.timeout,
                              keep=bool(args.only))
    print(json.dumps(result, indent=1))
    print(f"{len(args.only) if args.only else args.cases} cases in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
