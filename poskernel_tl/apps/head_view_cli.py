"""The ``poskernel inspect`` subcommand: one head on one text, written as an HTML page.

The command line's parser declares the subcommand (:mod:`poskernel_tl.apps.cli`);
:func:`cmd_inspect` checks the arguments before the model loads
(:func:`check_inspect_args`), picks the text (``--text``, ``--file`` or a
:func:`dataset_window`), runs :func:`poskernel_tl.apps.head_view.inspect_head` and saves
the view.
"""

from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from poskernel_tl.analyses.spectral.summary import alignment_line
from poskernel_tl.apps.head_inputs import MIN_TOKENS, check_head
from poskernel_tl.apps.head_view import inspect_head
from poskernel_tl.constants import model_slug
from poskernel_tl.data.datasets import TOKEN_DATASETS, check_dataset_name
from poskernel_tl.data.sequences import build_sequences, collect_windows, sequence_frame
from poskernel_tl.errors import DataError, UserError
from poskernel_tl.models.loading import load_model, resolve_device
from poskernel_tl.models.registry import resolve


def default_out(model: str, layer: int, head: int) -> Path:
    return Path("artifacts") / "inspect" / f"{model_slug(model)}_L{layer}H{head}.html"


def check_inspect_args(args) -> str | None:
    """Check everything that can be checked before the model loads; returns the text of
    ``--file`` (read now, so a bad file fails early) or ``--text``."""
    spec = resolve(args.model)
    if args.layer < 0 or args.head < 0:
        raise UserError(f"--layer and --head must be >= 0, got {args.layer}, {args.head}")
    if spec.n_layers:
        check_head(spec.name, spec.n_layers, spec.n_heads, args.layer, args.head)
    if args.index is not None and args.dataset is None:
        raise UserError("--index selects a window of --dataset; give --dataset too")
    if args.max_tokens is not None and args.max_tokens < MIN_TOKENS:
        raise UserError(f"--max-tokens must be >= {MIN_TOKENS}, got {args.max_tokens}")
    resolve_device(args.device)
    out = Path(args.out) if args.out else default_out(args.model, args.layer, args.head)
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give an .html file name")
    if args.dataset is not None:
        check_dataset_name(args.dataset)
        if args.index is not None and args.index < 0:
            raise UserError(f"--index must be >= 0, got {args.index}")
        if args.length < MIN_TOKENS or (spec.n_ctx and args.length > spec.n_ctx):
            limit = f"..{spec.n_ctx}" if spec.n_ctx else " or more"
            raise UserError(f"--length {args.length}: choose {MIN_TOKENS}{limit} tokens")
        return None
    if args.file is not None:
        path = Path(args.file)
        if not path.is_file():
            raise UserError(f"--file {path}: no such file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"--file {path} is not UTF-8 text ({err})") from err
    else:
        text = args.text
    if not text.strip():
        raise UserError("the text is empty")
    return text


def dataset_window(tokenizer, dataset: str, length: int, index: int = 0, seed: int = 0,
                   *, model_name: str = "model") -> tuple[Int[Tensor, " pos"], str]:
    """Window ``index`` (corpus order) of ``length`` tokens of ``dataset`` and a label.
    Random tokens: row ``index`` of the seeded random sequences."""
    if dataset in TOKEN_DATASETS:
        n = 2 * (index // 2 + 1)
        seqs = build_sequences(tokenizer, dataset, length, n, seed, model_name=model_name)
        return seqs["input_ids"][index], f"{dataset} tokens, sequence {index} (seed {seed})"
    tokens, doc_ids, offsets = collect_windows(tokenizer, dataset, length, seed,
                                               max_windows=index + 1)
    if len(tokens) <= index:
        raise DataError(f"dataset {dataset!r} has only {len(tokens)} windows of {length} "
                        f"tokens; --index {index} is out of range")
    text = length - sum(map(len, sequence_frame(tokenizer)))  # [CLS] … [SEP] for encoders
    return (torch.from_numpy(tokens[index].copy()),
            f"{dataset} window {index}: {doc_ids[index]}, tokens {offsets[index]}.."
            f"{offsets[index] + text - 1}")


def cmd_inspect(args) -> int:
    """``poskernel inspect``: write one head's page and print its R²."""
    text = check_inspect_args(args)  # before the model loads
    out = Path(args.out) if args.out else default_out(args.model, args.layer, args.head)
    model = load_model(args.model, device=args.device)
    source: object = text
    label = f"--file {args.file}" if args.file else "--text"
    if args.dataset is not None:
        source, label = dataset_window(model.tokenizer, args.dataset, args.length,
                                       args.index or 0, args.seed, model_name=args.model)
    view = inspect_head(model, source, args.layer, args.head, max_tokens=args.max_tokens)
    path = view.save(out, inline=not args.shared_assets)
    print(f"{view.title} ({label})")
    print(f"R² = {view.r2:.4f}   R² without the sink column = {view.r2_nosink:.4f}   "
          f"(logits from {view.scores_from})")
    if view.thetas is not None:
        print(alignment_line(view.alignment))
    for note in view.notes:
        print(note)
    size = path.stat().st_size / 1e6
    print(f"page written to {path} ({size:.2f} MB"
          + (", scripts inlined)" if not args.shared_assets else ", assets/ beside it)"))
    return 0
