"""The output folder as a user meets it: one writer at a time (a second process refused
naming the holder), a folder that cannot be written refused before the model loads, and a
disk that fills during the run answered as the user's problem in one line (exit 2), not as
a bug — on real read-only and full file systems (tmpfs mounts, where the test may mount)."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_models import tiny_hf_model

import poskernel_tl as pk
import poskernel_tl.models.loading as loading
from poskernel_tl import constants as C
from poskernel_tl import folder
from poskernel_tl.apps.cli import main
from poskernel_tl.errors import ResultFileError
from poskernel_tl.folder import LOCK, FolderLock, file_digest
from poskernel_tl.run import runner


@pytest.fixture
def tiny_folder(tmp_path, tiny_tokenizer) -> Path:
    folder = tmp_path / "tiny"
    tiny_hf_model("llama").save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


def run_argv(model: str, out: Path, n: int = 8, T: int = 32) -> list[str]:
    return ["run", "--model", model, "--dataset", "random", "--length", str(T), "--n-seqs",
            str(n), "--out", str(out), "--quiet"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def mount(tmp_path):
    """Mount a tmpfs with the given options at a new folder (skipped where the test may
    not mount); unmounted after the test."""
    points = []

    def make(options: str) -> Path:
        point = tmp_path / f"mnt{len(points)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        points.append(point)
        return point

    yield make
    for point in points:
        subprocess.run(["umount", str(point)], check=False)


def no_model_load(monkeypatch):
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))


@pytest.mark.parametrize("command", ["run", "report", "spectral"])
def test_a_second_writer_is_refused_naming_the_first(command, tmp_path, capsys, monkeypatch):
    """While another process holds the folder, run/report/spectral refuse in one line
    naming its PID and command, exit 2, before any model loads."""
    out = tmp_path / "out"
    out.mkdir()
    no_model_load(monkeypatch)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from poskernel_tl.folder import FolderLock\n"
        f"sys.argv = ['poskernel', 'grid', '--out', {str(out)!r}]\n"
        f"with FolderLock({str(out)!r}):\n"
        "    print('held', flush=True); time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = {"run": run_argv("smollm2-135m", out), "report": ["report", str(out)],
                "spectral": ["spectral", str(out)]}[command]
        assert main(argv) == 2
        err = one_line(capsys)
        assert f"PID {holder.pid}: poskernel grid --out {out}" in err and str(out) in err
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    """The lock is the operating system's: a holder killed with SIGKILL leaves its lock
    file behind, and the next writer simply takes it (and records itself)."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from poskernel_tl.folder import FolderLock\n"
        f"with FolderLock({str(out)!r}):\n"
        "    print('held', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    assert (out / LOCK).read_text().startswith(f"{holder.pid}\n")
    with FolderLock(out):
        assert (out / LOCK).read_text().startswith(f"{os.getpid()}\n")


def test_a_read_only_folder_is_refused_before_the_model_loads(mount, capsys, monkeypatch):
    ro = mount("ro,size=1m")
    no_model_load(monkeypatch)
    assert main(run_argv("smollm2-135m", ro / "out")) == 2
    err = one_line(capsys)
    assert f"could not write {ro / 'out'}: Read-only file system" in err


def test_a_run_that_will_not_fit_is_refused_before_the_forward(mount, tiny_folder, capsys,
                                                             monkeypatch):
    """The free space is checked against the condition's planned output before the
    forward: one line naming the folder, the estimate and the shortfall, exit 2."""
    monkeypatch.setattr(runner, "measure", lambda *a, **k: pytest.fail("measured"))
    full = mount("size=64k")
    assert main(run_argv(f"hf:{tiny_folder}", full / "out", n=32, T=128)) == 2
    err = one_line(capsys)
    assert f"could not write {full / 'out'}: No space left on device" in err, err
    assert "needs ≈" in err and "MiB short" in err and "free space" in err


def test_the_planned_output_is_what_a_run_writes(tiny_folder, tmp_path):
    """The estimate the free-space check uses is within 25 % of the bytes a run writes
    (here: random tokens, no centering; the raw Gram at T ≤ 256; the tables)."""
    out = tmp_path / "out"
    assert main(run_argv(f"hf:{tiny_folder}", out, n=16, T=64)) == 0
    written = sum(p.stat().st_size for p in (out / C.RESULTS_DIR).rglob("*")
                  if p.is_file() and not p.name.endswith(C.CFG))
    result = pk.ConditionResult.load(out)
    planned = runner.output_bytes(result.spec, 64, 16, result.centered, 0)
    assert 0.75 * written < planned < 1.25 * written, (planned, written)


def test_a_full_disk_is_the_users_problem_in_one_line(mount, tiny_folder, capsys,
                                                      monkeypatch):
    """A disk that fills while the results are written (after the check passed): one
    line naming the file and the cause, exit 2; no partial result file is left behind."""
    monkeypatch.setattr(runner, "check_room", lambda *a: None)
    full = mount("size=64k")
    assert main(run_argv(f"hf:{tiny_folder}", full / "out", n=32, T=128)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "could not write" in err and "No space left on device" in err, err
    assert "bug" not in err
    assert not [p for p in (full / "out").rglob("*") if p.name.startswith(".tmp-")]


def test_hf_naming_a_local_path_that_is_no_model_folder(tmp_path, capsys, monkeypatch):
    """``hf:`` on a plain file or on a folder without config.json is named as such, in
    one line, before anything loads: no hub advice for a local path."""
    no_model_load(monkeypatch)
    text = tmp_path / "one.txt"
    text.write_text("hello")
    assert main(run_argv(f"hf:{text}", tmp_path / "out")) == 2
    err = one_line(capsys)
    assert f"hf:{text} is a file" in err and "hf download" not in err
    assert main(run_argv(f"hf:{tmp_path}", tmp_path / "out")) == 2
    err = one_line(capsys)
    assert "folder without config.json" in err and "hf download" not in err


def test_a_changed_result_file_is_named_by_every_loader(tiny_folder, tmp_path, capsys):
    """One number of a finished run's trackB.csv changed by hand: loading names the file
    and its recorded and present hashes; the report isolates the condition and exits 2.
    Restoring the file makes the condition whole again."""
    out = tmp_path / "out"
    assert main(run_argv(f"hf:{tiny_folder}", out, n=8, T=32)) == 0
    pk.ConditionResult.load(out)  # untouched: loads
    table = next((out / C.RESULTS_DIR).glob("*_trackB.csv"))
    original = table.read_text()
    header, first, *rest = original.split("\n")
    cells = first.split(",")
    r2 = header.split(",").index("R2_gram")
    cells[r2] = "0.999"
    table.write_text("\n".join([header, ",".join(cells), *rest]))
    with pytest.raises(ResultFileError, match=r"trackB.csv: changed after it was written "
                                              r"\(sha256 [0-9a-f]{12}… recorded"):
        pk.ConditionResult.load(out)
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after the progress bar)
    assert err.startswith("poskernel: error: report written to")
    assert "trackB.csv: changed after it was written" in err
    table.write_text(original)
    pk.ConditionResult.load(out)


def test_a_result_written_before_the_hashes_is_read_on_its_checks(tiny_folder, tmp_path):
    """A cfg.json without the record (an earlier release's) loads on the structural
    checks alone."""
    out = tmp_path / "out"
    assert main(run_argv(f"hf:{tiny_folder}", out, n=8, T=32)) == 0
    cfg = next((out / C.RESULTS_DIR).glob(f"*_{C.CFG}"))
    meta = json.loads(cfg.read_text())
    assert set(meta.pop("sha256")) >= {"trackA.csv", "trackB.csv", "g.npz", "heads.csv"}
    cfg.write_text(json.dumps(meta))
    assert pk.ConditionResult.load(out).n_layers > 0


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_rewritten_at_once_with_the_same_size_is_hashed_again(tmp_path):
    """The per-process digest cache keys on size and modification time, which a file
    system records coarsely: a file changed within that tick must still read as changed;
    an old file's digest is kept."""
    path = tmp_path / "t.csv"
    path.write_text("0.0586\n")
    first = file_digest(path)
    path.write_text("0.9990\n")  # the same size, within the same timestamp tick
    assert file_digest(path) != first == sha256_of(b"0.0586\n")
    old = time.time() - 10
    os.utime(path, (old, old))
    kept = file_digest(path)
    assert file_digest(path) == kept == sha256_of(b"0.9990\n")
    assert any(k[0] == str(path.resolve()) for k in folder._DIGESTS)  # kept: not hashed again
