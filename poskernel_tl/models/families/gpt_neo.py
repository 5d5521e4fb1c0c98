"""GPT-Neo: q·k enters the softmax unscaled. transformers' ``GPTNeoSelfAttention`` forms
``query @ keyᵀ`` with no 1/√d_head (the scale is folded into the weights' initialisation)
and keeps no scaling attribute to read, so the default 1/√d_head would report every logit
and g(Δ) √d_head times too small (R², scale-free, is unchanged). The load's self-check
(:mod:`poskernel_tl.models.self_check`) holds the factor to what the softmax reads."""

from poskernel_tl.models.families.family import Family


class GPTNeo(Family):
    NAME = "GPT-Neo"
    MODEL_TYPES = frozenset({"gpt_neo"})

    def logit_scale(self, hf_model) -> float | None:
        return 1.0


FAMILY = GPTNeo()
