"""pk.measure as a value: save/load round trip and validation, both Track A paths,
from_bridge, strings as input, and the CLI's refusals before any model is loaded."""


import json
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
from masks import masks
from tiny_models import tiny_hf_model, tiny_loaded

import poskernel_tl as pk
from poskernel_tl import constants as C
from poskernel_tl.apps.cli import main
from poskernel_tl.errors import ResultFileError, UserError
from poskernel_tl.measurement.parts import owner
from poskernel_tl.measurement.result import ALIASES
from poskernel_tl.models.loading import boot_bridge

T, N = 24, 6


def _tokens(seed=0, n=N):
    return torch.randint(3, 290, (n, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama(tiny_tokenizer):
    return tiny_loaded("llama", tiny_tokenizer)


@pytest.fixture(scope="module")
def measured(llama):
    return pk.measure(llama, _tokens(0), _tokens(1), batch_size=4, progress=False,
                      logits_for=[0, 2], whiten=True)


def _equal(a, b):
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def test_save_load_round_trip_is_exact(measured, tmp_path):
    measured.save(tmp_path)
    back = pk.ConditionResult.load(tmp_path)
    assert sorted(back.parts) == sorted(measured.parts)
    for name in [*owner(), *ALIASES, "model", "dataset", "length", "seq_id"]:
        assert _equal(getattr(measured, name), getattr(back, name)), name
    a, b = measured.to_frames()
    pd.testing.assert_frame_equal(a, back.to_frames()[0])
    pd.testing.assert_frame_equal(b, back.to_frames()[1])
    assert measured.g_pooled.dtype == np.float64 and back.r2_gram_whitened is not None


def test_permutation_null_reuses_track_a_for_the_unpermuted_fit(llama, measured):
    """The null's unpermuted reference is Track A's pooled fit of the same sequences (all
    6 here, fewer than the 8 the null uses), not a second pass."""
    assert measured.r2_perm_null.shape == (4, 2, 4)
    assert np.array_equal(measured.r2_perm_same_seqs, measured.r2_pooled)
    from poskernel_tl.statistics import PermNullReducer

    standalone = PermNullReducer(masks(T, 2), 4, n_perm=4, max_seqs=8, seed=0)
    from poskernel_tl.measurement.measure import forward_pass

    (red,) = forward_pass(llama, _tokens(0), lambda: [standalone], 4, "null", False)
    res = red.result()
    assert np.abs(res.r2_same_seqs - measured.r2_pooled).max() < 1e-6
    assert np.abs(res.r2_null - measured.r2_perm_null).max() < 1e-6


def test_both_track_a_paths_agree(llama):
    hook = pk.measure(llama, _tokens(0), _tokens(1), progress=False, scores="hook")
    qk = pk.measure(llama, _tokens(0), _tokens(1), progress=False, scores="qk")
    assert hook.provenance["scores_from"] != qk.provenance["scores_from"]
    for name in ("r2_per_seq", "r2_pooled", "r2_pooled_nosink", "r2_pooled_early", "g_pooled",
                 "r2_gram", "r2_gram_raw"):
        diff = np.nanmax(np.abs(getattr(hook, name) - getattr(qk, name)))
        assert diff < 1e-6, f"{name}: {diff:.3g}"


def test_measure_agrees_with_the_public_fit_of_hooked_scores(llama, measured):
    scores = {}
    with torch.no_grad(), llama.bridge.hooks(fwd_hooks=[(
            "blocks.1.attn.hook_attn_scores", lambda x, hook: scores.setdefault(1, x.clone()))]):
        llama.bridge(_tokens(0))
    r2, g = pk.shift_invariance_r2(scores[1])
    assert np.abs(measured.r2_per_seq[:, 1] - r2.numpy()).max() < 1e-6
    logits = measured.logits[2][1]
    lower = np.tril(np.ones((T, T), bool), -1)
    assert np.abs(logits[:, lower] - scores[1][2].numpy()[:, lower]).max() < 1e-5
    assert np.isnan(logits[:, ~lower]).all()


def test_from_bridge_and_strings(tiny_tokenizer):
    hf = tiny_hf_model("llama", seed=3)
    bridge = boot_bridge(hf, tiny_tokenizer)
    model = pk.LoadedModel.from_bridge(bridge, tiny_tokenizer)
    assert (model.spec.pe, model.spec.n_layers, model.spec.n_kv_heads) == ("rope", 2, 2)
    assert model.spec.rotary_frequencies() is not None and model.rotary_pairs is not None
    text = ["the quick brown fox jumps over the lazy dog " * 3] * 4
    res = pk.measure(model, text, progress=False)
    assert res.r2_pooled.shape == (2, 4) and not res.centered and np.isnan(res.r2_gram).all()
    assert res.to_frames()[1]["R2_gram"].equals(res.to_frames()[1]["R2_gram_raw"])


def test_texts_of_different_lengths_are_cut_to_one_length(llama):
    """Strings are tokenized and cut: to ``length`` where given (a shorter text refused,
    named), else both sets to their shortest text, and the result says so."""
    words = "the quick brown fox jumps over the lazy dog def f(x): return x + 1 "
    texts = [words * (3 + i) for i in range(6)]  # every text a different length
    n = [len(llama.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    res = pk.measure(llama, texts[2:], centering_tokens=texts[:2], progress=False)
    assert res.length == min(n) and res.centered
    assert any(f"cut to the shortest (T = {min(n)})" in x for x in res.provenance["notes"])
    res = pk.measure(llama, texts[2:], centering_tokens=texts[:2], length=20, progress=False)
    assert res.length == 20 and not any("shortest" in x for x in res.provenance["notes"])
    with pytest.raises(UserError, match=f"centering text 0 has {n[0]} tokens, fewer than "
                                        f"length={n[0] + 1}"):
        pk.measure(llama, texts[2:], centering_tokens=texts[:2], length=n[0] + 1,
                   progress=False)


def test_shape_errors_raise_in_normal_use(llama):
    from poskernel_tl.reducers import LayerBatch

    with pytest.raises(Exception, match="head_index|d_head|batch"):
        LayerBatch(0, torch.zeros(2, 8, 4, 16), torch.zeros(3, 8, 2, 16),
                   torch.arange(2), 0.25)


@pytest.mark.parametrize("problem", ["cut_csv", "renamed_column", "corrupt_npz",
                                     "corrupt_means", "bad_shape"])
@pytest.mark.parametrize("recorded", [True, False])
def test_load_validates_and_names_the_file(measured, tmp_path, problem, recorded):
    """A damaged file is named: as changed since it was written, by its content hash;
    and by the structural checks for a result whose cfg.json records no hashes (an
    earlier release's)."""
    measured.save(tmp_path)
    path = lambda s: C.result_path(tmp_path, measured.model, measured.dataset, T, s)
    if not recorded:
        meta = json.loads(path(C.CFG).read_text())
        del meta["sha256"]
        path(C.CFG).write_text(json.dumps(meta))
    if problem == "cut_csv":
        lines = path(C.TRACK_A_CSV).read_text().splitlines()[:13]
        path(C.TRACK_A_CSV).write_text("\n".join(lines) + "\n")
        want = "trackA.csv: has 12 rows"
    elif problem == "renamed_column":
        text = path(C.TRACK_B_CSV).read_text().replace("R2_gram_raw", "R2_gram_rawx", 1)
        path(C.TRACK_B_CSV).write_text(text)
        want = "trackB.csv: lacks columns"
    elif problem == "corrupt_npz":
        path(C.G_ARRAYS).write_bytes(path(C.G_ARRAYS).read_bytes()[:200])
        want = "g.npz: unreadable"
    elif problem == "corrupt_means":
        path(C.CENTERING_MEANS).write_bytes(b"not a torch file")
        want = "centering_means.pt: unreadable"
    else:
        np.savez(path(C.G_ARRAYS), **{**dict(np.load(path(C.G_ARRAYS))),
                                      "trackA_pooled": np.zeros((2, 4, 5))})
        want = "trackA_pooled has shape"
    if recorded:
        want = r"(trackA.csv|trackB.csv|g.npz|centering_means.pt): changed after it was " \
               r"written \(sha256 [0-9a-f]{12}… recorded"
    with pytest.raises(ResultFileError, match=want):
        pk.ConditionResult.load(tmp_path)


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "-1"], "--batch-size -1"),
    (["--batch-size", "0"], "--batch-size 0"),
    (["--device", "tpu9"], "--device tpu9: not a device"),
    (["--device", "cuda"], "--device cuda: not available"),
    (["--dataset", "nope"], "unknown dataset"),
    (["--length", "99999"], "exceeds"),
    (["--n-seqs", "3"], "--n-seqs 3"),
])
def test_cli_refuses_bad_input_before_loading(args, message, capsys, monkeypatch):
    import poskernel_tl.models.loading as loading

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    base = {"--model": "smollm2-135m", "--dataset": "prose", "--length": "64"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["run"] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    from poskernel_tl.apps import commands

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(commands.COMMANDS, "models", interrupted)
    assert main(["models"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == ("poskernel: stopped by SIGINT; finished conditions are kept; "
                           "rerun the same command to resume")


@pytest.mark.parametrize("command", [  # slow: the grid's stop takes the handler run's does
    "run", pytest.param("grid", marks=pytest.mark.slow)])
def test_sigterm_is_one_line_and_exit_143(command, tmp_path, tiny_tokenizer):
    """SIGTERM (what a scheduler or ``timeout`` sends) during a measurement: the same one
    line as Ctrl-C, naming the signal, and exit 143; no traceback."""
    folder = tmp_path / "tiny"
    tiny_hf_model("llama").save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    out = tmp_path / "out"
    args = {"run": ["run", "--model", f"hf:{folder}", "--dataset", "random", "--length",
                    "128"],
            "grid": ["grid", "--models", f"hf:{folder}", "--datasets", "random",
                     "--lengths", "128"]}[command]
    proc = subprocess.Popen([sys.executable, "-m", "poskernel_tl.apps.cli", *args,
                             "--n-seqs", "20000", "--out", str(out), "--quiet"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.time() + 240
    while not list(out.glob("data/*_seqs.pt")) and proc.poll() is None \
            and time.time() < deadline:  # the measurement has begun
        time.sleep(0.5)
    time.sleep(2)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "poskernel: stopped by SIGTERM; finished conditions are kept; rerun the same "
        "command to resume")


def test_progress_bars_are_text_bars_without_the_notebook_widgets(monkeypatch):
    """Without ipywidgets the bars are tqdm's text bars, chosen on purpose (no
    TqdmWarning in a notebook); with them, tqdm's automatic choice."""
    import importlib
    import importlib.util

    import tqdm.auto
    import tqdm.std

    import poskernel_tl.progress as progress

    real = importlib.util.find_spec
    try:
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "ipywidgets" else real(name, *a))
        assert importlib.reload(progress).tqdm is tqdm.std.tqdm
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: object() if name == "ipywidgets" else real(name, *a))
        assert importlib.reload(progress).tqdm is tqdm.auto.tqdm
    finally:
        monkeypatch.undo()
        importlib.reload(progress)
