"""Mean attention distance (``reducers/attn_distance.py``): per query row Σ_s p(t, s)·|t − s|
against a naive computation on the input of Hugging Face's own eager softmax (mask,
soft-cap, ALiBi, temperature and learned sinks), against TransformerLens's
``hook_pattern``, on planted heads, and its declared panel in the report's head view and in
``pk.inspect_head``'s."""

import json

import numpy as np
import pytest
import torch
from test_softmax_terms import softmax_patterns
from tiny_models import softmax_loaded, tiny_loaded

import poskernel_tl as pk
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.plan.config import MeasureConfig
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.report.head_page import declared
from poskernel_tl.statistics.attn_distance import AttnDistanceReducer
from poskernel_tl.statistics.statistic import StatisticContext

T = 40
TITLE = "Attention distance by query row"


def naive_rows(p: torch.Tensor) -> np.ndarray:
    """[n, H, T, T] pattern -> [H, T] mean over sequences of Σ_s p(t, s)·|t − s|."""
    offset = (torch.arange(p.shape[-1])[:, None] - torch.arange(p.shape[-1])[None]).abs()
    return (p.double() * offset).sum(-1).mean(0).numpy()


@pytest.mark.parametrize("arch", ["gpt_oss", "bloom", "gemma2", "starcoder2", "llama4"])
def test_distance_is_the_naive_one_on_what_the_softmax_reads(arch, tiny_tokenizer):
    model = softmax_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(1))
    res = pk.measure(model, ids, progress=False, null_seqs=3)
    for layer, p in enumerate(softmax_patterns(arch, model, ids[:3])):
        want = naive_rows(p)
        assert np.abs(res.attn_distance_rows[layer] - want).max() <= 1e-5, (arch, layer)
        assert np.abs(res.attn_distance[layer] - want.mean(-1)).max() <= 1e-5


def test_distance_equals_transformer_lens_pattern(tiny_tokenizer):
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(3))
    res = pk.measure(model, ids, progress=False, null_seqs=3)
    _, cache = model.bridge.run_with_cache(ids[:3])
    for layer in range(model.spec.n_layers):
        want = naive_rows(cache[f"blocks.{layer}.attn.hook_pattern"])
        assert np.abs(res.attn_distance_rows[layer] - want).max() <= 1e-5


def test_planted_uniform_and_previous_token_heads(tiny_tokenizer):
    """q = 0: every key s ≤ t alike, d(t) = t / 2; a query that matches the previous
    position's key alone: d(t) = 1 (t ≥ 1)."""
    model = tiny_loaded("llama", tiny_tokenizer)
    n, H, d = 2, model.spec.n_heads, model.spec.d_head
    q = torch.zeros(n, T, H, d)
    k = torch.zeros(n, T, model.spec.n_kv_heads, d)
    w = torch.pi / T  # q_t·k_s ∝ cos(w (t − 1 − s)): largest at s = t − 1 alone
    angle = lambda x: 300 * torch.stack([torch.cos(w * x), torch.sin(w * x)], -1)
    q[:, :, 1, :2] = angle(torch.arange(T, dtype=torch.float64) - 1).float()
    k[:, :, 0, :2] = angle(torch.arange(T, dtype=torch.float64)).float()
    run = StatisticContext(model, Geometry.of(model.spec, T), n, MeasureConfig(null_seqs=n))
    red = AttnDistanceReducer(run)
    red.update(LayerBatch(0, q, k, torch.arange(n), 1.0, rows=(0, 1)))
    out = red.result()
    np.testing.assert_allclose(out.attn_distance_rows[0, 0], np.arange(T) / 2, atol=1e-5)
    assert np.abs(out.attn_distance_rows[0, 1, 1:] - 1).max() < 1e-5
    assert out.attn_distance[0, 0] == pytest.approx((T - 1) / 4, abs=1e-5)


def test_its_panel_shows_in_the_report_and_in_inspect_head(tiny_tokenizer, tmp_path):
    """The declared curve reaches the report's page of every head (the saved rows) and
    inspect_head's page (this sequence's rows, from its pattern)."""
    from test_viewer import typed

    from poskernel_tl.report.build import build_report
    from poskernel_tl.report.viewer import head_payload

    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(5))
    res = pk.measure(model, ids, progress=False, null_seqs=3, dataset="random")
    res.save(tmp_path)
    page = build_report(tmp_path, workers=1)
    text = (page.parent / "data" / f"{res.stem()}.js").read_text(encoding="utf-8")
    heads = json.loads(text[text.index(" = {") + 3:-2])["heads"]
    for layer in range(model.spec.n_layers):
        for head in range(model.spec.n_heads):
            mine = [p for p in heads[layer * model.spec.n_heads + head]["panels"]
                    if p["section"] == TITLE]
            assert len(mine) == 1 and mine[0]["series"][0]["first"] == 0
            np.testing.assert_array_equal(typed(mine[0]["series"][0]["y"]), res.attn_distance_rows[
                layer, head].astype(np.float32))
    view = pk.inspect_head(model, ids[0], layer=1, head=2)
    want = naive_rows(torch.as_tensor(view.pattern)[None, None])[0]
    payload = head_payload(view.page_data())
    mine = [p for p in payload["panels"] if p["section"] == TITLE]
    assert len(mine) == 1
    np.testing.assert_allclose(typed(mine[0]["series"][0]["y"]), want, atol=1e-5)
    numbers, panels = declared(view.parts, 1, 2)
    assert TITLE in [p["section"] for p in panels]


def test_the_docs_show_the_declared_panel():
    """docs/how-to/add-panel.md shows the panel as declared."""
    import inspect
    import re
    from pathlib import Path

    from poskernel_tl.statistics import attn_distance

    text = (Path(__file__).parents[1] / "docs" / "how-to" / "add-panel.md").read_text()
    section = text[text.index("A statistic shows more than a number"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code in inspect.getsource(attn_distance)
