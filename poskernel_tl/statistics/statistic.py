"""A per-head statistic computed during the forward, declared in one place: its
:class:`StatisticSpec`.

A statistic is one module that ends with a ``STATISTIC`` (as an analysis ends with its
``SPEC``): the result part it makes (a :class:`~poskernel_tl.schema.Part` whose fields say
their axes and where each is saved, and its head-view panels), how its reducer is built
from the model and the run's options (:class:`StatisticContext`; ``None``: not wanted in
this run), its bytes for the memory plan, and which of its fields are per-head columns
(with a label) and which values it gives per condition.
:data:`poskernel_tl.statistics.registry.STATISTICS` lists them; from that list
``pk.measure`` builds the reducers and the result's parts, ``ConditionResult`` saves,
loads and checks them, the per-head table (``heads.csv``) gains the declared columns (and
with it the report's per-head tables, the atlas and the head viewer's rows), every head
view its panels, and ``grid_summary.csv`` and the report the per-condition values.

Track A and Track B are not in the list: the plan runs Track B in blocks of layers and
every other statistic reads Track A's result, so ``pk.measure`` builds them itself.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from poskernel_tl.mask import Mask
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.models.registry import ModelSpec
from poskernel_tl.schema import Part


@dataclass(frozen=True)
class StatisticContext:
    """What a statistic's reducer is built from: the model, the run's geometry (its
    length, mask and per-layer offsets: :class:`~poskernel_tl.models.geometry.Geometry`),
    the number of evaluation sequences and the run's options (a
    :class:`~poskernel_tl.plan.config.MeasureConfig`)."""

    model: LoadedModel
    geometry: Geometry
    n_eval: int
    options: Any
    centering: Any = None  # the centering pass's Moments, or None
    wanted: Mapping[int, int] = field(default_factory=dict)  # pass position -> seq_id

    @property
    def spec(self) -> ModelSpec:
        return self.model.spec

    @property
    def device(self):
        return self.model.device

    @property
    def source(self) -> str:
        """Where Track A-like fits take their sums: ``lags`` (from q and k) or ``scores``."""
        return "scores" if self.options.scores in ("hook", "qk") else "lags"

    @property
    def length(self) -> int:
        return self.geometry.length

    @property
    def masks(self) -> tuple[Mask, ...]:
        """Per layer, the entries its softmax keeps (what every reducer is built from)."""
        return self.geometry.masks


def no_bytes(model: LoadedModel, work: Any) -> int:
    return 0


def mean_of(column: str, name: str) -> Callable[[pd.DataFrame], dict[str, float]]:
    """A ``condition_values`` giving ``name``: the mean over heads of a per-head column."""
    return lambda heads: {name: float(heads[column].mean())}


@dataclass(frozen=True)
class StatisticSpec:
    """One statistic (see the module docstring). ``state_bytes(model, work)`` gets the
    plan's :class:`~poskernel_tl.plan.batching.Workload` (length, n_eval, n_logits,
    whiten, null_draws); ``head_columns`` maps a ``[layer, head_index]`` field of the part
    to its label; ``condition_values(heads)`` reads the condition's per-head table and
    returns named scalars; ``finish(part, reducers, run)`` completes the part from the
    pass's other reducers (by name; ``track_a`` among them)."""

    name: str
    part: type[Part]
    build: Callable[[StatisticContext], Any]
    description: str
    state_bytes: Callable[[LoadedModel, Any], int] = no_bytes
    head_columns: Mapping[str, str] = field(default_factory=dict)
    condition_values: Callable[[pd.DataFrame], dict[str, float]] | None = None
    condition_labels: Mapping[str, str] = field(default_factory=dict)
    finish: Callable[[Part, Mapping[str, Any], StatisticContext], Part] | None = None

    def values_of(self, heads: pd.DataFrame) -> dict[str, float]:
        """:attr:`condition_values` of one condition's per-head table; empty where the
        statistic has none or the table lacks its columns (saved before it existed)."""
        cols = list(self.head_columns)
        if self.condition_values is None or not set(cols) <= set(heads.columns) or \
                heads[cols].isna().all().all():
            return {}
        return self.condition_values(heads)

    def __post_init__(self):
        if self.name != self.part.NAME:
            raise ValueError(f"statistic {self.name!r}: its part is named {self.part.NAME!r}")


__all__ = ["StatisticContext", "StatisticSpec", "mean_of", "no_bytes"]
