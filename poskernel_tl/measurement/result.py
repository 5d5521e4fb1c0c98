"""One condition's measurement as a value: :class:`ConditionResult`.

A result is its condition (model, dataset, length, spec, evaluation sequence ids,
configuration, provenance) and a set of parts, each the result dataclass of the reducer
that computes it (:func:`part_classes`: Track A, Track B, the centering means, S_PE and
every statistic of :data:`~poskernel_tl.statistics.registry.STATISTICS`). Where each
part's fields are saved — a file and key, or a column of the tidy Track A/Track B tables
— is declared on the fields themselves
(:mod:`poskernel_tl.schema`), so ``save``, ``load``, the tables and the shape checks are
written once for every part: the files in :mod:`~poskernel_tl.measurement.store`, the
tables in :mod:`~poskernel_tl.measurement.tables`, the value and its checks here.

A part's fields read as attributes of the result (``result.r2_pooled`` is
``result.track_a.r2_pooled``); an absent part's fields read as their defaults (None).
:func:`poskernel_tl.measure` returns a result without touching the disk; ``save`` writes
the protocol's files and ``load`` reads them back exactly, checking every file first.
"""

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jaxtyping import Int

from poskernel_tl import constants as C
from poskernel_tl.fit.toeplitz import two_sided
from poskernel_tl.hooks import kv_head_map
from poskernel_tl.measurement import store, tables
from poskernel_tl.measurement.parts import (
    build_part,
    condition_dims,
    owner,
    part_classes,
)
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.registry import ModelSpec
from poskernel_tl.reducers import GramResult, TrackAResult
from poskernel_tl.schema import Part

# result attribute -> (part, field) where the names differ
ALIASES = {"r2_perm_null": ("perm_null", "r2_null"),
           "r2_perm_same_seqs": ("perm_null", "r2_same_seqs")}
META = ("model", "dataset", "length", "spec", "seq_id", "config", "provenance")


class ConditionResult:
    """Track A, Track B and their companions for one (model, dataset, length) condition.

    Build it from parts (``parts={"track_a": TrackAResult(...), ...}``) or from the parts'
    fields by name (``r2_pooled=..., g_gram=...``); arrays use TransformerLens axis names
    and ``lag`` runs over Δ = 1..T−1 (index Δ−1). Shapes are checked on construction.
    ``r2_gram``/``g_gram`` (centered Track B) are NaN when no centering sequences were
    given (random tokens); the Track B table then reports the raw fit under ``R2_gram``
    with ``centered`` false.

    A bidirectional model (``spec.causal`` false) is fitted on both triangles; its result
    also holds the parallel ``*_back`` arrays (Δ = −1..−(T−1), index j ↔ Δ = −(j+1):
    ``g_per_seq_back``, ``g_pooled_back``, ``g_gram_back``, ``g_gram_raw_back``) and the
    diagonal means (Δ = 0: ``g_per_seq_self``, ``g_pooled_self``, ``g_gram_self``,
    ``g_gram_raw_self``), saved in ``g.npz`` beside the others, and the tables' asymmetry
    columns (``asym_A``, ``asym_A_per_seq``, ``asym_gram``, ``asym_gram_raw``). For a causal
    model they are None and absent. :meth:`g_two_sided` joins the two sides.
    """

    def __init__(self, model: str, dataset: str, length: int, spec: ModelSpec,
                 seq_id: Int[np.ndarray, " n_seqs"], *, parts: dict[str, Part] | None = None,
                 config: dict | None = None, provenance: dict | None = None, **fields: Any):
        self.model, self.dataset, self.length, self.spec = model, dataset, int(length), spec
        self.seq_id = np.asarray(seq_id)
        self.config, self.provenance = dict(config or {}), dict(provenance or {})
        self.parts: dict[str, Part] = dict(parts or {})
        for name, (_, field) in ALIASES.items():
            if name in fields:
                fields[field] = fields.pop(name)
        owners = owner()
        unknown = sorted(set(fields) - set(owners) - {"seq_index"})
        if unknown:
            raise TypeError(f"ConditionResult has no fields {unknown}")
        if "r2_pooled" in fields:  # Track A built from its fields: sequences in order
            fields.setdefault("seq_index", np.arange(len(self.seq_id)))
        for cls in part_classes():
            mine = {k: v for k, v in fields.items() if owners.get(k, TrackAResult) is cls}
            if mine and all(v is None for v in mine.values()) and any(
                    f.name in mine for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING):  # a required field unset: no part
                self.parts.pop(cls.NAME, None)
            elif mine and cls.NAME in self.parts:
                self.parts[cls.NAME] = dataclasses.replace(self.parts[cls.NAME], **mine)
            elif mine:
                self.parts[cls.NAME] = build_part(cls, mine)
        for required in ("track_a", "track_b"):
            if required not in self.parts:
                raise TypeError(f"ConditionResult needs the {required} part")
        self.check()

    # ------------------------------------------------------------ attributes
    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("parts",):
            raise AttributeError(name)
        part_name, field = ALIASES.get(name, (None, name))
        cls = owner().get(field)
        if cls is None:
            raise AttributeError(f"ConditionResult has no attribute {name!r}")
        part = self.parts.get(part_name or cls.NAME)
        if part is None:
            f = next(f for f in dataclasses.fields(cls) if f.name == field)
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return None if f.default is dataclasses.MISSING else f.default
        return getattr(part, field)

    def replace(self, **changes) -> "ConditionResult":
        """A copy with some condition attributes or part fields changed."""
        meta = {k: changes.pop(k, getattr(self, k)) for k in META}
        return ConditionResult(**meta, parts=self.parts, **changes)

    def __repr__(self) -> str:
        return (f"ConditionResult({self.model!r}, {self.dataset!r}, T={self.length}, "
                f"n_eval={len(self.seq_id)}, parts={sorted(self.parts)})")

    # ------------------------------------------------------------ derived values
    @property
    def n_layers(self) -> int:
        return self.r2_pooled.shape[0]

    @property
    def n_heads(self) -> int:
        return self.r2_pooled.shape[1]

    @property
    def kv_head(self) -> Int[np.ndarray, " head_index"]:
        return np.asarray(kv_head_map(self.n_heads, self.spec.n_kv_heads))

    @property
    def thetas(self) -> np.ndarray | None:
        """The model's rotary frequencies θ_i (rad/token), or None without rotary."""
        return self.spec.rotary_frequencies()

    @property
    def usage(self) -> np.ndarray | None:
        """Frequency usage of each rotary pair, mean |q| × mean |k| (each query head with
        its key/value head), [layer, head_index, pair] in the order of :attr:`thetas`."""
        if self.q_pair_norm is None or self.k_pair_norm is None:
            return None
        return np.asarray(self.q_pair_norm, np.float64) * \
            np.asarray(self.k_pair_norm, np.float64)[:, self.kv_head]

    @property
    def r2_split_mean(self) -> np.ndarray:
        return self.track_a.r2_split_mean

    @property
    def r2_split_std(self) -> np.ndarray:
        return self.track_a.r2_split_std

    @property
    def g_trackB(self) -> tuple[np.ndarray, str]:
        """The Track B g(Δ) the spectral analysis reads, and its name: the centered Gram,
        or the raw Gram where the condition is not centered."""
        return (self.g_gram, "gram_centered") if self.centered else (self.g_gram_raw,
                                                                     "gram_raw")

    @property
    def geometry(self) -> Geometry:
        """The condition's geometry (its length and every layer's kept offsets), as the
        run that measured it made it."""
        return Geometry.of(self.spec, self.length)

    @property
    def causal(self) -> bool:
        """False for a bidirectional model (fits over both triangles)."""
        return bool(getattr(self.spec, "causal", True))

    def g_two_sided(self, source: str = "trackA") -> np.ndarray | None:
        """g over signed lags Δ = −(T−1)..T−1 [layer, head_index, 2T−1] with the diagonal's
        mean at Δ = 0 (:func:`~poskernel_tl.fit.toeplitz.two_sided`) for ``trackA`` (pooled)
        or ``trackB`` (the g of :attr:`g_trackB`); None for a causal model."""
        if source not in ("trackA", "trackB"):
            raise ValueError(f"source={source!r}: choose trackA or trackB")
        if source == "trackA":
            parts = (self.g_pooled, self.g_pooled_back, self.g_pooled_self)
        elif self.centered:
            parts = (self.g_gram, self.g_gram_back, self.g_gram_self)
        else:
            parts = (self.g_gram_raw, self.g_gram_raw_back, self.g_gram_raw_self)
        return None if parts[1] is None else two_sided(*parts)

    @property
    def track_a(self) -> TrackAResult:
        return self.parts["track_a"]

    @property
    def track_b(self) -> GramResult:
        return self.parts["track_b"]

    def dims(self) -> dict[str, int]:
        """Axis name → size for this condition (the shape checks' reference)."""
        return condition_dims(self.spec, self.length, len(self.seq_id))

    def check(self) -> None:
        """Every part's arrays against :meth:`dims` (cheap: shapes only; values are checked
        where they are read from files, and a mapped array by whoever reads it)."""
        dims = self.dims()
        for part in self.parts.values():
            every = {f.name for f in dataclasses.fields(part)}
            part.check(dims, f"{self.model}/{self.dataset}_{self.length}", unchecked=every)

    def stem(self) -> str:
        return C.stem(self.model, self.dataset, self.length)

    # ------------------------------------------- its tables (measurement/tables.py)
    def to_frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The tidy Track A and Track B tables
        (:func:`~poskernel_tl.measurement.tables.to_frames`)."""
        return tables.to_frames(self)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every tidy table the parts fill (:func:`~poskernel_tl.measurement.tables.tidy`)."""
        return tables.tidy(self)

    def kernels(self) -> pd.DataFrame | None:
        """The per-head table, ``heads.csv`` (:func:`~poskernel_tl.measurement.tables.heads`)."""
        return tables.heads(self)

    def condition_values(self) -> dict[str, float]:
        """Every per-condition value (:func:`~poskernel_tl.measurement.tables.condition_values`)."""
        return tables.condition_values(self)

    def layer_summary(self) -> pd.DataFrame:
        """Per layer, the mean over heads of each R²
        (:func:`~poskernel_tl.measurement.tables.layer_summary`)."""
        return tables.layer_summary(self)

    # ------------------------------------------------ its files (measurement/store.py)
    def save(self, out: str | Path) -> dict[str, Path]:
        """Write the condition under ``out`` (:func:`~poskernel_tl.measurement.store.save`)."""
        return store.save(self, out)

    @classmethod
    def load(cls, out: str | Path, model: str | None = None, dataset: str | None = None,
             length: int | None = None, lazy: bool = False) -> "ConditionResult":
        """A saved condition, read back exactly (:func:`~poskernel_tl.measurement.store.load`)."""
        return store.load(cls, out, model, dataset, length, lazy)

    conditions = staticmethod(store.conditions)
    folder = staticmethod(store.folder)
    saved_config = staticmethod(store.saved_config)
    saved_spec = staticmethod(store.saved_spec)


__all__ = ["ALIASES", "ConditionResult"]
