"""Benchmark: the soft-capped scores path against Hugging Face's own forward (not a test).

A soft-capped layer (Gemma 2: cap·tanh(scale·q·k / cap)) reads a nonlinear function of
q·k, so Track A, the null and the previous-token score form its T×T scores and sweep them
(:mod:`poskernel_tl.models.softmax_terms`), where an uncapped layer streams sums of q and k.
This script builds one random Gemma 2 shaped like SmolLM2-135M (30 layers, 9 query and 3
key/value heads, d_head 64, hidden 576; a 4096-token window on every other layer, cap 50)
and times, per sequence, in one process and on the same random tokens:

  hf        Hugging Face's default forward of the model (``model.model(ids)``: no
            unembedding; Gemma 2's attention is eager there, sdpa cannot cap)
  capped    ``pk.measure`` of the model as it is (soft-capped: the scores path)
  uncapped  ``pk.measure`` of the same weights with the cap removed (the streamed path)

and prints each per sequence with its ratio to ``hf``.

Usage: python scripts/bench_softcap.py [--length 1024] [--n-seqs 4] [--repeats 2] [--threads N]
       [--null-perms K]
"""

import argparse
import time

import torch


def build(cap: float | None):
    import transformers as tf

    cfg = tf.Gemma2Config(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          head_dim=64, max_position_embeddings=8192, sliding_window=4096,
                          query_pre_attn_scalar=64, attn_logit_softcapping=cap,
                          final_logit_softcapping=None)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    model.config.architectures = [type(model).__name__]
    return model


def loaded(cap: float | None):
    import tempfile

    from conftest import make_tiny_tokenizer  # tests/ on sys.path below

    from poskernel_tl.hooks.fast_attention import set_attention
    from poskernel_tl.models.loading import LoadedModel, boot_bridge, describe
    from poskernel_tl.models.registry import placeholder_spec

    hf = build(cap)
    tok = make_tiny_tokenizer(tempfile.mkdtemp())
    spec = describe(hf, placeholder_spec(f"gemma2-bench-cap{cap}", None))
    bridge = boot_bridge(hf, tok)
    return LoadedModel(bridge=bridge, tokenizer=tok, spec=spec, hf_model=hf,
                       attention=set_attention(bridge, "sdpa"))


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import poskernel_tl as pk

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--n-seqs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--null-perms", type=int, default=None,
                    help="permutations of the null (default: pk.measure's own)")
    a = ap.parse_args()
    extra = {} if a.null_perms is None else {"null_perms": a.null_perms}
    if a.threads:
        torch.set_num_threads(a.threads)
    ids = torch.randint(3, 49000, (a.n_seqs, a.length), generator=torch.Generator().manual_seed(0))
    capped, uncapped = loaded(50.0), loaded(None)
    hf = build(50.0)  # a fresh copy: booting a bridge takes over the modules

    def forward():
        with torch.no_grad():
            for i in range(a.n_seqs):
                hf.model(ids[i:i + 1])

    out = {"hf": best(forward, a.repeats)}
    for name, model in (("capped", capped), ("uncapped", uncapped)):
        out[name] = best(lambda model=model: pk.measure(model, ids, progress=False,
                                                        batch_size=1, **extra), a.repeats)
    print(f"T = {a.length}, {a.n_seqs} sequences, {torch.get_num_threads()} threads, best of "
          f"{a.repeats}, null permutations: {a.null_perms if extra else 'default'}")
    for name, sec in out.items():
        print(f"  {name:9s} {sec / a.n_seqs:8.3f} s/seq   {sec / out['hf']:5.2f}× hf")


if __name__ == "__main__":
    main()
