"""The embedded encoder (all-MiniLM-L6-v2): real trained weights, loaded offline, against a
Hugging Face ``BertModel`` of the same checkpoint that no bridge ever wrapped."""

import math

import pytest
import torch
from test_models import hf_bert_qk

from poskernel_tl.data.sequences import build_sequences
from poskernel_tl.hooks import capture_qk, logit_scale, qk_hook_names
from poskernel_tl.hooks.names import scores_hook_is_logits
from poskernel_tl.models.embedded import wheel_dir
from poskernel_tl.models.loading import position_table
from poskernel_tl.models.registry import REGISTRY
from poskernel_tl.reducers.base import LayerBatch

pytestmark = pytest.mark.minilm
QK_TOL = 1e-5  # bridge hook_q/hook_k vs HF's query/key projections, float32
HIDDEN_TOL = 1e-5  # block outputs and the sentence embedding vs HF's, float32
PATTERN_TOL = 1e-5  # hook_attn_scores vs softmax(q·kᵀ/√d_head)
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby."]


@pytest.fixture(scope="module")
def reference(minilm):
    """The checkpoint as a plain ``BertModel`` (the class sentence-transformers runs)."""
    from transformers import BertModel

    model = BertModel.from_pretrained(wheel_dir(REGISTRY["minilm-l6"]), attn_implementation="eager",
                                      add_pooling_layer=False)
    return model.to(minilm.device).eval()


@pytest.fixture(scope="module")
def prose_ids(minilm):
    """Two prose windows of 128 tokens, [CLS] … [SEP]."""
    seqs = build_sequences(minilm.tokenizer, "prose", 128, 2, model_name="minilm-l6",
                           n_ctx=512)
    return seqs["input_ids"].to(minilm.device)


def test_spec_and_geometry(minilm):
    spec = minilm.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head, spec.n_ctx) == \
        (6, 12, 12, 32, 512)
    assert spec.causal is False and spec.pe == "learned-absolute"
    assert spec.rotary_frequencies() is None and minilm.rotary_pairs is None
    assert tuple(position_table(minilm.hf_model).weight.shape) == (512, 384)
    assert logit_scale(minilm.hf_model, 32) == pytest.approx(1 / math.sqrt(32))
    assert qk_hook_names(minilm.bridge, "blocks.5.attn") == ("blocks.5.attn.hook_q",
                                                             "blocks.5.attn.hook_k")
    assert minilm.attention == "eager"  # no fast path for BERT


def test_q_k_equal_hf_projections(minilm, reference, prose_ids):
    got = {}
    with torch.no_grad(), capture_qk(minilm.bridge, lambda c: got.__setitem__(
            c.layer, (c.q.clone(), c.k.clone()))) as capture:
        capture.forward(prose_ids)
    ref = hf_bert_qk(reference, prose_ids)
    assert sorted(got) == sorted(ref) == list(range(6))
    worst = max((ours - theirs).abs().max().item()
                for layer in got for ours, theirs in zip(got[layer], ref[layer]))
    assert tuple(got[0][0].shape) == (2, 128, 12, 32)
    assert worst < QK_TOL, f"max diff {worst:.3g}"


def test_hidden_states_equal_hf(minilm, reference, prose_ids):
    seen = {}
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_out" for i in range(6)]
    hooks = [(n, lambda x, hook, n=n: seen.__setitem__(n, x.clone())) for n in names]
    with torch.no_grad(), minilm.bridge.hooks(fwd_hooks=hooks):
        minilm.bridge(prose_ids)
    with torch.no_grad():
        ref = reference(prose_ids, output_hidden_states=True).hidden_states
    for name, theirs in zip(names, ref):
        diff = (seen[name] - theirs).abs().max().item()
        assert diff < HIDDEN_TOL, f"{name}: max diff {diff:.3g}"


def _embeddings(minilm, run) -> torch.Tensor:
    """sentence-transformers' output: the mean of the last hidden state over real tokens,
    L2-normalised."""
    batch = minilm.tokenizer(SENTENCES, padding=True, return_tensors="pt").to(minilm.device)
    last = run(batch)
    mask = batch["attention_mask"].unsqueeze(-1).to(last.dtype)
    return torch.nn.functional.normalize((last * mask).sum(1) / mask.sum(1), dim=-1)


def test_sentence_embeddings_match_hf_and_make_sense(minilm, reference):
    last_block = f"blocks.{minilm.spec.n_layers - 1}.hook_out"

    def bridge_last(batch):
        seen = {}
        with minilm.bridge.hooks(fwd_hooks=[(last_block, lambda x, hook: seen.update(x=x))]):
            minilm.bridge(batch["input_ids"], attention_mask=batch["attention_mask"])
        return seen["x"]

    with torch.no_grad():
        ours = _embeddings(minilm, bridge_last)
        theirs = _embeddings(minilm, lambda b: reference(**b).last_hidden_state)
    diff = (ours - theirs).abs().max().item()
    assert diff < HIDDEN_TOL, f"max diff {diff:.3g}"
    sim = ours @ ours.T
    assert sim[0, 1] > 0.6 and sim[0, 2] < 0.3, sim  # eating food ~ eating bread


def test_attn_scores_hook_is_the_pattern(minilm, prose_ids):
    """What hook_attn_scores carries on the BERT bridge (see scores_hook_is_logits)."""
    got, pattern = {}, {}
    hooks = [(f"blocks.{i}.attn.hook_pattern",
              lambda x, hook, i=i: pattern.__setitem__(i, x.clone())) for i in range(6)]
    with torch.no_grad(), minilm.bridge.hooks(fwd_hooks=hooks), capture_qk(
            minilm.bridge, lambda c: got.__setitem__(c.layer, c), scores=True) as capture:
        capture.forward(prose_ids[:1])
    assert not scores_hook_is_logits(minilm.bridge)
    for layer, c in got.items():
        logits = LayerBatch(layer, c.q, c.k, torch.arange(1), 1 / math.sqrt(32)).scores
        assert torch.equal(c.scores, pattern[layer])
        diff = (logits.softmax(-1) - c.scores).abs().max().item()
        assert diff < PATTERN_TOL, f"layer {layer}: max diff {diff:.3g} from the pattern"
        assert (logits - c.scores).abs().max().item() > 5  # ≈ 30: not the logits
