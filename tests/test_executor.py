"""``--executor``: the grid as submitit jobs, run here by submitit's local cluster."""

import os
from pathlib import Path

import pytest
from tiny_models import load_for_grid

from poskernel_tl import constants as C
from poskernel_tl.apps.cli import main
from poskernel_tl.plan.config import GridConfig
from poskernel_tl.run import executor, grid
from poskernel_tl.run.manifest import Manifest
from poskernel_tl.run.slurm import Request

TESTS = Path(__file__).parent
CONDS = [grid.GridCell("tiny-llama", "random", 32, 6),
         grid.GridCell("tiny-olmo", "random", 32, 6)]


def _csvs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / C.RESULTS_DIR).glob("*.csv"))}


@pytest.fixture
def jobs_can_import_tests(monkeypatch):
    # the jobs unpickle tiny_models.load_for_grid by reference
    monkeypatch.setenv("PYTHONPATH", str(TESTS))


def test_local_executor_runs_two_conditions_as_jobs_and_merges_them(tmp_path,
                                                                    jobs_can_import_tests):
    opts = GridConfig(out=str(tmp_path / "sub"), batch_size=2, progress=False)
    table = executor.submit_grid(CONDS, opts, cluster="local", load=load_for_grid,
                                 poll_s=0.5)
    assert sorted(table["condition"]) == sorted(c.name for c in CONDS)
    assert (table["status"] == "done").all()
    merged = Manifest(tmp_path / "sub")
    assert set(merged.entries) == {c.name for c in CONDS}
    assert all(merged.status(n, e["key"]) == "complete" for n, e in merged.entries.items())
    assert (tmp_path / "sub" / grid.SUMMARY_CSV).exists()
    for c in CONDS:  # each model ran in its own job folder, with its own log
        assert (tmp_path / "sub" / executor.JOBS_DIR / c.model / grid.LOG).exists()
    # the same bytes as the grid run in this process
    here = GridConfig(out=str(tmp_path / "here"), batch_size=2, progress=False)
    grid.run_grid(CONDS, here, load=load_for_grid)
    assert _csvs(tmp_path / "sub") == _csvs(tmp_path / "here") != {}
    # a resubmission resumes: every condition is already complete in its job folder
    again = executor.submit_grid(CONDS, opts, cluster="local", load=load_for_grid,
                                 poll_s=0.5)
    assert (again["status"] == "skipped (complete)").all()


def _failing_load(name):
    raise RuntimeError(f"no weights for {name} on this node")


def test_a_failed_job_is_reported_with_its_log(tmp_path, jobs_can_import_tests):
    opts = GridConfig(out=str(tmp_path), batch_size=2, progress=False)
    with pytest.raises(executor.GridJobError, match="tiny-llama.*no weights.*log: "):
        executor.submit_grid(CONDS[:1], opts, cluster="local", load=_failing_load,
                             poll_s=0.5)


def test_conditions_are_grouped_one_job_per_model():
    conds = grid.plan("seed")
    groups = executor.by_model(conds)
    assert list(groups) == list(grid.SEED_MODELS)
    assert all(len(g) == 6 for g in groups.values())  # 3 datasets x 2 lengths each


def test_unknown_executor_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="--executor"):
        executor.make_executor("kubernetes", tmp_path, REQUEST)
    with pytest.raises(SystemExit):
        main(["grid", "--executor", "kubernetes"])
    assert "invalid choice" in capsys.readouterr().err


REQUEST = Request(partition="gpu", gpus=1, cpus=4, mem_mb=16384, time_min=90)


def test_a_request_maps_to_sbatch_options(tmp_path, monkeypatch):
    params = REQUEST.sbatch_parameters()
    assert (params["partition"], params["gpus_per_node"], params["time"]) == ("gpu", 1, 90)
    assert (params["cpus_per_task"], params["mem"], params["ntasks_per_node"]) == \
        (4, "16384M", 1)
    cpu = Request(partition=None, gpus=0, cpus=2, mem_mb=1000, time_min=30)
    assert "gpus_per_node" not in cpu.sbatch_parameters()  # no GRES asked of a CPU node
    assert "partition" not in cpu.sbatch_parameters()
    lines = executor.sbatch_lines(REQUEST, tmp_path)
    assert {"#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=4", "#SBATCH --mem=16384M",
            "#SBATCH --time=90", "#SBATCH --partition=gpu"} <= set(lines)
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun here
    with pytest.raises(ValueError, match="no Slurm on this machine"):
        executor.make_executor("slurm", tmp_path, REQUEST)


def test_slurm_executor_accepts_the_parameters(tmp_path, monkeypatch):
    for name in ("srun", "sbatch"):  # submitit only checks that srun exists before submitting
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    ex = executor.make_executor("slurm", tmp_path / "f", REQUEST)
    params = ex.parameters
    assert (params["partition"], params["gpus_per_node"], params["time"]) == ("gpu", 1, 90)
    assert (params["cpus_per_task"], params["mem"]) == (4, "16384M")
