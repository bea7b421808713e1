"""USDC modules and model tools: gate networks (G0…G6, fold into batch_gate), group-level augmentation, the
train-time USDCBlock (gates + static compression), stage-2 pruning, fusion into FusedGatedBlock, checkpoints, the
resource loss and the Trainer hooks."""
import copy
import json
import os

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast import reference
from vitfast.nn import FusedBlock, FusedBatchGate, FusedGatedBlock, set_gate_force
from vitfast.methods.usdc import GateNet, GateSearch, USDCBlock
from vitfast.methods.usdc.gates import GATE_KINDS, group_features, group_ids, group_sizes, hard_gates
from vitfast.nn._base import apply_norm

from helpers import assert_close_scaled, randomize

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_vit(depth=3, dim=32, heads=4, img=16, patch=4, classes=10):
    return VisionTransformer(img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads,
                             num_classes=classes).eval()


def randomise_gate(gate_net):
    # Gates start "execute everything"; random weights make the decisions depend on the input.
    with torch.no_grad():
        for p in gate_net.parameters():
            p.normal_(0, 0.5)
        for m in gate_net.modules():
            if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)


# ---------------------------------------------------------------------------------------------- groups
def test_group_sizes_recursive_log2_split():
    assert group_sizes(256) == [128, 64, 32, 16, 8, 4, 2, 1, 1]
    assert group_sizes(10) == [5, 2, 1, 1, 1]
    assert group_sizes(1) == [1]
    for b in range(1, 70):
        assert sum(group_sizes(b)) == b
    with pytest.raises(ValueError, match="batch"):
        group_sizes(0)


def test_group_ids_are_a_shuffled_assignment():
    g = torch.Generator().manual_seed(0)
    ids = group_ids(64, g)
    assert sorted(torch.bincount(ids).tolist(), reverse=True) == group_sizes(64)
    assert not torch.equal(ids, group_ids(64, torch.Generator().manual_seed(1)))


def test_group_features_levels():
    f = torch.randn(16, 5)
    assert torch.equal(group_features(f, "sample"), f)
    torch.testing.assert_close(group_features(f, "batch"), f.mean(0, keepdim=True).expand(16, 5))
    grouped = group_features(f, "group", torch.Generator().manual_seed(3))
    ids = group_ids(16, torch.Generator().manual_seed(3))
    for gid in ids.unique():
        rows = grouped[ids == gid]
        torch.testing.assert_close(rows, f[ids == gid].mean(0, keepdim=True).expand_as(rows))
    with pytest.raises(ValueError, match="level"):
        group_features(f, "token")


def test_hard_gates_are_one_hot_with_gradient():
    logits = torch.randn(6, 2, 2, requires_grad=True)
    g = hard_gates(logits, training=True)
    assert set(g.unique().tolist()) <= {0.0, 1.0}
    g.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert torch.equal(hard_gates(logits, training=False), (logits[..., 0] > logits[..., 1]).float())


# ---------------------------------------------------------------------------------------------- gate networks
@pytest.mark.parametrize("kind", GATE_KINDS)
def test_gate_net_folds_exactly_into_batch_gate(kind):
    dim = 24
    net = GateNet(kind, dim).eval()
    randomise_gate(net)
    fused = FusedBatchGate.from_gate_net(net)
    for seed in range(6):
        torch.manual_seed(seed)
        x = torch.randn(3, 7, dim) + torch.randn(dim)
        feat = x.mean(dim=(0, 1))[None]
        logits = net(feat)[0]
        d = logits[:, 0] - logits[:, 1]
        f = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in net.folded().items()}
        torch.testing.assert_close(reference.batch_gate_logits(x, **f), d, atol=1e-4, rtol=1e-4)
        if d.abs().min() > 1e-4:
            torch.testing.assert_close(fused(x), (d > 0).float(), atol=0, rtol=0)


def test_gate_net_starts_open_and_macs():
    net = GateNet("G0", 384)
    assert net.macs() == 384 * 192 + 192 * 4
    assert GateNet("G3", 384).macs() == 384 * 4
    g = hard_gates(net(torch.randn(4, 384)), training=False)
    assert torch.equal(g, torch.ones(4, 2))
    with pytest.raises(ValueError, match="kind"):
        GateNet("G7", 8)


def test_gate_search_mixes_in_training_and_selects_in_eval():
    search = GateSearch(16)
    with torch.no_grad():
        search.arch_logits.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0]))
    f = torch.randn(3, 16)
    search.train()
    out = search(f)
    out.sum().backward()
    assert search.arch_logits.grad is not None and search.arch_logits.grad.abs().sum() > 0
    search.eval()
    torch.testing.assert_close(search(f), search.candidates[2].eval()(f))
    assert search.selected() is search.candidates[2]


# ---------------------------------------------------------------------------------------------- blocks
@pytest.fixture
def block_and_input():
    torch.manual_seed(0)
    model = tiny_vit(depth=1)
    return model.blocks[0], torch.randn(3, 17, 32)


def test_forced_open_equals_ungated_fused_block(block_and_input):
    blk, x = block_and_input
    gated = USDCBlock.from_block(blk, search=False, gate_kind="G1", tokens=17).to_fused()
    randomise_gate(gated.gate)
    set_gate_force(gated, "open")
    ungated = FusedBlock.from_timm(blk)
    assert torch.equal(gated(x), ungated(x))


def test_open_gates_run_the_whole_block_op_with_the_sub_blocks_bits(block_and_input, monkeypatch):
    # Both gates open on the CPU at inference: one vit_block call (as vitfast.nn.FusedBlock), bit-equal to the two
    # sub-block calls it replaces.  One gate closed, grad mode on, or a pruned sub-block: the sub-block calls.
    import vitfast.nn.block as block_mod
    from vitfast.nn.block import whole_block_args

    blk, x = block_and_input
    gated = USDCBlock.from_block(blk, search=False, gate_kind="G1", tokens=17).to_fused()
    randomise_gate(gated.gate)
    taken = []

    def recorded(block, inp, current=None):
        args = whole_block_args(block, inp, current)
        taken.append(args is not None)
        return args

    monkeypatch.setattr(block_mod, "whole_block_args", recorded)
    set_gate_force(gated, "open")
    with torch.no_grad():
        whole = gated(x)
    assert taken == [True]
    monkeypatch.setattr(block_mod, "whole_block_args", lambda *args, **kwargs: None)
    with torch.no_grad():
        assert torch.equal(whole, gated(x))
    monkeypatch.setattr(block_mod, "whole_block_args", recorded)
    taken.clear()
    set_gate_force(gated, ("open", "closed"))
    with torch.no_grad():
        gated(x)
    assert taken == []
    set_gate_force(gated, "open")
    # grad mode on: the sub-block ops (nn.block.direct_forward declines before asking whole_block_args)
    assert torch.equal(gated(x), whole) and taken == []
    taken.clear()
    gated.mlp = None  # a pruned FFN sub-block
    with torch.no_grad():
        gated(x)
    assert taken == [False]


def test_forced_closed_skips_each_sub_block_exactly(block_and_input):
    blk, x = block_and_input
    gated = USDCBlock.from_block(blk, search=False, tokens=17).to_fused()
    ungated = FusedBlock.from_timm(blk)
    set_gate_force(gated, "closed")
    assert torch.equal(gated(x), x)
    set_gate_force(gated, ("open", "closed"))  # FFN skipped: the MHSA sub-block alone
    assert torch.equal(gated(x), ungated.attn(apply_norm(ungated.norm1, x), residual=x))  # as FusedBlock.forward
    set_gate_force(gated, ("closed", "open"))  # MHSA skipped: the FFN sub-block on the input
    assert torch.equal(gated(x), ungated.mlp(x))
    with pytest.raises(ValueError, match="force"):
        set_gate_force(gated, "ajar")


def test_closed_sub_blocks_are_not_computed(block_and_input, monkeypatch):
    blk, x = block_and_input
    gated = USDCBlock.from_block(blk, search=False, tokens=17).to_fused()
    set_gate_force(gated, "closed")

    def boom(*a, **k):
        raise AssertionError("a closed sub-block ran")

    monkeypatch.setattr(gated.attn, "forward", boom)
    monkeypatch.setattr(gated.mlp, "forward", boom)
    gated(x)


@pytest.mark.parametrize("kind", ["G0", "G1", "G3", "G5"])
def test_train_time_eval_equals_fused(block_and_input, kind):
    blk, _ = block_and_input
    block = USDCBlock.from_block(blk, search=False, gate_kind=kind, tokens=17).eval()
    randomise_gate(block.gate)
    fused = block.to_fused()
    decisions = set()
    for seed in range(8):
        torch.manual_seed(seed)
        x = torch.randn(2, 17, 32) * 2 + torch.randn(32)
        torch.testing.assert_close(fused(x), block(x), atol=1e-5, rtol=1e-5)
        decisions.add(tuple(fused.gate(x).tolist()))
    assert len(decisions) > 1  # the gate really switched between the inputs


def test_training_mixes_gates_per_sample_and_gets_gradients(block_and_input):
    blk, x = block_and_input
    block = USDCBlock.from_block(blk, level="sample", static=True, tokens=17).train()
    out = block(x)
    (out.sum() + block.last_flops).backward()
    for name in ("alpha_attn", "alpha_ffn", "alpha_heads", "alpha_channels"):
        assert getattr(block, name).grad is not None, name
    assert block.gate.arch_logits.grad is not None


def test_static_pruning_is_physical_and_exact(block_and_input):
    blk, x = block_and_input
    block = USDCBlock.from_block(blk, static=True, tokens=17).eval()
    with torch.no_grad():
        block.alpha_heads[1] = torch.tensor([-1.0, 1.0])
        block.alpha_heads[3] = torch.tensor([-1.0, 1.0])
        block.alpha_channels[::3] = torch.tensor([-1.0, 1.0])
        block.gate.arch_logits[4] = 3.0
    expect = block(x)
    pruned = block.pruned().eval()
    assert pruned.attn.num_heads == 2 and pruned.mlp.fc1.out_features == 128 - 43
    assert isinstance(pruned.gate, GateNet) and pruned.gate.kind == "G4" and not pruned.static
    torch.testing.assert_close(pruned(x), expect, atol=1e-5, rtol=1e-5)
    fused = block.to_fused()
    assert fused.attn.num_heads == 2 and fused.mlp.active_features == 85
    torch.testing.assert_close(fused(x), expect, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sub_block", ["heads", "channels"])
def test_pruning_every_head_or_channel_keeps_the_bias(sub_block):
    """All heads (channels) pruned while α keeps the sub-block: its eval output is still ls·proj.bias
    (ls·fc2.bias) whenever the gate opens; the pruned and fused models once dropped that constant (off by
    0.14 / 0.21 at output scale ~2.5)."""
    torch.manual_seed(0)
    model = vitfast.convert.from_timm(randomize(tiny_vit(depth=1)), gates=True, gate_search=False,
                                     flops_target=0.6).eval()  # random biases: the constant is not 0
    block = model.blocks[0]
    with torch.no_grad():
        block.gate.fc2.bias.copy_(torch.tensor([9.0, -9.0, 9.0, -9.0]))  # both sub-blocks' gates open
        getattr(block, "alpha_" + sub_block).copy_(torch.tensor([-3.0, 3.0]))  # every head / channel pruned
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expect = model(x)
        assert_close_scaled(vitfast.methods.usdc.prune(copy.deepcopy(model))(x), expect)
        assert_close_scaled(vitfast.fuse(model)(x), expect)
    pruned = block.pruned()
    if sub_block == "heads":
        assert pruned.attn.num_heads == 1 and not pruned.attn.proj.weight.any()
    else:
        assert pruned.mlp.fc1.out_features == 1 and not pruned.mlp.fc2.weight.any()


def test_block_level_pruning_removes_sub_blocks(block_and_input):
    blk, x = block_and_input
    block = USDCBlock.from_block(blk, static=True, tokens=17).eval()
    with torch.no_grad():
        block.alpha_attn.copy_(torch.tensor([-1.0, 1.0]))
    fused = block.to_fused()
    assert fused.attn is None and fused.norm1 is None and fused.mlp is not None
    torch.testing.assert_close(fused(x), block(x), atol=1e-5, rtol=1e-5)


def test_channel_idle_blocks_compose(block_and_input):
    from vitfast.methods.repavit import ChannelIdleBlock

    blk, x = block_and_input
    ci = ChannelIdleBlock.from_timm(blk, idle_ratio=0.5, ffn_norm="layer").eval()
    block = USDCBlock.from_block(ci, search=False, static=True, tokens=17).eval()
    assert block.alpha_channels is None and block.ffn_owned
    fused = block.to_fused()
    set_gate_force(fused, "open")
    torch.testing.assert_close(fused(x), ci(x), atol=1e-5, rtol=1e-5)
    set_gate_force(fused, None)
    torch.testing.assert_close(fused(x), block(x), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- models
def test_convert_fuse_save_load_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = vitfast.convert.from_timm(tiny_vit(), gates=True, flops_target=0.7)
    assert all(isinstance(b, USDCBlock) for b in model.blocks) and hasattr(model, "usdc_resource")
    with torch.no_grad():
        randomise_gate(model.blocks[1].gate)
        model.blocks[0].alpha_heads[0] = torch.tensor([-1.0, 1.0])
        model.blocks[2].alpha_ffn.copy_(torch.tensor([-1.0, 1.0]))
    model.eval()
    x = torch.randn(4, 3, 16, 16)
    expect = model(x)
    fused = vitfast.fuse(model)
    assert not hasattr(fused, "usdc_resource") and all(isinstance(b, FusedGatedBlock) for b in fused.blocks)
    torch.testing.assert_close(fused(x), expect, atol=1e-5, rtol=1e-5)
    path = os.path.join(tmp_path, "gated.safetensors")
    vitfast.save(fused, path)
    cfg = vitfast.io.read_config(path)
    b0, b2 = cfg["modules"]["blocks.0"], cfg["modules"]["blocks.2"]
    assert b0["kind"] == "gated_block" and b0["attn"]["num_heads"] == 3 and b2["mlp"] is None
    assert b0["gate"]["kind"] == "batch_gate"
    loaded = vitfast.load(path)
    torch.testing.assert_close(loaded(x), fused(x), atol=0, rtol=0)


def test_convert_argument_errors():
    with pytest.raises(ValueError, match="flops_target"):
        vitfast.convert.from_timm(tiny_vit(), flops_target=0.5)
    with pytest.raises(ValueError, match="flops_target"):
        vitfast.convert.from_timm(tiny_vit(), gates=True, flops_target=1.5)
    with pytest.raises(ValueError, match="level"):
        vitfast.convert.from_timm(tiny_vit(), gates=True, gate_level="token")


def test_resource_loss_is_eq9_and_pulls_flops_down():
    torch.manual_seed(0)
    model = vitfast.convert.from_timm(tiny_vit(), gates=True, flops_target=0.3).train()
    res = model.usdc_resource
    assert res.extra_loss_weight == 100.0
    model(torch.randn(8, 3, 16, 16))
    flops = res.expected_flops()
    assert 0.3 < float(flops.detach()) <= 1.0
    torch.testing.assert_close(res.extra_loss(), (flops - 0.3) ** 2)
    res.extra_loss().backward()
    # d loss / d keep-logit > 0 (keeping costs FLOPs above the target): SGD lowers every keep logit.
    assert float(model.blocks[0].alpha_heads.grad[:, 0].sum()) > 0


def test_trainer_steps_prune_and_fuse():
    from vitfast.training.trainer import Trainer

    torch.manual_seed(0)
    model = vitfast.convert.from_timm(tiny_vit(depth=2), gates=True, flops_target=0.5)
    images, labels = torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))
    loader = [(images[:8], labels[:8]), (images[8:], labels[8:])]
    before = model.blocks[0].alpha_heads.detach().clone()
    trainer = Trainer(model, loader, None, total_steps=4, lr=1e-2, progress=False)
    metrics = trainer.train_step(loader[0])
    assert any(k.startswith("extra/") for k in metrics), metrics
    trainer.fit()
    assert not torch.equal(model.blocks[0].alpha_heads.detach(), before)
    stage2 = vitfast.methods.usdc.prune(model.eval())
    assert all(not b.static and isinstance(b.gate, GateNet) for b in stage2.blocks)
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(stage2(x), model(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(vitfast.fuse(stage2)(x), model(x), atol=1e-5, rtol=1e-5)
    rates = vitfast.methods.usdc.gate_rates(stage2, [(x, None)])
    assert len(rates) == 2 and all(0.0 <= r <= 1.0 for pair in rates for r in pair)


def test_half_closed_model_skips_half_the_sub_blocks():
    torch.manual_seed(0)
    fused = vitfast.fuse(vitfast.convert.from_timm(tiny_vit(depth=4), gates=True, gate_search=False))
    for i, b in enumerate(fused.blocks):
        b.gate.force = ("open", "closed") if i % 2 else ("closed", "open")
    calls = []
    for b in fused.blocks:
        b.attn.register_forward_hook(lambda *a: calls.append("attn"))
        b.mlp.register_forward_hook(lambda *a: calls.append("mlp"))
    fused(torch.randn(2, 3, 16, 16))
    assert len(calls) == 4


# ---------------------------------------------------------------------------------------------- CUDA
def test_gated_cuda_kernel_policy():
    from vitfast.ops import use_gated_cuda_kernels

    # Measured (docstring): half precision on the gated kernels, fp32 on cuBLAS + gate_select; both forcible.
    assert use_gated_cuda_kernels(torch.float16) and use_gated_cuda_kernels(torch.bfloat16)
    assert not use_gated_cuda_kernels(torch.float32)
    assert use_gated_cuda_kernels(torch.float32, "triton")
    assert not use_gated_cuda_kernels(torch.float16, "torch")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_gated_model_matches_cpu_and_survives_graph_capture(monkeypatch):
    # On CUDA every sub-block must go through the gated ops (kernels/gated.py: the kernels read the decision and
    # return early), never through compute-then-gate_select: count the calls while the graph is captured.
    # (fp32 takes gate_select under the default policy, ops.use_gated_cuda_kernels: force the gated kernels.)
    import vitfast.nn.gated as usdc_mod
    from vitfast import _env

    monkeypatch.setattr(_env, "_cuda_kernels", "triton")

    calls = []

    def counted(name, fn):
        def run(*args):
            calls.append(name)
            return fn(*args)
        return run

    monkeypatch.setattr(usdc_mod.ops, "gated_mhsa", counted("mhsa", vitfast.ops.gated_mhsa))
    monkeypatch.setattr(usdc_mod.ops, "gated_ffn", counted("ffn", vitfast.ops.gated_ffn))
    monkeypatch.setattr(usdc_mod.ops, "gate_select", counted("select", vitfast.ops.gate_select))
    torch.manual_seed(0)
    model = vitfast.convert.from_timm(tiny_vit(depth=3), gates=True, gate_search=False, gate_kind="G1")
    for b in model.blocks:
        randomise_gate(b.gate)
    fused = vitfast.fuse(model)
    inputs = [torch.randn(4, 3, 16, 16) * s + s for s in (0.5, 1.0, 2.0, -1.0)]
    cpu_out = [fused(x) for x in inputs]
    cpu_dec = [[b.gate(t).tolist() for b, t in zip(fused.blocks, _block_inputs(fused, x))] for x in inputs]
    cuda = fused.cuda()
    static = inputs[0].cuda()
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                cuda(static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        calls.clear()
        with torch.cuda.graph(graph):
            out = cuda(static)
    assert calls == ["mhsa", "ffn"] * len(fused.blocks)
    assert len({tuple(map(tuple, d)) for d in cpu_dec}) > 1  # the inputs really take different paths
    for x, expect in zip(inputs, cpu_out):
        static.copy_(x.cuda())
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), expect, atol=2e-3, rtol=2e-3)


def _block_inputs(model, images):
    seen = []
    handles = [b.register_forward_pre_hook(lambda m, a: seen.append(a[0])) for b in model.blocks]
    with torch.no_grad():
        model(images)
    for h in handles:
        h.remove()
    return seen


def test_study_batches_are_full_and_count_each_image_once():
    from vitfast.demos.usdc_study import full_batches

    for count, bs in ((360, 64), (360, 8), (360, 1), (5, 8), (64, 64)):
        batches = full_batches(count, bs)
        assert all(len(idx) == bs for idx, _ in batches)  # every decision is taken on a batch of size bs
        counted = [i for idx, real in batches for i in idx[:real]]
        assert counted == list(range(count))  # in order, each image once
    assert full_batches(360, 64)[-1][1] == 40 and full_batches(360, 64)[-1][0][40:] == list(range(24))
    with pytest.raises(ValueError, match="batch_size"):
        full_batches(10, 0)


def test_cli_usdc_quick(tmp_path, capsys):
    from vitfast.cli import main

    out = os.path.join(tmp_path, "usdc")
    assert main(["usdc", "--quick", "--levels", "group", "--batch-sizes", "1,8", "--pretrain-steps", "5",
                 "--stage1-steps", "4", "--stage2-steps", "3", "--out", out, "--no-progress"]) == 0
    import json

    report = json.load(open(os.path.join(out, "usdc_report.json")))
    assert set(report["levels"]["group"]["acc"]) == {"1", "8"}
    fused = vitfast.load(os.path.join(out, "usdc_group.safetensors"))
    assert all(isinstance(b, FusedGatedBlock) for b in fused.blocks)
    assert main(["usdc", "--levels", "token"]) == 2


def test_cli_convert_train_prune_fuse(tmp_path):
    from vitfast.cli import main

    d = str(tmp_path)
    kwargs = '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}'
    assert main(["convert", "vit_tiny_patch16_224", "--img-size", "16", "--num-classes", "10", "--model-kwargs", kwargs,
                 "--gates", "--flops-target", "0.6", "-o", f"{d}/g.safetensors"]) == 0
    assert main(["train", f"{d}/g.safetensors", "--steps", "2", "--batch-size", "16", "--out", f"{d}/s1",
                 "--no-progress", "--arch-lr-scale", "5"]) == 0
    # --arch-lr-scale is stored with the run: another value on --resume was silently ignored (the optimizer's state
    # kept the old rates); now it is refused like any other setting, and the stored one is what the run used
    stored = json.loads(torch.load(f"{d}/s1/trainer.pt", weights_only=True)["extra"]["train_settings"])
    assert stored["arch_lr_scale"] == 5.0
    assert main(["train", "--resume", f"{d}/s1/trainer.pt", "--arch-lr-scale", "7", "--no-progress"]) == 2
    assert main(["train", "--resume", f"{d}/s1/trainer.pt", "--arch-lr-scale", "5", "--no-progress"]) == 0
    assert main(["train", f"{d}/s1/model.safetensors", "--usdc-prune", "--steps", "2", "--batch-size", "16",
                 "--out", f"{d}/s2", "--no-progress"]) == 0
    assert main(["fuse", f"{d}/s2/model.safetensors", "-o", f"{d}/fused.safetensors"]) == 0
    fused = vitfast.load(f"{d}/fused.safetensors")
    assert all(isinstance(b, FusedGatedBlock) for b in fused.blocks)
    from vitfast.io.trainable import load_trainable

    stage2, _ = load_trainable(f"{d}/s2/model.safetensors")
    assert all(isinstance(b.gate, GateNet) and not b.static for b in stage2.blocks)
    assert main(["convert", "vit_tiny_patch16_224", "--gates", "--norm", "layer", "-o", f"{d}/x.safetensors"]) == 2


@pytest.mark.slow
def test_torch_compile_fullgraph_of_a_gated_model():
    # Under torch.compile the decision is never read on the host (the gated sub-block ops): one graph, no breaks.
    torch._dynamo.reset()
    torch.manual_seed(0)
    fused = vitfast.fuse(vitfast.convert.from_timm(tiny_vit(depth=2), gates=True, gate_search=False,
                                                   gate_kind="G1"))
    for b in fused.blocks:
        with torch.no_grad():
            b.gate.b2.copy_(torch.tensor([-1.0, 1.0]))  # MHSA closed, FFN open
    compiled = torch.compile(fused, fullgraph=True)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fused(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rates", [dict(drop_path_rate=0.5), dict(attn_drop_rate=0.5)], ids=["drop_path", "attn_drop"])
def test_usdc_training_keeps_the_source_regularisation(rates, monkeypatch):
    """USDC blocks once dropped drop-path and attention dropout: train-mode forwards were deterministic."""
    import json

    import vitfast.methods.usdc.modules as usdc_nn
    from vitfast.io.trainable import build_trainable, describe_trainable

    monkeypatch.setattr(usdc_nn, "hard_gates", lambda logits, training, tau=5.0: torch.ones(logits.shape[:2]))
    torch.manual_seed(0)
    source = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10, **rates)
    model = vitfast.convert.from_timm(source, gates=True, gate_search=False)
    block = model.blocks[1].train()
    x = torch.randn(16, 17, 32)
    assert not torch.equal(block(x), block(x))  # stochastic in training (all gates open)
    block.eval()
    assert torch.equal(block(x), block(x))
    rebuilt = build_trainable(json.loads(json.dumps(describe_trainable(model))))  # what --resume builds
    rebuilt.load_state_dict(model.state_dict())
    assert not torch.equal(rebuilt.blocks[1].train()(x), rebuilt.blocks[1](x))


@pytest.mark.parametrize("level", ["group", "batch"])
def test_training_gates_are_one_draw_per_group(level, monkeypatch):
    """USDC sec. 3.2.2: "the gate values of each sample inside the same group are consistent" (appendix B: one
    gate per batch at the batch level).  Each sample once drew its own Gumbel noise on its group's mean logits, so
    an undecided gate opened for some samples of a group and closed for others."""
    import vitfast.methods.usdc.modules as usdc_nn

    torch.manual_seed(0)
    block = USDCBlock.from_block(tiny_vit(depth=1).blocks[0], level=level, search=False, gate_kind="G0",
                                 tokens=17).train()
    with torch.no_grad():  # logits 0 for both choices: the Gumbel noise alone decides
        block.gate.fc2.weight.zero_()
        block.gate.fc2.bias.zero_()
    seen = []
    real = usdc_nn.group_assignment
    monkeypatch.setattr(usdc_nn, "group_assignment", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    values = set()
    for _ in range(12):
        g = block.gates(torch.randn(16, 17, 32))
        ids, groups = seen[-1]
        assert groups == (1 if level == "batch" else len(group_sizes(16)))
        for group in range(groups):
            rows = g[ids == group]
            assert torch.equal(rows, rows[:1].expand_as(rows)), f"group {group}: {rows[:, 0].tolist()}"
        values.update(g[:, 0].tolist())
    assert values == {0.0, 1.0}  # and the draws do differ between groups/batches


def test_training_batch_level_gates_one_value_per_batch():
    torch.manual_seed(0)
    block = USDCBlock.from_block(tiny_vit(depth=1).blocks[0], level="batch", search=False, tokens=17).train()
    with torch.no_grad():
        block.gate.fc2.weight.zero_()
        block.gate.fc2.bias.zero_()
    firsts = set()
    for _ in range(12):
        g = block.gates(torch.randn(16, 17, 32))
        assert torch.equal(g, g[:1].expand_as(g)), g[:, 0].tolist()
        firsts.add(float(g[0, 0].detach()))
    assert firsts == {0.0, 1.0}


@pytest.mark.parametrize("level", ["group", "batch"])
def test_batchnorm_gates_see_the_samples_statistics(level):
    """At the batch level every feature row was the batch mean: a BatchNorm gate (G1/G4/G5) saw zero variance,
    output its bias whatever the input, and its running_var decayed towards 0 (0.004 after 50 batches)."""
    torch.manual_seed(0)
    block = USDCBlock.from_block(tiny_vit(depth=1).blocks[0], level=level, search=False, gate_kind="G1",
                                 tokens=17).train()
    randomise_gate(block.gate)
    with torch.no_grad():
        block.gate.norm.running_var.fill_(1.0)
    logits = []
    block.gate.register_forward_hook(lambda module, args, out: logits.append(out.detach()))
    for step in range(50):
        block.gates(torch.randn(8, 17, 32) * (1 + step % 3) + step % 5)
    # running_var tracks the per-sample variance of fc1's output, not 0
    with torch.no_grad():
        fc1 = block.gate.fc1(torch.randn(512, 17, 32).mean(1) * 2 + 1)
    assert block.gate.norm.running_var.min() > 0.2 * fc1.var(0).min()
    assert len({tuple(t.flatten().tolist()) for t in logits}) > 1  # train-mode logits depend on the input


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_batchnorm_gates_refuse_a_training_batch_of_one_by_name(kind):
    # torch's own "Expected more than 1 value per channel" said nothing of the gate or the way out
    net = GateNet(kind, 16).train()
    if kind in ("G1", "G4", "G5"):
        with pytest.raises(ValueError, match=rf"features: a {kind} gate normalises with BatchNorm .* got 1; train"):
            net(torch.randn(1, 16))
    else:
        assert net(torch.randn(1, 16)).shape == (1, 2, 2)
    assert net.eval()(torch.randn(1, 16)).shape == (1, 2, 2)  # inference uses the running statistics
    assert net.train()(torch.randn(2, 16)).shape == (2, 2, 2)


def test_stage2_pruning_keeps_dropout():
    torch.manual_seed(0)
    source = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10,
                               attn_drop_rate=0.1, proj_drop_rate=0.2)
    block = USDCBlock.from_block(source.blocks[0], static=True, search=False, tokens=17)
    pruned = block.pruned()
    assert pruned.attn.attn_drop.p == 0.1 and pruned.attn.proj_drop.p == 0.2
    assert pruned.mlp.drop1.p == 0.2 and pruned.mlp.drop2.p == 0.2


def test_train_time_block_takes_timm_attention_masks():
    torch.manual_seed(0)
    model = tiny_vit(depth=1)
    blk = model.blocks[0]
    block = USDCBlock.from_block(blk, search=False, tokens=17).eval()  # gates start open
    x = torch.randn(2, 17, 32)
    mask = torch.rand(17, 17) > 0.3
    mask.fill_diagonal_(True)
    with torch.no_grad():
        expected = blk(x, attn_mask=mask)
        torch.testing.assert_close(block(x, attn_mask=mask), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(block.to_fused()(x, attn_mask=mask), expected, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(block(x), expected)
