"""One config tree: every option field has a flag and every flag a field; choices are
checked with messages that name the flag; bad input fails before any model loads, with
exit 2 and one line, while a bug shows its traceback and asks for a report."""

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from poskernel_tl.apps import cli, commands
from poskernel_tl.errors import UserError
from poskernel_tl.plan.config import (
    PER_CONDITION,
    GridConfig,
    MeasureConfig,
    RunConfig,
    cli_fields,
    from_args,
)

IGNORED = {"help", "command"}


def _dests(argv: list[str]) -> set[str]:
    parser = cli.build_parser()
    args = parser.parse_args(argv)
    return set(vars(args)) - IGNORED


def _fields(cls, exclude=()) -> set[str]:
    return {f.name for f in cli_fields(cls)} - set(exclude)


def test_run_flags_are_the_run_config_fields():
    assert _dests(["run"]) - {"spectral"} == _fields(RunConfig)


def test_grid_flags_are_the_grid_config_fields():
    assert _dests(["grid"]) == _fields(GridConfig, PER_CONDITION)


def test_analyze_flags_are_run_fields_plus_the_options():
    from poskernel_tl.analyses.registry import REGISTRY

    for name, spec in REGISTRY.items():
        dests = _dests(["analyze", name]) - {"analysis"}
        assert dests == _fields(RunConfig, cli.RUN_ONLY) | _fields(spec.options), name


def test_every_field_documents_itself():
    for cls in (MeasureConfig, RunConfig, GridConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_parsed_flags_round_trip_into_the_dataclass():
    args = cli.build_parser().parse_args(
        ["run", "--model", "gpt2", "--length", "64", "--n-seqs", "8", "--batch-size", "3",
         "--scores", "qk", "--quiet", "--whiten"])
    cfg = from_args(RunConfig, args)
    assert (cfg.model, cfg.length, cfg.n_seqs, cfg.batch_size, cfg.scores) == \
        ("gpt2", 64, 8, 3, "qk")
    assert cfg.progress is False and cfg.whiten is True


@pytest.mark.parametrize("changes, flag", [
    ({"dtype": "float8"}, "--dtype"), ({"scores": "maybe"}, "--scores"),
    ({"batch_size": 0}, "--batch-size"), ({"n_seqs": 7}, "--n-seqs"),
    ({"length": 100_000}, "--length"), ({"length": 2}, "--length"),
    ({"dataset": "nosuch"}, "nosuch"), ({"model": "nosuch"}, "nosuch"),
    ({"null_perms": -1}, "--null-perms")])
def test_bad_values_name_the_flag(changes, flag):
    cfg = RunConfig()
    for key, value in changes.items():  # as a command line or a cfg.json would set them
        setattr(cfg, key, value)
    with pytest.raises(UserError, match=flag):
        cfg.validate()


@pytest.mark.parametrize("content", [b"", b"\x00\x01binary\x00"])
def test_empty_or_binary_text_fails_before_the_model_loads(tmp_path, content, capsys,
                                                           monkeypatch):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    monkeypatch.setattr("poskernel_tl.run.runner.load_model",
                        lambda *a, **k: pytest.fail("the model was loaded"))
    t0 = time.time()
    rc = cli.main(["run", "--dataset", f"text:{path}", "--out", str(tmp_path / "o")])
    assert rc == 2 and time.time() - t0 < 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0]


def test_a_bug_is_a_traceback_and_a_request_to_report(monkeypatch, capsys):
    def broken(args):
        raise ZeroDivisionError("internal")

    monkeypatch.setitem(commands.COMMANDS, "models", broken)
    assert cli.main(["models"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err and "report" in err


def test_a_user_error_is_one_line_and_exit_2(capsys):
    assert cli.main(["run", "--batch-size", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size" in err[0]


def test_grid_config_makes_each_condition_s_run_config():
    grid = GridConfig(batch_size=2, seed=3, out="x", save_logits="yes")
    run = grid.run_config("m", "prose", 1024, 20)
    assert isinstance(run, RunConfig) and not isinstance(run, GridConfig)
    assert (run.model, run.length, run.n_seqs, run.batch_size, run.seed, run.out) == \
        ("m", 1024, 20, 2, 3, "x")
    assert run.save_logits == "no"  # full logits only at T <= 256


def _config_reads() -> set[str]:
    """Names the library reads off a configuration: attributes of ``cfg``/``opts``/``args``
    outside config.py, the fields a config method reads for them (``cfg.wants_logits()``
    reads ``save_logits``), pk.measure's keywords (``measure_kwargs`` passes every
    MeasureConfig field) and the fields ``load_model(cfg)`` takes whole."""
    import ast
    import inspect
    from pathlib import Path

    import poskernel_tl as pk
    from poskernel_tl.models.loading import LOAD_FIELDS

    root = Path(__file__).resolve().parents[1]
    read, config = set(LOAD_FIELDS), ast.parse((root / "poskernel_tl/plan/config.py").read_text())
    for folder in ("poskernel_tl", "hooks", "analyses"):
        for path in (root / folder).rglob("*.py"):
            if path.name != "config.py":
                read |= {n.attr for n in ast.walk(ast.parse(path.read_text()))
                         if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                         and n.value.id in ("cfg", "opts", "args")}
    for f in ast.walk(config):
        if isinstance(f, ast.FunctionDef) and f.name in read:
            read |= {n.attr for n in ast.walk(f) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == "self"}
    measured = {f.name for f in dataclasses.fields(MeasureConfig)}
    return read | (measured & set(inspect.signature(pk.measure).parameters))


def test_every_field_a_command_accepts_reaches_a_consumer():
    """A flag that no code reads fails here: every field of the grid's configuration
    (which holds the run's and the measurement's) is read beyond its definition."""
    read = _config_reads()  # (once: it parses every module of the package)
    unread = [f.name for f in dataclasses.fields(GridConfig) if f.name not in read]
    assert unread == []


def test_a_run_loads_its_model_from_the_configuration_whole(monkeypatch):
    """`poskernel run` (and every command on one condition) hands load_model the
    configuration itself, so no loading option can be dropped on the way (the grid, tested
    in test_grid.py, once lost --compatibility-mode)."""
    from poskernel_tl.run import runner

    calls = []
    monkeypatch.setattr(runner, "load_model", lambda c: calls.append(c) or 1 / 0)
    cfg = RunConfig(length=16, n_seqs=4, compatibility_mode=True, attention="eager")
    with pytest.raises(ZeroDivisionError):
        runner.prepare(cfg)
    assert calls == [cfg]


@pytest.mark.parametrize("argv, rc", [
    (["--help"], 0), (["run", "--help"], 0), (["run", "--lenght", "3"], 2),
    (["run", "--length", "1e3"], 2), (["run", "--length", "99999"], 2),
    (["run", "--dataset", "nope"], 2), (["grid", "--models", "nosuch"], 2),
    (["run", "--out", "/proc/poskernel-test/out"], 2)])
def test_the_command_line_answers_before_torch_is_imported(argv, rc):
    """--help, a bad flag, a bad value and every check that needs no model answer from
    the parser and the light checks: torch, transformers, TransformerLens and pandas are
    never imported (the commands are, once the input is good)."""
    code = ("import sys\nfrom poskernel_tl.apps.cli import main\ntry:\n"
            f"    rc = main({argv!r})\nexcept SystemExit as stop:\n    rc = stop.code\n"
            "heavy = ('torch', 'transformers', 'transformer_lens', 'pandas')\n"
            "print(rc, [m for m in heavy if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == f"{rc} []", done.stdout + done.stderr
    if rc == 2:  # one line naming the problem (argparse's usage above it)
        assert "error: " in done.stderr.strip().splitlines()[-1], done.stderr
