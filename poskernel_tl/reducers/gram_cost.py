"""What Track B holds and costs, by path and layer: the evaluation sequences' q/k factors
or the accumulator in row blocks (the lower triangle, or a sliding window's band). The
memory plan (:mod:`poskernel_tl.plan.batching`) sums these bytes with what every other
reducer states of itself and picks, per kind of layer, the path by
:func:`track_b_seconds` where both fit."""

import itertools
import math

from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.reducers.lag_sums import MOMENT_BYTES
from poskernel_tl.reducers.two_sided import sides

GRAM_ROWS = 64  # query rows per block of the Track B accumulator
FACTOR_RANK_MAX = 256  # the factors' fit uses running moments up to n_eval·d_head of this
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


Path = tuple[bool, ...]  # per layer: True keeps the factors, False the accumulator


def gram_row_blocks(length: int, full: bool, rows: int = GRAM_ROWS,
                    last: int | None = None) -> list[tuple[int, int, int, int]]:
    """How the Track B accumulator of one layer is laid out: ``(r0, r1, k0, k1)`` per block
    of query rows [r0, r1), holding keys [k0, k1): ``k0 = 0, k1 = r1`` (the strictly lower
    triangle plus the diagonal blocks, ≈ T²/2 + T·rows/2 entries), on a layer whose window
    keeps the offsets Δ ≤ ``last`` only the window's band ``k0 = r0 − last``
    (≈ T·(last + rows) entries), or, ``full``, every key (T²: the whole matrix, for
    saving it)."""
    band = not full and last is not None and last < length - 1
    return [(r0, r1, max(0, r0 - last) if band else 0, length if full else r1)
            for r0 in range(0, length, rows) for r1 in [min(r0 + rows, length)]]


def block_entries(length: int, full: bool, last: int | None = None) -> int:
    """Entries of one head's accumulator (:func:`gram_row_blocks`)."""
    return sum((r1 - r0) * (k1 - k0) for r0, r1, k0, k1 in
               gram_row_blocks(length, full, last=last))


def layer_lags(model: LoadedModel, length: int) -> list[int | None]:
    """Per layer, the last offset its window keeps (None: the whole triangle)."""
    return [mask.window_last for mask in Geometry.of(model.spec, length).masks]


def low_rank(model: LoadedModel, n_eval: int) -> bool:
    """Whether the factors' fit may use running moments (rank n·d_head at most
    :data:`FACTOR_RANK_MAX`: they grow as its square); above it, the fit forms the
    accumulator's row blocks from the factors, one at a time."""
    return n_eval * model.spec.d_head <= FACTOR_RANK_MAX


def layer_seconds(model: LoadedModel, length: int, n_eval: int, factors: bool,
                  last: int | None) -> float:
    """Estimated CPU seconds of Track B on one layer (:data:`COST`): the accumulator's
    updates, O(n·E·d), and fit, O(E·d), over the E entries of its row blocks (the
    triangle, or a window's band) — as much for factors above the moments' rank, whose
    fit forms the same blocks; or the factors' fit by moments, O(T·r·log T + T·r²) with
    r = n·d_head; each per triangle a fit reads."""
    s, T = model.spec, length
    if factors and low_rank(model, n_eval):
        r = n_eval * s.d_head
        head = T * r * (COST["factor_lags"] * math.log2(2 * T) + COST["factor_rank"] * r)
    else:
        entries = block_entries(T, False, last) - T * min(GRAM_ROWS, T) / 2
        head = entries * s.d_head * (COST["update"] * n_eval + COST["fit"])
    return s.n_heads * head * sides(model)


def track_b_seconds(model: LoadedModel, length: int, n_eval: int, path: Path | bool) -> float:
    """Estimated CPU seconds of Track B over every layer on ``path`` (per layer, or one
    path for all)."""
    lags = layer_lags(model, length)
    path = as_path(path, len(lags))
    return sum(layer_seconds(model, length, n_eval, f, m) for f, m in zip(path, lags))


def as_path(path: Path | bool, n_layers: int) -> Path:
    """A per-layer path from one path for every layer."""
    return (path,) * n_layers if isinstance(path, bool) else tuple(path)


def track_b_paths(model: LoadedModel, length: int, n_eval: int, full: bool
                  ) -> dict[Path, float]:
    """The paths Track B may take, one choice per kind of layer (its window: layers alike
    choose alike), fastest first (ties: the smaller state, then the fewer factors), with
    their estimated CPU seconds. Factors never where full matrices are to be returned."""
    lags = layer_lags(model, length)
    kinds = sorted(set(lags), key=lambda m: -1 if m is None else m)
    choices = itertools.product(*[(False,) if full else (False, True) for _ in kinds])
    paths = [tuple(c[kinds.index(m)] for m in lags) for c in choices]
    seconds = {p: track_b_seconds(model, length, n_eval, p) for p in paths}
    every = range(len(lags))
    return dict(sorted(seconds.items(), key=lambda p: (
        p[1], gram_block_bytes(model, length, full, n_eval, p[0], every), sum(p[0]))))


def gram_factors(model: LoadedModel, length: int, n_eval: int, full: bool) -> Path:
    """Track B's fastest path where memory allows it, per layer (True keeps the
    evaluation sequences' factors, False the accumulator)."""
    return next(iter(track_b_paths(model, length, n_eval, full)))


def gram_layer_bytes(model: LoadedModel, length: int, full: bool, n_eval: int = 0,
                     factors: bool = False, last: int | None = None) -> int:
    """Track B's state for one layer: the float32 accumulator in row blocks (the window's
    band where ``last`` is one), or the ``factors``, and the float64 evaluation sums of
    q and k."""
    s, T = model.spec, length
    sums = (s.n_heads + s.n_kv_heads) * T * s.d_head * 8
    if factors:
        return (s.n_heads + s.n_kv_heads) * n_eval * T * s.d_head * 4 + sums
    return accumulator_bytes(model, T, full, last) + sums


def gram_block_bytes(model: LoadedModel, length: int, full: bool, n_eval: int,
                     path: Path | bool, layers: range) -> int:
    """Track B's state for a block of ``layers`` on ``path``."""
    lags = layer_lags(model, length)
    path = as_path(path, len(lags))
    return sum(gram_layer_bytes(model, length, full, n_eval, path[L], lags[L])
               for L in layers)


def accumulator_bytes(model: LoadedModel, length: int, full: bool,
                      last: int | None = None) -> int:
    """One layer's float32 Track B accumulator in row blocks (every key where ``full`` or
    where the model is bidirectional; a window's band where ``last`` is one)."""
    every_key = full or sides(model) == 2
    return model.spec.n_heads * block_entries(length, every_key, last) * 4


def gram_fit_bytes(model: LoadedModel, length: int, n_eval: int, factors: bool,
                   windowed: bool = False) -> int:
    """Temporaries of Track B's fit of one layer: two centerings' corrections (U and V of
    rank 2·d_head in float64, their FFT lag sums), X, Y = B_side·X and a variant's W
    (X three d_head wide), and the float32 row block, or the factors' side-by-side copies
    and running moments (above their rank: a row block formed from them); per side the
    fit reads; on a layer with a window (``windowed``) the corrections' running key
    moments too (float32 and float64 [T/64, kv, 2·d_head, 2·d_head]). Measured peaks are
    0.5–0.9 of it (tested at two lengths)."""
    s, T, n_sides = model.spec, length, sides(model)
    d, r = s.d_head, max(n_eval * s.d_head, 2 * s.d_head)
    vectors = (s.n_heads + s.n_kv_heads) * T * d * 8  # float64 [head, T, d_head], q and k
    lags = 8 * vectors * n_sides  # the FFTs of U and V padded to 2T, complex
    corrections = 6 * vectors + lags  # U, V of two centerings; X; their lag sums
    if windowed:
        corrections += s.n_kv_heads * -(-T // 64) * (2 * d) ** 2 * 12 + MOMENT_BYTES
    rows = min(GRAM_ROWS, T)
    pad = rows if n_sides == 2 else 0  # the upper side's zero columns
    y_w = s.n_heads * T * 5 * d * 8 * n_sides  # Y = B_side·X and one variant's W
    block = 2 * s.n_heads * rows * (rows + T + pad) * 8
    if factors and low_rank(model, n_eval):  # (Y and W within the side-by-side copies')
        chunks = -(-T // 64)
        moments = s.n_kv_heads * chunks * (2 * r * r + 2 * r * 4 * d) * 8
        return 3 * s.n_heads * T * r * 8 * n_sides + moments + corrections
    if factors:  # the factors side by side (float32) and one block formed from them
        return 2 * (s.n_heads + s.n_kv_heads) * T * r * 4 + block + y_w + corrections
    return block + y_w + corrections
