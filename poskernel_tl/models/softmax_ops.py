"""What a layer's softmax adds to scale·q·k, applied to tensors (the terms themselves:
:class:`~poskernel_tl.models.softmax_terms.SoftmaxTerms`).

:func:`fold_qk` gives queries and keys whose product, times ``scale``, is the additive
part of the softmax input (the ALiBi ramp as two more dimensions: q' = [q, −(m/scale)·(t
− c), m/scale], k' = [k, 1, s − c] with c the middle position, so q'·k'·scale = scale·q·k −
m·(t − s) exactly; the temperature as a factor on q), so every fit that streams sums of
q and k reads it unchanged. :func:`finish_scores` makes materialised scores what the
softmax reads: an offset table that does not fold (:func:`offset_bias`, each entry's
b_h(t − s)) added, the nonlinear part (:func:`cap_scores`) applied.
"""

from collections.abc import Callable
from functools import lru_cache

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.models.softmax_terms import SoftmaxTerms


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


def chunk_qk(q: Float[Tensor, "batch pos head_index d_head"],
             k: Float[Tensor, "batch pos kv_head_index d_head"], chunk: int
             ) -> tuple[Float[Tensor, "batch pos head_index d_chunked"],
                        Float[Tensor, "batch pos kv_head_index d_chunked"]]:
    """(q', k') with q'_t·k'_s = q_t·k_s where t and s lie in one chunk of ``chunk``
    positions and exactly 0 across chunks: position t's vector placed in the ⌈T / chunk⌉
    slots of width d at its chunk's slot. Every sum over a chunked mask's kept entries is
    then the same sum over the causal triangle (within Δ ≤ chunk − 1) of q'·k'ᵀ, so the
    streaming fits read a chunked layer unchanged; only the counts come from the mask."""
    T = q.shape[1]
    slot = torch.nn.functional.one_hot(torch.arange(T, device=q.device) // chunk,
                                       -(-T // chunk)).to(q.dtype)  # [pos, chunk]

    def spread(x: Tensor) -> Tensor:
        b, _, h, d = x.shape
        return (x[:, :, :, None, :] * slot[None, :, None, :, None]).reshape(b, T, h, -1)
    return spread(q), spread(k)


def qk_scores(q: Float[Tensor, "batch pos head_index d_head"],
              k: Float[Tensor, "batch pos kv_head_index d_head"], scale: float,
              buffer: Callable[[tuple, Tensor], Tensor] | None = None
              ) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """scale·q·kᵀ per sequence and query head, in float32 (float64 for float64 q/k: an
    ALiBi ramp folded into them, whose two large terms cancel): [b, kv, group, t, d] @
    [b, kv, 1, d, t], GQA keys broadcast, not copied; into ``buffer(shape, like)`` where
    given (a reused output buffer)."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qg = q.to(dtype).permute(0, 2, 1, 3).reshape(b, kv, h // kv, t, d) * scale
    kg = k.to(dtype).permute(0, 2, 3, 1).unsqueeze(2)
    out = None if buffer is None else buffer((b, kv, h // kv, t, t), qg)
    return torch.matmul(qg, kg, out=out).reshape(b, h, t, t)


def head_logits(q: Float[Tensor, "pos d_head"], k: Float[Tensor, "pos d_head"],
                terms: SoftmaxTerms, head: int, scale: float
                ) -> Float[Tensor, "query_pos key_pos"]:
    """What query head ``head``'s softmax reads, every entry (the mask not applied):
    scale·q'·k'ᵀ of the folded q and k, an offset table's b_h(t − s) added, soft-capped
    where the layer caps; float64."""
    one = terms.replace(slopes=None if terms.slopes is None else (terms.slopes[head],),
                        sinks=None)
    qf, kf = fold_qk(q[None, :, None].double(), k[None, :, None].double(), one, scale)
    A = qf[0, :, 0] @ kf[0, :, 0].T * scale
    if terms.offsets:
        t = torch.arange(len(A), device=A.device)
        A += offset_bias(terms, entry_offsets(t, t), len(A))[head].to(A)
    return cap_scores(A, terms)


@lru_cache(maxsize=16)
def _offset_table(terms: SoftmaxTerms, length: int) -> Float[Tensor, "head_index lag"]:
    """Σ of the layer's unfolded offset terms' b_h(Δ) at Δ = −(length − 1) … length − 1."""
    lags = range(1 - length, length)
    return sum(torch.tensor(t.known_kernel(lags), dtype=torch.float64)
               for t in terms.offsets)


def offset_bias(terms: SoftmaxTerms, delta: Tensor, length: int
                ) -> Float[Tensor, "head_index ..."] | None:
    """b_h(Δ) of the layer's offset terms that do not fold into q and k
    (:attr:`~poskernel_tl.models.softmax_terms.SoftmaxTerms.offsets`), per query head at
    the offsets ``delta`` (integers in (−length, length), any shape), float64 on
    ``delta``'s device; None where the layer has none."""
    if not terms.offsets:
        return None
    table = _offset_table(terms, length).to(delta.device)
    return table[:, delta + (length - 1)]


def entry_offsets(rows: Tensor, keys: Tensor) -> Tensor:
    """t − s of the entries (rows[i], keys[j]): [len(rows), len(keys)]."""
    return rows[:, None] - keys[None, :]


def finish_scores(scores: Float[Tensor, "*batch head_index query_pos key_pos"],
                  terms: SoftmaxTerms, delta: Callable[[], Tensor] | None = None,
                  length: int = 0) -> Tensor:
    """``scores`` (scale·q'·k' of the folded q and k, its head axis before the entries)
    made what the softmax reads, in place: the unfolded offset terms' b_h(t − s) added
    (``delta``: a function giving each entry's offset, of the entries' shape, called only
    where the layer has such a term; ``length``: the sequence length bounding it), then
    the cap (:func:`cap_scores`)."""
    if terms.offsets:
        if delta is None:
            raise ValueError("an offset table is added at each entry's offset: pass delta")
        scores.add_(offset_bias(terms, delta(), length).to(scores.dtype))
    return cap_scores(scores, terms)


def cap_scores(scores: Tensor, terms: SoftmaxTerms) -> Tensor:
    """``scores`` soft-capped in place where the layer caps (cap·tanh(x / cap))."""
    if terms.softcap is not None:
        scores.div_(terms.softcap).tanh_().mul_(terms.softcap)
    return scores


def sink_logits(terms: SoftmaxTerms, device=None) -> Float[Tensor, " head_index"] | None:
    """The layer's learned sink logits per query head (None without)."""
    return None if terms.sinks is None else torch.tensor(terms.sinks, dtype=torch.float32,
                                                         device=device)


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


__all__ = ["alibi_ramp", "attention_pattern", "cap_scores", "chunk_qk", "entry_offsets",
           "finish_scores", "fold_qk", "head_logits", "logsumexp_with_sinks", "offset_bias",
           "sink_logits", "temperatures"]
