"""The statistic registry: every per-head statistic computed during the forward, by name
(:class:`~poskernel_tl.statistics.statistic.StatisticSpec`). ``pk.measure``, the result's
parts, the per-head table, ``grid_summary.csv``, the report and the head viewer iterate
over :data:`STATISTICS`.

Adding a statistic: one module in this folder ending with its ``STATISTIC`` (see
``statistic.py`` and the docs' page ``docs/how-to/add-statistic.md``). Every module of the folder
that defines one is registered, in the order of the module names; nothing else to edit.
"""

import pandas as pd

from poskernel_tl.errors import UnknownNameError
from poskernel_tl.plugins import by_name, discover
from poskernel_tl.statistics.statistic import StatisticSpec

STATISTICS: dict[str, StatisticSpec] = by_name(
    discover(__package__, "STATISTIC", lambda x: isinstance(x, StatisticSpec)),
    lambda s: s.name, "statistics")


def get(name: str) -> StatisticSpec:
    """The spec of statistic ``name`` (an UnknownNameError lists the valid names)."""
    if name not in STATISTICS:
        raise UnknownNameError(f"unknown statistic {name!r}; choose one of "
                               f"{', '.join(STATISTICS)}")
    return STATISTICS[name]


def condition_labels() -> dict[str, str]:
    """Every statistic's per-condition value names -> labels (the name where none)."""
    return {k: v for s in STATISTICS.values() for k, v in s.condition_labels.items()}


def condition_values(heads: pd.DataFrame) -> dict[str, float]:
    """Every statistic's per-condition values of one condition's per-head table."""
    return {k: v for s in STATISTICS.values() for k, v in s.values_of(heads).items()}


__all__ = ["STATISTICS", "condition_labels", "condition_values", "get"]
