"""Training at scale on CPU: 2 gloo processes (torch.multiprocessing.spawn) against one process on the same global
batch, identical weights on every rank, global-batch BatchNorm, sharded evaluation, an agreed stop + resume
under DDP; and in one process: gradient accumulation, SIGTERM -> checkpoint -> resume, bf16 autocast."""
import os
import signal
import socket

import pytest
import torch
import torch.multiprocessing as mp

from vitfast.training.data import SeededSampler, ShardSampler, digits_loaders
from vitfast.training.trainer import Trainer
from vitfast.io.trainer_checkpoint import load_trainer_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

GLOBAL_BATCH, STEPS = 32, 5


def bn_vit(seed=3):
    """A tiny ViT with channel-idle FFNs and BatchNorms (the models that need a global-batch BatchNorm)."""
    from timm.models.vision_transformer import VisionTransformer

    from vitfast.convert import from_timm

    torch.manual_seed(seed)
    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    return from_timm(vit, channel_idle=0.5, norm="batch")


def make_trainer(model, world=1, rank=0, accum=1, **kw):
    """SGD: Adam divides by the gradient's running RMS, which turns the float noise of a gradient that is zero in
    exact arithmetic (a bias right before a BatchNorm) into full-size steps; SGD keeps the comparison about
    the gradients themselves."""
    train, val = digits_loaders(img_size=16, batch_size=GLOBAL_BATCH // (world * accum), num_replicas=world, rank=rank)
    kw = {"optimizer": "sgd", "lr": 0.05, **kw}
    return Trainer(model, train, val, total_steps=STEPS, warmup_steps=1, grad_clip=1.0, progress=False,
                   grad_accum=accum, eval_every=STEPS, **kw)


# ---------------------------------------------------------------------------------------------- 2 processes
def _worker(rank, world, init_file, out):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # 1. an uninterrupted run
        model = bn_vit()
        trainer = make_trainer(model, world, rank)
        assert trainer.ddp_model is not None  # wrapped automatically inside a process group
        trainer.fit()
        torch.save({"state": model.state_dict(), "eval": trainer.last_eval,
                    "bn_class": type(model.blocks[0].mlp.pre_norm).__name__}, f"{out}/full_{rank}.pt")

        # 2. the same run, stopped after step 2 by a request on rank 1 only, then resumed by fresh trainers
        class StopOnRank1:
            def on_step(self, tr, metrics):
                if rank == 1 and tr.step == 2:
                    tr.request_stop()

        ckpt = f"{out}/ckpt.pt"
        first = make_trainer(bn_vit(), world, rank, checkpoint_path=ckpt, callbacks=[StopOnRank1()])
        summary = first.fit()
        assert summary["stopped"] and summary["step"] == 2, summary  # both ranks stopped at the same step
        model2 = bn_vit(seed=99)  # different init: everything must come from the checkpoint
        second = make_trainer(model2, world, rank, checkpoint_path=ckpt)
        second.load_checkpoint(ckpt)
        second.fit()
        torch.save({"state": model2.state_dict()}, f"{out}/resumed_{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, str(out / "init"), str(out)), nprocs=2, join=True)
    return out


@pytest.mark.slow  # two spawned processes importing torch and timm: 20-60 s on a loaded 2-core machine
def test_two_gloo_processes_match_one_process_on_the_same_global_batch(two_process_run):
    ranks = [torch.load(two_process_run / f"full_{r}.pt", weights_only=True) for r in range(2)]
    # every rank holds identical weights (and BatchNorm statistics) after training
    for key, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][key]), key
    # the BatchNorms were plain again after fit (the global-batch class is only swapped in during training)
    assert ranks[0]["bn_class"] == "BatchNorm1d"

    model = bn_vit()
    single = make_trainer(model)
    single.fit()
    ref = model.state_dict()
    for key, value in ranks[0]["state"].items():
        if value.dtype.is_floating_point:
            # all-reduce order and float sums differ from one process's; nothing else may
            torch.testing.assert_close(value, ref[key], atol=2e-5, rtol=1e-4, msg=key)
        else:
            assert torch.equal(value, ref[key]), key
    # the global BatchNorm statistics are those of the 32-image batch, not of one rank's 16
    torch.testing.assert_close(ranks[0]["state"]["blocks.0.mlp.pre_norm.running_var"],
                               ref["blocks.0.mlp.pre_norm.running_var"], atol=1e-5, rtol=1e-4)
    # distributed evaluation: every validation image counted once, the same accuracy on both ranks
    ev = [r["eval"] for r in ranks]
    assert ev[0]["n"] == ev[1]["n"] == 360 and ev[0]["acc"] == ev[1]["acc"]
    assert ev[0]["acc"] == pytest.approx(single.last_eval["acc"], abs=1 / 360 + 1e-9)


@pytest.mark.slow
def test_ddp_stop_on_one_rank_then_resume_equals_the_uninterrupted_run(two_process_run):
    state = load_trainer_checkpoint(two_process_run / "ckpt.pt")
    assert state["world_size"] == 2 and len(state["rng_ranks"]) == 2
    for r in range(2):
        full = torch.load(two_process_run / f"full_{r}.pt", weights_only=True)["state"]
        resumed = torch.load(two_process_run / f"resumed_{r}.pt", weights_only=True)["state"]
        for key, value in full.items():
            assert torch.equal(value, resumed[key]), (r, key)


# ---------------------------------------------------------------------------------------------- samplers
def test_sharded_samplers_partition_the_global_batches():
    whole = list(SeededSampler(103, seed=5))
    shards = [list(SeededSampler(103, seed=5, num_replicas=2, rank=r)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 51  # equal shares; the last sample of this epoch is dropped
    b = 4  # per-rank batch; the global batch is 8
    for k in range(51 // b):
        union = sorted(shards[0][k * b:(k + 1) * b] + shards[1][k * b:(k + 1) * b])
        assert union == sorted(whole[k * 2 * b:(k + 1) * 2 * b])
    s = ShardSampler(7, num_replicas=3, rank=1)
    assert list(s) == [1, 4] and len(s) == 2
    assert sorted(sum((list(ShardSampler(7, num_replicas=3, rank=r)) for r in range(3)), [])) == list(range(7))
    with pytest.raises(ValueError, match=r"rank: expected an integer in \[0, 2\)"):
        SeededSampler(10, num_replicas=2, rank=2)


# ---------------------------------------------------------------------------------------------- one process
def test_gradient_accumulation_equals_the_large_batch():
    """4 micro-batches of 8 per step = one batch of 32 (a LayerNorm model: BatchNorm would see 8 at a time)."""
    from timm.models.vision_transformer import VisionTransformer

    def ln_vit():
        torch.manual_seed(4)
        return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10)

    a, b = ln_vit(), ln_vit()
    make_trainer(a).fit()
    trainer = make_trainer(b, accum=4)
    trainer.fit()
    assert trainer.step == STEPS and trainer.history[0]["loss"] > 0
    for (key, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=2e-5, rtol=1e-4, msg=key)


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resume_is_exact(tmp_path):
    ckpt = tmp_path / "t.pt"

    class Kill:
        def on_step(self, tr, metrics):
            if tr.step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    full = bn_vit()
    make_trainer(full).fit()

    stopped = make_trainer(bn_vit(), checkpoint_path=ckpt, handle_signals=True, callbacks=[Kill()])
    before = signal.getsignal(signal.SIGTERM)
    summary = stopped.fit()
    assert summary["stopped"] and not summary["finished"] and summary["step"] == 3
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is removed again
    assert load_trainer_checkpoint(ckpt)["step"] == 3  # no completed step lost, with checkpoint_every unset

    model = bn_vit(seed=42)
    resumed = make_trainer(model, checkpoint_path=ckpt)
    resumed.load_checkpoint(ckpt)
    resumed.fit()
    for (key, va), vb in zip(full.state_dict().items(), model.state_dict().values()):
        assert torch.equal(va, vb), key


def test_unequal_micro_batches_weigh_by_their_samples():
    """Micro-batches of 4 and 2 (a loader without drop_last) = one batch of 6: each micro-batch's mean loss once
    weighed 1/A, the 2-sample tail as much as the 4 (the gradient was off by up to half its size)."""
    from timm.models.vision_transformer import VisionTransformer

    from vitfast.training.trainer import Trainer

    def ln_vit():
        torch.manual_seed(4)
        return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=10)

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 3, 16, 16, generator=g), torch.randint(0, 10, (6,), generator=g)
    sgd = lambda groups: torch.optim.SGD(groups, lr=0.5)  # noqa: E731
    a, b = ln_vit(), ln_vit()
    Trainer(a, total_steps=1, warmup_steps=0, optimizer=sgd, progress=False).train_step((x, y))
    accum = Trainer(b, total_steps=1, warmup_steps=0, optimizer=sgd, progress=False, grad_accum=2)
    metrics = accum.train_step((x[:4], y[:4]), (x[4:], y[4:]))
    for (key, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=2e-6, rtol=1e-5, msg=key)
    assert metrics["loss"] > 0


def test_resume_with_another_grad_accum_continues_at_the_same_sample(tmp_path):
    ckpt = tmp_path / "t.pt"
    make_trainer(bn_vit(), checkpoint_path=ckpt).fit(until_step=2)
    trainer = make_trainer(bn_vit(), accum=2, checkpoint_path=ckpt)
    trainer.load_checkpoint(ckpt)
    assert trainer.batch_in_epoch == 4  # 2 steps x 2 micro-batches of 16 = the 64 samples already seen
    trainer.fit()
    assert trainer.step == STEPS


def test_bf16_autocast_and_bad_arguments():
    model = bn_vit()
    trainer = make_trainer(model, amp="bf16")
    trainer.fit()
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in trainer.history)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast, not a cast of the weights
    with pytest.raises(ValueError, match="amp: 'fp16' needs a CUDA device"):
        make_trainer(bn_vit(), amp="fp16")
    with pytest.raises(ValueError, match="amp: expected None, 'bf16' or 'fp16'"):
        make_trainer(bn_vit(), amp="fp8")
    with pytest.raises(ValueError, match="grad_accum: expected a positive integer"):
        Trainer(bn_vit(), total_steps=2, grad_accum=0)
    with pytest.raises(ValueError, match="ddp: True needs an initialised process group"):
        make_trainer(bn_vit(), ddp=True)
    with pytest.raises(ValueError, match="expected grad_accum=2 micro-batches"):
        make_trainer(bn_vit(), accum=2).train_step(next(iter(digits_loaders(img_size=16, batch_size=8)[0])))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 loss scaling and CUDA autocast need a GPU")
@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_mixed_precision_on_cuda_resumes_exactly(tmp_path, amp):
    ckpt = tmp_path / "t.pt"
    full = bn_vit().cuda()
    trainer = make_trainer(full, amp=amp, device="cuda")
    trainer.fit()
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in trainer.history)
    assert trainer.last_eval["n"] == 360
    make_trainer(bn_vit().cuda(), amp=amp, device="cuda", checkpoint_path=ckpt).fit(until_step=2)
    state = load_trainer_checkpoint(ckpt)
    assert ("scaler" in state) == (amp == "fp16")
    model = bn_vit(seed=42).cuda()
    resumed = make_trainer(model, amp=amp, device="cuda")
    resumed.load_checkpoint(ckpt)
    resumed.fit()
    for (key, va), vb in zip(full.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=1e-5, rtol=1e-5, msg=key)  # cuDNN/cuBLAS may pick other kernels
