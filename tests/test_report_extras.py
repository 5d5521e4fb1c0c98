"""The report's "Further analyses" section and the head views' rows: the kernel-patching,
separable and mean-field CSVs, made by the analyses' own table functions from synthetic
numbers with a few planted values, read back into report.html and the data files."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from synthetic import make_result

from poskernel_tl import constants as C
from poskernel_tl.analyses import kernel_patching as KP
from poskernel_tl.analyses import mean_field as MF
from poskernel_tl.analyses import separable as SEP
from poskernel_tl.analyses.base import AnalysisSpec
from poskernel_tl.analyses.kernel_patching import passes as KPP
from poskernel_tl.analyses.registry import REGISTRY as ANALYSES
from poskernel_tl.models.registry import REGISTRY
from poskernel_tl.report import extras as EX
from poskernel_tl.report.build import build_report

L, H, T, N = 2, 2, 16, 4
OTHER = "llama-3.2-1b"
PLANTED = {"dloss_patched": 0.1234567, "dloss_ablated": 0.4321, "R2_separable": 0.654321,
           "share_cross": -0.0421}
PNG = b"\x89PNG\r\n\x1a\n"


def spec(name: str = "smollm2-135m", layers: int = L, heads: int = H):
    base = REGISTRY[name]
    i = np.arange(0, 8, 2)
    return dataclasses.replace(base, n_layers=layers, n_heads=heads, n_kv_heads=1, d_head=8,
                               inv_freq=tuple(float(base.rope_base) ** (-i / 8)))


def with_logits(r):
    """The result with one saved logit matrix (NaN on and above the diagonal), so its
    head views carry an attention pattern."""
    rng = np.random.default_rng(7)
    A = rng.standard_normal((L, H, T, T)).astype(np.float32)
    A[..., np.triu_indices(T)[0], np.triu_indices(T)[1]] = np.nan
    return r.replace(logits={int(r.seq_id[0]): A})


def patching_csv(rng) -> pd.DataFrame:
    n = 5
    clean = 3.0 + 0.01 * rng.standard_normal(n)
    row = np.repeat(clean[:, None], L, 1)
    losses = {"patched": row[..., None] + rng.uniform(0.0, 0.2, (n, L, H)),
              "patched_sink": row[..., None] + rng.uniform(0.0, 0.1, (n, L, H)),
              "ablated": row[..., None] + rng.uniform(0.1, 0.5, (n, L, H))}
    res = KPP.PatchingResult(clean, row, losses, "pooled", "fit", 0, 1, "result.g_pooled",
                            True, 4, 0.1)
    return KP.patching_table(res, {"R2_pooled": rng.uniform(0, 1, (L, H))}, n_boot=50)


def separable_csv(rng) -> pd.DataFrame:
    per = lambda: rng.uniform(0, 1, (N, L, H))  # noqa: E731
    res = SEP.SeparableResult(np.arange(N), T, *(rng.uniform(0, 1, (L, H)) for _ in range(3)),
                              per(), per(), per())
    return SEP.separable_table(res, "m", "d", T).drop(columns=["model", "dataset", "length"])


def mean_field_csv(rng) -> pd.DataFrame:
    parts = (*MF.PARTS, "raw")
    g = {p: rng.standard_normal((L, H, T - 1)) for p in parts}
    amp, freqs = MF.spectrum(g["meanfield"])
    share = dict(zip(MF.PARTS, (np.full((L, H), 0.5), np.full((L, H), 0.1),
                                np.full((L, H), 0.4))))
    mf = MF.MeanFieldResult({p: rng.uniform(0, 1, (L, H)) for p in parts}, g, share, share,
                            amp, freqs, "result")
    return MF.mean_field_table(mf)


def write_csv(out, r, name: str, table: pd.DataFrame) -> None:
    """As ``run_analysis`` writes it: model, dataset and length first."""
    table = table.copy()
    for col, value in (("length", r.length), ("dataset", r.dataset), ("model", r.model)):
        table.insert(0, col, value)
    path = C.result_path(out, r.model, r.dataset, r.length, f"{name}.csv")
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)


def plant(table: pd.DataFrame, layer: int = 1, head: int = 0) -> pd.DataFrame:
    """The planted values at (layer, head); L0H1's ablation made not significant."""
    at = (table["layer"] == layer) & (table["head"] == head)
    for col, value in PLANTED.items():
        if col in table.columns:
            table.loc[at, col] = value
    if "ablation_matters" in table.columns:
        table.loc[(table["layer"] == 0) & (table["head"] == 1), "ablation_matters"] = False
    return table


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two conditions: prose (with saved logits) has all three CSVs; random (one head of
    another model, so that no tokenizer is loaded and few pages are drawn) has only a
    kernel-patching CSV without its dloss_ablated column."""
    out = tmp_path_factory.mktemp("beyond")
    rng = np.random.default_rng(0)
    prose = with_logits(make_result(spec(), T, dataset="prose", n_seqs=N))
    rand = make_result(spec(OTHER, 1, 1), T, dataset="random", centered=False, n_seqs=N, seed=1)
    for r in (prose, rand):
        r.save(out)
    tables = {"kernel-patching": plant(patching_csv(rng)), "separable": plant(separable_csv(rng)),
              "mean-field": plant(mean_field_csv(rng))}
    for name, table in tables.items():
        write_csv(out, prose, name, table)
    bad = patching_csv(rng).query("layer == 0 and head == 0").drop(columns="dloss_ablated")
    write_csv(out, rand, "kernel-patching", bad)
    page = build_report(out, workers=1)
    return {"out": out, "page": page, "report": page.parent, "prose": prose, "rand": rand,
            "tables": tables}


def read(path) -> str:
    return path.read_text(encoding="utf-8")


def test_report_has_section_figures_and_layer_table(built):
    text = read(built["page"])
    assert f"<h2>{EX.section_title()}</h2>" in text
    section = text[text.index(EX.section_title()):text.index("<h2>Limitations")]
    prose = built["prose"]
    for a in EX.shown():
        png = built["report"] / "figures" / f"further_{prose.stem()}_{a.name}.png"
        assert png.is_file() and png.stat().st_size > 1000
        assert png.read_bytes()[:8] == PNG
        assert png.with_suffix(".pdf").is_file()
        assert f'src="figures/{png.name}"' in section
        assert a.guide.split(":")[0].replace("'", "&#x27;") in section
    # no figure for the malformed table
    assert not list((built["report"] / "figures").glob(f"further_{built['rand'].stem()}_*"))
    # per-layer means: layer 1 of the separable R² mean over both heads
    sep = built["tables"]["separable"]
    mean = sep.loc[sep.layer == 1, "R2_separable"].mean()
    assert f"<td>{mean:.4g}</td>" in section
    assert "<th>L0</th>" in section and "<th>L1</th>" in section
    assert "kernel / ablation*" in section


def tables_of(built, r, at: int) -> dict:
    """Head ``at``'s tables of the further analyses in the condition's data file (the page
    of that head), by analysis name."""
    text = (built["report"] / "data" / f"{r.stem()}.js").read_text(encoding="utf-8")
    page = json.loads(text[text.index(" = {") + 3:-2])["heads"][at]
    by_title = {t["title"]: t for t in page["tables"]}
    return {name: by_title[a.title] for name, a in ANALYSES.items() if a.title in by_title}


def shown(table: dict, label: str) -> list:
    """The row of quantity ``label``: [label, value, interval, note]."""
    return next(row for row in table["rows"] if row[0] == label)


def test_malformed_csv_is_a_note(built):
    text = read(built["page"])
    section = text[text.index(EX.section_title()):text.index("<h2>Limitations")]
    assert "unreadable — missing column dloss_ablated" in section
    rows = tables_of(built, built["rand"], 0)
    assert rows["kernel-patching"]["message"].startswith(f"{EX.UNREADABLE} — ")
    assert "missing column dloss_ablated" in rows["kernel-patching"]["message"]
    assert rows["separable"]["message"].startswith(f"{EX.NOT_RUN} — ")


def test_head_views_carry_each_heads_values(built):
    rows = tables_of(built, built["prose"], 1 * H + 0)  # L1H0
    for name, col in (("kernel-patching", "dloss_patched"), ("kernel-patching", "dloss_ablated"),
                      ("separable", "R2_separable"), ("mean-field", "share_cross")):
        label = dict(ANALYSES[name].head_rows)[col]
        assert float(shown(rows[name], label)[1]) == pytest.approx(PLANTED[col], rel=1e-3), col
    kp = built["tables"]["kernel-patching"].set_index(["layer", "head"]).loc[(1, 0)]
    lo, hi = shown(rows["kernel-patching"], "Δloss, kernel patched (nats)")[2][1:-1].split(", ")
    assert [float(lo), float(hi)] == pytest.approx(
        [kp["dloss_patched_lo"], kp["dloss_patched_hi"]], rel=1e-3)
    shares = [0.5, PLANTED["share_cross"], 0.4]
    assert [float(r[1]) for r in rows["mean-field"]["rows"][1:4]] == pytest.approx(shares)
    assert rows["kernel-patching"]["rows"][0][3] == ""  # no note where ablation matters
    other = tables_of(built, built["prose"], 0 * H + 1)
    assert "the ratio means little" in other["kernel-patching"]["rows"][0][3]


def test_head_views_without_csvs_say_not_run(built):
    rows = tables_of(built, built["rand"], 0)
    for name in ("separable", "mean-field"):
        assert rows[name]["message"] == (f"{EX.NOT_RUN} — poskernel analyze {name} --model "
                                         f"{OTHER} --dataset random --length {T} --out DIR")
        assert "rows" not in rows[name]


def test_report_without_csvs_has_no_section(tmp_path):
    r = make_result(spec(), T, dataset="prose", n_seqs=N)
    r.save(tmp_path)
    text = read(build_report(tmp_path, workers=1))
    assert EX.section_title() not in text
    assert not list((tmp_path / "report" / "figures").glob("further_*"))


def test_read_table_problems(tmp_path):
    a = ANALYSES["separable"]
    path = tmp_path / "x.csv"
    assert EX.read_table(a, path).status == EX.NOT_RUN
    path.write_bytes(b"")
    assert "could not be parsed" in EX.read_table(a, path).problem
    pd.DataFrame({"layer": [0], "head": [0], "R2_toeplitz": ["high"], "R2_separable": [0.1],
                  "R2_toeplitz_separable": [0.2]}).to_csv(path, index=False)
    assert EX.read_table(a, path).problem == "column R2_toeplitz is not numeric"
    pd.DataFrame({"layer": [0, 5], "head": [0, 0], "R2_toeplitz": 0.1, "R2_separable": 0.1,
                  "R2_toeplitz_separable": 0.2}).to_csv(path, index=False)
    assert "does not have" in EX.read_table(a, path, n_layers=2, n_heads=2).problem
    ok = EX.read_table(a, path)
    assert ok.status == EX.OK and len(ok.table) == 2
    rows = {x["name"]: x for x in EX.viewer_tables({"separable": ok}, "m", "d", T, 6, 1)}
    assert [rows[n]["status"] for n in ("kernel-patching", "separable", "mean-field")] == \
        [EX.NOT_RUN, EX.OK, EX.NOT_RUN]
    assert rows["separable"]["values"][1] is None and rows["separable"]["values"][5]
    assert rows["mean-field"]["message"].startswith(
        "poskernel analyze mean-field --model m --dataset d --length 16")
    odd = EX.viewer_tables({}, "m", "<b>x</b>", T, 1, 1)[0]["message"]
    assert "--dataset '<b>x</b>'" in odd  # quoted for the shell; the viewer shows it as text


def test_csv_flag_reads_every_spelling_of_a_boolean():
    from poskernel_tl.io import csv_flag

    col = pd.Series(["True", "false", " YES ", "no", "1", "0.0", "", "maybe", None, 1.0])
    got = csv_flag(col).tolist()
    assert got[:6] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0] and got[9] == 1.0
    assert all(np.isnan(x) for x in got[6:9])


def test_figure_failure_is_a_note(tmp_path):
    """A mean-field table with the shown columns but not the figure's: table, no figure."""
    r = make_result(spec(), T, dataset="prose", n_seqs=N)
    table = mean_field_csv(np.random.default_rng(3)).drop(columns="R2_gram_raw")
    write_csv(tmp_path, r, "mean-field", table)
    drawn = []
    html = EX.report_section(tmp_path, [r], lambda fig, name, alt: drawn.append(name) or "")
    assert not drawn
    assert "Mean field: figure not drawn (KeyError" in html
    assert "R² mean field" in html and "not run — <code>poskernel analyze separable" in html


def test_figures_drawn_in_parallel_equal_those_drawn_in_one_process(tmp_path):
    r = with_logits(make_result(spec(), T, dataset="prose", n_seqs=N))
    r.save(tmp_path)
    files = {}
    for workers in (1, 2):
        page = build_report(tmp_path, tmp_path / f"r{workers}", workers=workers)
        files[workers] = {p.relative_to(page.parent): p.read_bytes()
                          for p in page.parent.rglob("*") if p.is_file()
                          and p.suffix in (".html", ".js", ".png")}
    assert len(files[1]) > 8 and files[1] == files[2]


def test_a_registered_analysis_is_reported_without_report_edits(tmp_path, monkeypatch):
    """A new spec with per-layer means (and a validity column) in the analysis registry:
    the report shows its section, its layer means (the starred one over the valid heads
    only, with their count) and its rows in the head views, with no report code naming
    it."""
    toy = AnalysisSpec(name="toy", title="Toy analysis", guide="Planted per-head numbers.",
                       compute=lambda inputs, options: pd.DataFrame(), needs_model=False,
                       columns=("x",), layer_means=(("x", "mean x"), ("x", "valid x*")),
                       valid=("ok", "not ok here"), head_rows=(("x", "x of the head"),),
                       figure=lambda table, title: SEP.plot_separable(
                           separable_csv(np.random.default_rng(0)), title))
    monkeypatch.setitem(ANALYSES, "toy", toy)
    r = make_result(spec(), T, dataset="prose", n_seqs=N)
    r.save(tmp_path)
    table = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                          "x": [1.0, 3.0, 5.0, 7.0], "ok": [True, False, True, True]})
    write_csv(tmp_path, r, "toy", table)
    text = read(build_report(tmp_path, workers=1))
    assert EX.section_title().endswith(", toy analysis")
    section = text[text.index(EX.section_title()):text.index("<h2>Limitations")]
    assert "valid x*" in section and "<td>1</td>" in section  # layer 0 over its valid head
    assert "<td>2</td>" in section and "<td>1/2</td>" in section  # mean x; ok count
    assert "Toy analysis: over the heads where ok" in section
    built = {"report": tmp_path / "report"}
    rows = [tables_of(built, r, at)["toy"]["rows"] for at in (1, 2)]
    assert rows[0] == [["x of the head", "3", "", "not ok here"]]
    assert rows[1] == [["x of the head", "5", "", ""]]
