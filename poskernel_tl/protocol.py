"""The pre-registered protocol's definitions (Experiment 1), in one place: every module
that speaks of early layers, late layers, the spectral gate, the boundary rows or the
evaluation splits reads them from here."""

import numpy as np

# layers 0–1 are "early" (expected R² > 0.80), layers 4+ "late" (expected < 0.50);
# layers 2–3 are the moderate band in between
EARLY_LAYERS = (0, 1)
LATE_FROM = 4

# Phase 5: spectral analysis proceeds only if the mean pooled Track A R² of the rotary
# models' early-layer heads exceeds GATE_THRESHOLD; each head needs HEAD_THRESHOLD
GATE_THRESHOLD = 0.60
HEAD_THRESHOLD = 0.40
FALSIFY_BELOW = 0.40  # R² below this at early layers falsifies claim (a)

# the boundary-effect comparison (0-indexed query rows)
EARLY_ROWS = (1, 21)  # query positions 1..20
INTERIOR_FROM = 50  # query positions 50..T-1 (and keys 50.. for the interior block)

# evaluation splits: first half of the sequences centers Track B, second half evaluates
SPLIT_CENTERING = "centering"
SPLIT_EVAL = "eval"
N_SPLITS = 5  # random 80/20 subsets of the evaluation set (Step 3.5)
SPLIT_FRACTION = 0.8
VIS_EVAL_INDICES = tuple(range(0, 100, 11))  # eval indices 0, 11, ..., 99
# seed 004's design: 200 sequences per condition (half of them the centering set where the
# tokens are text), at T = 256 and 1024
DESIGN_SEQS = 200
DESIGN_LENGTHS = (256, 1024)


def design_differences(n_seqs: int, length: int, centered: bool, needs_centering: bool
                       ) -> list[str]:
    """How one condition differs from seed 004's design (empty: it is the design's): fewer
    sequences, another length, no centering set where the tokens are text."""
    out = []
    if n_seqs < DESIGN_SEQS:
        out.append(f"n = {n_seqs} sequences (the protocol: {DESIGN_SEQS})")
    if length not in DESIGN_LENGTHS:
        out.append(f"T = {length} (the protocol: {' and '.join(map(str, DESIGN_LENGTHS))})")
    if needs_centering and not centered:
        out.append("no centering set (Track B uncentered; the protocol centers text)")
    return out


def gate_met(early_r2: list) -> bool | None:
    """The spectral gate: the mean pooled Track A R² over the early-layer heads of every
    rotary condition (``early_r2``: one array per condition) exceeds GATE_THRESHOLD;
    None without rotary conditions."""
    if not early_r2:
        return None
    return bool(np.nanmean(np.concatenate([np.ravel(a) for a in early_r2])) > GATE_THRESHOLD)


def early_layers(n_layers: int) -> list[int]:
    """The early layers a model of ``n_layers`` has."""
    return [layer for layer in EARLY_LAYERS if layer < n_layers]


def late_layers(n_layers: int) -> list[int]:
    """Layers 4+ (empty for a model of 4 layers or fewer)."""
    return list(range(LATE_FROM, n_layers))

# offset bands of Track A's band fits: Δ in [1, 16], [17, 64], [65, 256], … (×4), the last
# ending at T − 1; then the cumulative bands Δ in [1, W] for each band's end W past the first
FIRST_BAND_END = 16
BAND_RATIO = 4


def band_ends(length: int) -> list[int]:
    """The last offset of each band that partitions Δ = 1..T−1 (ascending, ends at T − 1)."""
    ends, hi = [], FIRST_BAND_END
    while hi < length - 1:
        ends.append(hi)
        hi *= BAND_RATIO
    return ends + [length - 1]


def offset_bands(length: int) -> list[tuple[int, int]]:
    """(lo, hi), inclusive, of every band Track A fits at length T: the partition bands,
    then the cumulative [1, W] of each partition band's end but the first's."""
    ends = band_ends(length)
    parts = [(lo + 1, hi) for lo, hi in zip([0] + ends[:-1], ends)]
    return parts + [(1, hi) for hi in ends[1:]]
