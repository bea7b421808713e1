"""vitfast.cuda_graph: GPU inference replayed from CUDA graphs.

The wrapper's bookkeeping (signatures, input buffers, eviction, output structures, errors) runs everywhere through
a stand-in for the CUDA side that keeps a graph's semantics: the "capture" runs the forward once on the graph's own
input buffers, and a "replay" runs it again on those buffers and writes the result into the captured output
tensors in place.  The real capture and replay run in the CUDA tests (a GPU machine: benchmarks/gpu_check_*.sh).
"""
from __future__ import annotations

import collections

import pytest
import timm
import torch
import torch.nn as nn

import vitfast
from vitfast.cuda_graphs import CudaGraphModule

CUDA = torch.cuda.is_available()


class _StandInGraphs:
    device_type = "cpu"

    def __init__(self) -> None:
        self.warm_calls = 0
        self.captures = 0
        self.replays = 0
        self.fail_capture = None

    def warm(self, fn, device, calls):
        for _ in range(calls):
            fn()
        self.warm_calls += calls

    def capture(self, fn, device):
        if self.fail_capture is not None:
            raise self.fail_capture
        self.captures += 1
        return fn, fn()

    def replay(self, graph, device):
        self.replays += 1
        # The graph's outputs are fixed tensors: copy a fresh evaluation into them, as a replay writes in place.
        fresh = graph()
        outs = getattr(graph, "_outputs", None)
        if outs is None:
            raise AssertionError("replay before the wrapper registered the outputs")
        for dst, src in zip(outs, _tensors(fresh)):
            with torch.inference_mode(dst.is_inference()):  # a replay writes the memory, whatever the mode
                dst.copy_(src)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    return [t for v in out for t in _tensors(v)]


def _wrap(module, **kw):
    backend = _StandInGraphs()
    wrapper = CudaGraphModule(module, _graphs=backend, **kw)
    original = wrapper._capture

    def capture_and_register(*args):
        entry = original(*args)
        entry.graph._outputs = entry.outputs  # the stand-in's replay writes into them
        return entry

    wrapper._capture = capture_and_register
    return wrapper, backend


class _Affine(nn.Module):
    def __init__(self, out="tensor"):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.out = out
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        if self.out == "tuple":
            return y, y.sum(-1)
        if self.out == "dict":
            return {"logits": y, "parts": [y * 2, (y - 1,)]}
        if self.out == "namedtuple":
            return _Pair(y, -y)
        if self.out == "int":
            return 3
        if self.out == "return_types":
            return torch.max(y, dim=-1)
        return y


_Pair = collections.namedtuple("_Pair", "first second")


def test_replays_use_each_calls_inputs_and_capture_once_per_signature():
    module = _Affine().eval()
    wrapper, backend = _wrap(module, warmup=3)
    xs = [torch.randn(2, 4) for _ in range(3)]
    for x in xs:
        torch.testing.assert_close(wrapper(x), module.lin(x), rtol=0, atol=0)
    assert backend.captures == 1 and backend.warm_calls == 3 and backend.replays == 3 and wrapper.graphs == 1
    # a new batch size is a new signature; the old graph stays
    torch.testing.assert_close(wrapper(torch.ones(5, 4)), module.lin(torch.ones(5, 4)), rtol=0, atol=0)
    assert backend.captures == 2 and wrapper.graphs == 2
    wrapper(xs[0])
    assert backend.captures == 2
    # a new dtype is a new signature too
    module.double()
    wrapper.reset()
    wrapper(xs[0].double())
    assert wrapper.graphs == 1


def test_inputs_are_copied_not_captured_by_reference():
    module = _Affine().eval()
    wrapper, _ = _wrap(module)
    x = torch.randn(2, 4)
    x0 = x.clone()
    first = wrapper(x)
    x.add_(100.0)  # the caller's tensor changes after the call: the next call with new data must see only that
    y = torch.randn(2, 4)
    torch.testing.assert_close(wrapper(y), module.lin(y), rtol=0, atol=0)
    torch.testing.assert_close(first, module.lin(x0), rtol=0, atol=0)


def test_first_call_under_inference_mode_then_outside():
    # The graph's input buffers must not be inference tensors: a later call outside inference mode copies into them.
    module = _Affine().eval()
    wrapper, _ = _wrap(module)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    with torch.inference_mode():
        wrapper(x)
    torch.testing.assert_close(wrapper(y), module.lin(y).detach(), rtol=0, atol=0)
    with torch.inference_mode():
        torch.testing.assert_close(wrapper(x), module.lin(x), rtol=0, atol=0)


def test_least_recently_used_graph_is_dropped_past_max_graphs():
    wrapper, backend = _wrap(_Affine().eval(), max_graphs=2)
    a, b, c = (torch.randn(n, 4) for n in (1, 2, 3))
    wrapper(a)
    wrapper(b)
    wrapper(a)  # a is now the most recent: c evicts b
    wrapper(c)
    assert wrapper.graphs == 2 and backend.captures == 3
    wrapper(a)
    assert backend.captures == 3
    wrapper(b)
    assert backend.captures == 4


def test_clone_output_false_returns_the_graphs_own_buffers():
    module = _Affine().eval()
    wrapper, _ = _wrap(module, clone_output=False)
    x1, x2 = torch.randn(2, 4), torch.randn(2, 4)
    out1 = wrapper(x1)
    out2 = wrapper(x2)
    assert out1.data_ptr() == out2.data_ptr()  # overwritten in place, as documented
    torch.testing.assert_close(out1, module.lin(x2), rtol=0, atol=0)
    cloned, _ = _wrap(module)
    assert cloned(x1).data_ptr() != cloned(x2).data_ptr()


@pytest.mark.parametrize("kind", ["tuple", "dict", "namedtuple", "return_types"])
def test_output_structures_are_rebuilt(kind):
    module = _Affine(kind).eval()
    wrapper, _ = _wrap(module)
    x = torch.randn(3, 4)
    got, want = wrapper(x), module(x)
    assert type(got) is type(want)
    for g, w in zip(_tensors(got), _tensors(want)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    if kind == "dict":
        assert isinstance(got["parts"], list) and isinstance(got["parts"][1], tuple)
    if kind == "namedtuple":
        torch.testing.assert_close(got.second, -module.lin(x))


def test_parameters_are_read_in_place_and_moving_drops_the_graphs():
    module = _Affine().eval()
    wrapper, backend = _wrap(module)
    x = torch.randn(2, 4)
    wrapper(x)
    with torch.no_grad():
        module.lin.weight.mul_(2.0)  # in place: the replay sees it
    torch.testing.assert_close(wrapper(x), module.lin(x), rtol=0, atol=0)
    assert backend.captures == 1
    wrapper.to(torch.float64)
    assert wrapper.graphs == 0
    torch.testing.assert_close(wrapper(x.double()), module.lin(x.double()), rtol=0, atol=0)


def test_autocast_state_is_part_of_the_signature():
    module = _Affine().eval()
    wrapper, backend = _wrap(module)
    x = torch.randn(2, 4)
    assert wrapper(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = wrapper(x)
        expect = module.lin(x)
    assert y.dtype == torch.bfloat16 and backend.captures == 2
    torch.testing.assert_close(y, expect, rtol=0, atol=0)


def test_bad_use_is_refused_with_the_argument_named():
    module = _Affine()
    wrapper, _ = _wrap(module)
    with pytest.raises(RuntimeError, match=r"module: _Affine is in training mode.*\.eval\(\)"):
        wrapper(torch.randn(2, 4))
    module.eval()
    with pytest.raises(ValueError, match=r"inputs\[0\]: requires_grad=True"):
        wrapper(torch.randn(2, 4, requires_grad=True))
    with pytest.raises(TypeError, match=r"inputs\[1\]: expected a tensor.*got int"):
        wrapper(torch.randn(2, 4), 3)
    with pytest.raises(TypeError, match=r"keyword arguments are not captured, got \['scale'\]"):
        wrapper(torch.randn(2, 4), scale=2.0)
    with pytest.raises(ValueError, match=r"inputs: expected at least one tensor"):
        wrapper()
    with pytest.raises(ValueError, match=r"module: its parameters are on meta, the input on cpu"):
        _wrap(_Affine().eval().to("meta"))[0](torch.randn(2, 4))
    with pytest.raises(TypeError, match=r"output: a CUDA graph can only return tensors.*got int"):
        _wrap(_Affine("int").eval())[0](torch.randn(2, 4))
    with pytest.raises(TypeError, match=r"module: expected a torch.nn.Module, got function"):
        CudaGraphModule(lambda x: x)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"max_graphs: expected a positive int"):
            CudaGraphModule(module, max_graphs=bad)
    for bad in (0, 1.5, False):
        with pytest.raises(ValueError, match=r"warmup: expected an int >= 1"):
            CudaGraphModule(module, warmup=bad)
    # the real (CUDA) wrapper refuses a CPU tensor before touching CUDA
    with pytest.raises(ValueError, match=r"inputs\[0\]: expected a CUDA tensor.*got device cpu"):
        CudaGraphModule(module)(torch.randn(2, 4))


def test_capture_failure_names_the_module_and_the_likely_cause():
    wrapper, backend = _wrap(_Affine().eval())
    backend.fail_capture = RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
    with pytest.raises(RuntimeError, match=r"capturing _Affine for inputs \[\(2, 4\)\] failed.*synchronises with "
                                           r"the host.*operation not permitted when stream is capturing\)"):
        wrapper(torch.randn(2, 4))
    assert wrapper.graphs == 0


@pytest.mark.skipif(CUDA, reason="checks the message of a machine without CUDA")
def test_cuda_graph_needs_cuda():
    with pytest.raises(RuntimeError, match=r"cuda_graph: torch.cuda.is_available\(\) is False"):
        vitfast.cuda_graph(_Affine().eval())


def test_save_writes_the_wrapped_model(tmp_path):
    model = vitfast.fuse(vitfast.convert.from_timm(_tiny_timm(), channel_idle=0.75).eval())
    wrapper, _ = _wrap(model)
    path = str(tmp_path / "m.safetensors")
    vitfast.save(wrapper, path)
    loaded = vitfast.load(path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_public_names():
    assert vitfast.cuda_graph is vitfast.cuda_graphs.cuda_graph
    assert vitfast.CudaGraphModule is CudaGraphModule


# --- on a GPU: real captures of fused models --------------------------------------------------------------------

def _tiny_timm(**kw):
    args = dict(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=2, num_classes=7)
    args.update(kw)
    return timm.models.vision_transformer.VisionTransformer(**args).eval()


def _fused_models():
    torch.manual_seed(0)
    yield "channel_idle", vitfast.fuse(vitfast.convert.from_timm(_tiny_timm(), channel_idle=0.75).eval())
    yield "dwconv", vitfast.fuse(vitfast.convert.from_timm(_tiny_timm(), dwconv_blocks=[1],
                                                          dwconv_heads={2: [0]}).eval())
    yield "gated", vitfast.fuse(vitfast.convert.from_timm(_tiny_timm(), gates=True, gate_search=False,
                                                          gate_kind="G1").eval())
    yield "timm", _tiny_timm()


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_graph_of_fused_models_matches_eager(dtype):
    for name, model in _fused_models():
        model = model.cuda().to(dtype)
        graphed = vitfast.cuda_graph(model)
        for batch in (1, 4, 1):
            for seed in range(2):
                g = torch.Generator().manual_seed(seed + 10 * batch)
                x = torch.randn(batch, 3, 32, 32, generator=g).cuda().to(dtype)
                with torch.no_grad():
                    want = model(x)
                got = graphed(x)
                torch.cuda.synchronize()
                tol = 1e-5 if dtype == torch.float32 else 2e-3
                torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{name} b{batch}: {m}")
        assert graphed.graphs == 2, name


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_cuda_graph_under_autocast_and_after_load(tmp_path):
    model = dict(_fused_models())["channel_idle"]
    path = str(tmp_path / "fused.safetensors")
    vitfast.save(model, path)
    loaded = vitfast.load(path).cuda()
    graphed = vitfast.cuda_graph(loaded)
    x = torch.randn(2, 3, 32, 32).cuda()
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), loaded(x), rtol=1e-5, atol=1e-5)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got, want = graphed(x), loaded(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-2, atol=5e-2)
    assert graphed.graphs == 2
