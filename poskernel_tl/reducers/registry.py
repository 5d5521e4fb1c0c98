"""The statistic registry: every per-head statistic computed during the forward, by name
(:class:`~poskernel_tl.reducers.statistic.StatisticSpec`). ``pk.measure``, the result's
parts, the per-head table, ``grid_summary.csv``, the report and the head viewer iterate
over :data:`STATISTICS`.

Adding a statistic: one module ending with its ``STATISTIC`` (see ``statistic.py`` and the
README, section *Adding a statistic*), then its ``STATISTIC`` in the list below.
"""

import pandas as pd

from poskernel_tl.errors import UnknownNameError
from poskernel_tl.reducers import freq_usage, logits, perm_null, prev_token, whitened_gram
from poskernel_tl.reducers.statistic import StatisticSpec

STATISTICS: dict[str, StatisticSpec] = {s.name: s for s in (
    freq_usage.STATISTIC, logits.STATISTIC, whitened_gram.STATISTIC, perm_null.STATISTIC,
    prev_token.STATISTIC)}


def get(name: str) -> StatisticSpec:
    """The spec of statistic ``name`` (an UnknownNameError lists the valid names)."""
    if name not in STATISTICS:
        raise UnknownNameError(f"unknown statistic {name!r}; choose one of "
                               f"{', '.join(STATISTICS)}")
    return STATISTICS[name]


def head_columns() -> dict[str, str]:
    """Every statistic's per-head columns, column -> label, in registry order."""
    return {c: label for s in STATISTICS.values() for c, label in s.head_columns.items()}


def condition_labels() -> dict[str, str]:
    """Every statistic's per-condition value names -> labels (the name where none)."""
    return {k: v for s in STATISTICS.values() for k, v in s.condition_labels.items()}


def condition_values(heads: pd.DataFrame) -> dict[str, float]:
    """Every statistic's per-condition values of one condition's per-head table."""
    return {k: v for s in STATISTICS.values() for k, v in s.values_of(heads).items()}


__all__ = ["STATISTICS", "condition_labels", "condition_values", "get", "head_columns"]
