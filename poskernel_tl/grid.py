"""``poskernel grid``: many conditions from one command, resumable and shardable.

A preset names a list of conditions (model × dataset × length × N). The grid plans them
(which weights and datasets this machine has), loads each model once, runs its
conditions through :func:`poskernel_tl.runner.run_condition`, and records each finished
condition in the folder's manifest (:mod:`poskernel_tl.manifest`); a rerun skips what is
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
from poskernel_tl.datasets import HUB_DATASETS, DataError, hub_offline
from poskernel_tl.io import place_file, remove_stale_temporaries, save_csv
from poskernel_tl.manifest import FolderLock, Manifest, key_of, sha256
from poskernel_tl.registry import EMBEDDED_DEFAULT, resolve
from poskernel_tl.runner import RunConfig

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
class Condition:
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
        raise ValueError(f"--shard {text}: expected I/N, e.g. 0/6") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text}: need 0 <= I < N (shards are numbered 0..N-1)")
    return i, n


def plan(preset: str, models=None, datasets=None, lengths=None, n_seqs=None,
         shard: str | None = None) -> list[Condition]:
    """The preset's conditions (optionally narrowed), in a fixed order, then sharded."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    models = list(models or p["models"])
    for m in models:
        resolve(m)  # unknown names fail here, listing the valid ones
    conds = [Condition(m, d, int(t), int(n_seqs or p["n_seqs"]))
             for m in models for d in (datasets or p["datasets"])
             for t in (lengths or p["lengths"])]
    i, n = parse_shard(shard)
    block = np.array_split(np.arange(len(conds)), n)[i]  # contiguous: a model stays together
    return [conds[j] for j in block]


def weights_available(model: str) -> tuple[bool, str]:
    """Whether the weights are on this machine (embedded wheel or local HF cache)."""
    spec = resolve(model)
    if spec.loader == "gguf":
        from poskernel_tl.loading import ModelUnavailableError, embedded_model_dir

        try:
            embedded_model_dir()
            return True, "embedded wheel"
        except ModelUnavailableError as err:
            return False, str(err)
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


def check_plan(conds: list[Condition]) -> pd.DataFrame:
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
    if spec.loader == "gguf":
        from poskernel_tl.loading import embedded_model_dir

        path = embedded_model_dir() / spec.gguf_file
        return f"gguf:{path.stat().st_size}:{int(path.stat().st_mtime)}"
    commit = getattr(model.hf_model.config, "_commit_hash", None)
    return f"{spec.hub_id}@{commit}"


def condition_key(cfg: RunConfig, model, seq_file: Path) -> str:
    import poskernel_tl

    run = {k: v for k, v in cfg.to_dict().items() if k not in ("out", "progress", "device",
                                                                 "overwrite")}
    return key_of({"config": run, "spec": model.spec.to_dict(),
                   "weights": weights_identity(model), "sequences": sha256(seq_file),
                   "version": poskernel_tl.__version__})


@dataclass
class GridOptions:
    out: str = "artifacts/grid"
    device: str = "auto"
    batch_size: int | str = "auto"
    dtype: str = "auto"
    seed: int = 0
    force: bool = False
    progress: bool = True
    save_logits: str = "yes"  # head pages show a real sequence's pattern


def _logger(out: Path) -> logging.Logger:
    log = logging.getLogger(f"poskernel.grid.{out}")
    if not log.handlers:
        handler = logging.FileHandler(out / LOG)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


def run_grid(conds: list[Condition], opts: GridOptions, load=None) -> pd.DataFrame:
    """Run ``conds`` into ``opts.out``; returns the summary table (also written as
    ``grid_summary.csv``). ``load(name)`` loads a model (default ``load_model``)."""
    from tqdm.auto import tqdm

    from poskernel_tl.loading import dtype_name, load_model
    from poskernel_tl.runner import run_condition
    from poskernel_tl.sequences import TooFewWindowsError, ensure_sequences

    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    load = load or (lambda name: load_model(name, device=opts.device,
                                            dtype=opts.dtype, progress=opts.progress))
    rows = []
    with FolderLock(out):
        remove_stale_temporaries(out)
        manifest, log = Manifest(out), _logger(out)
        log.info("grid of %d conditions into %s", len(conds), out)
        bar = tqdm(conds, desc="conditions", unit="cond", disable=not opts.progress)
        models: dict = {}
        for c in bar:
            bar.set_postfix_str(c.name)
            t0 = time.time()
            if c.model not in models:
                models.clear()  # one model in memory at a time
                models[c.model] = load(c.model)
            model = models[c.model]
            cfg = RunConfig(model=c.model, dataset=c.dataset, length=c.length, seed=opts.seed,
                            n_seqs=c.n_seqs, out=str(out), device=opts.device,
                            batch_size=opts.batch_size, dtype=dtype_name(model.dtype),
                            save_logits=opts.save_logits if c.length <= 256 else "no",
                            progress=opts.progress)
            different = ValueError(
                f"{out} holds {c.name} from a different configuration; rerun with --force "
                "to redo it, or use another --out")
            try:
                _, seq_file, _ = ensure_sequences(
                    out, model.tokenizer, c.dataset, c.length, c.n_seqs, opts.seed,
                    model_name=c.model, n_ctx=model.spec.n_ctx, overwrite=opts.force)
            except TooFewWindowsError as err:  # a stated reason, and on to the next one
                rows.append({"condition": c.name, "status": f"skipped: {err}",
                             "seconds": 0.0})
                log.info("%s: skipped: %s", c.name, err)
                continue
            except DataError as err:
                raise different from err
            key = condition_key(cfg, model, seq_file)
            status = manifest.status(c.name, key)
            if status == "different" and not opts.force:
                raise different
            if status == "complete":
                rows.append(_summary_row(c, "skipped (complete)", 0.0, out))
                log.info("%s: complete, skipped", c.name)
                continue
            manifest.forget(c.name)
            result, written = run_condition(cfg, model=model)
            outputs = [p for k, p in written.items() if k != "sequences"]
            seconds = round(time.time() - t0, 1)
            manifest.record(c.name, key, outputs, {"seconds": seconds})
            rows.append(_summary_row(c, "done", seconds, out, result))
            log.info("%s: done in %.1f s", c.name, seconds)
        table = pd.DataFrame(rows)
        save_csv(table, out / SUMMARY_CSV)
    return table


def _summary_row(c: Condition, status: str, seconds: float, out: Path, result=None) -> dict:
    if result is None:
        from poskernel_tl.result import ConditionResult

        result = ConditionResult.load(out, c.model, c.dataset, c.length)
    early = result.r2_pooled[: min(2, result.n_layers)]
    late = result.r2_pooled[result.n_layers // 2:]
    return {"condition": c.name, "status": status, "seconds": seconds,
            "R2_A_early": float(np.nanmean(early)), "R2_A_late": float(np.nanmean(late)),
            "R2_B_centered_early": float(np.nanmean(result.r2_gram[:2]))
            if result.centered else float("nan")}


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
                    raise ValueError(f"{name}: {src} and {out} hold different configurations")
                if m.status(name, entry["key"]) != "complete":
                    continue  # damaged or partial: leave it to a rerun of that shard
                for rel in entry["outputs"]:
                    place_file(src / rel, out / rel)
                for seq in (src / C.DATA_DIR).glob(f"{name}_seqs.pt"):
                    place_file(seq, out / C.DATA_DIR / seq.name)
                target.entries[name] = entry
        target.save()
        return len(target.entries)


def options_from(**kw) -> GridOptions:
    names = {f.name for f in dataclasses.fields(GridOptions)}
    return GridOptions(**{k: v for k, v in kw.items() if k in names and v is not None})
