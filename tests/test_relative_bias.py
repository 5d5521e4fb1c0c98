"""The learned relative-position bias (T5's and MPNet's bucketed table) as a positional
term: read from the model's own bias function, equal to it at every offset and past the
probe, recorded and read back, refused where the bias is no function of the offset, and
recovered exactly from a head whose q·k is nothing."""

import numpy as np
import pytest
import torch
from masks import masks
from transformers import MPNetConfig, MPNetForMaskedLM, T5Config, T5ForConditionalGeneration

from poskernel_tl.models.scheme_reader import attention_modules, read_terms
from poskernel_tl.models.softmax_terms import SoftmaxTerms
from poskernel_tl.models.terms.relative_bias import RelativeBias
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.track_a import TrackAReducer

H = 4


def tiny_t5(**overrides):
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=300, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=H,
                   relative_attention_num_buckets=8, relative_attention_max_distance=20,
                   **overrides)
    return T5ForConditionalGeneration(cfg).eval()


def tiny_mpnet():
    torch.manual_seed(0)
    cfg = MPNetConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=H, intermediate_size=128)
    return MPNetForMaskedLM(cfg).eval()


def terms_of(model, attn) -> SoftmaxTerms:
    return read_terms(model.config, attn, "full_attention", H, None, model)


def the_models_bias(model, attn, T: int) -> torch.Tensor:
    """[head, T, T] as the model adds it to its logits."""
    with torch.no_grad():
        if hasattr(attn, "compute_bias"):
            first = attn if attn.has_relative_attention_bias else next(
                m for m in model.modules() if type(m) is type(attn)
                and m.has_relative_attention_bias and m.is_decoder == attn.is_decoder)
            return first.compute_bias(T, T)[0].double()
        return model.mpnet.encoder.compute_position_bias(torch.zeros(1, T, 1))[0].double()


def known(terms: SoftmaxTerms, T: int) -> torch.Tensor:
    lags = range(1 - T, T)
    term = next(t for t in terms.terms if isinstance(t, RelativeBias))
    table = torch.tensor(term.known_kernel(lags), dtype=torch.float64)
    t = torch.arange(T)
    return table[:, t[:, None] - t[None] + T - 1]


@pytest.mark.parametrize("which", ["t5 encoder layer 1", "t5 decoder layer 1", "mpnet"])
@pytest.mark.parametrize("T", [9, 300, 1500])
def test_the_term_is_the_models_own_bias(which, T):
    """Every layer of a stack reads its stack's table (T5's second layer keeps none of its
    own); b_h(t − s) equals the model's own bias at every entry, past the probe too."""
    if which == "mpnet":
        model = tiny_mpnet()
        attn = attention_modules(model)[1]
    else:
        model = tiny_t5()
        attns = attention_modules(model)  # encoder 0, 1; decoder 0 self, 0 cross, 1 self, …
        attn = attns[1] if "encoder" in which else attns[4]
        assert not attn.has_relative_attention_bias
    terms = terms_of(model, attn)
    assert [t.NAME for t in terms.terms] == ["relative_bias"]
    assert not terms.bilinear and not terms.additive
    want = the_models_bias(model, attn, T)
    assert torch.equal(known(terms, T), want)


def test_each_stack_has_its_own_table_and_sides():
    model = tiny_t5()
    attns = attention_modules(model)
    enc, dec = terms_of(model, attns[0]), terms_of(model, attns[2])
    assert "two-sided" in enc.describe() and "one-sided" in dec.describe()
    assert "7 buckets" in enc.describe()  # 8 buckets, one of them never used (T5's rp > 0 at 0)
    assert enc != dec


def test_a_layer_with_its_own_table_reads_its_own():
    model = tiny_t5()
    attns = attention_modules(model)
    attns[1].has_relative_attention_bias = True  # as UMT5's layers each keep one
    attns[1].relative_attention_bias = torch.nn.Embedding(8, H)
    assert terms_of(model, attns[1]) != terms_of(model, attns[0])
    assert torch.equal(known(terms_of(model, attns[1]), 40),
                       the_models_bias(model, attns[1], 40))


def test_the_record_reads_back():
    model = tiny_mpnet()
    terms = terms_of(model, attention_modules(model)[0])
    again = SoftmaxTerms.from_dict(terms.to_dict())
    assert again == terms and hash(again) == hash(terms)
    assert "constant past |Δ| = 91" in terms.describe()  # MPNet: 16 buckets a side, 8 exact


def test_a_bias_that_is_no_function_of_the_offset_is_refused(monkeypatch):
    model = tiny_t5()
    attn = attention_modules(model)[0]
    real = type(attn).compute_bias

    def by_position(self, q, k, *args, **kwargs):
        out = real(self, q, k, *args, **kwargs).clone()
        out[..., 3, :] += 1.0  # one query row shifted
        return out
    monkeypatch.setattr(type(attn), "compute_bias", by_position)
    with pytest.raises(ValueError, match="no function of the offset"):
        terms_of(model, attn)


def test_a_model_without_a_table_has_no_term():
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=1, num_attention_heads=H,
                     intermediate_size=128)
    model = BertForMaskedLM(cfg)
    assert terms_of(model, attention_modules(model)[0]).relative_bias is None


@pytest.mark.parametrize("causal", [True, False])
def test_a_content_free_head_recovers_the_table(causal):
    """q = k = 0: Track A's R² is 1 and g(Δ) is T5's table at every offset."""
    model = tiny_t5()
    attn = attention_modules(model)[2 if causal else 0]
    terms = terms_of(model, attn)
    T = 40
    q = torch.zeros(2, T, H, 8)
    red = TrackAReducer(2, masks(T, causal=causal), H)
    red.update(LayerBatch(0, q, q, torch.arange(2), 1.0, rows=(0, 1), terms=terms))
    res = red.result()
    bias = the_models_bias(model, attn, T).numpy()
    assert np.allclose(res.r2_pooled[0], 1.0, atol=1e-9)
    g_want = np.stack([[bias[h, d, 0] for d in range(1, T)] for h in range(H)])
    assert np.abs(res.g_pooled[0] - g_want).max() <= 1e-6
    if not causal:
        back = np.stack([[bias[h, 0, d] for d in range(1, T)] for h in range(H)])
        assert np.abs(res.g_pooled_back[0] - back).max() <= 1e-6
