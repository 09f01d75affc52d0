"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from training.config import RunError


class DiskFullError(RunError):
    """A write failed for want of space; the message says which file and what is intact."""

    kind = "Disk full"


@contextlib.contextmanager
def reporting_disk_full(path: str | os.PathLike, intact: str) -> Iterator[None]:
    """Turn running out of space while writing `path` into a DiskFullError that names the
    file and says what is still intact (`intact`, a clause), instead of a traceback."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskFullError(
            f"no space left on the device of {path} while writing it; {intact}"
        ) from None


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file next to `path`; on success fsync it and rename it over `path`.

    If the body raises (or the process dies), `path` keeps its previous content and the
    temporary file is removed (after a kill, by the next write of `path`).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files; mode must be 'w' or 'wb', not {mode!r}")
    path = Path(path)
    remove_orphans(path.parent, path.name)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def remove_orphans(directory: Path, names: str) -> None:
    """Delete the temporary files `.NAME.<pid>.tmp` of the files matching `names` (a glob) in
    `directory` that were left by processes killed while writing them."""
    if os.name != "posix":  # the liveness check below is POSIX's
        return
    for tmp in directory.glob(f".{names}.*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not _process_exists(int(pid)):
            tmp.unlink(missing_ok=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # another user's process: leave its file alone
    return True


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename inside `directory` durable (a no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
