"""scripts/length_sweep.py on the embedded SmolLM2: its per-layer Track A R² is what
`pk.measure` finds on the same evaluation windows, and its table has a line per layer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.smollm2
@pytest.mark.slow  # a script around pk.measure, whose path on SmolLM2 default tests take
def test_length_sweep_matches_measure(tmp_path, smollm2):
    import poskernel_tl as pk
    from poskernel_tl.data.sequences import build_sequences

    out = tmp_path / "sweep.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "length_sweep.py"),
                           "--lengths", "24", "40", "--n-eval", "4", "--dataset", "random",
                           "--threads", "1", "--json", str(out)], capture_output=True,
                          text=True, env=env, timeout=600, check=True)
    rows = json.loads(out.read_text())
    assert [r["T"] for r in rows] == [24, 40] and all(r["n_eval"] == 4 for r in rows)
    model = smollm2  # the session's load
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    bands = [ln for ln in lines if ln.startswith("| Δ ")]
    assert len(lines) == 2 + model.spec.n_layers + 3 + len(bands), proc.stdout
    # T = 24 has one band [1, 23] (the whole fit); T = 40 has [1, 16] and [17, 39]
    assert [ln.split(" |")[0] for ln in bands] == ["| Δ from 1", "| Δ from 17"]
    seqs = build_sequences(model.tokenizer, "random", 40, n_seqs=4, seed=0,
                           model_name="smollm2-135m")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the script ran: float32 sums split across threads differ
    try:
        res = pk.measure(model, seqs["input_ids"], progress=False, null_perms=0)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(rows[1]["layer_pooled"], res.r2_pooled.mean(1), atol=1e-9)
    assert rows[1]["pooled"] == pytest.approx(res.r2_pooled.mean(), abs=1e-9)
    assert rows[1]["per_seq_sd"] > 0
    assert rows[1]["bands"]["17-39"] == pytest.approx(np.nanmean(
        res.r2_band_pooled[list(res.band_lo).index(17)]), abs=1e-9)
