"""Rotary frequency usage per head (Barbero et al., ICLR 2025, "Round and Round We Go").

Reads ``freq_usage.npz`` written by ``poskernel run`` (the mean norm of q and k inside
each rotary 2-D pair, pairs read from the model's own ``hook_cos``) and lays it out
per (layer, head, pair) ordered by rotation frequency θ: large norms in the
highest-frequency pairs mark positional heads; large norms in the lowest-frequency pairs
are the near-constant "semantic" channels.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from poskernel_tl.constants import FREQ_USAGE, result_path  # noqa: E402


def freq_usage_table(out_dir: Path, model: str, dataset: str, length: int) -> pd.DataFrame:
    """Tidy table: layer, head, kv_head, pair, theta, dim_a, dim_b, q_norm, k_norm,
    q_share (the pair's share of the head's summed q norms), sorted by θ descending."""
    path = result_path(out_dir, model, dataset, length, FREQ_USAGE)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: frequency usage exists for rotary models "
                                "after `poskernel run`")
    z = np.load(path)
    qn, kn, theta = z["q_pair_norm"], z["k_pair_norm"], z["theta"]
    L, H, P = qn.shape
    group = H // kn.shape[1]
    order = np.argsort(-theta, kind="stable")
    rows = []
    for layer in range(L):
        for head in range(H):
            share = qn[layer, head] / qn[layer, head].sum()
            for rank, pair in enumerate(order):
                rows.append((layer, head, head // group, rank, int(pair), float(theta[pair]),
                             int(z["pair_first"][pair]), int(z["pair_second"][pair]),
                             float(qn[layer, head, pair]), float(kn[layer, head // group, pair]),
                             float(share[pair])))
    return pd.DataFrame(rows, columns=["layer", "head", "kv_head", "rank", "pair", "theta",
                                       "dim_a", "dim_b", "q_norm", "k_norm", "q_share"])


def plot_freq_usage(table: pd.DataFrame, layer: int, title: str = ""):
    """Heatmap of q-norm share per (head, pair) for one layer, pairs ordered by θ
    (highest frequency on the left). Returns the figure."""
    sub = table[table.layer == layer].pivot(index="head", columns="rank", values="q_share")
    thetas = table[(table.layer == layer) & (table["head"] == 0)].sort_values("rank")["theta"]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(sub) + 1.5))
    im = ax.imshow(sub.to_numpy(), aspect="auto", cmap="viridis")
    ticks = np.linspace(0, len(thetas) - 1, min(8, len(thetas))).astype(int)
    ax.set_xticks(ticks, [f"{thetas.iloc[i]:.2g}" for i in ticks])
    ax.set_xlabel("rotary pair, by θ (rad/token, high → low)")
    ax.set_ylabel("head")
    ax.set_title(title or f"layer {layer}: share of |q| per rotary pair")
    fig.colorbar(im, ax=ax, label="share of summed |q|")
    fig.tight_layout()
    return fig


def write_freq_usage(out_dir: Path, model: str, dataset: str, length: int) -> Path | None:
    """Write ``freq_usage.csv`` beside the run's results (None for non-rotary models)."""
    from poskernel_tl.constants import FREQ_USAGE_CSV
    from poskernel_tl.io import save_csv

    if not result_path(out_dir, model, dataset, length, FREQ_USAGE).exists():
        return None
    return save_csv(freq_usage_table(out_dir, model, dataset, length),
                    result_path(out_dir, model, dataset, length, FREQ_USAGE_CSV))
