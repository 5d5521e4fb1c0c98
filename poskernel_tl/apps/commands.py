"""What each ``poskernel`` subcommand does, once :mod:`poskernel_tl.apps.cli` has parsed
and checked its input: each a thin wrapper over a library call."""

import argparse
import dataclasses
import os
import sys

from poskernel_tl import constants as C
from poskernel_tl import protocol
from poskernel_tl.analyses.registry import REGISTRY
from poskernel_tl.apps.head_view_cli import cmd_inspect
from poskernel_tl.data.sequences import ensure_sequences
from poskernel_tl.errors import ResultFileError, UserError
from poskernel_tl.folder import FolderLock
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.embedded import install_lines
from poskernel_tl.models.families.registry import family_of
from poskernel_tl.models.loading import load_model, resolve_device
from poskernel_tl.models.registry import REGISTRY as MODELS
from poskernel_tl.models.registry import resolve
from poskernel_tl.models.sources import load_tokenizer
from poskernel_tl.plan.allocator import reuse_freed_memory
from poskernel_tl.plan.config import GridConfig, RunConfig, from_args
from poskernel_tl.report.build import build_report
from poskernel_tl.run.analyze import run_analysis
from poskernel_tl.run.executor import (
    GridJobError,
    by_model,
    describe_jobs,
    job_logs,
    submit_grid,
)
from poskernel_tl.run.grid import LOG, check_plan, merge, plan, run_grid
from poskernel_tl.run.runner import run_condition


def cmd_models(args) -> int:
    if args.pip:
        print("\n".join(install_lines()))
        return 0
    if args.name:
        model = load_model(args.name, device="cpu", progress=False)
        spec = model.spec
        print(f"{spec.name}: {spec.n_layers} layers, {spec.n_heads} query / {spec.n_kv_heads} "
              f"key-value heads, d_head {spec.d_head}, context {spec.n_ctx or 'not stated'}, "
              f"logit scale {model.logit_scale:.4g}")
        family = family_of(model.hf_model.config)
        if family is not None and family.note(model.hf_model):
            stack = f" {family.stack(spec.stack).name} stack" if family.STACKS else ""
            print(f"  {family.NAME}{stack}: {family.note(model.hf_model)}")
        for i, s in enumerate(spec.layers):
            start = f" from dimension {s.rotary_offset}" if s.rotary_offset else ""
            rope = "" if s.pe != "rope" else (f", {s.rotary_dims}/{spec.d_head} dims rotated"
                                              f"{start} ({s.layout})")
            rope += "" if s.block is None else f", block {s.block}"
            adds = s.terms.describe()
            print(f"  layer {i:3d}: {s.kind}{rope}, mask {s.mask}"
                  + (", QK-norm" if s.qk_norm else "")
                  + (f"; the softmax adds to scale·q·k: {adds}" if adds else ""))
        return 0
    cols = ("name", "hub_id", "pe", "norm", "n_layers", "n_heads", "n_kv_heads", "d_head",
            "rope_base", "loader")
    rows = [[str(getattr(s, c) if getattr(s, c) is not None else "-") for c in cols]
            + ["causal" if s.causal else "bidirectional"] for s in MODELS.values()]
    rows.append(["hf:<repo id>", "any TransformerLens-supported causal LM, BERT encoder, "
                 "or T5-family encoder-decoder (@encoder, the default, or @decoder)"]
                + [""] * 9)
    cols += ("attention",)
    widths = [max(len(r[i]) for r in rows + [list(cols)]) for i in range(len(cols))]
    for r in [list(cols)] + rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
    return 0


def cmd_data(args) -> int:
    cfg = from_args(RunConfig, args)
    cfg.validate()
    seqs, path, built = ensure_sequences(
        cfg.out, load_tokenizer(cfg.model), cfg.dataset, cfg.length, cfg.n_seqs, cfg.seed,
        model_name=cfg.model, n_ctx=resolve(cfg.model).n_ctx or None,
        allow_cross_doc=cfg.allow_cross_doc, overwrite=cfg.overwrite)
    n, t = seqs["input_ids"].shape
    print(f"{'built' if built else 'reused'} {path}: {n} x {t} tokens "
          f"({seqs['split'].count(protocol.SPLIT_CENTERING)} centering, "
          f"{seqs['split'].count(protocol.SPLIT_EVAL)} eval)")
    return 0


def cmd_run(args) -> int:
    cfg = from_args(RunConfig, args)
    cfg.validate()  # before the model is loaded
    if not cfg.progress:
        _quiet_libraries()
    result, _ = run_condition(cfg)
    prov = result.provenance
    print(f"\n{cfg.model} · {cfg.dataset} · T={cfg.length} · {prov['n_eval']} eval "
          f"sequences ({prov['weights']}); mean R² over heads per layer:")
    print(result.layer_summary().round(3).to_string())
    print(f"\nresults in {os.path.join(cfg.out, C.RESULTS_DIR)} ({prov['seconds']} s)")
    if args.spectral:
        _spectral_all(cfg.out, cfg.model, cfg.dataset, cfg.length)
    return 0


def _quiet_libraries() -> None:
    """Silence the progress bars of transformers (the GGUF conversion) and datasets."""
    os.environ["TQDM_DISABLE"] = "1"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _spectral_all(out, model=None, dataset=None, length=None, options=None) -> None:
    """Spectral analysis and frequency usage of the chosen conditions under ``out``."""
    chosen = [c for c in ConditionResult.conditions(ConditionResult.folder(out))
              if (model is None or c[0] == model) and (dataset is None or c[1] == dataset)
              and (length is None or c[2] == length)]
    if not chosen:
        raise UserError(f"no complete condition under {out} matches model={model} "
                        f"dataset={dataset} length={length}")
    names = {f.name for f in dataclasses.fields(RunConfig)}
    for m, d, t in chosen:  # the condition's own configuration (its dataset, n_seqs, …)
        saved = ConditionResult.saved_config(out, m, d, t)
        cfg = RunConfig(**{"dataset": d, **{k: v for k, v in saved.items() if k in names},
                           "model": m, "length": t, "out": str(out)})
        for name, opts in (("spectral", options), ("freq-usage", None)):
            if name == "freq-usage" and ConditionResult.saved_spec(out, m, d, t).pe != "rope":
                continue
            table, path = run_analysis(name, cfg, options=opts)
            print(f"{name}: {len(table)} rows in {path}")


def cmd_spectral(args) -> int:
    _spectral_all(args.out, args.model, args.dataset, args.length,
                  from_args(REGISTRY["spectral"].options, args))
    return 0


def cmd_analyze(args) -> int:
    spec = REGISTRY[args.analysis]
    cfg = from_args(RunConfig, args)
    cfg.validate(_saved_model_spec(cfg) if not spec.needs_model else None)
    if not cfg.progress:
        _quiet_libraries()
    table, path = run_analysis(spec.name, cfg, options=from_args(spec.options, args))
    print(table.head(12).round(4).to_string(index=False))
    print(f"\n{len(table)} rows in {path}")
    return 0


def _saved_model_spec(cfg: RunConfig):
    """The model spec of ``cfg``'s condition when it is saved under ``cfg.out`` (an
    analysis that reads only the result then works for any model, registered or not)."""
    try:
        return ConditionResult.saved_spec(cfg.out, cfg.model, cfg.dataset, cfg.length)
    except ResultFileError:
        return None


def cmd_grid(args) -> int:
    cfg = from_args(GridConfig, args)
    if cfg.merge:
        print(f"{cfg.out} holds {merge(list(cfg.merge), cfg.out)} complete conditions")
        return 0
    cfg.validate()
    if cfg.executor != "slurm":  # (the jobs' nodes have the device, maybe not this one)
        resolve_device(cfg.device)
    conds = plan(cfg.preset, cfg.models, cfg.datasets, cfg.lengths, cfg.n_seqs, cfg.shard)
    checked = check_plan(conds)
    print(checked[["condition", "weights", "data"]].to_string(index=False))
    missing = checked[~checked["ok"]]
    if len(missing):
        notes = sorted({n for _, r in missing.iterrows() for n, ok in
                        ((r.weights_note, r.weights == "yes"), (r.data_note, r.data == "yes"))
                        if not ok})
        raise UserError("missing: " + "; ".join(notes))
    if cfg.plan:
        if cfg.executor == "slurm":
            print(describe_jobs(conds, cfg))
        return 0
    if not cfg.progress:
        _quiet_libraries()
    logs = [os.path.join(cfg.out, LOG)]
    if cfg.executor != "here":
        try:
            table = submit_grid(conds, cfg, cfg.executor)
        except GridJobError as err:
            print(f"poskernel: {err}", file=sys.stderr)
            return 1
        logs = [str(p) for p in job_logs(cfg.out, by_model(conds))]
    else:
        table = run_grid(conds, cfg)
    print("\n" + table.round(3).to_string(index=False))
    print(f"\nresults in {os.path.join(cfg.out, C.RESULTS_DIR)}; log {', '.join(logs)}")
    return 0


def cmd_report(args) -> int:
    page = build_report(args.out, args.report_dir, workers=args.workers, progress=True)
    print(f"report: {page}")
    return 0


def cmd_demo(args) -> int:
    """The demo grid on the embedded model (with the spectral analysis), then its report."""
    grid = GridConfig(preset="demo", out=args.out, analyses=("spectral", "freq-usage"),
                      n_seqs=args.n_seqs, progress=not args.quiet)
    rc = cmd_grid(argparse.Namespace(command="grid", **dataclasses.asdict(grid)))
    if rc == 0:
        with FolderLock(args.out):
            rc = cmd_report(argparse.Namespace(command="report", out=args.out,
                                               report_dir=None, workers=None))
    return rc


COMMANDS = {"models": cmd_models, "data": cmd_data, "run": cmd_run, "spectral": cmd_spectral,
            "analyze": cmd_analyze, "grid": cmd_grid, "report": cmd_report,
            "inspect": cmd_inspect, "demo": cmd_demo}


def run(args) -> int:
    """Run the parsed, checked command ``args``."""
    reuse_freed_memory()  # large temporaries reused, not faulted in afresh
    return COMMANDS[args.command](args)
