"""Text sources: every dataset name the toolkit knows, as a stream of (doc_id, text).

Offline sources (exist on every machine):

- ``prose``: CPython's ``pydoc_data.topics`` (English reference prose), one document
  per topic, topics in sorted order.
- ``stdlib-code``: the standard-library ``.py`` files of the running interpreter, one
  document per file, sorted by relative path. ``site-packages``/``dist-packages`` and the
  test suites (``test``, ``tests``, ``idle_test`` folders) are left out, so the corpus is
  library code, not test data; it depends on the interpreter version (recorded).
- ``random``: no text at all; the sequence builder draws token ids directly, uniformly
  from :func:`~poskernel_tl.data.sequences.random_token_ids` (the vocabulary without
  special tokens and reserved placeholders such as BERT's ``[unused7]``), framed like
  text (e.g. ``[CLS]`` … ``[SEP]``).
- ``repeated``: one token repeated over the whole sequence (Gu et al., ICLR 2025's third
  condition for the attention sink), the token drawn per sequence from the same
  vocabulary as ``random``, framed like text.
- ``text:PATH``: a UTF-8 file (one document) or a folder (every ``*.txt``, ``*.md`` and
  ``*.py`` file below it, hidden folders skipped, sorted by relative path, one document
  each; empty files skipped). A file whose lines include WikiText top-level headings
  (`` = Title = ``, a single ``=`` on each side; `` = = Section = = `` lines are
  sub-headings) is split into one document per article, so the WikiText-2 test file
  gives its ~60 articles rather than one document.

Hub sources (need ``pip install poskernel_tl[hub]`` and internet):

- ``wikipedia``: ``wikimedia/wikipedia``, config ``20231101.en``, streamed and shuffled
  with a fixed seed (shuffle buffer of 1,000 articles).
- ``code``: the Python files of ``codeparrot/github-code`` (GitHub via BigQuery), read
  straight from its parquet shards (the repository's loading script is not supported by
  ``datasets`` >= 4), streamed and shuffled with a fixed seed. Whole files rather than
  CodeSearchNet's single functions, so T=1024 windows fit inside one document.
"""

import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from poskernel_tl.errors import DataError

OFFLINE_DATASETS = ("prose", "stdlib-code", "random", "repeated")
TOKEN_DATASETS = ("random", "repeated")  # drawn token ids: no documents, no centering half
HUB_DATASETS = ("wikipedia", "code")
TEXT_PREFIX = "text:"
# the seed keeps the full logits of 10 evaluation sequences for Wikipedia only
LOGITS_BY_DEFAULT = ("wikipedia",)

WIKIPEDIA_REPO, WIKIPEDIA_CONFIG = "wikimedia/wikipedia", "20231101.en"
CODE_REPO = "codeparrot/github-code"
CODE_DATA_FILES = f"hf://datasets/{CODE_REPO}/data/train-*.parquet"
SHUFFLE_BUFFER = 1000
HUB_PROBE_TIMEOUT_S = 10.0

TEXT_SUFFIXES = (".txt", ".md", ".py")
STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})
_WIKITEXT_TITLE = re.compile(r"^ = (?!=)(.*\S) = $")
_OFFLINE_HINT = "offline alternatives: prose, stdlib-code, random, repeated, text:PATH"
# reserved, never-used vocabulary slots: BERT's "[unused12]", "<unused3>" elsewhere
_PLACEHOLDER = re.compile(r"^(\[unused\d+\]|<unused\d+>)$")


def known_datasets() -> str:
    return ", ".join((*HUB_DATASETS, *OFFLINE_DATASETS, "text:PATH"))


def check_dataset_name(dataset: str) -> None:
    """Raise DataError unless ``dataset`` is a known name or ``text:PATH``."""
    if dataset in OFFLINE_DATASETS or dataset in HUB_DATASETS:
        return
    if dataset.startswith(TEXT_PREFIX) and len(dataset) > len(TEXT_PREFIX):
        return
    raise DataError(f"unknown dataset {dataset!r}; known: {known_datasets()}")


def check_dataset(dataset: str) -> None:
    """:func:`check_dataset_name`, and for ``text:PATH`` that the file or folder holds
    UTF-8 text (read now, so an empty or binary file fails before a model loads)."""
    check_dataset_name(dataset)
    if dataset.startswith(TEXT_PREFIX):
        next(iter(_text_path(dataset[len(TEXT_PREFIX):])))


def saves_logits_by_default(dataset: str) -> bool:
    """Whether ``poskernel run --save-logits auto`` keeps full logits for ``dataset``."""
    return dataset in LOGITS_BY_DEFAULT


def describe_source(dataset: str, seed: int = 0) -> str:
    """One line saying where the text of ``dataset`` comes from (saved as provenance)."""
    check_dataset_name(dataset)
    py = f"CPython {sys.version.split()[0]}"
    if dataset == "prose":
        return f"pydoc_data.topics of {py}, one document per topic, sorted"
    if dataset == "stdlib-code":
        return f"standard-library .py files of {py} (tests excluded), sorted by path"
    if dataset == "random":
        return (f"token ids uniform over the vocabulary without special and placeholder "
                f"tokens, torch seed {seed}")
    if dataset == "repeated":
        return (f"one token per sequence, repeated, drawn uniformly from the vocabulary "
                f"without special and placeholder tokens, torch seed {seed}")
    if dataset == "wikipedia":
        return (f"{WIKIPEDIA_REPO} {WIKIPEDIA_CONFIG}, streamed, shuffled "
                f"(seed {seed}, buffer {SHUFFLE_BUFFER})")
    if dataset == "code":
        return (f"{CODE_REPO} Python files (parquet shards), streamed, shuffled "
                f"(seed {seed}, buffer {SHUFFLE_BUFFER})")
    return f"local text {dataset[len(TEXT_PREFIX):]}"


def iter_documents(dataset: str, seed: int = 0) -> Iterator[tuple[str, str]]:
    """Yield ``(doc_id, text)`` for ``dataset`` in a deterministic order.

    Argument errors (unknown name, unreadable path, hub unreachable) are raised here,
    before the first document is produced. ``seed`` only affects the hub sources.
    """
    check_dataset_name(dataset)
    if dataset in TOKEN_DATASETS:
        raise DataError(f"dataset {dataset!r} has no documents; the sequence builder draws "
                        "token ids directly")
    if dataset == "prose":
        return _prose()
    if dataset == "stdlib-code":
        return _stdlib_code()
    if dataset in HUB_DATASETS:
        return _hub(dataset, seed)
    return _text_path(dataset[len(TEXT_PREFIX):])


# ------------------------------------------------------- the random source's vocabulary
def special_token_ids(tokenizer) -> set[int]:
    """``all_special_ids`` plus every added token flagged special (e.g. SmolLM2's
    ``<file_sep>``, ``<jupyter_code>``, which ``all_special_ids`` does not list)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def placeholder_token_ids(tokenizer) -> set[int]:
    """Reserved vocabulary slots that no text tokenizes to and that are not flagged
    special, e.g. BERT's ``[unused0]``..``[unused993]``."""
    return {int(i) for tok, i in tokenizer.get_vocab().items() if _PLACEHOLDER.match(tok)}


# ------------------------------------------------------------------ offline sources
def _prose() -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        if topics[key].strip():
            yield f"pydoc:{key}", topics[key]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[tuple[str, Path]]:
    root = stdlib_root()
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if STDLIB_SKIP_DIRS.isdisjoint(rel.parts[:-1]):
            found.append((rel.as_posix(), path))
    return sorted(found)


def _stdlib_code() -> Iterator[tuple[str, str]]:
    files = _stdlib_files()
    if not files:
        raise DataError(f"no standard-library .py files found under {stdlib_root()}; "
                        "use prose, random or text:PATH")
    for rel, path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # a few interpreters ship non-UTF-8 fixtures; skip them
        if text.strip():
            yield f"stdlib:{rel}", text


def read_text_file(path: Path) -> str:
    """Read a UTF-8 text file (BOM stripped, newlines normalised) or raise DataError."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror or err}") from err
    if b"\x00" in data:
        raise DataError(f"{path} looks like a binary file (it contains NUL bytes), "
                        "not UTF-8 text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text (bad byte at offset {err.start})") from err
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_wikitext(text: str) -> list[tuple[str, str]]:
    """Split WikiText on top-level `` = Title = `` lines into ``(title, article)`` pairs.

    Text without such headings is returned whole with the title ``""``; text before the
    first heading becomes its own piece.
    """
    pieces: list[tuple[str, list[str]]] = [("", [])]
    for line in text.split("\n"):
        match = _WIKITEXT_TITLE.match(line)
        if match:
            pieces.append((match.group(1), []))
        pieces[-1][1].append(line)
    out = [(title, "\n".join(lines)) for title, lines in pieces]
    return [(title, body) for title, body in out if body.strip()]


def _file_documents(path: Path, name: str) -> list[tuple[str, str]]:
    text = read_text_file(path)
    if not text.strip():
        return []
    articles = split_wikitext(text)
    if len(articles) == 1 and not articles[0][0]:
        return [(name, text)]
    return [(f"{name}#{i}:{title}" if title else f"{name}#{i}", body)
            for i, (title, body) in enumerate(articles)]


def _text_files(folder: Path) -> list[tuple[str, Path]]:
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.suffix.lower() in TEXT_SUFFIXES and path.is_file():
            found.append((rel.as_posix(), path))
    return sorted(found)


def _text_path(raw: str) -> Iterator[tuple[str, str]]:
    path = Path(raw).expanduser()
    if not path.exists():
        raise DataError(f"text:{raw}: no such file or folder")
    if path.is_file():
        docs = _file_documents(path, path.name)
        if not docs:
            raise DataError(f"text:{raw}: the file is empty")
        return iter(docs)
    if not path.is_dir():
        raise DataError(f"text:{raw} is neither a regular file nor a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise DataError(f"text:{raw}: permission denied")
    files = _text_files(path)
    if not files:
        raise DataError(f"text:{raw}: the folder holds no {'/'.join(TEXT_SUFFIXES)} files")
    return _folder_documents(raw, files)


def _folder_documents(raw: str, files: list[tuple[str, Path]]) -> Iterator[tuple[str, str]]:
    produced = False
    for rel, path in files:
        for doc in _file_documents(path, rel):
            produced = True
            yield doc
    if not produced:
        raise DataError(f"text:{raw}: every text file in the folder is empty")


# ---------------------------------------------------------------------- hub sources
def hub_offline() -> bool:
    """True when the environment forbids hub access (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    truthy = {"1", "on", "yes", "true"}
    return any(os.environ.get(v, "").strip().lower() in truthy
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub(dataset: str, seed: int) -> Iterator[tuple[str, str]]:
    repo = WIKIPEDIA_REPO if dataset == "wikipedia" else CODE_REPO
    if hub_offline():
        raise DataError(f"dataset {dataset!r} streams {repo} from the Hugging Face hub, but "
                        f"HF_HUB_OFFLINE is set; {_OFFLINE_HINT}")
    try:
        import datasets
    except ImportError as err:
        raise DataError(f"dataset {dataset!r} needs the `datasets` package "
                        f"(pip install 'poskernel_tl[hub]'); {_OFFLINE_HINT}") from err
    try:  # one quick request, so an unreachable hub fails in seconds, not after retries
        from huggingface_hub import HfApi

        HfApi().dataset_info(repo, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as err:  # any failure here means "not reachable"
        raise DataError(f"cannot reach {repo} on the Hugging Face hub "
                        f"({type(err).__name__}); {_OFFLINE_HINT}") from err
    try:
        if dataset == "wikipedia":
            stream = datasets.load_dataset(WIKIPEDIA_REPO, WIKIPEDIA_CONFIG, split="train",
                                           streaming=True)
        else:
            stream = datasets.load_dataset("parquet", data_files=CODE_DATA_FILES,
                                           split="train", streaming=True)
            stream = stream.filter(lambda row: row["language"] == "Python")
        stream = stream.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)
    except Exception as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise DataError(f"cannot open {repo} ({type(err).__name__}: {detail}); "
                        f"{_OFFLINE_HINT}") from err
    return _hub_rows(dataset, repo, stream)


def _hub_rows(dataset: str, repo: str, stream) -> Iterator[tuple[str, str]]:
    rows = iter(stream)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as err:  # network errors surface here mid-stream
            raise DataError(f"streaming {repo} failed ({type(err).__name__}); "
                            f"{_OFFLINE_HINT}") from err
        if dataset == "wikipedia":
            doc_id, text = f"wikipedia:{row['id']}", row["text"]
        else:
            doc_id, text = f"github:{row['repo_name']}/{row['path']}", row["code"]
        if text and text.strip():
            yield doc_id, text
