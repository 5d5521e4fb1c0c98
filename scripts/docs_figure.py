"""The picture on the README and the docs' home page: g(Δ) of two heads of the embedded
SmolLM2-135M (Track A, pooled over standard-library sources at T = 256), with each head's R².

    python scripts/docs_figure.py [--out docs/assets/g_delta.png]
"""

import argparse
import sysconfig
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import poskernel_tl as pk

HEADS = ((1, 2, "previous-token head"), (20, 4, "a late head"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/assets/g_delta.png")
    ap.add_argument("--length", type=int, default=256)
    args = ap.parse_args()
    model = pk.load_model("smollm2-135m", progress=False)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if 6000 < p.stat().st_size < 20000)[:16]
    texts = [f.read_text() for f in files]
    res = pk.measure(model, texts[8:], centering_tokens=texts[:8], length=args.length,
                     progress=False)
    fig, axes = plt.subplots(1, len(HEADS), figsize=(8, 2.8), dpi=110)
    lags = np.arange(1, res.g_pooled.shape[-1] + 1)
    for ax, (layer, head, label) in zip(axes, HEADS):
        ax.plot(lags, res.g_pooled[layer, head], lw=1.2, color="#3b5ba5")
        ax.set_xscale("log")
        ax.set_title(f"L{layer}H{head} ({label}): R² = {res.r2_pooled[layer, head]:.2f}",
                     fontsize=9)
        ax.set_xlabel("offset Δ = t − s (tokens)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("g(Δ), pooled Track A", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
