"""Print, per architecture of the decoder sweep (``tests/decoder_configs.py``), the largest
|ΔR²| of Track A (pooled, over layers and heads) against the naive float64 fit on the input
of Hugging Face's eager softmax, or the one-line refusal (the architecture table,
``docs/reference/architectures.md``, is written by ``scripts/architecture_table.py``).

Usage: python scripts/decoder_sweep.py [ARCH ...] [--length 48] [--seqs 3]
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from conftest import make_tiny_tokenizer  # noqa: E402
from decoder_configs import DECODERS  # noqa: E402
from softmax_spy import naive_r2, softmax_inputs  # noqa: E402
from test_decoder_sweep import build, loaded  # noqa: E402
from tiny_models import VOCAB  # noqa: E402

import poskernel_tl as pk  # noqa: E402
from poskernel_tl.errors import UserError  # noqa: E402


def deviation(arch: str, tokenizer, T: int, n: int) -> str:
    ids = torch.randint(3, VOCAB - 10, (n, T), generator=torch.Generator().manual_seed(1))
    try:
        model = loaded(arch, tokenizer)
        res = pk.measure(model, ids, progress=False, null_perms=0)
    except UserError as err:
        return f"refused: {err}"
    ref = softmax_inputs(build(arch), ids)
    dev = max(np.abs(res.r2_pooled[layer] - naive_r2(A, keep)).max()
              for layer, (A, keep, _) in enumerate(ref))
    return f"{len(ref)} attention layers, max |ΔR²| {dev:.1e}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("archs", nargs="*", default=list(DECODERS))
    p.add_argument("--length", type=int, default=48)
    p.add_argument("--seqs", type=int, default=3)
    args = p.parse_args()
    tokenizer = make_tiny_tokenizer(tempfile.mkdtemp())
    for arch in args.archs:
        print(f"{arch:18s} {deviation(arch, tokenizer, args.length, args.seqs)}", flush=True)


if __name__ == "__main__":
    main()
