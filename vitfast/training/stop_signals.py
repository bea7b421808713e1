"""SIGTERM/SIGINT turned into a call (the Trainer's `request_stop`: finish this step, checkpoint, return)."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator

__all__ = ["on_stop_signals"]


@contextlib.contextmanager
def on_stop_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT call `stop()` instead of their handlers; the previous handlers come
    back on exit.  Off the main thread nothing is installed (Python allows signal handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
