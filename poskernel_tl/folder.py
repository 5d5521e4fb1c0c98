"""An output folder's care: one writer at a time (:class:`FolderLock`), the content hash
that proves a file untouched (:func:`sha256`), and room for what a run will write
(:func:`check_space`). Standard library only: the command line takes the lock and checks
the folder before it imports torch."""

import errno
import fcntl
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

from poskernel_tl.errors import FolderBusyError, WriteError

LOCK = ".poskernel.lock"


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


_DIGESTS: dict[tuple[str, int, int], str] = {}


RACY_S = 2.0  # a file modified this recently may change again within one timestamp tick


def file_digest(path: Path) -> str:
    """:func:`sha256` of ``path``, computed once per process for a file unchanged since
    (same size and modification time: a report reads each condition several times, the
    grid's manifest hashes what the result just recorded). A file modified less than
    :data:`RACY_S` ago is hashed every time: a file system's timestamps are coarser than
    the writes a process can make."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = sha256(path)
    if time.time() - st.st_mtime > RACY_S:
        _DIGESTS[key] = digest
    return digest


class FolderLock:
    """An exclusive, non-blocking lock on an output folder (released on exit, and by the
    operating system if the process dies: a lock left by a killed process is simply taken
    over). Taking it creates the folder and writes the lock file: a folder that cannot be
    written is refused here, before any model is loaded (a
    :class:`~poskernel_tl.errors.WriteError`); a folder another process holds is refused
    naming its PID and command (a :class:`~poskernel_tl.errors.FolderBusyError`)."""

    def __init__(self, folder: Path | str):
        self.path = Path(folder) / LOCK
        self.fh = None

    def __enter__(self) -> "FolderLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.path, "a+")  # (not "w": that would erase the holder's line)
        except OSError as err:
            raise WriteError(self.path.parent, err) from None
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "unknown"
            self.fh.close()
            raise FolderBusyError(
                f"another poskernel process is writing to {self.path.parent} (PID "
                f"{holder.replace(chr(10), ': ', 1)}); wait for it or use another --out"
            ) from None
        try:
            self.fh.seek(0)
            self.fh.truncate()
            self.fh.write(f"{os.getpid()}\n{' '.join(['poskernel', *sys.argv[1:]])}\n")
            self.fh.flush()
        except OSError as err:
            self.__exit__()
            raise WriteError(self.path, err) from None
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def check_space(folder: Path | str, needed: int, what: str) -> None:
    """Refuse (a :class:`~poskernel_tl.errors.WriteError` for ENOSPC naming the estimate
    and the shortfall) when the file system of ``folder`` has less than ``needed`` bytes
    free for ``what``."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise WriteError(folder, err, detail=f"{what} needs ≈ {_mib(needed)}, "
                                             f"{_mib(free)} are free ({_mib(needed - free)} short)")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


__all__ = ["LOCK", "FolderLock", "check_space", "file_digest", "sha256"]
