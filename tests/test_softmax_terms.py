"""What each layer's softmax reads: tiny random Hugging Face models of the architectures
that add to scale·q·k (ALiBi, soft-capping, learned sinks, a query temperature, chunks) or
reach the product another way (MLA, partial and interleaved rotary, a grouped Falcon, a
hybrid), each measured against a naive float64 fit on the input of Hugging Face's own
eager softmax, over the entries its mask keeps."""

import base64
import copy
import json

import numpy as np
import pytest
import torch
from softmax_spy import naive_r2, softmax_inputs
from tiny_models import SOFTMAX_ARCHITECTURES, softmax_hf_model, softmax_loaded
from transformer_lens.head_detector import (
    compute_head_attention_similarity_score,
    get_previous_token_head_detection_pattern,
)

import poskernel_tl as pk
from poskernel_tl.models.softmax_ops import alibi_ramp, fold_qk
from poskernel_tl.models.softmax_terms import SoftmaxTerms

T = 40
QKV = ("query_key_value", "Wqkv")  # the fused projections of BLOOM/Falcon and MPT


def alibi_bias(hf_model, ids) -> list[torch.Tensor]:
    """HF's own bias (+ mask) of every layer: the softmax input of a copy whose fused
    q/k/v projections are zero (its q·k vanish)."""
    probe = copy.deepcopy(hf_model)
    for name, p in probe.named_parameters():
        if any(x in name for x in QKV):
            p.data.zero_()
    return [A for A, _, _ in softmax_inputs(probe, ids)]


def what_softmax_reads(arch: str, model, ids) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per attention layer: the logits HF's eager softmax reads (float64, [n, H, T, T]) on
    the entries its mask keeps, in the fit's form: gpt-oss's row maximum (subtracted over
    the tokens and the sink before its softmax) added back; ALiBi in the paper's form
    (HF's bias differs from −m·(t − s) by a per-row constant: checked here)."""
    hf = softmax_hf_model(arch)  # a fresh copy: booting the bridge replaced the modules
    ref = softmax_inputs(hf, ids)
    biases = alibi_bias(hf, ids) if model.spec.pe == "alibi" else None
    out = []
    for layer, (A, keep, extra) in enumerate(ref):
        terms = model.spec.layers[layer].terms
        if terms.sinks is not None:  # spy: raw − rowmax; extra: sink − rowmax
            sinks = torch.tensor(terms.sinks, dtype=torch.float64)[None, :, None, None]
            A = torch.where(keep, A + sinks - extra[..., :1], A)
        if biases is not None:
            shift = biases[layer] - alibi_ramp(terms, A.shape[-1])[None]
            spread = torch.where(keep, shift, -np.inf).amax(-1) + \
                torch.where(keep, -shift, -np.inf).amax(-1)
            assert spread.max() < 1e-5, (arch, layer, spread.max())  # a per-row constant
            paper = torch.where(keep, A - shift, A)
            same = torch.where(keep, A, -np.inf).softmax(-1) - \
                torch.where(keep, paper, -np.inf).softmax(-1)
            assert same.abs().max() < 1e-6  # both forms give the same attention
            A = paper
        out.append((A, keep))
    return out


def softmax_patterns(arch: str, model, ids) -> list[torch.Tensor]:
    """Per attention layer: the pattern HF's eager softmax makes ([n, H, T, T] over the
    tokens; the learned sinks, where the model has them, take their share of each row)."""
    out = []
    for layer, (A, keep) in enumerate(what_softmax_reads(arch, model, ids)):
        terms = model.spec.layers[layer].terms
        logits = torch.where(keep, A, -np.inf)
        if terms.sinks is not None:  # the sink logit joins each row's normaliser
            sink = torch.tensor(terms.sinks, dtype=A.dtype)[None, :, None, None]
            logits = torch.cat([logits, sink.expand(*A.shape[:3], 1)], -1)
        out.append(logits.softmax(-1)[..., :A.shape[-1]])
    return out


@pytest.mark.parametrize("arch", SOFTMAX_ARCHITECTURES)
def test_track_a_fits_what_the_softmax_reads(arch, tiny_tokenizer):
    """Track A pooled and per-sequence R² equal the naive fit on what HF's eager softmax
    reads (≤ 1e-6), layer by layer; TransformerLens's previous-token score equals its
    similarity on HF's own pattern (sinks in the normaliser)."""
    model = softmax_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(1))
    res = pk.measure(model, ids, progress=False, null_perms=2)
    ref = what_softmax_reads(arch, model, ids)
    assert len(ref) == model.spec.n_layers
    for layer, (A, keep) in enumerate(ref):
        got, want = res.r2_pooled[layer], naive_r2(A, keep)
        assert np.abs(got - want).max() <= 1e-6, (arch, layer, np.abs(got - want).max())
        one = naive_r2(A[2:3], keep[2:3])
        assert np.abs(res.r2_per_seq[2, layer] - one).max() <= 1e-6
        terms = model.spec.layers[layer].terms
        sinks = 0 if terms.sinks is None else \
            torch.tensor(terms.sinks, dtype=torch.float64)[None, :, None, None].expand(
                *A.shape[:3], 1)
        full = torch.cat([torch.where(keep, A, -np.inf), sinks * torch.ones(*A.shape[:3], 1,
                                                                             dtype=A.dtype)]
                         if terms.sinks is not None else [torch.where(keep, A, -np.inf)], -1)
        pattern = full.softmax(-1)[..., :T].float()
        detect = get_previous_token_head_detection_pattern(ids[:1])
        tl = [[compute_head_attention_similarity_score(
            pattern[x, h], detect, exclude_bos=False, exclude_current_token=False,
            error_measure="mul") for h in range(A.shape[1])] for x in range(len(ids))]
        assert np.abs(res.tl_prev_token[layer] - np.mean(tl, 0)).max() <= 1e-5
    assert np.isfinite(res.r2_perm_null).all()


def test_the_schemes_name_what_the_softmax_adds(tiny_tokenizer):
    """Read from the models: ALiBi slopes (paper form, Falcon's doubled 1/√d), soft-cap,
    sinks, temperature on the NoPE layer, chunks on the RoPE ones, MLA's split head, the
    hybrid's attention blocks."""
    spec = lambda arch: softmax_loaded(arch, tiny_tokenizer).spec
    bloom = spec("bloom")
    assert bloom.pe == "alibi" and bloom.n_ctx == 0
    assert bloom.layers[0].terms.slopes == pytest.approx((0.25, 0.0625, 0.015625, 0.00390625))
    assert spec("mpt").layers[0].terms.slopes == pytest.approx(bloom.layers[0].terms.slopes)
    falcon = spec("falcon_alibi")
    assert falcon.n_kv_heads == 1 and falcon.layers[0].terms.slopes == pytest.approx(
        tuple(2 * m / 4 for m in bloom.layers[0].terms.slopes))
    assert spec("falcon").n_kv_heads == 2
    assert {s.terms.softcap for s in spec("gemma2").layers} == {0.5}
    oss = spec("gpt_oss")
    assert all(s.terms.sinks is not None and len(s.terms.sinks) == 4 for s in oss.layers)
    l4 = spec("llama4")
    assert [s.terms.temperature for s in l4.layers] == [None] * 3 + [(8.0, 0.1)]
    assert [s.terms.chunk for s in l4.layers] == [64] * 3 + [None]
    assert [s.layout for s in l4.layers[:3]] == ["interleaved"] * 3
    assert l4.layers[0].norm_after_rotary is not None
    ds = spec("deepseek_v3")
    assert ds.d_head == 24 and {(s.rotary_offset, s.rotary_dims) for s in ds.layers} == {(16, 8)}
    bamba = spec("bamba")
    assert bamba.n_layers == 2 and [s.block for s in bamba.layers] == [1, 3]
    from poskernel_tl.models.scheme import summary

    assert summary(bamba.layers).endswith("layers 0-1 (the model's blocks 1, 3)")


def test_a_planted_alibi_ramp_is_recovered(tiny_tokenizer):
    """A BLOOM whose q/k/v projections are zero reads only its ALiBi bias: every head's
    logits are the ramp −m_h·Δ, so Track A's R² is 1 and g(Δ) is the ramp exactly."""
    from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe
    from poskernel_tl.models.registry import placeholder_spec

    hf = softmax_hf_model("bloom")
    for name, p in hf.named_parameters():
        if "query_key_value" in name:
            p.data.zero_()
    model = LoadedModel(bridge=boot_bridge(hf, tiny_tokenizer), tokenizer=tiny_tokenizer,
                        spec=describe(hf, placeholder_spec("ramp", None)), hf_model=hf)
    ids = torch.randint(3, 290, (3, T), generator=torch.Generator().manual_seed(2))
    res = pk.measure(model, ids, progress=False)
    slopes = np.array(model.spec.layers[0].terms.slopes)
    assert np.allclose(res.r2_pooled, 1.0, atol=1e-9)
    ramp = -slopes[None, :, None] * np.arange(1, T)[None, None, :]
    assert np.allclose(res.g_pooled, ramp, atol=1e-9)


def test_folded_queries_give_the_paper_form_and_the_temperature():
    """fold_qk: scale·q'·k'ᵀ = scale·q·kᵀ − m_h·(t − s), with τ_t on every query row."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 12, 4, 8, generator=g), torch.randn(2, 12, 2, 8, generator=g)
    terms = SoftmaxTerms(slopes=(0.5, 0.25, 0.1, 0.05), temperature=(4.0, 0.3))
    qf, kf = fold_qk(q, k, terms, 0.3)
    got = torch.einsum("bthd,bshd->bhts", qf, kf.repeat_interleave(2, 2)) * 0.3
    t = torch.arange(12, dtype=torch.float64)
    tau = 1 + 0.3 * torch.log1p(torch.floor((t + 1) / 4))
    want = torch.einsum("bthd,bshd->bhts", q.double() * tau[None, :, None, None],
                        k.double().repeat_interleave(2, 2)) * 0.3 + alibi_ramp(terms, 12)[None]
    assert torch.allclose(got, want, atol=1e-12)
    assert fold_qk(q, k, SoftmaxTerms(softcap=30.0), 0.3) == (q, k)  # nothing additive


def models_command(name: str, capsys) -> tuple[int, str, str]:
    """``poskernel models NAME`` in this process: (exit status, stdout, stderr)."""
    from poskernel_tl.apps import cli

    capsys.readouterr()
    rc = cli.main(["models", name])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_model_without_attention_is_refused_in_one_line(tmp_path, tiny_tokenizer, capsys):
    from tiny_models import _softmax_configs
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(_softmax_configs()["mamba"]).save_pretrained(tmp_path / "m")
    tiny_tokenizer.save_pretrained(tmp_path / "m")
    rc, _, err = models_command(f"hf:{tmp_path / 'm'}", capsys)
    assert rc == 2, err
    last = err.strip().splitlines()[-1]
    assert "no softmax-attention layer" in last and "Traceback" not in err


def test_a_broken_local_folder_is_named_as_such(tmp_path, capsys):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    rc, _, err = models_command(f"hf:{folder}", capsys)
    assert rc == 2, err
    last = err.strip().splitlines()[-1]
    assert "config.json" in last and "Pre-download" not in last and str(folder) in last


@pytest.mark.parametrize("arch, expect", [
    ("bloom", "ALiBi −m·(t − s), m = 0.25 … 0.00391 over 4 heads"),
    ("gemma2", "soft-cap 0.5·tanh(x / 0.5)"),
    ("gpt_oss", "learned sink logits"),
    ("deepseek_v3", "8/24 dims rotated from dimension 16"),
])
def test_models_prints_what_each_softmax_adds(arch, expect, tmp_path, tiny_tokenizer, capsys):
    softmax_hf_model(arch).save_pretrained(tmp_path / arch)
    tiny_tokenizer.save_pretrained(tmp_path / arch)
    rc, out, err = models_command(f"hf:{tmp_path / arch}", capsys)
    assert rc == 0 and expect in out, (out, err)


@pytest.mark.parametrize("arch", ["bloom", "gpt_oss", "gemma2", "llama4", "bamba"])
def test_a_head_view_reads_what_the_softmax_reads(arch, tiny_tokenizer):
    """One head's view: its fit equals Track A's per-sequence fit of the same sequence (the
    paper-form ALiBi, the cap, the temperature), and its pattern is the model's own
    softmax output (gpt-oss's rows short of 1 by what the sink takes)."""
    model = softmax_loaded(arch, tiny_tokenizer)
    ids = torch.randint(3, 290, (2, T), generator=torch.Generator().manual_seed(4))
    layer = model.spec.n_layers - 1
    res = pk.measure(model, ids, progress=False)
    hf = softmax_hf_model(arch)
    probs = []
    handles = [m.register_forward_hook(lambda _m, _i, out: probs.append(out[1]))
               for m in hf.modules() if type(m).__name__.endswith("Attention")]
    with torch.no_grad():
        hf(ids[:1], output_attentions=True)
    for h in handles:
        h.remove()
    for head in (0, 3):
        view = pk.inspect_head(model, ids[0], layer, head)
        assert abs(view.r2 - res.r2_per_seq[0, layer, head]) < 1e-6
        want = probs[layer][0, head].double().numpy()
        assert np.abs(view.pattern - want).max() < 1e-5, (arch, head)
    if arch == "gpt_oss":
        assert view.pattern.sum(-1).max() < 1 - 1e-4


def test_the_report_says_what_the_softmax_reads(tmp_path, tiny_tokenizer):
    """A BLOOM condition's report: the section naming its ALiBi and Track B's meaning, and
    every head's g(Δ) against its ramp (alibi_ramp.csv; a planted ramp's slope ratio 1)."""
    import pandas as pd

    from poskernel_tl.report.build import build_report
    from poskernel_tl.report.softmax_reads import ramp_fit

    model = softmax_loaded("bloom", tiny_tokenizer)
    ids = torch.randint(3, 290, (8, T), generator=torch.Generator().manual_seed(5))
    pk.measure(model, ids[4:], ids[:4], progress=False, dataset="random").save(tmp_path)
    page = build_report(tmp_path, workers=1).read_text()
    assert "What the softmax reads" in page and "ALiBi −m·(t − s)" in page
    assert "paper's form" in page.replace("&#x27;", "'")
    table = pd.read_csv(tmp_path / "report" / "alibi_ramp.csv")
    assert len(table) == 16 and set(table.columns) >= {"m", "slope_A", "slope_over_minus_m"}
    assert np.isfinite(table[["slope_A", "R2_line_A", "slope_B_content"]].to_numpy()).all()
    slope, r2 = ramp_fit(-0.25 * np.arange(1, 30) + 3.0)
    assert slope == pytest.approx(-0.25) and r2 == pytest.approx(1.0)
    # each head's page draws its known kernel −m_h·Δ in Track A's g(Δ) plot
    data = next(f for f in (tmp_path / "report" / "data").glob("*.js")
                if f.name != "head_map.js").read_text()
    pages = json.loads(data[data.index("] = ") + 4:].rstrip().rstrip(";"))["heads"]
    layer, head = 1, 2
    plot = next(p for p in pages[layer * 4 + head]["panels"] if p["title"] == "Track A g(Δ)")
    known = [t for t in plot["series"] if t["name"] == "known kernel: alibi"]
    m = model.spec.layers[layer].terms.slopes[head]
    y = np.frombuffer(base64.b64decode(known[0]["y"]["b64"]), "<f4")
    assert len(known) == 1 and np.allclose(y, -m * np.arange(1, T), rtol=1e-6)
