"""Sums along the diagonals of a matrix, read as strided lines: the per-lag sums of
every path that gathers a head's entries into a matrix whose diagonals are its offsets
(:mod:`poskernel_tl.reducers.band_sums`, Track B's row blocks in
:mod:`poskernel_tl.reducers.gram_fit`, the tiled kernels'
:mod:`poskernel_tl.kernels.lag_tiles`)."""

import torch
from jaxtyping import Float
from torch import Tensor

ACC = torch.float64


def diagonal_sums(r: Float[Tensor, "batch head_index rows keys"], P: int, W: int
                  ) -> Float[Tensor, "batch head_index lag"]:
    """Σ_i r[..., i, i + P − Δ] for Δ = 1..W (float64): the lines m = P − W .. P − 1."""
    return diagonal_lines(r.contiguous(), P - W, W).sum(-1, dtype=ACC).flip(-1)


def diagonal_lines(m: Float[Tensor, "*batch rows keys"], first: int, n: int
                   ) -> Float[Tensor, "*batch line rows"]:
    """A view of ``n`` diagonals of ``m`` (unit stride along keys): line j is
    m[..., i, first + j + i] for every row i, starting at column first + j of row 0 and
    stepping one row and one column. A line that runs past the end of a row reads on into
    the next one: callers keep their lines within the rows (or zero what they reach)."""
    *lead, rows, _ = m.shape
    return m.as_strided((*lead, n, rows), (*m.stride()[:-2], 1, m.stride(-2) + 1),
                        m.storage_offset() + first)


__all__ = ["diagonal_lines", "diagonal_sums"]
