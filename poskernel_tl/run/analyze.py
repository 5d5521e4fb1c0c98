"""Running a registered analysis on one condition: :func:`run_analysis`.

The analysis's table is written to ``results/{model}_{dataset}_{T}_{NAME}.csv`` (see
:class:`~poskernel_tl.analyses.base.AnalysisSpec`). When it needs the condition's
measurement, a saved one under ``--out`` is reused (validated by
:meth:`ConditionResult.load`), otherwise it is measured and saved first; an analysis that
needs no model (spectral, frequency usage, the cosine fit) runs on the saved result
without loading one.
"""

from pathlib import Path

import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.analyses.registry import get
from poskernel_tl.errors import ResultFileError
from poskernel_tl.io import save_csv
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.models.registry import REGISTRY
from poskernel_tl.plan.batching import resolve_batch_size
from poskernel_tl.plan.config import RunConfig
from poskernel_tl.run.runner import prepare, run_condition


def saved_result(cfg: RunConfig) -> ConditionResult | None:
    """The saved measurement of ``cfg``'s condition under ``cfg.out``, or None."""
    try:
        return ConditionResult.load(cfg.out, cfg.model, cfg.dataset, cfg.length)
    except ResultFileError:
        return None


def analysis_inputs(spec: AnalysisSpec, cfg: RunConfig, model: LoadedModel | None = None
                    ) -> AnalysisInputs:
    """What ``spec`` reads for ``cfg``'s condition: the saved result where enough, else
    the model, the sequences and (measured now, and saved, if missing) the result."""
    result = saved_result(cfg) if spec.needs_result else None
    if not spec.needs_model and result is not None:
        return AnalysisInputs(None, result, progress=cfg.progress, out=cfg.out)
    cond = prepare(cfg, model)
    if spec.needs_result and result is None:
        result = run_condition(cfg, model=cond.model)[0]
    batch_size = resolve_batch_size(cfg.batch_size, cond.model, cfg.length,
                                    len(cond.eval_tokens))
    return AnalysisInputs(cond.model, result, cond.eval_tokens, cond.centering_tokens,
                          batch_size=batch_size, progress=cfg.progress, out=cfg.out)


def save_tables(spec: AnalysisSpec, tables, cfg: RunConfig
                ) -> dict[str, tuple[pd.DataFrame, Path]]:
    """Write an analysis's table(s) with the condition's model, dataset and length first;
    returns {file suffix: (table as written, path)}."""
    if isinstance(tables, pd.DataFrame):
        tables = {spec.suffix: tables}
    written = {}
    for suffix, table in tables.items():
        keys = {"model": cfg.model, "dataset": cfg.dataset, "length": cfg.length}
        table = pd.concat([pd.DataFrame(keys, index=table.index),
                           table.drop(columns=[c for c in keys if c in table.columns])],
                          axis=1)
        written[suffix] = (table, save_csv(table, C.result_path(
            Path(cfg.out), cfg.model, cfg.dataset, cfg.length, suffix)))
    return written


def run_analysis(name: str, cfg: RunConfig, model: LoadedModel | None = None,
                 options=None) -> tuple[pd.DataFrame, Path]:
    """Run analysis ``name`` on ``cfg``'s condition with ``options`` (its options
    dataclass; default: its defaults). Returns its main table and that table's CSV (an
    analysis that writes its own files returns no table and its main file is read)."""
    spec = get(name)
    known = REGISTRY.get(cfg.model)  # a registered encoder is refused before any loading
    if known is not None:
        spec.refuse_unsupported(known.causal, cfg.model)
    tables = spec.run(analysis_inputs(spec, cfg, model), options)
    written = save_tables(spec, tables, cfg)
    if spec.suffix in written:
        return written[spec.suffix]
    path = C.result_path(Path(cfg.out), cfg.model, cfg.dataset, cfg.length, spec.suffix)
    return pd.read_csv(path), path  # an analysis that wrote its own files
