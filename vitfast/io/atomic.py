"""Atomic file writes: a reader of `path` sees either the old file or the complete new one, never a partial one."""
from __future__ import annotations

import os
import stat
import uuid
from typing import Callable


def check_target(path: str) -> str:
    """The file `atomic_write(path, ...)` would replace, with symlinks resolved; raises when that is not a file.

    A symlink is written through (its target gets the new file; the link stays).  A directory, a FIFO, a
    device or a socket is refused: the rename would replace it by a regular file (as root, `/dev/null` itself).
    """
    if path == "":
        raise ValueError("path: expected a file name, got ''")
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise IsADirectoryError(f"path: expected a file name, got the directory {path!r}")
    if os.path.lexists(target) and not os.path.isfile(target):
        raise ValueError(
            f"path: expected a regular file or a new file name, got a special file (FIFO, device or socket) "
            f"{path!r}: the write renames a new file over the path, which would replace it"
        )
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"path: directory {directory!r} does not exist")
    return target


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Write the file at `path` through `write(tmp)`, which fills the file at the temporary path `tmp`.

    `path` must name a regular file or a new one (see `check_target`; a symlink is written through).  The
    temporary file is created (empty, exclusively) in that file's directory, which must exist, so the rename
    stays on one file system; after `write` it is fsynced, renamed over `path` with `os.replace`, and the
    directory is fsynced so the rename itself survives a crash.  On any error, KeyboardInterrupt included, the
    temporary file is removed and an existing file at `path` is left untouched.
    """
    path = check_target(path)
    directory, base = os.path.split(path)
    tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex}.tmp")
    # O_EXCL: never clobber someone else's file; mode 0o666 so the umask applies as for any new file.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    umask_mode = stat.S_IMODE(os.stat(tmp).st_mode)
    try:
        write(tmp)
        # A replaced file keeps its permission bits; a new one gets the umask's.  Set after `write`: writers
        # may recreate the file (safetensors' save_file left every checkpoint 0600 whatever the umask).
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) if os.path.isfile(path) else umask_mode)
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
