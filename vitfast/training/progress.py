"""The Trainer's progress bar: a tqdm bar over optimizer steps, with the recent loss, lr and accuracy.

Kept apart from the loop so that how a run shows itself (terminal or log file, which process draws) is decided in
one place; the bar is drawn by the main process only.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["progress_bar", "show_metrics"]


def progress_bar(total: int, initial: int, desc: str, enabled: bool):
    """A tqdm bar from `initial` to `total` steps (disabled, but still usable, when not `enabled`)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        disable=not enabled,
        dynamic_ncols=True,
        leave=True,
        # a log file is not a terminal: redraw rarely there instead of writing thousands of bar lines
        mininterval=0.1 if getattr(sys.stderr, "isatty", lambda: False)() else 5.0,
    )


def show_metrics(bar, window: Sequence[Tuple[float, int, int]], history: List[Dict[str, Any]],
                 last_eval: Optional[Dict[str, Any]]) -> None:
    """Set the bar's postfix: mean loss and accuracy over `window` ((loss, correct, n) of recent steps), the last
    step's lr, and the last evaluation's accuracy."""
    if bar.disable or not window:
        return
    loss = sum(w[0] for w in window) / len(window)
    acc = sum(w[1] for w in window) / max(1, sum(w[2] for w in window))
    post = {"loss": f"{loss:.3f}", "lr": f"{history[-1]['lr']:.2e}", "acc": f"{acc:.3f}"}
    if last_eval is not None:
        post["val_acc"] = f"{last_eval['acc']:.3f}"
    bar.set_postfix(post, refresh=False)
