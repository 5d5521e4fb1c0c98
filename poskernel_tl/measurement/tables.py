"""A condition's tables, read from a :class:`~poskernel_tl.measurement.result.ConditionResult`
``r`` (its methods of the same names call these; the value itself builds no table): the
tidy per-sequence tables (``trackA.csv``, ``trackB.csv``, ``bands.csv``: :func:`tidy`), the
per-head table ``heads.csv`` (:func:`heads`), the per-condition values of
``grid_summary.csv`` (:func:`condition_values`) and the per-layer summary the command
line prints (:func:`layer_summary`)."""

import numpy as np
import pandas as pd

from poskernel_tl.fit.kernel_class import condition_kernels
from poskernel_tl.measurement.parts import condition_values as values_of_heads
from poskernel_tl.measurement.parts import head_values
from poskernel_tl.schema import tidy_tables


def to_frames(r) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tidy Track A table (a row per eval sequence, layer, head) and Track B's."""
    out = tidy(r)
    return out["trackA"], out["trackB"]


def tidy(r) -> dict[str, pd.DataFrame]:
    """Every tidy table the parts fill (:func:`~poskernel_tl.schema.tidy_tables`)."""
    return tidy_tables(r.parts.values(), r.dims(), dict(
        model=r.model, dataset=r.dataset, length=r.length), r.seq_id,
        r.kv_head, skip=() if r.band_lo is not None else ("bands",))


def heads(r) -> pd.DataFrame | None:
    """Per head, the kernel descriptors and class (:mod:`poskernel_tl.fit.kernel_class`)
    and every declared per-head column ``r`` holds
    (:func:`~poskernel_tl.measurement.parts.head_columns`): ``heads.csv``; None for a
    result saved without the sink column's mean."""
    df = condition_kernels(r)
    if df is None:
        return None
    for col, values in head_values(r.parts).items():
        df[col] = values.ravel()
    return df


def condition_values(r) -> dict[str, float]:
    """Every per-condition value (``grid_summary.csv``, the report: each statistic's, and
    the mean over heads of each per-head column declared on a field), read from
    :func:`heads`; empty without the per-head table."""
    table = heads(r)
    return {} if table is None else values_of_heads(table)


def layer_summary(r) -> pd.DataFrame:
    """Mean over heads of each layer: pooled Track A (and within rows), Track B centered
    and raw; for a model with sliding-window layers also each layer's kind and Track A
    pooled over the whole causal triangle (``R2_A_whole``, the diagnostic)."""
    df = pd.DataFrame({
        "R2_A_pooled": np.nanmean(r.r2_pooled, axis=1),
        "R2_A_per_seq": np.nanmean(r.r2_per_seq, axis=(0, 2)),
        "R2_A_nosink": np.nanmean(r.r2_pooled_nosink, axis=1),
        "R2_B_centered": (np.nanmean(r.r2_gram, axis=1) if r.centered
                          else np.full(r.n_layers, np.nan)),
        "R2_B_raw": np.nanmean(r.r2_gram_raw, axis=1)})
    whole = getattr(r, "r2_pooled_whole", None)
    if whole is not None:  # NaN on a chunked layer past its chunk (never read)
        n = np.isfinite(whole).sum(axis=1)
        df.insert(1, "R2_A_whole", np.where(n > 0, np.nansum(whole, axis=1) / np.maximum(n, 1),
                                            np.nan))
    if "within_row" in r.parts:  # the same fit with a free constant per row
        df.insert(1, "R2_A_within_row", np.nanmean(r.r2_within_pooled, axis=1))
    if r.spec.layers and len({s.kind for s in r.spec.layers}) > 1:
        df.insert(0, "kind", [s.kind for s in r.spec.layers])
    df.index.name = "layer"
    return df


__all__ = ["condition_values", "heads", "layer_summary", "tidy", "to_frames"]
