"""Seeding and RNG state: what makes a resumed run continue bit-exactly.

The Trainer stores every generator it draws from (Python's `random`, NumPy's global RNG, torch CPU and CUDA) in its
checkpoint as plain values and tensors, so `torch.load(..., weights_only=True)` can read them back.
"""
from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch


# ---------------------------------------------------------------------------------------------- helpers
def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global RNG and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _rng_state(device: torch.device) -> Dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),  # (version, tuple of ints, gauss) — plain values
        # NumPy's key is an ndarray, which weights_only loading rejects: store it as an int64 tensor.
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npk = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": npk["key"].numpy().astype(np.uint32), "pos": npk["pos"]},
            "has_gauss": npk["has_gauss"],
            "gauss": npk["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
