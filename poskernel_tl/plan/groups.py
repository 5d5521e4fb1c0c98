"""Which layers of a forward are handed to the reducers together.

On the tiled kernels' path (:func:`poskernel_tl.kernels.active`: a GPU) the statistics of
one layer and batch are a few dozen small launches; at T ≤ 1024 their fixed cost, not the
work, is most of a measurement. There the layers of one *kind* — the same mask (the last
offset kept, no binding chunk), the same terms beyond scale·q·k, a causal model — are held
until the last of them is captured and handed over as one
:class:`~poskernel_tl.reducers.base.LayerBatch`: their q and k joined along the head axis,
so that every kernel and every reduction runs once for all of them, layers being one more
axis of the heads (query head h of the group's layer j is head j·H + h, and its key/value
head j·H_kv + h // (H / H_kv), which is what a kernel's h // group already reads). A layer
of another kind is another group; a layer the kernels do not take (a binding chunk, an
offset table), a soft-capped layer (whose within-row sums read its materialised logits), a
bidirectional model's and every layer on a CPU (where the chunked sums are large
operations whose count does not matter) is a group of its own.

A group holds its layers' q and k through the forward and their joined copy while the
reducers run: :func:`group_bytes` is what the memory plan counts, and ``max_layers`` (from
the plan) bounds a group.
"""

from collections.abc import Sequence

import torch

from poskernel_tl import kernels
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel

Groups = tuple[tuple[int, ...], ...]


def grouping(model: LoadedModel, geometry: Geometry, scores: bool = False) -> bool:
    """Whether this run groups layers: on the kernels' path, a causal model, Track A from
    the lag sums (not from materialised ``scores``: the reference paths)."""
    return kernels.active(torch.empty(0, device=model.device)) and geometry.causal \
        and not scores


def kind(model: LoadedModel, geometry: Geometry, layer: int) -> tuple | None:
    """What layers of one group share (None: the layer is a group of its own)."""
    terms = model.spec.layer_terms(layer)
    if geometry.chunk(layer) is not None or not terms.bilinear:
        return None  # (a cap or an offset table: the within-row sums read the scores)
    return geometry.lags[layer], terms


def layer_groups(model: LoadedModel, geometry: Geometry, layers: Sequence[int],
                 grouped: bool, max_layers: int = 1,
                 cuts: Sequence[int] = ()) -> Groups:
    """``layers`` in groups, in the order their last layer is captured (``grouped``
    false: one group per layer). A group takes the layers of one :func:`kind` up to
    ``max_layers`` of them, and never spans a layer of ``cuts`` (a group ends before it:
    Track B's blocks of layers)."""
    if not grouped or max_layers <= 1:
        return tuple((L,) for L in layers)
    open_: dict = {}
    done: list[tuple[int, ...]] = []
    for L in layers:
        key = kind(model, geometry, L)
        if key is None:
            done.append((L,))
            continue
        if L in cuts:  # close every open group at a block boundary
            done += [tuple(g) for g in open_.values()]
            open_ = {}
        group = open_.setdefault(key, [])
        group.append(L)
        if len(group) >= max_layers:
            done.append(tuple(open_.pop(key)))
    done += [tuple(g) for g in open_.values()]
    return tuple(sorted(done, key=max))


def group_bytes(model: LoadedModel, length: int, n_layers: int, itemsize: int = 4) -> int:
    """Bytes one sequence of a group of ``n_layers`` layers holds beyond one layer's: its
    layers' q and k kept through the forward, and their joined copy."""
    s = model.spec
    per_layer = length * (s.n_heads + s.n_kv_heads) * s.d_head * itemsize
    return 0 if n_layers <= 1 else (2 * n_layers - 1) * per_layer


__all__ = ["Groups", "group_bytes", "grouping", "kind", "layer_groups"]
