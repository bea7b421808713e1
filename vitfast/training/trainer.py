"""Training loop for train-time vitfast models (and plain timm models).

    from vitfast.training import Trainer
    trainer = Trainer(model, train_loader, val_loader, total_steps=1000, lr=1e-3, checkpoint_path="run/trainer.pt")
    trainer.fit()                    # warm-up + cosine LR, progress bar, periodic eval, checkpoints
    trainer.evaluate()               # {'loss': ..., 'acc': ..., 'n': ...}

What later methods plug into (no change to the loop needed):

* **Step schedules.**  Every callable registered with `add_schedule(fn)` (or `schedules=[...]`), and every
  module that defines `set_step(step, total_steps)`, is called before each training step with the global
  step (0-based count of optimizer steps already taken) and `total_steps`; once more with
  `(total_steps, total_steps)` when training ends, so schedules finish at their final value (λ = 1 for
  progressive joining, which is what `vitfast.fuse` expects).
* **Extra losses.**  Every module that defines `extra_loss()` (returning a scalar tensor or None) is asked
  after each training forward; the value times its weight is added to the task loss.  The weight is
  `extra_loss_weights[name]` (module path, or class name) if given, else the module's `extra_loss_weight`
  attribute, else 1.  Each is logged separately as `extra/<module path>`.
* **Custom losses.**  `loss_fn(logits, targets)`, or override `Trainer.compute_loss(images, targets)` for
  losses that need the inputs (distillation from a teacher).
* **Callbacks.**  Objects with any of `on_step(trainer, metrics)`, `on_eval(trainer, metrics)`,
  `on_fit_end(trainer)`.

At scale (same loop, nothing else to change):

* **Data parallel.**  Under `torchrun` (a process group initialised, e.g. by `vitfast.training.distributed.init_from_env`)
  the Trainer wraps the model in DistributedDataParallel (`ddp=None`: automatic), switches every BatchNorm to a
  global-batch one for the duration of `fit` (`vitfast.training.distributed.synced_batchnorm`; channel-idle FFNs need
  it), evaluates each process's shard of a `ShardSampler` loader and sums counts over processes (no padded
  duplicates), and agrees on stopping.  Give each process its share of the data (`vitfast.training.data` loaders take
  `num_replicas`/`rank`): R processes with batch b then take the same steps as one process with batch R·b.
* **Gradient accumulation.**  `grad_accum=A`: one optimizer step = A micro-batches (loss/A each; DDP syncs
  gradients on the last one only).  An epoch is cut to a multiple of A micro-batches, so a step never spans
  two epochs and A micro-batches of b equal one batch of A·b.
* **Mixed precision.**  `amp="bf16"` (autocast; CPU or GPU) or `amp="fp16"` (autocast + GradScaler; GPU only).
* **Stopping safely.**  `handle_signals=True` turns SIGTERM/SIGINT into "finish this step, write the
  checkpoint, return" (`request_stop()` does the same from code); under DDP the processes agree on the step.
  Checkpoints are written by rank 0 only (atomically) and every rank reads them to resume; each rank's RNG
  state is stored, and the data position is stored in optimizer steps, so a run may resume with another
  `grad_accum` or process count (bit-exact when they are unchanged).

Checkpoints hold only state dicts, tensors and plain Python values (loadable with
`torch.load(..., weights_only=True)`, which is how they are read): model, optimizer, LR scheduler, global step,
data position (epoch and batch within it) and every RNG state; they are written atomically (temporary file,
fsync, rename).  A run resumed from a checkpoint continues exactly: N/2 steps + resume + N/2 steps gives the
same weights as N steps.  For that the Trainer owns the training loader's randomness: each epoch it calls
the sampler's `set_epoch(epoch)` (SeededSampler, DistributedSampler), or reseeds a `RandomSampler`, and
seeds the loader's worker-seed generator, from (seed, epoch).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .._threads import set_threads
from ..io.trainer_checkpoint import load_trainer_checkpoint, save_trainer_checkpoint
from . import distributed as _dist
from .callbacks import Callback
from .checkpoint_state import load_trainer_state, trainer_state
from .data import _mix
from .data_order import epoch_batches
from .evaluation import evaluate_model
from .optim import make_optimizer, make_scheduler
from .progress import progress_bar, show_metrics
from .rng import _set_rng_state, seed_everything
from .schedules import layer_decay_groups, param_groups
from .settings import resolve_total_steps, resolve_train_settings
from .stop_signals import on_stop_signals

__all__ = ["Trainer", "Callback", "AMP_DTYPES"]


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------------------------- trainer
class Trainer:
    """A single-model supervised training loop with the hooks the vitfast methods need (module docstring).

    Args:
        model: the network (train-time vitfast model or any classifier returning logits).
        train_loader: yields (images, targets).  Its randomness is driven by the Trainer (see module doc).
        val_loader: optional; used by `evaluate()` and periodic evaluation.
        total_steps / epochs: length of training (exactly one of them; epochs × (len(train_loader) // grad_accum)
            optimizer steps).
        recipe: a paper's settings (`vitfast.recipes`: "repavit", "nondeep:finetune", ... or a `get_recipe` dict);
            every argument given explicitly (not None) overrides it, and its lr follows the global batch by the
            recipe's rule.  `trainer.settings` holds what was used and where each value came from.  Settings the
            Trainer cannot apply (data augmentation, drop-path, method options) are listed in
            `trainer.unapplied`; `vitfast train --recipe` applies them.
        optimizer: "adamw" (default), "sgd", "lamb" or another `timm.optim.create_optimizer_v2` name, or a callable
            `param_groups -> torch.optim.Optimizer`.
        lr, weight_decay, betas, momentum: optimizer settings (weight decay skips norms, biases, pos-embed,
            cls token and parameters marked `_no_weight_decay`, but decays a module's `_weight_decay` names, e.g.
            DW-conv's γ; see `vitfast.training.schedules.no_decay_names`).
        layer_decay: timm's layer-wise lr decay (lr × layer_decay^(depth − layer)); needs lr_schedule "timm".
        warmup_steps / warmup_fraction: linear warm-up length (steps, or a fraction of total_steps).
        min_lr: the cosine's floor (absolute; scaled per param group).
        warmup_lr: where timm's warm-up starts (default: lr / warmup_steps, the legacy schedule's first value).
        lr_schedule: "timm" (timm's CosineLRScheduler per update; the default with a recipe) or "legacy" (the
            default without: vitfast's LambdaLR; see schedules.py).  A checkpoint resumes on the schedule it stored.
        mixup, cutmix: timm `Mixup` alphas (0: off); with either, the loss is timm's SoftTargetCrossEntropy on the
            mixed targets (label smoothing folded in), evaluation plain cross-entropy.  Batches must be even.
        num_classes: for mixup's one-hot targets (default: the model's `num_classes`).
        loss_fn: `fn(logits, targets) -> scalar`; default cross-entropy with `label_smoothing`.
        grad_clip: max global gradient norm (None: no clipping; the norm is logged either way).
        extra_loss_weights: {module path or class name: weight} for `extra_loss()` modules.
        schedules: callables `fn(step, total_steps)` called before every step.
        callbacks: objects with on_step / on_eval / on_fit_end.
        eval_every: evaluate every this many steps (and at the end) when a val_loader is given.
        checkpoint_path / checkpoint_every: save a resumable checkpoint every this many steps and at the end.
        checkpoint_extra: plain values (JSON-like) stored in every checkpoint under "extra" — e.g. how to
            rebuild the model (the CLI stores its recipe there).
        seed: seeds every RNG at construction and drives the data order.
        progress: show a tqdm bar (loss, lr, train acc; val acc after evaluations).
        device: where batches go (default: the model's device).
        grad_accum: micro-batches per optimizer step (module doc).
        amp: None, "bf16" or "fp16" (module doc).
        ddp: wrap in DistributedDataParallel (None: when a process group of > 1 processes is initialised).
        sync_batchnorm: under DDP, BatchNorm statistics over the global batch during `fit` (default True).
        find_unused_parameters: passed to DistributedDataParallel (parameters some steps do not use).
        handle_signals: SIGTERM/SIGINT stop `fit` after the current step with a checkpoint (module doc).
        threads: CPU threads, `torch.set_num_threads(threads)` at construction (None: leave torch's count).  On
            cores shared with other processes more than one thread needs OpenMP's passive waiting, which only the
            environment at start can give (`OMP_WAIT_POLICY=PASSIVE`; warned once otherwise; vitfast._threads).
    """

    def __init__(
        self,
        model: nn.Module,
        train_loader: Optional[Iterable] = None,
        val_loader: Optional[Iterable] = None,
        *,
        total_steps: Optional[int] = None,
        epochs: Optional[int] = None,
        recipe: Union[str, Dict[str, Any], None] = None,
        optimizer: Union[str, Callable[[List[Dict[str, Any]]], torch.optim.Optimizer], None] = None,
        lr: Optional[float] = None,
        weight_decay: Optional[float] = None,
        betas: Optional[Tuple[float, float]] = None,
        momentum: float = 0.9,
        warmup_steps: Optional[int] = None,
        warmup_fraction: Optional[float] = None,
        min_lr: Optional[float] = None,
        warmup_lr: Optional[float] = None,
        layer_decay: Optional[float] = None,
        lr_schedule: Optional[str] = None,
        mixup: Optional[float] = None,
        cutmix: Optional[float] = None,
        num_classes: Optional[int] = None,
        loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
        label_smoothing: Optional[float] = None,
        grad_clip: Optional[float] = None,
        extra_loss_weights: Optional[Dict[str, float]] = None,
        schedules: Sequence[Callable[[int, int], Any]] = (),
        callbacks: Sequence[Any] = (),
        eval_every: Optional[int] = None,
        checkpoint_path: Union[str, os.PathLike, None] = None,
        checkpoint_every: Optional[int] = None,
        checkpoint_extra: Optional[Dict[str, Any]] = None,
        seed: int = 0,
        progress: bool = True,
        desc: str = "train",
        device: Union[str, torch.device, None] = None,
        grad_accum: int = 1,
        amp: Optional[str] = None,
        ddp: Optional[bool] = None,
        sync_batchnorm: bool = True,
        find_unused_parameters: bool = False,
        handle_signals: bool = False,
        threads: Optional[int] = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.train_loader = train_loader
        self.val_loader = val_loader
        resolved = resolve_train_settings(
            model, train_loader, recipe=recipe, grad_accum=grad_accum, total_steps=total_steps, epochs=epochs,
            optimizer=optimizer, lr=lr, weight_decay=weight_decay, betas=betas, warmup_steps=warmup_steps,
            warmup_fraction=warmup_fraction, min_lr=min_lr, warmup_lr=warmup_lr, layer_decay=layer_decay,
            lr_schedule=lr_schedule, mixup=mixup, cutmix=cutmix, num_classes=num_classes, loss_fn=loss_fn,
            label_smoothing=label_smoothing, grad_clip=grad_clip, eval_every=eval_every,
            checkpoint_every=checkpoint_every)
        self.settings, self.unapplied, self.recipe = resolved.settings, resolved.unapplied, resolved.recipe
        self.lr_schedule, self.total_steps = resolved.lr_schedule, resolved.total_steps
        set_threads(threads, training=True)
        self.warmup_steps, self.warmup_lr = resolved.warmup_steps, resolved.warmup_lr
        self.lr, self.min_lr, self.weight_decay = resolved.lr, resolved.min_lr, resolved.weight_decay
        self.layer_decay = resolved.layer_decay
        self.mixup_fn, self.loss_fn, self.eval_loss_fn = resolved.mixup_fn, resolved.loss_fn, resolved.eval_loss_fn
        self.grad_clip = grad_clip
        self.seed = int(seed)
        self.device = torch.device(device) if device is not None else self._model_device()
        self.progress = bool(progress)
        self.desc = desc
        self.eval_every = eval_every
        self.checkpoint_path = os.fspath(checkpoint_path) if checkpoint_path is not None else None
        self.checkpoint_every = checkpoint_every
        self.checkpoint_extra = dict(checkpoint_extra or {})
        self.extra_loss_weights = dict(extra_loss_weights or {})
        self.callbacks = list(callbacks)
        self._user_schedules: List[Callable[[int, int], Any]] = list(schedules)
        for fn in self._user_schedules:
            if not callable(fn):
                raise TypeError(f"schedules: expected callables fn(step, total_steps), got {fn!r}")

        self.grad_accum = grad_accum  # checked by resolve_train_settings
        if amp is not None and amp not in AMP_DTYPES:
            raise ValueError(f"amp: expected None, 'bf16' or 'fp16', got {amp!r}")
        if amp == "fp16" and self.device.type != "cuda":
            raise ValueError(f"amp: 'fp16' needs a CUDA device (loss scaling); got device {self.device}; use 'bf16'")
        self.amp = amp
        self.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
        self.handle_signals = bool(handle_signals)
        self.sync_batchnorm = bool(sync_batchnorm)
        self.rank, self.world_size = _dist.rank(), _dist.world_size()

        # Other ranks get their own streams (dropout, drop-path); the weights still start equal: DDP broadcasts
        # rank 0's at wrapping.
        seed_everything(self.seed if self.rank == 0 else _mix(self.seed, self.rank, 0xD1))
        self.ddp_model: Optional[nn.Module] = None
        if ddp is None:
            ddp = _dist.is_distributed()
        if ddp:
            if not _dist.is_distributed():
                raise ValueError("ddp: True needs an initialised process group of more than one process "
                                 "(run under torchrun; vitfast.training.distributed.init_from_env)")
            from torch.nn.parallel import DistributedDataParallel

            self.ddp_model = DistributedDataParallel(
                model,
                device_ids=[torch.cuda.current_device() if self.device.index is None else self.device.index]
                if self.device.type == "cuda" else None,
                find_unused_parameters=bool(find_unused_parameters),
            )
        groups = (layer_decay_groups(model, self.weight_decay, layer_decay) if layer_decay
                  else param_groups(model, self.weight_decay))
        if not groups:
            raise ValueError("model: has no trainable parameters (all requires_grad=False)")
        self.optimizer = self._make_optimizer(resolved.optimizer, groups, resolved.betas, momentum)
        self.scheduler = self._make_scheduler(self.lr_schedule)

        # training position: `step` optimizer steps done; the next batch is number `batch_in_epoch` of `epoch`.
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.history: List[Dict[str, float]] = []
        self.eval_history: List[Dict[str, float]] = []
        self.last_eval: Optional[Dict[str, float]] = None
        self._iter = None
        self._pending_rng: Optional[Dict[str, Any]] = None
        self._window: List[Tuple[float, int, int]] = []  # (loss, correct, n) of recent steps for the bar
        self._last_saved_step: Optional[int] = None
        self._stop_requested = False
        self._epoch_limit: Optional[int] = None

    # ------------------------------------------------------------------------------------------ set-up
    # the run's optimizer steps from total_steps or epochs (settings.py); `vitfast train` sizes a run with it too
    _resolve_total_steps = staticmethod(resolve_total_steps)

    def _model_device(self) -> torch.device:
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    def _make_optimizer(self, optimizer, groups, betas, momentum) -> torch.optim.Optimizer:
        return make_optimizer(optimizer, groups, self.lr, betas, momentum)

    def _make_scheduler(self, kind: str):
        return make_scheduler(kind, self.optimizer, self.total_steps, self.warmup_steps, self.lr, self.min_lr,
                              self.warmup_lr)

    # ------------------------------------------------------------------------------------------ hooks
    def add_schedule(self, fn: Callable[[int, int], Any]) -> None:
        """Register `fn(step, total_steps)`, called before every training step (and once at the end)."""
        if not callable(fn):
            raise TypeError(f"fn: expected a callable fn(step, total_steps), got {fn!r}")
        self._user_schedules.append(fn)

    def schedules(self) -> List[Callable[[int, int], Any]]:
        """User schedules plus every module's `set_step` (re-scanned, so modules swapped in later count)."""
        found = [m.set_step for _, m in self.model.named_modules() if callable(getattr(m, "set_step", None))]
        return self._user_schedules + found

    def _apply_schedules(self, step: int) -> None:
        for fn in self.schedules():
            fn(step, self.total_steps)

    def extra_loss_modules(self) -> List[Tuple[str, nn.Module]]:
        return [
            (name or "model", m) for name, m in self.model.named_modules() if callable(getattr(m, "extra_loss", None))
        ]

    def _extra_weight(self, name: str, module: nn.Module) -> float:
        if name in self.extra_loss_weights:
            return float(self.extra_loss_weights[name])
        cls = type(module).__name__
        if cls in self.extra_loss_weights:
            return float(self.extra_loss_weights[cls])
        return float(getattr(module, "extra_loss_weight", 1.0))

    def _callback(self, event: str, *args) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if callable(fn):
                fn(self, *args)

    # ------------------------------------------------------------------------------------------ one step
    def compute_loss(self, images: torch.Tensor, targets: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, float]]:
        """Forward + task loss + module extra losses -> (total loss, logits, logged parts).

        Override for losses that need more than (logits, targets) — e.g. distillation from a teacher.
        """
        logits = self.forward(images)
        task, parts = self.task_loss(images, logits, targets)
        total = task
        for name, module in self.extra_loss_modules():
            value = module.extra_loss()
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                raise ValueError(
                    f"{name}.extra_loss(): expected a scalar tensor or None, got "
                    f"{type(value).__name__}{tuple(value.shape) if isinstance(value, torch.Tensor) else ''}"
                )
            weight = self._extra_weight(name, module)
            parts[f"extra/{name}"] = float(value.detach())
            total = total + weight * value.reshape(())
        return total, logits, parts

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The training forward: through the DDP wrapper when there is one (it syncs gradients)."""
        return (self.ddp_model if self.ddp_model is not None else self.model)(images)

    def task_loss(self, images: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The loss of the task itself -> (scalar, logged parts); `loss_fn` by default.  Distillation overrides it."""
        task = self.loss_fn(logits, targets)
        return task, {"task_loss": float(task.detach())}

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=AMP_DTYPES[self.amp])

    def _all_finite(self, loss: torch.Tensor) -> bool:
        ok = bool(torch.isfinite(loss.detach()).all())
        if _dist.is_distributed():  # every rank must take the same branch, or the others wait in backward forever
            ok = _dist.all_reduce_sum([0.0 if ok else 1.0], self.device)[0] == 0
        return ok

    def train_step(self, batch, *more_batches) -> Dict[str, float]:
        """One optimizer step on `batch` (and, with grad_accum = A, the A - 1 `more_batches`); returns its metrics.

        Logged loss/acc are over all micro-batches (and, under DDP, over all processes).
        """
        micro = [batch, *more_batches]
        if len(micro) != self.grad_accum:
            raise ValueError(f"batch: expected grad_accum={self.grad_accum} micro-batches, got {len(micro)}")
        self._apply_schedules(self.step)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, correct, count, parts_sum = 0.0, 0, 0, {}
        # Each micro-batch's loss (a mean over its samples) weighs by its share of the step's samples: with
        # unequal micro-batches (a loader without drop_last) 1/A weighted a 2-sample tail like a full 4 (the
        # gradient was off by up to half its size).  Equal sizes keep the exact 1/A of before.
        sizes = [int(mb[0].shape[0]) if isinstance(mb, (tuple, list)) and torch.is_tensor(mb[0]) else 1 for mb in micro]
        equal = len(set(sizes)) == 1
        for i, mb in enumerate(micro):
            weight = 1.0 / len(micro) if equal else sizes[i] / sum(sizes)
            images, targets = self._to_device(mb)
            hard = targets
            if self.mixup_fn is not None:
                if images.shape[0] % 2:
                    raise ValueError(f"batch_size: mixup/cutmix need an even batch, got {images.shape[0]}")
                images, targets = self.mixup_fn(images, targets)
            last = i == len(micro) - 1
            no_sync = self.ddp_model.no_sync() if (self.ddp_model is not None and not last) else contextlib.nullcontext()
            with no_sync:
                with self._autocast():
                    loss, logits, parts = self.compute_loss(images, targets)
                if not self._all_finite(loss):
                    raise FloatingPointError(
                        f"loss: expected a finite value, got {float(loss.detach())} at step {self.step} (parts: {parts}); "
                        "lower lr or enable grad_clip"
                    )
                scaled = loss.float() / len(micro) if equal else loss.float() * weight
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_sum += float(loss.detach()) * (1.0 if equal else weight * len(micro))
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v * (1.0 if equal else weight * len(micro))
            with torch.no_grad():
                if logits.ndim == 2 and hard.ndim == 1:
                    correct += int((logits.argmax(-1) == hard).sum())
            count += int(hard.shape[0])
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip is not None else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        lr = self.optimizer.param_groups[0]["lr"]
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.step += 1
        if self.lr_schedule == "timm":
            self.scheduler.step_update(self.step)  # the lr of the next update (timm: called after each update)
        else:
            self.scheduler.step()
        loss_mean = loss_sum / len(micro)
        total = _dist.all_reduce_sum([loss_mean, correct, count], self.device)  # global metrics under DDP
        loss_mean, correct, count = total[0] / self.world_size, int(total[1]), int(total[2])
        metrics = {"step": self.step, "loss": loss_mean, "lr": lr, "grad_norm": grad_norm,
                   **{k: v / len(micro) for k, v in parts_sum.items()}}
        metrics["acc"] = correct / max(1, count)
        self._window = (self._window + [(metrics["loss"], correct, count)])[-20:]
        return metrics

    def _stop_agreed(self) -> bool:
        """Whether any process was asked to stop (one tiny all-reduce under DDP, so all stop at the same step)."""
        return _dist.all_reduce_sum([float(self._stop_requested)], self.device)[0] > 0

    def request_stop(self) -> None:
        """Make `fit` return after the current step, with a checkpoint (safe to call from a signal handler)."""
        self._stop_requested = True

    def _to_device(self, batch):
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ValueError(f"train_loader: expected batches of (images, targets), got {type(batch).__name__}")
        images, targets = batch[0], batch[1]
        return images.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)

    # ------------------------------------------------------------------------------------------ data order
    def _epoch_iterator(self, epoch: int, skip_batches: int):
        it, self._epoch_limit = epoch_batches(self.train_loader, epoch, skip_batches, self.seed, self.grad_accum)
        return it

    def _next_batch(self):
        for _ in range(2):
            if self._iter is None:
                self._iter = self._epoch_iterator(self.epoch, self.batch_in_epoch)
                if self._pending_rng is not None:
                    # restored *after* positioning the data, whose set-up draws from the global RNG
                    _set_rng_state(self._pending_rng)
                    self._pending_rng = None
            try:
                if self._epoch_limit is not None and self.batch_in_epoch >= self._epoch_limit:
                    raise StopIteration
                batch = next(self._iter)
                self.batch_in_epoch += 1
                return batch
            except StopIteration:
                self._iter = None
                self.epoch += 1
                self.batch_in_epoch = 0
        raise ValueError("train_loader: produced no batches for a whole epoch")

    # ------------------------------------------------------------------------------------------ loops
    def fit(self, until_step: Optional[int] = None) -> Dict[str, Any]:
        """Train up to `until_step` (default: total_steps); returns a summary.

        `until_step` < total_steps stops early with the schedule unchanged (the LR still follows the full
        run) — a checkpoint then resumes it.  Schedules get their final call only when total_steps is reached.
        """
        until = self.total_steps if until_step is None else int(until_step)
        if not self.step <= until <= self.total_steps:
            raise ValueError(f"until_step: expected {self.step} <= until_step <= {self.total_steps}, got {until_step!r}")
        bar = progress_bar(self.total_steps, self.step, self.desc, self.progress and _dist.is_main_process())
        start = time.perf_counter()
        steps_at_start = self.step
        stopped = False
        self._stop_requested = False
        with contextlib.ExitStack() as stack:
            if self.ddp_model is not None and self.sync_batchnorm:
                stack.enter_context(_dist.synced_batchnorm(self.model))
            if self.handle_signals:
                stack.enter_context(on_stop_signals(self.request_stop))
            try:
                while self.step < until:
                    metrics = self.train_step(*[self._next_batch() for _ in range(self.grad_accum)])
                    self.history.append(metrics)
                    bar.update(1)
                    self._callback("on_step", metrics)
                    if self.val_loader is not None and self.eval_every and self.step % self.eval_every == 0:
                        self._run_eval(bar)
                    if self.checkpoint_path and self.checkpoint_every and self.step % self.checkpoint_every == 0:
                        self.save_checkpoint(self.checkpoint_path)
                    self._update_bar(bar)
                    if self._stop_agreed():
                        stopped = True
                        if bar is not None and not bar.disable:
                            bar.write(f"[{self.desc}] stop requested: stopping after step {self.step}")
                        break
                finished = self._finish_fit(bar)
                stopped = stopped and not finished  # a stop requested during the last step: the run is complete
            finally:
                bar.close()
        elapsed = time.perf_counter() - start
        if finished:
            self._callback("on_fit_end")
        return {
            "step": self.step,
            "steps_run": self.step - steps_at_start,
            "seconds": elapsed,
            "finished": finished,
            "stopped": stopped,
            "last_eval": self.last_eval,
        }

    def _finish_fit(self, bar) -> bool:
        """End of `fit` (completed or stopped): final schedule call and evaluation, last checkpoint."""
        finished = self.step >= self.total_steps
        if finished:
            self._apply_schedules(self.total_steps)
            if self.val_loader is not None and (self.last_eval is None or self.last_eval["step"] != self.step):
                self._run_eval(bar)
                self._update_bar(bar)
        if self.checkpoint_path and self._last_saved_step != self.step:
            self.save_checkpoint(self.checkpoint_path)
        return finished

    def _update_bar(self, bar) -> None:
        show_metrics(bar, self._window, self.history, self.last_eval)

    def _run_eval(self, bar=None) -> Dict[str, float]:
        metrics = self.evaluate()
        metrics["step"] = self.step
        self.last_eval = metrics
        self.eval_history.append(metrics)
        if bar is not None and not bar.disable:
            bar.write(f"[{self.desc}] step {self.step}: val loss {metrics['loss']:.4f}, val acc {metrics['acc']:.4f}")
        self._callback("on_eval", metrics)
        return metrics

    @torch.no_grad()
    def evaluate(self, loader: Optional[Iterable] = None, model: Optional[nn.Module] = None) -> Dict[str, float]:
        """Top-1 accuracy and mean task loss over `loader` (default: val_loader), in eval mode.

        Runs under a forked RNG, so evaluating (or not) never changes the training run's randomness.
        Under DDP, a loader whose sampler is sharded over the processes (`num_replicas` = world size, e.g.
        `vitfast.training.data.ShardSampler`) is evaluated shard by shard and the sums are all-reduced, so every process
        gets the accuracy over the whole set, each sample counted once; any other loader is evaluated whole by
        every process.  torch's DistributedSampler pads shards with repeated samples, so it is refused.
        """
        loader = self.val_loader if loader is None else loader
        if loader is None:
            raise ValueError("loader: evaluate() needs a loader (no val_loader was given)")
        return evaluate_model(self.model if model is None else model, loader, device=self.device,
                              world_size=self.world_size, to_device=self._to_device, autocast=self._autocast,
                              loss_fn=self.eval_loss_fn)

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Everything a resumed run needs, as tensors and plain values (weights_only-loadable; checkpoint_state.py).

        Under DDP every process must call it (the RNG states of all ranks are gathered).
        """
        return trainer_state(self, extra)

    def save_checkpoint(self, path: Union[str, os.PathLike], extra: Optional[Dict[str, Any]] = None) -> str:
        """Atomically write a resumable checkpoint to `path` (main process only under DDP)."""
        path = os.fspath(path)
        state = self.state_dict(extra)
        if _dist.is_main_process():
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            save_trainer_checkpoint(state, path)
        _dist.barrier()  # nobody goes on (or reads it to resume) before it is complete
        self._last_saved_step = self.step
        return path

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take back a `state_dict` of this run (same length, seed and recipe; checkpoint_state.py)."""
        load_trainer_state(self, state)

    def load_checkpoint(self, path: Union[str, os.PathLike]) -> Dict[str, Any]:
        """Resume from `path`: the next `fit()` continues exactly where that run stopped. Returns its `extra`."""
        state = load_trainer_checkpoint(path)
        self.load_state_dict(state)
        return state.get("extra") or {}


