"""vitfast.training.Trainer and vitfast.training.data: learning, hooks, exact resume, LR schedule, checkpoints, data."""
import math
import os

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from vitfast.training.data import DigitsDataset, SeededSampler, digits_arrays, digits_loaders
from vitfast.training.trainer import Trainer
from vitfast.io.trainable import load_trainable, save_trainable
from vitfast.io.trainer_checkpoint import load_trainer_checkpoint
from vitfast.training.schedules import param_groups, warmup_cosine

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_vit(seed=0, **kw):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10)
    cfg.update(kw)
    return VisionTransformer(**cfg)


# ---------------------------------------------------------------------------------------------- learning
def test_loss_decreases_on_digits():
    model = tiny_vit()
    train, val = digits_loaders(img_size=16, batch_size=32)
    trainer = Trainer(model, train, val, total_steps=120, lr=5e-3, warmup_steps=0, progress=False)
    before = trainer.evaluate()
    summary = trainer.fit()
    after = trainer.evaluate()
    assert summary["step"] == 120 and summary["finished"]
    assert after["loss"] < before["loss"] - 0.1, (before, after)
    assert after["acc"] > 0.18  # chance is 0.10
    first = sum(m["loss"] for m in trainer.history[:10]) / 10
    last = sum(m["loss"] for m in trainer.history[-10:]) / 10
    assert last < first
    # periodic evaluation at the end is recorded with its step
    assert trainer.last_eval["step"] == 120 and trainer.last_eval["n"] == len(val.dataset)


def test_evaluate_does_not_touch_the_training_rng():
    model = tiny_vit()
    train, val = digits_loaders(img_size=16, batch_size=32)
    trainer = Trainer(model, train, val, total_steps=5, progress=False)
    state = torch.get_rng_state()
    trainer.evaluate()
    assert torch.equal(state, torch.get_rng_state())
    assert model.training  # mode restored


# ---------------------------------------------------------------------------------------------- hooks
class StepRecorder(nn.Module):
    """A module exposing set_step (as progressive-joining λ(t) will)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def set_step(self, step, total_steps):
        self.calls.append((step, total_steps))

    def forward(self, x):
        return x


class WithExtra(nn.Module):
    """A classifier with a submodule whose extra_loss() pulls a free parameter towards 0."""

    def __init__(self):
        super().__init__()
        self.body = tiny_vit()
        self.reg = Regulariser()
        self.rec = StepRecorder()

    def forward(self, x):
        return self.rec(self.body(x))


class Regulariser(nn.Module):
    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((4,), 3.0))
        self.skip_next = False

    def extra_loss(self):
        if self.skip_next:  # None means "nothing this step"
            return None
        return (self.alpha ** 2).sum()


def test_schedule_hooks_get_the_global_step_and_resume_continues_it(tmp_path):
    model = WithExtra()
    train, _ = digits_loaders(img_size=16, batch_size=64)
    seen = []
    ckpt = tmp_path / "t.pt"
    trainer = Trainer(model, train, total_steps=7, progress=False, schedules=[lambda s, t: seen.append((s, t))],
                      checkpoint_path=ckpt)
    trainer.fit(until_step=4)
    assert model.rec.calls == [(0, 7), (1, 7), (2, 7), (3, 7)]
    assert seen == model.rec.calls

    model2 = WithExtra()
    trainer2 = Trainer(model2, train, total_steps=7, progress=False)
    later = []
    trainer2.add_schedule(lambda s, t: later.append(s))
    trainer2.load_checkpoint(ckpt)
    trainer2.fit()
    # continues from the global step, then one final call at total_steps so schedules end at their last value
    assert model2.rec.calls == [(4, 7), (5, 7), (6, 7), (7, 7)]
    assert later == [4, 5, 6, 7]


def test_extra_losses_are_added_weighted_and_logged():
    model = WithExtra()
    train, _ = digits_loaders(img_size=16, batch_size=64)
    trainer = Trainer(model, train, total_steps=3, lr=1e-2, weight_decay=0.0, progress=False,
                      extra_loss_weights={"reg": 0.5})
    batch = next(iter(train))
    loss, _, parts = trainer.compute_loss(*batch)
    assert parts["extra/reg"] == pytest.approx(36.0)
    assert float(loss.detach()) == pytest.approx(parts["task_loss"] + 0.5 * 36.0, rel=1e-6)
    trainer.fit()
    assert all("extra/reg" in m for m in trainer.history)
    # alpha only receives gradient from the extra loss: it must have moved towards 0
    assert float(model.reg.alpha.detach().abs().max()) < 3.0

    model.reg.skip_next = True
    _, _, parts = trainer.compute_loss(*batch)
    assert "extra/reg" not in parts

    model.reg.extra_loss = lambda: torch.ones(3)
    with pytest.raises(ValueError, match=r"reg\.extra_loss\(\): expected a scalar tensor"):
        trainer.compute_loss(*batch)


def test_callbacks_and_grad_clip():
    events = []

    class CB:
        def on_step(self, trainer, metrics):
            events.append(("step", metrics["step"]))

        def on_eval(self, trainer, metrics):
            events.append(("eval", metrics["step"]))

        def on_fit_end(self, trainer):
            events.append(("end", trainer.step))

    model = tiny_vit()
    train, val = digits_loaders(img_size=16, batch_size=64)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    clip, lr = 1e-3, 0.5
    trainer = Trainer(model, train, val, total_steps=1, optimizer="sgd", momentum=0.0, lr=lr, weight_decay=0.0,
                      warmup_steps=0, grad_clip=clip, callbacks=[CB()], eval_every=1, progress=False)
    trainer.fit()
    assert events == [("step", 1), ("eval", 1), ("end", 1)]
    assert trainer.history[0]["grad_norm"] > clip  # the logged norm is the one before clipping
    # one plain SGD step moves the weights by lr * clipped gradient: its global norm is at most lr * clip
    delta = torch.sqrt(sum(((p.detach() - before[n]) ** 2).sum() for n, p in model.named_parameters()))
    assert float(delta) <= lr * clip * (1 + 1e-4)
    assert float(delta) > 0


# ---------------------------------------------------------------------------------------------- resume
def _run(total, *, until=None, resume=None, ckpt=None, loader="seeded"):
    torch.manual_seed(1)
    model = tiny_vit(seed=1, drop_rate=0.1, drop_path_rate=0.1)  # dropout: the RNG state matters
    if loader == "seeded":
        train, val = digits_loaders(img_size=16, batch_size=256, augment=True)  # 5 batches/epoch
    else:  # a plain DataLoader: RandomSampler, skipped by reading (the generic path)
        ds = DigitsDataset(*[a[:600] for a in digits_arrays()], img_size=16, augment=False)
        train, val = DataLoader(ds, batch_size=128, shuffle=True, drop_last=True), None
    trainer = Trainer(model, train, val, total_steps=total, lr=2e-3, progress=False, eval_every=3, grad_clip=1.0,
                      checkpoint_path=ckpt, checkpoint_every=2 if ckpt else None)
    if resume:
        trainer.load_checkpoint(resume)
    trainer.fit(until)
    return model, trainer


@pytest.mark.parametrize("loader", ["seeded", "plain"])
def test_resume_equals_uninterrupted_run(tmp_path, loader):
    total, half = 12, 7  # crosses epoch boundaries; the checkpoint is mid-epoch
    full, full_trainer = _run(total, loader=loader)
    ckpt = str(tmp_path / "trainer.pt")
    _run(total, until=half, ckpt=ckpt, loader=loader)
    assert load_trainer_checkpoint(ckpt)["step"] == half
    resumed, resumed_trainer = _run(total, resume=ckpt, loader=loader)
    assert resumed_trainer.step == total
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    # the per-step losses after the resume point are the same numbers, not merely close
    assert [m["loss"] for m in full_trainer.history[half:]] == [m["loss"] for m in resumed_trainer.history]
    opt_a = full_trainer.optimizer.state_dict()["state"]
    opt_b = resumed_trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(opt_a[k]["exp_avg"], opt_b[k]["exp_avg"]) for k in opt_a)


@pytest.mark.parametrize("accum,batch", [(2, 64), (3, 42)])
def test_resume_at_the_end_of_an_epoch_with_accumulation(tmp_path, accum, batch):
    """A checkpoint at an epoch's last step with grad_accum > 1: the resume positioned the sampler past the epoch's
    end, no batch consumed it, and it shifted the *next* epoch (A=3: other data; A=2: "produced no batches")."""
    def run(until=None, resume=None, ckpt=None):
        torch.manual_seed(0)
        model = tiny_vit()
        train, _ = digits_loaders(img_size=16, batch_size=batch, seed=0)
        per_epoch = len(train) // accum
        trainer = Trainer(model, train, total_steps=per_epoch + 3, lr=2e-3, progress=False, grad_accum=accum,
                          checkpoint_path=ckpt, checkpoint_every=per_epoch if ckpt else None)
        if resume:
            trainer.load_checkpoint(resume)
        trainer.fit(until)
        return model, trainer, per_epoch

    full, full_trainer, per_epoch = run()
    ckpt = str(tmp_path / "t.pt")
    run(until=per_epoch, ckpt=ckpt)
    resumed, resumed_trainer, _ = run(resume=ckpt)
    assert [m["loss"] for m in full_trainer.history[per_epoch:]] == [m["loss"] for m in resumed_trainer.history]
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), resumed.state_dict().values()))
    assert (resumed_trainer.epoch, resumed_trainer.batch_in_epoch) == (full_trainer.epoch, full_trainer.batch_in_epoch)


def test_epochs_count_optimizer_steps_and_an_epoch_holds_one():
    """epochs × len(loader) steps trained grad_accum× the epochs asked for; fewer batches than grad_accum per epoch
    trained nothing and failed mid-run ("produced no batches for a whole epoch")."""
    train, _ = digits_loaders(img_size=16, batch_size=64)
    for accum in (1, 2, 4):
        assert Trainer(tiny_vit(), train, epochs=2, progress=False, grad_accum=accum).total_steps == \
            2 * (len(train) // accum)
    few, _ = digits_loaders(img_size=16, batch_size=512)  # 2 batches per epoch
    with pytest.raises(ValueError, match=r"train_loader: expected at least grad_accum = 3 batches per epoch"):
        Trainer(tiny_vit(), few, total_steps=4, progress=False, grad_accum=3)


def test_a_stop_during_the_last_step_is_a_finished_run():
    train, _ = digits_loaders(img_size=16, batch_size=64)
    trainer = Trainer(tiny_vit(), train, total_steps=2, progress=False)
    original = trainer.train_step

    def step_then_stop(*batches):
        out = original(*batches)
        if trainer.step == trainer.total_steps:
            trainer.request_stop()  # SIGTERM while the last step ran
        return out

    trainer.train_step = step_then_stop
    summary = trainer.fit()
    assert summary["finished"] and not summary["stopped"]


def test_checkpoint_is_weights_only_atomic_and_checked(tmp_path):
    model = tiny_vit()
    train, _ = digits_loaders(img_size=16, batch_size=64)
    path = tmp_path / "c.pt"
    trainer = Trainer(model, train, total_steps=4, progress=False, checkpoint_path=path,
                      checkpoint_extra={"note": "plain values only"})
    trainer.fit(until_step=2)
    state = torch.load(path, weights_only=True)  # no arbitrary pickle needed to read it back
    assert state["step"] == 2 and state["extra"] == {"note": "plain values only"}
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]  # no temporary file left behind

    other = Trainer(tiny_vit(), train, total_steps=5, progress=False)
    with pytest.raises(ValueError, match="total_steps=4"):
        other.load_checkpoint(path)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable vitfast trainer checkpoint"):
        trainer.load_checkpoint(broken)
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        trainer.load_checkpoint(tmp_path / "missing.pt")


# ---------------------------------------------------------------------------------------------- schedule, groups
def test_lr_schedule_shape():
    total, warm, lr, min_lr = 50, 10, 1e-2, 1e-4
    assert warmup_cosine(0, total, warm) == pytest.approx(1 / warm)
    assert warmup_cosine(warm, total, warm) == pytest.approx(1.0)
    assert warmup_cosine(total, total, warm, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(warm + (total - warm) // 2, total, warm) == pytest.approx(0.5)

    lrs = []

    class Rec:
        def on_step(self, trainer, metrics):
            lrs.append(metrics["lr"])

    train, _ = digits_loaders(img_size=16, batch_size=256)
    Trainer(tiny_vit(depth=0), train, total_steps=total, lr=lr, min_lr=min_lr, warmup_steps=warm,
            callbacks=[Rec()], progress=False).fit()
    assert len(lrs) == total
    assert all(a < b for a, b in zip(lrs[:warm - 1], lrs[1:warm]))  # strictly rising warm-up...
    assert lrs[warm - 1] == pytest.approx(lr) and lrs[warm] == pytest.approx(lr)  # ...that ends at the peak
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1:]))  # then never rising
    expected_last = min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (total - 1 - warm) / (total - warm)))
    assert lrs[-1] == pytest.approx(expected_last)
    assert lrs[-1] < 2 * min_lr + 1e-5


def test_weight_decay_groups():
    model = tiny_vit()
    extra = nn.Linear(3, 3)
    extra._no_weight_decay = True  # module-level mark: none of its parameters decay
    model.extra = extra
    gate = nn.Parameter(torch.zeros(2, 2))
    gate._no_weight_decay = True  # parameter-level mark
    model.gate = gate
    groups = param_groups(model, 0.05)
    decay = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.05 and groups[1]["weight_decay"] == 0.0
    names = {n for n, p in model.named_parameters() if id(p) in decay}
    assert "blocks.0.attn.qkv.weight" in names and "head.weight" in names
    for skipped in ("pos_embed", "cls_token", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias", "extra.weight",
                    "gate"):
        assert skipped not in names


def test_weight_decay_marks_survive_conversion():
    # from_timm / USDC copy the model: torch's Parameter deepcopy drops attributes, so a parameter the user marked
    # `_no_weight_decay` decayed after conversion.
    import vitfast

    for convert in (lambda m: vitfast.convert.from_timm(m, channel_idle=0.5),
                    lambda m: vitfast.convert.from_timm(m, gates=True),
                    lambda m: vitfast.convert.from_timm(m, dwconv_blocks=[1])):  # block 0's attention is kept
        model = tiny_vit(depth=2)
        model.gate = nn.Parameter(torch.zeros(2, 2))
        model.gate._no_weight_decay = True
        # inside a block the conversion rebuilds, on a tensor it carries over as it is (a derived one, e.g. the qkv
        # rows of the heads a scattered DW-conv conversion keeps, is a new parameter and starts unmarked)
        model.blocks[0].attn.qkv.weight._no_weight_decay = True
        converted = convert(model)
        assert converted.gate is not model.gate and converted.gate._no_weight_decay is True
        qkv = next(p for n, p in converted.named_parameters() if n.startswith("blocks.0.") and n.endswith("qkv.weight"))
        assert qkv is not model.blocks[0].attn.qkv.weight and qkv._no_weight_decay is True
        decay = {id(p) for p in param_groups(converted, 0.05)[0]["params"]}
        assert id(converted.gate) not in decay and id(qkv) not in decay


def test_bad_arguments_are_named():
    train, _ = digits_loaders(img_size=16, batch_size=64)
    with pytest.raises(ValueError, match="total_steps/epochs: expected exactly one"):
        Trainer(tiny_vit(), train)
    with pytest.raises(ValueError, match="lr: expected > 0"):
        Trainer(tiny_vit(), train, total_steps=3, lr=0)
    with pytest.raises(ValueError, match="optimizer: expected 'adamw', 'sgd'"):
        Trainer(tiny_vit(), train, total_steps=3, optimizer="no-such-optimizer")
    assert Trainer(tiny_vit(), train, epochs=2, progress=False).total_steps == 2 * len(train)


# ---------------------------------------------------------------------------------------------- data
def test_digits_loaders():
    train, val = digits_loaders(img_size=24, batch_size=50, val_fraction=0.25, seed=3)
    x, y = next(iter(train))
    assert x.shape == (50, 3, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert len(train.dataset) + len(val.dataset) == 1797
    assert len(val.dataset) == math.ceil(1797 * 0.25)  # scikit-learn rounds the test share up
    xv, _ = next(iter(val))
    assert abs(float(xv.mean())) < 0.2 and 0.6 < float(xv.std()) < 1.4  # normalised with train statistics
    # the split is a function of the seed alone
    _, val2 = digits_loaders(img_size=24, batch_size=50, val_fraction=0.25, seed=3)
    assert torch.equal(val.dataset.labels, val2.dataset.labels)
    with pytest.raises(ValueError, match="val_fraction"):
        digits_loaders(val_fraction=1.5)


def test_seeded_sampler_and_augmentation_are_pure_functions_of_the_key():
    s = SeededSampler(10, seed=5)
    s.set_epoch(2)
    order = list(s)
    s.set_start(4)
    assert list(s) == order[4:]
    assert list(s) == order  # set_start applies to one iteration only
    s.set_epoch(3)
    assert list(s) != order
    ds = DigitsDataset(*[a[:20] for a in digits_arrays()], img_size=16, augment=True)
    a, b = ds[(3, 123)][0], ds[(3, 123)][0]
    assert torch.equal(a, b)
    assert not torch.equal(a, ds[(3, 124)][0])
    assert torch.equal(ds[3][0], DigitsDataset(*[t[:20] for t in digits_arrays()], img_size=16)[3][0])


def test_repeated_augmentation_draws_each_image_r_times_with_its_own_seed():
    plain = SeededSampler(12, seed=5)
    plain.set_epoch(1)
    once = list(plain)
    s = SeededSampler(12, seed=5, repeats=3)
    s.set_epoch(1)
    keys = list(s)
    assert len(s) == len(keys) == 12  # the epoch keeps its length: a third of the images, three times each
    indices = [i for i, _ in keys]
    assert indices == [i for i, _ in once[:4] for _ in range(3)]  # the plain order, each index thrice in a row
    assert len({seed for _, seed in keys}) == 12  # every copy is augmented differently
    assert keys[0::3] == once[:4]  # the first copy keeps the plain sample's seed
    s.set_start(5)
    assert list(s) == keys[5:]  # a resumed epoch enters its repeated order part-way
    assert list(SeededSampler(12, seed=5, repeats=1)) == list(SeededSampler(12, seed=5))
    shards = [list(SeededSampler(12, seed=5, repeats=3, num_replicas=3, rank=r)) for r in range(3)]
    whole = list(SeededSampler(12, seed=5, repeats=3))
    for k in range(4):  # three replicas side by side: the one-process order, an image's copies on different ranks
        assert sorted(sh[k] for sh in shards) == sorted(whole[3 * k:3 * k + 3])
        assert len({sh[k][0] for sh in shards}) == 1
    with pytest.raises(ValueError, match="repeats: expected"):
        SeededSampler(12, repeats=0)


# ---------------------------------------------------------------------------------------------- train-time files
def test_trainable_file_round_trip(tmp_path):
    import vitfast

    model = vitfast.convert.from_timm(tiny_vit(depth=2), channel_idle=0.75).eval()
    path = tmp_path / "m.safetensors"
    save_trainable(model, path, recipe={"why": "test"})
    loaded, recipe = load_trainable(path)
    assert recipe == {"why": "test"}
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    fused = tmp_path / "f.safetensors"
    vitfast.save(vitfast.fuse(model), fused)
    with pytest.raises(ValueError, match="fused model"):
        load_trainable(fused)


def make_image_folder(root, classes=("cat", "dog"), per_class=6, size=20):
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            pixels = (torch.rand(size, size, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(root / c / f"{i}.png")
    return root


def test_image_folder_loaders(tmp_path, monkeypatch):
    from vitfast.training.data import image_folder_loaders

    root = make_image_folder(tmp_path / "imgs")
    train, val = image_folder_loaders(root, img_size=16, batch_size=4, val_fraction=0.25, seed=0)
    assert len(train.dataset) == 9 and len(val.dataset) == 3 and train.dataset.classes == ["cat", "dog"]
    x, y = next(iter(train))
    assert x.shape == (4, 3, 16, 16) and y.dtype == torch.int64
    # random crops/flips are seeded per (index, seed) key, so a resumed run sees the same pixels
    assert torch.equal(train.dataset[(2, 99)][0], train.dataset[(2, 99)][0])

    def reseeds_cuda(seed):  # torch.manual_seed reseeds every CUDA generator too, outside fork_rng(devices=[])
        raise AssertionError("the per-image seed must go to the CPU generator only")

    monkeypatch.setattr(torch, "manual_seed", reseeds_cuda)
    assert torch.equal(train.dataset[(2, 99)][0], train.dataset[(2, 99)][0])
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="root: expected a directory"):
        image_folder_loaders(tmp_path / "nope")
    # (height, width), as timm's img_size of a non-square model; the digits too
    train, val = image_folder_loaders(root, img_size=(12, 20), batch_size=4, val_fraction=0.25, seed=0)
    assert next(iter(train))[0].shape == (4, 3, 12, 20) and next(iter(val))[0].shape == (3, 3, 12, 20)
    from vitfast.training.data import digits_loaders

    train, val = digits_loaders(img_size=(16, 24), batch_size=4)
    assert next(iter(train))[0].shape == (4, 3, 16, 24) and next(iter(val))[0].shape[1:] == (3, 16, 24)
    with pytest.raises(ValueError, match=r"img_size\[1\]: expected an integer >= 8, got 4"):
        digits_loaders(img_size=(16, 4))


@pytest.mark.parametrize("method", [{}, {"channel_idle": 0.5}, {"branches": 2}, {"dwconv_blocks": [0]}],
                         ids=["timm", "channel_idle", "nondeep", "dwconv"])
def test_described_model_keeps_its_dropout_and_drop_path(method):
    """The description once held no regularisation: a rebuilt model (every --resume) trained without dropout, and
    one with drop-path could not be described at all ("DropPath described, Identity rebuilt")."""
    import json

    from timm.layers import DropPath

    import vitfast
    from vitfast.io.trainable import build_trainable, describe_trainable

    model = tiny_vit(depth=2, drop_rate=0.1, attn_drop_rate=0.15, proj_drop_rate=0.2, drop_path_rate=0.3)
    if method:
        model = vitfast.convert.from_timm(model, **method)

    def rates(m):
        return sorted((name, type(sub).__name__, round(float(getattr(sub, "p", getattr(sub, "drop_prob", 0.0))), 6))
                      for name, sub in m.named_modules() if isinstance(sub, (nn.Dropout, DropPath))
                      and float(getattr(sub, "p", getattr(sub, "drop_prob", 0.0))) > 0)

    rebuilt = build_trainable(json.loads(json.dumps(describe_trainable(model))))
    assert rates(rebuilt) == rates(model) and rates(model)
    assert any(kind == "DropPath" for _, kind, _ in rates(model))  # the case the rebuild could not handle at all
