"""Head inspection (``inspect_head``, ``poskernel inspect``) and the report's head and
layer pages (``write_head_pages``), with the pages opened in headless Chromium when it
is installed."""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from browser import find_chromium, load_page, parse_html
from tiny_models import tiny_loaded

from poskernel_tl import report
from poskernel_tl.constants import dataset_slug
from poskernel_tl.head_view import HeadView, head_tensors, inspect_head
from poskernel_tl.head_view_cli import add_inspect_parser, cmd_inspect, dataset_window
from poskernel_tl.registry import ModelSpec
from poskernel_tl.report import pages
from poskernel_tl.result import ConditionResult
from poskernel_tl.toeplitz import shift_invariance_r2

ROOT = Path(__file__).resolve().parents[1]
EVIL = "<script>alert(1)</script>"
TEXT = ("The quick brown fox jumps over the lazy dog. "
        f'Say {EVIL} and "double" \'single\' </div> done. def f(x): return x + 1\n')

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not found: apt-get install chromium (or set POSKERNEL_CHROMIUM)")


@pytest.fixture(scope="module")
def llama(tiny_tokenizer):
    return tiny_loaded("llama", tiny_tokenizer, compatibility_mode=False)


@pytest.fixture(scope="module")
def gpt2(tiny_tokenizer):
    return tiny_loaded("gpt2", tiny_tokenizer, compatibility_mode=False)


def hooked(model, ids, layer, head):
    """hook_attn_scores and hook_pattern of one head, read directly."""
    got = {}
    names = [f"blocks.{layer}.attn.hook_attn_scores", f"blocks.{layer}.attn.hook_pattern"]

    def grab(x, hook):
        got[hook.name.rsplit(".", 1)[-1]] = x[0, head].detach().clone()

    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[(n, grab) for n in names]):
        model.bridge(ids[None])
    return got["hook_attn_scores"], got["hook_pattern"]


# ------------------------------------------------------------------ inspect_head


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_numbers_equal_the_hooked_scores(arch, llama, gpt2, monkeypatch):
    model = {"llama": llama, "gpt2": gpt2}[arch]
    view = inspect_head(model, TEXT, 1, 3)
    ids = torch.as_tensor(view.token_ids)
    scores, pattern = hooked(model, ids, 1, 3)
    T = len(ids)
    assert view.logits.shape == view.pattern.shape == view.residual.shape == (T, T)
    assert view.g.shape == (T - 1,) and len(view.tokens) == T
    lower = np.tril(np.ones((T, T), dtype=bool))
    np.testing.assert_array_equal(view.logits[lower], scores.numpy()[lower])
    assert np.isnan(view.logits[~lower]).all()
    r2, g = shift_invariance_r2(scores)
    assert view.r2 == float(r2)
    np.testing.assert_array_equal(view.g, g.numpy())
    np.testing.assert_array_equal(view.pattern, pattern.numpy())
    assert view.pattern_from == "hook_pattern" and view.scores_from == "hook_attn_scores"
    # residual and the no-sink fit, by brute force
    A = scores.double().numpy()
    t, s = np.nonzero(np.tril(np.ones((T, T), dtype=bool), k=-1))
    np.testing.assert_allclose(view.residual[t, s], A[t, s] - view.g[t - s - 1], atol=1e-12)
    keep = s > 0
    lag = (t - s)[keep]
    vals = A[t[keep], s[keep]]
    fit = np.array([vals[lag == d].mean() for d in lag])
    r2_ns = 1 - ((vals - fit) ** 2).sum() / ((vals - vals.mean()) ** 2).sum()
    assert view.r2_nosink == pytest.approx(r2_ns, abs=1e-10)
    # the q·kᵀ path gives the same logits
    qk = head_tensors(model, ids, 1, 3, hook_scores=False)
    assert qk["scores_from"].startswith("q·kᵀ")
    strict = np.tril(np.ones((T, T), dtype=bool), k=-1)
    np.testing.assert_allclose(qk["scores"].numpy()[strict], scores.numpy()[strict], atol=1e-5)
    omega, power = view.spectrum
    assert omega.shape == power.shape and (power >= 0).all()
    if arch == "llama":  # without hook_pattern: the softmax of the causal logits
        monkeypatch.setattr("poskernel_tl.head_view.PATTERN_HOOK", "no.such.hook{layer}")
        soft = head_tensors(model, ids, 1, 3)
        assert soft["pattern_from"] == "softmax of the causal logits"
        np.testing.assert_allclose(soft["pattern"].numpy(), pattern.numpy(), atol=1e-6)
    if arch == "llama":
        assert view.alignment is not None and "aligned" in view.alignment
        assert view.thetas is not None and len(view.thetas) == 8
    else:
        assert view.alignment is None and view.thetas is None
    assert "r2=" in repr(view) and len(repr(view)) < 200


def test_token_inputs(llama, tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    a = inspect_head(llama, ids[:20], 0, 1)
    b = inspect_head(llama, torch.tensor([ids]), 0, 1, max_tokens=20)
    c = inspect_head(llama, TEXT, 0, 1, max_tokens=20)
    assert a.r2 == b.r2 == c.r2 and a.tokens == c.tokens
    assert c.tokens == [tiny_tokenizer.decode([i]) for i in ids[:20]]
    assert inspect_head(llama, ids[:3], 0, 0).n_tokens == 3  # the shortest allowed


def test_bad_input_is_refused_with_the_limit(llama):
    with pytest.raises(ValueError, match=r"layers 0\.\.1"):
        inspect_head(llama, TEXT, 2, 0)
    with pytest.raises(ValueError, match=r"heads 0\.\.3"):
        inspect_head(llama, TEXT, 0, 4)
    with pytest.raises(ValueError, match=r"heads 0\.\.3"):
        inspect_head(llama, TEXT, 0, -1)
    with pytest.raises(ValueError, match="at least 3"):
        inspect_head(llama, "The", 0, 0)
    with pytest.raises(ValueError, match="context of 128"):
        inspect_head(llama, TEXT * 10, 0, 0)
    with pytest.raises(ValueError, match="vocabulary"):
        inspect_head(llama, [1, 2, 5000], 0, 0)
    with pytest.raises(ValueError, match="max_tokens"):
        inspect_head(llama, TEXT, 0, 0, max_tokens=2)
    with pytest.raises(TypeError):
        inspect_head(llama, 3.5, 0, 0)


def with_nasty_tokens(view: HeadView) -> HeadView:
    view.tokens = list(view.tokens)
    view.tokens[4], view.tokens[5], view.tokens[6] = EVIL, '"double" \'single\'', "</div>"
    return view


@pytest.fixture(scope="module")
def saved(llama, tmp_path_factory):
    view = with_nasty_tokens(inspect_head(llama, TEXT, 1, 2))
    return view, view.save(tmp_path_factory.mktemp("inspect") / "one.html")


def test_saved_page_escapes_tokens(saved):
    view, page = saved
    text = page.read_text(encoding="utf-8")
    assert page.stat().st_size > 1_000_000  # the bundle is inline
    assert EVIL not in text and "<div>" not in text.replace('<div class="', "")
    assert 'id="' in text and text.count("<div") == text.count("</div>")
    spans = [s.text() for s in parse_html(text).find_all("span", class_="pk-tok")]
    assert spans == view.tokens
    block = view._repr_html_()
    assert "var CircuitsVis" in block and "<style>" in block and EVIL not in block


@needs_chromium
def test_saved_page_renders_in_chromium(saved):
    view, page = saved
    run = load_page(page)
    assert run.probe == [], run.probe  # no alert, no error, nothing fetched
    box = run.dom.find_all("div", class_="pk-cv")
    assert len(box) == 1 and box[0].attrs["data-pk-state"] == "mounted", box[0].text()
    assert len(box[0].find_all("canvas", role="img")) == 1
    T = view.n_tokens
    assert int(box[0].attrs["data-pk-cells"]) == T * T
    spans = [s.text() for s in run.dom.find_all("span", class_="pk-tok")]
    assert spans == view.tokens and spans[4:7] == [EVIL, '"double" \'single\'', "</div>"]
    assert not run.dom.find_all("b") and not run.dom.find_all("img", src="x")
    assert len(run.dom.find_all("img", class_="pk-fig")) == 3  # logits, g, spectrum


# ---------------------------------------------------------------------- the CLI


def parse(argv):
    parser = argparse.ArgumentParser(prog="poskernel")
    add_inspect_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["inspect", *argv])


def test_cli_checks_arguments_before_loading(monkeypatch, tmp_path):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("poskernel_tl.head_view_cli.load_model", no_load)
    cases = [
        (["--layer", "30", "--head", "0", "--text", "hello"], ValueError, r"layers 0\.\.29"),
        (["--layer", "0", "--head", "9", "--text", "hello"], ValueError, r"heads 0\.\.8"),
        (["--layer", "0", "--head", "0", "--file", str(tmp_path / "no.txt")],
         FileNotFoundError, "no such file"),
        (["--layer", "0", "--head", "0", "--dataset", "nope"], ValueError, "unknown dataset"),
        (["--layer", "0", "--head", "0", "--text", "x", "--index", "2"], ValueError, "--index"),
        (["--layer", "0", "--head", "0", "--dataset", "prose", "--length", "9000"],
         ValueError, "8192"),
        (["--layer", "0", "--head", "0", "--text", "  "], ValueError, "empty"),
        (["--model", "nonesuch", "--layer", "0", "--head", "0", "--text", "x"], ValueError,
         "unknown model"),
        (["--layer", "0", "--head", "0", "--text", "x", "--device", "tpu"], ValueError, "tpu"),
    ]
    for argv, err, match in cases:
        with pytest.raises(err, match=match):
            cmd_inspect(parse(argv))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="UTF-8"):
        cmd_inspect(parse(["--layer", "0", "--head", "0", "--file", str(bad)]))
    with pytest.raises(SystemExit):  # exactly one text source
        parse(["--layer", "0", "--head", "0", "--text", "a", "--dataset", "prose"])


def test_cli_writes_pages(monkeypatch, tmp_path, llama, capsys):
    monkeypatch.setattr("poskernel_tl.head_view_cli.load_model", lambda *a, **k: llama)
    src = tmp_path / "in.txt"
    src.write_text(TEXT, encoding="utf-8")
    runs = [["--text", TEXT], ["--file", str(src), "--shared-assets"],
            ["--dataset", "prose", "--index", "1", "--length", "40"]]
    for i, extra in enumerate(runs):
        out = tmp_path / f"p{i}.html"
        assert cmd_inspect(parse(["--layer", "1", "--head", "3", "--out", str(out), *extra])) == 0
        printed = capsys.readouterr().out
        assert "R² = " in printed and str(out) in printed and out.is_file()
    assert "prose window 1: pydoc:" in printed and "40 tokens" in printed
    assert (tmp_path / "assets" / "circuitsvis.js").is_file()
    assert '<script src="assets/circuitsvis.js">' in (tmp_path / "p1.html").read_text("utf-8")
    ids, label = dataset_window(llama.tokenizer, "random", 16, index=2, seed=1,
                                model_name="tiny")
    assert ids.shape == (16,) and label == "random tokens, sequence 2 (seed 1)"


# -------------------------------------------------------------- report head pages


def synthetic_result(L=2, H=4, T=32, n=6, *, logits=True, dataset="prose", seed=0,
                     n_kv=2, n_theta=8, model="tiny-llama") -> ConditionResult:
    """A ConditionResult of random arrays around a planted g(Δ) (no model)."""
    rng = np.random.default_rng(seed)
    thetas = 10000.0 ** (-np.arange(n_theta) / n_theta)
    spec = ModelSpec(model, None, "rope", "rmsnorm", L, H, n_kv, 2 * n_theta, 10000.0, 2048,
                     inv_freq=tuple(float(x) for x in thetas))
    lag = np.arange(1, T)
    g = (np.cos(np.outer(rng.uniform(0.05, 1.0, L * H), lag)) * 2
         - 0.02 * lag).reshape(L, H, T - 1)
    r2 = lambda *shape: rng.uniform(0.2, 1.0, shape)  # noqa: E731
    fields = dict(
        model=model, dataset=dataset, length=T, spec=spec, seq_id=np.arange(n) * 2 + 1,
        r2_per_seq=r2(n, L, H), r2_per_seq_nosink=r2(n, L, H),
        g_per_seq=(g[None] + rng.normal(0, 0.1, (n, L, H, T - 1))).astype(np.float32),
        r2_pooled=r2(L, H), r2_pooled_nosink=r2(L, H), g_pooled=g,
        r2_pooled_early=r2(L, H), r2_pooled_interior=r2(L, H),
        r2_pooled_interior_keys=r2(L, H), r2_split=r2(5, L, H), centered=True,
        r2_gram=r2(L, H), g_gram=0.8 * g, r2_gram_raw=r2(L, H), g_gram_raw=0.9 * g,
        r2_gram_half=r2(L, H), n_centering=n,
        q_pair_norm=rng.uniform(0.5, 2, (L, H, n_theta)),
        k_pair_norm=rng.uniform(0.5, 2, (L, n_kv, n_theta)),
        pair_first=np.arange(n_theta), pair_second=np.arange(n_theta) + n_theta,
        provenance={"weights": "synthetic arrays"})
    if logits:
        d = np.subtract.outer(np.arange(T), np.arange(T))
        mats = []
        for sid in (3, 5):
            A = np.take_along_axis(np.broadcast_to(g[..., None, :], (L, H, T, T - 1)),
                                   np.broadcast_to(np.clip(d - 1, 0, T - 2), (L, H, T, T)),
                                   -1) + rng.normal(0, 0.3, (L, H, T, T))
            A[..., d <= 0] = np.nan
            mats.append((sid, A.astype(np.float32)))
        fields["logits"] = dict(mats)
    return ConditionResult(**fields)


NASTY_TOKENS = [EVIL, '"q"', "</div>", "a&b"]


def decode_with_nasty(result, seq_id):
    tokens = [f" w{i}" for i in range(result.length)]
    tokens[1:1 + len(NASTY_TOKENS)] = NASTY_TOKENS
    return tokens


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    (root / "report.html").write_text("<!DOCTYPE html><title>report</title>", encoding="utf-8")
    with_logits = synthetic_result(H=2, n_kv=1)
    without = synthetic_result(L=1, H=2, logits=False, dataset="text:/data/<b>odd</b>.txt",
                               seed=1)
    spectral = pd.DataFrame({"model": "tiny-llama", "dataset": "prose", "length": 32,
                             "layer": [0, 1], "head": [0, 0], "note": [EVIL, "c"]})
    t0 = time.time()
    written = pages.write_head_pages([with_logits, without], root,
                                     tokenizer_decode=decode_with_nasty,
                                     tables={"Spectral (csv)": spectral})
    return {"root": root, "written": written, "results": [with_logits, without],
            "seconds": time.time() - t0}


def test_head_pages_layout_and_content(site):
    root, (res, bare) = site["root"], site["results"]
    expected = {pages.head_page_path(root, r.model, r.dataset, r.length, layer, head)
                for r in (res, bare) for layer in range(r.n_layers) for head in range(r.n_heads)}
    expected |= {pages.layer_page_path(root, r.model, r.dataset, r.length, layer)
                 for r in (res, bare) for layer in range(r.n_layers)}
    assert set(site["written"]) == expected and all(p.is_file() for p in expected)
    first = pages.head_page_path(root, "tiny-llama", "prose", 32, 0, 1)
    assert first == root / "heads" / "tiny-llama" / "prose_32" / "L0H1.html"
    assert pages.head_page_href("tiny-llama", "prose", 32, 0, 1) == \
        "heads/tiny-llama/prose_32/L0H1.html"
    text = first.read_text(encoding="utf-8")
    assert "seq_id 3" in text and EVIL not in text and "Spectral (csv)" not in text
    assert "Spectral (csv)" in first.with_name("L0H0.html").read_text(encoding="utf-8")
    doc = parse_html(text)
    links = {a.text(): a.attrs["href"] for a in doc.find_all("a")}
    assert set(links) == {"report", "layer 0", "← L0H0",
                          f"same head: tiny-llama · {bare.dataset} · T=32"}
    assert all((first.parent / href).resolve().is_file() for href in links.values())
    headings = [h.text() for h in doc.find_all("h3")]
    assert any(h.startswith("Track A (pooled over 6") for h in headings)
    assert any(h.startswith("Track A per sequence (summary of 6 rows)") for h in headings)
    assert "Track B" in headings
    assert "Top spectral peaks: Track B g(Δ), gram centered" in headings
    assert [s.text() for s in doc.find_all("span", class_="pk-tok")][1:5] == NASTY_TOKENS
    assert len(doc.find_all("img", class_="pk-fig")) == 4
    other = pages.head_page_path(root, bare.model, bare.dataset, 32, 0, 1)
    assert other.parent.name == f"{dataset_slug(bare.dataset)}_32"
    bare_text = other.read_text(encoding="utf-8")
    assert "saved no full logit matrices" in bare_text and 'class="pk-cv"' not in bare_text
    assert "<b>odd" not in bare_text
    assert "Positions are labelled by index" not in text
    assert len(parse_html(bare_text).find_all("img", class_="pk-fig")) == 3
    assert "Spectral (csv)" not in bare_text  # its rows are for the other dataset


def test_extra_table_rows_belong_to_the_head(site):
    root = site["root"]
    notes = {}
    for head in range(2):
        page = pages.head_page_path(root, "tiny-llama", "prose", 32, 0, head)
        doc = parse_html(page.read_text(encoding="utf-8"))
        tables = doc.find_all("table")
        notes[head] = [t.text() for t in tables if "note" in t.text()]
    assert EVIL in notes[0][0] and notes[1] == []


def test_sequence_tokens_reads_the_run(tmp_path, tiny_tokenizer):
    from poskernel_tl.sequences import ensure_sequences

    seqs, _, _ = ensure_sequences(tmp_path, tiny_tokenizer, "prose", 32, 4, 0,
                                  model_name="tiny-llama")
    res = synthetic_result(L=1, H=2, logits=False)
    for tok in (tiny_tokenizer, {"tiny-llama": tiny_tokenizer}):
        tokens = pages.sequence_tokens(tmp_path, tok)(res, 3)
        assert tokens == [tiny_tokenizer.decode([i]) for i in seqs["input_ids"][3].tolist()]
    assert pages.sequence_tokens(tmp_path, {"other": tiny_tokenizer})(res, 3) is None
    assert pages.sequence_tokens(tmp_path, tiny_tokenizer)(res, 99) is None
    assert pages.sequence_tokens(tmp_path / "none", tiny_tokenizer)(res, 0) is None


def test_causal_softmax():
    A = np.array([[np.nan, np.nan, np.nan], [1.0, np.nan, np.nan], [0.0, np.log(3), np.nan]])
    P = pages.causal_softmax(A)
    np.testing.assert_allclose(P, [[1, 0, 0], [1, 0, 0], [0.25, 0.75, 0]], atol=1e-7)


@needs_chromium
def test_layer_page_links_to_head_pages_in_chromium(site):
    root = site["root"]
    layer = pages.layer_page_path(root, "tiny-llama", "prose", 32, 1)
    run = load_page(layer)
    assert run.probe == [], run.probe
    box = run.dom.find_all("div", class_="pk-cv")[0]
    assert box.attrs["data-pk-state"] == "mounted", box.text()
    assert len(box.find_all("canvas", role="img")) == 2 + 1
    links = {a.text(): a.attrs["href"] for a in run.dom.find_all("a")}
    assert {"L1H0", "L1H1", "report", "← layer 0"} <= set(links)
    for label in ("L1H0", "L1H1"):
        target = (layer.parent / links[label]).resolve()
        assert target.is_file()
        h1 = parse_html(target.read_text(encoding="utf-8")).find_all("h1")[0].text()
        assert h1.endswith(label)
    head = (layer.parent / links["L1H1"]).resolve()
    run = load_page(head)
    assert run.probe == [], run.probe
    assert run.dom.find_all("div", class_="pk-cv")[0].attrs["data-pk-state"] == "mounted"
    spans = [s.text() for s in run.dom.find_all("span", class_="pk-tok")]
    assert spans[1:5] == NASTY_TOKENS and not run.dom.find_all("b")
    for a in run.dom.find_all("a"):
        assert (head.parent / a.attrs["href"]).resolve().is_file(), a.attrs["href"]


def test_demo_grid_report_size(tmp_path):
    """A SmolLM2-shaped condition at T = 256 (30 layers × 9 heads, 3 kv heads, 32 θ):
    two head pages and a full 9-head layer page are written and measured; the demo
    grid (3 conditions × 270 heads) is extrapolated from them."""
    res = synthetic_result(L=30, H=9, T=256, n=20, n_kv=3, n_theta=32, model="smollm2-135m")
    t0 = time.time()
    written = pages.write_head_pages([res], tmp_path, heads=[(0, 0), (0, 1)])
    per_head = (time.time() - t0) / 2
    head_sizes = [p.stat().st_size for p in written if p.name.startswith("L0H")]
    patterns = pages.causal_softmax(res.logits[3][0])
    layer = report.render_layer_page(
        tmp_path / "layer.html", title="layer 0", tokens=[str(i) for i in range(256)],
        patterns=patterns, head_names=[f"L0H{h}" for h in range(9)], assets_rel="assets",
        tables={"Heads": pd.DataFrame({"head": range(9), "R2": np.linspace(0, 1, 9)})})
    bundle = (tmp_path / "assets" / "circuitsvis.js").stat().st_size
    total = 3 * (270 * np.mean(head_sizes) + 30 * layer.stat().st_size) + bundle
    print(f"\nhead page (T=256, with logits): {np.mean(head_sizes) / 1e3:.0f} kB, "
          f"{per_head:.1f} s each; 9-head layer page {layer.stat().st_size / 1e3:.0f} kB; "
          f"demo grid report ≈ {total / 1e6:.0f} MB")
    assert max(head_sizes) <= 150_000
    assert total < 150e6


# ----------------------------------------------------------------- the notebook


@pytest.mark.smollm2
def test_worked_notebook_runs(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", POSKERNEL_INSPECT_OUT=str(tmp_path),
               TOKENIZERS_PARALLELISM="false")
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "inspect_heads.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pages_written = sorted(p.name for p in tmp_path.glob("*.html"))
    assert len(pages_written) == 3, (pages_written, proc.stdout[-2000:])
    assert "most shift-invariant" in proc.stdout and "least shift-invariant" in proc.stdout
    print(f"\nscripts/inspect_heads.py: {time.time() - t0:.0f} s")
