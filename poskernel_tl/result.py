"""One condition's measurement as a value: :class:`ConditionResult`.

:func:`poskernel_tl.measure` returns it without touching the disk; ``save`` writes the
seed's files (tidy CSVs, compact arrays, the centering means, …) and ``load`` reads them
back exactly, validating every file before anything is returned. The grid, the report,
head inspection and the analyses all work from this one object.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from poskernel_tl import constants as C
from poskernel_tl.errors import ResultFileError
from poskernel_tl.io import save_csv, save_json, save_npz, save_torch
from poskernel_tl.registry import ModelSpec

HEAD_ARRAYS_A = {  # attribute -> Track A CSV column, one value per (layer, head)
    "r2_pooled": "R2_pooled", "r2_pooled_nosink": "R2_pooled_nosink",
    "r2_pooled_early": "R2_pooled_early", "r2_pooled_interior": "R2_pooled_interior",
    "r2_pooled_interior_keys": "R2_pooled_interior_keys",
}
HEAD_ARRAYS_B = {"r2_gram_raw": "R2_gram_raw", "r2_gram_half": "R2_gram_half"}


@dataclass
class ConditionResult:
    """Track A and Track B for one (model, dataset, length) condition.

    Arrays use TransformerLens axis names; ``lag`` runs over Δ = 1..T−1 (index Δ−1).
    ``r2_gram``/``g_gram`` (centered Track B) are NaN when no centering sequences were
    given (random tokens, by the seed's rule); the tidy Track B table then reports the
    raw fit under ``R2_gram`` with ``centered`` false, as the seed's CSV does.
    """

    model: str
    dataset: str
    length: int
    spec: ModelSpec
    seq_id: Int[np.ndarray, " n_seqs"]
    # Track A
    r2_per_seq: Float[np.ndarray, "n_seqs layer head_index"]
    r2_per_seq_nosink: Float[np.ndarray, "n_seqs layer head_index"]
    g_per_seq: Float[np.ndarray, "n_seqs layer head_index lag"]  # float32
    r2_pooled: Float[np.ndarray, "layer head_index"]
    r2_pooled_nosink: Float[np.ndarray, "layer head_index"]
    g_pooled: Float[np.ndarray, "layer head_index lag"]
    r2_pooled_early: Float[np.ndarray, "layer head_index"]
    r2_pooled_interior: Float[np.ndarray, "layer head_index"]
    r2_pooled_interior_keys: Float[np.ndarray, "layer head_index"]
    r2_split: Float[np.ndarray, "split layer head_index"]
    # Track B
    centered: bool
    r2_gram: Float[np.ndarray, "layer head_index"]
    g_gram: Float[np.ndarray, "layer head_index lag"]
    r2_gram_raw: Float[np.ndarray, "layer head_index"]
    g_gram_raw: Float[np.ndarray, "layer head_index lag"]
    r2_gram_half: Float[np.ndarray, "layer head_index"]
    n_centering: int = 0
    n_centering_half: int = 0
    r2_gram_whitened: Float[np.ndarray, "layer head_index"] | None = None
    mean_q: Float[np.ndarray, "layer head_index pos d_head"] | None = None
    mean_k: Float[np.ndarray, "layer kv_head_index pos d_head"] | None = None
    mean_q_half: Float[np.ndarray, "layer head_index pos d_head"] | None = None
    mean_k_half: Float[np.ndarray, "layer kv_head_index pos d_head"] | None = None
    gram_raw: Float[np.ndarray, "layer head_index query_pos key_pos"] | None = None
    gram_centered: Float[np.ndarray, "layer head_index query_pos key_pos"] | None = None
    # rotary frequency usage (rotary models)
    q_pair_norm: Float[np.ndarray, "layer head_index pair"] | None = None
    k_pair_norm: Float[np.ndarray, "layer kv_head_index pair"] | None = None
    pair_first: Int[np.ndarray, " pair"] | None = None
    pair_second: Int[np.ndarray, " pair"] | None = None
    # joint position-permutation null of the pooled Track A R² (first few eval sequences)
    r2_perm_null: Float[np.ndarray, "perm layer head_index"] | None = None
    r2_perm_same_seqs: Float[np.ndarray, "layer head_index"] | None = None
    # head-projected positional kernel S_PE (learned absolute PE)
    s_pe: Float[np.ndarray, "layer head_index lag"] | None = None
    # full logits of a few evaluation sequences: seq_id -> [layer, head, T, T]
    logits: dict[int, np.ndarray] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------ derived values
    @property
    def n_layers(self) -> int:
        return self.r2_pooled.shape[0]

    @property
    def n_heads(self) -> int:
        return self.r2_pooled.shape[1]

    @property
    def kv_head(self) -> Int[np.ndarray, " head_index"]:
        return np.arange(self.n_heads) // (self.n_heads // self.spec.n_kv_heads)

    @property
    def thetas(self) -> np.ndarray | None:
        """The model's rotary frequencies θ_i (rad/token), or None without rotary."""
        return self.spec.rotary_frequencies()

    @property
    def usage(self) -> Float[np.ndarray, "layer head_index pair"] | None:
        """Frequency usage of each rotary pair, mean |q| × mean |k| (each query head with
        its key/value head), pairs in the order of :attr:`thetas`; None without rotary."""
        if self.q_pair_norm is None or self.k_pair_norm is None:
            return None
        q, k = np.asarray(self.q_pair_norm, np.float64), np.asarray(self.k_pair_norm,
                                                                    np.float64)
        return q * k[:, self.kv_head]

    @property
    def r2_split_mean(self) -> Float[np.ndarray, "layer head_index"]:
        return self.r2_split.mean(0)

    @property
    def r2_split_std(self) -> Float[np.ndarray, "layer head_index"]:
        return self.r2_split.std(0, ddof=1) if len(self.r2_split) > 1 else \
            np.full(self.r2_pooled.shape, np.nan)

    @property
    def g_trackB(self) -> tuple[Float[np.ndarray, "layer head_index lag"], str]:
        """The Track B g(Δ) the spectral analysis reads, and its name: the centered Gram,
        or the raw Gram where the condition is not centered."""
        return (self.g_gram, "gram_centered") if self.centered else (self.g_gram_raw,
                                                                     "gram_raw")

    def stem(self) -> str:
        return C.stem(self.model, self.dataset, self.length)

    # ------------------------------------------------------------------ tables
    def to_frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The tidy Track A table (one row per eval sequence, layer, head) and Track B
        table (one row per layer, head), with the seed's columns first."""
        n, L, H = self.r2_per_seq.shape
        s, layer, head = (g.ravel() for g in np.meshgrid(np.arange(n), np.arange(L),
                                                          np.arange(H), indexing="ij"))
        base = dict(model=self.model, dataset=self.dataset, length=self.length)
        a = pd.DataFrame({**base, "layer": layer, "head": head, "seq_id": self.seq_id[s],
                          "R2_per_seq": self.r2_per_seq.ravel()})
        a["R2_pooled"] = self.r2_pooled[layer, head]
        a["kv_head"] = self.kv_head[head]
        a["R2_per_seq_nosink"] = self.r2_per_seq_nosink.ravel()
        a["R2_per_seq_mean"] = np.nanmean(self.r2_per_seq, axis=0)[layer, head]
        a["R2_per_seq_std"] = (np.nanstd(self.r2_per_seq, axis=0, ddof=1)[layer, head]
                               if n > 1 else np.nan)
        for attr, col in HEAD_ARRAYS_A.items():
            if col != "R2_pooled":
                a[col] = getattr(self, attr)[layer, head]
        a["R2_split_mean"] = self.r2_split_mean[layer, head]
        a["R2_split_std"] = self.r2_split_std[layer, head]
        layer, head = (g.ravel() for g in np.meshgrid(np.arange(L), np.arange(H),
                                                      indexing="ij"))
        b = pd.DataFrame({
            **base, "layer": layer, "head": head,
            "R2_gram": (self.r2_gram if self.centered else self.r2_gram_raw)[layer, head],
            "R2_gram_raw": self.r2_gram_raw[layer, head],
            "R2_gram_half": self.r2_gram_half[layer, head],
            "centered": self.centered, "kv_head": self.kv_head[head],
            "n_centering": self.n_centering, "n_centering_half": self.n_centering_half})
        if self.r2_gram_whitened is not None:
            b["R2_gram_whitened"] = self.r2_gram_whitened[layer, head]
        return a, b

    def layer_summary(self) -> pd.DataFrame:
        """Mean over heads of each layer: pooled Track A, Track B centered and raw."""
        df = pd.DataFrame({
            "R2_A_pooled": np.nanmean(self.r2_pooled, axis=1),
            "R2_A_per_seq": np.nanmean(self.r2_per_seq, axis=(0, 2)),
            "R2_A_nosink": np.nanmean(self.r2_pooled_nosink, axis=1),
            "R2_B_centered": (np.nanmean(self.r2_gram, axis=1) if self.centered
                              else np.full(self.n_layers, np.nan)),
            "R2_B_raw": np.nanmean(self.r2_gram_raw, axis=1)})
        df.index.name = "layer"
        return df

    # ----------------------------------------------------------------- save/load
    def save(self, out: str | Path) -> dict[str, Path]:
        """Write the condition under ``out`` (``results/{model}_{dataset}_{T}_*``);
        ``cfg.json`` is written last, so its presence marks a complete condition.
        Returns the paths written."""
        out = Path(out)
        path = lambda suffix: C.result_path(out, self.model, self.dataset, self.length, suffix)
        a, b = self.to_frames()
        w = {"trackA": save_csv(a, path(C.TRACK_A_CSV)),
             "trackB": save_csv(b, path(C.TRACK_B_CSV)),
             "g": save_npz(path(C.G_ARRAYS), lags=np.arange(1, self.length),
                           seq_id=self.seq_id, trackA_per_seq=self.g_per_seq,
                           trackA_pooled=self.g_pooled, gram_centered=self.g_gram,
                           gram_raw=self.g_gram_raw, r2_split=self.r2_split)}
        if self.mean_q is not None:
            w["centering_means"] = save_torch(
                {k: torch.from_numpy(v) for k, v in
                 (("mean_q", self.mean_q), ("mean_k", self.mean_k),
                  ("mean_q_half", self.mean_q_half), ("mean_k_half", self.mean_k_half))
                 if v is not None}, path(C.CENTERING_MEANS))
        for name, mat in (("gram_raw", self.gram_raw), ("gram_centered", self.gram_centered)):
            if mat is not None:
                w[name] = save_torch(torch.from_numpy(mat), path(f"{name}.pt"))
        if self.q_pair_norm is not None:
            w["freq_usage"] = save_npz(
                path(C.FREQ_USAGE), theta=self.thetas, q_pair_norm=self.q_pair_norm,
                k_pair_norm=self.k_pair_norm, pair_first=self.pair_first,
                pair_second=self.pair_second)
        if self.s_pe is not None:
            w["pe_kernel"] = save_npz(path(C.PE_KERNEL), s_pe=self.s_pe)
        if self.r2_perm_null is not None:
            w["perm_null"] = save_npz(path(C.PERM_NULL), r2_perm_null=self.r2_perm_null,
                                      r2_perm_same_seqs=self.r2_perm_same_seqs)
        for sid, mat in sorted(self.logits.items()):
            w[f"A_vis_{sid}"] = save_torch(torch.from_numpy(mat),
                                           path(C.VIS_DIR) / f"seq_{sid}.pt")
        meta = {"model": self.model, "dataset": self.dataset, "length": self.length,
                "spec": self.spec.to_dict(), "centered": self.centered,
                "n_eval": len(self.seq_id), "n_centering": self.n_centering,
                "n_centering_half": self.n_centering_half,
                "whitened": self.r2_gram_whitened is not None,
                "logits_saved": sorted(int(k) for k in self.logits),
                "config": self.config, "provenance": self.provenance}
        w["cfg"] = save_json(meta, path(C.CFG))
        return w

    @staticmethod
    def conditions(out: str | Path) -> list[tuple[str, str, int]]:
        """(model, dataset, length) of every complete condition saved under ``out``."""
        found = []
        for cfg in sorted((Path(out) / C.RESULTS_DIR).glob(f"*_{C.CFG}")):
            try:
                meta = json.loads(cfg.read_text())
                found.append((meta["model"], meta["dataset"], int(meta["length"])))
            except (ValueError, KeyError) as err:
                raise ResultFileError(f"{cfg}: unreadable ({err})") from err
        return found

    @staticmethod
    def saved_spec(out: str | Path, model: str, dataset: str, length: int) -> ModelSpec:
        """The model spec of a saved condition, read from its ``cfg.json`` alone."""
        path = C.result_path(out, model, dataset, length, C.CFG)
        try:
            return ModelSpec.from_dict(json.loads(path.read_text())["spec"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ResultFileError(f"{path}: unreadable ({err})") from err

    @classmethod
    def load(cls, out: str | Path, model: str | None = None, dataset: str | None = None,
             length: int | None = None) -> "ConditionResult":
        """Read a saved condition back (exactly). With several conditions under ``out``,
        ``model``/``dataset``/``length`` choose one. Every file is read and checked
        (shapes against the spec, row counts, finiteness) before anything is returned;
        problems raise :class:`ResultFileError` naming the file."""
        from poskernel_tl.result_io import load_condition

        found = [c for c in cls.conditions(out)
                 if (model is None or c[0] == model) and (dataset is None or c[1] == dataset)
                 and (length is None or c[2] == int(length))]
        if len(found) != 1:
            what = "no complete condition" if not found else f"{len(found)} conditions"
            raise ResultFileError(
                f"{what} under {out} match model={model} dataset={dataset} "
                f"length={length}; present: {cls.conditions(out) or 'none'}")
        return load_condition(cls, Path(out), *found[0])

    def replace(self, **changes) -> "ConditionResult":
        return dataclasses.replace(self, **changes)
