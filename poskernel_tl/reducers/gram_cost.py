"""What Track B holds and costs, by path: the evaluation sequences' q/k factors or the
[T, T] accumulator in row blocks. The memory plan (:mod:`poskernel_tl.plan.batching`) sums
these bytes with what every other reducer states of itself and picks the path by
:func:`track_b_seconds` where both fit."""

import math

from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.reducers.two_sided import sides

GRAM_ROWS = 64  # query rows per block of the Track B accumulator
FACTOR_RANK_MAX = 256  # Track B may keep factors only up to n_eval·d_head of this
# Track B's CPU seconds per unit of work on one core, by path (``python
# scripts/bench_tracks.py --calibrate`` measures them, here on the reference 2-core CPU with
# one thread; the plan compares the two paths'
# estimates, so on another device only their ratios matter): the accumulator's update per
# lower-triangle entry·d_head·sequence and its fit per entry·d_head; the factors' fit per
# position·rank·log2(2T) (lag sums by FFT) and per position·rank² (running moments; at the
# ranks the factors are kept for, r ≤ 256, its share is near the timings' noise: the
# non-negative fit has given it 0 on some runs). The corrections to each centering cost the
# same on both paths and are left out.
COST = {"update": 2.1e-11, "fit": 7.5e-11, "factor_lags": 2.4e-9, "factor_rank": 1.4e-11}


def gram_row_blocks(length: int, full: bool, rows: int = GRAM_ROWS
                    ) -> list[tuple[int, int, int]]:
    """How the Track B accumulator of one layer is laid out: ``(r0, r1, keys)`` per block
    of query rows [r0, r1), holding keys [0, keys): ``keys = r1`` (the strictly lower
    triangle plus the diagonal blocks, ≈ T²/2 + T·rows/2 entries) or, ``full``, every key
    (T²: the whole matrix, for saving it)."""
    return [(r0, min(r0 + rows, length), length if full else min(r0 + rows, length))
            for r0 in range(0, length, rows)]


def factors_allowed(model: LoadedModel, n_eval: int, full: bool) -> bool:
    """Whether Track B may keep the evaluation sequences' q̃, k̃ instead of an accumulator:
    no full matrix is to be returned and their rank n·d_head is at most
    :data:`FACTOR_RANK_MAX` (the fit's moments grow as its square)."""
    return not full and n_eval * model.spec.d_head <= FACTOR_RANK_MAX


def track_b_seconds(model: LoadedModel, length: int, n_eval: int, factors: bool) -> float:
    """Estimated CPU seconds of Track B over every layer on one path (:data:`COST`): the
    accumulator's updates, O(n·T²·d), and fit, O(T²·d); or the factors' fit,
    O(T·r·log T + T·r²) with r = n·d_head; each per triangle a fit reads."""
    s, T = model.spec, length
    if factors:
        r = n_eval * s.d_head
        head = T * r * (COST["factor_lags"] * math.log2(2 * T) + COST["factor_rank"] * r) \
            * sides(model)
    else:
        head = T * T / 2 * sides(model) * s.d_head * (COST["update"] * n_eval + COST["fit"])
    return s.n_layers * s.n_heads * head


def track_b_paths(model: LoadedModel, length: int, n_eval: int, full: bool
                  ) -> dict[bool, float]:
    """The paths Track B may take (True: the factors, False: the accumulator), fastest
    first, with their estimated CPU seconds."""
    paths = [f for f in (False, True) if not f or factors_allowed(model, n_eval, full)]
    seconds = {f: track_b_seconds(model, length, n_eval, f) for f in paths}
    return dict(sorted(seconds.items(), key=lambda p: p[1]))


def gram_factors(model: LoadedModel, length: int, n_eval: int, full: bool) -> bool:
    """Track B's faster path where memory allows both: True keeps the evaluation
    sequences' factors (few sequences at long T), False the accumulator."""
    return next(iter(track_b_paths(model, length, n_eval, full)))


def gram_layer_bytes(model: LoadedModel, length: int, full: bool, n_eval: int = 0,
                     factors: bool = False) -> int:
    """Track B's state for one layer: the float32 accumulator in row blocks, or the
    ``factors``, and the float64 evaluation sums of q and k."""
    s, T = model.spec, length
    sums = (s.n_heads + s.n_kv_heads) * T * s.d_head * 8
    if factors:
        return (s.n_heads + s.n_kv_heads) * n_eval * T * s.d_head * 4 + sums
    return accumulator_bytes(model, T, full) + sums


def accumulator_bytes(model: LoadedModel, length: int, full: bool) -> int:
    """One layer's float32 Track B accumulator in row blocks (every key where ``full`` or
    where the model is bidirectional)."""
    every_key = full or sides(model) == 2
    acc = sum((r1 - r0) * keys for r0, r1, keys in gram_row_blocks(length, every_key))
    return model.spec.n_heads * acc * 4


def gram_fit_bytes(model: LoadedModel, length: int, n_eval: int, factors: bool) -> int:
    """Temporaries of Track B's fit of one layer: two centerings' corrections (U and V of
    rank 2·d_head in float64, their FFT lag sums), X, Y = B_side·X and a variant's W
    (X three d_head wide), and the float32 row block, or the factors' side-by-side copies
    and running moments; per side the fit reads. Measured peaks are 0.5–0.9 of it
    (tested at two lengths)."""
    s, T, n_sides = model.spec, length, sides(model)
    d, r = s.d_head, max(n_eval * s.d_head, 2 * s.d_head)
    vectors = (s.n_heads + s.n_kv_heads) * T * d * 8  # float64 [head, T, d_head], q and k
    lags = 8 * vectors * n_sides  # the FFTs of U and V padded to 2T, complex
    corrections = 6 * vectors + lags  # U, V of two centerings; X; their lag sums
    if factors:  # (Y and W within the side-by-side copies' share)
        chunks = -(-T // 64)
        moments = s.n_kv_heads * chunks * (2 * r * r + 2 * r * 4 * d) * 8
        return 3 * s.n_heads * T * r * 8 * n_sides + moments + corrections
    rows = min(GRAM_ROWS, T)
    pad = rows if n_sides == 2 else 0  # the upper side's zero columns
    y_w = s.n_heads * T * 5 * d * 8 * n_sides  # Y = B_side·X and one variant's W
    return 2 * s.n_heads * rows * (rows + T + pad) * 8 + y_w + corrections
