"""Atomic file writes: a reader of `path` sees either the old file or the complete new one, never a partial one.

A failed write leaves nothing behind: the temporary file is removed and the error names the path the caller asked
for (not the temporary name), with the system's errno.  A writer killed outright (SIGKILL, power loss) cannot clean
up; the next write to the same path removes what it left (`remove_stale_temps`).
"""
from __future__ import annotations

import errno
import os
import re
import stat
import time
import uuid
from typing import Callable, List, Optional

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

    `path` must name a regular file or a new one (see `check_target`; a symlink is written through).  The
    temporary file is created (empty, exclusively) in that file's directory, which must exist, so the rename
    stays on one file system; after `write` it is fsynced, renamed over `path` with `os.replace`, and the
    directory is fsynced so the rename itself survives a crash.  On any error, KeyboardInterrupt included, the
    temporary file is removed and an existing file at `path` is left untouched.

    An error of the file system (full disk, read-only, permission, quota) is raised as an OSError with its errno
    and `filename` = `path` as given, whatever raised it: Python, or a writer that wraps it (safetensors' Rust
    writer says "... (os error 28)" in its own exception type).  The temporary file's name never reaches the
    user: it is gone by then.  Stale temporaries of earlier writes to `path` are removed first.
    """
    shown = os.fspath(path)
    path = check_target(shown)
    directory, base = os.path.split(path)
    remove_stale_temps(path)
    try:
        tmp, lock = _create_temp(directory, base)
    except OSError as exc:  # read-only, no permission, no inodes left: about `path`, whatever name was tried
        named = _naming(exc, shown, exc.filename)
        if named is exc:
            raise
        raise named from exc
    umask_mode = stat.S_IMODE(os.fstat(lock).st_mode)
    try:
        write(tmp)
        # A replaced file keeps its permission bits; a new one gets the umask's.  Set after `write`: writers
        # may recreate the file (safetensors' save_file left every checkpoint 0600 whatever the umask).
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) if os.path.isfile(path) else umask_mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:  # gone already; or it stays, for a write after this process ended to remove
            pass
        os.close(lock)
        named = _naming(exc, shown, tmp) if isinstance(exc, Exception) else None
        if named is not None and named is not exc:
            raise named from exc
        raise
    os.close(lock)  # only after the rename: until then the lock marks the temporary as a live writer's
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
    # `.{base}.{pid}.{uuid}.tmp` (locked while written) or, from writers before the lock, `.{base}.{uuid}.tmp`
    return re.compile(re.escape(f".{base}.") + r"(?:(?P<pid>[0-9]+)\.)?[0-9a-f]{32}\.tmp")


def _create_temp(directory: str, base: str):
    """A new empty temporary file for `base` in `directory`, and a descriptor holding its lock (see
    `remove_stale_temps` for what the lock and the pid in the name are for)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        # O_EXCL: never clobber someone else's file; mode 0o666 so the umask applies as for any new file.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        if fcntl is None:
            return tmp, fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # no locks on this file system: a cleaner cannot lock it either, so it is never removed
            return tmp, fd
        # Between the create and the lock a cleaner may have found the file unlocked and removed it: then this
        # descriptor locks a file no name leads to, and the next try makes another.
        try:
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return tmp, fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(errno.EAGAIN, "could not create a temporary file that stays (another process removes them)", tmp)


def remove_stale_temps(path: str) -> List[str]:
    """Remove the temporaries that killed writers left next to `path` (`.{base}...tmp`); returns their paths.

    A temporary is stale when both hold:
    * its lock can be taken.  A live writer holds an advisory lock (flock) on it from creating the file until the
      rename, and the kernel drops it when the writer dies however it dies (SIGKILL included).  Unlike a pid, a
      lock is not fooled by a reused pid, by pid namespaces (containers sharing a volume) or by another NFS client.
    * the pid in its name is not a live process here.  This covers writers that replace the temporary file by a
      new one while writing (safetensors' save_file renames its own temporary over it): the lock stays with the
      replaced file.  A reused pid only keeps a stale file until that process ends; it never removes a live one.
    Unlocked temporaries of the old naming (no pid: vitfast before the lock) count as stale once untouched for
    UNLOCKED_TEMP_AGE_S.  Anything that cannot be checked (no permission, no locks on this file system) is left.
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
        pid = match.group("pid")
        try:
            if pid is None and time.time() - os.lstat(full).st_mtime < UNLOCKED_TEMP_AGE_S:
                continue
            if pid is not None and _alive(int(pid)):
                continue
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # removed while this process holds the lock, and only the file that was locked (not a newer one
            # of the same name, which a uuid makes impossible anyway)
            if os.path.samestat(os.fstat(fd), os.lstat(full)):
                os.unlink(full)
                removed.append(full)
        except OSError:  # locked: a live writer's; or gone, or not ours to remove
            pass
        finally:
            os.close(fd)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():  # another thread of this process is writing
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process (or no such pid at all: kept, to be safe)
        return True
    return True


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


def _naming(exc: BaseException, shown: str, tmp: Optional[str]) -> BaseException:
    """`exc` as an OSError naming `shown` when it is a file-system error about the temporary file (or about no file:
    a write that failed); any other exception, and an error naming another file, as it is."""
    found = os_error_of(exc)
    if found is None or (found.filename is not None and found.filename != tmp):
        return exc
    return OSError(found.errno, found.strerror, shown)
