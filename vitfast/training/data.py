"""Data for training and checking vitfast models: scikit-learn's bundled digits (no download) and image folders.

    train_loader, val_loader = vitfast.training.data.digits_loaders(img_size=32, batch_size=64)
    images, labels = next(iter(train_loader))          # [64, 3, 32, 32] float32 (normalised), [64] int64

Exact resume needs data that is a pure function of (seed, epoch, position).  So the training loaders here use
`SeededSampler`: it yields `(index, sample_seed)` pairs, where `sample_seed` is derived from (seed, epoch,
index), and the datasets draw their augmentation from a private generator seeded with it.  The data a step
sees therefore does not depend on worker processes, on the global RNG, or on whether the run was
interrupted; `vitfast.training.Trainer` calls `set_epoch()` at each epoch and `set_start()` to skip what a
resumed run already consumed (no images are loaded for the skipped part).
"""
from __future__ import annotations

import contextlib
import math
import os
import random
from typing import Callable, Iterator, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = [
    "SeededSampler",
    "ShardSampler",
    "DigitsDataset",
    "SeededTransformDataset",
    "digits_loaders",
    "digits_arrays",
    "image_folder_loaders",
    "write_digits_image_folder",
    "timm_transforms",
]

_MASK64 = (1 << 64) - 1


def _mix(*values: int) -> int:
    """A 63-bit seed from several integers (splitmix64 finaliser), so nearby (seed, epoch, index) tuples give
    unrelated streams — `seed + epoch` would make epoch 1 of seed 0 equal epoch 0 of seed 1."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 29
    return h & ((1 << 63) - 1)


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_image_size(name: str, value, minimum: int = 1) -> Tuple[int, int]:
    """An image size: one int (square) or (height, width), as timm's img_size; returns (height, width)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name}: expected an integer or (height, width), got {value!r}")
        return _check_positive_int(f"{name}[0]", value[0], minimum), _check_positive_int(f"{name}[1]", value[1], minimum)
    size = _check_positive_int(name, value, minimum)
    return size, size


class SeededSampler(Sampler):
    """Yields `(index, sample_seed)` for every index of a dataset of length `n`, shuffled per epoch.

    The order and the per-sample seeds depend only on (seed, epoch): call `set_epoch(e)` before iterating
    (the Trainer does).  `set_start(k)` makes the *next* iteration begin at position k of the epoch's order
    (how a resumed run skips what it already consumed); it resets after that iteration.

    Data parallel (`num_replicas` > 1): replica `rank` takes positions rank, rank + R, rank + 2R, ... of the
    one global order, and every replica gets the same count ⌊n/R⌋ (the tail is dropped, as a training loader's
    drop_last would), so all replicas run the same number of steps.  With a per-replica batch b, local batch
    k of every replica lies inside global positions [k·R·b, (k+1)·R·b): the R replicas together see exactly
    the batch one process with batch R·b would see at that step, whatever R is.  `set_start` then counts
    positions of this replica's share.

    Repeated augmentation (`repeats` = r > 1; DeiT's RASampler, Hoffer et al. 2020): the global order holds every
    shuffled index r times in a row, each copy with its own sample seed (so its own augmentation), and an epoch
    still yields ⌊n/R⌋ samples per replica — about n/r distinct images, each seen r times, in the same batch on one
    process and on r replicas side by side with several.  (DeiT also rounds the epoch down to a multiple of 256
    images, an ImageNet-size convenience left out here so the steps per epoch do not depend on r.)  r = 1 is the
    plain order, with the same seeds as without the option.
    """

    def __init__(self, n: int, *, shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0,
                 repeats: int = 1):
        self.n = _check_positive_int("n", n)
        self.repeats = _check_positive_int("repeats", repeats)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = _check_positive_int("num_replicas", num_replicas)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank: expected an integer in [0, {self.num_replicas}), got {rank!r}")
        self.rank = int(rank)
        if self.n < self.num_replicas:
            raise ValueError(f"n: expected at least num_replicas={self.num_replicas} samples, got {self.n}")
        self.epoch = 0
        self._start = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def set_start(self, start: int) -> None:
        if not 0 <= start <= len(self):
            raise ValueError(f"start: expected 0 <= start <= {len(self)}, got {start}")
        self._start = int(start)

    def order(self) -> list:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(_mix(self.seed, self.epoch, 0x5A3))
        return torch.randperm(self.n, generator=g).tolist()

    def _keys(self) -> list:
        """The epoch's global order as (index, copy) pairs: each index `repeats` times in a row."""
        return [(i, c) for i in self.order() for c in range(self.repeats)]

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        start, self._start = self._start, 0
        mine = self._keys()[self.rank : len(self) * self.num_replicas : self.num_replicas]
        for i, c in mine[start:]:
            yield (i, _mix(self.seed, self.epoch, i) if c == 0 else _mix(self.seed, self.epoch, i, c))

    def __len__(self) -> int:
        return self.n // self.num_replicas


class ShardSampler(Sampler):
    """Evaluation shard: replica `rank` of `num_replicas` gets indices rank, rank + R, ... of 0..n-1, in order.

    No padding and no duplicates (unlike torch's DistributedSampler, which repeats samples to even out the
    shards): summing per-replica counts gives exactly the whole set, which is what a distributed accuracy
    needs.  Shards may differ in length by one.
    """

    def __init__(self, n: int, *, num_replicas: int = 1, rank: int = 0):
        self.n = _check_positive_int("n", n)
        self.num_replicas = _check_positive_int("num_replicas", num_replicas)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank: expected an integer in [0, {self.num_replicas}), got {rank!r}")
        self.rank = int(rank)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.num_replicas))


@contextlib.contextmanager
def seeded_rng(seed: int):
    """Python's `random`, NumPy's global RNG and torch's CPU generator seeded with `seed` inside, restored after.

    timm's transforms draw from all three (RandAugment: `random` and `np.random.choice`; RandomErasing: `random`
    and torch), so a seeded sample needs every one seeded, and the training run's own streams must not move."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        # the CPU generator only: torch.manual_seed also reseeds every CUDA generator, which fork_rng(devices=[])
        # does not restore (each batch reset the GPU's dropout stream to a data-derived seed)
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % (2**32))
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def _split_key(key) -> Tuple[int, Optional[int]]:
    if isinstance(key, (tuple, list)):
        return int(key[0]), int(key[1])
    return int(key), None


# ---------------------------------------------------------------------------------------------- digits
def digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: images [1797, 8, 8] float32 in [0, 1], labels [1797] int64."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


class DigitsDataset(Dataset):
    """8x8 digits rendered at `img_size` (an int: square, or (height, width)), 3 channels, normalised with
    (`mean`, `std`).

    Rendering is one bilinear `grid_sample` from the 8x8 source onto the output grid, so upsampling and the
    optional augmentation (small rotation, scale and shift) are a single resampling, never a blur of a blur.
    `dataset[i]` is the plain image; `dataset[(i, seed)]` is augmented with a generator seeded by `seed`.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        img_size: Union[int, Tuple[int, int]] = 32,
        mean: float = 0.0,
        std: float = 1.0,
        augment: bool = False,
        max_rotate_deg: float = 10.0,
        max_scale: float = 0.1,
        max_shift: float = 0.15,
        reprob: float = 0.0,
    ):
        self.images = torch.as_tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8)
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        if len(self.images) != len(self.labels):
            raise ValueError(f"labels: expected {len(self.images)} labels (one per image), got {len(self.labels)}")
        self.image_hw = _check_image_size("img_size", img_size, minimum=8)
        if not std > 0:
            raise ValueError(f"std: expected > 0, got {std}")
        self.mean, self.std = float(mean), float(std)
        self.augment = bool(augment)
        self.max_rotate = math.radians(max_rotate_deg)
        self.max_scale, self.max_shift = float(max_scale), float(max_shift)
        if not 0.0 <= reprob <= 1.0:
            raise ValueError(f"reprob: expected a probability in [0, 1], got {reprob!r}")
        self.erasing = None
        if reprob > 0:
            from timm.data.random_erasing import RandomErasing

            # DeiT's random erasing (pixel mode: normal noise in the erased box), on the rendered tensor
            self.erasing = RandomErasing(probability=float(reprob), mode="pixel", device="cpu")
        self.classes = list(range(10))

    def __len__(self) -> int:
        return len(self.labels)

    def _theta(self, seed: Optional[int]) -> torch.Tensor:
        if seed is None or not self.augment:
            return torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(4, generator=g) * 2 - 1  # four uniforms in [-1, 1]
        angle = float(u[0]) * self.max_rotate
        scale = 1.0 + float(u[1]) * self.max_scale
        # theta maps output coords to input coords, so dividing by scale zooms the digit by `scale`.
        c, s = math.cos(angle) / scale, math.sin(angle) / scale
        return torch.tensor([[c, -s, float(u[2]) * self.max_shift], [s, c, float(u[3]) * self.max_shift]])

    def __getitem__(self, key):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys):
        # DataLoader calls this with a whole batch of keys: one batched grid_sample is ~20x faster than one
        # call per image, and each image still gets its own seeded transform.
        split = [_split_key(k) for k in keys]
        index = torch.tensor([i for i, _ in split])
        theta = torch.stack([self._theta(seed) for _, seed in split])
        grid = F.affine_grid(theta, [len(split), 1, *self.image_hw], align_corners=False)
        img = F.grid_sample(self.images[index], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        img = ((img - self.mean) / self.std).expand(-1, 3, -1, -1)
        labels = self.labels[index]
        out = [(img[j].contiguous(), labels[j]) for j in range(len(split))]
        if self.erasing is not None and self.augment:
            for j, (_, seed) in enumerate(split):
                if seed is not None:
                    with seeded_rng(_mix(seed, 0xE5A)):
                        out[j] = (self.erasing(out[j][0]), out[j][1])
        return out


def digits_loaders(
    img_size: Union[int, Tuple[int, int]] = 32,
    batch_size: int = 64,
    val_fraction: float = 0.2,
    seed: int = 0,
    augment: bool = True,
    *,
    eval_batch_size: Optional[int] = None,
    num_workers: int = 0,
    drop_last: bool = True,
    num_replicas: int = 1,
    rank: int = 0,
    reprob: float = 0.0,
    repeats: int = 1,
) -> Tuple[DataLoader, DataLoader]:
    """Train and validation loaders over scikit-learn's digits (1797 images, 10 classes, no download).

    The split is stratified and fixed by `seed` (the same seed always gives the same validation images);
    normalisation statistics come from the training split only.  The training loader shuffles with a
    `SeededSampler` and (if `augment`) applies a small random affine per image; the validation loader is
    plain and in order.  Both yield `[B, 3, H, W]` float32 (img_size = H = W, or (H, W)) and `[B]` int64 labels.
    `drop_last` (train only) keeps every step's batch the same size, which keeps BatchNorm statistics sane.
    Data parallel: `num_replicas`/`rank` give this process its share (`SeededSampler` for training,
    `ShardSampler` for validation); `batch_size` is then the per-process batch.  `reprob`: timm's random erasing
    on the training images (with `augment`), seeded per sample like the affine.  `repeats` > 1: repeated
    augmentation (`SeededSampler`), each drawn image `repeats` times with its own augmentation.
    """
    img_size = _check_image_size("img_size", img_size, minimum=8)
    batch_size = _check_positive_int("batch_size", batch_size)
    eval_batch_size = _check_positive_int("eval_batch_size", eval_batch_size or max(batch_size, 256))
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction: expected a fraction strictly between 0 and 1, got {val_fraction!r}")
    from sklearn.model_selection import train_test_split

    images, labels = digits_arrays()
    idx_train, idx_val = train_test_split(
        np.arange(len(labels)), test_size=float(val_fraction), random_state=int(seed), stratify=labels
    )
    if batch_size * num_replicas > len(idx_train) and drop_last:
        raise ValueError(
            f"batch_size: expected at most {len(idx_train) // num_replicas} (the training split per process) with "
            f"drop_last, got {batch_size}"
        )
    mean, std = float(images[idx_train].mean()), float(images[idx_train].std())
    common = dict(img_size=img_size, mean=mean, std=std)
    train_set = DigitsDataset(images[idx_train], labels[idx_train], augment=augment, reprob=reprob, **common)
    val_set = DigitsDataset(images[idx_val], labels[idx_val], augment=False, **common)
    train_loader = DataLoader(
        train_set,
        batch_size=batch_size,
        sampler=SeededSampler(len(train_set), shuffle=True, seed=seed, num_replicas=num_replicas, rank=rank,
                              repeats=repeats),
        drop_last=drop_last,
        num_workers=num_workers,
    )
    val_loader = DataLoader(val_set, batch_size=eval_batch_size, num_workers=num_workers,
                            sampler=ShardSampler(len(val_set), num_replicas=num_replicas, rank=rank))
    return train_loader, val_loader


# ---------------------------------------------------------------------------------------------- image folders
class SeededTransformDataset(Dataset):
    """Wraps a map-style dataset of (image, target) and applies `transform` with a per-sample seed.

    For `(index, seed)` keys (from `SeededSampler`) the transform runs under seeded, restored RNGs (`seeded_rng`:
    torch's CPU generator, Python's `random`, NumPy's), so random torchvision and timm transforms become a pure
    function of the key; plain integer keys run the transform as is.
    """

    def __init__(self, base: Dataset, transform: Optional[Callable] = None):
        self.base, self.transform = base, transform
        self.classes = getattr(base, "classes", None)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key):
        index, seed = _split_key(key)
        image, target = self.base[index]
        if self.transform is None:
            return image, target
        if seed is None:
            return self.transform(image), target
        with seeded_rng(seed):
            return self.transform(image), target


def image_folder_loaders(
    root: Union[str, os.PathLike],
    img_size: Union[int, Tuple[int, int]] = 224,
    batch_size: int = 64,
    *,
    val_root: Union[str, os.PathLike, None] = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    augment: bool = True,
    mean: Sequence[float] = (0.485, 0.456, 0.406),
    std: Sequence[float] = (0.229, 0.224, 0.225),
    eval_batch_size: Optional[int] = None,
    num_workers: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
    transform: Optional[dict] = None,
    repeats: int = 1,
) -> Tuple[DataLoader, DataLoader]:
    """Train/val loaders over a torchvision `ImageFolder` tree (`root/<class>/<image>`).

    With `val_root` its images are the validation set; otherwise a fixed `val_fraction` of `root` (by `seed`)
    is held out.  Training: RandomResizedCrop + horizontal flip (if `augment`); validation: resize + centre
    crop.  Both normalised with ImageNet statistics unless `mean`/`std` are given.  Point `root` at ImageNet's
    train/ and `val_root` at its val/ (both in class sub-folders).  Data parallel: as `digits_loaders`
    (`batch_size` is per process).  `transform`: timm's train and eval transforms instead (`timm_transforms`: the
    DeiT pipeline — RandomResizedCrop, flip, RandAugment, colour jitter, random erasing — with these settings).
    `repeats` > 1: repeated augmentation, as `digits_loaders`.
    """
    from torchvision import datasets, transforms

    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"root: expected a directory of class sub-folders, got {root!r} (not a directory)")
    height, width = _check_image_size("img_size", img_size)
    batch_size = _check_positive_int("batch_size", batch_size)
    norm = transforms.Normalize(mean, std)
    # The usual 0.875 centre-crop ratio; a non-square (H, W) resizes to (H, W) / 0.875, then crops (H, W).
    resize = (int(round(height / 0.875)) if height == width
              else (int(round(height / 0.875)), int(round(width / 0.875))))
    plain = transforms.Compose(
        [transforms.Resize(resize), transforms.CenterCrop((height, width)), transforms.ToTensor(), norm]
    )
    train_tf = (
        transforms.Compose(
            [transforms.RandomResizedCrop((height, width)), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
             norm]
        )
        if augment
        else plain
    )
    if transform is not None:
        train_tf, plain = timm_transforms((height, width), mean=mean, std=std, **transform)
        if not augment:
            train_tf = plain
    full = datasets.ImageFolder(root)
    if val_root is not None:
        val_root = os.fspath(val_root)
        if not os.path.isdir(val_root):
            raise FileNotFoundError(f"val_root: expected a directory of class sub-folders, got {val_root!r}")
        train_base, val_base = full, datasets.ImageFolder(val_root)
        if val_base.classes != full.classes:
            raise ValueError(f"val_root: expected the same classes as root {full.classes[:5]}..., got {val_base.classes[:5]}...")
    else:
        if not 0.0 < float(val_fraction) < 1.0:
            raise ValueError(f"val_fraction: expected a fraction strictly between 0 and 1, got {val_fraction!r}")
        g = torch.Generator().manual_seed(_mix(seed, 0xF01D))
        perm = torch.randperm(len(full), generator=g).tolist()
        n_val = max(1, int(round(len(full) * float(val_fraction))))
        train_base = torch.utils.data.Subset(full, perm[n_val:])
        val_base = torch.utils.data.Subset(full, perm[:n_val])
        train_base.classes = val_base.classes = full.classes
    train_set = SeededTransformDataset(train_base, train_tf)
    val_set = SeededTransformDataset(val_base, plain)
    train_loader = DataLoader(
        train_set,
        batch_size=batch_size,
        sampler=SeededSampler(len(train_set), shuffle=True, seed=seed, num_replicas=num_replicas, rank=rank,
                              repeats=repeats),
        drop_last=len(train_set) // num_replicas > batch_size,
        num_workers=num_workers,
    )
    val_loader = DataLoader(
        val_set, batch_size=eval_batch_size or batch_size, num_workers=num_workers,
        sampler=ShardSampler(len(val_set), num_replicas=num_replicas, rank=rank),
    )
    return train_loader, val_loader


def timm_transforms(img_size: Union[int, Tuple[int, int]], *, auto_augment: Optional[str] = None,
                    color_jitter: Optional[float] = None, reprob: Optional[float] = 0.0, interpolation: str = "bilinear",
                    mean: Sequence[float] = (0.485, 0.456, 0.406), std: Sequence[float] = (0.229, 0.224, 0.225),
                    ) -> Tuple[Callable, Callable]:
    """(train, eval) transforms from `timm.data.create_transform`: DeiT's training pipeline (RandomResizedCrop,
    horizontal flip, RandAugment `auto_augment` such as 'rand-m9-mstd0.5-inc1', colour jitter — which timm skips
    under RandAugment —, random erasing with probability `reprob`) and the eval resize + centre crop (0.875)."""
    from timm.data import create_transform

    height, width = _check_image_size("img_size", img_size)
    common = dict(input_size=(3, height, width), interpolation=interpolation, mean=tuple(mean), std=tuple(std))
    train = create_transform(is_training=True, auto_augment=auto_augment or None,
                             color_jitter=float(color_jitter or 0.0), re_prob=float(reprob or 0.0), re_mode="pixel",
                             **common)
    plain = create_transform(is_training=False, crop_pct=0.875, **common)
    _posterize_zero_bits(train)
    return train, plain


def _posterize_zero_bits(transform) -> None:
    """timm's PosterizeIncreasing reaches 0 bits at magnitude 10 (RandAugment's magnitude noise gets there), which
    Pillow 12+ refuses ("bits must be between or equal to 1 and 8"); older Pillow kept 0 bits, a black image.  The
    ops of every RandAugment in `transform` get that behaviour back."""
    from timm.data import auto_augment

    def posterize(img, bits_to_keep, **kwargs):
        if bits_to_keep <= 0:
            return img.point(lambda _: 0)
        return auto_augment.posterize(img, bits_to_keep, **kwargs)

    for t in getattr(transform, "transforms", ()):
        for op in getattr(t, "ops", ()):
            if getattr(op, "aug_fn", None) is auto_augment.posterize:
                op.aug_fn = posterize


def write_digits_image_folder(root: Union[str, os.PathLike], *, size: int = 32, val_fraction: float = 0.2,
                              seed: int = 0) -> Tuple[str, str]:
    """Write scikit-learn's digits as an image folder, root/train/<class>/*.png and root/val/<class>/*.png (RGB,
    `size` x `size`, bilinear from 8x8), split exactly as `digits_loaders(val_fraction, seed)` splits them; returns
    (train_dir, val_dir).  Real files for `image_folder_loaders` / `vitfast train --data DIR --val-data DIR`."""
    from PIL import Image
    from sklearn.model_selection import train_test_split

    images, labels = digits_arrays()
    idx_train, idx_val = train_test_split(
        np.arange(len(labels)), test_size=float(val_fraction), random_state=int(seed), stratify=labels
    )
    render = DigitsDataset(images, labels, img_size=size)  # plain render: mean 0, std 1 keeps [0, 1]
    out = []
    for split, idx in (("train", idx_train), ("val", idx_val)):
        base = os.path.join(os.fspath(root), split)
        for i in idx:
            img, label = render[int(i)]
            folder = os.path.join(base, str(int(label)))
            os.makedirs(folder, exist_ok=True)
            pixels = (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            Image.fromarray(pixels).save(os.path.join(folder, f"{int(i):04d}.png"))
        out.append(base)
    return out[0], out[1]
