"""The plan's forward cost per kind of layer: a window's band on the sdpa path (T·w, not
T²), no [T, T] mask where the masks are described, T² everywhere on TransformerLens's path."""

import pytest
import torch
from tiny_models import arch_loaded

from poskernel_tl.hooks import banded
from poskernel_tl.plan import batching, forward_cost


def test_entries_count_the_band():
    for n, window in [(40, 16), (1300, 512), (9, 1), (30, 30), (30, 50)]:
        lag = torch.arange(n)[:, None] - torch.arange(n)[None]
        keep = (lag >= 0) & (lag < (window if window < n else n))
        assert forward_cost.kept_entries(n, window if window < n else 0) == int(keep.sum())
    assert forward_cost.banded_entries(32768, 512) < 32768 * 32768 / 25
    blocks = banded.band_blocks(1300, 512)
    assert forward_cost.banded_entries(1300, 512) == sum(
        (e - s) * (e - k) for s, e, k in blocks)


@pytest.fixture(scope="module")
def gemma(tiny_tokenizer):
    return arch_loaded("gemma3", tiny_tokenizer)


def test_kinds_of_layer_and_their_costs(gemma):
    kinds = {c.kind: c for c in forward_cost.forward_costs(gemma, 4096)}
    types = gemma.hf_model.config.layer_types
    assert set(kinds) == {"causal", "sliding 16"}
    assert kinds["sliding 16"].layers == tuple(i for i, t in enumerate(types) if "sliding" in t)
    band, causal = kinds["sliding 16"], kinds["causal"]
    assert band.computed < 4096 * (2 * banded.BAND_BLOCK + 16) and causal.work_bytes == 0
    eager = {c.kind: c for c in forward_cost.forward_costs(gemma, 4096, sdpa=False)}
    assert eager["sliding 16"].computed == 4096**2
    assert eager["sliding 16"].work_bytes > 100 * band.work_bytes
    assert "sliding 16" in forward_cost.describe(gemma, 4096)


def test_described_masks_cost_nothing(gemma):
    """On the sdpa path with described masks the per-sequence bytes are linear in T but
    for Track A's work; TransformerLens's path counts the scores and the built masks."""
    assert forward_cost.masks_described(gemma)
    assert forward_cost.mask_bytes(gemma, 1024) == 0
    assert forward_cost.mask_bytes(gemma, 1024, built=True) == 2 * 1024 * 1024 * 4
    lean = forward_cost.attention_bytes(gemma, 8192, materialised=False)
    full = forward_cost.attention_bytes(gemma, 8192, materialised=True)
    assert lean < 8192 * 8192 and full >= batching.SCORE_COPIES * 4 * 8192**2 * 4
