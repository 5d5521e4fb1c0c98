"""What an analysis declares: :class:`AnalysisSpec`.

Every analysis module ends with one ``SPEC``: its name (the CLI name and the CSV suffix
``results/{model}_{dataset}_{T}_{NAME}.csv``), an options dataclass (its fields become
the flags of ``poskernel analyze NAME``), a compute function on
(:class:`AnalysisInputs`, options) returning a per-head table, its figure, the rows it
shows on a head view and one sentence on how to read it. The registry
(:mod:`poskernel_tl.analyses.registry`) collects them; the CLI, the grid's
``--analyses`` and the report iterate over it.
"""

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from jaxtyping import Int
from matplotlib.figure import Figure

from poskernel_tl.errors import UserError
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.loading import LoadedModel


@dataclass
class AnalysisInputs:
    """What an analysis may read: the loaded model (None for analyses that read only the
    saved result), the condition's evaluation and centering tokens and its measurement."""

    model: LoadedModel | None
    result: ConditionResult | None
    eval_tokens: Int[torch.Tensor, "batch pos"] | None = None
    centering_tokens: Int[torch.Tensor, "batch pos"] | None = None
    batch_size: int = 4
    progress: bool = True
    out: str | None = None  # the output folder (analyses that read other conditions)


@dataclass(frozen=True)
class NoOptions:
    """An analysis without options."""


@dataclass(frozen=True)
class AnalysisSpec:
    name: str
    title: str
    guide: str  # one sentence on how to read it (report section, CLI help)
    # a per-head table, or {file suffix: table} for an analysis that writes several
    compute: Callable[[AnalysisInputs, Any], pd.DataFrame | dict[str, pd.DataFrame]]
    options: type = NoOptions
    needs_model: bool = True  # False: runs on the saved ConditionResult alone
    needs_result: bool = False  # True: needs the condition measured first
    figure: Callable[[pd.DataFrame, str], Figure] | None = None
    # (column, label) of the head view's rows; an interval is shown where
    # ``{column}_lo`` / ``{column}_hi`` exist
    head_rows: tuple[tuple[str, str], ...] = ()
    columns: tuple[str, ...] = field(default=())  # besides layer and head; checked on read
    # (column, label) of the report's per-layer means: an analysis with any is shown in
    # the report's "Further analyses" and in the head views. A label ending in "*" is
    # averaged over the heads where ``valid``'s boolean column holds
    layer_means: tuple[tuple[str, str], ...] = ()
    # (boolean column, the head view's note where it is False)
    valid: tuple[str, str] | None = None
    file: str | None = None  # the CSV suffix, default ``{name}.csv``
    # True: defined for bidirectional (encoder) models too; False: reads the causal
    # triangle only, and an encoder is refused rather than given a one-sided answer
    bidirectional: bool = False
    # the head view's panels: given what the analysis saved for a condition (its loaded
    # table, or the spectral analysis' SavedSpectral) and the condition's result, a
    # function of (layer, head) returning panel dicts (:mod:`poskernel_tl.panels`' kinds)
    # with a ``shared`` dict of the arrays they name (e.g. ``"omega"``); None: no panel
    head_panels: Callable[[Any, ConditionResult], Callable[[int, int], list[dict]]] | None = None
    # where it is listed (the command line's subcommands, the report's sections, a head
    # page's panels): lowest first, then by name
    order: int = 50

    @property
    def suffix(self) -> str:
        return self.file or f"{self.name}.csv"

    def command(self, model: str, dataset: str, length: int, out: str) -> str:
        """The command that writes this analysis' table for a condition."""
        return " ".join(shlex.quote(x) for x in (
            "poskernel", "analyze", self.name, "--model", model, "--dataset", dataset,
            "--length", str(length), "--out", str(out)))

    def supports(self, causal: bool) -> bool:
        return causal or self.bidirectional

    def refuse_unsupported(self, causal: bool, model: str) -> None:
        """A UserError for a bidirectional model this analysis is not defined for."""
        if not self.supports(causal):
            raise UserError(f"analysis {self.name} reads the causal (lower) triangle only; "
                            f"{model} is a bidirectional encoder")

    def run(self, inputs: AnalysisInputs, options=None
            ) -> pd.DataFrame | dict[str, pd.DataFrame]:
        where = inputs.model.spec if inputs.model is not None else inputs.result
        if where is not None:
            self.refuse_unsupported(bool(getattr(where, "causal", True)),
                                    getattr(where, "name", None) or where.model)
        if self.needs_model and inputs.model is None:
            raise TypeError(f"analysis {self.name} needs a loaded model")
        if self.needs_result and inputs.result is None:
            raise TypeError(f"analysis {self.name} needs the condition's ConditionResult")
        return self.compute(inputs, options if options is not None else self.options())
