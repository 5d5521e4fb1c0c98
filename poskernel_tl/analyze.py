"""``poskernel analyze NAME``: run one analysis of ``analyses/`` on one condition.

Every analysis module in ``analyses/`` that the CLI knows exposes

    NAME: str                 # the CLI name, e.g. "separable"
    NEEDS_RESULT: bool        # whether it reads the condition's ConditionResult
    def analyze(model, eval_tokens, centering_tokens, *, result=None, batch_size=4,
                progress=True) -> pandas.DataFrame

and the table is written to ``results/{model}_{dataset}_{T}_{NAME}.csv``. When an
analysis needs the condition's measurement, a saved one under ``--out`` is reused
(validated by :meth:`ConditionResult.load`), otherwise it is measured and saved first.
"""

import importlib
from pathlib import Path

import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl.batching import resolve_batch_size
from poskernel_tl.io import save_csv
from poskernel_tl.loading import LoadedModel
from poskernel_tl.result import ConditionResult, ResultFileError
from poskernel_tl.runner import RunConfig, prepare, run_condition

ANALYSES = {  # CLI name -> module under poskernel_tl.analyses
    "gk-baseline": "gk_baseline",
    "fourier-kernel": "fourier_kernel",
    "seq-pca": "sequence_pca",
    "qig-control": "qig_kernel",
    "kernel-patching": "kernel_patching",
    "separable": "separable",
    "mean-field": "mean_field",
}


def analysis_module(name: str):
    """The module behind CLI name ``name`` (a ValueError lists the valid names)."""
    if name not in ANALYSES:
        raise ValueError(f"unknown analysis {name!r}; choose one of {', '.join(ANALYSES)}")
    module = importlib.import_module(f"poskernel_tl.analyses.{ANALYSES[name]}")
    if not hasattr(module, "analyze"):
        raise ValueError(f"analysis {name!r} has no command-line entry point")
    return module


def condition_result(cfg: RunConfig, model: LoadedModel) -> ConditionResult:
    """The saved measurement of ``cfg``'s condition under ``cfg.out``, or a new one."""
    try:
        return ConditionResult.load(cfg.out, cfg.model, cfg.dataset, cfg.length)
    except ResultFileError:
        return run_condition(cfg, model=model)[0]


def run_analysis(name: str, cfg: RunConfig, model: LoadedModel | None = None
                 ) -> tuple[pd.DataFrame, Path]:
    """Run analysis ``name`` on ``cfg``'s condition; returns its table and CSV path."""
    module = analysis_module(name)
    cond = prepare(cfg, model)
    result = condition_result(cfg, cond.model) if getattr(module, "NEEDS_RESULT", False) \
        else None
    batch_size = resolve_batch_size(cfg.batch_size, cond.model, cfg.length,
                                    len(cond.eval_tokens))
    table = module.analyze(cond.model, cond.eval_tokens, cond.centering_tokens,
                           result=result, batch_size=batch_size, progress=cfg.progress)
    for col, value in (("length", cfg.length), ("dataset", cfg.dataset), ("model", cfg.model)):
        if col in table.columns:
            table = table.drop(columns=col)
        table.insert(0, col, value)
    path = save_csv(table, C.result_path(Path(cfg.out), cfg.model, cfg.dataset, cfg.length,
                                         f"{name}.csv"))
    return table, path
