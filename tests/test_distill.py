"""vitfast.methods.distill: the losses of swin-distillation-compression (eq. 1, 4, MSE/KL) and DistillTrainer."""
import math

import pytest
import torch
import torch.nn.functional as F

from vitfast.training.data import digits_loaders
from vitfast.methods.distill.trainer import DistillTrainer
from vitfast.methods.distill.losses import harmonic_mean_loss, hard_label_loss, joint_loss, kl_logits_loss, linear_alpha, mse_logits_loss
from vitfast.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_vit(seed=0, **kw):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    cfg.update(kw)
    return VisionTransformer(**cfg)


# ---------------------------------------------------------------------------------------------- losses
def test_harmonic_mean_is_eq_4():
    l_d, l_s = torch.tensor(0.5), torch.tensor(2.0)
    # eq. 4 by hand: (w_d + w_s) / (w_d / L_d + w_s / L_s)
    assert float(harmonic_mean_loss(l_d, l_s)) == pytest.approx(14 / (13 / 0.5 + 1 / 2.0), rel=1e-6)
    # w_d = w_s: eq. 2, the plain harmonic mean 2 / (1/L_d + 1/L_s)
    assert float(harmonic_mean_loss(l_d, l_s, w_d=1, w_s=1)) == pytest.approx(2 / (1 / 0.5 + 1 / 2.0), rel=1e-6)
    # between the two losses, nearer the heavier-weighted one
    h = float(harmonic_mean_loss(l_d, l_s))
    assert 0.5 < h < 2.0 and abs(h - 0.5) < abs(h - 2.0)
    # the gradient of eq. 4 w.r.t. L_i is w_i (L/L_i)^2 / (w_d + w_s): it is eq. 1 with alpha from the ratio (eq. 3)
    a, b = torch.tensor(0.5, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    loss = harmonic_mean_loss(a, b, w_d=13, w_s=1)
    loss.backward()
    L = float(loss.detach())
    assert float(a.grad) == pytest.approx(13 * (L / 0.5) ** 2 / 14, rel=1e-5)
    assert float(b.grad) == pytest.approx(1 * (L / 2.0) ** 2 / 14, rel=1e-5)
    # a zero loss gives the limit 0, not NaN
    assert float(harmonic_mean_loss(torch.tensor(0.0), l_s)) == 0.0
    with pytest.raises(ValueError, match="w_d"):
        harmonic_mean_loss(l_d, l_s, w_d=0)


def test_joint_loss_alpha_and_linear_schedule():
    l_d, l_s = torch.tensor(3.0), torch.tensor(1.0)
    assert float(joint_loss(l_d, l_s, 0.25)) == pytest.approx(0.75 * 3 + 0.25 * 1)
    assert float(joint_loss(l_d, l_s, 1.0)) == 1.0  # alpha = 1: no distillation
    with pytest.raises(ValueError, match=r"alpha: expected a number in \[0.0, 1.0\]"):
        joint_loss(l_d, l_s, 1.5)
    assert [linear_alpha(s, 10, 0.0, 0.5) for s in (0, 5, 10, 20)] == [0.0, 0.25, 0.5, 0.5]


def test_logit_losses():
    torch.manual_seed(0)
    s, t = torch.randn(8, 10), torch.randn(8, 10)
    y = torch.randint(0, 10, (8,))
    assert torch.allclose(mse_logits_loss(s, t), ((s - t) ** 2).mean())
    tau = 3.0
    p_t = F.softmax(t / tau, -1)
    kl = (p_t * (p_t.log() - F.log_softmax(s / tau, -1))).sum(-1).mean() * tau ** 2
    torch.testing.assert_close(kl_logits_loss(s, t, tau), kl)
    assert float(kl_logits_loss(t, t, tau)) == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(hard_label_loss(s, y), F.cross_entropy(s, y))
    with pytest.raises(ValueError, match="teacher_logits: expected the student's shape"):
        mse_logits_loss(s, t[:, :5])


# ---------------------------------------------------------------------------------------------- trainer
def test_distill_trainer_loss_teacher_frozen_and_logged():
    train, val = digits_loaders(img_size=16, batch_size=32)
    teacher, student = tiny_vit(1), tiny_vit(2)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    trainer = DistillTrainer(student, train, val, teacher=teacher, harmonic=(13, 1), total_steps=3, progress=False)
    images, targets = next(iter(train))
    loss, logits, parts = trainer.compute_loss(images, targets)
    with torch.no_grad():
        t_logits = teacher.eval()(images)
    l_d = F.mse_loss(logits.detach(), t_logits)
    l_s = F.cross_entropy(logits.detach(), targets)
    assert float(loss.detach()) == pytest.approx(float(14 / (13 / l_d + 1 / l_s)), rel=1e-5)
    assert parts["distill/l_d"] == pytest.approx(float(l_d), rel=1e-5)
    assert parts["distill/l_s"] == pytest.approx(float(l_s), rel=1e-5)
    trainer.fit()
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # the teacher never moves
    assert all("distill/l_d" in m for m in trainer.history)


def test_distill_trainer_alpha_schedule_follows_the_step():
    train, _ = digits_loaders(img_size=16, batch_size=32)
    trainer = DistillTrainer(tiny_vit(2), train, teacher=tiny_vit(1), alpha_schedule=(0.0, 0.5), total_steps=4,
                             progress=False, distill="kl", tau=2.0)
    trainer.fit()
    assert [m["distill/alpha"] for m in trainer.history] == [0.0, 0.125, 0.25, 0.375]
    assert trainer.alpha == 0.5  # the final schedule call


def test_distill_trainer_bad_arguments():
    train, _ = digits_loaders(img_size=16, batch_size=32)
    s = tiny_vit(2)
    with pytest.raises(ValueError, match="at most one of them"):
        DistillTrainer(s, train, teacher=tiny_vit(1), alpha=0.2, harmonic=(13, 1), total_steps=2)
    with pytest.raises(ValueError, match="distill: expected one of"):
        DistillTrainer(s, train, teacher=tiny_vit(1), distill="l1", total_steps=2)
    with pytest.raises(ValueError, match="separate model"):
        DistillTrainer(s, train, teacher=s, total_steps=2)
    with pytest.raises(ValueError, match=r"teacher: takes 32x32 images, the student 16x16"):
        DistillTrainer(s, train, teacher=tiny_vit(1, img_size=32), total_steps=2)
    DistillTrainer(s, train, teacher=tiny_vit(1, img_size=32, dynamic_img_size=True), total_steps=2)  # takes any


def test_harmonic_mean_gradient_stays_finite_for_tiny_losses():
    # The w/L form overflowed in the backward pass (w/L²) for L between ~1e-38 and ~1e-20: NaN gradients that
    # the trainer's finite-loss check could not see.
    for tiny in (2e-38, 1e-30, 1e-21):
        a, b = torch.tensor(tiny, requires_grad=True), torch.tensor(1.0, requires_grad=True)
        loss = harmonic_mean_loss(a, b)
        loss.backward()
        assert float(loss.detach()) == pytest.approx(14 * tiny / (13 + tiny), rel=1e-5)
        assert torch.isfinite(a.grad) and torch.isfinite(b.grad)
        assert float(a.grad) == pytest.approx(14 / 13, rel=1e-5)  # d/dL_d of 14·L_d·L_s / (13·L_s + L_d) at 0
    a, b = torch.tensor(0.0, requires_grad=True), torch.tensor(0.0, requires_grad=True)
    harmonic_mean_loss(a, b).backward()
    assert float(a.grad) == 0.0 and float(b.grad) == 0.0


def test_distillation_moves_the_student_towards_the_teacher():
    """Pure distillation (alpha = 0): the MSE to the teacher's logits falls."""
    train, val = digits_loaders(img_size=16, batch_size=64)
    teacher = tiny_vit(1)
    Trainer(teacher, train, total_steps=40, lr=3e-3, progress=False).fit()
    student = tiny_vit(2, depth=1)
    trainer = DistillTrainer(student, train, teacher=teacher, alpha=0.0, total_steps=40, lr=3e-3, progress=False)
    trainer.fit()
    first = sum(m["distill/l_d"] for m in trainer.history[:5]) / 5
    last = sum(m["distill/l_d"] for m in trainer.history[-5:]) / 5
    assert last < 0.5 * first, (first, last)
    assert math.isfinite(last)
