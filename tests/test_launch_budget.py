"""The launch budget of the kernels' path, counted on the CPU under Triton's interpreter
(:mod:`poskernel_tl.measurement.launches`): per batch of the evaluation pass, every
default statistic of every layer together costs a bounded number of kernel launches
beyond the model's own forward — the same for 4 layers as for 16 of the same width, and
at any length — and no device→host read (a GPU's host would wait for the queue there:
``.item()``, a boolean index, ``.cpu()``, an upload); docs/explanation/performance.md,
"On a GPU"."""

import pytest
import torch
import transformers as tf

pytest.importorskip("triton")

from tiny_models import VOCAB  # noqa: E402

from poskernel_tl import kernels  # noqa: E402
from poskernel_tl.hooks.fast_attention import set_attention  # noqa: E402
from poskernel_tl.kernels.launch_count import SyncCount, counting  # noqa: E402
from poskernel_tl.measurement.launches import batch_cost  # noqa: E402
from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe  # noqa: E402
from poskernel_tl.models.registry import placeholder_spec  # noqa: E402

interpreted = pytest.mark.skipif(not kernels.interpreting(), reason="counts the kernels' "
                                 "path on CPU tensors (TRITON_INTERPRET=1)")

BUDGET = 60  # launches per batch for every layer of one kind together
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=2,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2)
# one sequence per batch, 2 then 3 batches: what Triton's interpreter runs in a minute for
# 16 layers (the counts do not depend on the batch, the kernels' work does)
COUNT = dict(batch_size=1, short=2, long=3)


def booted(cfg, tokenizer) -> LoadedModel:
    """A tiny random model of ``cfg`` booted on the project's default (sdpa) path."""
    cls = tf.AutoModelForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = cls.from_config(cfg).eval()
    hf.config.architectures = [type(hf).__name__]
    spec = describe(hf, placeholder_spec(f"tiny-{cfg.model_type}", hub_id=None))
    bridge = boot_bridge(hf, tokenizer, device=torch.device("cpu"))
    return LoadedModel(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf,
                       attention=set_attention(bridge, "sdpa"))


def llama(n_layers: int, tokenizer) -> LoadedModel:
    return booted(tf.LlamaConfig(**COMMON, num_hidden_layers=n_layers, num_key_value_heads=1),
                  tokenizer)


@interpreted
@pytest.mark.slow  # the default suite counts a batch of Gemma 3 (below): the same path
@pytest.mark.parametrize("deep", [16])
def test_launches_per_batch_do_not_grow_with_layers_or_length(deep, tiny_tokenizer):
    """4 layers at T = 32 and 64, ``deep`` layers of the same width at T = 32: the same
    count, within the budget, and no host read; the model's own forward grows with the
    layers (the counter sees it)."""
    models = {n: llama(n, tiny_tokenizer) for n in (4, deep)}
    costs = {(n, T): batch_cost(models[n], T, **COUNT)
             for n, T in ((4, 32), (4, 64), (deep, 32))}
    counts = {key: cost.launches for key, cost in costs.items()}
    assert len(set(counts.values())) == 1, counts
    assert max(counts.values()) <= BUDGET, {k: c.by_name for k, c in costs.items()}
    assert all(cost.syncs == 0 for cost in costs.values()), \
        {k: c.syncs_by_name for k, c in costs.items()}
    assert costs[deep, 32].forward_launches > 0.75 * deep / 4 * costs[4, 32].forward_launches


@interpreted
def test_a_second_kind_of_layer_costs_one_more_budget(tiny_tokenizer):
    """Gemma 3's sliding-window and global layers are two kinds: at most two budgets (the
    kinds interleaved, each kind's layers apart: 117 launches, as for 6 layers in Gemma 3's
    own order)."""
    cfg = tf.Gemma3TextConfig(**COMMON, num_hidden_layers=4, num_key_value_heads=1,
                              head_dim=16, sliding_window=16, query_pre_attn_scalar=16,
                              layer_types=["sliding_attention", "full_attention"] * 2)
    cost = batch_cost(booted(cfg, tiny_tokenizer), 24, **COUNT)  # (the window binds past 16)
    assert cost.launches <= 2 * BUDGET and cost.syncs == 0, (cost.by_name,
                                                            cost.syncs_by_name)


def test_the_counters_see_what_they_count():
    """A scalar read, a boolean index, a data-sized output and an upload are each one read;
    views and empty allocations launch nothing."""
    x = torch.randn(8)
    with counting() as (launched, synced):
        float(x.sum())  # a launch (sum) and a read
        x[x > 0]  # gt, index (and a read)
        torch.tensor([1, 2])  # an upload
        x.view(2, 4)
        torch.empty(3)
    assert synced.by_name["_local_scalar_dense"] == 1 and synced.by_name["index"] == 1
    assert synced.by_name["lift_fresh"] == 1 and synced.total == 3, synced.by_name
    assert launched.by_name["sum"] == 1 and "view" not in launched.by_name
    assert "empty" not in launched.by_name, launched.by_name
    with SyncCount() as s:
        x.cpu()
        x.tolist()
        x.to("cpu")
        x.to(torch.float64)  # (no device named: not counted)
    assert s.by_name == {".cpu": 1, ".tolist": 1, ".to": 1}, s.by_name
