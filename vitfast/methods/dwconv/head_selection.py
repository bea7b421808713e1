"""Which attention heads to replace by depthwise convolutions (dropin-depthwise-conv-attention, section 2.3).

Σ criterion (section 2.3.1, eq. 15-16), the paper's default:

    σ_(E^h)  = pointwise standard deviation of the attention map E(X)^h ∈ R^(N×N) over N_s input samples
    Σ_h      = Σ_(entries) σ_(E^h)                   (eq. 15; Σ_h = 0 ⟺ the map does not depend on the input)
    Σ_b      = (1 / n_h) Σ_(h in block b) Σ_h        (eq. 16)

Lowest scores first: blockwise selection takes the p_b blocks with the smallest Σ_b, scattered selection the
p_h heads with the smallest Σ_h.  `attention_std_scores` computes every head's Σ_h in ONE pass over the samples
with Welford's online algorithm (the model runs on batches, the statistics are updated image by image), so
the [N_s, n_h, N, N] maps are never stored; the state is one mean and one M2 per head entry (fp64).  σ is the
population standard deviation over the N_s samples (ddof = 0).

Class token.  The paper's models have none (appendix A.3.2: it is removed before the heads are replaced), so its
E(X)^h is over the patch tokens only.  For a model that keeps a class token (and registers), `cls="include"` (the
default) sums σ over the full N×N map, prefix rows and columns included; `cls="exclude"` sums it over the patch
tokens' (N−P)×(N−P) block only, the paper's statistic (each row still normalised over all N keys, as the
model computes it).  The prefix rows are maps a replaced head cannot reproduce anyway (a convolution head gives a
prefix token the mean of the patch values), so "include" ranks the heads by the whole map they compute and
"exclude" by the part a convolution stands in for.

DSP alternative (section 2.3.2, eq. 17-18): `DSPGate` holds trainable logits (one per block, or one per head for
scattered selection) and draws the Gumbel top-k relaxation (Kool et al. 2019) of `topk(w, p)` during training,
with a temperature annealed geometrically from `tau_start` to 1e-3 over the run through the Trainer's
`set_step`; `attach_dsp` puts a `DSPGatedAttention` (eq. 18: (1 − w̃_b) MhSA + w̃_b M̃hSA) in every block.  At
evaluation the gate is the hard top-k of the logits; `DSPGate.selection()` is what `vitfast.convert.from_timm`
takes to replace the chosen blocks/heads for good (DSP-2S).
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from ...io.head_ranking import HeadRanking

__all__ = [
    "HeadRanking",
    "attention_std_scores",
    "attention_maps",
    "DSPGate",
    "DSPGatedAttention",
    "attach_dsp",
    "finalize_dsp",
    "gumbel_topk_relaxed",
]


def _attention_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    from timm.models.vision_transformer import Attention as TimmAttention

    found = [(name, m) for name, m in model.named_modules() if type(m) is TimmAttention]
    if not found:
        raise ValueError(f"model: expected timm ViT Attention modules to score, found none in {type(model).__name__}")
    return found


def attention_maps(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """E(X)^h = softmax(Q^h K^hᵀ / √d_h) of a timm `Attention` for its input x [B, N, C] -> [B, H, N, N] (fp32)."""
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    return torch.softmax((q.float() @ k.float().transpose(-1, -2)) * attn.scale, dim=-1)


class _Welford:
    """Welford's running mean / M2 of a [H, N, N] map over samples, in fp64, one sample at a time.

    Per sample: δ = E − mean;  mean += δ / n;  M2 += δ ⊙ (E − mean).  The state is the only memory (no batch
    of fp64 maps), and a map that is the same for every input gives δ = 0 exactly, so its Σ_h is exactly 0.
    """

    def __init__(self) -> None:
        self.count = 0
        self.mean: Optional[torch.Tensor] = None
        self.m2: Optional[torch.Tensor] = None

    def update(self, batch: torch.Tensor) -> None:
        for sample in batch:
            sample = sample.double()
            if self.mean is None:
                self.count, self.mean, self.m2 = 1, sample.clone(), torch.zeros_like(sample)
                continue
            if self.mean.shape != sample.shape:
                raise ValueError(f"inputs: expected attention maps of shape {list(self.mean.shape)} for every "
                                 f"image (same resolution), got {list(sample.shape)}")
            self.count += 1
            delta = sample - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (sample - self.mean)

    def head_scores(self) -> List[float]:
        """Σ_h = Σ over entries of the population standard deviation (eq. 15)."""
        std = (self.m2.clamp_min(0.0) / self.count).sqrt()
        return [float(s) for s in std.flatten(1).sum(1)]


def _batches(inputs) -> Iterable[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        yield inputs
        return
    for item in inputs:
        yield item[0] if isinstance(item, (tuple, list)) else item


def attention_std_scores(
    model: nn.Module,
    inputs: Union[torch.Tensor, Iterable],
    *,
    num_samples: Optional[int] = None,
    batch_size: int = 16,
    progress: bool = True,
    cls: str = "include",
) -> HeadRanking:
    """Σ_h of every timm `Attention` head of `model` over N_s input images, in one pass (Welford).

    inputs: an image tensor [N_s, 3, H, W], or an iterable of batches (a DataLoader: (images, labels) tuples or
    image tensors).  num_samples: stop after this many images (the paper uses N_s = 1000).  The model runs in eval
    mode under no_grad (its mode is restored); a tqdm bar counts the images.
    cls: "include" — Σ_h over the full N×N map; "exclude" — over the patch tokens' block only, the prefix tokens'
    (class token, registers: the model's `num_prefix_tokens`) rows and columns left out, as in the paper's models
    that have no class token (module doc).  The same for a model without prefix tokens.
    """
    from tqdm.auto import tqdm

    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
        raise ValueError(f"num_samples: expected an int >= 1 or None, got {num_samples!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    if cls not in ("include", "exclude"):
        raise ValueError(f"cls: expected 'include' or 'exclude', got {cls!r}")
    prefix = int(getattr(model, "num_prefix_tokens", 0) or 0) if cls == "exclude" else 0
    modules = _attention_modules(model)
    states = {name: _Welford() for name, _ in modules}
    total = num_samples
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() != 4:
            raise ValueError(f"inputs: expected images [N_s, C, H, W], got shape {list(inputs.shape)}")
        total = inputs.shape[0] if num_samples is None else min(num_samples, inputs.shape[0])
        inputs = [inputs[i:i + batch_size] for i in range(0, total, batch_size)]
    elif total is None and hasattr(inputs, "dataset"):
        total = len(inputs.dataset)

    def hook(name):
        def record(module, args, output):
            states[name].update(attention_maps(module, args[0])[..., prefix:, prefix:])
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in modules]
    was_training = model.training
    model.eval()
    seen = 0
    device = next(model.parameters()).device
    try:
        with torch.no_grad(), tqdm(total=total, desc="Σ_h (attention std)", unit="img", disable=not progress) as bar:
            for images in _batches(inputs):
                if num_samples is not None:
                    images = images[: num_samples - seen]
                if images.shape[0] == 0:
                    break
                model(images.to(device))
                seen += images.shape[0]
                bar.update(images.shape[0])
                if num_samples is not None and seen >= num_samples:
                    break
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if seen == 0:
        raise ValueError("inputs: expected at least one image, got none")
    return HeadRanking([states[name].head_scores() for name, _ in modules], seen, [name for name, _ in modules])


