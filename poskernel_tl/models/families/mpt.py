"""MPT: ALiBi where ``attn_config.alibi`` is set. The model's ``build_mpt_alibi_tensor(H,
T)`` gives m_h·(s − T + 1), added after ``softmax_scale``: m_h as built (the model calls
it without ``attn_config.alibi_bias_max``, so its default of 8 is what runs)."""

from poskernel_tl.models.alibi import ramp_step
from poskernel_tl.models.families.family import Family


class Mpt(Family):
    NAME = "MPT"
    MODEL_TYPES = frozenset({"mpt"})

    def uses_alibi(self, cfg) -> bool:
        return bool(getattr(getattr(cfg, "attn_config", None), "alibi", False))

    def refusal(self, hf_model, stack) -> str | None:
        if getattr(getattr(hf_model.config, "attn_config", None), "clip_qkv", None):
            return ("MPT's clip_qkv clamps q and k after TransformerLens's hook_q/hook_k "
                    "fire: not supported")
        return None

    def alibi_slopes(self, hf_model, n_heads: int) -> tuple[float, ...]:
        inner = getattr(hf_model, "transformer", hf_model)  # the call MptModel.forward makes
        return ramp_step(inner.build_mpt_alibi_tensor(n_heads, 2), n_heads)


FAMILY = Mpt()
