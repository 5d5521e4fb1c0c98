"""Barbero et al.'s frequency claim as a per-head share and a per-condition permutation
test (:mod:`poskernel_tl.statistics.freq_usage`): the share against a loop over pairs, the
test against an exhaustive enumeration of the labellings, a planted difference found, a
flat one not."""

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import tiny_loaded

import poskernel_tl as pk
from poskernel_tl.statistics.freq_usage import FreqUsage, positional_heads_test


def test_share_by_pairs():
    rng = np.random.default_rng(0)
    q, k = rng.random((2, 4, 6)), rng.random((2, 2, 6))
    theta = np.array([1.0, 0.3, 0.1, 0.03, 0.01, 0.003])  # above the median: the first 3
    part = FreqUsage(q, k, np.arange(6), np.arange(6) + 6, theta, np.array([True, False]))
    share = part.hf_share
    for h in range(4):
        norm = q[0, h] + k[0, h // 2]
        assert share[0, h] == pytest.approx(norm[:3].sum() / norm.sum(), abs=1e-15)
    assert np.isnan(share[1]).all()  # a layer without rotary
    assert np.isnan(FreqUsage(q, k, np.arange(6), np.arange(6), None).hf_share).all()


def test_p_value_equals_the_exhaustive_test():
    """With more permutations than labellings the p-value tends to the exact one: the
    share of the C(8, 3) labellings whose difference reaches the observed."""
    share = np.array([0.9, 0.8, 0.35, 0.5, 0.3, 0.2, 0.6, 0.1])
    cls = ["previous-token", "local", "content", "other", "local", "sink", "decay", "other"]
    got = positional_heads_test(pd.DataFrame({"hf_share": share, "kernel_class": cls}),
                                permutations=200_000)
    pos = np.isin(cls, ["previous-token", "local"])
    observed = share[pos].mean() - share[~pos].mean()
    diffs = [share[list(c)].mean() - np.delete(share, list(c)).mean()
             for c in itertools.combinations(range(8), 3)]
    exact = np.mean(np.array(diffs) >= observed - 1e-12)
    assert got["hf_share_diff"] == pytest.approx(observed)
    assert got["hf_share_p"] == pytest.approx(exact, abs=0.005)
    assert got["n_positional_heads"] == 3


def test_planted_and_flat():
    rng = np.random.default_rng(1)
    cls = np.array(["local"] * 20 + ["content"] * 80)
    planted = np.where(cls == "local", 0.7, 0.5) + rng.normal(0, 0.05, 100)
    flat = rng.normal(0.5, 0.05, 100)
    frame = lambda s: pd.DataFrame({"hf_share": s, "kernel_class": cls})
    assert positional_heads_test(frame(planted))["hf_share_p"] < 0.001
    assert positional_heads_test(frame(flat))["hf_share_p"] > 0.05
    none = positional_heads_test(pd.DataFrame({"hf_share": flat, "kernel_class": "content"}))
    assert np.isnan(none["hf_share_p"]) and none["n_positional_heads"] == 0


def test_the_columns_of_a_measurement(tiny_tokenizer):
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 290, (3, 24), generator=torch.Generator().manual_seed(0))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    heads = res.kernels()
    assert np.allclose(heads["hf_share"], res.parts["freq_usage"].hf_share.ravel())
    assert 0 < heads["hf_share"].min() and heads["hf_share"].max() < 1
    assert {"hf_share_p", "hf_share_diff"} <= set(res.condition_values())
