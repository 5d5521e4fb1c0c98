"""Data layer: sources, the sequence builder, the ``_seqs.pt`` cache and its validation."""

import os
import sys
import time
from itertools import islice
from pathlib import Path

import pytest
import torch

from poskernel_tl import constants
from poskernel_tl.data.datasets import (
    HUB_DATASETS,
    OFFLINE_DATASETS,
    iter_documents,
    special_token_ids,
    split_wikitext,
)
from poskernel_tl.data.sequences import (
    build_sequences,
    centering_mask,
    collect_windows,
    ensure_sequences,
    eval_mask,
    load_sequences,
    save_sequences,
)
from poskernel_tl.errors import DataError

WIKITEXT = Path(__file__).parents[2] / "shared/data/wikitext2_test_raw.txt"
OFFLINE_NAMES = ("prose", "stdlib-code", "random", "text:PATH")


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg, f"error message should be one non-empty line: {msg!r}"
    return msg


@pytest.fixture
def small_text(tmp_path) -> Path:
    """A WikiText-style file: a long article and a short one (shorter than 128 tokens)."""
    body = "The quick brown fox jumps over the lazy dog. " * 18
    text = (f" = First Article = \n {body}\n = = History = = \n {body}\n"
            f" = Second Article = \n A short closing article about a fox .\n")
    path = tmp_path / "small.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def wikitext() -> Path:
    if not WIKITEXT.is_file():
        pytest.skip(f"shared WikiText-2 file not found at {WIKITEXT}")
    return WIKITEXT


def build(tok, dataset, length, n=20, seed=0, **kw):
    return build_sequences(tok, dataset, length, n, seed, model_name="tiny", **kw)


# ----------------------------------------------------------------------- sources
def test_dataset_name_tuples():
    assert OFFLINE_DATASETS == ("prose", "stdlib-code", "random", "repeated")
    assert HUB_DATASETS == ("wikipedia", "code")


def test_prose_and_stdlib_documents_are_sorted_and_nonempty():
    prose = list(iter_documents("prose"))
    assert len(prose) > 50 and all(t.strip() for _, t in prose)
    assert [d for d, _ in prose] == sorted(d for d, _ in prose)
    first = [d for d, _ in islice(iter_documents("stdlib-code"), 40)]
    assert first == sorted(first) and all(d.startswith("stdlib:") for d in first)
    again = [d for d, _ in islice(iter_documents("stdlib-code"), 40)]
    assert again == first
    assert not any("/test/" in d or "site-packages" in d for d in first)


def test_wikitext_split_into_articles(small_text):
    docs = list(iter_documents(f"text:{small_text}"))
    assert [d for d, _ in docs] == ["small.txt#0:First Article", "small.txt#1:Second Article"]
    assert "= = History = =" in docs[0][1]  # sub-headings stay inside their article
    assert split_wikitext("no headings here\n") == [("", "no headings here\n")]


def test_shared_wikitext_articles(wikitext):
    ids = [d for d, _ in iter_documents(f"text:{wikitext}")]
    assert len(ids) > 50 and ids[0] == "wikitext2_test_raw.txt#0:Robert Boulter"


def test_text_folder(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "a.txt").write_text("alpha text\n")
    (tmp_path / "b" / "c.py").write_text("x = 1\n")
    (tmp_path / "b" / "d.md").write_text("# title\n")
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\x00\x00")
    (tmp_path / ".hidden" / "e.txt").write_text("secret\n")
    assert [d for d, _ in iter_documents(f"text:{tmp_path}")] == ["a.txt", "b/c.py", "b/d.md"]


@pytest.mark.parametrize("content, match", [
    (b"", "empty"),
    (b"   \n\n", "empty"),
    (b"abc\x00\x01\x02", "binary"),
    ("caf\u00e9 cr\u00e8me".encode("latin-1"), "not UTF-8"),
])
def test_bad_text_files(tmp_path, content, match):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=match) as err:
        list(iter_documents(f"text:{path}"))
    one_line(err)


def test_missing_and_unreadable_paths(tmp_path):
    with pytest.raises(DataError, match="no such file") as err:
        iter_documents(f"text:{tmp_path / 'nope.txt'}")
    one_line(err)
    with pytest.raises(DataError, match="no .txt/.md/.py files"):
        iter_documents(f"text:{tmp_path}")
    if os.geteuid() == 0:
        return  # root reads everything; permission errors cannot be provoked
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    with pytest.raises(DataError, match="cannot read"):
        iter_documents(f"text:{locked}")


def test_unknown_dataset():
    with pytest.raises(DataError, match="unknown dataset 'wiki'.*prose") as err:
        iter_documents("wiki")
    one_line(err)


@pytest.mark.parametrize("name", HUB_DATASETS)
def test_hub_offline_fails_fast(monkeypatch, tiny_tokenizer, name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(DataError) as err:
        build(tiny_tokenizer, name, 16)
    assert time.perf_counter() - t0 < 2.0
    msg = one_line(err)
    assert all(alt in msg for alt in OFFLINE_NAMES), msg


def test_hub_without_datasets_package(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DataError, match="needs the `datasets` package") as err:
        iter_documents("wikipedia")
    assert all(alt in one_line(err) for alt in OFFLINE_NAMES)


class _FakeStream:
    """Stands in for a streamed hub dataset: endless rows, counting how many were read."""

    def __init__(self, make_row):
        self.make_row, self.read = make_row, 0

    def shuffle(self, seed, buffer_size):
        return self

    def filter(self, fn):
        return self

    def __iter__(self):
        while True:
            self.read += 1
            yield self.make_row(self.read)


def _fake_hub(monkeypatch, make_row, probe_error=None):
    import types

    import huggingface_hub

    def probe(self, repo, timeout=None):
        if probe_error:
            raise probe_error

    stream = _FakeStream(make_row)
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda *a, **k: stream
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", probe)
    return stream


def test_hub_source_stops_at_a_pool_of_4n(monkeypatch, tiny_tokenizer):
    text = "The quick brown fox jumps over the lazy dog. " * 12  # several 32-token windows
    stream = _fake_hub(monkeypatch, lambda i: {"id": str(i), "text": text})
    seqs = build(tiny_tokenizer, "wikipedia", 32, n=10)
    assert seqs["n_candidates"] == 40 and stream.read < 40  # stopped early
    assert all(d.startswith("wikipedia:") for d in seqs["doc_ids"])
    row = {"repo_name": "me/repo", "path": "a.py", "code": "def f(x):\n    return x\n" * 20}
    stream = _fake_hub(monkeypatch, lambda i: row)
    assert build(tiny_tokenizer, "code", 32, n=4)["doc_ids"][0] == "github:me/repo/a.py"


def test_unreachable_hub_fails_fast(monkeypatch):
    _fake_hub(monkeypatch, lambda i: {}, probe_error=ConnectionError("no route to host"))
    with pytest.raises(DataError, match="cannot reach wikimedia/wikipedia") as err:
        iter_documents("wikipedia")
    assert all(alt in one_line(err) for alt in OFFLINE_NAMES)


# ----------------------------------------------------------------------- builder
def test_deterministic(tiny_tokenizer, small_text):
    for dataset in (f"text:{small_text}", "prose", "random"):
        a, b = build(tiny_tokenizer, dataset, 32), build(tiny_tokenizer, dataset, 32)
        assert torch.equal(a["input_ids"], b["input_ids"]) and a["doc_ids"] == b["doc_ids"]
        other = build(tiny_tokenizer, dataset, 32, seed=1)
        assert not torch.equal(a["input_ids"], other["input_ids"]), dataset


def test_windows_are_natural_content(tiny_tokenizer):
    seqs = build(tiny_tokenizer, "prose", 64, n=40)
    texts = dict(iter_documents("prose"))
    assert seqs["input_ids"].shape == (40, 64) and seqs["input_ids"].dtype == torch.int64
    assert seqs["cross_doc"] is False and seqs["tokenizer"] and seqs["source"]
    for row, doc, off in zip(seqs["input_ids"], seqs["doc_ids"], seqs["offsets"].tolist()):
        ids = tiny_tokenizer(texts[doc], add_special_tokens=False)["input_ids"]
        assert off % 64 == 0 and off + 64 <= len(ids)
        assert row.tolist() == ids[off:off + 64], (doc, off)
    assert not set(seqs["input_ids"].unique().tolist()) & special_token_ids(tiny_tokenizer)


def test_cross_doc_windows_follow_the_stream(tiny_tokenizer, small_text):
    dataset, t = f"text:{small_text}", 120
    inside, _, _ = collect_windows(tiny_tokenizer, dataset, t)
    tokens, doc_ids, offsets = collect_windows(tiny_tokenizer, dataset, t, allow_cross_doc=True)
    assert len(tokens) > len(inside)  # the short article only counts across documents
    names, texts = zip(*iter_documents(dataset))
    docs = [tiny_tokenizer(x, add_special_tokens=False)["input_ids"] for x in texts]
    stream = docs[0] + [tiny_tokenizer.eos_token_id] + docs[1]
    assert tokens.reshape(-1).tolist() == stream[:len(tokens) * t]
    assert (tokens == tiny_tokenizer.eos_token_id).sum() == 1
    starts = [0, len(docs[0]) + 1]
    for k, (doc, off) in enumerate(zip(doc_ids, offsets)):
        assert starts[names.index(doc)] + off == t * k
    seqs = build(tiny_tokenizer, dataset, t, n=len(tokens) // 2 * 2, allow_cross_doc=True)
    assert seqs["cross_doc"] is True


def test_split_layout(tiny_tokenizer):
    seqs = build(tiny_tokenizer, "prose", 64, n=40)
    assert seqs["split"] == ["centering"] * 20 + ["eval"] * 20
    assert torch.equal(seqs["seq_id"], torch.arange(40))
    assert centering_mask(seqs).tolist() == [True] * 20 + [False] * 20
    assert torch.equal(eval_mask(seqs), ~centering_mask(seqs))
    windows = list(zip(seqs["doc_ids"], seqs["offsets"].tolist()))
    assert len(set(windows)) == 40  # centering and evaluation never share a window
    order = {d: i for i, (d, _) in enumerate(iter_documents("prose"))}
    keys = [(order[d], o) for d, o in windows]
    assert keys[:20] == sorted(keys[:20]) and keys[20:] == sorted(keys[20:])
    # both halves are random draws from the whole corpus, not its first and second part
    assert max(keys[:20]) > min(keys[20:]) and max(keys[20:]) > min(keys[:20])
    rand = build(tiny_tokenizer, "random", 16, n=10)
    assert rand["split"] == ["eval"] * 10 and not centering_mask(rand).any()
    assert eval_mask(rand).all()
    assert rand["offsets"].tolist() == [-1] * 10


def test_random_excludes_special_tokens(tiny_tokenizer):
    seqs = build(tiny_tokenizer, "random", 256, n=40)
    used = set(seqs["input_ids"].unique().tolist())
    special = set(tiny_tokenizer.all_special_ids)
    assert special and not used & special
    assert used == set(range(len(tiny_tokenizer))) - special  # 10,240 draws cover them all


def test_repeated_is_one_token_per_sequence(tiny_tokenizer, tmp_path):
    """Gu et al.'s third condition: each sequence one non-special token repeated, drawn
    per sequence (so sequences differ), every sequence an evaluation one; the file
    validates when read back."""
    seqs = build(tiny_tokenizer, "repeated", 64, n=40)
    ids = seqs["input_ids"]
    assert (ids == ids[:, :1]).all()  # no frame for this tokenizer: the whole row
    assert len(set(ids[:, 0].tolist())) > 20
    assert not set(ids.unique().tolist()) & set(tiny_tokenizer.all_special_ids)
    assert seqs["split"] == ["eval"] * 40 and seqs["doc_ids"] == ["repeated"] * 40
    assert "repeated" in seqs["source"]
    with pytest.raises(DataError, match="no documents"):
        next(iter_documents("repeated"))


def test_random_excludes_smollm2_added_specials(smollm2_tokenizer):
    seqs = build_sequences(smollm2_tokenizer, "random", 256, 200, model_name="smollm2-135m")
    special = special_token_ids(smollm2_tokenizer)
    assert set(range(17)) <= special  # <file_sep>, <jupyter_code>, ... are special too
    assert not set(seqs["input_ids"].unique().tolist()) & special
    assert int(seqs["input_ids"].max()) < len(smollm2_tokenizer)


def test_too_small_corpus_says_how_many(tiny_tokenizer, small_text):
    dataset = f"text:{small_text}"
    available = len(collect_windows(tiny_tokenizer, dataset, 64)[0])
    assert 4 <= available < 200
    with pytest.raises(DataError, match=f"can supply only {available} sequences of 64") as err:
        build(tiny_tokenizer, dataset, 64, n=200)
    assert "--allow-cross-doc" in one_line(err)
    assert len(build(tiny_tokenizer, dataset, 64, n=available - available % 2)["doc_ids"])


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 7}, "even integer"),
    ({"n": 0}, "even integer"),
    ({"n": 1}, "even integer"),
    ({"length": 2}, "length must be"),
    ({"length": 512, "n_ctx": 256}, r"context of model 'tiny' \(256 tokens\)"),
])
def test_bad_arguments(tiny_tokenizer, kwargs, match):
    length = kwargs.pop("length", 32)
    n = kwargs.pop("n", 20)
    with pytest.raises(DataError, match=match) as err:
        build(tiny_tokenizer, "random", length, n=n, **kwargs)
    one_line(err)


# ----------------------------------------------------------------- file / cache
def test_save_load_roundtrip(tiny_tokenizer, tmp_path):
    seqs = build(tiny_tokenizer, "prose", 32)
    path = tmp_path / "data" / "x_seqs.pt"
    save_sequences(seqs, path)
    assert [p.name for p in path.parent.iterdir()] == ["x_seqs.pt"]  # no temp file left
    raw = torch.load(path, weights_only=True)
    assert set(raw) == set(seqs)
    for key, value in seqs.items():
        same = torch.equal(raw[key], value) if torch.is_tensor(value) else raw[key] == value
        assert same, key
    loaded = load_sequences(path, expect={"model": "tiny", "dataset": "prose", "length": 32,
                                          "n_seqs": 20, "seed": 0, "cross_doc": False})
    assert torch.equal(loaded["input_ids"], seqs["input_ids"])
    with pytest.raises(DataError, match="seed=0, not seed=3") as err:
        load_sequences(path, expect={"seed": 3})
    one_line(err)


def test_ensure_builds_then_reuses(tiny_tokenizer, tmp_path):
    seqs, path, built = ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20,
                                         model_name="tiny")
    assert built and path == constants.seqs_path(tmp_path, "tiny", "prose", 32)
    stamp = path.stat().st_mtime_ns
    again, _, built2 = ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20,
                                        model_name="tiny")
    assert not built2 and path.stat().st_mtime_ns == stamp
    assert torch.equal(again["input_ids"], seqs["input_ids"])
    fresh, _, _ = ensure_sequences(tmp_path / "other", tiny_tokenizer, "prose", 32, 20,
                                   model_name="tiny")
    assert torch.equal(fresh["input_ids"], seqs["input_ids"])  # rebuilding is identical
    with pytest.raises(DataError, match="seed=0, not seed=1.*--overwrite") as err:
        ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20, 1, model_name="tiny")
    one_line(err)
    assert path.stat().st_mtime_ns == stamp


def _edit(seqs: dict, how: str) -> dict:
    seqs = dict(seqs)
    if how == "dtype":
        seqs["input_ids"] = seqs["input_ids"].int()
    elif how == "rows":
        seqs["input_ids"] = seqs["input_ids"][:-1]
    elif how == "length":
        seqs["input_ids"] = seqs["input_ids"][:, :-1]
    elif how == "split":
        seqs["split"] = seqs["split"][::-1]
    elif how == "seq_id":
        seqs["seq_id"] = seqs["seq_id"].flip(0)
    elif how == "missing":
        del seqs["offsets"]
    elif how == "not-a-dict":
        return [seqs["input_ids"]]
    return seqs


@pytest.mark.parametrize("how, match", [
    ("dtype", "int64"), ("rows", "split must be a list of 19|even number"),
    ("length", "tokens per row"), ("split", "fixed layout"), ("seq_id", "arange"),
    ("missing", "missing field"), ("not-a-dict", "expected a dict"),
])
def test_hand_edited_file_is_rejected(tiny_tokenizer, tmp_path, how, match):
    seqs, path, _ = ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20,
                                     model_name="tiny")
    torch.save(_edit(seqs, how), path)
    with pytest.raises(DataError, match=match) as err:
        load_sequences(path)
    one_line(err)
    with pytest.raises(DataError, match="--overwrite"):
        ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20, model_name="tiny")


def test_corrupt_cache_never_silently_reused(tiny_tokenizer, tmp_path):
    path = constants.seqs_path(tmp_path, "tiny", "prose", 32)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a torch file")
    with pytest.raises(DataError, match="corrupt.*delete the file or rerun with --overwrite") as e:
        ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20, model_name="tiny")
    one_line(e)
    assert path.read_bytes() == b"not a torch file"
    with pytest.warns(UserWarning, match="rebuilding"):
        seqs, _, built = ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20,
                                          model_name="tiny", overwrite=True)
    assert built and torch.equal(load_sequences(path)["input_ids"], seqs["input_ids"])


def test_cross_doc_choice_is_part_of_the_cache_key(tiny_tokenizer, tmp_path):
    ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20, model_name="tiny",
                     allow_cross_doc=True)
    with pytest.raises(DataError, match="cross_doc=True, not cross_doc=False"):
        ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 20, model_name="tiny")


# ------------------------------------------------- embedded default model (SmolLM2)
@pytest.mark.parametrize("length", [256, 1024])
def test_wikitext_with_smollm2(smollm2_tokenizer, wikitext, length):
    seqs = build_sequences(smollm2_tokenizer, f"text:{wikitext}", length, 200,
                           model_name="smollm2-135m", n_ctx=8192)
    assert seqs["input_ids"].shape == (200, length)
    assert seqs["n_candidates"] >= 200 and seqs["cross_doc"] is False
    assert not set(seqs["input_ids"].unique().tolist()) & special_token_ids(smollm2_tokenizer)


def test_prose_supplies_200_at_256(smollm2_tokenizer):
    seqs = build_sequences(smollm2_tokenizer, "prose", 256, 200, model_name="smollm2-135m")
    assert seqs["input_ids"].shape == (200, 256) and seqs["n_candidates"] >= 200


def test_stdlib_code_supplies_200_at_256(smollm2_tokenizer):
    # the full scan (~3.4 M tokens, ~8 s) is what build_sequences does; stopping at 200
    # windows proves the same claim in a fraction of the time
    tokens, doc_ids, offsets = collect_windows(smollm2_tokenizer, "stdlib-code", 256,
                                               max_windows=200)
    assert tokens.shape == (200, 256) and len(set(doc_ids)) > 5
    assert all(off % 256 == 0 for off in offsets)
