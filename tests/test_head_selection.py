"""Head selection for drop-in depthwise convolution: the Σ criterion (eq. 15-16, one Welford pass) and DSP gating.

Σ_h sanity: a head whose attention map does not depend on the input has Σ_h = 0 (section 2.3.1: necessary and
sufficient for input invariance), and the one-pass Welford statistics equal the two-pass standard deviation of
the stored maps.  DSP: the Gumbel top-k relaxation sums to k and hardens as τ → 0; τ reaches 1e-3 through the
Trainer's set_step; the gate's logits learn.
"""
import copy
import json

import pytest
import torch
from helpers import randomize
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.cli import main as cli_main
from vitfast.methods.dwconv.dsp import DSPGate, DSPGatedAttention, attach_dsp, gumbel_topk_relaxed
from vitfast.io.head_ranking import HeadRanking
from vitfast.methods.dwconv.head_selection import attention_maps, attention_std_scores

pytestmark = pytest.mark.usefixtures("one_thread")


def vit(depth=3, heads=4, seed=0):
    torch.manual_seed(seed)
    return randomize(VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=depth, num_heads=heads,
                                       num_classes=10, qkv_bias=True), seed=seed)


def test_input_independent_head_has_zero_sigma():
    model = vit()
    hd = 8
    with torch.no_grad():
        # Block 1, head 2: zero query and key weights -> scores q·k are constants -> the map is the same for any
        # input (uniform here).  Block 2, head 0: zero query weights only -> every query sees the same scores
        # b_q·k_j, which still depend on the input through k_j: not input-invariant.
        qkv = model.blocks[1].attn.qkv
        qkv.weight[2 * hd:3 * hd].zero_()
        qkv.weight[32 + 2 * hd:32 + 3 * hd].zero_()
        model.blocks[2].attn.qkv.weight[0:hd].zero_()
    ranking = attention_std_scores(model, torch.randn(12, 3, 16, 16), batch_size=5, progress=False)
    assert ranking.num_samples == 12 and ranking.num_blocks == 3
    assert ranking.head_scores[1][2] == 0.0
    assert ranking.head_scores[2][0] > 0.0
    assert all(s > 0.0 for b, row in enumerate(ranking.head_scores) for h, s in enumerate(row) if (b, h) != (1, 2))
    assert ranking.head_order()[0] == (1, 2)


def test_one_pass_welford_equals_two_pass_std():
    model = vit(depth=2)
    x = torch.randn(11, 3, 16, 16)
    ranking = attention_std_scores(model, x, batch_size=3, progress=False)  # batches 3, 3, 3, 2
    maps = []
    handle = model.blocks[1].attn.register_forward_hook(lambda m, a, o: maps.append(attention_maps(m, a[0])))
    with torch.no_grad():
        model.eval()(x)
    handle.remove()
    stacked = maps[0].double()  # [N_s, H, N, N]
    expected = stacked.std(0, unbiased=False).flatten(1).sum(1)
    torch.testing.assert_close(torch.tensor(ranking.head_scores[1], dtype=torch.float64), expected, rtol=1e-6, atol=1e-9)


def test_one_forward_per_batch_and_num_samples_and_loader_input():
    model = vit(depth=2).train()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(a[0].shape[0]))
    x = torch.randn(10, 3, 16, 16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(10)), batch_size=4)
    ranking = attention_std_scores(model, loader, num_samples=7, progress=False)
    assert calls == [4, 3] and ranking.num_samples == 7
    full = attention_std_scores(model, x[:7], batch_size=7, progress=False)
    torch.testing.assert_close(torch.tensor(ranking.head_scores), torch.tensor(full.head_scores), rtol=1e-6, atol=1e-9)
    assert model.training  # mode restored


def test_block_scores_orders_and_selections():
    r = HeadRanking([[3.0, 1.0], [0.5, 0.5], [2.0, 0.0]], num_samples=4)
    assert r.block_scores() == [2.0, 0.5, 1.0]  # eq. 16: mean over the block's heads
    assert r.block_order() == [1, 2, 0]
    assert r.select_blocks(2) == [1, 2]
    assert r.head_order()[:3] == [(2, 1), (1, 0), (1, 1)]
    assert r.select_heads(3) == {1: [0, 1], 2: [1]}
    with pytest.raises(ValueError, match="count: expected an int in \\[0, 3\\] blocks"):
        r.select_blocks(4)
    with pytest.raises(ValueError, match="head_scores\\[0\\]\\[1\\]: expected a finite number >= 0"):
        HeadRanking([[1.0, float("nan")]], 1)


def test_ranking_json_round_trip_and_errors(tmp_path):
    r = HeadRanking([[3.0, 1.0], [0.5, 0.25]], num_samples=9, blocks=["blocks.0.attn", "blocks.1.attn"])
    path = tmp_path / "ranking.json"
    r.save(path)
    data = json.loads(path.read_text())
    assert data["block_order"] == [1, 0] and data["head_order"][0] == [1, 1]
    again = HeadRanking.load(path)
    assert again == r
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="expected JSON"):
        HeadRanking.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="ranking: expected a 'vitfast.head_ranking' object"):
        HeadRanking.from_dict({"format": "other"})


def test_models_without_attention_are_refused():
    fused = vitfast.fuse(vitfast.convert.from_timm(vit(depth=1), dwconv_blocks=[0]))
    with pytest.raises(ValueError, match="model: expected timm ViT Attention modules"):
        attention_std_scores(fused, torch.randn(2, 3, 16, 16), progress=False)


def test_cli_select_heads_prints_and_saves(tmp_path, capsys):
    out = tmp_path / "ranking.json"
    status = cli_main(["select-heads", "vit_tiny_patch16_224", "--img-size", "16",
                       "--model-kwargs", '{"depth": 2, "patch_size": 4, "embed_dim": 32, "num_heads": 2}',
                       "--num-samples", "20", "--batch-size", "8", "--no-progress", "-o", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "blocks by Σ_b" in printed and "Σ_h" in printed
    ranking = HeadRanking.load(out)
    assert ranking.num_samples == 20 and ranking.num_blocks == 2 and len(ranking.head_scores[0]) == 2
    assert cli_main(["select-heads", "not_a_model_xyz", "-o", str(out)]) == 2


# ---------------------------------------------------------------------------------------------- DSP
def test_gumbel_topk_relaxation():
    logits = torch.tensor([0.1, 2.0, -1.0, 1.5, 0.0])
    soft = gumbel_topk_relaxed(logits, 2, 1.0)
    assert abs(float(soft.sum()) - 2.0) < 1e-4 and bool((soft >= 0).all())
    gate = DSPGate(5, 2)
    with torch.no_grad():
        gate.logits.copy_(logits)
    w = gate.train().weights()
    assert bool((w >= 0).all()) and bool((w <= 1).all())  # mixing weights of eq. 18 stay convex
    hard = gumbel_topk_relaxed(logits, 2, 1e-3, noise=False)
    torch.testing.assert_close(hard, torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0]), atol=1e-4, rtol=0)


def test_dsp_gate_anneals_to_1e3_through_the_trainer_and_learns():
    from vitfast.training.data import digits_loaders

    model = attach_dsp(vit(depth=3), 1)
    gate = model.dsp_gate
    assert float(gate.tau) == 1.0
    train, val = digits_loaders(img_size=16, batch_size=16)
    taus = []
    trainer = vitfast.training.Trainer(model, train, val, total_steps=4, lr=1e-2, progress=False,
                                              schedules=[lambda s, t: taus.append(float(gate.tau))])
    before = gate.logits.detach().clone()
    trainer.fit()
    assert abs(float(gate.tau) - 1e-3) < 1e-9  # the final set_step(total, total)
    # user schedules run before the modules' set_step: each entry is τ set at the previous step
    assert taus == pytest.approx([1.0, 1.0, 1e-3 ** 0.25, 1e-3 ** 0.5, 1e-3 ** 0.75])  # τ0·(τ_end/τ0)^(t/T)
    assert not torch.equal(gate.logits.detach(), before)
    # eval: the hard top-1 block, and selection() names it
    model.eval()
    w = gate.weights()
    assert float(w.sum()) == 1.0 and int(w.argmax()) == gate.selection()[0]
    no_decay = {id(p) for g in vitfast.training.param_groups(model, 0.05) if g["weight_decay"] == 0.0 for p in g["params"]}
    assert id(gate.logits) in no_decay


def test_dsp_gate_at_the_extremes_is_mhsa_or_dwconv():
    model = attach_dsp(vit(depth=2), 1).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        model.dsp_gate.logits.copy_(torch.tensor([5.0, -5.0]))  # hard top-1 = block 0 replaced
        gated = model(x)
        block0 = model.blocks[0].attn
        h = model.patch_embed(x)
        h = model._pos_embed(h)
        h = model.norm_pre(h)
        b0 = model.blocks[0]
        h = h + b0.ls1(block0.conv(b0.norm1(h)))
        h = h + b0.ls2(b0.mlp(b0.norm2(h)))
        b1 = model.blocks[1]
        h = h + b1.ls1(b1.attn.mhsa(b1.norm1(h)))
        h = h + b1.ls2(b1.mlp(b1.norm2(h)))
        expected = model.forward_head(model.norm(h))
    torch.testing.assert_close(gated, expected, atol=1e-5, rtol=1e-5)


def test_dsp_per_head_gate_mixes_heads():
    model = attach_dsp(vit(depth=1, heads=4), 2, per_head=True)
    gate = model.dsp_gate
    assert gate.logits.shape == (4,)
    model.eval()
    with torch.no_grad():
        gate.logits.copy_(torch.tensor([3.0, -3.0, 2.0, -2.0]))
        x = torch.randn(1, 17, 32)
        attn = model.blocks[0].attn
        mixed = attn(x)
        # heads 0 and 2 replaced: a DWConvAttention with exactly those heads (same weights) gives the same output
        from vitfast.methods.dwconv.modules import DWConvAttention

        ref = DWConvAttention.from_timm(attn.mhsa, [0, 2], (4, 4))
        full = attn.conv
        with torch.no_grad():
            ref.conv_kernel.copy_(torch.cat([full.conv_kernel[0:8], full.conv_kernel[16:24]]))
        torch.testing.assert_close(mixed, ref(x), atol=1e-5, rtol=1e-5)
    assert gate.selection() == [(0, 0), (0, 2)]  # (block, head) pairs: what from_timm(dwconv_heads=) takes


@pytest.mark.parametrize("per_head,count", [(False, 1), (True, 3)], ids=["blocks", "heads"])
def test_finalize_dsp_keeps_the_trained_convolutions(per_head, count, tmp_path):
    """DSP-e2e (paper Table 5): the gated model's hard top-k made permanent with the trained conv weights.  There
    was no way to do it: save_trainable refused the wrappers, and from_timm(selection()) re-initialised the
    kernels (DSP-2S).  Also: selection() of a per-head gate is what from_timm takes ((block, head) pairs; it was
    flat indices), and the model deep-copies after a training forward (the gate kept a non-leaf draw)."""
    from vitfast.methods.dwconv.dsp import finalize_dsp

    model = attach_dsp(vit(depth=3), count, per_head=per_head).train()
    x = torch.randn(4, 3, 16, 16)
    model(x).sum().backward()
    copy.deepcopy(model)  # "Only Tensors created explicitly by the user support the deepcopy protocol" before
    with torch.no_grad():
        model.dsp_gate.logits.copy_(torch.randn(model.dsp_gate.logits.shape, generator=torch.Generator().manual_seed(3)))
        for block in model.blocks:  # the conv branch trained away from its MhSA initialisation
            for p in block.attn.conv.parameters():
                p.add_(0.3 * torch.randn_like(p))
    model.eval()
    selection = model.dsp_gate.selection()
    if per_head:
        assert all(isinstance(u, tuple) and len(u) == 2 for u in selection)
        vitfast.convert.from_timm(vit(depth=3), dwconv_heads=selection)  # DSP-2S takes it as is
    final = finalize_dsp(model).eval()
    assert isinstance(model.blocks[0].attn, DSPGatedAttention) and hasattr(model, "dsp_gate")  # left as it was
    replaced = {u if isinstance(u, int) else u[0] for u in selection}
    assert {i for i, b in enumerate(final.blocks) if isinstance(b, vitfast.methods.dwconv.DWConvBlock)} == replaced
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(final(x), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vitfast.fuse(final)(x), expected, atol=1e-5, rtol=1e-5)
    path = vitfast.io.save_trainable(final, tmp_path / "dsp_e2e.safetensors")
    loaded, _ = vitfast.io.load_trainable(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"model: expected a model prepared by attach_dsp"):
        finalize_dsp(final)


def test_dsp_per_head_refuses_another_resolution():
    """The per-head mix read a larger grid's extra patches as prefix tokens (the per-block path refuses it)."""
    source = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=4, num_classes=10,
                               dynamic_img_size=True)
    model = attach_dsp(source, 2, per_head=True).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 16, 16))
        with pytest.raises(ValueError, match=r"x: expected 17 tokens \(1 prefix \+ a 4×4 patch grid\), got 21"):
            model(torch.randn(1, 3, 16, 20))


def test_attach_dsp_refuses_before_changing_anything():
    from vitfast.methods.dwconv.dsp import attach_dsp
    from vitfast.methods.dwconv import DWConvAttention

    model = vit()
    model.blocks[2].attn = DWConvAttention.from_timm(model.blocks[2].attn, [0], (4, 4))
    before = [type(b.attn) for b in model.blocks]
    with pytest.raises(ValueError, match=r"model.blocks.2.attn: expected timm Attention, got DWConvAttention"):
        attach_dsp(model, 1)
    assert [type(b.attn) for b in model.blocks] == before and not hasattr(model, "dsp_gate")  # was half wrapped
    from timm.models.swin_transformer import SwinTransformer
    swin = SwinTransformer(img_size=32, patch_size=4, embed_dim=16, depths=(1,), num_heads=(2,), window_size=4)
    with pytest.raises(ValueError, match=r"model: expected a timm ViT/DeiT .*got SwinTransformer"):
        attach_dsp(swin, 1)  # an AttributeError before


def test_dsp_gate_arguments():
    with pytest.raises(ValueError, match="num_selected: expected an int in \\[1, 3\\]"):
        DSPGate(3, 4)
    with pytest.raises(ValueError, match="tau_start/tau_end"):
        DSPGate(3, 1, tau_start=1e-4, tau_end=1e-3)


def test_dsp_per_head_mix_applies_the_attention_dropout():
    """The per-head mix computed SDPA without dropout and skipped proj_drop: deterministic in training, unlike
    the per-block gate."""
    torch.manual_seed(0)
    source = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=4, num_classes=10,
                               attn_drop_rate=0.5)
    model = attach_dsp(source, 2, per_head=True).train()
    model.dsp_gate.weights = lambda: torch.full((4,), 0.5)  # a fixed mix: the gate's Gumbel draws are random too
    x = torch.randn(4, 17, 32)
    attn = model.blocks[0].attn
    assert not torch.equal(attn(x), attn(x))
    model.eval()
    assert torch.equal(attn(x), attn(x))
