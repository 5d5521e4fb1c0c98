"""What is particular to one model family, in one file: how its checkpoint loads, which
stacks of self-attention layers it has and where the bridge hooks them, what the generic
reading of its config gets wrong, what must be done before TransformerLens boots it (an
adapter of the project's), and what of it is not measured (said in one line). The generic
loading and scheme reading (:mod:`~poskernel_tl.models.loading`,
:mod:`~poskernel_tl.models.scheme_reader`) read a model's :class:`Family` where one claims
its ``config.model_type``; every other model takes the generic path.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

from poskernel_tl.models.scheme import SLIDING_TYPES, UnreadableSchemeError


@dataclass(frozen=True)
class Stack:
    """One stack of self-attention layers: its name (the suffix ``@name`` of a model name
    chooses it), whether its mask is causal, and ``site``, the bridge's hook prefix of
    layer i's self-attention (a format string of ``i``)."""

    name: str
    causal: bool
    site: str


class Family:
    """A model family (module docstring); subclasses set the class attributes and, where
    they differ from the defaults, the methods."""

    NAME: ClassVar[str]
    MODEL_TYPES: ClassVar[frozenset[str]]
    # the transformers class the checkpoint loads as: "causal" (AutoModelForCausalLM),
    # "masked" (AutoModelForMaskedLM) or "seq2seq" (AutoModelForSeq2SeqLM)
    LOADS_AS: ClassVar[str] = "causal"
    CAUSAL: ClassVar[bool] = True  # a model of one stack: False for an encoder
    STACKS: ClassVar[tuple[Stack, ...]] = ()  # an encoder-decoder's; the first the default
    NORM: ClassVar[str | None] = None  # "rmsnorm" | "layernorm" where the names do not say

    def stack(self, name: str | None) -> Stack:
        """The stack ``name`` (None: the first); refused in one line naming the stacks
        there are."""
        if name is None:
            return self.STACKS[0]
        found = next((s for s in self.STACKS if s.name == name), None)
        if found is None:
            raise UnreadableSchemeError(f"{self.NAME} has no stack {name!r}; its stacks: "
                             + ", ".join(s.name for s in self.STACKS))
        return found

    def uses_alibi(self, cfg: Any) -> bool:
        """Whether the config's attention adds an ALiBi bias."""
        return False

    def alibi_slopes(self, hf_model: Any, n_heads: int) -> tuple[float, ...]:
        """m_h per query head on the scale of the softmax's input, read by calling the
        model's own builder (:func:`~poskernel_tl.models.alibi.ramp_step`); only asked
        where :meth:`uses_alibi`."""
        raise ValueError(f"{self.NAME}: no ALiBi slopes")

    def logit_scale(self, hf_model: Any) -> float | None:
        """The factor on q·k where the attention modules keep none to read and it is not
        1/√d_head (None: read from the modules)."""
        return None

    def rope_layers(self, attention: list) -> list[bool] | None:
        """Per attention layer (its Hugging Face module, in order), whether its forward
        applies the model's rotary, where the config does not say (None: every layer of a
        RoPE model rotates, but those ``no_rope_layers`` leaves out)."""
        return None

    def norm_after_rotary(self, attention: Any) -> float | None:
        """ε of a weightless RMS norm the layer's attention module (Hugging Face's) applies
        to q and k after rotary, where its forward does so and no module name says it
        (None: none, or Llama 4's ``qk_norm``, read by name)."""
        return None

    def prepare(self, hf_model: Any) -> None:
        """What must be done before a bridge is booted around ``hf_model`` (register an
        adapter TransformerLens lacks); nothing by default."""

    def attention(self, hf_model: Any, stack: Stack) -> list:
        """The Hugging Face self-attention module of every layer of ``stack``, in order."""
        raise NotImplementedError

    def stack_module(self, hf_model: Any, stack: Stack) -> Any:
        """The Hugging Face module of ``stack`` (where its own rotary table is kept)."""
        raise NotImplementedError

    def stack_config(self, cfg: Any, stack: Stack) -> Any:
        """The config ``stack``'s layers read (layer types, window, soft-cap): the model's
        own by default, a sub-config where the stacks keep their own."""
        return cfg

    def window_reach(self, cfg: Any, layer_type: str, layer: int) -> int | None:
        """The last offset |t − s| layer ``layer`` (of type ``layer_type``) of a
        bidirectional stack keeps (None: every offset), asked of every such layer: by
        default a full layer keeps every offset, and a sliding one is refused (a ValueError:
        its rule is not read)."""
        if layer_type in SLIDING_TYPES:
            raise ValueError(f"{self.NAME}: a two-sided sliding window whose rule is not "
                             "read")
        return None

    def softmax_input(self, hf_model: Any, x: Any, length: int) -> Any:
        """The input ``x`` of one of the model's softmax calls over its last axis as
        [batch, head, T, T] (−inf where the mask removes an entry), where the family's
        attention lays it out otherwise (Longformer's band); None: not such a call (the
        self-check then reads a [batch, head, T, ≥ T] or [batch·head, T, T] input as it is)."""
        return None

    def geometry(self, cfg: Any, stack: Stack | None) -> dict:
        """What the generic reading of the config gets wrong for this family (a
        :class:`~poskernel_tl.models.registry.ModelSpec`'s fields); ``stack`` None for a
        model of one stack."""
        return {}

    def refusal(self, hf_model: Any, stack: Stack | None) -> str | None:
        """Why ``stack`` (None: the model of one stack) is not measured, in one line, or
        None."""
        return None

    def note(self, hf_model: Any) -> str:
        """One line on what is measured of a model of this family (``poskernel models``,
        the report)."""
        return ""


__all__ = ["Family", "Stack"]
