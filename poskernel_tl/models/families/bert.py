"""BERT: a bidirectional encoder (every query reads every key), loaded as its masked-LM
class, the one TransformerLens's BERT bridge wraps (a bare ``BertModel`` checkpoint, e.g.
sentence-transformers', loads with that head left as initialised: nothing reads the
model's output). Its bridge fires ``hook_attn_scores`` on the post-softmax pattern
(:func:`~poskernel_tl.hooks.names.scores_hook_is_logits`)."""

from poskernel_tl.models.families.family import Family


class Bert(Family):
    NAME = "BERT"
    MODEL_TYPES = frozenset({"bert"})
    LOADS_AS = "masked"
    CAUSAL = False


FAMILY = Bert()
