"""Artifact names: every file a run writes is named here and nowhere else."""

import hashlib
import re
from pathlib import Path

DATA_DIR = "data"
RESULTS_DIR = "results"
MANIFEST = "manifest.json"

VERSION = "0.2.0"
GRAM_SAVE_MAX_T = 256  # full T×T Gram matrices are written only up to this length
VIEW_TOKENS = 256  # full logits are saved (and head views drawn whole) up to this length;
# past it one sequence's long view: an overview of blocks and the zoom's q and k


def dataset_slug(dataset: str) -> str:
    """A filename-safe name for a dataset; ``text:PATH`` becomes ``text-<stem>-<hash6>``."""
    if dataset.startswith("text:"):
        path = dataset[len("text:"):]
        stem = re.sub(r"[^A-Za-z0-9]+", "-", Path(path).stem).strip("-")[:32] or "text"
        digest = hashlib.sha1(path.encode()).hexdigest()[:6]
        return f"text-{stem}-{digest}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", dataset)


def model_slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", model)


def stem(model: str, dataset: str, length: int) -> str:
    return f"{model_slug(model)}_{dataset_slug(dataset)}_{length}"


def seqs_path(out: str | Path, model: str, dataset: str, length: int) -> Path:
    return Path(out) / DATA_DIR / f"{stem(model, dataset, length)}_seqs.pt"


def result_path(out: str | Path, model: str, dataset: str, length: int, suffix: str) -> Path:
    """``results/{model}_{dataset}_{length}_{suffix}``, e.g. suffix ``trackA.csv``."""
    return Path(out) / RESULTS_DIR / f"{stem(model, dataset, length)}_{suffix}"


# suffixes of the per-condition result files
TRACK_A_CSV = "trackA.csv"
TRACK_B_CSV = "trackB.csv"
HEADS_CSV = "heads.csv"
BANDS_CSV = "bands.csv"  # the tables' files are named after them: f"{table}.csv"
SPECTRAL_CSV = "spectral.csv"
SPECTRAL_PEAKS_CSV = "spectral_peaks.csv"
G_ARRAYS = "g.npz"
CENTERING_MEANS = "centering_means.pt"
GRAM_CENTERED = "gram_centered.pt"
GRAM_RAW = "gram_raw.pt"
FREQ_USAGE = "freq_usage.npz"
FREQ_USAGE_CSV = "freq_usage.csv"
PE_KERNEL = "pe_kernel.npz"
PERM_NULL = "perm_null.npz"
CFG = "cfg.json"
VIS_DIR = "A_vis"
