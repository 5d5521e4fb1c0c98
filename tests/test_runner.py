"""`poskernel run` end to end: tiny models (fast) and the embedded SmolLM2 (small N)."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import tiny_loaded

import poskernel_tl as pk
from poskernel_tl import constants as C
from poskernel_tl.apps.cli import main
from poskernel_tl.data.sequences import load_sequences
from poskernel_tl.hooks import scores_hook_name
from poskernel_tl.measurement.measure import forward_pass
from poskernel_tl.plan.config import RunConfig
from poskernel_tl.run.runner import run_condition

TRACK_A_COLS = ["model", "dataset", "length", "layer", "head", "seq_id", "R2_per_seq",
                "R2_pooled"]
TRACK_B_COLS = ["model", "dataset", "length", "layer", "head", "R2_gram", "R2_gram_raw"]
TOL = 1e-5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    words = ("the cat sat on a mat while quick brown foxes jumped over lazy dogs and "
             "every function returned its argument plus one").split()
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        text = " ".join(rng.choice(words, size=400))
        (folder / f"doc{i:02d}.txt").write_text(text)
    return folder


def _run(model, out, dataset, length=32, n_seqs=8, **kw):
    cfg = RunConfig(model=model.spec.name, dataset=dataset, length=length, n_seqs=n_seqs,
                    out=str(out), batch_size=3, progress=False, **kw)
    return run_condition(cfg, model=model)[0]


def test_run_writes_seed_files_and_matches_direct_fit(tiny_tokenizer, corpus, tmp_path):
    model = tiny_loaded("llama", tiny_tokenizer)
    dataset = f"text:{corpus}"
    res = _run(model, tmp_path, dataset, save_logits="yes", whiten=True)
    path = lambda s: C.result_path(tmp_path, "tiny-llama", dataset, 32, s)
    a = pd.read_csv(path(C.TRACK_A_CSV))
    b = pd.read_csv(path(C.TRACK_B_CSV))
    assert list(a.columns[:8]) == TRACK_A_COLS and list(b.columns[:7]) == TRACK_B_COLS
    assert len(a) == 4 * 2 * 4 and len(b) == 2 * 4  # eval seqs x layers x heads
    assert b["centered"].all() and (a["kv_head"] == a["head"] // 2).all()
    assert b["R2_gram_whitened"].between(-1e-9, 1).all()
    # independent check: the model's own hook_attn_scores through the public fit
    seqs = load_sequences(C.seqs_path(tmp_path, "tiny-llama", dataset, 32))
    ev = [i for i, s in enumerate(seqs["split"]) if s == "eval"]
    grabbed = {}
    grab = (scores_hook_name("blocks.1.attn"), lambda x, hook: grabbed.__setitem__(1, x.clone()))
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=[grab]):
        model.bridge(seqs["input_ids"][ev])
    r2, _ = pk.shift_invariance_r2(grabbed[1])  # [eval, head]
    got = a[a.layer == 1].pivot(index="seq_id", columns="head", values="R2_per_seq")
    assert np.abs(got.to_numpy() - r2.numpy()).max() < TOL
    g = np.load(path(C.G_ARRAYS))
    assert g["trackA_per_seq"].shape == (4, 2, 4, 31) and g["gram_centered"].shape == (2, 4, 31)
    means = torch.load(path(C.CENTERING_MEANS), weights_only=True)
    assert means["mean_q"].shape == (2, 4, 32, 16) and means["mean_k"].shape == (2, 2, 32, 16)
    assert torch.load(path(C.GRAM_CENTERED), weights_only=True).shape == (2, 4, 32, 32)
    vis = sorted(path(C.VIS_DIR).iterdir())
    assert len(vis) == 1  # of eval indices 0, 11, ..., 99 only 0 exists among 4
    cfg = json.loads(path(C.CFG).read_text())
    assert cfg["spec"]["inv_freq"] and cfg["centered"] is True
    assert res.layer_summary().shape[0] == 2


def test_random_tokens_are_not_centered(tiny_tokenizer, tmp_path):
    model = tiny_loaded("olmo", tiny_tokenizer)
    _run(model, tmp_path, "random", n_seqs=6)
    b = pd.read_csv(C.result_path(tmp_path, "tiny-olmo", "random", 32, C.TRACK_B_CSV))
    assert not b["centered"].any()
    assert np.allclose(b["R2_gram"], b["R2_gram_raw"])
    assert not C.result_path(tmp_path, "tiny-olmo", "random", 32, C.CENTERING_MEANS).exists()
    a = pd.read_csv(C.result_path(tmp_path, "tiny-olmo", "random", 32, C.TRACK_A_CSV))
    assert a["seq_id"].nunique() == 6  # all random sequences are evaluation sequences


def test_length_above_context_fails_before_forward(tiny_tokenizer, tmp_path):
    model = tiny_loaded("gpt2", tiny_tokenizer)
    with pytest.raises(ValueError, match="context"):
        _run(model, tmp_path, "random", length=4096)
    assert not (tmp_path / C.RESULTS_DIR).exists()


@pytest.mark.smollm2
# slow: `run` on tiny models (test_decoder_sweep.py), pk.measure on SmolLM2 (test_sink_first.py)
@pytest.mark.slow
def test_cli_run_on_smollm2(smollm2, tmp_path, monkeypatch, capsys):
    """The CLI path with the real model (loaded once per session) and a small N."""
    from poskernel_tl.run import runner

    monkeypatch.setattr(runner, "load_model", lambda *a, **k: smollm2)
    rc = main(["run", "--model", "smollm2-135m", "--dataset", "prose", "--length", "64",
               "--n-seqs", "4", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "R2_A_pooled" in out and "Q4_1" in out
    a = pd.read_csv(C.result_path(tmp_path, "smollm2-135m", "prose", 64, C.TRACK_A_CSV))
    assert len(a) == 2 * 30 * 9
    assert a["R2_per_seq"].between(-1e-9, 1 + 1e-9).all()


def test_spectral_and_frequency_usage_after_a_run(tiny_tokenizer, corpus, tmp_path):
    from poskernel_tl.analyses.freq_usage import freq_usage_table, write_freq_usage
    from poskernel_tl.analyses.spectral import run_spectral

    model = tiny_loaded("llama", tiny_tokenizer)
    dataset = f"text:{corpus}"
    _run(model, tmp_path, dataset)
    result = pk.ConditionResult.load(tmp_path)
    _, _, summary = run_spectral(result, tmp_path, force=True, n_null=100)
    assert summary["forced"] and summary["n_analysed"] == 2 * 4
    spec_csv = pd.read_csv(C.result_path(tmp_path, "tiny-llama", dataset, 32, C.SPECTRAL_CSV))
    assert len(spec_csv) == 8 and spec_csv["forced"].all()
    table = freq_usage_table(result)
    assert len(table) == 2 * 4 * 8  # layers x heads x d_head/2 pairs
    first = table[(table.layer == 0) & (table["head"] == 0)]
    assert first["theta"].is_monotonic_decreasing and abs(first["q_share"].sum() - 1) < 1e-9
    assert (first["dim_b"] - first["dim_a"] == 8).all()  # HF rotate_half pairs i, i + d/2
    assert write_freq_usage(result, tmp_path).exists()


def test_gpt2_run_writes_positional_kernel_for_spectral(tiny_tokenizer, tmp_path):
    from poskernel_tl.analyses.spectral import run_spectral

    model = tiny_loaded("gpt2", tiny_tokenizer)
    _run(model, tmp_path, "random", n_seqs=4)
    s_pe = np.load(C.result_path(tmp_path, "tiny-gpt2", "random", 32, C.PE_KERNEL))["s_pe"]
    assert s_pe.shape == (2, 4, 31)
    from tiny_models import tiny_hf_model

    from poskernel_tl.measurement.pe_kernel import head_projected_pe_kernel

    pristine = head_projected_pe_kernel(tiny_hf_model("gpt2"), 32)  # same seed, not booted
    assert np.abs(s_pe - pristine).max() < 1e-6
    run_spectral(pk.ConditionResult.load(tmp_path), tmp_path, force=True, n_null=100)
    df = pd.read_csv(C.result_path(tmp_path, "tiny-gpt2", "random", 32, C.SPECTRAL_CSV))
    assert df["r_pe_gram_raw"].notna().all() and (df["pe"] == "learned-absolute").all()
    assert not C.result_path(tmp_path, "tiny-gpt2", "random", 32, C.FREQ_USAGE).exists()


def test_out_of_memory_backs_off_and_says_so(tiny_tokenizer, tmp_path, monkeypatch, capsys):
    model = tiny_loaded("llama", tiny_tokenizer)
    real_forward = model.bridge.forward
    sizes = []

    def forward(ids, *a, **k):
        sizes.append(len(ids))
        if len(ids) > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(ids, *a, **k)

    monkeypatch.setattr(model.bridge, "forward", forward)
    _run(model, tmp_path, "random", n_seqs=4)
    assert "retrying evaluation pass with --batch-size 1" in capsys.readouterr().out
    a = pd.read_csv(C.result_path(tmp_path, "tiny-llama", "random", 32, C.TRACK_A_CSV))
    assert a["seq_id"].nunique() == 4 and a["R2_per_seq"].notna().all()


def test_out_of_memory_mid_forward_restarts_clean(tiny_tokenizer, capsys):
    """An out-of-memory error raised after some layers of a batch were delivered: the pass
    starts again with half the batch size and fresh reducers, and every layer of every
    sequence is delivered once, with the q/k of an undisturbed pass (nothing hooked in
    the broken pass leaks into the next)."""
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))

    class Recorder:
        def __init__(self, fail: bool):
            self.fail, self.seen = fail, {}

        def update(self, batch) -> None:
            if self.fail and batch.layer == 1 and len(batch.rows) > 1:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            for j, row in enumerate(batch.rows):
                assert (row, batch.layer) not in self.seen
                self.seen[row, batch.layer] = (batch.q[j].clone(), batch.k[j].clone())

    clean = forward_pass(model, ids, lambda: [Recorder(False)], 4, "clean", False)[0].seen
    made = []
    red = forward_pass(model, ids, lambda: made.append(Recorder(True)) or made[-1:], 4,
                       "evaluation pass", False)[0]
    assert len(made) == 3 and "retrying evaluation pass with --batch-size 1" in \
        capsys.readouterr().out
    assert red.seen.keys() == clean.keys()
    for key, q in clean.items():
        torch.testing.assert_close(red.seen[key], q)
