"""What one layer's softmax keeps at one length, said once: :class:`Mask`.

A layer of a causal model keeps the entries (t, s) at offsets Δ = t − s = 1..``last``
below the diagonal (``last`` = T − 1: the whole triangle; a sliding window of W positions:
W − 1); a bidirectional layer keeps the same offsets on both sides (|t − s| ≤ ``last``); a
chunked mask of C positions (Llama 4) keeps only the entries whose query and key lie in
one chunk (⌊t / C⌋ = ⌊s / C⌋), ``chunk`` set where it binds (T > C). The diagonal
(Δ = 0) is never fitted. Every fit, analysis and view that reads "the entries the softmax
keeps" asks the layer's mask (:meth:`poskernel_tl.models.geometry.Geometry.mask`):
:meth:`Mask.offsets` is the offset test, :meth:`Mask.kept` the entry test of any rows
against any keys.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from jaxtyping import Bool


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
    def max_lag(self) -> int | None:
        """The last offset kept where a window cuts the triangle, else None (the fits'
        ``max_lag`` argument)."""
        return self.last if self.last < self.length - 1 else None

    @property
    def reach(self) -> int:
        """The largest offset with a kept entry (a binding chunk's C − 1 at most)."""
        return self.last if self.chunk is None else min(self.last, self.chunk - 1)

    @property
    def whole(self) -> bool:
        """Whether the layer keeps every entry of its triangle(s)."""
        return self.max_lag is None and self.chunk is None

    def offsets(self) -> Bool[np.ndarray, " offset"]:
        """[2T − 1] booleans over the offsets t − s = −(T − 1) … T − 1: those kept."""
        lag = np.arange(-(self.length - 1), self.length)
        keep = (lag >= 1) if self.causal else (lag != 0)
        return keep & (np.abs(lag) <= self.last)

    def kept(self, rows: Any = None, keys: Any = None, device=None) -> Any:
        """Whether each query position of ``rows`` keeps each key position of ``keys``:
        a bool tensor [query_pos, key_pos] (``rows``, ``keys``: index tensors; None: every
        position, on ``device``)."""
        import torch  # (here, not above: the command line answers before torch loads)

        T = self.length
        if rows is None:
            rows = torch.arange(T, device=device if keys is None else keys.device)
        if keys is None:
            keys = torch.arange(T, device=rows.device)
        keep = torch.as_tensor(self.offsets(), device=rows.device)
        keep = keep[rows[:, None] - keys[None] + T - 1]
        if self.chunk is not None:
            keep &= (rows[:, None] // self.chunk) == (keys[None] // self.chunk)
        return keep

    def lower(self, device=None) -> Any:
        """The kept entries of the strict lower triangle (s < t): a bool tensor
        [query_pos, key_pos]."""
        return self.kept(device=device).tril(-1)


__all__ = ["Mask"]
