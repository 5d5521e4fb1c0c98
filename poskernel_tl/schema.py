"""Result parts: dataclasses whose fields say where they are saved.

A :class:`ConditionResult <poskernel_tl.measurement.result.ConditionResult>` is composed of parts
(Track A, Track B, the centering means, frequency usage, the permutation null, saved
logits, …), each the result dataclass of the reducer that computes it. A part's field
declares, in its metadata, where it is stored — an array in a file (:func:`stored`) or a
column of a tidy table (:func:`column`) — and its jaxtyping annotation gives its axes.
From that alone this module writes, reads and shape-checks every part, so adding a
statistic to a reducer's result (one annotated field) is all it takes to save it, load
it and see it in the tables.

Tables: ``trackA`` has one row per (evaluation sequence, layer, head), ``trackB`` one per
(layer, head), ``bands`` one per (offset band, layer, head); a field with fewer axes is
repeated along the others.
"""

import dataclasses
import struct
import typing
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from poskernel_tl.errors import ResultFileError

TABLE_ROWS = {"trackA": ("n_seqs", "layer", "head_index"), "trackB": ("layer", "head_index"),
              "bands": ("band", "layer", "head_index")}


def stored(file: str, key: str | None = None, *, finite: bool = False,
           default: Any = dataclasses.MISSING) -> Any:
    """A field saved as array ``key`` of ``file`` (``.npz``, or ``.pt``: a dict of tensors,
    or one tensor when ``key`` is None)."""
    return dataclasses.field(default=default, metadata={
        "file": file, "key": key, "finite": finite})


def column(table: str, name: str, *, finite: bool = False, head: str | None = None,
           default: Any = dataclasses.MISSING) -> Any:
    """A field saved as column ``name`` of the tidy table ``table`` (trackA or trackB);
    ``head``: a [layer head_index] field is also a per-head column of that name in
    ``heads.csv`` (and so in the report's head tables, the head map and the atlas), with
    this label."""
    return dataclasses.field(default=default, metadata={
        "table": table, "column": name, "finite": finite, **({"head": head} if head else {})})


def axes(tp) -> tuple[str, ...] | None:
    """The axis names of a jaxtyping annotation (``Float[np.ndarray, "layer head_index"]``,
    optionally ``| None``); None for anything else."""
    for t in (tp, *typing.get_args(tp)):
        dims = getattr(t, "dim_str", None)
        if dims is not None:
            return tuple(dims.split())
    return None


def check_shapes(obj, dims: dict[str, int], where: str = "",
                 error: type[Exception] = ResultFileError) -> dict[str, int]:
    """Every annotated array field of dataclass ``obj`` against ``dims`` (axis name →
    size); axes not in ``dims`` are bound by their first use. Raises ``error`` naming
    the field; returns the (extended) dims."""
    return check_values(type(obj), {f.name: getattr(obj, f.name)
                                    for f in dataclasses.fields(obj)}, dims, where,
                        error=error)


def check_values(cls, values: dict[str, Any], dims: dict[str, int], where: str = "",
                 label: Callable[[dataclasses.Field], str] = lambda f: f.name,
                 error: type[Exception] = ResultFileError) -> dict[str, int]:
    """:func:`check_shapes` for the field values of dataclass ``cls`` before building it
    (``label``: how a field is named in the message)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        names, value = axes(hints.get(f.name)), values.get(f.name)
        if names is None or value is None or not hasattr(value, "shape"):
            continue
        expected = tuple(dims.get(a, "?") for a in names)
        if len(value.shape) != len(names) or any(
                dims.setdefault(a, n) != n for a, n in zip(names, value.shape)):
            raise error(f"{where}{label(f)} has shape {tuple(value.shape)}, "
                        f"expected {expected} ({' '.join(names)})")
    return dims


def mapped_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file as read-only memory maps where a member is stored
    uncompressed (``np.savez``: its ``.npy`` bytes lie in the file as they are), else read
    whole."""
    out = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as fh:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                out[name] = np.lib.format.read_array(z.open(info))
                continue
            fh.seek(info.header_offset + 26)  # the local header's name and extra lengths
            n, m = struct.unpack("<HH", fh.read(4))
            fh.seek(info.header_offset + 30 + n + m)
            version = np.lib.format.read_magic(fh)
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}[version]
            shape, fortran, dtype = read(fh)
            if dtype.hasobject or 0 in shape:
                out[name] = np.lib.format.read_array(z.open(info))
            else:
                out[name] = np.memmap(path, dtype, "r", fh.tell(), shape,
                                      "F" if fortran else "C")
    return out


class SavedFiles:
    """Reads a saved condition's files once each; every problem names the file. ``lazy``:
    ``.pt`` files and the members of ``.npz`` files are memory-mapped (their pages read
    when touched)."""

    def __init__(self, path_of: Callable[[str], Path], lazy: bool = False):
        self.path_of, self.cache, self.lazy = path_of, {}, lazy

    def exists(self, file: str) -> bool:
        return self.path_of(file).exists()

    def _read(self, file: str):
        path = self.path_of(file)
        if not path.exists():
            raise ResultFileError(f"{path}: missing")
        try:
            if file.endswith(".npz") and self.lazy:
                return mapped_npz(path)
            if file.endswith(".npz"):
                with np.load(path, allow_pickle=False) as z:
                    return {k: z[k] for k in z.files}
            if file.endswith(".csv"):
                return pd.read_csv(path, float_precision="round_trip")
            return torch.load(path, weights_only=True, map_location="cpu", mmap=self.lazy)
        except Exception as err:  # numpy, pandas and torch raise many types for bad files
            raise ResultFileError(f"{path}: unreadable ({type(err).__name__}: {err})") from err

    def get(self, file: str):
        if file not in self.cache:
            self.cache[file] = self._read(file)
        return self.cache[file]

    def array(self, file: str, key: str | None) -> np.ndarray:
        content = self.get(file)
        if key is None:
            return content.numpy() if torch.is_tensor(content) else np.asarray(content)
        if key not in content:
            raise ResultFileError(f"{self.path_of(file)}: lacks {key}")
        value = content[key]
        return value.numpy() if torch.is_tensor(value) else value

    def table_column(self, table: str, name: str, dims: dict[str, int],
                     names: tuple[str, ...]) -> Any:
        """Column ``name`` of ``table`` laid out along ``names`` (rows in the written
        order, checked: one row per combination of the table's row axes)."""
        path, df = self.path_of(f"{table}.csv"), self.get(f"{table}.csv")
        rows = TABLE_ROWS[table]
        shape = tuple(dims[a] for a in rows)
        if name not in df.columns:
            raise ResultFileError(f"{path}: lacks columns ['{name}']")
        if len(df) != int(np.prod(shape)):
            raise ResultFileError(f"{path}: has {len(df)} rows, expected {np.prod(shape)}")
        values = df[name].to_numpy().reshape(shape)
        index = tuple(slice(None) if a in names else 0 for a in rows)
        # a copy: a view would keep the table's whole block of columns alive
        return values[index].copy() if names else values[index].item()


class Part:
    """Mixin of a result part (a dataclass). ``NAME``: its attribute on the result;
    ``PANELS``: what a head view draws of it (:class:`~poskernel_tl.panels.Panel`)."""

    NAME: ClassVar[str]
    PANELS: ClassVar[tuple] = ()

    @classmethod
    def stored_fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if "file" in f.metadata]

    @classmethod
    def head_fields(cls) -> dict[str, tuple[str, str]]:
        """Field -> (its ``heads.csv`` column, label) of the fields declared per-head
        columns (:func:`column`'s ``head``)."""
        return {f.name: (f.metadata["column"], f.metadata["head"])
                for f in dataclasses.fields(cls) if "head" in f.metadata}

    @classmethod
    def column_fields(cls, table: str) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.metadata.get("table") == table]

    def arrays(self) -> dict[str, dict[str | None, np.ndarray]]:
        """{file: {key: array}} of the stored fields that hold a value."""
        out: dict[str, dict] = {}
        for f in self.stored_fields():
            value = getattr(self, f.name)
            if value is not None:
                out.setdefault(f.metadata["file"], {})[f.metadata["key"]] = value
        return out

    def columns(self, table: str, dims: dict[str, int]) -> dict[str, np.ndarray]:
        """{column: values, one per row of ``table``} of the fields saved in it."""
        hints = typing.get_type_hints(type(self))
        rows = TABLE_ROWS[table]
        shape = tuple(dims[a] for a in rows)
        out = {}
        for f in self.column_fields(table):
            value = getattr(self, f.name)
            if value is None:
                continue
            names = axes(hints[f.name]) or ()
            index = tuple(slice(None) if a in names else None for a in rows)
            arr = np.asarray(value)[index] if names else np.asarray(value)
            out[f.metadata["column"]] = np.broadcast_to(arr, shape).ravel()
        return out

    @classmethod
    def present(cls, saved: SavedFiles) -> bool:
        """Whether the condition has this part (its files exist; table parts: always)."""
        files = {f.metadata["file"] for f in cls.stored_fields()}
        if files:
            return any(saved.exists(file) for file in files)
        tables = {f.metadata["table"]: f.metadata["column"] for f in dataclasses.fields(cls)
                  if "table" in f.metadata and f.default is dataclasses.MISSING}
        return all(col in saved.get(f"{t}.csv").columns for t, col in tables.items())

    @classmethod
    def load(cls, saved: SavedFiles, dims: dict[str, int], **given):
        """The part from a saved condition; None if it was not saved. ``given``: values
        of fields that are not stored (counts, flags from ``cfg.json``)."""
        if not cls.present(saved):
            return None
        hints = typing.get_type_hints(cls)
        values = dict(given)
        for f in dataclasses.fields(cls):
            meta, default_missing = f.metadata, f.default is dataclasses.MISSING
            if "file" in meta:
                if not saved.exists(meta["file"]) and not default_missing:
                    continue
                if meta["key"] is not None and meta["key"] not in saved.get(meta["file"]) \
                        and not default_missing:
                    continue
                values[f.name] = saved.array(meta["file"], meta["key"])
            elif "table" in meta and f.name not in values:
                table = f"{meta['table']}.csv"
                if not default_missing and (not saved.exists(table) or
                                            meta["column"] not in saved.get(table).columns):
                    continue  # an optional column this condition does not have
                names = axes(hints[f.name]) or ()
                values[f.name] = saved.table_column(meta["table"], meta["column"], dims, names)
        check_values(cls, values, dims, label=lambda f: (
            f"{saved.path_of(f.metadata['file'])}: {f.metadata['key'] or 'the array'}"
            if "file" in f.metadata else f"{saved.path_of('*')}: {f.name}"))
        part = cls(**values)
        # a mapped array is checked by whoever reads it: the check would read every page
        mapped = {f.name for f in dataclasses.fields(cls) if saved.lazy and "file" in f.metadata}
        part.check(dims, saved.path_of("*"), unchecked=mapped)
        return part

    def check(self, dims: dict[str, int], where: object = "", unchecked=()) -> dict[str, int]:
        """Shapes against ``dims`` and finiteness of the fields that require it (but
        ``unchecked``)."""
        prefix = f"{where}: " if where else ""
        check_shapes(self, dims, prefix)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("finite") and f.name not in unchecked and value is not None and \
                    not np.isfinite(np.asarray(value)).all():
                raise ResultFileError(f"{prefix}{f.name} holds NaN/inf")
        return dims


def head_index_columns(n_layers: int, n_heads: int) -> dict[str, np.ndarray]:
    """The ``layer`` and ``head`` columns of a table of one row per (layer, head), layer
    by layer (the order of ``array[layer, head].ravel()``)."""
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return {"layer": layer, "head": head}


def tidy_tables(parts, dims: dict[str, int], base: dict, seq_id: np.ndarray,
                kv_head: np.ndarray, skip=()) -> dict[str, pd.DataFrame]:
    """Every table of :data:`TABLE_ROWS` but ``skip`` from the parts' column fields, with the
    condition's columns (``base``), layer, head (and seq_id) first, kv_head last."""
    out = {}
    for table, rows in TABLE_ROWS.items():
        if table in skip:
            continue
        shape = tuple(dims[a] for a in rows)
        index = dict(zip(rows, (g.ravel() for g in np.meshgrid(
            *(np.arange(s) for s in shape), indexing="ij"))))
        cols = {**base, "layer": index["layer"], "head": index["head_index"]}
        if "n_seqs" in index:
            cols["seq_id"] = seq_id[index["n_seqs"]]
        for part in parts:
            cols.update(part.columns(table, dims))
        cols["kv_head"] = kv_head[cols["head"]]
        out[table] = pd.DataFrame(cols)
    return out
