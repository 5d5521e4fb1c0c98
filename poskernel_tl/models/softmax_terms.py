"""What a layer's attention softmax reads beyond ``scale·q·k`` plus a mask.

Many models add something to the product of a query and a key before the softmax, or
transform it; the fit of a head must read exactly what its softmax reads. A
:class:`SoftmaxTerms` says, for one layer, read from the model itself:

- ``slopes``: an additive ALiBi bias, per query head, in the paper's form
  ``scale·q_t·k_s − m_h·(t − s)`` (Press et al., 2022). Hugging Face's BLOOM, MPT and
  Falcon code adds a bias of the key position alone (``m_h·s``, ``m_h·(s − T + 1)``,
  Falcon's before its 1/√d scaling): it differs from the paper's form by a per-row
  constant, which the softmax ignores and a Toeplitz fit does not, so the paper's form is
  what is fitted. ``m_h`` is the slope on the softmax's own scale (Falcon's already
  multiplied by its 1/√d).
- ``softcap``: logits soft-capped as ``cap·tanh(scale·q·k / cap)`` before the mask
  (Gemma 2): a nonlinear function of q·k, fitted on the materialised scores.
- ``temperature``: a per-position query temperature ``τ_t = 1 + attn_scale·log(1 +
  ⌊(t + 1) / floor_scale⌋)`` (Llama 4's NoPE layers): folded into q.
- ``sinks``: learned per-head sink logits that join each row's normaliser as one more
  column (gpt-oss). They are no entry of the logits among tokens, so the fit never sees
  them; the attention pattern (the previous-token score, the head view) divides by them.
- ``chunk``: a chunked causal mask (Llama 4): query t reads key s ≤ t of its own chunk
  of ``chunk`` positions. For T ≤ chunk it keeps every causal entry; past it every fit
  reads the entries of one chunk, counted by the mask
  (:meth:`poskernel_tl.models.geometry.Geometry.chunk`,
  :func:`~poskernel_tl.models.softmax_ops.chunk_qk`).

The tensor side (folding the terms into q and k, the cap, the pattern with sinks) is
:mod:`~poskernel_tl.models.softmax_ops`; reading them from a model is
:mod:`~poskernel_tl.models.scheme_reader`. This module imports no torch: the command line
checks a run against the registry before it pays for torch.
"""

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class SoftmaxTerms:
    """What one layer's softmax reads beyond scale·q·k plus its mask (module docstring)."""

    slopes: tuple[float, ...] | None = None  # ALiBi m_h per query head (paper form)
    softcap: float | None = None  # cap·tanh(x / cap)
    temperature: tuple[float, float] | None = None  # (floor_scale, attn_scale)
    sinks: tuple[float, ...] | None = None  # learned sink logit per query head
    chunk: int | None = None  # chunked causal mask: chunks of this many positions

    @property
    def additive(self) -> bool:
        """Whether the product itself changes (a bias or a temperature, folded into q/k)."""
        return self.slopes is not None or self.temperature is not None

    @property
    def nonlinear(self) -> bool:
        """Whether the logits are a nonlinear function of q·k (fitted on the materialised
        scores)."""
        return self.softcap is not None

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) is not None for f in dataclasses.fields(self))

    def labels(self) -> list[str]:
        """Short labels, e.g. ``["alibi", "soft-cap 50"]``."""
        out = []
        if self.slopes is not None:
            out.append("alibi")
        if self.softcap is not None:
            out.append(f"soft-cap {self.softcap:g}")
        if self.temperature is not None:
            out.append("temperature")
        if self.sinks is not None:
            out.append("sinks")
        if self.chunk is not None:
            out.append(f"chunk {self.chunk}")
        return out

    def describe(self, values: bool = True) -> str:
        """One line of what the softmax adds (empty when nothing); ``values=False`` leaves
        out what differs from layer to layer (the learned sink logits' range)."""
        out = []
        if self.slopes is not None:
            m = self.slopes
            out.append(f"ALiBi −m·(t − s), m = {max(m):.3g} … {min(m):.3g} over {len(m)} heads")
        if self.softcap is not None:
            out.append(f"soft-cap {self.softcap:g}·tanh(x / {self.softcap:g})")
        if self.temperature is not None:
            floor, scale = self.temperature
            out.append(f"query temperature 1 + {scale:g}·log(1 + ⌊(t + 1) / {floor:g}⌋)")
        if self.sinks is not None:
            span = f" ({min(self.sinks):.3g} … {max(self.sinks):.3g})" if values else ""
            out.append(f"learned sink logits{span} in the normaliser")
        if self.chunk is not None:
            out.append(f"chunked mask, {self.chunk} positions per chunk")
        return "; ".join(out)

    def to_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict | None) -> "SoftmaxTerms":
        d = dict(d or {})
        for name in ("slopes", "temperature", "sinks"):
            if d.get(name) is not None:
                d[name] = tuple(float(x) for x in d[name])
        return cls(**d)

NONE = SoftmaxTerms()

__all__ = ["NONE", "SoftmaxTerms"]
