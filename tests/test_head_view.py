"""Head inspection (``inspect_head``, ``poskernel inspect``) and the report's head and
layer pages (``write_head_pages``), with the pages opened in headless Chromium when it
is installed."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from browser import find_chromium, load_page
from tiny_models import tiny_loaded

import poskernel_tl as pk
from poskernel_tl.apps.cli import build_parser
from poskernel_tl.apps.head_view import HeadView, head_tensors, inspect_head
from poskernel_tl.apps.head_view_cli import cmd_inspect, dataset_window
from poskernel_tl.errors import UserError
from poskernel_tl.fit.toeplitz import shift_invariance_r2

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
        monkeypatch.setattr("poskernel_tl.apps.head_view.PATTERN_HOOK", "no.such.hook{site}")
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
    with pytest.raises(UserError, match="text_or_tokens"):
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
    assert page.stat().st_size > 1_000_000  # the bundles are inline
    assert EVIL not in text and "</div>\"" not in text
    data = re.search(r'<script type="application/json" id="(pk-[0-9a-f]+)-data">(.*?)</script>',
                     text, re.S)
    assert json.loads(data.group(2))["seq"]["tokens"] == view.tokens
    block = view._repr_html_()
    assert "var CircuitsVis" in block and EVIL not in block


@needs_chromium
def test_saved_page_renders_in_chromium(saved):
    view, page = saved
    run = load_page(page)
    assert run.probe == [] and run.console == [], (run.probe, run.console)
    heads = run.dom.find_all("div", class_="pk-head")
    assert len(heads) == 1 and heads[0].children, "the head view did not render"
    assert not run.dom.find_all("b") and not run.dom.find_all("img", src="x")
    assert f"{view.r2:.3f}" in heads[0].text()


def test_notebook_views_share_the_viewer_assets(llama, tmp_path, monkeypatch):
    """In a notebook the first view carries Plotly, circuitsvis and the viewer, later ones
    only their data (logits and pattern as deflated half-precision display copies);
    ``to_html()`` stays self-contained. Rendered together in Chromium, every view mounts;
    a later view on a page without the first says what to do."""
    import poskernel_tl.report.html as report_html

    monkeypatch.setattr(report_html, "SHOWN", set())  # a fresh notebook session
    views = [inspect_head(llama, torch.randint(3, 290, (128,), generator=torch.Generator()
                                               .manual_seed(i)), 1, i) for i in range(3)]
    blocks = [v._repr_html_() for v in views]
    assert len(blocks[0]) > 1_000_000 and all(len(b) < 60_000 for b in blocks[1:])
    assert len(views[1].to_html()) > 1_000_000  # standalone: the assets inline
    figure = pk.plots.r2_heatmap(pk.measure(llama, torch.randint(3, 290, (4, 16)),
                                            progress=False))
    assert "plotly" in report_html.SHOWN  # the views carried plotly.js: figures reuse it
    assert len(figure._repr_mimebundle_()["text/html"]) < 100_000
    if find_chromium() is None:
        pytest.skip("headless Chromium not found: apt-get install chromium")
    page = tmp_path / "notebook.html"
    page.write_text("<html><body>" + "".join(blocks) + "</body></html>", encoding="utf-8")
    run = load_page(page)
    assert run.console == [] and run.probe == [], (run.console, run.probe)
    heads = run.dom.find_all("div", class_="pk-head")
    assert len(heads) == 3 and all(h.children for h in heads)
    for h, v in zip(heads, views):
        assert f"{v.r2:.3f}" in h.text()
    alone = tmp_path / "alone.html"
    alone.write_text("<html><body>" + blocks[2] + "</body></html>", encoding="utf-8")
    assert "not loaded on this page" in load_page(alone).dom.text()


# ---------------------------------------------------------------------- the CLI


def parse(argv):
    return build_parser("inspect").parse_args(["inspect", *argv])


def test_cli_checks_arguments_before_loading(monkeypatch, tmp_path):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("poskernel_tl.apps.head_view_cli.load_model", no_load)
    cases = [
        (["--layer", "30", "--head", "0", "--text", "hello"], ValueError, r"layers 0\.\.29"),
        (["--layer", "0", "--head", "9", "--text", "hello"], ValueError, r"heads 0\.\.8"),
        (["--layer", "0", "--head", "0", "--file", str(tmp_path / "no.txt")],
         UserError, "no such file"),
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
    monkeypatch.setattr("poskernel_tl.apps.head_view_cli.load_model", lambda *a, **k: llama)
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


# ----------------------------------------------------------------- the notebook


@pytest.mark.smollm2
@pytest.mark.slow  # a script around pk.inspect_head, whose path on SmolLM2 the tests above take
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


# ------------------------------------------------------------- bidirectional models
def naive_two_sided(A: np.ndarray, skip_key0: bool = False):
    """R², g(Δ > 0), g(Δ < 0) of a fit over every off-diagonal entry, by brute force."""
    T = len(A)
    t, s = np.nonzero(~np.eye(T, dtype=bool))
    if skip_key0:
        keep = s > 0
        t, s = t[keep], s[keep]
    lag, vals = t - s, A[t, s]
    means = {d: vals[lag == d].mean() for d in np.unique(lag)}
    fit = np.array([means[d] for d in lag])
    r2 = 1 - ((vals - fit) ** 2).sum() / ((vals - vals.mean()) ** 2).sum()
    return r2, np.array([means.get(d, np.nan) for d in range(1, T)]), \
        np.array([means.get(-d, np.nan) for d in range(1, T)])


def test_encoder_head_is_fit_on_both_triangles(tiny_tokenizer):
    model = tiny_loaded("bert", tiny_tokenizer)
    view = inspect_head(model, TEXT, 1, 2)
    ids = torch.as_tensor(view.token_ids)
    T = len(ids)
    # the BERT bridge's hook_attn_scores is the pattern: the view forms q·kᵀ itself
    assert view.scores_from.startswith("q·kᵀ")
    scores, pattern = hooked(model, ids, 1, 2)
    np.testing.assert_allclose(scores.numpy(), pattern.numpy(), atol=1e-7)
    q_k = head_tensors(model, ids, 1, 2, hook_scores=False)
    A = q_k["scores"].double().numpy()
    np.testing.assert_allclose(view.logits, A, atol=1e-6)  # the whole matrix, no mask
    r2, g, g_back = naive_two_sided(A)
    assert view.r2 == pytest.approx(r2, abs=1e-10)
    np.testing.assert_allclose(view.g, g, atol=1e-10)
    np.testing.assert_allclose(view.g_back, g_back, atol=1e-10)
    assert view.g_self == pytest.approx(np.diag(A).mean(), abs=1e-10)
    assert view.r2_nosink == pytest.approx(naive_two_sided(A, skip_key0=True)[0], abs=1e-10)
    t, s = np.nonzero(~np.eye(T, dtype=bool))
    fitted = np.where(t > s, view.g[np.abs(t - s) - 1], view.g_back[np.abs(t - s) - 1])
    np.testing.assert_allclose(view.residual[t, s], A[t, s] - fitted, atol=1e-10)
    assert np.isnan(np.diag(view.residual)).all()
    np.testing.assert_array_equal(view.pattern, pattern.numpy())
    omega, power = view.spectrum  # of the two-sided g: twice the causal span
    assert len(omega) > 2 * T and (power >= 0).all()
    payload = view.page_data()
    assert payload.two_sided and payload.g_trackA_back is view.g_back


@pytest.mark.minilm
def test_minilm_text_is_framed_like_its_sequences(minilm):
    view = inspect_head(minilm, "the quick brown fox jumps over the lazy dog", 0, 0,
                        max_tokens=6)
    assert view.tokens[0] == "[CLS]" and view.tokens[-1] == "[SEP]" and len(view.tokens) == 6
    assert view.g_back is not None and view.scores_from.startswith("q·kᵀ")
