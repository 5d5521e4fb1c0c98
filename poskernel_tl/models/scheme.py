"""Each layer's own positional scheme, read from the Hugging Face model itself.

Models mix schemes per layer: Gemma 3's local layers attend within a 512-token sliding
window with RoPE base 10,000 beside global layers with base 1,000,000; SmolLM3 leaves
RoPE out of every fourth layer; GPT-NeoX rotates a quarter of each head's dimensions and
GPT-J pairs neighbouring dimensions. A :class:`LayerScheme` says, for one layer, what
enters its logits:

- ``pe``: ``"rope"`` (with its own ``inv_freq``, the rotated share ``rotary_dims`` of
  d_head and the pair ``layout``: ``"rotate_half"`` pairs i with i + r/2, ``"interleaved"``
  pairs 2i with 2i + 1), ``"none"`` (NoPE), ``"learned-absolute"`` (a position table
  added to the residual stream), ``"alibi"`` or ``"relative-bias"`` (a learned table of
  biases over bucketed offsets added to the logits, T5's: its ``relative_bias`` term);
- ``mask``: ``"causal"``, ``"sliding"`` (a query t reads keys s with t − s < ``window``,
  the rule of transformers' ``sliding_window_overlay``) or ``"bidirectional"`` (with a
  ``window``: keys with |t − s| < window, T5Gemma's encoder's sliding layers);
- ``qk_norm``: whether q and k are normalised per head before RoPE.

Everything is read from the config and modules (``layer_types``, ``sliding_window``,
per-type rotary buffers, ``no_rope_layers``, the rotary module's ``inv_freq`` or GPT-J's
``embed_positions`` table); what cannot be read is refused with
:class:`UnreadableSchemeError` naming what is missing, never guessed.

Reading a scheme from a loaded model is :mod:`~poskernel_tl.models.scheme_reader`; this
module holds the schemes themselves and imports no torch (the registry's specs carry them).
"""

import dataclasses
import math
from dataclasses import dataclass

from poskernel_tl.errors import UserError
from poskernel_tl.models.softmax_terms import NONE, SoftmaxTerms

# transformers' layer types of a sliding window (a hybrid's attention layer beside a state
# too)
SLIDING_TYPES = frozenset({"sliding_attention", "hybrid_sliding"})


class UnreadableSchemeError(UserError):
    """A layer's positional scheme or mask cannot be read from the model (or is one the
    fit does not support): the model is refused rather than measured under a guess."""


@dataclass(frozen=True)
class LayerScheme:
    """One layer's positional scheme (see the module docstring)."""

    pe: str  # "rope" | "none" | "learned-absolute" | "alibi" | "relative-bias"
    mask: str = "causal"  # "causal" | "sliding" | "bidirectional"
    # sliding: a query reads keys with t − s < window (bidirectional: |t − s| < window)
    window: int | None = None
    inv_freq: tuple[float, ...] | None = None  # rope: θ_i per rotated pair
    rotary_dims: int | None = None  # rope: how many of d_head's dimensions rotate
    layout: str | None = None  # rope: "rotate_half" | "interleaved"
    qk_norm: bool = False
    # ε of a weightless RMS norm of q and k applied after rotary (Llama 4's L2 norm), which
    # a capture rotating pre-rotary hooks must apply itself
    norm_after_rotary: float | None = None
    terms: SoftmaxTerms = NONE
    # rope: the first rotated dimension (DeepSeek's MLA heads put qk_nope_head_dim plain
    # dimensions before the rotary ones)
    rotary_offset: int = 0
    # the model's block index of this attention layer where they differ (a hybrid's
    # attention layers among its state-space or convolution layers)
    block: int | None = None
    # the bridge's hook prefix of this layer's attention where it is not its block's
    # (an encoder-decoder's stacks: ``encoder_blocks.{i}.attn``, ``decoder_blocks.{i}.self_attn``)
    site: str | None = None

    @property
    def last(self) -> int | None:
        """The largest offset Δ = t − s (|Δ| for a bidirectional window) whose logit the
        mask keeps (None: no limit)."""
        return None if self.window is None else self.window - 1

    @property
    def kind(self) -> str:
        """A short label that separates layer kinds in tables and figures, e.g.
        ``"rope 1e+04, window 512"``, ``"rope 1e+06"``, ``"nope"``."""
        head = {"rope": "rope", "none": "nope", "learned-absolute": "learned",
                "alibi": "alibi", "relative-bias": "relative"}[self.pe]
        if self.pe == "rope" and self.inv_freq:
            head += f" {self.base:.3g}"
        if self.window is not None:
            head += (f", window {self.window}" if self.mask == "sliding" else
                     f", window ±{self.last}")
        extra = [x for x in self.terms.labels() if x not in ("alibi", "relative bias")]
        return ", ".join([head, *extra])

    @property
    def base(self) -> float | None:
        """The RoPE base b read back from θ_i = b^(−i/n) over n pairs: b = (θ_0/θ_1)^n, to
        5 significant digits (the buffers are float32; None without RoPE or with fewer than
        two pairs)."""
        f = self.inv_freq
        if self.pe != "rope" or not f or len(f) < 2 or min(f[0], f[1]) <= 0:
            return None
        return float(f"{(f[0] / f[1]) ** len(f):.5g}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["inv_freq"] = None if self.inv_freq is None else list(self.inv_freq)
        d["terms"] = self.terms.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LayerScheme":
        d = dict(d)
        if d.get("inv_freq") is not None:
            d["inv_freq"] = tuple(float(x) for x in d["inv_freq"])
        d["terms"] = SoftmaxTerms.from_dict(d.get("terms"))
        return cls(**d)


def summary(layers) -> str:
    """One line naming each kind of layer and where it sits, e.g.
    ``"rope 1e+04, window 512: layers 0-4, 6-10, 12-16; rope 1e+06: layers 5, 11, 17"``
    (a hybrid's attention layers also name the model's blocks they are)."""
    if not layers:
        return "unknown until loaded"
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(layers):
        groups.setdefault(s.kind, []).append(i)
    blocks = lambda ix: "" if layers[ix[0]].block is None else \
        f" (the model's blocks {', '.join(str(layers[i].block) for i in ix)})"
    return "; ".join(f"{kind}: layers {_ranges(ix)}{blocks(ix)}" for kind, ix in groups.items())


def terms_summary(layers) -> str:
    """One line naming what each kind of layer's softmax adds to scale·q·k and where, e.g.
    ``"ALiBi −m·(t − s), m = 0.25 … 0.0039 over 4 heads: layers 0-3"`` (empty when no
    layer adds anything)."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(layers):
        if s.terms:
            groups.setdefault(s.terms.describe(values=False), []).append(i)
    return "; ".join(f"{what}: layers {_ranges(ix)}" for what, ix in groups.items())


def _ranges(ix: list[int]) -> str:
    runs, start = [], ix[0]
    for a, b in zip(ix, ix[1:] + [math.inf]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(runs)


__all__ = ["LayerScheme", "UnreadableSchemeError", "summary", "terms_summary"]
