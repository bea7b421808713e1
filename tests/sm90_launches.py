"""Every Triton kernel of kernels/, compiled for an H100 (sm_90) at the argument types its launchers really pass.

The interpreter runs a kernel's Python body, so it accepts what a GPU compile rejects (a constexpr used as a
runtime value, a dot on a tile side under 16, shared memory beyond 227 KB, ...).  Three kernels have their own
sm_90 tests with performance assertions (ln_linear, attention, gated attention); this covers all of them for
legality only, so that a change to any kernel is compiled by CI as the GPU would compile it.

    record(path)    under TRITON_INTERPRET=1: runs each launcher once per dtype on small ViT-like shapes, records
                    every launch (kernel, argument types, constexpr values, warps/stages) and writes them to `path`
    compile(path)   with the interpreter off: compiles each recorded launch for sm_90 — an autotuned kernel at
                    every config of its autotuner, not only the interpreter's one — and asks ptxas to assemble it
                    (where triton ships ptxas); prints a count per kernel, or raises listing every launch that
                    fails

Argument types follow what triton's JIT does on a launch: a tensor is a pointer to its dtype (16-byte aligned:
ptxas may then vectorise), an int equal to 1 a constexpr, an int divisible by 16 carries that divisibility, a
float is fp32.  The INTERPRET_BF16 constexpr (the interpreter's bf16 emulation) is False on a GPU.
"""
from __future__ import annotations

import inspect
import json
import numbers
import os
import sys

# Launch options a recorded launch carries (triton.Config.all_kwargs() on the autotuned path).
OPTIONS = ("num_warps", "num_stages", "maxnreg")
DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.int32": "i32",
          "torch.int64": "i64", "torch.int8": "i8", "torch.uint8": "u8", "torch.bool": "i1"}


# ---------------------------------------------------------------------------------------------- recording
class InterpreterBroken(RuntimeError):
    """This triton's interpreter cannot run kernels here (tests/interpreter_probe.py): nothing can be recorded."""


def _describe(value):
    import torch

    if isinstance(value, torch.Tensor):
        return ["ptr", DTYPES[str(value.dtype)], value.data_ptr() % 16 == 0]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return ["const", value]
    if isinstance(value, numbers.Integral):  # numpy integers too
        return ["int", int(value)]
    if isinstance(value, numbers.Real):
        return ["float", float(value)]
    return ["const", repr(value)]


def _launches():
    """(what, launcher, args, kwargs): each launcher in fp32 and fp16 (bf16: the fp16 launches with bf16 pointers,
    `compile`; numpy, which the interpreter computes in, has no bf16, and the kernels' bf16 emulation is a constexpr
    the GPU build drops)."""
    import torch
    from helpers import make_xwx_args
    from vitfast.kernels.attention import attention_triton
    from vitfast.kernels.batch_gate import batch_gate_logits_triton, batch_gate_triton, gate_select_triton
    from vitfast.kernels.channel_idle_ffn import channel_idle_ffn_triton
    from vitfast.kernels.dwconv_attention import dwconv_attention_triton
    from vitfast.kernels.gated import gated_ffn_triton, gated_mhsa_triton
    from vitfast.kernels.ln_linear import ln_linear_triton, row_stats_triton
    from vitfast.kernels.vit_block import vit_block_triton
    from vitfast.kernels.xwx_attention import xwx_attention_triton

    def uni(*shape, fan_in, dtype):
        return ((torch.rand(*shape) * 2 - 1) / max(fan_in, 1) ** 0.5).to(dtype)

    c, heads, tokens, batch, grid = 64, 2, 17, 2, 4
    for dt in (torch.float32, torch.float16):
        x = torch.randn(batch, tokens, c).to(dt)
        res = torch.randn(batch, tokens, c).to(dt)
        w_qkv, b_qkv = uni(3 * c, c, fan_in=c, dtype=dt), uni(3 * c, fan_in=c, dtype=dt)
        w_proj, b_proj = uni(c, c, fan_in=c, dtype=dt), uni(c, fan_in=c, dtype=dt)
        w_in, b_in = uni(2 * c, c, fan_in=c, dtype=dt), uni(2 * c, fan_in=c, dtype=dt)  # θ = 0.5: c active, c idle
        w_out, b_out = uni(c, c, fan_in=c, dtype=dt), uni(c, fan_in=c, dtype=dt)
        gate = torch.tensor([1.0, 1.0], dtype=dt)
        gate_net = [x, uni(32, c, fan_in=c, dtype=dt), uni(32, fan_in=c, dtype=dt), uni(2, 32, fan_in=32, dtype=dt),
                    uni(2, fan_in=32, dtype=dt), True, "gelu", 1e-5]
        xwx = [a.to(dt) if isinstance(a, torch.Tensor) else a for a in make_xwx_args(batch, tokens, c, heads, 16, 32)]
        n = 1 + grid * grid
        dw = [torch.randn(batch, n, c).to(dt), uni(c, c, fan_in=c, dtype=dt), uni(c, fan_in=c, dtype=dt),
              (torch.randn(c, 3, 3) / 3).to(dt), uni(c, c, fan_in=c, dtype=dt), uni(c, fan_in=c, dtype=dt), grid, grid,
              torch.randn(batch, n, c).to(dt)]
        yield "attention", attention_triton, (torch.randn(batch, tokens, 3 * c).to(dt), heads), {}
        yield "vit_block", vit_block_triton, (x, 1e-6, w_qkv, b_qkv, heads, w_proj, b_proj, 1e-6, w_in, b_in, w_out,
                                              b_out, True), {}
        for norm in ("explicit", "fold"):
            yield f"ln_linear {norm}", ln_linear_triton, (x, w_in, b_in), {"eps": 1e-6, "gelu_cols": c, "norm": norm}
        yield "ln_linear split-K", ln_linear_triton, (x, w_proj, b_proj), {"residual": res, "emit_stats": True, "split_k": 2}
        yield "ln_linear split-K, LayerNorm", ln_linear_triton, (x, w_proj, b_proj), {"eps": 1e-6, "residual": res,
                                                                                     "split_k": 3}
        yield "row_stats", row_stats_triton, (x,), {}
        yield "channel_idle_ffn", channel_idle_ffn_triton, (x, w_in, b_in, w_out, b_out, res), {}
        yield "gated_mhsa", gated_mhsa_triton, (gate, 0, x, 1e-6, w_qkv, b_qkv, heads, w_proj, b_proj), {}
        yield "gated_ffn", gated_ffn_triton, (gate, 1, x, 1e-6, w_in, b_in, w_out, b_out, True), {}
        yield "batch_gate", batch_gate_triton, gate_net, {}
        yield "batch_gate_logits", batch_gate_logits_triton, gate_net, {}
        yield "gate_select", gate_select_triton, (gate, 0, x, res), {}
        yield "xwx_attention", xwx_attention_triton, xwx, {}
        for path in ("fused", "split"):
            yield f"dwconv_attention {path}", dwconv_attention_triton, dw, {"path": path}


def record(path: str) -> None:
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError("record: expected TRITON_INTERPRET=1 (the launches run on the interpreter)")
    from interpreter_probe import copy_probe
    from triton.runtime.interpreter import InterpretedFunction

    try:
        ok = copy_probe()
    except Exception as exc:
        raise InterpreterBroken(f"{type(exc).__name__}: {exc}") from exc
    if not ok:
        raise InterpreterBroken("a trivial copy kernel copies wrongly")

    seen, launches = set(), []
    run = InterpretedFunction.run

    def recording_run(self, *args, **kwargs):
        # (grid and warmup are keywords of run(); the rest are the kernel's arguments and launch options)
        names = list(inspect.signature(self.fn).parameters)
        values = dict(zip(names, args))
        values.update({k: v for k, v in kwargs.items() if k in names})
        entry = {
            "module": self.fn.__module__, "name": self.fn.__name__,
            "args": {name: _describe(values[name]) for name in names if name in values},
            "options": {k: kwargs[k] for k in OPTIONS if kwargs.get(k) is not None},
        }
        key = json.dumps(entry, sort_keys=True)
        if key not in seen:
            seen.add(key)
            launches.append(entry)
        return run(self, *args, **kwargs)

    InterpretedFunction.run = recording_run
    try:
        for what, launcher, args, kwargs in _launches():
            try:
                launcher(*args, **kwargs)
            except Exception as exc:
                raise RuntimeError(f"{what}: {exc}") from exc
    finally:
        InterpretedFunction.run = run
    with open(path, "w") as f:
        json.dump(launches, f)


# ---------------------------------------------------------------------------------------------- compiling
def _jit_and_autotuners(module_name: str, name: str):
    """The JITFunction `name` of a kernels module and every autotuner over it (module globals)."""
    import importlib

    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    module = importlib.import_module(module_name)
    jit, tuners = None, []
    for value in vars(module).values():
        inner, chain = value, []
        while not isinstance(inner, JITFunction) and hasattr(inner, "fn"):
            chain.append(inner)
            inner = inner.fn
        if isinstance(inner, JITFunction) and inner.fn.__name__ == name:
            jit = inner
            tuners += [t for t in chain if isinstance(t, Autotuner)]
    if jit is None:
        raise LookupError(f"{module_name}.{name}: no JITFunction of that name in the module")
    return jit, tuners


def _source(jit, args, constexpr_overrides):
    from triton.compiler import ASTSource

    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(jit.arg_names):
        kind = args.get(name)
        if i in jit.constexprs:
            value = constexpr_overrides.get(name, kind[1] if kind is not None else None)
            if name.startswith("INTERPRET"):
                value = False  # the interpreter's emulation switches
            constexprs[name] = value
            signature[name] = "constexpr"
        elif kind is None:
            raise ValueError(f"{jit.fn.__name__}: argument {name} was not recorded")
        elif kind[0] == "ptr":
            signature[name] = "*" + kind[1]
            if kind[2]:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif kind[0] == "int":
            value = kind[1]
            if value == 1 and i not in jit.do_not_specialize:
                signature[name] = "constexpr"
                constexprs[name] = 1
            else:
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
                if value % 16 == 0 and i not in jit.do_not_specialize:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif kind[0] == "float":
            signature[name] = "fp32"
        else:  # a bool, None or a string passed to a non-constexpr parameter: triton makes it a constexpr
            signature[name] = "constexpr"
            constexprs[name] = kind[1]
    return ASTSource(fn=jit, signature=signature, constexprs=constexprs, attrs=attrs)


def _plan(launches):
    """(label, module, kernel name, args, constexpr overrides, options) to compile: every launch at its own options (a
    kernel without an autotuner) or at each autotuner's first config (the GPU scripts' VITFAST_TRITON_AUTOTUNE=0
    choice), and every config of an autotuner once per kernel and precision (fp32, or 16-bit), at the first such
    launch.  fp16 launches are compiled as bf16, the GPU path's usual dtype (both lower to the same 16-bit MMAs)."""
    plan, swept = [], set()
    for entry in launches:
        tuners = _jit_and_autotuners(entry["module"], entry["name"])[1]
        args = {name: (["ptr", "bf16", kind[2]] if kind[0] == "ptr" and kind[1] == "fp16" else kind)
                for name, kind in entry["args"].items()}
        low = any(kind[0] == "ptr" and kind[1] == "bf16" for kind in args.values())
        if not tuners:
            variants = [({}, entry["options"])]
        else:
            sweep = (entry["module"], entry["name"], low) not in swept
            swept.add((entry["module"], entry["name"], low))
            variants = [(dict(cfg.kwargs), {k: v for k, v in cfg.all_kwargs().items() if k in OPTIONS and v is not None})
                        for tuner in tuners for cfg in (tuner.configs if sweep else tuner.configs[:1])]
        for overrides, options in variants:
            label = f"{entry['module']}.{entry['name']} ({'16-bit' if low else 'fp32'}) {overrides} {options}"
            plan.append((label, entry["module"], entry["name"], args, overrides, options))
    return plan


def _compile_one(item):
    import triton
    from sm90 import ptxas_report
    from triton.backends.compiler import GPUTarget

    label, module, name, args, overrides, options = item
    try:
        jit = _jit_and_autotuners(module, name)[0]
        kernel = triton.compile(_source(jit, args, overrides), target=GPUTarget("cuda", 90, 32), options=dict(options))
        if kernel.metadata.shared > 227 * 1024:
            raise RuntimeError(f"shared memory {kernel.metadata.shared} B > 227 KB")
        ptxas_report(kernel)  # assembles the PTX: a ptxas error raises
    except Exception as exc:  # noqa: BLE001 - name the launch, keep the compiler's message
        return f"{label}: {type(exc).__name__}: {str(exc)[-2000:]}"
    return None


def compile(path: str, workers: int = 2) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from vitfast.kernels._common import AUTOTUNE

    if not AUTOTUNE:  # the autotuners would hold their first config only (the test suite's default)
        raise RuntimeError("compile: expected VITFAST_TRITON_AUTOTUNE=1 (or unset) when the kernels are imported")
    with open(path) as f:
        plan = _plan(json.load(f))
    unique = {}
    for item in plan:
        key = json.dumps(item[1:], sort_keys=True)
        unique.setdefault(key, item)
    items = list(unique.values())
    with ProcessPoolExecutor(max_workers=workers) as pool:
        failures = [f for f in pool.map(_compile_one, items) if f is not None]
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(items)} launches do not compile for sm_90:\n" + "\n".join(failures))
    counts = {}
    for item in items:
        counts[f"{item[1]}.{item[2]}"] = counts.get(f"{item[1]}.{item[2]}", 0) + 1
    for kernel, count in sorted(counts.items()):
        print(f"{kernel}: {count} compiled")
    print(f"{len(items)} launches of {len(counts)} kernels compile for sm_90")


if __name__ == "__main__":
    {"record": record, "compile": compile}[sys.argv[1]](sys.argv[2])
