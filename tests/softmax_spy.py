"""What a Hugging Face model's attention softmax reads, recorded during its eager forward
(:func:`poskernel_tl.models.self_check.softmax_inputs`, the load's self-check's own
recording), and the naive float64 fits the tests hold the measurement to.

The input of every attention softmax (``torch.softmax``, ``Tensor.softmax``,
``torch.nn.functional.softmax`` over the last axis of a [batch, head, T, ≥ T] or BART-style
[batch·head, T, T] tensor) is the ground truth of what a head's fit should read: the logits
after every bias, cap and temperature the model applies, with the entries its mask removes
at the dtype's minimum (or −inf). Columns past T (gpt-oss's learned sink logits) are the
model's own extra normaliser terms, returned apart.
"""

import numpy as np
import torch

from poskernel_tl.models.self_check import softmax_inputs

__all__ = ["naive_r2", "naive_within_fit", "naive_within_r2", "softmax_inputs"]


def naive_r2(A: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    """Pooled R² per head over the kept strictly lower entries, entry by entry (float64)."""
    n, H, T_, _ = A.shape
    lag = (torch.arange(T_)[:, None] - torch.arange(T_)[None]).expand(n, T_, T_)
    out = np.empty(H)
    for h in range(H):
        kept = keep[:, h] & (lag > 0)
        vals, lags = A[:, h][kept], lag[kept]
        g = torch.bincount(lags, vals, minlength=T_) / \
            torch.bincount(lags, minlength=T_).clamp(min=1)
        out[h] = 1 - float(((vals - g[lags]) ** 2).sum() / ((vals - vals.mean()) ** 2).sum())
    return out


def naive_within_r2(A: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    """Within-row R² per head over the kept off-diagonal entries of the sequences of ``A``
    [n, head, T, T] together, by a dense least-squares fit of g(Δ) + c_x(t) (one constant
    per row of each sequence) and the variance about each row's mean (float64)."""
    return naive_within_fit(A, keep)[0]


def naive_within_fit(A: torch.Tensor, keep: torch.Tensor) -> tuple[np.ndarray, list]:
    """:func:`naive_within_r2` and, per head, g by signed offset (a dict Δ -> g(Δ)) on
    the raw logits' mean level (its mean over the kept entries equals theirs)."""
    n, H, T_, _ = A.shape
    t = torch.arange(T_)
    lag = (t[:, None] - t[None]).expand(n, T_, T_)
    seq = torch.arange(n)[:, None, None].expand(n, T_, T_)
    row = t[None, :, None].expand(n, T_, T_)
    out, kernels = np.empty(H), []
    for h in range(H):
        kept = keep[:, h] & (lag != 0)
        y = A[:, h][kept].numpy()
        lags, rows = lag[kept].numpy(), (seq[kept] * T_ + row[kept]).numpy()
        _, li = np.unique(lags, return_inverse=True)
        _, ri = np.unique(rows, return_inverse=True)
        X = np.zeros((len(y), li.max() + 1 + ri.max() + 1))
        X[np.arange(len(y)), li] = 1
        X[np.arange(len(y)), li.max() + 1 + ri] = 1
        coef = np.linalg.lstsq(X, y, rcond=None)[0]
        fit = X @ coef
        means = np.bincount(ri, y) / np.bincount(ri)
        out[h] = 1 - ((y - fit) ** 2).sum() / ((y - means[ri]) ** 2).sum()
        g = coef[:li.max() + 1]
        g = g + y.mean() - g[li].mean()
        kernels.append(dict(zip(np.unique(lags).tolist(), g)))
    return out, kernels
