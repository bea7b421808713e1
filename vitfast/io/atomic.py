"""Atomic file writes: a reader of `path` sees either the old file or the complete new one, never a partial one.

A failed write leaves nothing behind: the temporary file is removed and the error names the path the caller asked
for (not the temporary name), with the system's errno.  A writer killed outright (SIGKILL, power loss) cannot clean
up; the next write to the same path removes what it left (`remove_stale_temps`).
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import time
import uuid
from typing import Callable, List, NoReturn, Optional, Tuple

try:
    import fcntl
except ImportError:  # not on Windows: no stale-temp cleanup there (an open file cannot be removed anyway)
    fcntl = None

# Temporaries of writers that take no lock (vitfast before the lock existed: `.{base}.{uuid}.tmp`, no pid) are
# removed only when untouched this long: such a writer cannot be told from a dead one otherwise, and none of them
# is silent for an hour while it writes.
UNLOCKED_TEMP_AGE_S = 3600.0


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

    `path` must name a regular file or a new one (see `check_target`; a symlink is written through).  `tmp` has
    the same base name as `path`, in a private directory `.{base}.{pid}.{uuid}.tmp` created next to it, so the
    rename stays on one file system, and whatever else the writer puts next to `tmp` (safetensors' save_file
    writes its own `.tmpXXXXXX` and renames it over `tmp`) is inside it too.  After `write` the file is fsynced,
    renamed over `path` with `os.replace`, and the directory is fsynced so the rename itself survives a crash.  On
    any error, KeyboardInterrupt included, the private directory is removed and an existing file at `path` is
    left untouched.

    An error of the file system (full disk, read-only, permission, quota) is raised as an OSError with its errno
    and `filename` = `path` as given, whatever raised it: Python, or a writer that wraps it (safetensors' Rust
    writer says "... (os error 28)" in its own exception type).  The temporary names never reach the user: they
    are gone by then.  Stale temporaries of earlier writes to `path` are removed first (`remove_stale_temps`).
    """
    shown = os.fspath(path)
    path = check_target(shown)
    directory, base = os.path.split(path)
    remove_stale_temps(path)
    try:
        private, lock = _create_private_dir(directory, base)
    except OSError as exc:  # read-only, no permission, no inodes left: about `path`, whatever name was tried
        _raise_naming(exc, shown, exc.filename)
    tmp = os.path.join(private, base)
    try:
        # O_EXCL: the name is the writer's alone; mode 0o666 so the umask applies as for any new file.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        umask_mode = stat.S_IMODE(os.stat(tmp).st_mode)
        write(tmp)
        # A replaced file keeps its permission bits; a new one gets the umask's.  Set after `write`: writers
        # may recreate the file (safetensors' save_file left every checkpoint 0600 whatever the umask).
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) if os.path.isfile(path) else umask_mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _remove(private)  # if that fails too, it stays for a write after this process ended to remove
        _close(lock)
        if isinstance(exc, Exception):
            _raise_naming(exc, shown, private)
        raise
    _remove(private)
    _close(lock)  # only now: until the private directory is gone, the lock marks it as a live writer's
    try:  # make the rename itself durable (not every platform or file system can open a directory)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def atomic_write_text(path: str, text: str) -> None:
    """`text` (UTF-8) to `path` through `atomic_write`: JSON reports and other side outputs."""
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


# ---------------------------------------------------------------------------------------------- temporaries
def _temp_pattern(base: str) -> re.Pattern[str]:
    # `.{base}.{pid}.{uuid}.tmp` (a private directory, locked while written) or, from vitfast before the lock,
    # `.{base}.{uuid}.tmp` (a file)
    return re.compile(re.escape(f".{base}.") + r"(?:(?P<pid>[0-9]+)\.)?[0-9a-f]{32}\.tmp")


def _create_private_dir(directory: str, base: str) -> Tuple[str, Optional[int]]:
    """A new private directory for a write of `base` in `directory`, and a descriptor holding its lock (None where
    the file system has no locks: such a directory is never removed by `remove_stale_temps`)."""
    for _ in range(100):
        private = os.path.join(directory, f".{base}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        os.mkdir(private, 0o700)  # fails if it exists: never someone else's
        if fcntl is None:
            return private, None
        fd = os.open(private, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # no locks here (NFS cannot lock a directory): a cleaner cannot take it either
            return private, fd
        # Between the mkdir and the lock a cleaner may have found the directory unlocked and removed it: then this
        # descriptor locks a directory no name leads to, and the next try makes another.
        try:
            if os.path.samestat(os.fstat(fd), os.stat(private)):
                return private, fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(errno.EAGAIN, "could not create a temporary directory that stays (something removes them)", private)


def remove_stale_temps(path: str) -> List[str]:
    """Remove the temporaries that killed writers left next to `path` (`.{base}.{pid}.{uuid}.tmp`); returns them.

    A temporary is stale when its lock can be taken.  A live writer holds an advisory lock (flock) on its private
    directory from creating it until it is removed, and the kernel drops the lock when the writer dies however it
    dies (SIGKILL included).  A pid check would be fooled: by a reused pid (a stale directory kept), and by pid
    namespaces (containers sharing a volume) or other NFS clients (a live writer's directory removed); the pid in
    the name is for a person reading the directory.  Temporary files of vitfast before the lock (no pid in the
    name) count as stale once untouched for UNLOCKED_TEMP_AGE_S.  Anything that cannot be checked (no permission,
    no locks on this file system) is left.
    """
    if fcntl is None:
        return []
    directory, base = os.path.split(os.path.realpath(path))
    pattern = _temp_pattern(base)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        full = os.path.join(directory, name)
        try:
            if match.group("pid") is None and time.time() - os.lstat(full).st_mtime < UNLOCKED_TEMP_AGE_S:
                continue
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # removed while this process holds the lock, and only what was locked (not a newer entry of the same
            # name, which a uuid makes impossible anyway)
            if os.path.samestat(os.fstat(fd), os.lstat(full)):
                _remove(full, strict=True)
                removed.append(full)
        except OSError:  # locked: a live writer's; or gone, or not ours to remove
            pass
        finally:
            os.close(fd)
    return removed


def _remove(path: str, strict: bool = False) -> None:
    """Remove a file or a directory tree (symlinks inside are removed, never followed)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        if strict:
            raise


def _close(fd: Optional[int]) -> None:
    if fd is not None:
        os.close(fd)


# ---------------------------------------------------------------------------------------------- errors
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(exc: BaseException) -> Optional[OSError]:
    """The file-system error behind `exc`, with its errno: `exc` itself, or the errno a writer's own exception
    type carries in its message (Rust's io::Error, as safetensors raises it, ends in "(os error N)")."""
    if isinstance(exc, OSError):
        return exc if exc.errno is not None else None
    match = _RUST_OS_ERROR.search(str(exc))
    if match is not None:
        code = int(match.group(1))
        return OSError(code, os.strerror(code))
    return None


def _raise_naming(exc: BaseException, shown: str, ours: Optional[str]) -> NoReturn:
    """Raise `exc` as an OSError naming `shown` when it is a file-system error about `ours` (the private directory
    or a file in it) or about no file (a write that failed); any other exception, and an error about another file
    (one the writer read), as it is."""
    found = os_error_of(exc)
    if found is not None and (found.filename is None or _inside(found.filename, ours)):
        raise OSError(found.errno, found.strerror, shown) from exc
    raise exc


def _inside(name, ours: Optional[str]) -> bool:
    if ours is None:
        return False
    try:
        name, ours = os.path.abspath(os.fsdecode(name)), os.path.abspath(os.fsdecode(ours))
        return os.path.commonpath([name, ours]) == ours
    except (TypeError, ValueError):
        return False
