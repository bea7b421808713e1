"""vitfast.methods.distill.student.make_student: Algorithm 1's student construction for Swin and ViT teachers."""
import pytest
import torch

from vitfast.methods.distill.student import make_student, student_cut

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_swin(depths=(2, 2, 6, 2)):
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=16, depths=depths,
                           num_heads=(1, 2, 2, 4), num_classes=10)


def tiny_vit(depth=8):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=depth, num_heads=2, num_classes=10)


def _swin_front(model, x, kept):
    h = model.patch_embed(x)
    h = model.layers[1](model.layers[0](h))
    stage = model.layers[2]
    h = stage.downsample(h)
    for blk in stage.blocks[:kept]:
        h = blk(h)
    return h


@pytest.mark.parametrize("depths, p1, p2", [([2, 2, 2, 2], 6, 10), ([2, 2, 4, 2], 8, 10)])
def test_swin_n_and_m_copy_everything_before_the_cut(depths, p1, p2):
    teacher = tiny_swin().eval()
    student = make_student(teacher, depths=depths).eval()
    cut = student.distill_cut
    assert (cut["p1"], cut["p2"]) == (p1, p2)  # Swin-N: the first 6 blocks copied, as in the paper
    assert [len(s.blocks) for s in student.layers] == depths
    x = torch.randn(2, 3, 32, 32)
    # F (stem + T[:p1]) computes the same function in teacher and student
    torch.testing.assert_close(_swin_front(student, x, depths[2]), _swin_front(teacher, x, depths[2]), atol=0, rtol=0)
    t_state, s_state = teacher.state_dict(), student.state_dict()
    # Ĝ (last stage, its patch merging, norm, head) is freshly initialised, not copied
    for key in ("layers.3.downsample.reduction.weight", "layers.3.blocks.0.attn.qkv.weight", "head.fc.weight"):
        assert not torch.equal(s_state[key], t_state[key]), key
    assert s_state["layers.3.blocks.0.attn.qkv.weight"].std() == pytest.approx(0.02, rel=0.2)  # timm's init
    assert cut["copied"] == sum(1 for k in s_state if k.startswith(("patch_embed", "layers.0", "layers.1", "layers.2")))


def test_swin_cut_argument_and_errors():
    teacher = tiny_swin()
    assert student_cut(teacher, depths=[2, 2, 4, 2], cut=2)["p1"] == 6  # copy only 2 of the 4 stage-3 blocks
    student = make_student(teacher, depths=[2, 2, 4, 2], cut=2)
    t, s = teacher.state_dict(), student.state_dict()
    assert torch.equal(s["layers.2.blocks.1.attn.qkv.weight"], t["layers.2.blocks.1.attn.qkv.weight"])
    assert not torch.equal(s["layers.2.blocks.2.attn.qkv.weight"], t["layers.2.blocks.2.attn.qkv.weight"])
    with pytest.raises(ValueError, match="exactly one stage made shallower"):
        make_student(teacher, depths=[1, 2, 2, 2])
    with pytest.raises(ValueError, match="exactly one stage made shallower"):
        make_student(teacher, depths=[2, 2, 8, 2])
    with pytest.raises(ValueError, match="depths: expected the student's per-stage depths"):
        make_student(teacher, depth=4)
    # int() used to truncate these silently (the ViT path refused the same values)
    for cut in (1.7, True, "1"):
        with pytest.raises(ValueError, match=r"cut: expected 0 <= cut <= 4"):
            student_cut(teacher, depths=[2, 2, 4, 2], cut=cut)
    for depths in ([2, 2, 2.9, 2], [2, 2, "x", 2]):
        with pytest.raises(ValueError, match=r"depths: expected integer block counts per stage"):
            student_cut(teacher, depths=depths)


def test_vit_student_default_cut_copy_and_random():
    teacher = tiny_vit(8).eval()
    student = make_student(teacher, depth=4)
    cut = student.distill_cut
    assert (cut["p1"], cut["p2"]) == (3, 7)  # Ĝ = the last quarter of the student (1 block) + norm + head
    t, s = teacher.state_dict(), student.state_dict()
    for key in ("patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.2.mlp.fc2.weight"):
        assert torch.equal(s[key], t[key]), key
    for key in ("blocks.3.attn.qkv.weight", "norm.weight", "head.weight"):
        assert key in s
    assert not torch.equal(s["blocks.3.attn.qkv.weight"], t["blocks.7.attn.qkv.weight"])
    assert not torch.equal(s["head.weight"], t["head.weight"])
    # the same seed gives the same Ĝ with init="random", so the arms of Table IX differ only in the copy
    scratch = make_student(teacher, depth=4, init="random")
    r = scratch.state_dict()
    assert torch.equal(r["blocks.3.attn.qkv.weight"], s["blocks.3.attn.qkv.weight"])
    assert not torch.equal(r["blocks.0.attn.qkv.weight"], t["blocks.0.attn.qkv.weight"])
    assert scratch.distill_cut["copied"] == 0
    # a copied student with the full cut reproduces the teacher's features up to the cut
    x = torch.randn(2, 3, 16, 16)
    student.eval()
    torch.testing.assert_close(student.blocks[:3](student._pos_embed(student.patch_embed(x))),
                               teacher.blocks[:3](teacher._pos_embed(teacher.patch_embed(x))), atol=0, rtol=0)
    assert make_student(teacher, depth=4, cut=4).distill_cut["p2"] == 8  # Ĝ = norm + head only


def test_vit_student_errors_and_overrides():
    teacher = tiny_vit(4)
    with pytest.raises(ValueError, match=r"depth: expected an integer in \[1, 4\)"):
        make_student(teacher, depth=4)
    with pytest.raises(ValueError, match="cut: expected an integer in"):
        make_student(teacher, depth=2, cut=3)
    with pytest.raises(ValueError, match="init: expected"):
        make_student(teacher, depth=2, init="zeros")
    student = make_student(teacher, depth=2, drop_path_rate=0.1)
    assert student.blocks[1].drop_path1.drop_prob == pytest.approx(0.1)
    from vitfast.convert import from_timm

    converted = from_timm(tiny_vit(4), channel_idle=0.5)
    with pytest.raises(ValueError, match="plain timm"):
        make_student(converted, depth=2)
