"""Rotary frequency usage per head (Barbero et al., ICLR 2025, "Round and Round We Go").

Lays out a :class:`~poskernel_tl.measurement.result.ConditionResult`'s frequency usage (the mean
norm of q and k inside each rotary 2-D pair, pairs read from the model's own
``hook_cos``) per (layer, head, pair) ordered by rotation frequency θ: large norms in the
highest-frequency pairs mark positional heads; large norms in the lowest-frequency pairs
are the near-constant "semantic" channels.
"""

from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec, NoOptions
from poskernel_tl.constants import FREQ_USAGE_CSV, result_path
from poskernel_tl.errors import UserError
from poskernel_tl.io import save_csv
from poskernel_tl.measurement.result import ConditionResult

COLUMNS = ["layer", "head", "kv_head", "rank", "pair", "theta", "dim_a", "dim_b", "q_norm",
           "k_norm", "q_share"]


def freq_usage_table(result: ConditionResult) -> pd.DataFrame:
    """Tidy table: layer, head, kv_head, rank, pair, theta, dim_a, dim_b, q_norm, k_norm,
    q_share (the pair's share of the head's summed q norms), sorted by θ descending."""
    if result.q_pair_norm is None:
        raise UserError(f"{result.model} has no rotary frequency usage (pe={result.spec.pe})")
    qn, kn, theta = result.q_pair_norm, result.k_pair_norm, result.thetas
    L, H, P = qn.shape
    order = np.argsort(-theta, kind="stable")
    layer, head, rank = (g.ravel() for g in np.meshgrid(np.arange(L), np.arange(H),
                                                        np.arange(P), indexing="ij"))
    pair = order[rank]
    kv = result.kv_head[head]
    share = qn / qn.sum(-1, keepdims=True)
    return pd.DataFrame({
        "layer": layer, "head": head, "kv_head": kv, "rank": rank, "pair": pair,
        "theta": theta[pair], "dim_a": result.pair_first[pair],
        "dim_b": result.pair_second[pair], "q_norm": qn[layer, head, pair],
        "k_norm": kn[layer, kv, pair], "q_share": share[layer, head, pair]})[COLUMNS]





def write_freq_usage(result: ConditionResult, out: str | Path) -> Path | None:
    """Write ``freq_usage.csv`` beside the condition's results (None without rotary)."""
    if result.q_pair_norm is None:
        return None
    return save_csv(freq_usage_table(result), result_path(
        out, result.model, result.dataset, result.length, FREQ_USAGE_CSV))


def analyze(inputs: AnalysisInputs, options: NoOptions) -> pd.DataFrame:
    """``poskernel analyze freq-usage``: :func:`freq_usage_table` of the saved result."""
    return freq_usage_table(inputs.result)


SPEC = AnalysisSpec(
    order=10,  # (where it is listed)
    bidirectional=True,
    name="freq-usage", title="Rotary frequency usage", compute=analyze, needs_model=False,
    needs_result=True, file=FREQ_USAGE_CSV, columns=("pair", "theta", "q_share"),
    guide="The mean norm of q and k inside each rotary 2-D pair, pairs ordered by θ: large "
          "norms in the fastest pairs mark positional heads, in the slowest pairs the "
          "near-constant semantic channels.")
