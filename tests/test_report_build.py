"""build_report end to end on synthetic conditions: offline and escaped, it only reads
(no fit, no null, each condition loaded once), a damaged condition costs only itself, the
exploratory spectral result is reported beside the deferred verdict, and the words are a
reader's."""

import gc
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_report import synthetic

from poskernel_tl import constants as C
from poskernel_tl.analyses import spectral as S
from poskernel_tl.analyses.spectral import align as SA
from poskernel_tl.analyses.spectral import null as SN
from poskernel_tl.analyses.spectral import processing as SP
from poskernel_tl.analyses.spectral import table as ST
from poskernel_tl.errors import ResultFileError
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.report import build as B
from poskernel_tl.report.build import ReportIncomplete, build_report
from poskernel_tl.report.collect import Decoders, read_condition, slim
from poskernel_tl.report.viewer_data import head_href

SCRIPT = "<script>alert(1)</script>\"quoted\" 'single'"


def visible(html: str) -> str:
    """The page's text as a reader sees it (tags, scripts and styles removed)."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S | re.I)
    return re.sub(r"<[^>]+>", " ", html)


def save_all(out: Path, results, spectral_gate=None) -> None:
    for r in results:
        r.save(out)
    gate = S.grid_gate(results) if spectral_gate is None else spectral_gate
    for r in results:
        S.run_spectral(r, out, gate_met=gate, n_null=50)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("built")
    first = synthetic(dataset=SCRIPT)
    null = np.full((8, *first.r2_pooled.shape), 1e-3)
    results = [first.replace(r2_perm_null=null, r2_perm_same_seqs=first.r2_pooled),
               synthetic(dataset="random", centered=False, seed=1),
               synthetic("gpt2", dataset=SCRIPT, heads=4, level=0.4, seed=3),
               synthetic(dataset="text:/some/deep/folder/of/corpora/wiki_sample.txt", seed=5)]
    save_all(out, results)
    return {"out": out, "page": build_report(out, workers=1), "results": results}


def test_build_report_offline_and_escaped(built):
    page, out = built["page"], built["out"] / "report"
    assert page == out / "report.html"
    text = page.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text
    assert "<script>alert(1)" not in text and "\"quoted\"" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;quoted&quot;" in text
    scripts = re.findall(r"<script\b[^>]*>", text)
    assert scripts == ['<script src="assets/plotly.min.js">',
                       '<script src="assets/circuitsvis.js">', '<script src="assets/viewer.js">',
                       '<script src="assets/longview.js">', '<script src="assets/headmap.js">',
                       '<script type="application/json" id="pk-index">', "<script>",
                       '<script src="data/head_map.js">', "<script>"]
    assert '<script>PK.headMap("pk-map", window.PK_HEAD_MAP, true);</script>' in text
    assert "<script>PK.start();</script>" in text
    for src in re.findall(r'(?:src|href)="([^"#]+)"', text):
        assert (out / src).exists(), src
        if src.endswith(".png"):  # Figures 1–4 also as PDF, the null figures as PNG only
            assert (out / src).with_suffix(".pdf").exists() != ("/nulls_" in src), src
    for name in ("table1", "verdicts", "summary", "nulls_thresholds"):
        assert (out / f"{name}.csv").exists() and (out / f"{name}.md").exists()
    for r in built["results"]:
        assert (out / "data" / f"{r.stem()}.js").is_file()
    assert {p.name for p in (out / "assets").iterdir()} == {
        "plotly.min.js", "circuitsvis.js", "viewer.js", "longview.js", "headmap.js", "viewer.css"}
    assert (out / "data" / "head_map.js").is_file() and (out / "head_map.csv").is_file()
    v = pd.read_csv(out / "verdicts.csv").set_index("id")
    assert v.loc["nope", "reason"] == "no NoPE model in this folder"
    assert "<script>" not in (out / "table1.md").read_text(encoding="utf-8")
    assert "36/36 heads above the largest of their 8 permuted R²" in text
    for question in ("(a)", "(b)", "(c)", "(d)", "(e)", "(f)"):
        assert question in text
    for phrase in ("Tokenizer confound", "dequantized", "NoPE + LayerNorm", "sink"):
        assert phrase in text
    assert len(list((out / "nulls").glob("*_perm_null.csv"))) == 1


def test_words_a_reader_understands(built):
    text = visible(built["page"].read_text(encoding="utf-8"))
    assert not re.search(r"seed", text, flags=re.I), re.findall(r".{40}seed.{40}", text, re.I)
    assert "the pre-registered protocol (Experiment 1" in text
    assert "What this report tests" in text and "Beyond" not in text
    # a text:PATH dataset is titled by its file name, not its path
    assert "text: wiki_sample.txt" in text and "/some/deep/folder" not in text
    for md in ("table1.md", "verdicts.md", "summary.md"):
        body = (built["out"] / "report" / md).read_text(encoding="utf-8")
        assert not re.search(r"seed", body, flags=re.I), md


def test_report_only_reads(tmp_path, monkeypatch):
    """No fit, no null, no spectral analysis: the report runs with those functions broken,
    loads each condition exactly once, and what it shows is what the analyses saved."""
    results = [synthetic(seed=0), synthetic(dataset="random", centered=False, seed=1)]
    save_all(tmp_path, results)

    def forbidden(*a, **k):
        raise AssertionError("the report must not compute this")

    for module, names in ((S, ("run_spectral",)),
                          (SA, ("spectral_alignment", "align_spectrum")),
                          (ST, ("spectral_table",)), (SP, ("spectrum",)),
                          (SN, ("rotation_null", "peak_significance"))):
        for name in names:
            monkeypatch.setattr(module, name, forbidden)
    loads = []
    real = ConditionResult.load.__func__

    def counted(cls, *args, **kw):
        loads.append(args[1:])
        return real(cls, *args, **kw)

    monkeypatch.setattr(ConditionResult, "load", classmethod(counted))
    page = build_report(tmp_path, workers=1)
    assert sorted(loads) == sorted((r.model, r.dataset, r.length) for r in results)
    table = pd.read_csv(C.result_path(tmp_path, results[0].model, "prose", 32, C.SPECTRAL_CSV))
    summary = pd.read_csv(page.parent / "summary.csv").set_index("dataset")
    early = table[table["layer"] < 2]
    assert summary.loc["prose", "specB_aligned_early"] == pytest.approx(early["aligned"].mean())
    assert summary.loc["prose", "specB_fpr_early"] == pytest.approx(early["fpr"].mean())


def test_missing_spectral_analysis_is_not_run_with_its_command(tmp_path):
    r = synthetic(seed=2)
    r.save(tmp_path)
    text = build_report(tmp_path, workers=1).read_text(encoding="utf-8")
    assert "spectral analysis was not run" in text and "poskernel spectral DIR" in text
    t1 = pd.read_csv(tmp_path / "report" / "table1.csv")
    assert t1["spectral_alignment"].tolist() == ["not run"]


def test_a_damaged_condition_costs_only_itself(tmp_path):
    good, bad = synthetic(seed=0), synthetic(dataset="random", centered=False, seed=1)
    save_all(tmp_path, [good, bad])
    broken = C.result_path(tmp_path, bad.model, "random", 32, C.TRACK_A_CSV)
    broken.write_text("layer,head\n0,0\n", encoding="utf-8")
    with pytest.raises(ReportIncomplete) as info:
        build_report(tmp_path, workers=1)
    err = info.value
    assert [d.file for d in err.damaged] == [broken.name]
    assert err.damaged[0].condition == bad.stem() and err.damaged[0].reason
    assert isinstance(err, ValueError) and str(err.page) in str(err)
    text = err.page.read_text(encoding="utf-8")
    top = text[: text.index("What this report tests")]
    assert "1 condition could not be read" in top and broken.name in top
    # a run's folder (no grid manifest): the run to redo, on the folder's real path
    real = str(tmp_path.resolve())
    assert f"Rerun <code>poskernel run</code> for it with <code>--out {real} --overwrite" \
        in top and f"poskernel report {real}" in top and "--out DIR" not in top
    (tmp_path / C.MANIFEST).write_text("{}", encoding="utf-8")  # a grid's folder
    with pytest.raises(ReportIncomplete) as grid:
        build_report(tmp_path, workers=1)
    assert f"Rerun the grid that made this folder (<code>poskernel grid … --out {real}" \
        in grid.value.page.read_text(encoding="utf-8")
    (tmp_path / C.MANIFEST).unlink()
    assert (err.page.parent / "data" / f"{good.stem()}.js").is_file()
    assert not (err.page.parent / "data" / f"{bad.stem()}.js").exists()
    # an unreadable cfg.json is named too, and hides nothing else
    C.result_path(tmp_path, bad.model, "random", 32, C.CFG).write_text("{", encoding="utf-8")
    with pytest.raises(ReportIncomplete) as info:
        build_report(tmp_path, workers=1)
    assert [d.file for d in info.value.damaged] == [f"{bad.stem()}_cfg.json"]
    with pytest.raises(FileNotFoundError):
        build_report(tmp_path / "empty", workers=1)


@pytest.mark.parametrize("command", [["report"], ["spectral"], ["spectral", "--length", "64"]])
@pytest.mark.parametrize("folder", ["empty", "missing"])
def test_a_folder_without_conditions_is_a_user_error(command, folder, tmp_path, capsys):
    """Every command that reads a folder of results, given an empty or a missing one: one
    line naming the folder and exit status 2, never a traceback."""
    from poskernel_tl.apps.cli import main

    (tmp_path / "empty").mkdir()
    assert main([*command, str(tmp_path / folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / folder) in err, err
    assert ("is not a folder" if folder == "missing" else "no complete condition") in err
    assert not (tmp_path / "missing").exists()


def test_exploratory_result_beside_the_deferred_verdict(tmp_path):
    """The gate fails: the verdict stays deferred as pre-registered, and the results add
    the ungated share of aligned early-layer heads for both g sources with the test's
    false-positive rate."""
    results = [synthetic(level=0.5, seed=0)]
    save_all(tmp_path, results, spectral_gate=False)
    page = build_report(tmp_path, workers=1)
    text = visible(page.read_text(encoding="utf-8"))
    v = pd.read_csv(page.parent / "verdicts.csv").set_index("id")
    assert v.loc["spectral", "verdict"] == "not computable"
    assert "deferred, as pre-registered" in v.loc["spectral", "reason"]
    sentence = re.search(r"Exploratory, ungated:[^.]*\.[^.]*\.", text)
    assert sentence, text[text.index("(f)"):][:600]
    tables = {s: pd.read_csv(C.result_path(tmp_path, results[0].model, "prose", 32, f))
              for s, f in (("B", C.SPECTRAL_CSV), ("A", "spectral_trackA.csv"))}
    for name, t in tables.items():
        early = t[t["layer"] < 2]
        k, n = int(early["aligned"].sum()), len(early)
        assert f"{k} of {n} ({100 * k / n:.0f}%)" in sentence.group(0), name
        assert f"{100 * early['fpr'].mean():.1f}%" in sentence.group(0), name


def test_permalinks():
    assert head_href("smollm2-135m", "prose", 256, 1, 2) == \
        "report.html#smollm2-135m/prose_256/L1H2"
    assert head_href("m", "text:/a b/c.txt", 32, 0, 0).startswith("report.html#m/text-c-")


def test_a_lazy_load_leaves_mapped_arrays_unread(tmp_path):
    """Loaded lazily (as the report does), a mapped array's values are not scanned (the
    centering means are 4·L·H·T·d floats that no report page shows): NaN means load, and
    a view of one table column does not keep the table's other columns alive. An eager
    load still checks them."""
    r = synthetic(seed=0)
    save_all(tmp_path, [r.replace(mean_q=np.full_like(r.mean_q, np.nan))])
    key = (r.model, r.dataset, r.length)
    lazy = ConditionResult.load(tmp_path, *key, lazy=True)
    assert np.isnan(lazy.mean_q).all()
    assert lazy.r2_pooled.base is None and lazy.r2_per_seq.base is None
    with pytest.raises(ResultFileError, match="mean_q holds NaN"):
        ConditionResult.load(tmp_path, *key)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(),
                    reason="reads the process's memory map (Linux)")
def test_the_report_maps_matrices_and_lets_them_go(tmp_path):
    """The report reads logits and Gram matrices lazily: loaded for it, their files are
    mapped (pages read when touched), the arrays equal an eager load, and once the
    condition is slimmed after its data file is written nothing stays mapped but the one
    head's copy it keeps."""
    r = synthetic(seed=0)
    lower = np.tril(np.ones((r.length, r.length), bool), -1)
    r = r.replace(logits={3: np.where(lower, r.gram_centered, np.nan).astype(np.float32)})
    save_all(tmp_path, [r])
    key = (r.model, r.dataset, r.length)
    files = [str(C.result_path(tmp_path, *key, name))
             for name in (f"{C.VIS_DIR}/seq_3.pt", "gram_centered.pt")]
    mapped = lambda: [f for f in files if f in Path("/proc/self/maps").read_text()]
    lazy = ConditionResult.load(tmp_path, *key, lazy=True)
    assert mapped() == files
    eager = ConditionResult.load(tmp_path, *key)
    np.testing.assert_array_equal(lazy.logits[3], eager.logits[3])
    np.testing.assert_array_equal(lazy.gram_centered, eager.gram_centered)
    g_file = str(C.result_path(tmp_path, *key, C.G_ARRAYS))
    assert g_file in Path("/proc/self/maps").read_text()  # npz members are mapped too
    np.testing.assert_array_equal(lazy.g_per_seq, eager.g_per_seq)
    np.testing.assert_array_equal(lazy.g_pooled, eager.g_pooled)
    del lazy
    gc.collect()
    assert mapped() == []
    cond = read_condition(tmp_path, key, Decoders())
    assert mapped() == files
    cond = slim(cond, (1, 2))
    gc.collect()
    assert mapped() == []
    np.testing.assert_array_equal(cond.kept["gram_centered"], eager.gram_centered[1, 2])
    np.testing.assert_array_equal(cond.kept["g_pooled"], eager.g_pooled[1, 2])
    assert cond.result.g_pooled.strides == (0, 0, 0) and not cond.result.g_pooled.any()


def test_freed_memory_is_handed_back_after_each_condition(tmp_path, monkeypatch):
    """After each condition's data file the report returns the heap pages its transients
    freed (glibc keeps them otherwise, and the peak would hold every earlier condition's)."""
    B.release_freed_memory()  # the real call: glibc's malloc_trim, or nothing elsewhere
    results = [synthetic(seed=0), synthetic(dataset="random", centered=False, seed=1)]
    save_all(tmp_path, results)
    written, calls = [], []
    write = B.write_data
    monkeypatch.setattr(B, "write_data", lambda out, item, long=None: written.append(item) or
                        write(out, item, long))
    monkeypatch.setattr(B, "release_freed_memory", lambda: calls.append(len(written)))
    build_report(tmp_path, workers=1)
    assert calls == [1, 2]


def test_mapped_npz_equals_numpy_load(tmp_path):
    """Every member as np.load reads it: stored members mapped (C and Fortran order, any
    dtype), compressed or empty ones read whole."""
    from poskernel_tl.schema import mapped_npz

    arrays = {"c": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
              "f": np.asfortranarray(np.random.default_rng(0).random((5, 7))),
              "i": np.arange(3, dtype=np.int64), "empty": np.zeros((0, 4)),
              "scalar": np.float64(2.5)}
    for name, save in (("stored.npz", np.savez), ("packed.npz", np.savez_compressed)):
        save(tmp_path / name, **arrays)
        got = mapped_npz(tmp_path / name)
        assert sorted(got) == sorted(arrays)
        for k, v in arrays.items():
            np.testing.assert_array_equal(got[k], v)
            assert got[k].dtype == np.asarray(v).dtype
        assert isinstance(got["c"], np.memmap) == (name == "stored.npz")


def test_table_cells_in_markdown_and_html():
    """Both table writers read a cell alike: floats by the format, '–' for NaN, ±inf, None
    and NA; Markdown escapes '|', a tag-opening '<' and newlines, HTML escapes all."""
    from poskernel_tl.report.sections import table_html
    from poskernel_tl.report.tables import markdown_table

    df = pd.DataFrame({"a|b": [0.123456, np.nan, np.inf], "s": ["x|y\n<b>", None, pd.NA],
                       "n": [3, 4, 5]}, dtype=object)
    md = markdown_table(df).splitlines()
    assert md[0] == "| a\\|b | s | n |"
    assert md[2] == "| 0.1235 | x\\|y &lt;b> | 3 |"
    assert md[3] == "| – | – | 4 |" and md[4] == "| – | – | 5 |"
    html = table_html(df)
    assert "<th>a|b</th>" in html and "<td>0.1235</td>" in html
    assert "<td>x|y\n&lt;b&gt;</td>" in html and html.count("<td>–</td>") == 4


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_released_pages_keep_their_contents_and_leave_the_rss(tmp_path):
    """release_pages is a hint that keeps every value (a mapped file's array, an ordinary
    array); a mapped file's pages read once leave the process's RSS (Linux ≥ 5.4)."""
    import re

    from poskernel_tl.plan.allocator import release_pages

    def rss() -> int:
        return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read())[1]) * 1024

    values = np.random.default_rng(0).standard_normal((64 << 20) // 8)  # 64 MiB
    path = tmp_path / "a.npy"
    np.save(path, values)
    mapped = np.load(path, mmap_mode="r")
    before = rss()
    total = float(mapped.sum())  # every page read
    read = rss()
    release_pages(mapped)
    after = rss()
    assert np.array_equal(mapped, values) and float(mapped.sum()) == total
    plain = values.copy()
    release_pages(plain)
    assert np.array_equal(plain, values)
    assert read - before > values.nbytes // 2  # the mapped pages count in the RSS once read
    assert after < read - values.nbytes // 2, (before, read, after)  # and leave it


def test_verdicts_of_a_run_off_the_protocol_are_marked_exploratory(tmp_path):
    """A report of conditions unlike seed 004's design (a handful of sequences, T = 32, an
    uncentered text condition) shows its verdicts under a banner naming each difference,
    and every verdict cell says so; a condition of the design's own shape differs in
    nothing."""
    results = [synthetic(seed=0), synthetic(dataset="random", centered=False, seed=1)]
    save_all(tmp_path, results)
    page = build_report(tmp_path, workers=1).read_text(encoding="utf-8")
    verdicts = page[page.index("Pre-registration verdicts"):]
    n = sorted({len(r.seq_id) + r.n_centering for r in results})
    assert "Exploratory: these conditions are not the protocol&#x27;s design" in verdicts \
        or "Exploratory: these conditions are not the protocol's design" in verdicts
    assert "T = 32 (the protocol: 256 and 1024)" in verdicts
    assert f"n = {n[0]} sequences (the protocol: 200)" in verdicts
    note = f"(exploratory: n = {n[0] if len(n) == 1 else f'{n[0]}–{n[-1]}'}, T = 32)"
    cells = re.findall(r'<td class="pk-v-[a-z]+">([^<]*)</td>', verdicts)
    assert cells and all(c.endswith(note) for c in cells), cells[:3]
    from poskernel_tl.protocol import design_differences
    assert design_differences(200, 1024, True, True) == []
    assert design_differences(200, 256, False, False) == []
    assert design_differences(200, 256, False, True) == [
        "no centering set (Track B uncentered; the protocol centers text)"]
