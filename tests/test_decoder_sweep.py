"""Every TransformerLens decoder that transformers builds offline, measured exactly or
refused in one line: Track A pooled and per sequence against a naive float64 fit on the
input of Hugging Face's own eager softmax (``softmax_spy``), on the entries its mask keeps
(``decoder_configs`` and ``adapter_configs``: tiny random configs beyond those of
``test_layer_schemes`` and ``test_softmax_terms``)."""

import numpy as np
import pytest
import torch
from decoder_configs import DECODERS, REFUSED, decoder_configs
from softmax_spy import naive_r2, softmax_inputs
from tiny_models import VOCAB
from transformers import AutoModelForCausalLM

import poskernel_tl as pk
from poskernel_tl.apps.cli import main
from poskernel_tl.errors import UserError
from poskernel_tl.hooks.fast_attention import set_attention
from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe
from poskernel_tl.models.registry import placeholder_spec

T = 48


def build(arch: str, seed: int = 0):
    """The tiny eager Hugging Face model of ``arch`` (its config's architecture name kept
    where it names one, e.g. PhiMoE's hub class, else the class transformers builds)."""
    cfg = decoder_configs()[arch]()
    named = getattr(cfg, "architectures", None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    model.config.architectures = named or [type(model).__name__]
    return model


def loaded(arch: str, tokenizer) -> LoadedModel:
    """``arch`` booted as ``hf:`` boots a folder: everything read from the model."""
    hf = build(arch)
    spec = describe(hf, placeholder_spec(f"tiny-{arch}", None))
    bridge = boot_bridge(hf, tokenizer)
    return LoadedModel(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf,
                       attention=set_attention(bridge, "sdpa"))


@pytest.mark.parametrize("arch", DECODERS)
def test_each_decoder_is_exact_or_refused_in_one_line(arch, tiny_tokenizer):
    ids = torch.randint(3, VOCAB - 10, (3, T), generator=torch.Generator().manual_seed(1))
    if arch in REFUSED:
        with pytest.raises(UserError) as refusal:
            pk.measure(loaded(arch, tiny_tokenizer), ids, progress=False)
        assert REFUSED[arch] in str(refusal.value) and "\n" not in str(refusal.value)
        return
    ref = softmax_inputs(build(arch), ids)
    model = loaded(arch, tiny_tokenizer)
    res = pk.measure(model, ids, progress=False, null_perms=2)
    assert len(ref) == model.spec.n_layers
    for layer, (A, keep, _) in enumerate(ref):
        got, want = res.r2_pooled[layer], naive_r2(A, keep)
        assert np.abs(got - want).max() <= 1e-6, (arch, layer, np.abs(got - want).max())
        one = naive_r2(A[1:2], keep[1:2])
        assert np.abs(res.r2_per_seq[1, layer] - one).max() <= 1e-6, (arch, layer)
    assert np.isfinite(res.r2_perm_null).all()


@pytest.mark.parametrize("arch", ["zamba2", "gemma3n", "phimoe", "afmoe", "nanochat",
                                  "exaone_hub", "jetmoe", "recurrent_gemma"])
def test_hf_folders_of_them_run_or_are_refused_as_the_users_input(arch, tiny_tokenizer,
                                                                    tmp_path, capsys):
    """Through ``poskernel run --model hf:DIR`` (a folder transformers saved, under the
    class name it writes; the load's self-check on): PhiMoE, AFMoE, NanoChat and EXAONE 3
    under the hub's class name (built as a Llama) run; a refusal is one line, exit 2, never
    "a bug"."""
    folder = tmp_path / arch
    build(arch).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    capsys.readouterr()  # (transformers' own progress bar)
    rc = main(["run", "--model", f"hf:{folder}", "--dataset", "random", "--length", "32",
               "--n-seqs", "4", "--out", str(tmp_path / "out"), "--quiet",
               "--null-perms", "0"])
    err = capsys.readouterr().err.strip()
    if arch not in REFUSED:
        assert rc == 0, err
        return
    assert rc == 2 and len(err.splitlines()) == 1 and "bug" not in err, err
    assert REFUSED[arch] in err
