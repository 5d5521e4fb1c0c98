"""The sequence builder: one function for every source and model.

``build_sequences`` tokenizes a dataset with a model's own tokenizer (no padding), cuts
non-overlapping windows of natural content, samples N of them from a seed and returns
the dict saved as ``data/{model}_{dataset}_{T}_seqs.pt``.

Special tokens are decided in one place, :func:`sequence_frame`, from the tokenizer: a
decoder's tokenizer (no classification/separator token) gets none, so every one of the
T tokens is text and no BOS is added (windows start mid-document, as a decoder reads
text after its context fills up). An encoder's tokenizer (BERT's WordPiece: it has
``[CLS]`` and ``[SEP]``) frames every sequence the way the encoder was trained to read
it: position 0 is ``[CLS]``, positions 1..T−2 are T−2 text tokens, position T−1 is
``[SEP]``. Random-token sequences get the same frame. The fits include both special
positions; Track A's no-sink variant, which drops key column 0, drops ``[CLS]``.

Sampling: ``numpy.random.default_rng(seed).choice(n_candidates, N, replace=False)``. The
first N/2 draws form the centering set and the last N/2 the evaluation set; inside each
half the windows are sorted into corpus order. Both halves are therefore random samples
of the same corpus (sorting all N draws instead would put the start of a sorted corpus,
e.g. stdlib modules a–m, in the centering set and the end in the evaluation set).
"""

import os
import warnings
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Int

from poskernel_tl import constants, protocol
from poskernel_tl.data.datasets import (
    HUB_DATASETS,
    TOKEN_DATASETS,
    check_dataset_name,
    describe_source,
    iter_documents,
    placeholder_token_ids,
    special_token_ids,
)
from poskernel_tl.errors import DataError
from poskernel_tl.io import save_torch

__all__ = ["FORMAT_VERSION", "TooFewWindowsError", "build_sequences", "centering_mask",
           "ensure_sequences", "eval_mask", "load_sequences", "random_token_ids", "save_sequences",
           "sequence_frame"]

FORMAT_VERSION = 1


class TooFewWindowsError(DataError):
    """The source has fewer windows of T tokens than the sequences asked for."""

HUB_POOL_FACTOR = 4  # hub sources stop scanning at 4·N candidate windows
TOKENIZE_BATCH = 32  # documents per tokenizer call (fast tokenizers run batches in parallel)
EXPECT_KEYS = ("model", "dataset", "length", "n_seqs", "seed", "cross_doc")
REQUIRED_KEYS = ("input_ids", "split", "seq_id", "model", "dataset", "length", "seed",
                 "source", "tokenizer", "doc_ids", "offsets", "cross_doc", "format_version")


# ------------------------------------------------------------------------ helpers
def random_token_ids(tokenizer) -> torch.Tensor:
    """The ids the ``random`` dataset draws from: the vocabulary without special tokens
    (:func:`special_token_ids`, so no ``[PAD]``/``[UNK]``/``[CLS]``/``[SEP]``/``[MASK]``
    or BOS/EOS) and without placeholders (:func:`placeholder_token_ids`)."""
    excluded = special_token_ids(tokenizer) | placeholder_token_ids(tokenizer)
    return torch.tensor([i for i in range(len(tokenizer)) if i not in excluded],
                        dtype=torch.long)


def is_int(v) -> bool:
    """A Python or NumPy integer (not a bool)."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _check_args(dataset: str, length: int, n_seqs: int, n_ctx: int | None,
                model_name: str) -> None:
    if not is_int(n_seqs) or n_seqs < 2 or n_seqs % 2:
        raise DataError(f"n_seqs must be an even integer >= 2 (half centering, half eval), "
                        f"got {n_seqs!r}")
    if not is_int(length) or length < 3:
        raise DataError(f"length must be an integer >= 3 tokens, got {length!r}")
    if n_ctx and length > n_ctx:  # 0 or None: the model states no context (BLOOM)
        raise DataError(f"length {length} is longer than the context of model "
                        f"{model_name!r} ({n_ctx} tokens)")
    if not isinstance(dataset, str):
        raise DataError(f"dataset must be a name, got {dataset!r}")
    check_dataset_name(dataset)


def sequence_frame(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suffix): the special token ids every sequence starts and ends with.

    ``((cls,), (sep,))`` for a tokenizer with both a ``[CLS]`` and a ``[SEP]`` token (an
    encoder's, e.g. BERT's WordPiece, whose model only ever read input framed that way);
    ``((), ())`` otherwise: a decoder's sequences are all text, without BOS."""
    cls = getattr(tokenizer, "cls_token_id", None)
    sep = getattr(tokenizer, "sep_token_id", None)
    if cls is None or sep is None:
        return (), ()
    return (int(cls),), (int(sep),)


def _framed(body: Int[np.ndarray, "batch text_pos"],
            frame: tuple[tuple[int, ...], tuple[int, ...]]) -> Int[np.ndarray, "batch pos"]:
    """The text windows with the frame's prefix and suffix columns added."""
    prefix, suffix = (np.broadcast_to(np.asarray(part, dtype=np.int64), (len(body), len(part)))
                      for part in frame)
    return np.concatenate([prefix, body, suffix], axis=1)


def _frame_record(frame: tuple[tuple[int, ...], tuple[int, ...]]) -> dict:
    """The frame as saved in a sequences file: ``{"prefix": [ids], "suffix": [ids]}``."""
    return {"prefix": list(frame[0]), "suffix": list(frame[1])}


def _check_frame(seqs: dict, tokenizer, path: Path) -> None:
    """DataError unless ``seqs`` was framed as ``tokenizer`` frames now (a file without a
    ``frame`` record predates framing: it has none)."""
    have = seqs.get("frame", _frame_record(((), ())))
    want = _frame_record(sequence_frame(tokenizer))
    if have != want:
        raise DataError(f"{path} was built with special tokens {have}, not {want}")


def tokenizer_name(tokenizer) -> str:
    """``name_or_path`` (only the last component of an absolute path) or the class name."""
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    if os.path.isabs(name):
        name = Path(name).name
    return name or type(tokenizer).__name__


def _tokenize(tokenizer, texts: list[str]) -> list[np.ndarray]:
    out = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return [np.asarray(ids, dtype=np.int64) for ids in out]


def _tokenized_documents(tokenizer, dataset: str, seed: int):
    """Yield ``(doc_id, token array)`` in corpus order, tokenizing in small batches."""
    docs = iter(iter_documents(dataset, seed))
    while batch := list(islice(docs, TOKENIZE_BATCH)):
        yield from zip([d for d, _ in batch], _tokenize(tokenizer, [t for _, t in batch]))


def collect_windows(tokenizer, dataset: str, length: int, seed: int = 0, *,
                    allow_cross_doc: bool = False, max_windows: int | None = None):
    """All candidate windows of ``length`` tokens, in corpus order, each framed by
    :func:`sequence_frame` (so an encoder's window is ``[CLS]``, ``length`` − 2 text
    tokens, ``[SEP]``).

    Returns ``(tokens, doc_ids, offsets)``: an int64 array [n, length], and per window
    the id of the document its text starts in and the token offset of its first text
    token there. Without ``allow_cross_doc`` the text pieces are non-overlapping and
    inside one document; with it, documents are concatenated (separated by the eos token
    if the tokenizer has one) and the text pieces tile the stream. Scanning stops once
    ``max_windows`` windows exist.
    """
    frame = sequence_frame(tokenizer)
    tokens, doc_ids, offsets = _text_windows(tokenizer, dataset,
                                             length - sum(map(len, frame)), seed,
                                             allow_cross_doc, max_windows)
    return _framed(tokens, frame), doc_ids, offsets


def _text_windows(tokenizer, dataset: str, length: int, seed: int, allow_cross_doc: bool,
                  max_windows: int | None):
    """:func:`collect_windows` before framing: windows of ``length`` text tokens."""
    sep = getattr(tokenizer, "eos_token_id", None)
    sep_arr = np.asarray([] if sep is None else [int(sep)], dtype=np.int64)
    windows: list[np.ndarray] = []
    doc_ids: list[str] = []
    offsets: list[int] = []
    pending = np.zeros(0, dtype=np.int64)  # cross-doc: stream tokens not yet cut
    pending_at = 0  # stream position of pending[0]
    starts: list[tuple[int, str]] = []  # cross-doc: (stream position, doc_id) per document
    cur = 0  # index into starts of the document holding the next window start
    for doc_id, ids in _tokenized_documents(tokenizer, dataset, seed):
        if max_windows is not None and len(windows) >= max_windows:
            break
        if len(ids) == 0:
            continue
        if not allow_cross_doc:
            for off in range(0, len(ids) - length + 1, length):
                windows.append(ids[off:off + length])
                doc_ids.append(doc_id)
                offsets.append(off)
            continue
        if starts:
            pending = np.concatenate([pending, sep_arr])
        starts.append((pending_at + len(pending), doc_id))
        pending = np.concatenate([pending, ids])
        while len(pending) >= length:
            while cur + 1 < len(starts) and starts[cur + 1][0] <= pending_at:
                cur += 1
            windows.append(pending[:length])
            doc_ids.append(starts[cur][1])
            offsets.append(pending_at - starts[cur][0])
            pending, pending_at = pending[length:], pending_at + length
    if max_windows is not None:
        del windows[max_windows:], doc_ids[max_windows:], offsets[max_windows:]
    tokens = np.stack(windows) if windows else np.zeros((0, length), dtype=np.int64)
    return tokens, doc_ids, offsets


def _split_labels(n_seqs: int, random_tokens: bool) -> list[str]:
    if random_tokens:
        return [protocol.SPLIT_EVAL] * n_seqs
    half = n_seqs // 2
    return [protocol.SPLIT_CENTERING] * half + [protocol.SPLIT_EVAL] * half


# ------------------------------------------------------------------------ builder
def build_sequences(tokenizer, dataset: str, length: int, n_seqs: int = 200, seed: int = 0,
                    *, model_name: str, n_ctx: int | None = None,
                    allow_cross_doc: bool = False) -> dict:
    """Build the ``_seqs.pt`` dict for (model, dataset, length); see the module docstring.
    ``frame`` records the special tokens around the text (:func:`sequence_frame`).

    Raises DataError for bad arguments, unusable sources, or a corpus that cannot supply
    ``n_seqs`` windows (the message says how many it can).
    """
    _check_args(dataset, length, n_seqs, n_ctx, model_name)
    frame = sequence_frame(tokenizer)
    base = {"model": model_name, "dataset": dataset, "length": int(length), "seed": int(seed),
            "source": describe_source(dataset, seed), "tokenizer": tokenizer_name(tokenizer),
            "vocab_size": len(tokenizer), "format_version": FORMAT_VERSION,
            "frame": _frame_record(frame)}
    if dataset in TOKEN_DATASETS:
        allowed = random_token_ids(tokenizer)
        if len(allowed) == 0:
            raise DataError(f"tokenizer {base['tokenizer']!r} has no non-special tokens")
        gen = torch.Generator().manual_seed(int(seed))
        body = length - sum(map(len, frame))
        width = body if dataset == "random" else 1  # repeated: one token per sequence
        drawn = allowed[torch.randint(len(allowed), (n_seqs, width), generator=gen)].expand(
            n_seqs, body)
        input_ids = torch.from_numpy(_framed(drawn.numpy(), frame))
        return {"input_ids": input_ids, "split": _split_labels(n_seqs, True),
                "seq_id": torch.arange(n_seqs), **base, "doc_ids": [dataset] * n_seqs,
                "offsets": torch.full((n_seqs,), -1, dtype=torch.long), "cross_doc": False,
                "n_candidates": -1}

    cap = HUB_POOL_FACTOR * n_seqs if dataset in HUB_DATASETS else None
    tokens, doc_ids, offsets = collect_windows(tokenizer, dataset, length, seed,
                                               allow_cross_doc=allow_cross_doc,
                                               max_windows=cap)
    n_cand = len(tokens)
    if n_cand < n_seqs:
        how = "with" if allow_cross_doc else "without"
        hint = "" if allow_cross_doc else "; --allow-cross-doc may supply more"
        raise TooFewWindowsError(f"dataset {dataset!r} can supply only {n_cand} sequences of "
                        f"{length} tokens {how} crossing documents, {n_seqs} requested{hint}")
    drawn = np.random.default_rng(int(seed)).choice(n_cand, size=n_seqs, replace=False)
    half = n_seqs // 2
    chosen = np.concatenate([np.sort(drawn[:half]), np.sort(drawn[half:])])
    return {"input_ids": torch.from_numpy(tokens[chosen].copy()),
            "split": _split_labels(n_seqs, False), "seq_id": torch.arange(n_seqs), **base,
            "doc_ids": [doc_ids[i] for i in chosen],
            "offsets": torch.tensor([offsets[i] for i in chosen], dtype=torch.long),
            "cross_doc": bool(allow_cross_doc), "n_candidates": int(n_cand)}


# ---------------------------------------------------------------- save / validate
def save_sequences(seqs: dict, path: Path) -> None:
    """Write ``seqs`` atomically: a temp file in the same folder, then a rename."""
    save_torch(seqs, path)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def validate_sequences(seqs, where: str = "sequences") -> None:
    """Raise DataError unless ``seqs`` has the ``_seqs.pt`` layout (shapes, dtypes, split)."""
    if not isinstance(seqs, dict):
        raise DataError(f"{where}: expected a dict, found {type(seqs).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in seqs]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
    if seqs["format_version"] != FORMAT_VERSION:
        raise DataError(f"{where}: format_version {seqs['format_version']!r}, "
                        f"expected {FORMAT_VERSION}")
    ids = seqs["input_ids"]
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.ndim != 2:
        desc = (f"{ids.dtype} tensor of shape {tuple(ids.shape)}"
                if isinstance(ids, torch.Tensor) else type(ids).__name__)
        raise DataError(f"{where}: input_ids must be a 2-D int64 tensor, found {desc}")
    n, t = ids.shape
    if n < 2 or n % 2:
        raise DataError(f"{where}: {n} sequences; expected an even number >= 2")
    if t != seqs["length"]:
        raise DataError(f"{where}: input_ids has {t} tokens per row but length is "
                        f"{seqs['length']!r}")
    vocab = seqs.get("vocab_size")
    if int(ids.min()) < 0 or (isinstance(vocab, int) and int(ids.max()) >= vocab):
        raise DataError(f"{where}: input_ids holds token ids outside [0, {vocab})")
    split = seqs["split"]
    if not isinstance(split, list) or len(split) != n:
        raise DataError(f"{where}: split must be a list of {n} labels")
    if split != _split_labels(n, seqs["dataset"] in TOKEN_DATASETS):
        layout = ("all 'eval'" if seqs["dataset"] in TOKEN_DATASETS
                  else f"{n // 2} 'centering' then {n // 2} 'eval'")
        raise DataError(f"{where}: split does not have the fixed layout ({layout})")
    seq_id = seqs["seq_id"]
    if (not isinstance(seq_id, torch.Tensor) or seq_id.dtype != torch.int64
            or not torch.equal(seq_id, torch.arange(n))):
        raise DataError(f"{where}: seq_id must be the int64 tensor arange({n})")
    offsets = seqs["offsets"]
    if not isinstance(offsets, torch.Tensor) or tuple(offsets.shape) != (n,):
        raise DataError(f"{where}: offsets must be a tensor of shape ({n},)")
    if not isinstance(seqs["doc_ids"], list) or len(seqs["doc_ids"]) != n:
        raise DataError(f"{where}: doc_ids must be a list of {n} ids")


def load_sequences(path: Path, *, expect: dict | None = None) -> dict:
    """Load a ``_seqs.pt`` file (``weights_only=True``) and validate it.

    ``expect`` maps any of model, dataset, length, n_seqs, seed, cross_doc to the value
    the caller needs; a difference raises DataError naming the field.
    """
    path = Path(path)
    unknown = set(expect or {}) - set(EXPECT_KEYS)
    if unknown:
        raise ValueError(f"unknown expect key(s) {sorted(unknown)}; allowed: {EXPECT_KEYS}")
    if not path.is_file():
        raise DataError(f"{path}: no such sequences file")
    try:
        seqs = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unpickling failure means corrupt
        raise DataError(f"{path} is corrupt or not a sequences file ({_first_line(err)})") \
            from err
    validate_sequences(seqs, str(path))
    for key, want in (expect or {}).items():
        have = len(seqs["input_ids"]) if key == "n_seqs" else seqs[key]
        if have != want:
            raise DataError(f"{path} was built with {key}={have!r}, not {key}={want!r}")
    return seqs


def ensure_sequences(out_dir: Path, tokenizer, dataset: str, length: int, n_seqs: int = 200,
                     seed: int = 0, *, model_name: str, n_ctx: int | None = None,
                     allow_cross_doc: bool = False,
                     overwrite: bool = False) -> tuple[dict, Path, bool]:
    """Reuse ``data/{model}_{dataset}_{T}_seqs.pt`` under ``out_dir`` if it is valid and
    matches the arguments; otherwise build and save it. Returns (seqs, path, built).

    An existing file that is corrupt or was built with other arguments is never reused
    and never replaced silently: DataError, unless ``overwrite=True`` (then it is rebuilt
    with a warning). ``overwrite=True`` also rebuilds a valid file.
    """
    _check_args(dataset, length, n_seqs, n_ctx, model_name)
    path = constants.seqs_path(Path(out_dir), model_name, dataset, length)
    expect = {"model": model_name, "dataset": dataset, "length": length, "n_seqs": n_seqs,
              "seed": seed, "cross_doc": bool(allow_cross_doc) and dataset not in TOKEN_DATASETS}
    if path.exists():
        try:
            seqs = load_sequences(path, expect=expect)
            _check_frame(seqs, tokenizer, path)
        except DataError as err:
            if not overwrite:
                raise DataError(f"{err}; delete the file or rerun with --overwrite to rebuild it") \
                    from err
            warnings.warn(f"rebuilding {path}: {err}", stacklevel=2)
        else:
            if not overwrite:
                return seqs, path, False
    seqs = build_sequences(tokenizer, dataset, length, n_seqs, seed, model_name=model_name,
                           n_ctx=n_ctx, allow_cross_doc=allow_cross_doc)
    save_sequences(seqs, path)
    return seqs, path, True


def eval_mask(seqs: dict) -> torch.Tensor:
    """BoolTensor [N]: True for evaluation rows."""
    return torch.tensor([s == protocol.SPLIT_EVAL for s in seqs["split"]], dtype=torch.bool)


def centering_mask(seqs: dict) -> torch.Tensor:
    """BoolTensor [N]: True for centering rows (none for random tokens)."""
    return torch.tensor([s == protocol.SPLIT_CENTERING for s in seqs["split"]],
                        dtype=torch.bool)


def token_strings(tokenizer, ids: Sequence[int]) -> list[str]:
    """One string per token id (each decoded on its own), or the ids as text."""
    if tokenizer is None:
        return [str(int(i)) for i in ids]
    return [tokenizer.decode([int(i)], clean_up_tokenization_spaces=False) for i in ids]
