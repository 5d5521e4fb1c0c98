"""The grid: planning, sharding, resumability (kill -9 and rerun), locking, merging."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tiny_models import tiny_loaded

from poskernel_tl import constants as C
from poskernel_tl.apps.cli import main
from poskernel_tl.errors import FolderBusyError, UserError
from poskernel_tl.folder import FolderLock
from poskernel_tl.models.loading import LOAD_FIELDS
from poskernel_tl.plan.config import GridConfig
from poskernel_tl.run import grid
from poskernel_tl.run.manifest import Manifest

TESTS = Path(__file__).parent
CONDS = [grid.GridCell("tiny-llama", "random", 32, 6),
         grid.GridCell("tiny-llama", "random", 48, 6),
         grid.GridCell("tiny-llama", "random", 64, 6)]


def _run(out, conds=CONDS, tokenizer=None, **kw):
    model = tiny_loaded("llama", tokenizer)
    opts = GridConfig(out=str(out), batch_size=2, progress=False, **kw)
    return grid.run_grid(conds, opts, load=lambda name: model)


def _csvs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / C.RESULTS_DIR).glob("*.csv"))}


@pytest.mark.parametrize("n", range(1, 8))
def test_shards_cover_every_condition_once(n):
    full = grid.plan("seed")
    parts = [c for i in range(n) for c in grid.plan("seed", shard=f"{i}/{n}")]
    assert sorted(parts, key=str) == sorted(full, key=str) and len(parts) == len(full) == 36


@pytest.mark.parametrize("bad", ["3/2", "0/0", "x", "1/-2"])
def test_bad_shards_are_refused(bad):
    with pytest.raises(ValueError, match="--shard"):
        grid.parse_shard(bad)


def test_unknown_preset_and_model_name_the_valid_ones():
    with pytest.raises(ValueError, match="demo"):
        grid.plan("nope")
    with pytest.raises(ValueError, match="smollm2-135m"):
        grid.plan("demo", models=["gpt5"])


def test_seed_preset_offline_fails_fast_with_its_table(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-cache")
    t0 = time.time()
    assert main(["grid", "--preset", "seed"]) == 2
    out, err = capsys.readouterr()
    assert time.time() - t0 < 30
    assert "gpt2_wikipedia_256" in out and "MISSING" in out
    assert "wikipedia streams from the hub" in err and "hf download openai-community/gpt2" in err


def test_rerun_skips_complete_and_refuses_a_different_configuration(tiny_tokenizer, tmp_path):
    first = _run(tmp_path, tokenizer=tiny_tokenizer)
    assert list(first["status"]) == ["done"] * 3
    csvs = _csvs(tmp_path)
    again = _run(tmp_path, tokenizer=tiny_tokenizer)
    assert list(again["status"]) == ["skipped (complete)"] * 3
    assert _csvs(tmp_path) == csvs
    # a damaged output is redone; the rest stays skipped
    victim = tmp_path / C.RESULTS_DIR / f"{CONDS[1].name}_trackB.csv"
    victim.write_text("garbage")
    third = _run(tmp_path, tokenizer=tiny_tokenizer)
    assert list(third["status"]) == ["skipped (complete)", "done", "skipped (complete)"]
    assert _csvs(tmp_path) == csvs
    # another seed changes every condition's key: refused unless forced
    with pytest.raises(ValueError, match="different configuration.*--force"):
        _run(tmp_path, tokenizer=tiny_tokenizer, seed=1, conds=CONDS[:1])
    forced = _run(tmp_path, tokenizer=tiny_tokenizer, seed=1, conds=CONDS[:1], force=True)
    assert list(forced["status"]) == ["done"]
    assert _csvs(tmp_path)[f"{CONDS[1].name}_trackA.csv"] == csvs[f"{CONDS[1].name}_trackA.csv"]


def test_a_source_too_small_for_a_condition_is_skipped_with_its_reason(tiny_tokenizer,
                                                                      tmp_path):
    doc = tmp_path / "small.txt"
    doc.write_text("the cat sat on the mat " * 40)
    small = [grid.GridCell("tiny-llama", f"text:{doc}", 32, 6),
             grid.GridCell("tiny-llama", f"text:{doc}", 64, 200)]
    table = _run(tmp_path / "out", conds=small, tokenizer=tiny_tokenizer)
    assert table["status"][0] == "done"
    assert table["status"][1].startswith("skipped: dataset") and "200 requested" in \
        table["status"][1]


def test_identical_runs_give_identical_bytes(tiny_tokenizer, tmp_path):
    _run(tmp_path / "a", tokenizer=tiny_tokenizer, conds=CONDS[:1])
    _run(tmp_path / "b", tokenizer=tiny_tokenizer, conds=CONDS[:1])
    for p in sorted((tmp_path / "a").rglob("*")):
        # cfg.json records the folder and the seconds taken: the one file allowed to differ
        if p.is_file() and p.name not in (grid.LOG, "manifest.json", grid.SUMMARY_CSV) \
                and not p.name.endswith(C.CFG):
            twin = tmp_path / "b" / p.relative_to(tmp_path / "a")
            assert twin.read_bytes() == p.read_bytes(), p.name
    ma, mb = Manifest(tmp_path / "a"), Manifest(tmp_path / "b")
    strip = lambda m: {k: {f: d for f, d in v["outputs"].items() if not f.endswith(C.CFG)}
                       for k, v in m.entries.items()}
    assert strip(ma) == strip(mb)


def test_a_second_process_on_the_same_folder_is_refused(tmp_path):
    with FolderLock(tmp_path):
        busy = f"another poskernel process .*PID {os.getpid()}:"
        with pytest.raises(FolderBusyError, match=busy):
            with FolderLock(tmp_path):
                pass


SCRIPT = textwrap.dedent("""
    import sys, os
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, {tests!r})
    from conftest import make_tiny_tokenizer
    from tiny_models import tiny_loaded
    from poskernel_tl.run import grid
    from poskernel_tl.plan.config import GridConfig
    conds = [grid.GridCell("tiny-llama", "random", t, 20) for t in (48, 64, 96)]
    model = tiny_loaded("llama", make_tiny_tokenizer(sys.argv[2]))
    grid.run_grid(conds, GridConfig(out=sys.argv[1], batch_size=1, progress=False),
                  load=lambda name: model)
""")


@pytest.mark.slow  # a job killed and rerun to the same bytes: test_slurm.py's scancel test
def test_kill_and_resume_gives_the_same_bytes(tmp_path):
    script = tmp_path / "grid_job.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    cmd = lambda out: [sys.executable, str(script), str(out), str(tmp_path / "tok")]
    subprocess.run(cmd(ref), check=True, env=env, timeout=600)
    proc = subprocess.Popen(cmd(killed), env=env)
    deadline = time.time() + 300
    first = killed / C.RESULTS_DIR / "tiny-llama_random_48_cfg.json"
    while not first.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.2)  # now inside the second condition
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run(cmd(killed), check=True, env=env, timeout=600)
    # 3 conditions × (Track A, Track B, bands, heads)
    assert _csvs(killed) == _csvs(ref) and len(_csvs(ref)) == 12
    leftovers = [p for p in killed.rglob(".tmp-*")]
    assert not leftovers, leftovers


def test_merge_combines_shards(tiny_tokenizer, tmp_path):
    _run(tmp_path / "s0", tokenizer=tiny_tokenizer, conds=CONDS[:2])
    _run(tmp_path / "s1", tokenizer=tiny_tokenizer, conds=CONDS[2:])
    assert grid.merge([tmp_path / "s0", tmp_path / "s1"], tmp_path / "all") == 3
    merged = Manifest(tmp_path / "all")
    assert all(merged.status(n, e["key"]) == "complete" for n, e in merged.entries.items())
    from poskernel_tl.measurement.result import ConditionResult

    assert len(ConditionResult.conditions(tmp_path / "all")) == 3


def test_analyses_run_per_condition_and_resume(tmp_path, tiny_tokenizer):
    """--analyses: each named analysis writes its table for every measured condition, is
    recorded in the manifest, and a rerun leaves the finished tables untouched."""
    conds = CONDS[:2]
    _run(tmp_path, conds, tiny_tokenizer, analyses=("spectral", "separable"))
    tables = {c.name: [C.result_path(tmp_path, c.model, c.dataset, c.length, suffix)
                       for suffix in ("spectral.csv", "spectral_peaks.csv", "separable.csv")]
              for c in conds}
    for paths in tables.values():
        assert all(p.exists() for p in paths), paths
    manifest = Manifest(tmp_path)
    assert {f"{c.name}:{a}" for c in conds for a in ("spectral", "separable")} \
        <= set(manifest.entries)
    before = {p: p.stat().st_mtime_ns for paths in tables.values() for p in paths}
    _run(tmp_path, conds, tiny_tokenizer, analyses=("spectral", "separable"))
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_unknown_analysis_fails_before_any_condition(tmp_path, tiny_tokenizer):
    with pytest.raises(UserError, match="separable"):
        _run(tmp_path, CONDS[:1], tiny_tokenizer, analyses=("nosuch",))
    assert not (tmp_path / C.RESULTS_DIR).exists()


def test_the_grid_loads_models_with_every_model_option(tmp_path, monkeypatch):
    """What `poskernel grid` accepts for loading (device, dtype, attention, compatibility
    mode, progress, the self-check) reaches load_model: each field of the configuration has
    a consumer."""
    seen = []

    def fake_load(config):
        seen.append(config)
        raise UserError("stop here")

    monkeypatch.setattr(grid, "load_model", fake_load)
    cfg = GridConfig(out=str(tmp_path), compatibility_mode=True, attention="eager",
                     dtype="float32", device="cpu", progress=False, self_check=False)
    with pytest.raises(UserError, match="stop here"):
        grid.run_grid(CONDS[:1], cfg)
    assert [c.model for c in seen] == [CONDS[0].model]
    assert {f: getattr(seen[0], f) for f in LOAD_FIELDS} == {
        "device": "cpu", "dtype": "float32", "progress": False, "attention": "eager",
        "compatibility_mode": True, "self_check": False}
