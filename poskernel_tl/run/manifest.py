"""The grid's record of what is complete: ``manifest.json`` in the output folder.

Per condition it keeps a key — a hash of everything that determines the results (the
run configuration, the model spec, the weights' identity, the sequence file's checksum
and the package version) — and the checksum of every output. A condition is complete
when its entry exists, its key matches the key a rerun would compute, and every output
is present with that checksum; anything else is redone. Entries are written (atomically)
only after all of a condition's outputs, so a kill at any moment leaves either a
complete entry or none. A lock (:class:`~poskernel_tl.folder.FolderLock`) keeps two
processes from writing one folder.
"""

import hashlib
import json
from pathlib import Path

from poskernel_tl.errors import UserError
from poskernel_tl.folder import file_digest
from poskernel_tl.io import save_json

MANIFEST = "manifest.json"


def key_of(parts: dict) -> str:
    """A stable hash of a JSON-serialisable description."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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
            if not p.exists() or file_digest(p) != digest:
                return "damaged"
        return "complete"

    def record(self, name: str, key: str, outputs: list[Path], info: dict) -> None:
        self.entries[name] = {
            "key": key, **info,
            "outputs": {str(Path(p).relative_to(self.folder)): file_digest(p)
                        for p in sorted(outputs)}}
        self.save()

    def forget(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self.save()

    def save(self) -> None:
        save_json({"conditions": dict(sorted(self.entries.items()))}, self.path)
