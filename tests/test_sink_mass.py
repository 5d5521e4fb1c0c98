"""The attention-sink metric (Gu et al., ICLR 2025) against a naive computation on the
input of Hugging Face's own eager softmax: per head, the mean weight on key 0 over rows
t ≥ 1, with the model's mask, soft-cap, ALiBi and learned sinks; its per-condition share
above ε = 0.3; and a planted sink head."""

import numpy as np
import pandas as pd
import pytest
import torch
from test_softmax_terms import softmax_patterns
from tiny_models import softmax_loaded, tiny_loaded

import poskernel_tl as pk
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.plan.config import MeasureConfig
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.statistics.sink_mass import EPSILON, SinkMassReducer, share_above
from poskernel_tl.statistics.statistic import StatisticContext

T = 40


@pytest.mark.parametrize("arch", ["gpt_oss", "bloom", "gemma2", "starcoder2", "llama4"])
def test_sink_mass_is_the_naive_mean_weight_on_key_0(arch, tiny_tokenizer):
    model = softmax_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(1))
    res = pk.measure(model, ids, progress=False, null_seqs=3)
    for layer, p in enumerate(softmax_patterns(arch, model, ids[:3])):
        want = p[..., 1:, 0].mean(-1).mean(0).numpy()  # rows t ≥ 1, key 0
        assert np.abs(res.sink_mass[layer] - want).max() <= 1e-6, (arch, layer)


def test_a_planted_sink_head_and_its_share(tiny_tokenizer):
    """A head whose keys are zero but at position 0 (its q·k_0 large) puts nearly all
    weight on key 0; a head with zero q puts 1/(t + 1) there; the condition's share
    counts heads above ε."""
    model = tiny_loaded("llama", tiny_tokenizer)
    n, H, d = 2, model.spec.n_heads, model.spec.d_head
    q = torch.zeros(n, T, H, d)
    q[:, :, 0, 0] = 1.0
    k = torch.zeros(n, T, model.spec.n_kv_heads, d)
    k[:, 0, :, 0] = 50.0
    run = StatisticContext(model, Geometry.of(model.spec, T), n, MeasureConfig(null_seqs=n))
    red = SinkMassReducer(run)
    red.update(LayerBatch(0, q, k, torch.arange(n), 1.0, rows=(0, 1)))
    got = red.result().sink_mass[0]
    assert got[0] > 0.999
    assert got[1] == pytest.approx(np.mean([1 / (t + 1) for t in range(1, T)]), abs=1e-9)
    heads = pd.DataFrame({"sink_mass": [got[0], got[1], EPSILON, 0.9]})
    assert share_above(heads) == {"sink_heads": 0.5}
