"""A real single-node Slurm cluster for the tests (``scripts/slurm_test_cluster.sh``), and
a model loader the jobs can be held in (imported by reference inside the jobs, with this
folder on PYTHONPATH)."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_test_cluster.sh"
HOLD = "POSKERNEL_TEST_HOLD"  # env: "DIR:MODEL": that model's job waits in its loader
HOLD_S = 10  # long enough to scancel it, short enough to finish in KillWait if it ignored it


class Cluster:
    """Start (or skip the test, with the reason), use through ``SLURM_CONF``, stop."""

    def __init__(self, folder: Path, mode: str):
        self.folder, self.mode = Path(folder), mode
        self.conf = self.folder / "slurm.conf"
        self._saved = os.environ.get("SLURM_CONF")

    def start(self) -> "Cluster":
        if os.geteuid() != 0:
            pytest.skip("a Slurm test cluster needs root (its daemons run as root)")
        if shutil.which("slurmctld") is None:
            pytest.skip("Slurm is not installed (apt-get install slurm-wlm munge slurmdbd "
                        "mariadb-server)")
        run = subprocess.run(["bash", str(SCRIPT), "start", str(self.folder), self.mode],
                             capture_output=True, text=True, timeout=120)
        if run.returncode == 3:
            pytest.skip(run.stderr.strip())
        assert run.returncode == 0, run.stdout + run.stderr
        os.environ["SLURM_CONF"] = str(self.conf)
        return self

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop", str(self.folder)], capture_output=True,
                       timeout=120)
        if self._saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._saved

    def jobs(self) -> set[str]:
        """Every job the controller knows (pending, running or recently ended)."""
        return set(subprocess.run(["squeue", "-h", "--states=all", "-o", "%i"],
                                  capture_output=True, text=True).stdout.split())


def hold_then_load(name: str):
    """The grid's tiny-model loader; the model named in ``$POSKERNEL_TEST_HOLD`` first
    writes its process id to ``DIR/<model>.pid`` and waits :data:`HOLD_S` seconds."""
    from tiny_models import load_for_grid

    folder, _, model = os.environ.get(HOLD, "").partition(":")
    if model == name:
        (Path(folder) / f"{name}.pid").write_text(str(os.getpid()))
        time.sleep(HOLD_S)
    return load_for_grid(name)


def wait_for(path: Path, submitter, errors: list, timeout_s: float = 90) -> None:
    """Until ``path`` exists, while the ``submitter`` thread runs."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert submitter.is_alive(), f"the submitter ended before {path} appeared: {errors}"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout_s} s"
        time.sleep(0.2)


def wait_gone(pid: int, timeout_s: float = 60) -> None:
    """Until process ``pid`` has ended (its job's processes are gone)."""
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout_s} s"
        time.sleep(0.2)
