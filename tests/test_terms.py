"""The positional terms of a layer's softmax as registered objects: each reads itself from
a layer's config and module, describes and labels itself, says how it enters the logits
and round-trips through a result's record; a layer's SoftmaxTerms is the registry's terms
in order, whatever term is added."""

import copy
import pickle
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from poskernel_tl.models import softmax_terms
from poskernel_tl.models.softmax_terms import NONE, SoftmaxTerms
from poskernel_tl.models.terms.registry import TERMS
from poskernel_tl.models.terms.term import KINDS, LayerContext, Term


def test_the_registry_holds_each_term_once_with_its_kind():
    """The five the engine began with, in their order among the others; each term's kind
    known (a term added later is one more module, no edit here)."""
    first = {"slopes": "offset", "softcap": "nonlinear", "temperature": "row factor",
             "sinks": "normaliser", "chunk": "mask"}
    assert [n for n in TERMS if n in first] == list(first)
    assert {n: TERMS[n].KIND for n in first} == first
    assert all(t.KIND in KINDS for t in TERMS.values())
    assert [t.ORDER for t in TERMS.values()] == sorted(t.ORDER for t in TERMS.values())


def test_each_term_reads_itself_from_the_layer():
    attn = SimpleNamespace(attn_logit_softcapping=30.0, sinks=torch.tensor([0.5, -1.0]),
                           attn_temperature_tuning=True, use_rope=False, floor_scale=8,
                           attn_scale=0.1)
    cfg = SimpleNamespace(attention_chunk_size=64)
    got = SoftmaxTerms.read(LayerContext(cfg, attn, "chunked_attention", 2, (0.5, 0.25)))
    assert got == SoftmaxTerms(slopes=(0.5, 0.25), softcap=30.0, temperature=(8.0, 0.1),
                               sinks=(0.5, -1.0), chunk=64)
    assert got.additive and got.nonlinear and got.kinds() == set(KINDS)
    assert SoftmaxTerms.read(LayerContext(SimpleNamespace(), None, "full_attention", 2)) == NONE
    with pytest.raises(ValueError, match="one finite slope per query head"):
        SoftmaxTerms.read(LayerContext(cfg, None, "full_attention", 3, (0.5, 0.25)))
    with pytest.raises(ValueError, match="attention_chunk_size"):
        SoftmaxTerms.read(LayerContext(SimpleNamespace(), None, "chunked_attention", 2))


def test_terms_round_trip_and_stay_immutable():
    t = SoftmaxTerms(slopes=(0.5, 0.25), softcap=30.0, chunk=16)
    record = t.to_dict()
    assert record == {**dict.fromkeys(TERMS), "slopes": [0.5, 0.25], "softcap": 30.0,
                      "chunk": 16}  # every registered term's name, None where absent
    assert SoftmaxTerms.from_dict(record) == t and hash(SoftmaxTerms.from_dict(record)) == hash(t)
    assert pickle.loads(pickle.dumps(t)) == t and copy.deepcopy(t) is t
    assert t.slopes == (0.5, 0.25) and t.temperature is None
    assert t.replace(softcap=None) == SoftmaxTerms(slopes=(0.5, 0.25), chunk=16)
    assert t.labels() == ["alibi", "soft-cap 30", "chunk 16"]
    assert t.describe() == ("ALiBi −m·(t − s), m = 0.5 … 0.25 over 2 heads; soft-cap "
                            "30·tanh(x / 30); chunked mask, 16 positions per chunk")
    with pytest.raises(AttributeError):
        t.softcap = 1.0
    with pytest.raises(TypeError, match="unknown softmax terms"):
        SoftmaxTerms(bias_table=(1.0,))


def test_alibi_knows_its_kernel():
    ramp = SoftmaxTerms(slopes=(0.5, 0.25)).terms[0].known_kernel([1, 2, 3])
    assert ramp == [[-0.5, -1.0, -1.5], [-0.25, -0.5, -0.75]]
    assert TERMS["softcap"](30.0).known_kernel([1, 2]) is None


def test_a_new_term_is_one_class_the_rest_reads(monkeypatch):
    """A term registered beside the others (as a module of the folder would be) is read,
    listed in its order, described, recorded and read back, with no other edit."""

    @dataclass(frozen=True)
    class Doubling(Term):
        NAME, KIND, ORDER = "doubling", "row factor", 2.5

        @classmethod
        def read(cls, ctx):
            return cls(2.0) if getattr(ctx.cfg, "double_queries", False) else None

        def describe(self, values: bool = True) -> str:
            return f"queries times {self.value:g}"

    terms = dict(TERMS)
    terms = dict(sorted({**terms, "doubling": Doubling}.items(), key=lambda kv: kv[1].ORDER))
    monkeypatch.setattr(softmax_terms, "TERMS", terms)
    got = SoftmaxTerms.read(LayerContext(SimpleNamespace(double_queries=True), None,
                                         "full_attention", 2, (0.5, 0.25)))
    assert got.labels() == ["alibi", "doubling"] and got.doubling == 2.0 and got.additive
    assert got.describe().endswith("; queries times 2")
    assert SoftmaxTerms.from_dict(got.to_dict()) == got
