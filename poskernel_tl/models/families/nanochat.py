"""NanoChat: q and k normalised after rotary. Its attention rotates the projected q and k,
then applies a weightless RMS norm over each head (``q_norm``, ``k_norm``: the reverse of
the usual norm-then-rotate order, said only by the order of its forward). TransformerLens
hands the attention to Hugging Face's module, whose norms' outputs are what enters Q·Kᵀ:
the capture reads them as they are (rotating them again would read another product)."""

from poskernel_tl.models.families.family import Family


class NanoChat(Family):
    NAME = "NanoChat"
    MODEL_TYPES = frozenset({"nanochat"})

    def norm_after_rotary(self, attention) -> float | None:
        norm = getattr(attention, "q_norm", None)
        return None if norm is None else float(norm.eps)


FAMILY = NanoChat()
