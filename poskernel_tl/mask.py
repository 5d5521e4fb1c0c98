"""What one layer's softmax keeps at one length, said once: :class:`Mask`.

A layer of a causal model keeps the entries (t, s) at offsets Δ = t − s = 1..``last``
below the diagonal (``last`` = T − 1: the whole triangle; a sliding window of W positions:
W − 1); a bidirectional layer keeps the same offsets on both sides (|t − s| ≤ ``last``); a
chunked mask of C positions (Llama 4) keeps only the entries whose query and key lie in
one chunk (⌊t / C⌋ = ⌊s / C⌋), ``chunk`` set where it binds (T > C). The diagonal
(Δ = 0) is never fitted (the softmax reads it: ``diagonal=True``). Every fit, analysis,
pattern and view that reads "the entries the softmax keeps" asks the layer's mask
(:meth:`poskernel_tl.models.geometry.Geometry.mask`): :meth:`Mask.offsets` is the offset
test, :meth:`Mask.keeps` the entry test (:meth:`Mask.kept` of any rows against any keys),
:meth:`Mask.keys` the keys a block of rows reads, :attr:`Mask.kernels` whether the tiled
kernels take the layer.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jaxtyping import Bool


def within(lag: Any, last: int | None) -> Any:
    """The window's offset test, the one in Python: whether offsets ``lag`` (≥ 0: a side's
    Δ, or |t − s|; tensors, arrays or numbers) are kept by a window whose last kept offset
    is ``last`` (None: every offset, True)."""
    return True if last is None else lag <= last


@dataclass(frozen=True)
class Mask:
    """See the module docstring: ``length`` T, ``causal`` (else both triangles),
    ``last`` the last offset kept on each kept side, ``chunk`` the chunk where one binds
    (None: no chunk, or one no shorter than T)."""

    length: int
    causal: bool = True
    last: int | None = None  # None: T − 1, every offset
    chunk: int | None = None

    def __post_init__(self) -> None:
        T = self.length
        last = T - 1 if self.last is None else min(self.last, T - 1)
        object.__setattr__(self, "last", last)
        if self.chunk is not None and self.chunk >= T:
            object.__setattr__(self, "chunk", None)

    @property
    def window_last(self) -> int | None:
        """The last offset kept where a window cuts the triangle, else None: what the fits
        and streamed sums take as ``last`` (None: every offset, as in :func:`within`)."""
        return self.last if self.last < self.length - 1 else None

    @property
    def reach(self) -> int:
        """The largest offset with a kept entry (a binding chunk's C − 1 at most)."""
        return self.last if self.chunk is None else min(self.last, self.chunk - 1)

    @property
    def whole(self) -> bool:
        """Whether the layer keeps every entry of its triangle(s)."""
        return self.window_last is None and self.chunk is None

    @property
    def every_key(self) -> bool:
        """Whether every row reads every key (a bidirectional layer whose mask keeps all)."""
        return not self.causal and self.whole

    @property
    def kernels(self) -> bool:
        """Whether the tiled kernels take the layer: no chunk binds, and a two-sided layer
        keeps every entry (their other masks are the causal triangle and its window)."""
        return self.chunk is None and (self.causal or self.whole)

    def cut(self, length: int) -> "Mask":
        """The same rule at ``length`` (the first positions of a longer sequence)."""
        return Mask(length, self.causal, self.last, self.chunk)

    def keys(self, r0: int, r1: int, align: int = 1) -> tuple[int, int]:
        """The keys [lo, hi) that query rows [r0, r1) read (lo a multiple of ``align``)."""
        if self.every_key:
            return 0, self.length
        lo = max(0, r0 - self.last) // align * align
        return lo, r1 if self.causal else min(self.length, r1 + self.last)

    def offsets(self) -> Bool[np.ndarray, " offset"]:
        """[2T − 1] booleans over the offsets t − s = −(T − 1) … T − 1: those kept."""
        lag = np.arange(-(self.length - 1), self.length)
        return self.side(lag) & within(np.abs(lag), self.last)

    def side(self, lag: Any, diagonal: bool = False) -> Any:
        """The side test, the one in Python: whether offsets ``lag`` = t − s lie on a kept
        side (causal: Δ ≥ 1; two-sided: Δ ≠ 0; ``diagonal``: Δ = 0 kept as well)."""
        if self.causal:
            return lag >= (0 if diagonal else 1)
        return (lag != 0) | diagonal

    def keeps(self, t: Any, s: Any, diagonal: bool = False) -> Any:
        """Whether query position ``t`` keeps key position ``s`` (tensors or numpy arrays,
        broadcast): the entry test. ``diagonal``: the softmax's test, which keeps s = t (the fits
        never read it)."""
        lag = t - s
        keep = self.side(lag, diagonal) & within(abs(lag), self.last)
        return keep if self.chunk is None else keep & self.same_chunk(t, s)

    def same_chunk(self, t: Any, s: Any) -> Any:
        """Whether ``t`` and ``s`` lie in one chunk (True without a binding chunk)."""
        return True if self.chunk is None else (t // self.chunk) == (s // self.chunk)

    def page(self) -> dict:
        """What a page's script reads of the mask (``PK.keeps`` in ``viewer.js``):
        ``twoSided``, ``last`` (the last offset kept where a window cuts, else null) and
        ``chunk`` (null: none binds)."""
        return {"twoSided": not self.causal, "last": self.window_last, "chunk": self.chunk}

    def kept(self, rows: Any = None, keys: Any = None, device=None,
             diagonal: bool = False) -> Any:
        """:meth:`keeps` of each query position of ``rows`` against each key position of
        ``keys``: a bool tensor [query_pos, key_pos] (``rows``, ``keys``: index tensors;
        None: every position, on ``device``)."""
        import torch  # (here, not above: the command line answers before torch loads)

        T = self.length
        if rows is None:
            rows = torch.arange(T, device=device if keys is None else keys.device)
        if keys is None:
            keys = torch.arange(T, device=rows.device)
        return self.keeps(rows[:, None], keys[None], diagonal)

    def lower(self, device=None) -> Any:
        """The kept entries of the strict lower triangle (s < t): a bool tensor
        [query_pos, key_pos]."""
        return self.kept(device=device).tril(-1)


def shared(masks: Sequence[Mask]) -> tuple[int, bool]:
    """The length and side that ``masks`` (one per layer: what every reducer is built from,
    :attr:`~poskernel_tl.models.geometry.Geometry.masks`) share: a TypeError for anything but
    a non-empty sequence of :class:`Mask`, a ValueError where two differ."""
    if isinstance(masks, Mask) or not isinstance(masks, Sequence) or not masks or \
            not all(isinstance(m, Mask) for m in masks):
        raise TypeError(f"expected one Mask per layer, got {type(masks).__name__}")
    kinds = {(m.length, m.causal) for m in masks}
    if len(kinds) > 1:
        raise ValueError(f"the layers' masks differ in length or side: {sorted(kinds)}")
    return kinds.pop()


__all__ = ["Mask", "shared", "within"]
