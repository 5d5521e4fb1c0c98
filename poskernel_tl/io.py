"""Atomic file writes: every output appears whole (temp file + rename) or not at all; and
the checked reading of a result table written as CSV."""

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from poskernel_tl.errors import WriteError

TMP_PREFIX = ".tmp-"
FULL_BELOW = 1 << 20  # free bytes under which a failed archive write is a full disk


def atomic_write(path: Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` on a temporary path, then rename it to ``path``.

    The temporary file has the final file's *name*, inside a hidden temporary folder
    beside it (``.tmp-*``), so formats that record their own file name (``torch.save``
    archives) give identical bytes for identical content. A write the file system refuses
    (a full disk, a read-only file system, no permission) is a
    :class:`~poskernel_tl.errors.WriteError` naming the file and the cause; nothing is left
    at ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=path.parent))
    except OSError as err:
        raise WriteError(path, err) from None
    tmp = folder / path.name
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:
        raise WriteError(path, err) from None
    except RuntimeError:  # torch's archive writer reports a full disk this way
        if shutil.disk_usage(path.parent).free < FULL_BELOW:
            raise WriteError(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from None
        raise
    finally:
        if tmp.exists():
            tmp.unlink()
        folder.rmdir()
    return path


def place_file(src: Path, dst: Path) -> Path:
    """Put ``src``'s bytes at ``dst`` atomically: a hard link when both are on one file
    system (no second copy on disk; later writes replace files, never modify them, so the
    two names cannot diverge), a copy otherwise."""
    import shutil

    def write(tmp: Path) -> None:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copy2(src, tmp)

    return atomic_write(dst, write)


def remove_stale_temporaries(folder: Path) -> int:
    """Delete ``.tmp-*`` folders that an interrupted writer left below ``folder``;
    returns how many. Call only while no other writer uses the folder."""
    import shutil

    n = 0
    for tmp in Path(folder).rglob(f"{TMP_PREFIX}*"):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            n += 1
    return n


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


def save_arrays(path: Path, arrays: dict) -> Path:
    """Named arrays into an ``.npz`` file, or a ``.pt`` file: one tensor where the only
    name is None, else a dict of tensors."""
    if path.suffix == ".npz":
        return save_npz(path, **arrays)
    if list(arrays) == [None]:
        return save_torch(torch.from_numpy(np.asarray(arrays[None])), path)
    return save_torch({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}, path)


def save_json(obj: Any, path: Path) -> Path:
    return atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2, default=str)))


def read_csv_checked(path: Path, needed: tuple[str, ...], stale: str = ""
                     ) -> tuple[pd.DataFrame | None, str]:
    """A CSV result table and "", or None and what is wrong with the file (unreadable, or
    the ``needed`` columns it lacks, followed by ``stale``: what a user does about a file
    an older version wrote); never raises for a bad file."""
    try:
        df = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else err  # no path
        return None, f"could not be parsed ({type(err).__name__}: {why})"
    missing = [c for c in needed if c not in df.columns]
    if missing:
        return None, f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}{stale}"
    return df, ""


def csv_flag(column: pd.Series) -> pd.Series:
    """A boolean column read back from CSV as 1.0 / 0.0, NaN where empty or unrecognised
    (True/False, 1/0, yes/no, any case)."""
    text = column.astype(str).str.strip().str.lower()
    return text.map({"true": 1.0, "1": 1.0, "1.0": 1.0, "yes": 1.0,
                     "false": 0.0, "0": 0.0, "0.0": 0.0, "no": 0.0})


def sentence(text: str) -> str:
    """``text`` with its first letter upper-cased and a final full stop."""
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".") if text else ""
