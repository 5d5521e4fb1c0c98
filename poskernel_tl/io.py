"""Atomic file writes: every output appears whole (temp file + rename) or not at all."""

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch


def atomic_write(path: Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` on a temporary path beside ``path``, then rename it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; outputs are shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def save_csv(df: pd.DataFrame, path: Path) -> Path:
    return atomic_write(path, lambda p: df.to_csv(p, index=False))


def save_torch(obj: Any, path: Path) -> Path:
    return atomic_write(path, lambda p: torch.save(obj, p))


def save_npz(path: Path, **arrays: np.ndarray) -> Path:
    def write(p: Path) -> None:
        with open(p, "wb") as fh:
            np.savez(fh, **arrays)
    return atomic_write(path, write)


def save_json(obj: Any, path: Path) -> Path:
    return atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2, default=str)))
