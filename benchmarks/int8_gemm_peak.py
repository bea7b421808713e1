"""The int8 GEMM core against the core's instruction peaks and against the fp32 GEMM, on one core: builds the C++
benchmark `bench_gemm_int8` (csrc/bench/bench_gemm_int8.cpp) with CMake (the helpers of tests/cmake_tree.py), runs
it and prints its table; --record writes the tables `int8_gemm_peaks`, `int8_gemm_shapes`,
`softmax_quantize_rows` (attention's P in one pass against the two steps with the fp32 exp) and, on AMX hosts,
`amx_int8_bounds` (the AMX kernel's distance from the `tdpbssd` peak split into its parts) into benchmarks/results/
(results_file.py), --json prints the program's JSON report.

The anchor: ONNX Runtime's `MatMulInteger` (u8 activations × s8 weights -> int32, the GEMM of its dynamic int8
quantization, MLAS) at the same shapes on one thread, timed by this script right after the program (rows
"ORT MatMulInteger"; a lighter job than vitfast's, which also applies the fp32 epilogue).  --no-ort skips it.

    python benchmarks/int8_gemm_peak.py [--rounds 7] [--record] [--json] [--scalar]

The program times with the thread's CPU time (on a shared machine wall time counts other processes' slices) and
measures the peaks inside every shape's interleaved rounds, so a figure and the peak it is divided by come from
the same minutes; each figure is the median of the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from cmake_tree import run, tool  # noqa: E402


def build(build_dir: str, target: str = "bench_gemm_int8") -> str:
    """Configures (once) and builds one benchmark target only; returns the program's path."""
    cmake = tool("cmake")
    assert cmake, "cmake not found (pip install cmake, or apt-get install cmake)"
    gen = ["-G", "Ninja"] if tool("ninja") else []
    if gen and tool("ninja") != __import__("shutil").which("ninja"):
        gen += [f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}"]
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        run([cmake, "-S", ROOT, "-B", build_dir, *gen, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_TESTING=OFF"])
    run([cmake, "--build", build_dir, "--parallel", str(min(2, os.cpu_count() or 1)), "--target", target])
    return os.path.join(build_dir, target)


def measure(program: str, rounds: int, scalar: bool) -> dict:
    cmd = [program, "--json", "--rounds", str(rounds)] + (["--scalar"] if scalar else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600).stdout
    return json.loads(out)


ORT_SHAPES = [("DeiT-S qkv", 197, 384, 1152), ("DeiT-S proj", 197, 384, 384), ("DeiT-S fc1", 197, 384, 1536),
              ("DeiT-S fc2", 197, 1536, 384), ("DeiT-B qkv", 197, 768, 2304), ("DeiT-B proj", 197, 768, 768),
              ("DeiT-B fc1", 197, 768, 3072), ("DeiT-B fc2", 197, 3072, 768)]


def ort_matmul_integer_rows(report: dict, rounds: int) -> list[dict]:
    """ORT's MatMulInteger at ORT_SHAPES, one thread: median over `rounds` timings of ~20 ms each, against the best
    int8 peak the program measured (the AMX one where there is one)."""
    import time

    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    peak = next((p for p in report["peaks"] if p["name"].startswith("int8")), None)
    rng = np.random.default_rng(1)
    rows = []
    for name, m, k, n in ORT_SHAPES:
        w = rng.integers(-127, 128, (k, n), dtype=np.int8)
        graph = helper.make_graph(
            [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "mm",
            [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])],
            [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, n])], [numpy_helper.from_array(w, "B")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        a = {"A": rng.integers(0, 256, (m, k), dtype=np.uint8)}
        sess.run(None, a)
        t0 = time.process_time()
        sess.run(None, a)
        reps = max(1, int(0.02 / max(time.process_time() - t0, 1e-6)))
        times = []
        for _ in range(rounds):
            t0 = time.process_time()  # CPU time, as the program's figures
            for _ in range(reps):
                sess.run(None, a)
            times.append((time.process_time() - t0) / reps)
        us = float(np.median(times)) * 1e6
        gops = 2.0 * m * k * n / us * 1e-3
        rows.append({"shape": name, "mkn": f"{m}x{k}x{n}", "variant": "ORT MatMulInteger (MLAS, int32 out)",
                     "us": round(us, 2), "gops": round(gops, 2), "peak": peak["name"] if peak else "",
                     "pct_peak": round(100.0 * gops / peak["gops"], 1) if peak else 0.0, "quant_us": 0.0})
    return rows


def print_table(report: dict) -> None:
    print("peaks (one core, register-only loops):")
    for p in report["peaks"]:
        print(f"  {p['name']:40s} {p['gops']:8.1f} GOPS")
    print(f"\n{'shape':22s} {'m x k x n':14s} {'variant':18s} {'us/call':>9s} {'GOPS':>8s} {'% peak':>7s} "
          f"{'quant us':>9s}")
    for r in report["rows"]:
        quant = f"{r['quant_us']:9.1f}" if r["variant"].startswith("int8") else ""
        print(f"{r['shape']:22s} {r['mkn']:14s} {r['variant']:18s} {r['us']:9.1f} {r['gops']:8.1f} "
              f"{r['pct_peak']:6.1f}% {quant}")
    if report.get("amx_bounds"):
        print("\nAMX kernel against the tdpbssd peak, split (n = 1152, 192 rows):")
        for r in report["amx_bounds"]:
            print(f"  k = {r['k']:4d}  {r['part']:40s} {r['gops']:8.1f} GOPS {r['pct_peak']:6.1f}%")
    print("\nattention's P, 197 x 197 scores in row pairs (softmax_quantize_rows against the fp32-exp two steps):")
    for r in report.get("softmax_quantize", []):
        print(f"  [{r['isa']}] one pass {r['fused_us']:.1f} us, two steps {r['two_steps_us']:.1f} us "
              f"({r['two_steps_us'] / r['fused_us']:.2f}x)")


def record_tables(report: dict, rounds: int, command: str, emulated: str | None = None) -> None:
    import results_file

    def record(name: str, table: dict) -> str:
        if emulated:
            import cpuid_mask

            table["conditions"] = cpuid_mask.describe(emulated) + table["conditions"]
        return results_file.record(f"emulated_{emulated}_{name}" if emulated else name, table)

    conditions = (f"one thread, thread CPU time, medians of {rounds} interleaved rounds (peaks measured inside every "
                  f"round); quantize_rows on the {report['quantize_isa']} path")
    record("int8_gemm_peaks", {
        "title": "Instruction peaks of one core (register-only loops of independent instructions)",
        "script": "benchmarks/int8_gemm_peak.py", "command": command, "conditions": conditions,
        "columns": [{"label": "loop", "fmt": "{name}"}, {"label": "GOPS (2 per multiply-add)", "fmt": "{gops:.1f}"}],
        "rows": [{"name": p["name"], "gops": round(p["gops"], 1)} for p in report["peaks"]],
    })
    path = record("int8_gemm_shapes", {
        "title": "gemm_int8 (every kernel) and the fp32 gemm at DeiT-S/B shapes, one core",
        "script": "benchmarks/int8_gemm_peak.py", "command": command, "conditions": conditions,
        "columns": [
            {"label": "shape", "fmt": "{shape}"},
            {"label": "m × k × n", "fmt": "{mkn}"},
            {"label": "variant", "fmt": "{variant}"},
            {"label": "µs", "fmt": "{us:.1f}"},
            {"label": "GOPS", "fmt": "{gops:.1f}"},
            {"label": "% of peak", "fmt": "{pct_peak:.1f}%"},
            {"label": "peak", "fmt": "{peak}"},
            {"label": "quantize_rows µs", "fmt": "{quant_us:.1f}"},
        ],
        "rows": report["rows"],
    })
    if report.get("softmax_quantize"):
        record("softmax_quantize_rows", {
            "title": "attention's P: softmax_quantize_rows (one pass on x86, the exp for 8-bit results) against "
                     "softmax_exp_rows (the fp32 exp) + quantize_rows",
            "script": "benchmarks/int8_gemm_peak.py", "command": command,
            "conditions": f"one thread, thread CPU time, medians of {rounds} interleaved rounds; 197 x 197 scores "
                          "(N(0, 8)), row pairs, scale 1/8",
            "columns": [{"label": "CPU path", "fmt": "{isa}"}, {"label": "one pass µs", "fmt": "{fused_us:.1f}"},
                        {"label": "two steps, fp32 exp µs", "fmt": "{two_steps_us:.1f}"}],
            "rows": report["softmax_quantize"],
        })
    if report.get("amx_bounds"):
        record("amx_int8_bounds", {
            "title": "The AMX int8 kernel against the tdpbssd peak, split: its 32 × 32 block with every operand in L1, "
                     "with B's panel pairs streamed from L2, and the whole kernel",
            "script": "benchmarks/int8_gemm_peak.py", "command": command,
            "conditions": f"one thread, thread CPU time, medians of {rounds} interleaved rounds with the peak measured "
                          "in each; n = 1152 (36 panel pairs), 192 rows (6 row blocks), 64-byte aligned operands; "
                          "kernel = gemm_int8 on kAmxInt8 (A rows from memory, fp32 epilogue)",
            "columns": [{"label": "k (bytes)", "fmt": "{k}"}, {"label": "what runs", "fmt": "{part}"},
                        {"label": "GOPS", "fmt": "{gops:.1f}"}, {"label": "% of tdpbssd peak", "fmt": "{pct_peak:.1f}%"}],
            "rows": report["amx_bounds"],
        })
    print(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scalar", action="store_true", help="also the scalar int8 kernel (slow)")
    parser.add_argument("--record", action="store_true", help="write the tables into benchmarks/results/")
    parser.add_argument("--json", action="store_true", help="print the program's JSON report instead of the table")
    parser.add_argument("--no-ort", action="store_true", help="skip the ONNX Runtime MatMulInteger anchor rows")
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build", "int8-bench"))
    parser.add_argument("--emulate", choices=("avx2", "avx_vnni", "avx512"), default=None,
                        help="run on a CPU view masked to this profile (cpuid_mask.py; the program and ORT alike); "
                             "the tables are recorded as emulated_<profile>_<table>")
    args = parser.parse_args()
    if args.emulate:
        import cpuid_mask

        cpuid_mask.reexec(args.emulate)
    report = measure(build(args.build_dir), args.rounds, args.scalar)
    if not args.no_ort:
        try:
            report["rows"] += ort_matmul_integer_rows(report, args.rounds)
        except ImportError as e:
            print(f"onnxruntime/onnx not importable ({e}): no ORT anchor rows")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    if args.record:
        from results_file import command_line

        record_tables(report, args.rounds, command_line(), args.emulate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
