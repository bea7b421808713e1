"""Non-deep ViT (parallel branches, progressive joining): conversion, λ schedules, diversity, exact collapse through
`vitfast.fuse` for n ∈ {2, 3, 4} with q/k/v biases, composition with channel-idle FFNs, checkpoints."""
import copy
import math

import pytest
import torch
import torch.nn as nn
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast import reference
from vitfast.convert import from_timm
from vitfast.methods.nondeep import JoinSchedule, NonDeepBlock, join_lambda
from vitfast.nn import FusedXWXBlock
from vitfast.methods.nondeep.modules import branch_diversity
from vitfast.training.trainer import Trainer

from helpers import assert_close_scaled, randomize

pytestmark = pytest.mark.usefixtures("one_thread")

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))


def _vit(depth=12, embed_dim=48, num_heads=3, seed=0, **overrides) -> VisionTransformer:
    kwargs = dict(img_size=32, patch_size=8, embed_dim=embed_dim, depth=depth, num_heads=num_heads, num_classes=10,
                  qkv_bias=True)
    kwargs.update(overrides)
    model = randomize(VisionTransformer(**kwargs), seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # large q/k/v biases: the q-bias → key-bias and k-bias-cancels algebra must carry weight
        for block in model.blocks:
            block.attn.qkv.bias.copy_(torch.randn(block.attn.qkv.bias.shape, generator=g))
    return model


def _joined(model: nn.Module) -> nn.Module:
    for block in model.blocks:
        block.set_lambda(1.0)
    return model.eval()


def _randomize_batchnorms(model: nn.Module, seed: int = 3) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
    return model


def _check_fused(model: nn.Module, **fuse_kwargs) -> nn.Module:
    fused = vitfast.fuse(model)
    assert all(isinstance(b, FusedXWXBlock) for b in fused.blocks)
    assert not any(isinstance(m, NonDeepBlock) for m in fused.modules())
    with torch.no_grad():
        assert_close_scaled(fused.forward_features(IMAGES), model.forward_features(IMAGES))
        assert_close_scaled(fused(IMAGES), model(IMAGES))
    return fused


# ------------------------------------------------------------------------------------------------ collapse
@pytest.mark.parametrize("join_values", [False, True])
@pytest.mark.parametrize("branches", [2, 3, 4])
def test_collapse_is_exact(branches, join_values):
    model = _joined(from_timm(_vit(), branches=branches, join_values=join_values))
    assert len(model.blocks) == 12 // branches
    fused = _check_fused(model)
    attn = fused.blocks[0].attn
    assert attn.key_bias is not None and attn.b_o is not None  # the biases went somewhere, exactly
    assert attn.value_dim == (16 if join_values else 16 * branches)


@pytest.mark.parametrize("score_form", ["factored", "full"])
@pytest.mark.parametrize("branches", [2, 4])
def test_both_score_forms_exact(branches, score_form):
    model = _joined(from_timm(_vit(depth=8, embed_dim=64, num_heads=4), branches=branches))
    with torch.no_grad():
        x = model.patch_embed(IMAGES)
        for i, block in enumerate(model.blocks):
            fused = block.to_fused(name=f"blocks.{i}", score_form=score_form)
            assert fused.attn.score_form == score_form
            assert fused.attn.score_rank == (branches * 16 if score_form == "factored" else 64)
            assert_close_scaled(fused(x), block(x))
            x = block(x)


def test_auto_score_form_picks_factored_for_low_rank():
    # rank n·d_h = 32 ≤ C/2 = 48 → factored; n = 4: 64 > 48 → full
    assert vitfast.fuse(_joined(from_timm(_vit(depth=4, embed_dim=96, num_heads=6), branches=2))).blocks[0].attn.score_form == "factored"
    assert vitfast.fuse(_joined(from_timm(_vit(depth=4, embed_dim=96, num_heads=6), branches=4))).blocks[0].attn.score_form == "full"


def test_single_branch_block_equals_timm_block():
    """n = 1: LN affines absorbed into qkv/fc1, LayerScale into proj/fc2, head-wise projection, XWXᵀ collapse —
    all exact against timm's own Block (train-time and fused)."""
    timm_model = _vit(depth=2, init_values=0.3)
    block = timm_model.blocks[0]
    nd = NonDeepBlock.from_timm_blocks([block]).eval()
    x = torch.randn(2, 17, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = block(x)
        assert_close_scaled(nd(x), expected)
        assert_close_scaled(nd.to_fused()(x), expected)


def test_lambda_zero_is_the_parallel_version_of_the_pretrained_layers():
    """λ = 0, branch b = layer b: x + Σ_b attn_b(LN_b(x)), then x + Σ_b mlp_b(LN'_b(x)) with each layer's own LN."""
    timm_model = _vit(depth=3)
    nd = NonDeepBlock.from_timm_blocks(list(timm_model.blocks)).eval()
    x = torch.randn(2, 17, 48, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y = x + sum(b.ls1(b.attn(b.norm1(x))) for b in timm_model.blocks)
        expected = y + sum(b.ls2(b.mlp(b.norm2(y))) for b in timm_model.blocks)
        assert_close_scaled(nd(x), expected)


def test_k_bias_cancels_and_q_bias_matters():
    nd = NonDeepBlock.from_timm_blocks(list(_vit(depth=2).blocks)).eval()
    nd.set_lambda(0.4)
    x = torch.randn(2, 17, 48, generator=torch.Generator().manual_seed(3))
    dim = 48
    with torch.no_grad():
        before = nd(x)
        nd.attn.branches[1].qkv.bias[dim:2 * dim] += 5.0  # k-bias: constant per query row → softmax-invariant
        assert_close_scaled(nd(x), before)
        nd.attn.branches[1].qkv.bias[:dim] += 5.0  # q-bias: a per-key bias, changes the maps
        assert (nd(x) - before).abs().max() > 1e-3


def test_fuse_refuses_unfinished_joining():
    model = from_timm(_vit(depth=4), branches=2)
    model.blocks[1].set_lambda(0.5)
    with pytest.raises(ValueError, match=r"blocks\.0\.lam: expected λ = 1.*got 0"):
        vitfast.fuse(model)


# ------------------------------------------------------------------------------------------------ composition
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_composition_with_channel_idle(norm, tmp_path):
    model = from_timm(_vit(depth=4, embed_dim=64, num_heads=4), branches=2, channel_idle=0.5, norm=norm)
    ffn = model.blocks[0].mlp
    assert ffn.active_features == ffn.hidden_features // 2 and ffn.norm_type == norm
    model = _joined(_randomize_batchnorms(model))
    fused = _check_fused(model)
    mlp = fused.blocks[0].mlp
    assert mlp.linear_path and mlp.active_features == 128
    assert not any(isinstance(m, nn.BatchNorm1d) for m in fused.modules())
    path = tmp_path / "nondeep_ci.safetensors"
    vitfast.save(fused, path)
    loaded = vitfast.load(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IMAGES), fused(IMAGES), atol=0, rtol=0)


@pytest.mark.parametrize("branches", [2, 3])
def test_checkpoint_round_trip(branches, tmp_path):
    fused = vitfast.fuse(_joined(from_timm(_vit(depth=6), branches=branches)))
    path = tmp_path / "nondeep.safetensors"
    vitfast.save(fused, path)
    config = vitfast.io.read_config(path)
    assert config["architecture"]["kwargs"]["depth"] == 6 // branches  # a timm ViT of depth L/n, blocks replaced
    assert [b["kind"] for b in config["blocks"]] == ["xwx_block"] * (6 // branches)
    loaded = vitfast.load(path)
    assert isinstance(loaded.blocks[0], FusedXWXBlock)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IMAGES), fused(IMAGES), atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------ schedules
@pytest.mark.parametrize("kind, formula", [
    ("linear", lambda t: t),
    ("cosine", lambda t: 0.5 * (1 - math.cos(math.pi * t))),
    ("exp", lambda t: 1 - math.exp(-5 * t)),
    ("sqrt", lambda t: math.sqrt(t)),
])
def test_join_lambda_formulas(kind, formula):
    for t in (0.0, 0.1, 0.5, 0.9):
        assert join_lambda(kind, t) == pytest.approx(formula(t), abs=1e-12)
    assert join_lambda(kind, 1.0) == 1.0 and join_lambda(kind, 3.0) == 1.0  # adjustment phase


def test_join_schedule_phases():
    s = JoinSchedule("linear", warmup_steps=4, start_step=2)
    assert [s(k, 100) for k in range(8)] == [0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert JoinSchedule("cosine", warmup_fraction=0.5)(25, 100) == pytest.approx(0.5)
    assert JoinSchedule("linear", warmup_steps=0)(0, 10) == 1.0  # instant joining
    with pytest.raises(ValueError, match="kind: expected one of"):
        JoinSchedule("step")


def test_trainer_steps_move_lambda_and_add_diversity():
    model = from_timm(_vit(depth=4), branches=2, schedule=JoinSchedule("linear", warmup_steps=4))
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(3)]
    seen = []

    class Record:
        def on_step(self, trainer, metrics):
            seen.append((model.blocks[0].lambda_, model.blocks[1].lambda_, metrics))

    trainer = Trainer(model, batches, total_steps=6, lr=1e-4, progress=False, callbacks=[Record()])
    trainer.fit()
    assert [s[0] for s in seen] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]  # λ set from step k before step k
    assert all(a == b for a, b, _ in seen)
    assert model.blocks[0].lambda_ == 1.0  # the final set_step(total, total): ready to fuse
    for _, _, metrics in seen:
        for i in range(2):
            assert 0.0 < metrics[f"extra/blocks.{i}"] < 1.0  # mean squared cosine of two distinct branches
    assert model.blocks[0].extra_loss_weight == pytest.approx(0.05 / 2)  # α over the mean of the blocks
    vitfast.fuse(model)  # λ = 1 after training: collapses


def test_branch_diversity():
    f = torch.randn(5, 7, 16)
    assert float(branch_diversity(torch.stack([f, 2 * f, -f]))) == pytest.approx(1.0)
    e = torch.eye(4)
    assert float(branch_diversity(e[:, None, :].expand(4, 3, 4))) == pytest.approx(0.0)
    a, b, c = torch.randn(3, 10, 8).unbind(0)
    cos = lambda u, v: torch.nn.functional.cosine_similarity(u, v, dim=-1).square().mean()  # noqa: E731
    expected = (cos(a, b) + cos(a, c) + cos(b, c)) / 3
    assert float(branch_diversity(torch.stack([a, b, c]))) == pytest.approx(float(expected), rel=1e-5)


def test_eval_forward_records_no_diversity():
    model = from_timm(_vit(depth=2), branches=2).eval()
    with torch.no_grad():
        model(IMAGES)
    assert model.blocks[0].extra_loss() is None


# ------------------------------------------------------------------------------------------------ xwx reference
def test_xwx_attention_reference_matches_sdpa():
    """One branch's collapse fed to the reference equals ordinary multi-head attention with biases."""
    g = torch.Generator().manual_seed(4)
    batch, tokens, dim, heads = 2, 13, 32, 4
    d = dim // heads
    qkv = nn.Linear(dim, 3 * dim)
    proj = nn.Linear(dim, dim)
    with torch.no_grad():
        for p in (*qkv.parameters(), *proj.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(batch, tokens, dim, generator=g)
    q, k, v = qkv(x).reshape(batch, tokens, 3, heads, d).permute(2, 0, 3, 1, 4)
    expected = proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, dim))
    w = qkv.weight.reshape(3, heads, d, dim).transpose(-1, -2)  # [3, H, C, d]
    bias = qkv.bias.reshape(3, heads, d)
    s = 1 / math.sqrt(d)
    w_o = proj.weight.t().reshape(heads, d, dim)
    b_o = proj.bias + torch.einsum("hd,hdc->c", bias[2], w_o)
    key_bias = s * torch.einsum("hcd,hd->hc", w[1], bias[0])
    with torch.no_grad():
        factored = reference.xwx_attention(x, s * w[0], w[1], key_bias, w[2], w_o, b_o)
        full = reference.xwx_attention(x, s * w[0] @ w[1].transpose(-1, -2), None, key_bias, w[2], w_o, b_o, residual=x)
    assert_close_scaled(factored, expected.detach())
    assert_close_scaled(full, (expected + x).detach())


def test_xwx_attention_reference_rejects_bad_shapes():
    x = torch.randn(1, 5, 8)
    w = torch.randn(2, 8, 4)
    with pytest.raises(ValueError, match=r"w_k: expected the same shape as w_q \[2, 8, 4\], got \[2, 8, 3\]"):
        reference.xwx_attention(x, w, torch.randn(2, 8, 3), None, w, torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"w_q: expected the full score matrices \[H, 8, 8\] when w_k is None"):
        reference.xwx_attention(x, w, None, None, w, torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"key_bias: expected \[2, 8\] or None, got \[8\]"):
        reference.xwx_attention(x, w, w, torch.randn(8), w, torch.randn(2, 4, 8))


# ------------------------------------------------------------------------------------------------ errors
def test_timm_fix_init_is_refused_by_name():
    # timm's fix_init=True rescales attn.proj / mlp.fc2, which a non-deep block has once per branch
    with pytest.raises(AttributeError, match=r"proj: a non-deep block has one proj per branch \(attn.branches\[i\].proj\)"):
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10,
                          block_fn=NonDeepBlock, fix_init=True)
    block = NonDeepBlock(64, 4)
    assert not hasattr(block.attn, "proj") and not hasattr(block.mlp, "fc2")
    with pytest.raises(AttributeError, match=r"fc2: a non-deep block has one fc2 per branch"):
        block.mlp.fc2
    assert block.attn.branches[0].proj.weight.shape == (64, 64)  # ordinary attributes still resolve


def test_conversion_errors():
    with pytest.raises(ValueError, match="branches: expected a divisor of the model depth 6, got 4"):
        from_timm(_vit(depth=6), branches=4)
    with pytest.raises(ValueError, match="branches: expected an int >= 2, got 1"):
        from_timm(_vit(depth=6), branches=1)
    swin = SwinTransformer(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4), window_size=4)
    with pytest.raises(ValueError, match="branches: only timm VisionTransformer"):
        from_timm(swin, branches=2)
    with pytest.raises(ValueError, match="qk_norm: expected False"):
        NonDeepBlock(48, 3, qk_norm=True)
    with pytest.raises(ValueError, match="channel_idle: expected one idle ratio per block \\(2 blocks\\), got 4"):
        from_timm(_vit(depth=4), branches=2, channel_idle=[0.5] * 4)


# ------------------------------------------------------------------------------------------------ distillation
def test_teacher_maps_are_timm_attention():
    from vitfast.methods.nondeep.attn_distill import teacher_attention_maps

    teacher = _vit(depth=2)
    maps = teacher_attention_maps(teacher, IMAGES)
    assert len(maps) == 2 and maps[0].shape == (2, 3, 17, 17)
    # the maps reproduce timm's own attention output: proj(P · V)
    block = teacher.blocks[0]
    with torch.no_grad():
        x = teacher.norm_pre(teacher._pos_embed(teacher.patch_embed(IMAGES)))
        y = block.norm1(x)
        v = block.attn.qkv(y).reshape(2, 17, 3, 3, 16).permute(2, 0, 3, 1, 4)[2]
        out = block.attn.proj((maps[0] @ v).transpose(1, 2).reshape(2, 17, 48))
        assert_close_scaled(out, block.attn(y))
    # a fused teacher (the fast one to distil from) gives the same maps; its Attention had no `scale`
    fused_maps = teacher_attention_maps(vitfast.patch_timm(copy.deepcopy(teacher).eval()), IMAGES)
    for fused, plain in zip(fused_maps, maps):
        assert_close_scaled(fused, plain)


def test_attention_distillation_loss_and_trainer():
    from vitfast.methods.nondeep.attn_distill import AttentionDistillation, AttentionDistillTrainer, default_layer_map, teacher_attention_maps

    assert default_layer_map(6, 12) == [1, 3, 5, 7, 9, 11]
    assert default_layer_map(4, 12) == [2, 5, 8, 11]
    teacher = _vit(depth=4, seed=1)
    student = from_timm(_vit(depth=4), branches=2)
    distill = AttentionDistillation(student, teacher)
    student.train()
    student(IMAGES)
    loss = distill(IMAGES)
    teacher_maps = teacher_attention_maps(teacher, IMAGES)
    # student block i ↔ teacher block 1, 3 (default map); the recorded maps are checked in test_branch_averaged_maps
    expected = [torch.nn.functional.mse_loss(block.attn.attention_maps.detach(), teacher_maps[j])
                for block, j in zip(student.blocks, [1, 3])]
    assert float(loss.detach()) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-6)
    assert float(loss.detach()) > 0
    loss.backward()
    assert student.blocks[0].attn.branches[0].qkv.weight.grad is not None
    assert all(p.grad is None for p in teacher.parameters())

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(2)]
    trainer = AttentionDistillTrainer(student, batches, total_steps=2, lr=1e-4, progress=False, distill=distill)
    trainer.fit()
    assert all(m["distill/attn"] > 0 for m in trainer.history)
    with pytest.raises(ValueError, match=r"layer_map: expected 2 teacher block indices in \[0, 4\)"):
        AttentionDistillation(student, teacher, layer_map=[0, 4])
    for bad in (float("nan"), float("inf"), -1.0):  # NaN passed `< 0` and failed later as a "non-finite loss"
        with pytest.raises(ValueError, match="distill_weight: expected a finite number >= 0"):
            AttentionDistillTrainer(student, batches, total_steps=2, progress=False, distill=distill, distill_weight=bad)
    # a teacher of another input size failed inside timm at the first step (an AssertionError)
    with pytest.raises(ValueError, match=r"teacher: takes 16x16 images, the student 32x32"):
        AttentionDistillation(student, _vit(depth=4, seed=1, img_size=16))


def test_attention_distillation_trainer_moves_the_teacher_to_its_device():
    # DistillTrainer moved its teacher; this trainer did not (a CUDA student then met a CPU teacher at step 1).
    # The meta device stands in for a GPU: the teacher must follow the trainer's device.
    from vitfast.methods.nondeep.attn_distill import AttentionDistillation, AttentionDistillTrainer

    student = from_timm(_vit(depth=4), branches=2)
    distill = AttentionDistillation(student, _vit(depth=4, seed=1))
    trainer = AttentionDistillTrainer(student.to("meta"), [], total_steps=1, progress=False, distill=distill,
                                      device="meta")
    assert trainer.device.type == "meta"
    assert {p.device.type for p in distill.teacher.parameters()} == {"meta"}


def test_branch_averaged_maps():
    """The recorded map is the mean over branches of each branch's joined softmax (eq. 5 with the rescale)."""
    block = NonDeepBlock.from_timm_blocks(list(_vit(depth=3).blocks)).eval()
    block.set_lambda(0.3)
    block.attn.record_attention = True
    x = torch.randn(2, 17, 48, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        block(x)
        y = block.norm1(x)
        scores = []
        for br in block.attn.branches:
            q, k, _ = br.qkv(y).reshape(2, 17, 3, 3, 16).permute(2, 0, 3, 1, 4)
            scores.append(q @ k.transpose(-1, -2))
        total = sum(scores)
        scale = math.sqrt(1 + 2 * 0.3 ** 2) * math.sqrt(16)
        maps = [((s + 0.3 * (total - s)) / scale).softmax(-1) for s in scores]
        assert_close_scaled(block.attn.attention_maps, sum(maps) / 3)


# ------------------------------------------------------------------------------------------------ fused forms (op)
@pytest.mark.parametrize("score_form", ["factored", "full"])
@pytest.mark.parametrize("join_values", [False, True], ids=["values_side_by_side", "values_joined"])
def test_fused_forms_round_trip_and_match_train_time(score_form, join_values, tmp_path):
    """vitfast.fuse(score_form=...) picks the form, the checkpoint config records it, and the loaded model (which
    runs torch.ops.vitfast.xwx_attention: C++ on CPU) equals the train-time model in eval mode."""
    model = _joined(from_timm(_vit(depth=4, embed_dim=96, num_heads=6), branches=2, join_values=join_values))
    fused = vitfast.fuse(model, score_form=score_form)
    assert all(b.attn.score_form == score_form for b in fused.blocks)
    path = tmp_path / "f.safetensors"
    vitfast.save(fused, path)
    config = vitfast.io.read_config(path)
    assert [config["modules"][f"blocks.{i}"]["score_form"] for i in range(2)] == [score_form] * 2
    loaded = vitfast.load(path)
    with torch.no_grad():
        expected = model.eval()(IMAGES)
        assert_close_scaled(loaded(IMAGES), expected)


def test_fuse_refuses_an_option_no_module_takes():
    model = _joined(from_timm(_vit(depth=4), branches=2))
    with pytest.raises(ValueError, match="^score_fom: expected an option"):
        vitfast.fuse(model, score_fom="full")


def test_fused_block_calls_the_op(monkeypatch):
    """FusedXWXAttention goes through vitfast.ops.xwx_attention (C++ on CPU, Triton on CUDA, reference on request)."""
    fused = vitfast.fuse(_joined(from_timm(_vit(depth=4), branches=2)))
    calls = []
    original = vitfast.ops.xwx_attention
    monkeypatch.setattr(vitfast.ops, "xwx_attention", lambda *a: calls.append(1) or original(*a))
    with torch.no_grad():
        out = VisionTransformer.forward(fused, IMAGES)  # the module path (not the model's one C++ call)
        assert torch.equal(fused(IMAGES), out)  # the one call (vitfast.nn.vit) runs the op's CPU body: same bits
    assert calls == [1, 1]  # one per fused block
    vitfast._env.set_backend("reference")
    try:
        with torch.no_grad():
            assert_close_scaled(fused(IMAGES), out)
    finally:
        vitfast._env.set_backend("auto")


@pytest.mark.parametrize("branches", [2, 3, 4])
def test_joined_scores_keep_the_variance_of_one_branch(branches):
    # eq. 5 with the rescale generalised to n branches: for i.i.d. score maps, S_b + λ Σ_{b'≠b} S_b' has variance
    # (1 + (n−1)λ²)σ², so dividing by √(1 + (n−1)λ²) keeps the softmax input at the λ = 0 scale at every λ.
    from vitfast.methods.nondeep.modules import _join, _rescale

    scores = torch.randn(branches, 64, 4, 17, 17, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for lam in (0.0, 0.3, 0.7, 1.0):
        lam_t = torch.tensor(lam, dtype=torch.float64)
        joined = _join(scores, lam_t) / _rescale(lam_t, branches)
        assert float(joined.std()) == pytest.approx(float(scores.std()), rel=0.02)
        without = _join(scores, lam_t)
        if lam == 1.0:
            assert float(without.std()) == pytest.approx(math.sqrt(branches) * float(scores.std()), rel=0.02)


def test_joined_ffn_branches_get_the_same_gradient():
    # At λ = 1 every branch's GELU sees Σ_b h_b (eq. 9), so fc1/fc2 of all branches get one gradient: the fused
    # weight Σ_b W_b then moves n times as far per optimiser step as a single-branch weight at the same LR.  Before
    # joining (λ < 1) the gradients differ.  (Diversity off: the regulariser is what tells the branches apart.)
    block = NonDeepBlock(24, 2, branches=2, diversity_weight=0.0)
    x = torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(1))
    for lam, same in ((1.0, True), (0.5, False)):
        block.zero_grad()
        block.set_lambda(lam)
        block(x).square().sum().backward()
        for name in ("fc1", "fc2"):
            g0, g1 = (getattr(br, name).weight.grad for br in block.mlp.branches)
            assert torch.allclose(g0, g1, rtol=1e-5, atol=1e-7) == same, (lam, name)


def test_conversion_keeps_the_branches_dropout():
    """Attention, projection and MLP dropout were left at 0 by the conversion (drop-path alone was carried)."""
    model = from_timm(_vit(depth=4, attn_drop_rate=0.3, proj_drop_rate=0.2, drop_path_rate=0.1), branches=2)
    for block in model.blocks:
        assert block.attn.attn_drop.p == 0.3 and block.proj_drop.p == 0.2
        assert all(m.p == 0.2 for m in block.mlp.modules() if isinstance(m, nn.Dropout))
