"""What a Hugging Face model's attention softmax reads, recorded during its eager forward.

The input of every attention softmax (``torch.softmax``, ``Tensor.softmax``,
``torch.nn.functional.softmax`` over the last axis of a [batch, head, T, ≥ T] or BART-style
[batch·head, T, T] tensor) is the ground truth of what a head's fit should read: the logits
after every bias, cap and temperature the model applies, with the entries its mask removes
at the dtype's minimum (or −inf). Columns past T (gpt-oss's learned sink logits) are the
model's own extra normaliser terms, returned apart.
"""

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

SOFTMAXES = {torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax,
             torch._C._nn.softmax if hasattr(torch._C._nn, "softmax") else torch.softmax}


class _Spy(TorchFunctionMode):
    def __init__(self, length: int, heads: int):
        super().__init__()
        self.length, self.heads, self.seen = length, heads, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SOFTMAXES:
            x = args[0]
            dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            T = self.length
            if dim in (-1, x.ndim - 1) and x.ndim in (3, 4) and x.shape[-2] == T \
                    and x.shape[-1] >= T:
                self.seen.append(x.detach().double().clone())
        return func(*args, **kwargs)


def softmax_inputs(hf_model, ids: torch.Tensor, **inputs
                   ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Per attention layer, in order: (A [batch, head, T, T] float64, the bool [batch, head,
    T, T] of entries the mask keeps, the extra columns past T or None). ``inputs``: more
    arguments of the forward (an encoder-decoder's ``decoder_input_ids``)."""
    b, T = ids.shape
    spy = _Spy(T, None)
    with torch.no_grad(), spy:
        hf_model(ids, **inputs)
    out = []
    for x in spy.seen:
        if x.ndim == 3:
            x = x.view(b, -1, *x.shape[1:])
        extra = x[..., T:] if x.shape[-1] > T else None
        A = x[..., :T]
        keep = torch.isfinite(A) & (A > torch.finfo(torch.float32).min / 2)
        out.append((torch.where(keep, A, torch.zeros((), dtype=A.dtype)), keep, extra))
    return out


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
