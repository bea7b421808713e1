"""Benchmark of a fused ViT's whole forward as one C++ call (`vitfast.nn.vit.FusedVisionTransformer`,
csrc/ops/vit_forward.h) against the module path it replaces and against ONNX Runtime fp32 on the same fused graph.

Providers, one model (random weights; RePaViT θ = 0.75 BN-variant FFNs unless named otherwise), one call of each per
round, the order rotating
(harness.run_interleaved; `ort` is the baseline of the ratios, so each is ort ÷ provider, paired):
  modules   timm's forward over the fused modules (`VisionTransformer.forward`): what the model ran before, each
            block already one `vit_block` call
  one_call  `model(x)`: the whole forward in one `vitfast._C._vit_forward` call (the same bits)
  ort       ONNX Runtime fp32 on the same fused graph (`vitfast.export.to_onnx`, non-spinning threads): the anchor

`test_vit_forward_int8_interleaved` does the same for `vitfast.quantize(model)` (dynamic per-token int8: the stem,
attention linears and FFNs int8; the non-deep XWX and DW-conv attentions fp32) against ONNX Runtime's
`quantize_dynamic` of the same fused graph (`ort_int8`, the baseline there).

`test_vit_forward_bf16_interleaved`: a bf16 model (`vitfast.quantize(model, dtype="bf16")`, FusedBlock models only:
the other blocks' bf16 keeps the module path) on bf16 images, where the CPU has a bf16 extension, against
OpenVINO's default precision on the same fused graph (bf16 on such a CPU; `openvino`, the baseline there).

The call saves a fixed cost per forward (module calls, timm's Python, each op's entry), so it shows on small models
at batch 1: the digits demo's shape (width 96, 4 blocks, 17 tokens) is the case it was built for; DeiT-Ti shows what
is left of it at ImageNet size.  `ort ÷ one_call` above 1 is vitfast ahead; the report line says SLOWER where it
is not.

    .venv/bin/python -m pytest benchmarks/bench_vit_forward.py
"""
from __future__ import annotations

import pytest
import torch

import vitfast
from harness import interleaved_rounds, run_interleaved

THETA = 0.75
# name: (timm config, image side, vitfast.convert.from_timm options).  "demo": the digits demo's model
# (vitfast.demos.demo: width 96, 4 blocks, 32 px images in patches of 8, 10 classes); "demo_nondeep" the same
# joined into two-branch non-deep blocks (XWX attention), "demo_dwconv" with blocks 1-3 on drop-in DW-conv heads,
# "demo_usdc" with USDC batch gates on every block (random gate weights: each block's decision is the untrained
# network's).
_DEMO = dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=3, num_classes=10)
MODELS = {
    "demo": (_DEMO, 32, dict(channel_idle=THETA, norm="batch")),
    "demo_nondeep": (_DEMO, 32, dict(branches=2)),
    "demo_dwconv": (_DEMO, 32, dict(channel_idle=THETA, norm="batch", dwconv_blocks=[1, 2, 3])),
    "demo_usdc": (_DEMO, 32, dict(channel_idle=THETA, norm="batch", gates=True, gate_search=False)),
    "deit_tiny": (dict(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3, num_classes=1000), 224,
                  dict(channel_idle=THETA, norm="batch")),
    # the bf16 benchmark only (the bf16 cell: DeiT-S, batch 1, one thread)
    "deit_small": (dict(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6, num_classes=1000), 224,
                   dict(channel_idle=THETA, norm="batch")),
}
FP32_MODELS = [n for n in MODELS if n != "deit_small"]
_CACHE: dict = {}


def _model(name, tmp_path_factory):
    if name not in _CACHE:
        from timm.models.vision_transformer import VisionTransformer

        from vitfast.export import to_onnx
        from vitfast.measure import flops_per_image

        cfg, side, options = MODELS[name]
        torch.manual_seed(0)
        train = vitfast.convert.from_timm(VisionTransformer(**cfg).eval(), **options).eval()
        for block in train.blocks:
            if hasattr(block, "set_lambda"):
                block.set_lambda(1.0)  # non-deep: joining finished, the blocks collapse exactly
        fused = vitfast.fuse(train).eval()
        path = str(tmp_path_factory.mktemp("vit_forward") / f"{name}.onnx")
        to_onnx(fused, path, input_shape=(3, side, side))
        with vitfast.export.reference_backend():
            flops = flops_per_image(fused, (3, side, side))
        _CACHE.clear()
        _CACHE[name] = (fused, path, side, flops)
    return _CACHE[name]


def _run_three(benchmark, fns: dict, case: tuple, threads: int, flops: int) -> None:
    """The anchor (fns' first key: each ratio is anchor ÷ provider, paired), the module path and the one call,
    interleaved; one report line."""
    anchor = next(iter(fns))
    rounds = interleaved_rounds(flops, threads, 3, seconds=4.0)
    entry = run_interleaved(benchmark, fns, (), case, threads, flops, rounds=rounds)
    providers = entry["providers"]
    benchmark.extra_info.update(providers)
    one, mod = providers["one_call"], providers["modules"]
    print(f"\n{case}: one_call {one['median'] * 1e6:.0f} us, modules {mod['median'] * 1e6:.0f} us, {anchor} "
          f"{providers[anchor]['median'] * 1e6:.0f} us; {anchor} / one_call {one['ratio_median']:.3f}x "
          f"({one['ratio_p10']:.2f}-{one['ratio_p90']:.2f}){'' if one['ratio_median'] >= 1 else ' (vitfast SLOWER)'}, "
          f"{anchor} / modules {mod['ratio_median']:.3f}x{'' if mod['ratio_median'] >= 1 else ' (SLOWER)'}")


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("name", FP32_MODELS)
def test_vit_forward_interleaved(benchmark, tmp_path_factory, name, batch, threads):
    from timm.models.vision_transformer import VisionTransformer

    from vitfast.export import ort_session

    fused, path, side, flops_per_image = _model(name, tmp_path_factory)
    x = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(0))
    session = ort_session(path, threads, spinning=False)
    input_name, xn = session.get_inputs()[0].name, x.numpy()
    with torch.no_grad():
        want = VisionTransformer.forward(fused, x)
        assert torch.equal(fused(x), want)  # the one call has the module path's bits
        torch.testing.assert_close(torch.from_numpy(session.run(None, {input_name: xn})[0]), want, rtol=1e-4,
                                   atol=1e-4)
    # ONNX Runtime first: each provider's per-round ratio is then ort ÷ provider, paired (above 1: faster than it).
    fns = {"ort": lambda: session.run(None, {input_name: xn}), "modules": lambda: VisionTransformer.forward(fused, x),
           "one_call": lambda: fused(x)}
    _run_three(benchmark, fns, (name, f"b{batch}", f"t{threads}", "interleaved"), threads, flops_per_image * batch)


@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("name", [n for n in FP32_MODELS if n != "deit_tiny"])
def test_vit_forward_int8_interleaved(benchmark, tmp_path_factory, name, batch):
    """vitfast int8 (module path and one call) against ONNX Runtime's dynamic int8 on the same fused graph, one
    thread."""
    from timm.models.vision_transformer import VisionTransformer

    from vitfast.bench_runtimes import quantize_ort_dynamic
    from vitfast.export import ort_session

    fused, path, side, flops_per_image = _model(name, tmp_path_factory)
    q = vitfast.quantize(fused)
    int8_path = path.replace(".onnx", ".int8.onnx")
    quantize_ort_dynamic(path, int8_path)
    x = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(0))
    session = ort_session(int8_path, 1, spinning=False)
    input_name, xn = session.get_inputs()[0].name, x.numpy()
    with torch.no_grad():
        assert torch.equal(q(x), VisionTransformer.forward(q, x))  # the one call has the module path's bits
    fns = {"ort_int8": lambda: session.run(None, {input_name: xn}), "modules": lambda: VisionTransformer.forward(q, x),
           "one_call": lambda: q(x)}
    _run_three(benchmark, fns, (name, f"b{batch}", "t1", "int8", "interleaved"), 1, flops_per_image * batch)


@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("name", ["demo", "deit_tiny", "deit_small"])
def test_vit_forward_bf16_interleaved(benchmark, tmp_path_factory, name, batch):
    """vitfast bf16 (module path and one call) against OpenVINO's default precision on the same fused graph, one
    thread."""
    from timm.models.vision_transformer import VisionTransformer

    if vitfast.ops.bf16_kernel() == "none":
        pytest.skip("no CPU bf16 extension: a bf16 model computes in fp32 (and takes the module path)")
    openvino = pytest.importorskip("openvino")
    fused, path, side, flops_per_image = _model(name, tmp_path_factory)
    model = vitfast.quantize(fused, dtype="bf16")
    core = openvino.Core()
    x = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(0))
    ov_model = core.read_model(path)
    ov_model.reshape(list(x.shape))  # a static shape, as vitfast bench's OpenVINO rows (bench_runtimes.py)
    compiled = core.compile_model(ov_model, "CPU", {"INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY",
                                                    "NUM_STREAMS": 1})
    request = compiled.create_infer_request()
    xb, xn = x.to(torch.bfloat16), x.numpy()
    with torch.no_grad():
        assert torch.equal(model(xb), VisionTransformer.forward(model, xb))  # the one call has the module path's bits
    fns = {"openvino": lambda: request.infer({0: xn}), "modules": lambda: VisionTransformer.forward(model, xb),
           "one_call": lambda: model(xb)}
    _run_three(benchmark, fns, (name, f"b{batch}", "t1", "bf16", "interleaved"), 1, flops_per_image * batch)
