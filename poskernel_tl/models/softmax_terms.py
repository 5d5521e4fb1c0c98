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
  of ``chunk`` positions. For T ≤ chunk it keeps every causal entry.

:func:`fold_qk` gives queries and keys whose product, times ``scale``, is the additive
part of the softmax input (the ALiBi ramp as two more dimensions: q' = [q, −(m/scale)·(t
− c), m/scale], k' = [k, 1, s − c] with c the middle position, so q'·k'·scale = scale·q·k −
m·(t − s) exactly; the temperature as a factor on q), so every fit that streams sums of
q and k reads it unchanged. :func:`cap_scores` applies the nonlinear part to materialised
scores.
"""

import dataclasses
import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor


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


def temperatures(terms: SoftmaxTerms, length: int, device=None,
                 dtype: torch.dtype = torch.float64) -> Float[Tensor, " pos"] | None:
    """τ_t for t = 0..length−1 (None without a temperature)."""
    if terms.temperature is None:
        return None
    floor, scale = terms.temperature
    t = torch.arange(length, dtype=torch.float64, device=device)
    return (torch.log1p(torch.floor((t + 1.0) / floor)) * scale + 1.0).to(dtype)


def alibi_ramp(terms: SoftmaxTerms, length: int) -> Float[Tensor, "head_index query_pos key_pos"]:
    """The paper-form ALiBi bias −m_h·(t − s) as a float64 [head, T, T] (both triangles;
    the known kernel of an ALiBi head is its offset function −m_h·Δ)."""
    m = torch.tensor(terms.slopes, dtype=torch.float64)
    t = torch.arange(length, dtype=torch.float64)
    return -m[:, None, None] * (t[:, None] - t[None, :])


def fold_qk(q: Float[Tensor, "batch pos head_index d_head"],
            k: Float[Tensor, "batch pos kv_head_index d_head"], terms: SoftmaxTerms,
            scale: float) -> tuple[Tensor, Tensor]:
    """(q', k') with scale·q'·k'ᵀ = the additive part of what the softmax reads (module
    docstring): ``q``, ``k`` themselves when nothing is added; else float64 (q is cast
    to float64 by every fit that reads it)."""
    if not terms.additive:
        return q, k
    b, T, H, _ = q.shape
    q, k = q.double(), k.double()
    tau = temperatures(terms, T, q.device)
    if tau is not None:
        q = q * tau[None, :, None, None]
    if terms.slopes is not None:
        if len(terms.slopes) != H:
            raise ValueError(f"{len(terms.slopes)} ALiBi slopes for {H} query heads")
        m = torch.tensor(terms.slopes, dtype=torch.float64, device=q.device) / scale
        pos = torch.arange(T, dtype=torch.float64, device=q.device) - (T - 1) / 2
        q = torch.cat([q, (-pos[None, :, None, None] * m[None, None, :, None]).expand(b, T, H, 1),
                       m.view(1, 1, H, 1).expand(b, T, H, 1)], dim=-1)
        ones = torch.ones(b, T, k.shape[2], 1, dtype=torch.float64, device=k.device)
        k = torch.cat([k, ones, pos.view(1, T, 1, 1).expand(b, T, k.shape[2], 1)], dim=-1)
    return q, k


def head_logits(q: Float[Tensor, "pos d_head"], k: Float[Tensor, "pos d_head"],
                terms: SoftmaxTerms, head: int, scale: float
                ) -> Float[Tensor, "query_pos key_pos"]:
    """What query head ``head``'s softmax reads, every entry (the mask not applied):
    scale·q'·k'ᵀ of the folded q and k, soft-capped where the layer caps; float64."""
    one = dataclasses.replace(terms, slopes=None if terms.slopes is None
                              else (terms.slopes[head],), sinks=None)
    qf, kf = fold_qk(q[None, :, None].double(), k[None, :, None].double(), one, scale)
    return cap_scores(qf[0, :, 0] @ kf[0, :, 0].T * scale, terms)


def cap_scores(scores: Tensor, terms: SoftmaxTerms) -> Tensor:
    """``scores`` soft-capped in place where the layer caps (cap·tanh(x / cap))."""
    if terms.softcap is not None:
        scores.div_(terms.softcap).tanh_().mul_(terms.softcap)
    return scores


def sink_logits(terms: SoftmaxTerms, device=None) -> Float[Tensor, " head_index"] | None:
    """The layer's learned sink logits per query head (None without)."""
    return None if terms.sinks is None else torch.tensor(terms.sinks, dtype=torch.float32,
                                                         device=device)


def check_length(terms: SoftmaxTerms, length: int, layer: int) -> None:
    """A ValueError where the fit cannot read the layer's mask at ``length``: a chunked
    layer at T > chunk (its kept entries are no function of the offset alone and no fit
    of this toolkit reads them yet)."""
    if terms.chunk is not None and length > terms.chunk:
        raise ValueError(f"layer {layer} masks in chunks of {terms.chunk} positions: "
                         f"lengths up to {terms.chunk} keep every causal entry and are "
                         f"supported; T = {length} is not")


def attention_pattern(masked: Float[Tensor, "*head query_pos key_pos"],
                      sinks: Float[Tensor, " *head"] | None = None
                      ) -> Float[Tensor, "*head query_pos key_pos"]:
    """softmax over the keys of logits whose removed entries hold −inf, with the layer's
    sink logits (one per leading head, or None) joined to every row's normaliser: rows
    then sum to 1 less what the sink takes."""
    lse = logsumexp_with_sinks(torch.logsumexp(masked, -1), sinks)
    return (masked - lse[..., None]).exp()


def logsumexp_with_sinks(lse: Float[Tensor, "*head pos"],
                         sinks: Float[Tensor, " *head"] | None
                         ) -> Float[Tensor, "*head pos"]:
    """Each row's log-normaliser with the layer's sink logits (one per leading head)
    joined (unchanged without)."""
    if sinks is None:
        return lse
    return torch.logaddexp(lse, sinks.to(lse).reshape(*sinks.shape, 1).expand_as(lse))


# ------------------------------------------------------------------ reading the model
def _floats(x) -> tuple[float, ...]:
    return tuple(float(v) for v in torch.as_tensor(x).detach().double().cpu().flatten())


def read_terms(cfg, attn, layer_type: str, n_heads: int,
               slopes: tuple[float, ...] | None = None) -> SoftmaxTerms:
    """One layer's :class:`SoftmaxTerms` from its config and Hugging Face attention module
    ``attn`` (None where the layers could not be matched to modules): soft-capping from
    ``attn_logit_softcapping`` (module or config), learned sinks from the module's
    ``sinks`` parameter, Llama 4's temperature where its module tunes it and skips RoPE,
    a chunked mask from ``layer_type == "chunked_attention"``; ``slopes``: the layer's
    ALiBi slopes, read by the caller (:func:`alibi_slopes`). A ValueError names what is
    missing or inconsistent."""
    cap = getattr(attn, "attn_logit_softcapping", None)
    cap = cap if cap is not None else getattr(cfg, "attn_logit_softcapping", None)
    sinks = getattr(attn, "sinks", None)
    if sinks is not None:
        sinks = _floats(sinks)
        if len(sinks) != n_heads:
            raise ValueError(f"{len(sinks)} sink logits for {n_heads} query heads")
    temperature = None
    if getattr(attn, "attn_temperature_tuning", False) and not getattr(attn, "use_rope", True):
        temperature = (float(attn.floor_scale), float(attn.attn_scale))
    elif attn is None and getattr(cfg, "attn_temperature_tuning", False):
        raise ValueError("attn_temperature_tuning is set, but the layers' attention modules "
                         "(which say where it applies) were not found")
    chunk = None
    if layer_type == "chunked_attention":
        chunk = getattr(cfg, "attention_chunk_size", None)
        if not isinstance(chunk, int) or chunk < 1:
            raise ValueError("a chunked-attention layer without an integer "
                             "config.attention_chunk_size")
    if slopes is not None and (len(slopes) != n_heads or not all(map(math.isfinite, slopes))):
        raise ValueError(f"ALiBi slopes {slopes} do not give one finite slope per query head")
    return SoftmaxTerms(slopes=slopes, softcap=float(cap) if cap else None,
                        temperature=temperature, sinks=sinks, chunk=chunk)


__all__ = ["NONE", "SoftmaxTerms", "alibi_ramp", "attention_pattern", "cap_scores",
           "check_length", "fold_qk", "head_logits", "logsumexp_with_sinks", "read_terms",
           "sink_logits", "temperatures"]
