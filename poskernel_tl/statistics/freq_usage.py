"""Rotary frequency usage (Barbero et al., ICLR 2025): the mean norm of q and k within
each rotary 2-D pair, per layer and head, over the evaluation tokens. Low-frequency
pairs carrying large norms are the "semantic channels"; high-frequency pairs with
large norms are the positional ones.

Their claim, tested per condition (exploratory): the heads that attend by position —
those the atlas classes previous-token or local — carry a larger share of their q and k
norm in the high frequencies than the other heads. Per head ``hf_share`` is the q and k
norm in the rotary pairs above the median θ over the norm in all of them (the query
head's pairs and its key head's; NaN on a layer without rotary); per condition the
difference of the mean share between the two groups of heads and a one-sided
permutation p-value over heads (:func:`positional_heads_test`).
"""

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int

from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.schema import Part, stored
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec


@dataclass
class FreqUsage(Part):
    """Mean |q| and |k| inside each rotary pair; ``theta`` is the pair's rotation rate
    (set by the caller from the model's rotary module)."""

    NAME = "freq_usage"
    q_pair_norm: Float[np.ndarray, "layer head_index pair"] = stored(
        "freq_usage.npz", "q_pair_norm", finite=True)
    k_pair_norm: Float[np.ndarray, "layer kv_head_index pair"] = stored(
        "freq_usage.npz", "k_pair_norm", finite=True)
    pair_first: Int[np.ndarray, " pair"] = stored("freq_usage.npz", "pair_first")
    pair_second: Int[np.ndarray, " pair"] = stored("freq_usage.npz", "pair_second")
    theta: Float[np.ndarray, " pair"] | None = stored("freq_usage.npz", "theta",
                                                      default=None)
    rotary_layer: Bool[np.ndarray, " layer"] | None = stored("freq_usage.npz", "rotary_layer",
                                                            default=None)

    @property
    def hf_share(self) -> Float[np.ndarray, "layer head_index"]:
        """Per head, the q and k norm in the pairs above the median θ over the total."""
        q, k = self.q_pair_norm, self.k_pair_norm
        if self.theta is None or len(self.theta) != q.shape[-1]:
            return np.full(q.shape[:2], np.nan)
        high = self.theta > np.median(self.theta)
        norm = q + np.repeat(k, q.shape[1] // k.shape[1], axis=1)  # each query's key head
        share = norm[..., high].sum(-1) / norm.sum(-1)
        if self.rotary_layer is not None:
            share[~self.rotary_layer] = np.nan
        return share


def pair_split(first: torch.Tensor, second: torch.Tensor) -> tuple[int, int, int] | None:
    """(start, pairs, axis) where the pairs lie in a regular layout of d_head — dims
    start..start + 2·pairs as [2, pairs] (rotate-half: axis −2 holds the two members) or
    [pairs, 2] (interleaved: axis −1) — else None."""
    n, start = len(first), int(first[0])
    idx = torch.arange(n)
    if torch.equal(first, start + idx) and torch.equal(second, start + n + idx):
        return start, n, -2
    if torch.equal(first, start + 2 * idx) and torch.equal(second, start + 2 * idx + 1):
        return start, n, -1
    return None


class FreqUsageReducer:
    GROUPED = True  # a group of layers is one batch: its heads side by side

    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int,
                 first: torch.Tensor, second: torch.Tensor, device="cpu"):
        f64 = dict(dtype=torch.float64, device=device)
        self.first, self.second = first.to(device), second.to(device)
        self.split = pair_split(first, second)
        n_pairs = len(first)
        self.q_norm = torch.zeros(n_layers, n_heads, n_pairs, **f64)
        self.k_norm = torch.zeros(n_layers, n_kv_heads, n_pairs, **f64)
        self.count = [0] * n_layers

    def _pair_norm(self, x: torch.Tensor) -> torch.Tensor:
        """Σ over batch and positions of each pair's norm, per head: the norms in at least
        float32 (half precision promoted), summed in float64. The pairs are read as views
        where they lie in a regular layout (rotate-half or interleaved): three operations
        whatever the precision."""
        if self.split is not None:
            start, half, axis = self.split
            pairs = x[..., start:start + 2 * half].unflatten(-1, (2, half) if axis == -2
                                                             else (half, 2))
            if x.dtype in (torch.float16, torch.bfloat16):
                norm = torch.linalg.vector_norm(pairs, dim=axis, dtype=torch.float32)
            else:
                norm = torch.hypot(pairs.select(axis, 0), pairs.select(axis, 1))
        else:
            dt = torch.promote_types(x.dtype, torch.float32)
            norm = torch.hypot(x[..., self.first].to(dt), x[..., self.second].to(dt))
        return norm.sum(dim=(0, 1), dtype=torch.float64)  # [head, pair]

    def update(self, batch: LayerBatch) -> None:
        batch.add(self.q_norm, self._pair_norm(batch.q))
        batch.add(self.k_norm, self._pair_norm(batch.k))
        for L in batch.layers:
            self.count[L] += batch.q.shape[0] * batch.q.shape[1]

    def result(self) -> FreqUsage:
        n = torch.tensor(self.count, dtype=torch.float64, device=self.q_norm.device)[:, None,
                                                                                    None]
        return FreqUsage((self.q_norm / n).cpu().numpy(), (self.k_norm / n).cpu().numpy(),
                         self.first.cpu().numpy(), self.second.cpu().numpy())


def build(run: StatisticContext) -> FreqUsageReducer | None:
    """None for a model without rotary pairs."""
    if run.model.rotary_pairs is None:
        return None
    s = run.spec
    return FreqUsageReducer(s.n_layers, s.n_heads, s.n_kv_heads, *run.model.rotary_pairs,
                            device=run.device)


def with_theta(part: FreqUsage, reducers, run: StatisticContext) -> FreqUsage:
    """The pairs' rotation rates θ and which layers rotate, read from the model's spec."""
    s = run.spec
    rotary = np.array([s.layers[L].pe == "rope" for L in range(s.n_layers)]) if s.layers \
        else np.full(s.n_layers, s.pe == "rope")
    return dataclasses.replace(part, theta=s.rotary_frequencies(), rotary_layer=rotary)


POSITIONAL = ("previous-token", "local")  # the classes Barbero et al. call positional
PERMUTATIONS = 10_000


def positional_heads_test(heads: pd.DataFrame, permutations: int = PERMUTATIONS,
                          seed: int = 0) -> dict[str, float]:
    """Mean ``hf_share`` of the heads classed previous-token or local less that of the
    others, and the one-sided p-value of a permutation test over heads (the class labels
    shuffled; (1 + #{diff ≥ observed}) / (1 + permutations)); NaN where a group is empty."""
    ok = heads[np.isfinite(heads["hf_share"])]
    share = ok["hf_share"].to_numpy()
    positional = ok["kernel_class"].isin(POSITIONAL).to_numpy()
    k = int(positional.sum())
    out = {"hf_share_positional": np.nan, "hf_share_others": np.nan, "hf_share_diff": np.nan,
           "hf_share_p": np.nan, "n_positional_heads": float(k)}
    if k == 0 or k == len(share):
        return out
    diff = lambda mask: share[mask].mean() - share[~mask].mean()
    observed = diff(positional)
    rng = np.random.default_rng(seed)
    draws = rng.permuted(np.tile(positional, (permutations, 1)), axis=1)  # labels shuffled
    sums = draws @ share
    null = sums / k - (share.sum() - sums) / (len(share) - k)
    out.update(hf_share_positional=float(share[positional].mean()),
               hf_share_others=float(share[~positional].mean()), hf_share_diff=float(observed),
               hf_share_p=float((1 + (null >= observed - 1e-12).sum()) / (1 + permutations)))
    return out


STATISTIC = StatisticSpec(
    "freq_usage", FreqUsage, build, "mean |q| and |k| within each rotary pair",
    state_bytes=lambda model, work: 0, finish=with_theta,
    head_columns={"hf_share": "high-frequency share: q and k norm in the rotary pairs above "
                              "the median θ over all pairs (Barbero et al.)"},
    condition_values=positional_heads_test,
    condition_labels={
        "hf_share_positional": "high-frequency share, previous-token and local heads "
                               "(exploratory)",
        "hf_share_others": "high-frequency share, other heads (exploratory)",
        "hf_share_diff": "high-frequency share, positional heads less others (exploratory)",
        "hf_share_p": "p, permutation test over heads: positional heads carry more high "
                      "frequency (exploratory)",
        "n_positional_heads": "heads classed previous-token or local"})

__all__ = ["STATISTIC", "FreqUsage", "FreqUsageReducer", "positional_heads_test"]
