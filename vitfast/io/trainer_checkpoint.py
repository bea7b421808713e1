"""The Trainer checkpoint: a torch zip of state dicts, tensors and plain values only, read with
`torch.load(..., weights_only=True)` (no arbitrary objects are unpickled) and checked for its format and version."""
from __future__ import annotations

import os
from typing import Any, Dict, Union

import torch

CHECKPOINT_FORMAT = "vitfast-trainer"


CHECKPOINT_VERSION = 1


def load_trainer_checkpoint(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Read and check a Trainer checkpoint (weights_only: no arbitrary objects are unpickled)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint: expected an existing trainer checkpoint file, got {path!r} (not found)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, corrupt, or not a torch file at all
        raise ValueError(f"checkpoint: {path!r} is not a readable vitfast trainer checkpoint ({exc})") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"checkpoint: expected format {CHECKPOINT_FORMAT!r} in {path!r}, got {found!r}")
    if state.get("version") != CHECKPOINT_VERSION:
        raise ValueError(
            f"checkpoint: expected version {CHECKPOINT_VERSION} in {path!r}, got {state.get('version')!r}"
        )
    return state
