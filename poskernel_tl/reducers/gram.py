"""Track B, second pass: the averaged Gram matrix over the evaluation set (Phase 4).

The reducer keeps Σ_x q̃_x k̃_xᵀ with q̃ = (q − m_q)·scale, k̃ = k − m_k about a fixed
reference m (the centering means when there are any, otherwise the first batch's
per-position means; float32, as the centering means are saved), the mean removed in
float64 before the products are formed in float32, so the large mean term never enters
them and there is no cancellation to lose precision to. It is kept either

- as a float32 accumulator in blocks of query rows (:func:`~poskernel_tl.reducers.gram_cost.
  gram_row_blocks`): rows [r0, r1) with keys [0, r1), i.e. only the strictly lower
  triangle the fit reads plus the diagonal blocks (≈ T²/2 per head) — on a layer with a
  sliding window only the keys its window keeps, [r0 − w, r1) (≈ T·(w + 64) per head) —
  or every key where the full matrices are to be returned (T ≤ 256 by default). One
  in-place batched matmul
  per row block, layer and batch adds a whole batch (the batch axis folded into the
  contraction; on a GPU one tiled kernel per layer and batch adds it to every block,
  :mod:`poskernel_tl.kernels.gram_tiles`); or
- as the evaluation sequences' q̃, k̃ themselves (``factors=True``), n·T·d_head per head
  instead of T²/2: the smaller state for few sequences at long T
  (:func:`~poskernel_tl.reducers.gram_cost.gram_factors`; the path is chosen per kind of
  layer, ``factors`` then one flag per layer of the model).

Every Gram the fit needs then follows exactly from the evaluation means q̄, k̄:

    mean_x (q − a)(k − b)ᵀ = C_m + (m_q − a)(k̄ − b)ᵀ + (q̄ − m_q)(m_k − b)ᵀ,

with C_m the mean product about m (the expansion's (m_q − a)(k̄ − m_k)ᵀ and
(m_q − a)(m_k − b)ᵀ merged into the first term): the raw Gram (a = b = 0), the centered
Gram (a, b = the centering means, which are the reference: no correction at all) and the
half-centering check (a, b = means of a random half of the centering set). The fit of
g(Δ) is the Track A fit applied to Ḡ, from per-lag sums and a sum of squares that
:mod:`poskernel_tl.reducers.gram_fit` forms without any float64 T×T matrix.

A bidirectional model (``causal=False``) has logits on both sides of the diagonal, and its
Gram fits read both triangles (one g per signed lag, R² over every off-diagonal entry): the
accumulator then holds every key of every row (T² per head), and the fit adds the upper
triangle's pieces (:mod:`poskernel_tl.reducers.gram_fit`). ``g_gram``/``g_gram_raw`` keep
Δ = 1..T−1; ``g_gram_back``/``g_gram_raw_back`` hold Δ = −1..−(T−1) (index j ↔ Δ = −(j+1))
and ``g_gram_self``/``g_gram_raw_self`` the diagonal's mean (Δ = 0, not fitted); all None
for a causal model.

A reducer may cover only some layers (``layers``): a run that does not fit its memory
budget accumulates Track B in blocks of layers, one evaluation pass each
(:func:`poskernel_tl.measurement.measure.measure`); :func:`concat_layers` joins their results.
"""

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl import kernels
from poskernel_tl.constants import GRAM_SAVE_MAX_T
from poskernel_tl.mask import Mask, shared
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.reducers.gram_cost import GRAM_ROWS, as_path, gram_row_blocks
from poskernel_tl.reducers.gram_fit import Pieces, dense_pieces, factor_pieces, tile_pieces
from poskernel_tl.reducers.gram_result import GramResult
from poskernel_tl.reducers.gram_variant import variant_fit
from poskernel_tl.reducers.moments import Moments, means_in_place

Means = tuple[Float[Tensor, "head_index pos d_head"] | None,
              Float[Tensor, "kv_head_index pos d_head"] | None]
FIELDS = ("r2_gram_raw", "g_gram_raw", "r2_gram", "g_gram", "r2_gram_half")
SIDES = ("g_gram_raw_back", "g_gram_back", "g_gram_raw_self", "g_gram_self")


def concat_layers(parts: Sequence[GramResult]) -> GramResult:
    """One result from the results of reducers covering consecutive blocks of layers, in
    layer order (the evaluation means, too)."""
    if len(parts) == 1:
        return parts[0]
    cat = lambda name: (None if getattr(parts[0], name) is None
                        else np.concatenate([getattr(p, name) for p in parts]))
    evs = [p.eval_moments for p in parts]
    ev = None if any(e is None for e in evs) else Moments(
        torch.cat([e.mean_q for e in evs]), torch.cat([e.mean_k for e in evs]), None, None,
        evs[0].n, 0)
    return GramResult(**{name: cat(name) for name in FIELDS + SIDES},
                      gram_raw=cat("gram_raw"), gram_centered=cat("gram_centered"),
                      centered=parts[0].centered, eval_moments=ev)


class GramReducer:
    """Track B for ``layers`` (default: all ``n_layers``). ``full``: keep every key of every
    row, so that :meth:`result` can return the whole matrices (default: T ≤ 256, where
    they are saved), else only the lower triangle's row blocks. ``factors``: keep the
    evaluation sequences' q̃, k̃ instead of any accumulator (smaller when n·d_head is
    well below T/2; the fit then costs O(T·(n·d_head)²), or, above
    :data:`~poskernel_tl.reducers.gram_cost.FACTOR_RANK_MAX`, as much as the accumulator:
    its blocks are formed from them), for every layer or per layer of the model (a
    sequence of flags, one per layer). ``masks``: per layer, the entries its softmax keeps
    (:attr:`~poskernel_tl.models.geometry.Geometry.masks`); two-sided masks fit both
    triangles (every key of every row is accumulated; see the module docstring)."""

    def __init__(self, masks: Sequence[Mask], n_heads: int, n_kv_heads: int, d_head: int,
                 scale: float, device: torch.device | str = "cpu",
                 reference: Moments | None = None, *, layers: Sequence[int] | None = None,
                 full: bool | None = None, factors: bool | Sequence[bool] = False):
        length, causal = shared(masks)
        n_layers = len(masks)
        self.scale, self.group, self.T = scale, n_heads // n_kv_heads, length
        self.causal = causal
        # per layer, the entries its softmax keeps: a window's offsets, a binding chunk
        # (its entries across chunks are left out of every fit; such a layer is read off
        # the tiled kernels)
        self.masks = list(masks)
        self.layers = list(range(n_layers)) if layers is None else list(layers)
        self.slot = {L: i for i, L in enumerate(self.layers)}
        path = as_path(factors, n_layers)  # one path per layer of the model
        self.factors = [bool(path[L]) for L in self.layers]
        self.full = length <= GRAM_SAVE_MAX_T and not any(self.factors) if full is None \
            else full
        if any(self.factors) and self.full:
            raise ValueError("GramReducer: factors=True keeps no matrix (full=False)")
        every_key = self.full or not causal
        self.blocks = [gram_row_blocks(length, every_key, last=None if every_key else
                                       self.masks[L].last) for L in self.layers]
        f64 = dict(dtype=torch.float64, device=device)
        # on the tiled kernels' device each layer's blocks are views of one flat buffer,
        # the layers with the same blocks one after the other in one buffer, so that one
        # launch updates a group of them (:mod:`poskernel_tl.kernels.gram_tiles`)
        self.flat: list[tuple[Tensor, Tensor] | None] = [None] * len(self.layers)
        self.shared: list[tuple[Tensor, int, int] | None] = [None] * len(self.layers)
        self.acc = self._accumulators(n_heads, device)
        self.kept: list[list[tuple[Tensor, Tensor]]] = [[] for _ in self.layers]
        nl = len(self.layers)
        self.q_sum = torch.zeros(nl, n_heads, length, d_head, **f64)  # evaluation sums
        self.k_sum = torch.zeros(nl, n_kv_heads, length, d_head, **f64)
        self.count = [0] * nl
        self.means: Moments | None = None  # eval_moments, once taken (no update after it)
        self.joined: dict = {}  # a group's references side by side and parts (made once)
        # the reference, float32 [pos, head, d] (views of the centering means)
        self.ref_q: list[Tensor | None] = [None] * nl
        self.ref_k: list[Tensor | None] = [None] * nl
        if reference is not None:
            for i, L in enumerate(self.layers):
                self.ref_q[i] = reference.mean_q[L].transpose(0, 1)
                self.ref_k[i] = reference.mean_k[L].transpose(0, 1)

    def _accumulators(self, n_heads: int, device) -> list[list[Tensor]]:
        """Each layer slot's zeroed row blocks [head, rows, keys]: none for the factors'
        path; on the kernels' device views of one flat buffer per set of slots with the
        same blocks (kept in ``self.flat``: the slot's part and its tile table, and in
        ``self.shared``: the buffer, the slot's index in it and a part's size)."""
        acc: list[list[Tensor]] = [[] for _ in self.layers]
        probe = torch.empty(0, device=device)
        tiled = [i for i, f in enumerate(self.factors)
                 if not f and kernels.takes(probe, self.masks[self.layers[i]].chunk)]
        for i, f in enumerate(self.factors):
            if not f and i not in tiled:
                acc[i] = [torch.zeros(n_heads, r1 - r0, k1 - k0, dtype=torch.float32,
                                      device=device) for r0, r1, k0, k1 in self.blocks[i]]
        for blocks in dict.fromkeys(tuple(self.blocks[i]) for i in tiled):
            slots = [i for i in tiled if tuple(self.blocks[i]) == blocks]
            buffer, _, table = kernels.gram_layout(blocks, n_heads, device, len(slots))
            for j, i in enumerate(slots):
                part, acc[i] = kernels.layer_views(buffer, blocks, n_heads, j)
                self.flat[i] = (part, table)
                self.shared[i] = (buffer, j, part.numel())
        return acc

    GROUPED = True  # the kernels' path takes a group of layers as one batch

    def update(self, batch: LayerBatch) -> None:
        slots = [self.slot.get(L) for L in batch.layers]
        if all(i is None for i in slots):  # layers another reducer's block covers
            return
        if self.means is not None:
            raise RuntimeError(f"{type(self).__name__}: update after the means were taken")
        if None not in slots and all(self.shared[i] is not None for i in slots):
            buffer, _, size = self.shared[slots[0]]
            if all(self.shared[i][0] is buffer for i in slots):  # one launch for the group
                return self._update_tiles(batch, slots, buffer, size)
        if batch.n_layers > 1:
            for one in batch.split():
                self.update(one)
            return
        self._update_layer(slots[0], batch)

    def _update_tiles(self, batch: LayerBatch, slots: list[int], acc: Tensor,
                      size: int) -> None:
        """A group of layers (or one) whose accumulators are parts of ``acc`` (``size``
        entries each): the evaluation sums and one launch that centers and adds every
        block."""
        key = ("slots", tuple(slots))  # the slots and their parts of acc, uploaded once
        if key not in self.joined:
            self.joined[key] = torch.tensor([slots, [self.shared[i][1] for i in slots]],
                                            device=acc.device)
        where, parts = self.joined[key]
        for state, x in ((self.q_sum, batch.q), (self.k_sum, batch.k)):
            sums = batch.by_layer(x.sum(0, dtype=torch.float64).transpose(0, 1), 0)
            if slots == list(range(slots[0], slots[0] + len(slots))):
                state[slots[0]:slots[0] + len(slots)].add_(sums)
            else:
                state.index_add_(0, where, sums)
        for i in slots:
            self.count[i] += batch.q.shape[0]
        ref = self._group_reference(slots, batch)
        kernels.gram_tile_update(acc, self.flat[slots[0]][1], GRAM_ROWS, batch.q, batch.k,
                                 ref, self.scale, batch.heads, size, parts)

    def _group_reference(self, slots: list[int], batch: LayerBatch) -> tuple[Tensor, Tensor]:
        """The float32 reference (m_q, m_k) of a group's slots side by side along the head
        axis, joined once per group (no centering set: the first batch's means)."""
        key = ("reference", tuple(slots))
        if key not in self.joined:
            if self.ref_q[slots[0]] is None:
                m_q = batch.q.double().mean(0).float()
                m_k = batch.k.double().mean(0).float()
                for j, i in enumerate(slots):
                    self.ref_q[i] = batch.by_layer(m_q, 1)[:, j]
                    self.ref_k[i] = batch.by_layer(m_k, 1)[:, j]
                self.joined[key] = (m_q, m_k)
            else:
                self.joined[key] = tuple(torch.cat([r[i] for i in slots], 1).contiguous()
                                         for r in (self.ref_q, self.ref_k))
        return self.joined[key]

    def _update_layer(self, i: int, batch: LayerBatch) -> None:
        """One layer, centered in float64 here: the CPU path (one row block at a time) and
        the factors' path (the centered q and k kept)."""
        qd, kd = batch.q.double(), batch.k.double()
        self.q_sum[i] += qd.sum(0).transpose(0, 1)
        self.k_sum[i] += kd.sum(0).transpose(0, 1)
        self.count[i] += qd.shape[0]
        if self.ref_q[i] is None:  # no centering set: the first batch is the reference
            self.ref_q[i], self.ref_k[i] = qd.mean(0).float(), kd.mean(0).float()
        # q̃ = (q − m_q)·scale, k̃ = k − m_k: the mean removed in float64, then float32
        # (m the float32 reference, which the fit's corrections use as it is)
        q = (qd - self.ref_q[i]).mul_(self.scale).float()
        k = (kd - self.ref_k[i]).float()
        if self.factors[i]:
            self.kept[i].append((q, k))
            return
        b, T, H, d = q.shape
        kv, g = k.shape[2], self.group
        # per row block [kv, group·rows, b·d] @ [kv, b·d, keys] adds Σ_x q̃_x k̃_xᵀ for
        # every query head of the block's rows (row j·rows + i: head kv·group + j, row i)
        qc = q.permute(2, 1, 0, 3)  # [H, T, b, d]
        kc = k.permute(2, 0, 3, 1).reshape(kv, b * d, T)
        for (r0, r1, k0, k1), acc in zip(self.blocks[i], self.acc[i]):
            rows = qc[:, r0:r1].reshape(kv, g * (r1 - r0), b * d)
            acc.view(kv, g * (r1 - r0), k1 - k0).baddbmm_(rows, kc[:, :, k0:k1])

    def eval_moments(self) -> Moments:
        """The evaluation means of q and k of this reducer's layers (float64), taken once:
        the sums become the means in place (no second copy)."""
        if self.means is not None:
            return self.means
        n = means_in_place(self.count, self.q_sum, self.k_sum, who="GramReducer.result")
        self.means = Moments(self.q_sum, self.k_sum, None, None, int(n[0]), 0)
        return self.means

    def fit_layer(self, i: int, variants: dict[str, Means], ev: Moments, keep: bool
                  ) -> dict[str, tuple]:
        """Per variant (name → the centering a, b; None: zero): R², g, g_back and g_self
        (None for a causal fit) and (``keep``) the float32 matrix of
        mean_x (q − a)(k − b)ᵀ·scale of layer slot ``i``."""
        m_q, m_k = (r[i].transpose(0, 1).double() for r in (self.ref_q, self.ref_k))
        xs: list[Tensor] = []  # the distinct vectors B_low is applied to
        terms, uv = {}, {}  # per variant: its terms' X slots (plus, minus); U and V
        for name, (a, b) in variants.items():
            terms[name], found = corrections(a, b, m_q, m_k, ev.mean_q[i], ev.mean_k[i], xs)
            if found is not None:
                uv[name] = found
        d = m_q.shape[-1]
        x = torch.cat(xs, -1) if xs else m_k.new_zeros(m_k.shape[0], self.T, d)
        xs.clear()
        mats = {v: torch.empty(m_q.shape[0], self.T, self.T, dtype=torch.float32,
                               device=m_q.device) for v in ("raw", "centered")
                if keep and v in variants}
        mask = self.masks[self.layers[i]]
        pieces = self.pieces(i, x, self.keeper(mats, uv))
        out = {}
        for name, t in terms.items():
            u, v = uv.get(name, (None, None))
            fit = variant_fit(pieces, u, v, applied(pieces.y, t, d), self.scale,
                              applied(pieces.y_up, t, d), last=mask.last,
                              chunk=mask.chunk)
            out[name] = (*fit, mats.get(name))
        return out

    def keeper(self, mats: dict[str, Tensor], uv: dict):
        """The callback of :func:`dense_pieces` that writes the kept matrices' rows."""
        if not mats:
            return None

        def keep(r0: int, r1: int, block: Tensor) -> None:
            for name, mat in mats.items():
                if name not in uv:  # no correction: the block itself
                    mat[:, r0:r1] = block
                    continue
                u, v = uv[name]
                vh = v.repeat_interleave(self.group, dim=0)[:, :block.shape[-1]]
                mat[:, r0:r1] = torch.baddbmm(block.double(), u[:, r0:r1],
                                              vh.transpose(1, 2), alpha=self.scale)
        return keep

    def pieces(self, i: int, x: Tensor, keep) -> Pieces:
        """B's pieces of layer slot ``i`` over the entries its mask keeps (the offsets of
        its window, within its chunk)."""
        mask = self.masks[self.layers[i]]
        last, chunk = mask.window_last, mask.chunk
        if self.factors[i]:
            q = torch.cat([q for q, _ in self.kept[i]])
            return factor_pieces(q, torch.cat([k for _, k in self.kept[i]]), x,
                                 upper=not self.causal, last=last, chunk=chunk)
        if self.flat[i] is not None:  # read by tiles (one flat buffer)
            return tile_pieces(self.flat[i][0], self.blocks[i], self.acc[i][0].shape[0],
                               self.count[i], x, keep, self.acc[i], upper=not self.causal,
                               last=last)
        return dense_pieces(zip(self.blocks[i], self.acc[i]), self.count[i], x, keep,
                            upper=not self.causal, last=last, chunk=chunk)

    def result(self, centering: Moments | None = None, keep_matrices: bool = False
               ) -> GramResult:
        """R²/g of the raw Gram and, given the centering means, of the centered Gram (all
        centering sequences, and the random half), for this reducer's layers."""
        if keep_matrices and not self.full:
            raise ValueError("keep_matrices: this GramReducer was built with full=False "
                             "and holds only the lower triangle")
        ev = self.eval_moments()
        out: dict[str, list] = {name: [] for name in (*FIELDS, *SIDES, "gram_raw",
                                                      "gram_centered")}
        names = {"raw": ("r2_gram_raw", "g_gram_raw", "g_gram_raw_back", "g_gram_raw_self",
                         "gram_raw"),
                 "centered": ("r2_gram", "g_gram", "g_gram_back", "g_gram_self",
                              "gram_centered"),
                 "half": ("r2_gram_half", None, None, None, None)}
        for i, L in enumerate(self.layers):
            variants: dict[str, Means] = {"raw": (None, None)}
            if centering is not None:
                variants["centered"] = (centering.mean_q[L], centering.mean_k[L])
                if centering.mean_q_half is not None:
                    variants["half"] = (centering.mean_q_half[L], centering.mean_k_half[L])
            for v, values in self.fit_layer(i, variants, ev, keep_matrices).items():
                for key, value in zip(names[v], values):
                    if key is not None and value is not None:
                        out[key].append(value.cpu().numpy())
        return self._assemble(out, centering is not None, ev)

    def _assemble(self, out: dict[str, list], centered: bool, ev: Moments) -> GramResult:
        nl, H, T = len(self.layers), self.q_sum.shape[1], self.T
        nan, g_nan = np.full((nl, H), np.nan), np.full((nl, H, T - 1), np.nan)
        stack = lambda key, fallback: np.stack(out[key]) if out[key] else fallback
        sides = {} if self.causal else dict(
            g_gram_raw_back=stack("g_gram_raw_back", None),
            g_gram_back=stack("g_gram_back", g_nan),
            g_gram_raw_self=stack("g_gram_raw_self", None),
            g_gram_self=stack("g_gram_self", nan))
        return GramResult(
            r2_gram_raw=stack("r2_gram_raw", nan), g_gram_raw=stack("g_gram_raw", g_nan),
            r2_gram=stack("r2_gram", nan), g_gram=stack("g_gram", g_nan),
            r2_gram_half=stack("r2_gram_half", nan),
            gram_raw=stack("gram_raw", None), gram_centered=stack("gram_centered", None),
            centered=centered, eval_moments=ev, **sides)


def corrections(a: Tensor | None, b: Tensor | None, m_q: Tensor, m_k: Tensor,
                q_bar: Tensor, k_bar: Tensor, xs: list[Tensor]
                ) -> tuple[list[tuple[int, int | None]], tuple[Tensor, Tensor] | None]:
    """The correction of the centering (a, b) (None: zero) to the reference (m_q, m_k):
    (m_q − a)(k̄ − b)ᵀ + (q̄ − m_q)(m_k − b)ᵀ, each term left out where it is exactly zero
    (the centering that is the reference needs none). Returns each term's slots (plus,
    minus) in ``xs`` (the distinct vectors B_side is applied to; new ones appended) and
    U, V side by side (None without terms); no temporary outlives the call."""

    def slot(t: Tensor) -> int:
        found = [j for j, x in enumerate(xs) if x is t or torch.equal(x, t)]
        if not found:
            xs.append(t)
        return found[0] if found else len(xs) - 1

    a = torch.zeros_like(m_q) if a is None else a.double()
    b_slot = None if b is None else slot(b.double())
    b = torch.zeros_like(m_k) if b is None else b.double()
    kept = [(u, v, slot(plus)) for u, v, plus, zero in (
        (m_q - a, k_bar - b, k_bar, torch.equal(m_q, a)),
        (q_bar - m_q, m_k - b, m_k, torch.equal(m_k, b))) if not zero]
    uv = tuple(torch.cat([t[j] for t in kept], -1) for j in (0, 1)) if kept else None
    return [(plus, b_slot) for *_, plus in kept], uv


def applied(y: Tensor | None, terms: list, d: int) -> Tensor | None:
    """W = B_side·V of a variant's correction terms, from Y = B_side·X (one ``d``-wide
    slot per distinct vector of X; each term ``(plus, minus)`` with v = X[plus] −
    X[minus]); None without terms or without Y."""
    if y is None or not terms:
        return None
    part = lambda j: y[..., j * d:(j + 1) * d]
    return torch.cat([part(p) - part(m) if m is not None else part(p) for p, m in terms], -1)


__all__ = ["GramReducer", "concat_layers"]
