"""A condition's files: writing a :class:`~poskernel_tl.measurement.result.ConditionResult`
(:func:`save`), reading one back exactly, every file checked first (:func:`load`), and the
catalogue of a folder's saved conditions (:func:`conditions`, :func:`folder`,
:func:`saved_config`, :func:`saved_spec`). ``ConditionResult.save`` / ``.load`` and the
catalogue's static methods call these; the value itself knows no file."""

import json
from pathlib import Path

import numpy as np

from poskernel_tl import constants as C
from poskernel_tl.errors import NoConditionError, ResultFileError
from poskernel_tl.folder import file_digest
from poskernel_tl.io import save_arrays, save_csv, save_json
from poskernel_tl.measurement.parts import part_classes
from poskernel_tl.models.registry import ModelSpec
from poskernel_tl.reducers import GramResult, TrackAResult
from poskernel_tl.schema import SavedFiles
from poskernel_tl.statistics import SavedLogits


def save(r, out: str | Path) -> dict[str, Path]:
    """Write the condition ``r`` (a ConditionResult) under ``out``
    (``results/{model}_{dataset}_{T}_*``); ``cfg.json`` is written last, so its presence
    marks a complete condition. Returns the paths written."""
    path = lambda suffix: C.result_path(out, r.model, r.dataset, r.length,
                                        suffix)
    written = {table: save_csv(df, path(f"{table}.csv"))
               for table, df in r.tables().items()}
    if (heads := r.kernels()) is not None:
        written["heads"] = save_csv(heads, path(C.HEADS_CSV))
    files: dict[str, dict] = {C.G_ARRAYS: {"lags": np.arange(1, r.length),
                                            "seq_id": r.seq_id}}
    for part in r.parts.values():
        for file, arrays in part.arrays().items():
            files.setdefault(file, {}).update(arrays)
    for file, arrays in files.items():
        written[file] = save_arrays(path(file), arrays)
    prefix = str(path(""))  # a file's name in the record: its suffix ("trackA.csv")
    digests = {str(p)[len(prefix):]: file_digest(p) for p in map(Path, written.values())}
    meta = {"model": r.model, "dataset": r.dataset, "length": r.length,
            "spec": r.spec.to_dict(), "centered": bool(r.centered),
            "n_eval": len(r.seq_id), "n_centering": int(r.n_centering),
            "n_centering_half": int(r.n_centering_half),
            "whitened": r.r2_gram_whitened is not None,
            "logits_saved": sorted(int(k) for k in r.logits),
            "config": r.config, "provenance": r.provenance, "sha256": digests}
    written["cfg"] = save_json(meta, path(C.CFG))
    return written


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


def folder(out: str | Path) -> Path:
    """``out`` as a folder of saved conditions (one ``cfg.json`` at least, readable or
    not); :class:`~poskernel_tl.errors.NoConditionError` where it does not exist or
    holds none."""
    out = Path(out)
    if not out.is_dir():
        raise NoConditionError(f"{out} is not a folder: pass the --out folder of a run "
                               "or grid")
    if not any((out / C.RESULTS_DIR).glob(f"*_{C.CFG}")):
        raise NoConditionError(f"no complete condition under {out}: run `poskernel run` "
                               "or `poskernel grid` with --out there first")
    return out


def saved_config(out: str | Path, model: str, dataset: str, length: int) -> dict:
    """The configuration a saved condition was run with, read from its ``cfg.json``."""
    return dict(_meta(out, model, dataset, length).get("config") or {})


def saved_spec(out: str | Path, model: str, dataset: str, length: int) -> ModelSpec:
    """The model spec of a saved condition, read from its ``cfg.json`` alone."""
    return ModelSpec.from_dict(_meta(out, model, dataset, length)["spec"])


def load(cls, out: str | Path, model: str | None = None, dataset: str | None = None,
         length: int | None = None, lazy: bool = False):
    """Read a saved condition back (exactly) as a ``cls`` (ConditionResult). With several
    conditions under ``out``, ``model``/``dataset``/``length`` choose one (given all
    three, the folder is not scanned). Every file is read and checked (shapes against the
    spec, row counts, finiteness) before anything is returned; problems raise
    ResultFileError naming the file. ``lazy``: the ``.pt`` files (logits, Gram matrices,
    means) and the uncompressed members of the ``.npz`` files are mapped, not read: an
    array's pages are read when it is first touched, and its finiteness is left to
    whoever reads it (a reader that never rewrites the folder while it holds the arrays
    and reads few of them, such as the report)."""
    if None in (model, dataset, length):
        found = [c for c in conditions(out)
                 if (model is None or c[0] == model) and (dataset is None or c[1] == dataset)
                 and (length is None or c[2] == int(length))]
        if len(found) != 1:
            what = "no complete condition" if not found else f"{len(found)} conditions"
            raise ResultFileError(
                f"{what} under {out} match model={model} dataset={dataset} "
                f"length={length}; present: {conditions(out) or 'none'}")
        model, dataset, length = found[0]
    return _load(cls, Path(out), model, dataset, int(length), lazy)


def check_digests(out, model: str, dataset: str, length: int, digests: dict | None) -> None:
    """Every file a condition recorded (its ``cfg.json``'s ``sha256``: name → content hash)
    is present and unchanged; a ResultFileError names the first that is not. A condition
    written before the hashes were recorded is read on its structural checks alone."""
    for name, digest in sorted((digests or {}).items()):
        path = C.result_path(out, model, dataset, length, name)
        if not path.is_file():
            raise ResultFileError(f"{path}: missing")
        if (now := file_digest(path)) != digest:
            raise ResultFileError(
                f"{path}: changed after it was written (sha256 {digest[:12]}… recorded, "
                f"{now[:12]}… now); restore it, or rerun the command that wrote it")


def _meta(out, model: str, dataset: str, length: int) -> dict:
    path = C.result_path(out, model, dataset, length, C.CFG)
    try:
        meta = json.loads(path.read_text())
        meta["spec"] = ModelSpec.from_dict(meta["spec"]).to_dict()
        int(meta["n_eval"]), bool(meta["centered"])
        return meta
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ResultFileError(f"{path}: unreadable ({err})") from err


def _load(cls, out: Path, model: str, dataset: str, length: int, lazy: bool):
    meta = _meta(out, model, dataset, length)
    check_digests(out, model, dataset, length, meta.get("sha256"))
    spec = ModelSpec.from_dict(meta["spec"])
    saved = SavedFiles(lambda suffix: C.result_path(out, model, dataset, length, suffix),
                       lazy)
    seq_id = saved.array(C.G_ARRAYS, "seq_id")
    probe = cls.__new__(cls)
    probe.spec, probe.length, probe.seq_id = spec, length, seq_id
    dims = cls.dims(probe)
    a = saved.get(C.TRACK_A_CSV)
    stride = dims["layer"] * dims["head_index"]
    if len(a) != len(seq_id) * stride:
        raise ResultFileError(f"{saved.path_of(C.TRACK_A_CSV)}: has {len(a)} rows, "
                              f"expected {len(seq_id) * stride}")
    if "seq_id" not in a.columns or not np.array_equal(a["seq_id"].to_numpy()[::stride],
                                                       seq_id):
        raise ResultFileError(f"{saved.path_of(C.TRACK_A_CSV)}: seq_id values disagree "
                              f"with {saved.path_of(C.G_ARRAYS).name}")
    given = {TrackAResult: {"seq_index": np.arange(len(seq_id))},
             GramResult: {"centered": bool(meta["centered"])},
             SavedLogits: {"logits": [int(s) for s in meta.get("logits_saved", [])]}}
    parts = {}
    for part_cls in part_classes():
        part = part_cls.load(saved, dict(dims), **given.get(part_cls, {}))
        if part is not None:
            parts[part_cls.NAME] = part
    return cls(model, dataset, length, spec, seq_id, parts=parts,
               config=meta.get("config", {}), provenance=meta.get("provenance", {}))


__all__ = ["check_digests", "conditions", "folder", "load", "save", "saved_config", "saved_spec"]
