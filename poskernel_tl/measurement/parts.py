"""The parts a :class:`~poskernel_tl.measurement.result.ConditionResult` is composed of:
Track A, Track B, the centering means and S_PE, then every statistic of the registry
(:data:`~poskernel_tl.statistics.registry.STATISTICS`), and which part declares each field."""

import dataclasses
import functools
import math
import types
import typing

import numpy as np
import pandas as pd

from poskernel_tl.measurement.pe_kernel import PEKernel
from poskernel_tl.models.registry import ModelSpec
from poskernel_tl.protocol import offset_bands
from poskernel_tl.reducers import CenteringMeans, GramResult, TrackAResult
from poskernel_tl.schema import TABLE_ROWS, Part, axes
from poskernel_tl.statistics.registry import STATISTICS
from poskernel_tl.statistics.registry import condition_values as registry_values

CORE_PARTS: tuple[type[Part], ...] = (TrackAResult, GramResult, CenteringMeans, PEKernel)
UNSHOWN = ("seq_index", "eval_moments", "perms", "n_seqs", "seed")


def part_classes() -> tuple[type[Part], ...]:
    """Track A, Track B, the centering means and S_PE, then every registered statistic's
    part (read from the registry each time: a statistic registered later joins)."""
    return CORE_PARTS + tuple(s.part for s in STATISTICS.values())


@functools.cache
def _owners(classes: tuple[type[Part], ...]) -> dict[str, type[Part]]:
    """Each field's part; a ValueError where two parts declare one name (a result's
    attribute would read only one of them)."""
    found: dict[str, type[Part]] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.name in UNSHOWN:
                continue
            if f.name in found:
                raise ValueError(f"{cls.__name__}.{f.name}: {found[f.name].__name__} "
                                 "declares a field of that name; rename one")
            found[f.name] = cls
    return found


def owner() -> dict[str, type[Part]]:
    """Field name -> the part that declares it (fields a result does not show left out)."""
    return _owners(part_classes())


def head_columns() -> dict[str, tuple[str, str, str]]:
    """Every per-head column a result's parts declare, in part order: ``heads.csv``
    column -> (part, attribute, label) — the fields declared with a ``head`` label
    (:meth:`~poskernel_tl.schema.Part.head_fields`), then each statistic's
    ``head_columns``."""
    out = {col: (cls.NAME, attr, label) for cls in part_classes()
           for attr, (col, label) in cls.head_fields().items()}
    for stat in STATISTICS.values():
        out.update({col: (stat.name, col, label) for col, label in stat.head_columns.items()})
    return out


def field_columns() -> dict[str, str]:
    """``heads.csv`` column -> label of the per-head columns declared on fields
    (``column(..., head=)``), the statistics' own left out."""
    return {col: label for cls in part_classes() for col, label in cls.head_fields().values()}


def condition_entries() -> list[tuple[str, str, str]]:
    """(name, label, description) of every per-condition value: each statistic's, and the
    mean over heads of each per-head column declared on a field."""
    out = [(key, label, stat.description) for stat in STATISTICS.values()
           for key, label in stat.condition_labels.items()]
    return out + [(col, f"{label}, mean over heads", f"the mean over heads of {col}")
                  for col, label in field_columns().items()]


def condition_values(heads: pd.DataFrame) -> dict[str, float]:
    """Every per-condition value (:func:`condition_entries`) of one condition's per-head
    table; those whose columns the table lacks are left out."""
    out = registry_values(heads)
    out.update({col: float(heads[col].mean()) for col in field_columns()
                if col in heads and not heads[col].isna().all()})
    return out


def head_labels() -> dict[str, str]:
    """``heads.csv`` column -> label of every declared per-head column."""
    return {col: label for col, (_, _, label) in head_columns().items()}


def head_values(parts: dict[str, Part]) -> dict[str, np.ndarray]:
    """``heads.csv`` column -> [layer head_index] values, float64, of every per-head
    column (:func:`head_columns`) that ``parts`` hold."""
    out = {}
    for col, (name, attr, _) in head_columns().items():
        value = None if name not in parts else getattr(parts[name], attr)
        if value is not None:
            out[col] = np.asarray(value, np.float64)
    return out


def build_part(cls: type[Part], values: dict) -> Part:
    """A part from some of its fields; the rest take their defaults (None where absent)."""
    for f in dataclasses.fields(cls):
        if f.name not in values and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            values[f.name] = None
    return cls(**values)


def condition_dims(spec: ModelSpec, length: int, n_seqs: int) -> dict[str, int]:
    """Axis name → size for a condition of ``n_seqs`` evaluation sequences of ``length``
    tokens (the shape checks' reference)."""
    T = length
    dims = {"n_seqs": n_seqs, "layer": spec.n_layers, "head_index": spec.n_heads,
            "kv_head_index": spec.n_kv_heads, "d_head": spec.d_head, "pos": T,
            "query_pos": T, "key_pos": T, "lag": T - 1,
            "band": len(offset_bands(T)) if T > 1 else 0}
    return {k: v for k, v in dims.items() if v}


ITEM_BYTES = 4  # an array element as saved: the large per-sequence arrays are float32
CSV_VALUE_BYTES = 24  # one value of a table as text (17 significant digits), its separator


def planned_bytes(dims: dict[str, int], logits: int = 0, optional: tuple[str, ...] = ()
                  ) -> int:
    """≈ bytes a condition's files take, from the parts' declarations: every stored
    array each run writes (a field that is not optional; axes beyond ``dims`` count 1),
    the ``optional`` fields named (the centering means, the full Gram matrices), the
    logits of ``logits`` sequences, and one value per row and column of each table. A
    floor: the other optional arrays (an encoder's other side, the whitened fit) are
    small beside these."""
    size = lambda names: math.prod(dims.get(a, 1) for a in names)
    total = logits * size(("layer", "head_index", "query_pos", "key_pos")) * ITEM_BYTES
    for cls in part_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            names, tp = axes(hints.get(f.name)), hints.get(f.name)
            maybe = typing.get_origin(tp) in (typing.Union, types.UnionType) and \
                type(None) in typing.get_args(tp)
            if "file" in f.metadata and names and (not maybe or f.name in optional):
                total += size(names) * ITEM_BYTES
            if table := f.metadata.get("table"):
                total += size(TABLE_ROWS[table]) * CSV_VALUE_BYTES
    return total


__all__ = ["CORE_PARTS", "UNSHOWN", "build_part", "condition_dims", "condition_entries",
           "condition_values", "field_columns", "head_columns",
           "head_labels", "head_values", "owner", "part_classes", "planned_bytes"]
