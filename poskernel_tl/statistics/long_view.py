"""One evaluation sequence's long view, for the report's head views past
:data:`~poskernel_tl.constants.VIEW_TOKENS` tokens (where full logits are not saved).

Per layer and head of the first visualized sequence (``--save-logits yes``), on the grid of
:mod:`poskernel_tl.fit.blocks` (at most 256 × 256 blocks):

- ``logit_sum``: Σ over each block of what the softmax reads, A(t, s), on the entries the
  fit reads (1 ≤ t − s ≤ the layer's last offset; t ≠ s for a bidirectional model); the
  fit's sums and the counts follow from the sequence's g(Δ) and the geometry;
- ``mass``: Σ over each block of the pattern exp(A − lse(t)) (the layer's mask, learned
  sink logits in the normaliser), divided by the block's rows;
- ``lse``: each row's log-normaliser;
- ``q``/``k`` (float16) and ``factor_err``: the zoom's factors — post-rotary q of each
  head and k of each key/value head, with max |scale·q16·k16 − A| / max |A| on 64 sampled
  rows — where every layer's logits are scale · q · kᵀ (not for soft-capped layers, nor
  for ALiBi ramps folded into q and k, which float16 cannot hold).

Blocks of rows (a multiple of b, ≈ 256) are formed from q and k against the keys they
read, as :mod:`poskernel_tl.reducers.pattern` forms them: O(T²·d) per head for one
sequence, no T×T temporary.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int

from poskernel_tl.constants import VIEW_TOKENS, VIS_DIR
from poskernel_tl.fit.blocks import block_size, reduce_blocks
from poskernel_tl.mask import Mask
from poskernel_tl.models.softmax_ops import logsumexp_with_sinks, sink_logits
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.pattern import ROWS, score_blocks
from poskernel_tl.schema import Part, stored
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec

FILE = f"{VIS_DIR}/long_view.npz"
CHECK_ROWS = 64


@dataclass
class LongView(Part):
    NAME = "long_view"
    seq: Int[np.ndarray, " one"] = stored(FILE, "seq_id")
    scale: Float[np.ndarray, " one"] = stored(FILE, "scale")  # A = scale · q · k
    logit_sum: Float[np.ndarray, "layer head_index row_block key_block"] = stored(
        FILE, "logit_sum")
    mass: Float[np.ndarray, "layer head_index row_block key_block"] = stored(FILE, "mass")
    lse: Float[np.ndarray, "layer head_index pos"] = stored(FILE, "lse")
    q: Float[np.ndarray, "layer head_index pos d_head"] | None = stored(FILE, "q", default=None)
    k: Float[np.ndarray, "layer kv_head_index pos d_head"] | None = stored(FILE, "k",
                                                                         default=None)
    factor_err: Float[np.ndarray, "layer head_index"] | None = stored(FILE, "factor_err",
                                                                       default=None)

    @property
    def seq_id(self) -> int:
        return int(np.asarray(self.seq).ravel()[0])


class LongViewReducer:
    def __init__(self, run: StatisticContext):
        self.pos, self.geometry = min(run.wanted), run.geometry
        self.seq_id, self.T, self.causal = run.wanted[self.pos], run.length, run.geometry.causal
        self.b, self.n = block_size(self.T)
        self.layers: dict[int, dict] = {}
        self.scale = float(run.model.logit_scale)

    def update(self, batch: LayerBatch) -> None:
        if self.pos not in batch.rows:
            return
        i = batch.rows.index(self.pos)
        bq, bk = batch.logit_qk
        dtype = torch.float64 if bq.dtype == torch.float64 else torch.float32
        q, k = bq[i:i + 1].to(dtype), bk[i:i + 1].to(dtype)
        H, b, n, mask = q.shape[2], self.b, self.n, self.geometry.mask(batch.layer)
        a_sum = q.new_zeros(H, n, n, dtype=torch.float64)
        mass, lse = torch.zeros_like(a_sum), q.new_empty(H, self.T)
        sinks = sink_logits(batch.terms, q.device)
        for r0, r1, lo, A in score_blocks(q, k, batch.scale, mask, batch.terms,
                                          rows=b * max(1, ROWS // b), align=b):
            A = A.reshape(H, r1 - r0, -1)
            row_lse = logsumexp_with_sinks(torch.logsumexp(A, -1), sinks)
            lse[:, r0:r1] = row_lse
            read = mask.kept(torch.arange(r0, r1, device=A.device),
                             torch.arange(lo, lo + A.shape[-1], device=A.device))
            rb, kb = slice(r0 // b, -(-r1 // b)), slice(lo // b, lo // b + -(-A.shape[-1] // b))
            a_sum[:, rb, kb] += reduce_blocks(torch.where(read, A, 0.0), b).double()
            mass[:, rb, kb] += reduce_blocks((A - row_lse[..., None]).exp(), b).double()
        rows_per_block = torch.clamp(self.T - torch.arange(n, device=mass.device) * b, max=b)
        self.layers[batch.layer] = {"logit_sum": a_sum,
                                    "mass": mass / rows_per_block[:, None].to(mass),
                                    "lse": lse, **self._factors(batch, q, k, mask)}

    def _factors(self, batch: LayerBatch, q, k, mask: Mask) -> dict:
        """q, k as float16 and their error on sampled rows; none where the logits are not
        scale · q · kᵀ in float32."""
        if not batch.streams or q.dtype == torch.float64:
            return {}
        q16, k16 = q[0].half(), k[0].half()  # [T, H, d], [T, kv, d]
        rows = torch.as_tensor(np.unique(np.linspace(1, self.T - 1, min(CHECK_ROWS, self.T - 1))
                                         .astype(int)), device=q.device)
        g = q.shape[2] // k.shape[2]
        kk = k[0].repeat_interleave(g, 1)
        exact = torch.einsum("rhd,shd->hrs", q[0, rows], kk) * batch.scale
        approx = torch.einsum("rhd,shd->hrs", q16[rows].float(),
                              k16.float().repeat_interleave(g, 1)) * batch.scale
        read = mask.kept(rows, torch.arange(self.T, device=q.device))
        err = torch.where(read, (approx - exact).abs(), 0.0).amax((1, 2))
        size = torch.where(read, exact.abs(), 0.0).amax((1, 2)).clamp_min(1e-30)
        return {"q": q16.transpose(0, 1), "k": k16.transpose(0, 1), "factor_err": err / size}

    def result(self) -> LongView | None:
        if not self.layers:
            return None
        layers = [self.layers[i] for i in sorted(self.layers)]
        out = {key: torch.stack([x[key] for x in layers]).float().cpu().numpy()
               for key in ("logit_sum", "mass", "lse")}
        if all("q" in x for x in layers):
            out.update({key: torch.stack([x[key] for x in layers]).cpu().numpy()
                        for key in ("q", "k")})
            out["factor_err"] = torch.stack([x["factor_err"] for x in layers]).cpu().numpy()
        return LongView(seq=np.array([self.seq_id]), scale=np.array([self.scale]), **out)


def build(run: StatisticContext) -> LongViewReducer | None:
    """The long view of the first wanted sequence past VIEW_TOKENS tokens (None: shorter,
    or none wanted), under each layer's mask (a chunked one's blocks summed over the
    entries within a chunk: :func:`~poskernel_tl.fit.blocks.fit_blocks`)."""
    return LongViewReducer(run) if run.wanted and run.length > VIEW_TOKENS else None


def state_bytes(model, work) -> int:
    """Sums and factors of one sequence, and one block of rows' scores, pattern and mask."""
    s, T = model.spec, work.length
    if not work.n_logits or T <= VIEW_TOKENS:
        return 0
    _, n = block_size(T)
    kept = s.n_layers * (2 * s.n_heads * n * n * 8 + s.n_heads * T * 4 +
                         (s.n_heads + s.n_kv_heads) * T * s.d_head * 2)
    return kept + 4 * s.n_heads * ROWS * T * 4


STATISTIC = StatisticSpec(
    "long_view", LongView, build,
    "one evaluation sequence's long view past 256 tokens (an overview of blocks and the "
    "zoom's q and k) for the report's head views", state_bytes=state_bytes)

__all__ = ["STATISTIC", "LongView", "LongViewReducer"]
