"""Models that rotate only their sliding-window layers: AFMoE, Cohere 2 and EXAONE 4 (with a
window) apply RoPE in their local layers and none in their full-attention ones. Their
configs carry no ``no_rope_layers``; each attention module's forward decides by a flag of
its own, read here as that forward reads it. A full layer read as RoPE would be rotated by
the capture where the model does not (AFMoE, whose attention TransformerLens hands to Hugging
Face, hooked before rotary) or reported with frequencies it never uses (Cohere 2, EXAONE 4,
whose bridges leave those layers unrotated)."""

from poskernel_tl.models.families.family import Family


class SlidingRope(Family):
    NAME = "RoPE on sliding layers only"
    MODEL_TYPES = frozenset({"afmoe", "cohere2", "exaone4"})

    def rope_layers(self, attention: list) -> list[bool] | None:
        if any(a is None for a in attention):
            raise ValueError("its attention modules could not be paired with its layers, "
                             "and they alone say which layers rotate")
        return [_rotates(a) for a in attention]


def _rotates(attn) -> bool:
    """The condition under which the module's forward applies ``apply_rotary_pos_emb``."""
    if hasattr(attn, "is_local_attention"):  # AFMoE
        return bool(attn.is_local_attention)
    if hasattr(attn, "is_sliding"):  # EXAONE 4: every layer where the model has no window
        return attn.sliding_window is None or bool(attn.is_sliding)
    return attn.sliding_window is not None  # Cohere 2


FAMILY = SlidingRope()
