"""The forward passes of kernel patching (:mod:`poskernel_tl.analyses.kernel_patching`,
whose docstring describes the method): a clean pass, then per layer and head chunk one
patched forward, measured as per-sequence losses (:class:`PatchingResult`).

Batching and cost. One forward patches several heads of one layer in separate batch
rows: row 0 is clean, then one block of Hc rows per variant (kernel, kernel with the sink
kept, mean ablation), row j of a block patching head h_j (Hc = ``head_chunk``, default all
heads of the layer; R = 1 + 3Hc rows, 1 + 2Hc with ``sink_keys=0``). With one sequence per
forward the bridge runs blocks 0..L−1 on that sequence alone and repeats the residual
stream into the R rows at ``blocks.{L}.hook_in`` (``expand``), so a sequence costs
Σ_L [L + (n_layers − L)·R] block evaluations, about R·n_layers²/2: for SmolLM2 (30 layers
× 9 heads, R = 28) ≈ 13,500 block evaluations, the work of ≈ 450 single-sequence forwards,
in 30 forwards. Where expanding mid-forward is not possible (several sequences per
forward, or an architecture whose masks do not broadcast) the tokens are repeated at the
input instead (R·n_layers full forwards per sequence). Add one clean pass over the
sequences. The clean row of every patched forward is checked against the clean pass.
``max_seqs``, ``layers``, ``head_chunk`` and ``sink_keys=0`` bound the cost and memory
(logits of R rows).
"""

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.analyses.kernel_patching.kernels import (
    causal_masks,
    pooled_kernels,
    replace_mask,
    shift_invariant_part,
)
from poskernel_tl.hooks import block_site, scores_hook_name
from poskernel_tl.plan.batching import batched
from poskernel_tl.progress import tqdm

MODES = ("pooled", "per_seq")
DIAGONALS = ("fit", "keep")
CLEAN_TOL = 1e-3  # |loss(clean row) − loss(clean pass)| allowed (batch-shape float noise)


def next_token_loss(logits: Float[Tensor, "batch pos d_vocab"],
                    tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, " batch"]:
    """Mean cross-entropy of positions 0..T−2 predicting tokens 1..T−1, per row."""
    b, T, _ = logits.shape
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(),
                         reduction="none")
    return ce.view(b, T - 1).double().mean(-1)


@dataclass
class PatchingResult:
    """Per-sequence losses (float64): ``loss_clean`` [n_seqs] from the clean pass, and per
    variant (``"patched"``, ``"patched_sink"`` when asked for, ``"ablated"``) the loss
    [n_seqs, layer, head_index] (NaN for layers not patched), each measured against the
    clean row of the same forward (``loss_clean_row``)."""

    loss_clean: Float[np.ndarray, " n_seqs"]
    loss_clean_row: Float[np.ndarray, "n_seqs layer"]
    losses: dict[str, np.ndarray]
    mode: str
    diagonal: str
    keep_keys: int
    sink_keys: int
    kernel_from: str
    expanded: bool
    n_forwards: int
    seconds: float

    def dloss(self, variant: str) -> Float[np.ndarray, "n_seqs layer head_index"]:
        return self.losses[variant] - self.loss_clean_row[..., None]

    @property
    def loss_patched(self) -> Float[np.ndarray, "n_seqs layer head_index"]:
        return self.losses["patched"]

    @property
    def dloss_patched(self) -> Float[np.ndarray, "n_seqs layer head_index"]:
        return self.dloss("patched")


# ------------------------------------------------------------------ the clean pass
def _clean_pass(model, ids: Tensor, batch_size: int, progress: bool):
    """Clean losses per sequence and the mean scores over the sequences on the causal
    triangle, [layer, head_index, query_pos, key_pos] (float32; 0 above the diagonal)."""
    bridge, dev = model.bridge, model.device
    L, H, T = model.spec.n_layers, model.spec.n_heads, ids.shape[1]
    lower = causal_masks(T, dev)[0]
    sums = torch.zeros(L, H, T, T, dtype=torch.float32, device=dev)

    def observe(x: Tensor, hook) -> None:
        layer = int(hook.name.split(".")[1])
        sums[layer] += torch.where(lower, x.float(), 0.0).sum(0)

    losses: list[Tensor] = []

    def restart() -> None:
        sums.zero_()
        losses.clear()

    hooks = [(scores_hook_name(block_site(layer)), observe) for layer in range(L)]
    with bridge.hooks(fwd_hooks=hooks):
        batched(ids, batch_size, dev, "clean pass", progress,
                lambda rows, chunk: losses.append(next_token_loss(bridge(chunk), chunk)),
                restart)
    return torch.cat(losses), sums / len(ids)


# ------------------------------------------------------------- the patched passes
class _Patcher:
    """Hooks for one (layer, head chunk) forward. Rows: [clean, one block of Hc rows per
    kernel patch (``patches``: (keep_keys, pooled kernel [head_index, T, T] or None)),
    one block of mean-ablated rows]; row j of a block patches head ``heads[j]``."""

    def __init__(self, layer: int, heads: list[int], n_heads: int, mode: str,
                 diagonal: str, mean_scores: Tensor,
                 patches: list[tuple[int, Tensor | None]]):
        self.layer, self.n_heads = layer, n_heads
        self.mode, self.diagonal = mode, diagonal
        dev = mean_scores.device
        T = mean_scores.shape[-1]
        self.heads = torch.as_tensor(heads, device=dev)
        hc = len(heads)
        self.rows = 1 + (len(patches) + 1) * hc
        self.blocks = [1 + v * hc + torch.arange(hc, device=dev)
                       for v in range(len(patches) + 1)]
        self.patches = [(k, None if kern is None else kern[self.heads],
                         replace_mask(T, diagonal, k, dev)) for k, kern in patches]
        self.mean = mean_scores[layer, self.heads]  # [Hc, T, T]
        self.lower = causal_masks(T, dev)[0]

    def expand(self, x: Float[Tensor, "batch pos d_model"], hook) -> Tensor:
        if x.shape[0] != 1:
            raise RuntimeError("expanding mid-forward needs one sequence per forward")
        return x.repeat(self.rows, *([1] * (x.ndim - 1)))

    def scores(self, x: Float[Tensor, "batch head_index query_pos key_pos"], hook) -> Tensor:
        T = x.shape[-1]
        v = x.reshape(-1, self.rows, self.n_heads, T, T)
        out = v.clone()
        for rows, (keep_keys, kernel, replace) in zip(self.blocks, self.patches):
            src = v[:, rows, self.heads]  # [b, Hc, T, T]
            if self.mode == "per_seq":
                out[:, rows, self.heads] = shift_invariant_part(src, self.diagonal, keep_keys)
            else:
                out[:, rows, self.heads] = torch.where(replace, kernel.to(src.dtype), src)
        rows = self.blocks[-1]
        src = v[:, rows, self.heads]
        out[:, rows, self.heads] = torch.where(self.lower, self.mean.to(src.dtype), src)
        return out.reshape(x.shape)


def _patched_loss(model, ids: Tensor, loss_clean: Tensor, patcher: _Patcher, rows: slice,
                  use_expand: bool) -> Float[Tensor, "n_seqs row"]:
    """One patched forward of the sequences ``ids[rows]``: the loss of every row, the
    clean row checked against the clean pass."""
    bridge, dev = model.bridge, model.device
    tok = ids[rows].to(dev)
    hooks = [(scores_hook_name(block_site(patcher.layer)), patcher.scores)]
    if use_expand:
        hooks.append((f"blocks.{patcher.layer}.hook_in", patcher.expand))
    else:
        tok = tok.repeat_interleave(patcher.rows, 0)
    with torch.no_grad(), bridge.hooks(fwd_hooks=hooks):
        logits = bridge(tok)
    rep = tok if not use_expand else tok.expand(patcher.rows, -1)
    loss = next_token_loss(logits, rep).view(-1, patcher.rows)
    check = (loss[:, 0] - loss_clean[rows].to(loss)).abs().max()
    if float(check) > CLEAN_TOL:
        raise RuntimeError(f"clean row differs from the clean pass by {float(check):.2e}")
    return loss


@dataclass
class _Sweep:
    """The losses of every patched forward, filled in as the sweep goes."""

    losses: dict[str, np.ndarray]
    clean_row: Float[np.ndarray, "n_seqs layer"]
    expanded: bool
    n_forwards: int

    def record(self, loss: Tensor, patcher: _Patcher, rows: slice, heads: list[int]) -> None:
        loss = loss.cpu().numpy()
        self.clean_row[rows, patcher.layer] = loss[:, 0]
        for v, block in zip(self.losses, patcher.blocks):
            self.losses[v][rows, patcher.layer, heads] = loss[:, block.cpu().numpy()]
        self.n_forwards += 1


def _sweep(model, ids: Tensor, loss_clean: Tensor, variants: list[str],
           patcher: Callable[[int, list[int]], _Patcher], layers: list[int],
           chunks: list[list[int]], batch_size: int, expand: bool | None,
           progress: bool) -> _Sweep:
    """Every (layer, head chunk) forward over the sequences, one sequence per forward
    while the mid-forward expansion works (``expand`` None: falls back to repeating the
    tokens, ``batch_size`` sequences per forward, at the first failure)."""
    n = len(ids)
    L, H = model.spec.n_layers, model.spec.n_heads
    out = _Sweep({v: np.full((n, L, H), np.nan) for v in (*variants, "ablated")},
                 np.full((n, L), np.nan), expand is None or expand, -(-n // batch_size))
    step = 1 if out.expanded else batch_size
    bar = tqdm(total=len(layers) * len(chunks) * -(-n // step), desc="kernel patching",
               disable=not progress, unit="fwd")
    start = 0
    while start < n:
        rows = slice(start, min(n, start + step))
        for layer in layers:
            for heads in chunks:
                p = patcher(layer, heads)
                try:
                    loss = _patched_loss(model, ids, loss_clean, p, rows, out.expanded)
                except RuntimeError as err:
                    if not out.expanded or expand:
                        raise
                    warnings.warn(f"mid-forward expansion failed ({err}); repeating the "
                                  "tokens at the input instead", RuntimeWarning, stacklevel=3)
                    out.expanded, step = False, batch_size
                    rows = slice(start, min(n, start + step))
                    bar.total = bar.n + len(layers) * len(chunks) * -(-(n - start) // step)
                    loss = _patched_loss(model, ids, loss_clean, p, rows, False)
                out.record(loss, p, rows, heads)
                bar.update(1)
        start = rows.stop
    bar.close()
    return out


# ------------------------------------------------------------------ the entry point
def _check_options(mode: str, diagonal: str, T: int, keep_keys: int, sink_keys: int) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {MODES}")
    if diagonal not in DIAGONALS:
        raise ValueError(f"diagonal={diagonal!r}: choose one of {DIAGONALS}")
    for name, k in (("keep_keys", keep_keys), ("sink_keys", sink_keys)):
        if not 0 <= k < T - 1:
            raise ValueError(f"{name}={k}: need 0 <= {name} < T - 1 = {T - 1}")


def _variant_kernels(mode: str, g_pooled: np.ndarray | None, mean_scores: Tensor,
                     variants: dict[str, int]) -> tuple[dict[str, Tensor | None], str]:
    """Per kernel variant the pooled kernels [layer, head_index, T, T] (None per sequence,
    ``mode="per_seq"``) and where they come from."""
    if mode != "pooled":
        return dict.fromkeys(variants), "per-sequence fit"
    L, H, T = mean_scores.shape[:3]
    g = None
    if g_pooled is not None:
        g = torch.as_tensor(np.asarray(g_pooled), device=mean_scores.device)
        if g.shape != (L, H, T - 1):
            raise ValueError(f"g_pooled has shape {tuple(g.shape)}, expected "
                             f"{(L, H, T - 1)} (was the result measured at this length?)")
    kernels = {v: pooled_kernels(g, mean_scores, k) for v, k in variants.items()}
    kernel_from = ("result.g_pooled" if g is not None and not variants["patched"]
                   else "mean scores of the patched sequences")
    return kernels, kernel_from


def run_kernel_patching(
    model, eval_tokens: Int[Tensor, "batch pos"], *, g_pooled: np.ndarray | None = None,
    mode: str = "pooled", diagonal: str = "fit", keep_keys: int = 0, sink_keys: int = 1,
    layers=None, head_chunk: int | None = None, max_seqs: int | None = None,
    batch_size: int = 4, expand: bool | None = None, progress: bool = True,
) -> PatchingResult:
    """Clean, kernel-patched and mean-ablated losses of every head (the method: see
    :mod:`poskernel_tl.analyses.kernel_patching`; the batching: this module).

    ``g_pooled`` [layer, head_index, lag]: the pooled kernel of ``mode="pooled"`` (None:
    fitted to the patched sequences' mean scores); ``keep_keys``: key columns the main
    patch leaves clean; ``sink_keys`` > 0 adds the ``"patched_sink"`` variant that keeps
    that many first key columns (0: no extra variant); ``expand``: None tries the
    mid-forward expansion (one sequence per forward) and falls back to repeating the
    tokens; ``batch_size``: sequences per forward of the clean pass and of the repeat
    path."""
    t0 = time.time()
    ids = eval_tokens[:max_seqs] if max_seqs else eval_tokens
    _check_options(mode, diagonal, ids.shape[1], keep_keys, sink_keys)
    L, H = model.spec.n_layers, model.spec.n_heads
    layers = list(range(L)) if layers is None else sorted(int(x) for x in layers)
    head_chunk = head_chunk or H
    chunks = [list(range(h, min(H, h + head_chunk))) for h in range(0, H, head_chunk)]
    loss_clean, mean_scores = _clean_pass(model, ids, batch_size, progress)
    variants = {"patched": keep_keys}
    if sink_keys:
        variants["patched_sink"] = sink_keys
    kernels, kernel_from = _variant_kernels(mode, g_pooled, mean_scores, variants)

    def patcher(layer: int, heads: list[int]) -> _Patcher:
        return _Patcher(layer, heads, H, mode, diagonal, mean_scores,
                        [(k, None if kernels[v] is None else kernels[v][layer])
                         for v, k in variants.items()])

    done = _sweep(model, ids, loss_clean, list(variants), patcher, layers, chunks,
                  batch_size, expand, progress)
    return PatchingResult(loss_clean.cpu().numpy(), done.clean_row, done.losses, mode,
                          diagonal, keep_keys, sink_keys, kernel_from, done.expanded,
                          done.n_forwards, round(time.time() - t0, 1))


__all__ = ["CLEAN_TOL", "DIAGONALS", "MODES", "PatchingResult", "next_token_loss",
           "run_kernel_patching"]
