"""``poskernel grid``: many conditions from one command, resumable and shardable.

A preset names a list of conditions (model × dataset × length × N). The grid plans them
(which weights and datasets this machine has), loads each model once, runs its
conditions through :func:`poskernel_tl.run.runner.run_condition`, and records each finished
condition in the folder's manifest (:mod:`poskernel_tl.run.manifest`); a rerun skips what is
complete and valid and redoes the rest. ``--shard I/N`` keeps the I-th of N contiguous,
balanced blocks of the planned list (0-based I; conditions are ordered model by model,
so the seed grid's 36 conditions in 6 shards give each shard one model), so a
scheduler's job array of N tasks covers the grid; ``--merge`` combines the shards'
folders.
"""

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from poskernel_tl import constants as C
from poskernel_tl import protocol
from poskernel_tl.analyses.registry import get as get_analysis
from poskernel_tl.data.datasets import HUB_DATASETS, hub_offline
from poskernel_tl.data.sequences import TooFewWindowsError, ensure_sequences
from poskernel_tl.errors import DataError, ModelUnavailableError, UserError
from poskernel_tl.folder import FolderLock, file_digest
from poskernel_tl.io import place_file, remove_stale_temporaries, save_csv
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.embedded import weights_identity as wheel_identity
from poskernel_tl.models.embedded import weights_path
from poskernel_tl.models.loading import (
    dtype_name,
    load_model,
)
from poskernel_tl.models.registry import EMBEDDED_DEFAULT, REGISTRY, resolve
from poskernel_tl.plan.config import GridConfig, RunConfig
from poskernel_tl.progress import tqdm
from poskernel_tl.run.analyze import run_analysis
from poskernel_tl.run.manifest import Manifest, key_of
from poskernel_tl.run.runner import run_condition

SEED_MODELS = ("gpt2", "gpt2-medium", "olmo-1b", "llama-3.2-1b", "tinyllama-1.1b",
               "tinyllama-nope-1.1b")
PRESETS = {
    # the seed's grid exactly
    "seed": dict(models=SEED_MODELS, datasets=("wikipedia", "code", "random"),
                 lengths=(256, 1024), n_seqs=200),
    # the embedded model on what every machine has offline
    "demo": dict(models=(EMBEDDED_DEFAULT,), datasets=("prose", "stdlib-code", "random"),
                 lengths=(256,), n_seqs=200),
}
SUMMARY_CSV = "grid_summary.csv"
LOG = "grid.log"


@dataclass(frozen=True)
class GridCell:
    """One cell of a grid: a model, a dataset and a length, and how many sequences its
    condition draws (``name``: the condition's file stem)."""

    model: str
    dataset: str
    length: int
    n_seqs: int

    @property
    def name(self) -> str:
        return C.stem(self.model, self.dataset, self.length)


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"I/N"`` → (I, N) with 0 ≤ I < N; None → (0, 1)."""
    if text is None:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text}: expected I/N, e.g. 0/6") from None
    if n < 1 or not 0 <= i < n:
        raise UserError(f"--shard {text}: need 0 <= I < N (shards are numbered 0..N-1)")
    return i, n


def plan(preset: str, models=None, datasets=None, lengths=None, n_seqs=None,
         shard: str | None = None) -> list[GridCell]:
    """The preset's conditions (optionally narrowed), in a fixed order, then sharded."""
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    models = list(models or p["models"])
    for m in models:
        resolve(m)  # unknown names fail here, listing the valid ones
    conds = [GridCell(m, d, int(t), int(n_seqs or p["n_seqs"]))
             for m in models for d in (datasets or p["datasets"])
             for t in (lengths or p["lengths"])]
    i, n = parse_shard(shard)
    block = np.array_split(np.arange(len(conds)), n)[i]  # contiguous: a model stays together
    return [conds[j] for j in block]



def weights_available(model: str) -> tuple[bool, str]:
    """Whether the weights are on this machine (embedded wheel, a local folder or the local
    HF cache)."""
    spec = resolve(model)
    if spec.wheel is not None:
        try:
            weights_path(spec)
            return True, "installed wheel"
        except ModelUnavailableError as err:
            return False, str(err)
    folder = Path(spec.hub_id).expanduser()
    if folder.is_dir():  # ``hf:`` naming a local folder
        if (folder / "config.json").is_file():
            return True, "local folder"
        return False, f"{folder} has no config.json"
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(spec.hub_id, "config.json")
    if isinstance(found, str):
        return True, "local Hugging Face cache"
    return False, f"{spec.hub_id} is not in the local Hugging Face cache (`hf download " \
                  f"{spec.hub_id}`)"


def dataset_available(dataset: str) -> tuple[bool, str]:
    if dataset in HUB_DATASETS:
        if hub_offline():
            return False, f"{dataset} streams from the hub and HF_HUB_OFFLINE is set"
        from importlib.util import find_spec

        if find_spec("datasets") is None:
            return False, f"{dataset} needs `pip install poskernel_tl[hub]`"
        return True, "hub (streamed)"
    return True, "offline"


def check_plan(conds: list[GridCell]) -> pd.DataFrame:
    """One row per condition: whether its weights and data are available here."""
    rows = []
    for c in conds:
        w_ok, w_note = weights_available(c.model)
        d_ok, d_note = dataset_available(c.dataset)
        rows.append({"condition": c.name, "weights": "yes" if w_ok else "MISSING",
                     "data": "yes" if d_ok else "MISSING", "weights_note": w_note,
                     "data_note": d_note, "ok": w_ok and d_ok})
    return pd.DataFrame(rows)


def weights_identity(model) -> str:
    """What identifies the weights: the GGUF file's checksum, or the hub revision."""
    spec = model.spec
    if spec.wheel is not None:
        return wheel_identity(spec)
    commit = getattr(model.hf_model.config, "_commit_hash", None)
    return f"{spec.hub_id}@{commit}"


def condition_key(cfg: RunConfig, model, seq_file: Path) -> str:
    run = {k: v for k, v in cfg.to_dict().items()
           if k not in ("out", "progress", "device", "overwrite", "max_memory")}
    return key_of({"config": run, "spec": model.spec.to_dict(),
                   "weights": weights_identity(model), "sequences": file_digest(seq_file),
                   "version": C.VERSION})


def _logger(out: Path) -> logging.Logger:
    log = logging.getLogger(f"poskernel.grid.{out}")
    if not log.handlers:
        handler = logging.FileHandler(out / LOG)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


def run_grid(conds: list[GridCell], cfg: GridConfig, load=None) -> pd.DataFrame:
    """Run ``conds`` into ``cfg.out``, then ``cfg.analyses`` on every condition; returns
    the summary table (also written as ``grid_summary.csv``). ``load(name)`` loads a
    model (default ``load_model``)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    analyses = [get_analysis(name) for name in cfg.analyses]  # unknown names fail first
    load = load or (lambda name: load_model(dataclasses.replace(cfg, model=name)))
    rows = []
    with FolderLock(out):
        remove_stale_temporaries(out)
        manifest, log = Manifest(out), _logger(out)
        log.info("grid of %d conditions into %s", len(conds), out)
        models: dict = {}

        def model_of(name: str):
            if name not in models:
                models.clear()  # one model in memory at a time
                models[name] = load(name)
            return models[name]

        bar = tqdm(conds, desc="conditions", unit="cond", disable=not cfg.progress)
        for c in bar:
            bar.set_postfix_str(c.name)
            rows.append(_run_one(c, cfg, model_of(c.model), manifest, log))
        for c in conds if analyses else ():  # after all tracks: the gate sees every one
            if manifest.entries.get(c.name):
                _analyses_of(c, cfg, analyses, model_of, manifest, log)
        table = pd.DataFrame(rows)
        save_csv(table, out / SUMMARY_CSV)
    return table


def _run_one(c: GridCell, cfg: GridConfig, model, manifest: Manifest, log) -> dict:
    """Measure one condition unless the manifest has it complete; its summary row."""
    out, t0 = Path(cfg.out), time.time()
    run = cfg.run_config(c.model, c.dataset, c.length, c.n_seqs, out=str(out),
                         dtype=dtype_name(model.dtype))
    different = UserError(f"{out} holds {c.name} from a different configuration; rerun "
                          "with --force to redo it, or use another --out")
    try:
        _, seq_file, _ = ensure_sequences(
            out, model.tokenizer, c.dataset, c.length, c.n_seqs, cfg.seed,
            model_name=c.model, n_ctx=model.spec.n_ctx, overwrite=cfg.force)
    except TooFewWindowsError as err:  # a stated reason, and on to the next one
        log.info("%s: skipped: %s", c.name, err)
        return {"condition": c.name, "status": f"skipped: {err}", "seconds": 0.0}
    except DataError as err:
        raise different from err
    key = condition_key(run, model, seq_file)
    status = manifest.status(c.name, key)
    if status == "different" and not cfg.force:
        raise different
    if status == "complete":
        log.info("%s: complete, skipped", c.name)
        return _summary_row(c, "skipped (complete)", 0.0, out)
    manifest.forget(c.name)
    result, written = run_condition(run, model=model)
    outputs = [p for k, p in written.items() if k != "sequences"]
    seconds = round(time.time() - t0, 1)
    manifest.record(c.name, key, outputs, {"seconds": seconds})
    log.info("%s: done in %.1f s", c.name, seconds)
    return _summary_row(c, "done", seconds, out, result)


def _analyses_of(c: GridCell, cfg: GridConfig, analyses, model_of, manifest: Manifest,
                 log) -> None:
    """Run each analysis on a measured condition unless the manifest records it done
    for the same measurement (resumable like the tracks)."""
    out = Path(cfg.out)
    base = manifest.entries[c.name]["key"]
    for spec in analyses:
        name, key = f"{c.name}:{spec.name}", key_of({"condition": base, "analysis": spec.name})
        if manifest.status(name, key) == "complete" and not cfg.force:
            continue
        known = REGISTRY.get(c.model)
        if known is not None and not spec.supports(known.causal):
            log.info("%s: %s not run (causal models only; %s is bidirectional)", c.name,
                     spec.name, c.model)
            continue
        t0 = time.time()
        run = cfg.run_config(c.model, c.dataset, c.length, c.n_seqs, out=str(out))
        model = model_of(c.model) if spec.needs_model else None
        if model is not None:
            run = dataclasses.replace(run, dtype=dtype_name(model.dtype))
        _, path = run_analysis(spec.name, run, model=model)
        outputs = sorted(path.parent.glob(f"{c.name}_{Path(spec.suffix).stem}*"))
        manifest.record(name, key, outputs, {"seconds": round(time.time() - t0, 1)})
        log.info("%s: %s done in %.1f s", c.name, spec.name, time.time() - t0)


def _summary_row(c: GridCell, status: str, seconds: float, out: Path, result=None) -> dict:
    if result is None:
        result = ConditionResult.load(out, c.model, c.dataset, c.length)
    early = protocol.early_layers(result.n_layers)
    late = protocol.late_layers(result.n_layers)
    mean = lambda a: float(np.nanmean(a)) if np.size(a) else float("nan")
    return {"condition": c.name, "status": status, "seconds": seconds,
            "R2_A_early": mean(result.r2_pooled[early]),
            "R2_A_late": mean(result.r2_pooled[late]),
            "R2_B_centered_early": mean(result.r2_gram[early]) if result.centered
            else float("nan"), **result.condition_values()}


def merge(sources: list[Path], out: Path) -> int:
    """Copy the complete conditions of shard folders into ``out`` (one manifest); a
    condition present in two sources with different keys is an error. Returns how many
    conditions ``out`` holds."""
    out = Path(out)
    with FolderLock(out):
        target = Manifest(out)
        for src in map(Path, sources):
            m = Manifest(src)
            for name, entry in m.entries.items():
                if name in target.entries and target.entries[name]["key"] != entry["key"]:
                    raise UserError(f"{name}: {src} and {out} hold different configurations")
                if m.status(name, entry["key"]) != "complete":
                    continue  # damaged or partial: leave it to a rerun of that shard
                for rel in entry["outputs"]:
                    place_file(src / rel, out / rel)
                for seq in (src / C.DATA_DIR).glob(f"{name}_seqs.pt"):
                    place_file(seq, out / C.DATA_DIR / seq.name)
                target.entries[name] = entry
        target.save()
        return len(target.entries)
