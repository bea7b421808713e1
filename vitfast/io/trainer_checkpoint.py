"""The Trainer checkpoint: a torch zip of state dicts, tensors and plain values only, written atomically and read
with `torch.load(..., weights_only=True)` (no arbitrary objects are unpickled) and checked for its format and
version."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Union

import torch

from .atomic import atomic_write

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


def save_trainer_checkpoint(state: Dict[str, Any], path: Union[str, os.PathLike]) -> str:
    """Write `state` (from `Trainer.state_dict`) to `path` atomically; a full disk or a read-only directory raises
    an OSError naming `path`, and the previous file stays as it was."""
    path = os.fspath(path)
    atomic_write(path, lambda tmp: _torch_save(state, tmp))
    return path


class _Sink:
    """The file torch.save writes to, keeping the OSError of a failed write.  torch's zip writer turns it into
    "[enforce fail at inline_container.cc:...] unexpected pos N vs M" (a RuntimeError naming neither the file nor
    the reason), whether it writes to a path or to a Python file."""

    def __init__(self, f):
        self.f = f
        self.error: Optional[OSError] = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def _torch_save(obj: Any, path: str) -> None:
    with open(path, "wb") as f:
        sink = _Sink(f)
        try:
            torch.save(obj, sink)
        except RuntimeError as exc:
            if sink.error is not None:
                raise sink.error from exc
            raise
