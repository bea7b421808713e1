"""Atomic file writes: a reader of `path` sees either the old file or the complete new one, never a partial one."""
from __future__ import annotations

import os
import uuid
from typing import Callable


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Write the file at `path` through `write(tmp)`, which fills the file at the temporary path `tmp`.

    The temporary file is created (empty, exclusively) in `path`'s directory, which must exist, so the rename
    stays on one file system; after `write` it is fsynced, renamed over `path` with `os.replace`, and the
    directory is fsynced so the rename itself survives a crash.  On any error, KeyboardInterrupt included, the
    temporary file is removed and an existing file at `path` is left untouched.
    """
    directory, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex}.tmp")
    # O_EXCL: never clobber someone else's file; mode 0o666 so the umask applies as for any new file.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable (not every platform or file system can open a directory)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
