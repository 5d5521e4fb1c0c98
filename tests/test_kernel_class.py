"""Kernel descriptors and classes: planted heads come out in their classes, and the row
shares equal a naive softmax of the kernel."""

import numpy as np
import pytest
import torch
from masks import masks
from test_toeplitz import naive_r2

from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.kernel_class import head_kernels, row_shares
from poskernel_tl.reducers import LayerBatch, TrackAReducer
from poskernel_tl.statistics import PermNullReducer

B = 8
PLANTED = ("previous-token", "sink", "local", "periodic", "decay", "content")


def planted_logits(T: int, seed: int) -> torch.Tensor:
    """[B, head, T, T] logits of one head per class, plus unit content noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(T, dtype=torch.float64)
    lag = t[:, None] - t[None]
    pos = torch.stack([
        6.0 * (lag == 1),  # previous token
        6.0 * (t[None] == 0).expand(T, T),  # the sink: key 0
        torch.where(lag <= 6, 0.0, -10.0),  # a local window of 6 offsets
        3.0 * torch.cos(2 * np.pi * lag / 16),  # periodic (a RoPE pair of θ = 2π/16)
        -0.5 * torch.log(lag.clamp(min=1)),  # slow power-law decay
        torch.zeros(T, T, dtype=torch.float64),  # content only
    ])
    return pos[None] + torch.randn(B, len(pos), T, T, generator=g, dtype=torch.float64)


def classify(T: int, seed: int = 0):
    """The planted logits through Track A and its null as a model would give them: q = I
    and k = Aᵀ make q_t·k_s = A[t, s] exactly (d_head = T, scale 1)."""
    A = planted_logits(T, seed)
    H = A.shape[1]
    q = torch.eye(T, dtype=torch.float64)[None, :, None].expand(B, T, H, T)
    k = A.permute(0, 3, 1, 2)  # k[b, s, h, :] = A[b, h, :, s]
    red = TrackAReducer(B, masks(T), H)
    null = PermNullReducer(masks(T), H, n_perm=19, max_seqs=B)
    for r in (red, null):
        for start in range(0, B, 4):
            idx = torch.arange(start, start + 4)
            r.update(LayerBatch(0, q[idx], k[idx], idx, 1.0, rows=tuple(idx.tolist())))
    a = red.result()
    counts = lag_counts(T).numpy()[None]
    return head_kernels(a.g_pooled, a.g_sink, counts, a.r2_pooled,
                        null.result().r2_null, thetas=np.array([1.0, 2 * np.pi / 16, 0.1]))


@pytest.mark.parametrize("T", [128, 256])
def test_planted_heads_come_out_in_their_classes(T):
    df = classify(T)
    assert list(df["kernel_class"]) == list(PLANTED), df.to_string()
    periodic = df.iloc[3]
    assert periodic["periodic_theta"] == pytest.approx(2 * np.pi / 16)
    assert periodic["periodic_share"] > 0.8
    assert df.iloc[0]["peak_lag"] == 1 and df.iloc[2]["width"] <= 6
    assert df.iloc[4]["decay_slope"] == pytest.approx(-0.5, abs=0.05)


def naive_shares(g_ns, g_sink, g_back=None):
    """The mean over rows of the softmax mass on key t − 1 and on key 0, row by row."""
    T = len(g_ns) + 1
    prev, sink = [], []
    for t in range(1, T):
        logits = {0: g_sink[t - 1], **{s: g_ns[t - s - 1] for s in range(1, t)}}
        if g_back is not None:
            logits.update({s: g_back[s - t - 1] for s in range(t + 1, T)})
        keys = [s for s, v in logits.items() if np.isfinite(v)]
        p = np.exp([logits[s] for s in keys])
        p = dict(zip(keys, p / p.sum()))
        prev.append(p.get(t - 1, 0.0))
        if t >= 2:
            sink.append(p.get(0, 0.0))
    return np.mean(prev), np.mean(sink)


@pytest.mark.parametrize("two_sided,window", [(False, None), (True, None), (False, 5)])
def test_row_shares_equal_a_naive_softmax(rng, two_sided, window):
    T = 12
    g_ns, g_sink, g_back = (np.random.default_rng(3 + i).normal(0, 2, T - 1)
                            for i in range(3))
    if window:
        g_ns[window:] = np.nan
        g_sink[window:] = np.nan
    back = g_back if two_sided else None
    prev, sink = row_shares(g_ns[None], g_sink[None], None if back is None else back[None])
    want = naive_shares(g_ns, g_sink, back)
    assert prev[0] == pytest.approx(want[0], abs=1e-12)
    assert sink[0] == pytest.approx(want[1], abs=1e-12)


def test_a_flat_or_random_kernel_is_never_previous_token_or_local():
    """No positional structure: R² within its null, whatever the descriptors say."""
    rng = np.random.default_rng(0)
    T, H = 200, 16
    g = rng.normal(0, 0.01, (1, H, T - 1))
    counts = lag_counts(T).numpy()[None]
    null = rng.uniform(0.0, 0.02, (9, 1, H))
    df = head_kernels(g, g[..., :], counts, null.max(0) * rng.uniform(0.5, 1.0, (1, H)), null)
    assert set(df["kernel_class"]) == {"content"}


@pytest.mark.parametrize("T", [128, 256])
def test_a_head_view_classes_one_sequence(T):
    """The head view's class of one sequence's fit, against the view's own permutation
    null: each planted head of one sequence in its class, and the null equal to naive fits
    of the permuted matrices."""
    from poskernel_tl.apps.head_view import fit_one, kernel_of, position_permutation_null
    from poskernel_tl.statistics.perm_null import joint_permutations

    A = planted_logits(T, seed=1)[0]
    got = [kernel_of(fit_one(a, True), a, None, np.array([2 * np.pi / 16]))["kernel_class"]
           for a in A]
    assert got == list(PLANTED)
    a = A[5]
    naive = [naive_r2(a[p][:, p].numpy())[0] for p in joint_permutations(T, 19)]
    assert position_permutation_null(a, True, None) == pytest.approx(naive, abs=1e-9)
