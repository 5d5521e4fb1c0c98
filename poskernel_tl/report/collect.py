"""Reading a results folder for the report: every condition once, with the files its
analyses wrote beside it (the spectral tables and spectra, the further analyses' CSVs) and
the token strings of its saved logit sequence.

A condition that cannot be read is recorded with the file and the reason
(:class:`Damaged`) and left out; the others are reported. Nothing here fits, tests or
recomputes: the report only reads.
"""

import json
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from poskernel_tl import constants as C
from poskernel_tl.analyses.base import AnalysisSpec
from poskernel_tl.analyses.spectral import SPEC as SPECTRAL
from poskernel_tl.analyses.spectral.io import SavedSpectral, read_spectral
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report import extras, figures
from poskernel_tl.report.tokens import Decoder, token_decoder
from poskernel_tl.schema import axes

Key = tuple[str, str, int]


@dataclass(frozen=True)
class Damaged:
    """A condition left out of the report: its name, the file at fault and why."""

    condition: str
    file: str
    reason: str


@dataclass
class SavedCondition:
    """One readable condition and what its analyses saved. ``logits_seq`` is the sequence
    whose logits the head views show (the first saved one; None when none was saved) and
    ``tokens`` its token strings, or those of the long view's sequence past 256 tokens
    (None when no vocabulary was found)."""

    result: ConditionResult
    spectral: SavedSpectral
    extras: dict[str, extras.Loaded]
    logits_seq: int | None = None
    tokens: list[str] | None = None
    kept: dict = field(default_factory=dict)  # what Figure 4 reads of ``kept_head``
    kept_head: tuple[int, int] | None = None

    def saved(self, analysis: AnalysisSpec):
        """What ``analysis`` saved for this condition: the spectral files as read, or the
        analysis' table (:class:`~poskernel_tl.report.extras.Loaded`; its status says
        whether it was run)."""
        if analysis.name == SPECTRAL.name:
            return self.spectral
        return self.extras.get(analysis.name) or extras.Loaded(analysis, Path())

    @property
    def key(self) -> Key:
        return (self.result.model, self.result.dataset, int(self.result.length))


def scan(results_dir: str | Path) -> tuple[list[Key], list[Damaged]]:
    """Every condition whose ``cfg.json`` marks it complete, and the ``cfg.json`` files that
    cannot be read (each a :class:`Damaged`)."""
    keys, damaged = [], []
    for cfg in sorted((Path(results_dir) / C.RESULTS_DIR).glob(f"*_{C.CFG}")):
        try:
            meta = json.loads(cfg.read_text(encoding="utf-8"))
            keys.append((str(meta["model"]), str(meta["dataset"]), int(meta["length"])))
        except (OSError, ValueError, KeyError, TypeError) as err:
            damaged.append(Damaged(cfg.name[: -len(C.CFG) - 1], cfg.name,
                                   f"unreadable ({type(err).__name__}: {err})"))
    return keys, damaged


def _damaged(err: Exception, key: Key) -> Damaged:
    """The file and the reason from a loading error (``"PATH: problem"`` when it names
    its file)."""
    text = str(err)
    match = re.match(r"^(\S*?[\w.-]+\.(?:csv|json|npz|pt))(?::\s*)(.*)$", text, flags=re.S)
    file, reason = (Path(match.group(1)).name, match.group(2)) if match else ("", text)
    return Damaged(C.stem(*key), file, reason or type(err).__name__)


def sequence_tokens(results_dir: str | Path, r: ConditionResult, seq_id: int,
                    decode: Decoder | None) -> list[str] | None:
    """The token strings of sequence ``seq_id`` of the condition's sequence file, or None
    (no decoder, no file, or a file that does not fit)."""
    path = C.seqs_path(results_dir, r.model, r.dataset, r.length)
    if decode is None or not path.is_file():
        return None
    try:
        seqs = torch.load(path, map_location="cpu", weights_only=True)
        ids = seqs["input_ids"]
        rows = [int(s) for s in seqs.get("seq_id", range(len(ids)))]
        row = ids[rows.index(int(seq_id))]
    except (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError):
        return None
    if len(row) != r.length:
        return None
    return decode(row.tolist())


class Decoders:
    """One token decoder per model, made on first use (``given`` overrides, by model)."""

    def __init__(self, given: Mapping[str, Decoder] | None = None):
        self.made: dict[str, Decoder | None] = dict(given or {})

    def __call__(self, r: ConditionResult) -> Decoder | None:
        if r.model not in self.made:
            self.made[r.model] = token_decoder(r.spec)
        return self.made[r.model]


def read_condition(results_dir: str | Path, key: Key, decoders: Callable
                   ) -> SavedCondition | Damaged:
    """Everything the report reads for one condition, or why it cannot be read (the
    condition is named in full, so another condition's damaged files cannot hide it)."""
    try:
        r = ConditionResult.load(results_dir, *key, lazy=True)  # one head's pages read
    except Exception as err:  # any failure to read one condition leaves it out, named
        return _damaged(err, key)
    spectral = read_spectral(results_dir, r.model, r.dataset, r.length, r.n_layers, r.n_heads)
    further = extras.load_condition(results_dir, r.model, r.dataset, r.length, r.n_layers,
                               r.n_heads)
    cond = SavedCondition(r, spectral, further)
    if r.logits:
        cond.logits_seq = int(sorted(r.logits)[0])
        cond.tokens = sequence_tokens(results_dir, r, cond.logits_seq, decoders(r))
    elif r.parts.get("long_view") is not None:  # the tokens of the long view's sequence
        cond.tokens = sequence_tokens(results_dir, r, r.parts["long_view"].seq_id, decoders(r))
    return cond


def iter_conditions(results_dir: str | Path, decoders: Mapping[str, Decoder] | None = None
                    ) -> Iterator[SavedCondition | Damaged]:
    """Every condition under ``results_dir`` in order, read one at a time (a
    :class:`Damaged` for each that cannot be read, unreadable ``cfg.json`` files first)."""
    keys, broken = scan(results_dir)
    yield from broken
    make = Decoders(decoders)
    for key in keys:
        yield read_condition(results_dir, key, make)


def slim(cond: SavedCondition, head: tuple[int, int] | None = None) -> SavedCondition:
    """The condition without the arrays nothing after its data file reads: centering
    means, logits and Gram matrices dropped, every g(Δ) and spectrum a zero placeholder
    of its shape (no memory behind it); ``head``'s arrays (the head Figure 4 may show)
    copied into ``cond.kept`` first."""
    r, spectral = cond.result, cond.spectral
    if head is not None:
        cond.kept_head, cond.kept = head, figures.head_arrays(r, *head)
        cond.kept.update({f"spectrum_{s}": np.array(a[head])
                          for s, a in spectral.spectra.items()})
    zero = lambda a: np.broadcast_to(np.float32(0), np.shape(a))  # no memory behind it
    spectral.spectra = {s: zero(a) for s, a in spectral.spectra.items()}
    kernels = {name: zero(a) for part in r.parts.values()  # every array over the lags
               for name, tp in typing.get_type_hints(type(part)).items()
               if (axes(tp) or ("",))[-1] == "lag" and (a := getattr(part, name)) is not None}
    cond.result = r.replace(mean_q=None, mean_k=None, mean_q_half=None, mean_k_half=None,
                            gram_raw=None, gram_centered=None, logits={}, **kernels)
    return cond


__all__ = ["SavedCondition", "Damaged", "Decoders", "iter_conditions", "read_condition", "scan",
           "sequence_tokens", "slim"]
