"""The ``poskernel`` command. Each subcommand is a thin wrapper over a library call."""

import argparse
import os
import sys

from poskernel_tl import constants as C
from poskernel_tl.registry import EMBEDDED_DEFAULT, REGISTRY


def _add_condition_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, default=EMBEDDED_DEFAULT,
                   help="registry name (see `poskernel models`) or hf:<repo id>")
    p.add_argument("--dataset", required=required, default="prose",
                   help="wikipedia, code, random, prose, stdlib-code or text:PATH")
    p.add_argument("--length", type=int, required=required, default=256,
                   help="tokens per sequence (256, 1024)")
    p.add_argument("--n-seqs", type=int, default=200,
                   help="sequences: first half centering, second half evaluation")
    p.add_argument("--out", default="artifacts/run", help="output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow-cross-doc", action="store_true",
                   help="let windows span document boundaries (recorded in the data file)")


def _batch_size(text: str) -> int | str:
    """An int where the text is one; anything else is left to the one-line check of
    :func:`poskernel_tl.batching.check_batch_size`."""
    try:
        return int(text)
    except ValueError:
        return text


def _add_batch_args(p) -> None:
    p.add_argument("--batch-size", type=_batch_size, default="auto",
                   help="sequences per forward, or auto: as many as fit in half the free "
                        "memory (at most 4 on CPU, 64 on a GPU); halved on out-of-memory")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16",
                                                       "float16"],
                   help="forward dtype; auto: float32 on CPU, the model's recommended "
                        "dtype on a GPU (statistics accumulate in float32/float64)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="poskernel",
        description="Measure how shift-invariant each attention head's logits are. "
                    "With no arguments: a small demo run on the embedded default model.")
    sub = parser.add_subparsers(dest="command")

    sub.add_parser("models", help="list the model registry")

    p = sub.add_parser("data", help="build (or validate and reuse) a sequence file")
    _add_condition_args(p)
    p.add_argument("--overwrite", action="store_true", help="rebuild a mismatched file")

    p = sub.add_parser("run", help="Track A + Track B for one (model, dataset, length)")
    _add_condition_args(p)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    _add_batch_args(p)
    p.add_argument("--save-logits", default="auto", choices=["auto", "yes", "no"],
                   help="full logits of 10 eval sequences (auto: Wikipedia-like, T=256)")
    p.add_argument("--whiten", action="store_true",
                   help="Track B diagnostic: also fit the centered and whitened Gram")
    p.add_argument("--scores", default="auto", choices=["auto", "hook", "qk"],
                   help="Track A logits from hook_attn_scores (hook), from q·kᵀ (qk), or "
                        "whichever the model computes anyway (auto)")
    p.add_argument("--compatibility-mode", action="store_true",
                   help="TransformerLens' HookedTransformer weight processing (slower; "
                        "q/k and the results do not change)")
    p.add_argument("--overwrite", action="store_true",
                   help="rebuild a sequence file that does not match this run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--spectral", action="store_true",
                   help="also run the spectral analysis on the result")

    p = sub.add_parser("spectral", help="spectral analysis of g(Δ) for finished conditions")
    p.add_argument("out", help="the output folder of a run or grid")
    p.add_argument("--model", help="only this model's conditions")
    p.add_argument("--dataset", help="only this dataset's conditions")
    p.add_argument("--length", type=int, help="only this length's conditions")
    p.add_argument("--force", action="store_true",
                   help="analyse all heads, ignoring the gate (labelled ungated)")
    p.add_argument("--raw-spectrum", action="store_true",
                   help="use the seed's literal spectrum (mean kept, no taper, peaks ≥ 2π/T "
                        "apart on the grid) instead of the detrended, tapered one; for "
                        "comparison only")
    p.add_argument("--demean", action="store_true",
                   help="with --raw-spectrum: remove g's mean before the FFT")

    p = sub.add_parser("analyze", help="one analysis of analyses/ on one condition")
    p.add_argument("name", help="gk-baseline, fourier-kernel, seq-pca, qig-control, "
                                "kernel-patching, separable or mean-field")
    _add_condition_args(p)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--batch-size", type=_batch_size, default="auto",
                   help="sequences per forward, or auto (from the free memory)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("grid", help="many conditions from a preset; resumable, shardable")
    p.add_argument("--preset", default="demo", help="demo (embedded model, offline) or seed")
    p.add_argument("--models", nargs="+", help="narrow the preset's models")
    p.add_argument("--datasets", nargs="+", help="narrow the preset's datasets")
    p.add_argument("--lengths", nargs="+", type=int, help="narrow the preset's lengths")
    p.add_argument("--n-seqs", type=int, help="sequences per condition (preset default)")
    p.add_argument("--out", default="artifacts/grid", help="output folder")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    _add_batch_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard", help="I/N: run every N-th condition starting at I (0-based)")
    p.add_argument("--merge", nargs="+", metavar="DIR",
                   help="combine the shard folders DIR … into --out instead of running")
    p.add_argument("--force", action="store_true",
                   help="redo conditions recorded with a different configuration")
    p.add_argument("--plan", action="store_true", help="print the plan and stop")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--executor", choices=["slurm", "local"],
                   help="submit one job per model through submitit (slurm: a Slurm "
                        "cluster; local: processes on this machine) and merge their "
                        "folders; default: run here, in this process")
    p.add_argument("--slurm-partition", help="Slurm partition for --executor slurm")
    p.add_argument("--slurm-gpus-per-task", type=int, default=1,
                   help="GPUs per job (default 1)")
    p.add_argument("--slurm-time", type=int, default=240,
                   help="time limit per job in minutes (default 240)")

    p = sub.add_parser("report", help="figures, Table 1, verdicts and report.html for a folder")
    p.add_argument("out", help="the output folder of a run or grid (or a merged grid)")
    p.add_argument("--report-dir", help="where to write (default: OUT/report)")
    p.add_argument("--n-null", type=int, default=2000,
                   help="draws of the spectral null per head")
    p.add_argument("--head-pages", default="all", choices=["all", "first", "none"],
                   help="a page per head and per layer: for every condition (all), for the "
                        "first centered one (first), or none")

    from poskernel_tl.inspect import add_inspect_parser

    add_inspect_parser(sub)

    p = sub.add_parser("demo", help="the README's main job: the demo grid and its report")
    p.add_argument("--out", default="artifacts/demo", help="output folder")
    p.add_argument("--n-seqs", type=int, help="sequences per condition (default 200)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def cmd_models(args) -> int:
    cols = ("name", "hub_id", "pe", "norm", "n_layers", "n_heads", "n_kv_heads", "d_head",
            "rope_base", "loader")
    rows = [[str(getattr(s, c) if getattr(s, c) is not None else "-") for c in cols]
            for s in REGISTRY.values()]
    rows.append(["hf:<repo id>", "any TransformerLens-supported causal LM"] + [""] * 8)
    widths = [max(len(r[i]) for r in rows + [list(cols)]) for i in range(len(cols))]
    for r in [list(cols)] + rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
    return 0


def cmd_data(args) -> int:
    from poskernel_tl.datasets import check_dataset_name
    from poskernel_tl.loading import load_tokenizer
    from poskernel_tl.registry import resolve
    from poskernel_tl.sequences import ensure_sequences

    check_dataset_name(args.dataset)
    spec = resolve(args.model)
    tok = load_tokenizer(args.model)
    seqs, path, built = ensure_sequences(
        args.out, tok, args.dataset, args.length, args.n_seqs, args.seed,
        model_name=args.model, n_ctx=spec.n_ctx or None,
        allow_cross_doc=args.allow_cross_doc, overwrite=args.overwrite)
    n, t = seqs["input_ids"].shape
    print(f"{'built' if built else 'reused'} {path}: {n} x {t} tokens "
          f"({seqs['split'].count(C.SPLIT_CENTERING)} centering, "
          f"{seqs['split'].count(C.SPLIT_EVAL)} eval)")
    return 0


def cmd_run(args) -> int:
    from poskernel_tl.runner import RunConfig, run_condition

    cfg = RunConfig(model=args.model, dataset=args.dataset, length=args.length,
                    n_seqs=args.n_seqs, out=args.out, device=args.device,
                    batch_size=args.batch_size, seed=args.seed, dtype=args.dtype,
                    save_logits=args.save_logits, allow_cross_doc=args.allow_cross_doc,
                    whiten=args.whiten, scores=args.scores, overwrite=args.overwrite,
                    compatibility_mode=args.compatibility_mode, progress=not args.quiet)
    cfg.validate()  # before the model is loaded
    if args.quiet:
        _quiet_libraries()
    result, _ = run_condition(cfg)
    prov = result.provenance
    print(f"\n{args.model} · {args.dataset} · T={args.length} · {prov['n_eval']} eval "
          f"sequences ({prov['weights']}); mean R² over heads per layer:")
    print(result.layer_summary().round(3).to_string())
    print(f"\nresults in {os.path.join(args.out, C.RESULTS_DIR)} ({prov['seconds']} s)")
    if args.spectral:
        _spectral(args.out, args.model, args.dataset, args.length)
    return 0


def _quiet_libraries() -> None:
    """Silence the progress bars of transformers (the GGUF conversion) and datasets."""
    os.environ["TQDM_DISABLE"] = "1"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _spectral(out, model=None, dataset=None, length=None, force=False, raw_spectrum=False,
              demean=False) -> None:
    """Spectral analysis of the chosen conditions under ``out``, gated over every rotary
    condition in the folder (the seed's gate is over the grid, not per condition)."""
    from poskernel_tl.analyses.freq_usage import write_freq_usage
    from poskernel_tl.analyses.spectral import grid_gate, run_spectral
    from poskernel_tl.result import ConditionResult

    everything = [ConditionResult.load(out, *c) for c in ConditionResult.conditions(out)]
    if not everything:
        raise FileNotFoundError(f"no complete condition under {out}")
    chosen = [r for r in everything if (model is None or r.model == model)
              and (dataset is None or r.dataset == dataset)
              and (length is None or r.length == length)]
    if not chosen:
        raise ValueError(f"no condition under {out} matches model={model} dataset={dataset} "
                         f"length={length}")
    gate = grid_gate(everything)
    for result in chosen:  # all inputs were read and checked before anything is written
        _, _, summary = run_spectral(result, out, force=force, raw_spectrum=raw_spectrum,
                                     demean=demean, gate_met=gate)
        print("spectral:", ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in summary.items()))
        usage = write_freq_usage(result, out)
        if usage is not None:
            print(f"frequency usage per head and rotary pair: {usage}")


def cmd_spectral(args) -> int:
    _spectral(args.out, args.model, args.dataset, args.length, args.force, args.raw_spectrum,
              args.demean)
    return 0


def cmd_analyze(args) -> int:
    from poskernel_tl.analyze import analysis_module, run_analysis
    from poskernel_tl.runner import RunConfig

    analysis_module(args.name)  # an unknown name fails before the model loads
    cfg = RunConfig(model=args.model, dataset=args.dataset, length=args.length,
                    n_seqs=args.n_seqs, out=args.out, device=args.device,
                    batch_size=args.batch_size, seed=args.seed,
                    allow_cross_doc=args.allow_cross_doc, progress=not args.quiet)
    cfg.validate()
    if args.quiet:
        _quiet_libraries()
    table, path = run_analysis(args.name, cfg)
    print(table.head(12).round(4).to_string(index=False))
    print(f"\n{len(table)} rows in {path}")
    return 0


def cmd_grid(args) -> int:
    from poskernel_tl import grid

    if args.merge:
        n = grid.merge(args.merge, args.out)
        print(f"{args.out} holds {n} complete conditions")
        return 0
    from poskernel_tl.batching import check_batch_size
    from poskernel_tl.datasets import check_dataset_name
    from poskernel_tl.loading import resolve_device

    resolve_device(args.device)
    check_batch_size(args.batch_size)
    for d in args.datasets or []:
        check_dataset_name(d)
    conds = grid.plan(args.preset, args.models, args.datasets, args.lengths, args.n_seqs,
                      args.shard)
    checked = grid.check_plan(conds)
    print(checked[["condition", "weights", "data"]].to_string(index=False))
    missing = checked[~checked["ok"]]
    if len(missing):
        notes = sorted({n for _, r in missing.iterrows() for n, ok in
                        ((r.weights_note, r.weights == "yes"), (r.data_note, r.data == "yes"))
                        if not ok})
        for note in notes:
            print(f"poskernel: missing: {note}", file=sys.stderr)
        return 2
    if args.plan:
        return 0
    if args.quiet:
        _quiet_libraries()
    opts = grid.options_from(out=args.out, device=args.device, batch_size=args.batch_size,
                             dtype=args.dtype,
                             seed=args.seed, force=args.force, progress=not args.quiet)
    if args.executor:
        from poskernel_tl.executor import GridJobError, SlurmOptions, submit_grid

        slurm = SlurmOptions(partition=args.slurm_partition,
                             gpus_per_task=args.slurm_gpus_per_task, time_min=args.slurm_time)
        try:
            table = submit_grid(conds, opts, args.executor, slurm)
        except GridJobError as err:
            print(f"poskernel: {err}", file=sys.stderr)
            return 1
    else:
        table = grid.run_grid(conds, opts)
    print("\n" + table.round(3).to_string(index=False))
    print(f"\nresults in {os.path.join(args.out, C.RESULTS_DIR)}; log {args.out}/grid.log")
    return 0


def cmd_report(args) -> int:
    from poskernel_tl.report.build import build_report

    page = build_report(args.out, args.report_dir, n_null=args.n_null,
                        head_pages=args.head_pages, progress=True)
    print(f"report: {page}")
    return 0


def cmd_inspect(args) -> int:
    from poskernel_tl.inspect import cmd_inspect as run

    return run(args)


def cmd_demo(args) -> int:
    """The demo grid on the embedded model, then its report."""
    ns = build_parser().parse_args(
        ["grid", "--preset", "demo", "--out", args.out]
        + (["--n-seqs", str(args.n_seqs)] if args.n_seqs else [])
        + (["--quiet"] if args.quiet else []))
    rc = cmd_grid(ns)
    if rc == 0:  # head pages for one condition keep the demo short (about a second each)
        rc = cmd_report(build_parser().parse_args(["report", args.out, "--head-pages",
                                                   "first"]))
    return rc


COMMANDS = {"models": cmd_models, "data": cmd_data, "run": cmd_run, "spectral": cmd_spectral,
            "analyze": cmd_analyze, "grid": cmd_grid, "report": cmd_report,
            "inspect": cmd_inspect, "demo": cmd_demo}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = build_parser().parse_args(["demo"])
    command = args.command
    from poskernel_tl.loading import ModelUnavailableError
    from poskernel_tl.reducers import NonFiniteError
    from poskernel_tl.registry import UnknownModelError

    # bad input of any kind (including DataError, a ValueError) is one line on stderr;
    # POSKERNEL_DEBUG=1 shows the traceback
    expected = (UnknownModelError, ModelUnavailableError, FileNotFoundError, ValueError,
                NonFiniteError)
    try:
        return COMMANDS[command](args)
    except KeyboardInterrupt:
        if os.environ.get("POSKERNEL_DEBUG") == "1":
            raise
        print("\nposkernel: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except expected as err:
        if os.environ.get("POSKERNEL_DEBUG") == "1":
            raise
        print(f"poskernel: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
