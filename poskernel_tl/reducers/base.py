"""What every reducer sees: one layer's queries, keys and logits for one batch.

The protocol: a reducer takes its options in its constructor, ``update(batch)`` adds one
:class:`LayerBatch` to running statistics kept on the model's device (no ``.item()``,
``.cpu()`` or boolean-mask indexing: nothing that waits for the device), and
``result()`` syncs once and returns a typed dataclass of numpy arrays.
"""

from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Protocol

import torch
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl import kernels
from poskernel_tl.mask import Mask
from poskernel_tl.models.softmax_ops import (
    chunk_qk,
    entry_offsets,
    finish_scores,
    fold_qk,
    qk_scores,
)
from poskernel_tl.models.softmax_terms import NONE, SoftmaxTerms


@dataclass
class Workspace:
    """Output buffers reused from layer to layer and batch to batch (on CPU a fresh
    allocation of a [batch, head, T, T] tensor costs more than the matmul filling it).
    A buffer's contents are valid until the next layer asks for it."""

    buffers: dict[str, Tensor] = field(default_factory=dict)
    constants: dict = field(default_factory=dict)  # made once per pass (index tensors)

    def get(self, name: str, shape: tuple, like: Tensor, zero: bool = False) -> Tensor:
        buf = self.buffers.get(name)
        if buf is None or buf.shape != shape or buf.device != like.device \
                or buf.dtype != like.dtype:
            make = torch.zeros if zero else torch.empty
            buf = self.buffers[name] = make(shape, dtype=like.dtype, device=like.device)
        return buf


@dataclass
class LayerBatch:
    """Post-rotary q/k of one layer for one batch and the indices of the batch's
    sequences within the pass (``index`` on the model's device, ``rows`` the same on the
    host). ``scores`` (q·kᵀ times the model's logit scale, per
    sequence and query head) is taken from ``hook_attn_scores`` when the capture read it
    (valid on the strictly lower triangle: causal models only), otherwise formed from q/k
    on first use, every entry valid (GQA keys broadcast, not copied), into a workspace
    buffer shared by all reducers.

    ``q``/``k`` are what enters Q·Kᵀ: Track B, the centering means and the frequency
    usage read them (what content contributes). ``terms`` says what the layer's softmax
    adds (:mod:`poskernel_tl.models.softmax_terms`): ``logit_qk`` folds its additive
    part into q and k (an ALiBi ramp, a temperature; q/k themselves when nothing is
    added), and ``scores`` are formed from them, an offset table that does not fold added
    at each entry's offset and soft-capped where the layer caps, so
    every fit of the logits (Track A, the null, the saved logits, the pattern scores)
    reads what the softmax reads; where a chunked mask binds (:attr:`chunk`) they are 0
    across chunks (:attr:`kept_qk`).

    A batch may hold a *group* of layers of one kind (:mod:`poskernel_tl.plan.groups`):
    ``layers`` names them, q and k hold their heads one layer after the other along the
    head axis (query head h of the group's j-th layer at j·H + h, its key/value head at
    j·H_kv + h // group), and everything that works per head works on them unchanged;
    state kept per layer is read and written through :meth:`put` and :meth:`add`. A
    reducer that handles groups says so (``GROUPED = True``); any other receives each
    layer of a group in turn (:meth:`split`). :attr:`layer` is the one layer of a batch
    that holds one."""

    layers: int | tuple[int, ...]
    q: Float[Tensor, "batch pos head_index d_head"]
    k: Float[Tensor, "batch pos kv_head_index d_head"]
    index: Int[Tensor, " batch"]
    scale: float
    rows: tuple[int, ...] = ()  # ``index`` on the host, for the few reducers that need it
    workspace: Workspace = field(default_factory=Workspace)
    hooked_scores: Float[Tensor, "batch head_index query_pos key_pos"] | None = None
    terms: SoftmaxTerms = NONE  # of the batch's heads (a group's: SoftmaxTerms.repeated)
    layer_terms: SoftmaxTerms | None = None  # of one layer of a group (None: ``terms``)
    mask: Mask | None = None  # the entries its layers' softmax keeps (None: not known)
    # values several reducers read, formed once per layer and batch by whichever asks
    # first (:mod:`poskernel_tl.reducers.pattern`'s row normalisers)
    shared: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.layers, int):
            self.layers = (self.layers,)

    @property
    def layer(self) -> int:
        """The batch's one layer (a TypeError for a group: read :attr:`layers`)."""
        if len(self.layers) != 1:
            raise TypeError(f"a batch of layers {self.layers}: read .layers, or split()")
        return self.layers[0]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def heads(self) -> int:
        """Query heads per layer."""
        return self.q.shape[2] // len(self.layers)

    @property
    def layer_sel(self) -> slice | Int[Tensor, " layer"]:
        """The batch's layers as an index of a per-layer axis: a slice where they are
        consecutive, else a long tensor on the batch's device, made once per group (kept
        in the workspace: no upload per batch)."""
        first, last = self.layers[0], self.layers[-1]
        if self.layers == tuple(range(first, last + 1)):
            return slice(first, last + 1)
        key = ("layers", self.layers)
        if key not in self.workspace.constants:
            self.workspace.constants[key] = torch.tensor(self.layers, device=self.q.device)
        return self.workspace.constants[key]

    @property
    def seq_sel(self) -> slice | Int[Tensor, " batch"]:
        """The batch's sequences as an index of a per-sequence axis: a slice where their
        positions in the pass are consecutive (always, for the passes of ``pk.measure``),
        else :attr:`index`."""
        r = self.rows
        if r and r == tuple(range(r[0], r[-1] + 1)):
            return slice(r[0], r[-1] + 1)
        return self.index

    def by_layer(self, x: Tensor, dim: int) -> Tensor:
        """``x`` with its axis ``dim`` of the group's heads (layer-major) split into
        [layer, head] (a view)."""
        dim = dim % x.ndim
        return x.unflatten(dim, (len(self.layers), x.shape[dim] // len(self.layers)))

    def put(self, state: Tensor, value: Tensor) -> None:
        """``state[sequences, layers] = value``: per-sequence state [n_seqs, layer, ...]
        from ``value`` [batch, G·H, ...]. One operation, no upload."""
        value = self.by_layer(value, 1)
        sel = self.layer_sel
        if not isinstance(self.seq_sel, slice):  # sequences by index: both axes at once
            layers = sel if isinstance(sel, Tensor) else torch.arange(
                sel.start, sel.stop, device=state.device)
            state[self.seq_sel[:, None], layers[None, :]] = value
        elif isinstance(sel, slice):
            state[self.seq_sel, sel] = value
        else:
            state[self.seq_sel].index_copy_(1, sel, value.to(state.dtype))

    def add(self, state: Tensor, value: Tensor, lead: int = 0) -> None:
        """``state[..., layers, ...] += value``: per-layer state with ``lead`` axes before
        the layer axis, from ``value`` with the group's heads at axis ``lead``."""
        value = self.by_layer(value, lead)
        sel = self.layer_sel
        if isinstance(sel, slice):  # (in place on the view: one operation)
            state[(slice(None),) * lead + (sel,)].add_(value)
        else:
            state.index_add_(lead, sel, value.to(state.dtype))

    def split(self) -> list["LayerBatch"]:
        """One batch per layer of the group (views of q and k; itself for one layer)."""
        if len(self.layers) == 1:
            return [self]
        H, kv = self.heads, self.k.shape[2] // len(self.layers)
        return [LayerBatch(L, self.q[:, :, j * H:(j + 1) * H], self.k[:, :, j * kv:(j + 1) * kv],
                           self.index, self.scale, self.rows, self.workspace, None,
                           self.terms if self.layer_terms is None else self.layer_terms,
                           mask=self.mask)
                for j, L in enumerate(self.layers)]

    @cached_property
    def logit_qk(self) -> tuple[Float[Tensor, "batch pos head_index d_logit"],
                                Float[Tensor, "batch pos kv_head_index d_logit"]]:
        """(q', k') with scale·q'·k'ᵀ = the additive part of the softmax's input."""
        return fold_qk(self.q, self.k, self.terms, self.scale)

    @property
    def chunk(self) -> int | None:
        """The chunk of the layer's chunked mask where it binds (T > chunk), else None."""
        c = self.terms.chunk
        return c if c is not None and c < self.q.shape[1] else None

    @cached_property
    def kept_qk(self) -> tuple[Float[Tensor, "batch pos head_index d_kept"],
                               Float[Tensor, "batch pos kv_head_index d_kept"]]:
        """:attr:`logit_qk`, or where a chunk binds its
        :func:`~poskernel_tl.models.softmax_ops.chunk_qk`: (q', k') whose product is the
        additive logit on the entries the mask keeps and exactly 0 across chunks, what a
        sum over the kept entries streams from (the counts come from the mask)."""
        q, k = self.logit_qk
        return (q, k) if self.chunk is None else chunk_qk(q, k, self.chunk)

    @property
    def streams(self) -> bool:
        """Whether the logits are a bilinear form of :attr:`logit_qk`, so that fits may
        stream sums of q and k (False for soft-capped logits and for an offset table that
        does not fold: those read :attr:`scores`)."""
        return self.terms.bilinear

    @cached_property
    def on_kernels(self) -> bool:
        """Whether this batch's statistics are read from the tiled kernels (on a GPU:
        :func:`poskernel_tl.kernels.active`, the one rule) rather than the chunked
        sums designed for a CPU; a chunk that binds, or an offset table that does not
        fold, takes those sums on every device, as does a layer whose mask the kernels do
        not take: :attr:`~poskernel_tl.mask.Mask.kernels`)."""
        return kernels.takes(self.q, self.chunk) and not self.terms.offsets \
            and (self.mask is None or self.mask.kernels)

    def path(self, source: str = "lags", tiles: bool = True) -> str:
        """How a fit of the logits reads this batch, chosen here for every reducer:
        ``"tiles"`` (the tiled kernels: :attr:`on_kernels`), ``"streamed"`` (sums streamed
        from q and k on the CPU's path: :attr:`streams`), or ``"scores"`` (the materialised
        logits: the reference path, ``source="scores"``, and logits that are no bilinear
        form of q and k). ``tiles``: False for a fit the kernels do not compute (the
        within-row fit), which streams or materialises on every device."""
        if source == "lags" and tiles and self.on_kernels:
            return "tiles"
        return "streamed" if source == "lags" and self.streams else "scores"

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.q.shape[2] // self.k.shape[2]

    @cached_property
    def scores(self) -> Float[Tensor, "batch head_index query_pos key_pos"]:
        if self.hooked_scores is not None:
            A = self.hooked_scores
            if self.chunk is not None:  # 0 across chunks, as the formed scores are
                t = torch.arange(A.shape[-1], device=A.device)
                A = torch.where(Mask(len(t), chunk=self.chunk).same_chunk(t[:, None], t[None]),
                                A, 0.0)
            return A
        T, dev = self.q.shape[1], self.q.device
        return finish_scores(qk_scores(*self.kept_qk, self.scale,
                                       partial(self.workspace.get, "scores")),
                             self.terms, lambda: entry_offsets(torch.arange(T, device=dev),
                                                               torch.arange(T, device=dev)), T)


class Reducer(Protocol):
    """Running statistics over batches (see the module docstring)."""

    def update(self, batch: LayerBatch) -> None: ...

    def result(self) -> Any: ...
