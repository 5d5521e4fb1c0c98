"""A causal and a bidirectional model side by side in one report: the encoder is labelled,
its Table 1 row says the fit reads both triangles, and its head data carry both sides of
g and the whole logit matrix."""

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import tiny_loaded

import poskernel_tl as pk
from poskernel_tl.analyses import spectral as S
from poskernel_tl.report.build import build_report


@pytest.fixture(scope="module")
def folder(tiny_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("side_by_side")
    gen = torch.Generator().manual_seed(0)
    results = []
    for arch in ("llama", "bert"):
        model = tiny_loaded(arch, tiny_tokenizer)
        ids = torch.randint(3, 290, (8, 24), generator=gen)
        r = pk.measure(model, ids[4:], ids[:4], logits_for=[0], dataset="prose",
                       progress=False, null_perms=2)
        r.save(out)
        results.append(r)
    for r in results:
        S.run_spectral(r, out, gate_met=False, n_null=20)
    return out, results


def test_encoder_and_decoder_in_one_report(folder):
    out, (causal, encoder) = folder
    assert causal.causal and not encoder.causal
    page = build_report(out, workers=1)
    text = page.read_text(encoding="utf-8")
    assert "(bidirectional)" in text
    t1 = (out / "report" / "table1.md").read_text(encoding="utf-8")
    rows = [line for line in t1.splitlines() if line.startswith("| tiny-")]
    assert any("tiny-bert (bidirectional: both triangles)" in r for r in rows)
    assert any(r.startswith("| tiny-llama |") for r in rows)
    summary = pd.read_csv(out / "report" / "summary.csv")
    assert dict(zip(summary["model"], summary["causal"])) == {"tiny-llama": True,
                                                              "tiny-bert": False}


def payload(out, model: str) -> dict:
    data = next((out / "report" / "data").glob(f"{model}_*"))
    text = data.read_text(encoding="utf-8")
    return json.loads(re.search(r"=\s*(\{.*\})\s*;?\s*$", text, re.S).group(1))


def test_head_data_carry_both_sides_for_the_encoder_only(folder):
    out, (causal, encoder) = folder
    build_report(out, workers=1)
    enc, dec = payload(out, "tiny-bert"), payload(out, "tiny-llama")
    T = 24
    for d, both in ((enc, True), (dec, False)):
        page = d["heads"][0]
        kernels = [q for q in page["panels"] if q["section"] == "Positional kernel g(Δ)"]
        back = [sum("g(−Δ)" in t["name"] for t in k["series"]) for k in kernels]
        assert back == ([2, 1] if both else [0, 0])  # raw and within rows; Track B
        assert page["seq"]["twoSided"] is both and (page["seq"]["gBack"] is None) is not both
        # the saved logits: every entry off the diagonal (encoder), 8-bit coded
        assert page["seq"]["codes"]["shape"] == [T * (T - 1) // (1 if both else 2)]
    assert np.isnan(np.diag(encoder.logits[int(encoder.seq_id[0])][0, 0])).all()
    assert np.isfinite(encoder.logits[int(encoder.seq_id[0])][0, 0][0, 1])
