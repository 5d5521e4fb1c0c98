"""The grid's record of what is complete: ``manifest.json`` in the output folder.

Per condition it keeps a key — a hash of everything that determines the results (the
run configuration, the model spec, the weights' identity, the sequence file's checksum
and the package version) — and the checksum of every output. A condition is complete
when its entry exists, its key matches the key a rerun would compute, and every output
is present with that checksum; anything else is redone. Entries are written (atomically)
only after all of a condition's outputs, so a kill at any moment leaves either a
complete entry or none. A lock file keeps two processes from writing one folder.
"""

import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path

from poskernel_tl.errors import FolderBusyError, UserError, WriteError
from poskernel_tl.io import save_json

MANIFEST = "manifest.json"
LOCK = ".poskernel.lock"


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def key_of(parts: dict) -> str:
    """A stable hash of a JSON-serialisable description."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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


class Manifest:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / MANIFEST
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text())["conditions"]
            except (ValueError, KeyError) as err:
                raise UserError(f"{self.path}: unreadable manifest ({err}); move it away "
                                 "to start the folder afresh") from err

    def status(self, name: str, key: str) -> str:
        """``complete``, ``different`` (recorded with another key), ``damaged`` (an
        output missing or changed) or ``missing``."""
        entry = self.entries.get(name)
        if entry is None:
            return "missing"
        if entry["key"] != key:
            return "different"
        for rel, digest in entry["outputs"].items():
            p = self.folder / rel
            if not p.exists() or sha256(p) != digest:
                return "damaged"
        return "complete"

    def record(self, name: str, key: str, outputs: list[Path], info: dict) -> None:
        self.entries[name] = {
            "key": key, **info,
            "outputs": {str(Path(p).relative_to(self.folder)): sha256(p)
                        for p in sorted(outputs)}}
        self.save()

    def forget(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self.save()

    def save(self) -> None:
        save_json({"conditions": dict(sorted(self.entries.items()))}, self.path)
