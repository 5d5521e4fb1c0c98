"""Rotary frequency usage (Barbero et al., ICLR 2025): the mean norm of q and k within
each rotary 2-D pair, per layer and head, over the evaluation tokens. Low-frequency
pairs carrying large norms are the "semantic channels"; high-frequency pairs with
large norms are the positional ones."""

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int

from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.statistic import Run, StatisticSpec
from poskernel_tl.schema import Part, stored


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


class FreqUsageReducer:
    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int,
                 first: torch.Tensor, second: torch.Tensor, device="cpu"):
        f64 = dict(dtype=torch.float64, device=device)
        self.first, self.second = first.to(device), second.to(device)
        n_pairs = len(first)
        self.q_norm = torch.zeros(n_layers, n_heads, n_pairs, **f64)
        self.k_norm = torch.zeros(n_layers, n_kv_heads, n_pairs, **f64)
        self.count = [0] * n_layers

    def _pair_norm(self, x: torch.Tensor) -> torch.Tensor:
        """Σ over batch and positions of each pair's norm, per head: the norms in at least
        float32 (half precision promoted), summed in float64."""
        dt = torch.promote_types(x.dtype, torch.float32)
        a, b = x[..., self.first].to(dt), x[..., self.second].to(dt)
        return torch.hypot(a, b).sum(dim=(0, 1), dtype=torch.float64)  # [head, pair]

    def update(self, batch: LayerBatch) -> None:
        L = batch.layer
        self.q_norm[L] += self._pair_norm(batch.q)
        self.k_norm[L] += self._pair_norm(batch.k)
        self.count[L] += batch.q.shape[0] * batch.q.shape[1]

    def result(self) -> FreqUsage:
        n = torch.tensor(self.count, dtype=torch.float64, device=self.q_norm.device)[:, None,
                                                                                    None]
        return FreqUsage((self.q_norm / n).cpu().numpy(), (self.k_norm / n).cpu().numpy(),
                         self.first.cpu().numpy(), self.second.cpu().numpy())


def build(run: Run) -> FreqUsageReducer | None:
    """None for a model without rotary pairs."""
    if run.model.rotary_pairs is None:
        return None
    s = run.spec
    return FreqUsageReducer(s.n_layers, s.n_heads, s.n_kv_heads, *run.model.rotary_pairs,
                            device=run.device)


def with_theta(part: FreqUsage, reducers, run: Run) -> FreqUsage:
    """The pairs' rotation rates θ, read from the model's spec."""
    return dataclasses.replace(part, theta=run.spec.rotary_frequencies())


STATISTIC = StatisticSpec(
    "freq_usage", FreqUsage, build, "mean |q| and |k| within each rotary pair",
    state_bytes=lambda model, work: 0, finish=with_theta)

__all__ = ["STATISTIC", "FreqUsage", "FreqUsageReducer"]
