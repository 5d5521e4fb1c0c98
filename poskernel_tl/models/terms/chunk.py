"""A chunked causal mask (Llama 4): query t reads the keys s ≤ t of its own chunk of
``value`` positions (⌊s / C⌋ = ⌊t / C⌋). For T ≤ chunk it keeps every causal entry; past
it every fit reads the entries of one chunk, counted by the mask
(:meth:`~poskernel_tl.models.geometry.Geometry.chunk`,
:func:`~poskernel_tl.models.softmax_ops.chunk_qk`)."""

from dataclasses import dataclass

from poskernel_tl.models.terms.term import LayerContext, Term


@dataclass(frozen=True)
class Chunk(Term):
    NAME = "chunk"
    KIND = "mask"
    ORDER = 4

    @classmethod
    def read(cls, ctx: LayerContext) -> "Chunk | None":
        """From ``layer_type == "chunked_attention"`` and ``config.attention_chunk_size``."""
        if ctx.layer_type != "chunked_attention":
            return None
        chunk = getattr(ctx.cfg, "attention_chunk_size", None)
        if not isinstance(chunk, int) or chunk < 1:
            raise ValueError("a chunked-attention layer without an integer "
                             "config.attention_chunk_size")
        return cls(chunk)

    @classmethod
    def from_value(cls, value) -> "Chunk":
        return cls(int(value))

    def label(self) -> str:
        return f"chunk {self.value}"

    def describe(self, values: bool = True) -> str:
        return f"chunked mask, {self.value} positions per chunk"


TERM = Chunk
