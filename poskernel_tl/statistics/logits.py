"""The full logit matrices of a few evaluation sequences, for heatmaps and head pages
(the seed's visualization subset: evaluation indices 0, 11, …, 99 at T = 256)."""

from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float

from poskernel_tl.constants import VIEW_TOKENS, VIS_DIR
from poskernel_tl.errors import ResultFileError
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.reducers.base import LayerBatch
from poskernel_tl.schema import Part, SavedFiles
from poskernel_tl.statistics.statistic import StatisticContext, StatisticSpec


@dataclass
class SavedLogits(Part):
    """seq_id → logits [layer, head_index, query_pos, key_pos] (float32; NaN on and above
    the diagonal, which the causal mask removes; for a bidirectional model NaN on the
    diagonal only, which no fit reads), saved one file per sequence as
    ``A_vis/seq_{seq_id}.pt``; ``cfg.json`` lists the ids."""

    NAME = "saved_logits"
    logits: dict[int, Float[np.ndarray, "layer head_index query_pos key_pos"]] = field(
        default_factory=dict)

    def arrays(self) -> dict[str, dict[str | None, np.ndarray]]:
        return {f"{VIS_DIR}/seq_{sid}.pt": {None: mat} for sid, mat in sorted(
            self.logits.items())}

    @classmethod
    def load(cls, saved: SavedFiles, dims: dict[str, int], logits=()):
        """``logits``: the seq_ids ``cfg.json`` lists."""
        part = cls({int(sid): saved.array(f"{VIS_DIR}/seq_{sid}.pt", None) for sid in logits})
        part.check(dims, saved.path_of(VIS_DIR))
        return part

    def check(self, dims: dict[str, int], where: object = "", unchecked=()) -> dict[str, int]:
        shape = tuple(dims[a] for a in ("layer", "head_index", "query_pos", "key_pos"))
        for sid, mat in self.logits.items():
            if tuple(mat.shape) != shape:
                raise ResultFileError(f"{where}: logits of sequence {sid} have shape "
                                      f"{tuple(mat.shape)}, expected {shape}")
        return dims


def logit_bytes(model: LoadedModel, length: int, n_logits: int) -> int:
    """``n_logits`` sequences' float32 [layer, head, T, T] logits (none past VIEW_TOKENS:
    :mod:`poskernel_tl.statistics.long_view` keeps one sequence's long view there)."""
    s = model.spec
    if length > VIEW_TOKENS:
        return 0
    return n_logits * s.n_layers * s.n_heads * length * length * 4


class LogitSaver:
    def __init__(self, wanted: dict[int, int], n_layers: int, causal: bool = True):
        self.wanted = wanted  # position within the pass -> seq_id
        self.causal = causal
        self.layers: dict[int, list] = {i: [None] * n_layers for i in wanted}

    def update(self, batch: LayerBatch) -> None:
        for row, i in enumerate(batch.rows):
            if i in self.wanted:  # a copy of the ≤ 10 wanted sequences, on the device
                A = batch.scores[row].float()
                T = A.shape[-1]
                hide = torch.ones(T, T, dtype=torch.bool, device=A.device).triu()
                if not self.causal:
                    hide &= ~hide.triu(1)  # the diagonal alone
                self.layers[i][batch.layer] = A.masked_fill(hide, float("nan"))

    def result(self) -> SavedLogits:
        return SavedLogits({self.wanted[i]: torch.stack(v).cpu().numpy()
                            for i, v in self.layers.items() if all(x is not None for x in v)})


def build(run: StatisticContext) -> LogitSaver | None:
    """The full logits of the pass positions ``run.wanted`` (None: none wanted, or past
    VIEW_TOKENS tokens)."""
    if not run.wanted or run.length > VIEW_TOKENS:
        return None
    return LogitSaver(dict(run.wanted), run.spec.n_layers, causal=run.geometry.causal)


STATISTIC = StatisticSpec(
    "saved_logits", SavedLogits, build, "the full logits of a few evaluation sequences",
    state_bytes=lambda model, work: logit_bytes(model, work.length, work.n_logits))

__all__ = ["STATISTIC", "LogitSaver", "SavedLogits", "logit_bytes"]
