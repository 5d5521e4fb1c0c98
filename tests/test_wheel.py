"""A clean install: the project's metadata builds a wheel without a warning of its own,
and the wheel, installed into a fresh virtual environment outside the checkout, runs
`poskernel models` and `poskernel report` on a saved result, with the viewer's assets.

The fresh environment borrows this environment's dependencies (torch, TransformerLens,
…) through a path file, so the test takes seconds, not a download: a plain path line
puts that folder on ``sys.path`` without running its own ``.pth`` files, so the editable
install of this checkout stays out and ``poskernel_tl`` is the wheel's."""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "v0.2.0"
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "poskernel_tl", "hooks", "analyses")


def _run(cmd, cwd, **kw) -> subprocess.CompletedProcess:
    run = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                         timeout=600, **kw)
    assert run.returncode == 0, f"{cmd}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel built from a copy of the sources, and what the build printed."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        kw = dict(ignore=shutil.ignore_patterns("__pycache__")) if (ROOT / name).is_dir() else {}
        copy(ROOT / name, src / name, **kw)
    run = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "--verbose", "-w", tmp / "dist", src], cwd=tmp)
    (found,) = (tmp / "dist").glob("poskernel_tl-*.whl")
    return found, run.stdout + run.stderr


def test_the_build_prints_no_warning_of_the_project_s_metadata(wheel):
    _, log = wheel
    bad = [line for line in log.splitlines() if any(
        w in line for w in ("Warning", "deprecated", "is absent from", "2027"))]
    assert bad == []


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed (no deps: this one's, by path)."""
    where = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=False).create(where)
    py = where / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=where).stdout.strip())
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--quiet",
          wheel[0]], cwd=where)
    return where


def test_the_installed_wheel_runs_models_and_report(fresh_venv, tmp_path):
    bin_ = fresh_venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_}:/usr/bin:/bin", HF_HUB_OFFLINE="1")
    where = _run([bin_ / "python", "-c", "import poskernel_tl; print(poskernel_tl.__file__)"],
                 cwd=tmp_path, env=env).stdout.strip()
    assert Path(where).is_relative_to(fresh_venv) and not Path(where).is_relative_to(ROOT)
    models = _run([bin_ / "poskernel", "models"], cwd=tmp_path, env=env).stdout
    assert "smollm2-135m" in models and "gpt2" in models
    shutil.copytree(GOLDEN, tmp_path / "saved")
    _run([bin_ / "poskernel", "report", "saved"], cwd=tmp_path, env=env)
    report = tmp_path / "saved" / "report"
    assert (report / "report.html").stat().st_size > 0
    assets = {p.name for p in (report / "assets").rglob("*") if p.is_file()}
    assert {"viewer.js", "viewer.css"} <= assets, sorted(assets)
