"""A ConditionResult built from arrays, for tests of everything downstream of measure."""

import numpy as np

from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.registry import ModelSpec


def make_result(spec: ModelSpec, length: int, *, g: np.ndarray | None = None,
                r2: np.ndarray | None = None, dataset: str = "wikipedia",
                centered: bool = True, n_seqs: int = 4, s_pe: np.ndarray | None = None,
                usage: np.ndarray | None = None, seed: int = 0) -> ConditionResult:
    """Random arrays of the right shapes; ``g`` (Track A and both Gram g's), ``r2``
    (pooled R² everywhere) and ``usage`` (q_pair_norm, θ order) override them."""
    rng = np.random.default_rng(seed)
    L, H, Hkv, d, T = spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head, length
    r2 = rng.uniform(0, 1, (L, H)) if r2 is None else np.asarray(r2, np.float64)
    g = rng.standard_normal((L, H, T - 1)) if g is None else np.asarray(g, np.float64)
    nan = np.full((L, H), np.nan)
    fields = dict(
        model=spec.name, dataset=dataset, length=T, spec=spec, seq_id=np.arange(n_seqs),
        r2_per_seq=np.clip(r2 + rng.normal(0, 0.02, (n_seqs, L, H)), 0, 1),
        r2_per_seq_nosink=np.clip(r2 + rng.normal(0, 0.02, (n_seqs, L, H)), 0, 1),
        g_per_seq=np.repeat(g[None], n_seqs, 0).astype(np.float32), r2_pooled=r2,
        r2_pooled_nosink=r2 * 0.9, g_pooled=g, r2_pooled_early=r2 * 0.8,
        r2_pooled_interior=r2, r2_pooled_interior_keys=r2,
        r2_split=np.repeat(r2[None], 5, 0), centered=centered,
        r2_gram=r2 if centered else nan, g_gram=g if centered else np.full_like(g, np.nan),
        r2_gram_raw=r2, g_gram_raw=g, r2_gram_half=r2 if centered else nan,
        n_centering=n_seqs if centered else 0, s_pe=s_pe)
    if centered:
        fields.update(mean_q=rng.standard_normal((L, H, T, d)).astype(np.float32),
                      mean_k=rng.standard_normal((L, Hkv, T, d)).astype(np.float32))
    if usage is not None:
        fields.update(q_pair_norm=np.asarray(usage, np.float64),
                      k_pair_norm=np.ones((L, Hkv, d // 2)), pair_first=np.arange(d // 2),
                      pair_second=np.arange(d // 2) + d // 2)
    return ConditionResult(**fields)
