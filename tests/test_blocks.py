"""The overview grid's block sums of a function of the offset (double prefix sums)
against a naive loop over every entry, and the fit mask against its definition."""

import numpy as np
import pytest

from poskernel_tl.fit.blocks import block_size, block_sums, fit_blocks, fit_mask, read_offsets
from poskernel_tl.mask import Mask


@pytest.mark.parametrize("T,n_blocks", [(1, 4), (7, 3), (50, 7), (64, 8), (97, 10)])
def test_block_sums_equal_a_naive_loop(T, n_blocks):
    rng = np.random.default_rng(T)
    G = rng.standard_normal((3, 2 * T - 1))  # three heads
    b, n = block_size(T, n_blocks)
    want = np.zeros((3, n, n))
    for t in range(T):
        for s in range(T):
            want[:, t // b, s // b] += G[:, t - s + T - 1]
    np.testing.assert_allclose(block_sums(G, T, b), want, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("two_sided,last,chunk", [(False, None, None), (False, 5, None),
                                                 (True, None, None), (True, 5, None),
                                                 (False, None, 7), (False, 4, 9)])
def test_fit_blocks_count_the_read_entries(two_sided, last, chunk):
    """Every mask: causal or two-sided, a window, a chunk (not aligned with the blocks)."""
    T, b = 23, 4
    mask = Mask(T, not two_sided, last, chunk)
    keep = fit_mask(mask)
    t, s = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    lag = t - s
    rule = (lag != 0) if two_sided else (lag >= 1)
    if last is not None:
        rule &= np.abs(lag) <= last
    offsets = rule.copy()
    if chunk is not None:
        rule &= t // chunk == s // chunk
    assert (keep == rule).all() and (read_offsets(T, two_sided, last)[lag + T - 1] == offsets).all()
    assert (fit_mask(mask, slice(5, 9)) == rule[5:9]).all()
    assert (mask.keeps(t, s) == rule).all()  # the entry test on numpy arrays
    assert (mask.keeps(t, s, diagonal=True) == (rule | (lag == 0))).all()  # the softmax's
    assert (mask.offsets()[lag + T - 1] == offsets).all()  # the offset test
    g = np.arange(1.0, T)
    f_sum, count = fit_blocks(g, -g if two_sided else None, b, mask)
    fit = np.where(lag > 0, lag, -lag if not two_sided else lag).astype(float)
    n = -(-T // b)
    for i in range(n):
        for j in range(n):
            block = (slice(i * b, (i + 1) * b), slice(j * b, (j + 1) * b))
            assert count[i, j] == keep[block].sum()
            np.testing.assert_allclose(f_sum[i, j], fit[block][keep[block]].sum(), atol=1e-9)
