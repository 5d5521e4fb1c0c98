"""Kernel patching: is a head "just its kernel"?

For every attention head, the pre-softmax scores A(t, s) read at ``hook_attn_scores``
([batch, head_index, query_pos, key_pos], already causally masked) are replaced by a
shift-invariant kernel K(t, s) = g(t − s) through a TransformerLens hook that returns the
modified scores, and the mean next-token loss on the evaluation sequences is compared with
the clean loss and with the loss after mean-ablating the same head:

- ``mode="per_seq"``: g is fitted inside the hook on that sequence's own scores (g(Δ) =
  mean of sub-diagonal Δ, exactly the Track A fit; the head keeps everything that is a
  function of Δ in this sequence and loses everything else);
- ``mode="pooled"``: g is the condition's pooled Track A kernel ``result.g_pooled`` (one
  kernel for all sequences; a content-free head). Without a result, or with
  ``keep_keys``, it is fitted to the mean scores of the patched sequences, which is the
  pooled Track A fit of those sequences (the mean of sub-diagonal Δ over all of them).

Only the causal triangle s ≤ t is replaced; entries above the diagonal keep their masked
fill value. The Track A fit covers Δ = 1..T−1; the main diagonal (Δ = 0, a token attending
to itself) is, with ``diagonal="fit"`` (default), replaced by its own mean (per sequence,
or pooled over the evaluation batch's clean scores), and with ``diagonal="keep"`` left at
its clean value. ``keep_keys=k`` does the same for the main patch.

Mean ablation replaces the head's scores on the causal triangle (diagonal included) by
their mean over the evaluation sequences at each (t, s), computed in a clean pass over
the same sequences (the per-position mean scores; for a head this is its raw averaged
Gram matrix). The loss is the mean cross-entropy of positions 0..T−2 predicting 1..T−1.

Per head the table reports ``dloss_patched`` = loss(patched) − loss(clean),
``dloss_ablated`` = loss(mean-ablated) − loss(clean), their ratio ``dloss_ratio`` (the
normalised loss change: 0 = the kernel is all the head contributes, 1 = the kernel is no
better than the mean), and seeded bootstrap 95% intervals over sequences (the ratio's
interval is the ratio of resampled means). The ratio is only meaningful where ablation
matters (``ablation_matters``: its interval lies above 0).

A kernel g(t − s) cannot hold an attention sink (a large score on the first key whatever
the offset), and destroying a sink can cost nats where mean ablation, which keeps it,
costs nothing. So by default a second patch, ``patched_sink``, runs beside the first: the
same kernel with the first ``sink_keys`` (default 1) key columns kept at their clean
values and left out of the fit (``dloss_patched_sink``, ``dloss_ratio_sink``).

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
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from matplotlib.figure import Figure
from torch import Tensor
from tqdm.auto import tqdm

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.config import option
from poskernel_tl.hooks import scores_hook_name
from poskernel_tl.measure import as_tokens, check_tokens

MAX_SEQS = 16  # evaluation sequences patched by default from a notebook
MODES = ("pooled", "per_seq")
DIAGONALS = ("fit", "keep")
CLEAN_TOL = 1e-3  # |loss(clean row) − loss(clean pass)| allowed (batch-shape float noise)


# ----------------------------------------------------------------- the kernel fit
def causal_masks(T: int, device=None) -> tuple[Bool[Tensor, "query_pos key_pos"],
                                              Bool[Tensor, "query_pos key_pos"]]:
    """(s ≤ t, s < t): the causal triangle with and without its diagonal."""
    full = torch.ones(T, T, dtype=torch.bool, device=device)
    return full.tril(), full.tril(-1)


def lag_index(T: int, device=None) -> Int[Tensor, "query_pos key_pos"]:
    """Δ = t − s on the causal triangle, 0 above it."""
    pos = torch.arange(T, device=device)
    return (pos[:, None] - pos[None]).clamp(min=0)


def kernel_from_g(g: Float[Tensor, "*batch lag0"]) -> Float[Tensor, "*batch query_pos key_pos"]:
    """The Toeplitz matrix K(t, s) = g(t − s) from g over Δ = 0..T−1 (K[t, s] = g(0)
    above the diagonal: mask it)."""
    T = g.shape[-1]
    return g[..., lag_index(T, g.device)]


def replace_mask(T: int, diagonal: str = "fit", keep_keys: int = 0,
                 device=None) -> Bool[Tensor, "query_pos key_pos"]:
    """The entries a patch replaces: s ≤ t (s < t with ``diagonal="keep"``) and s ≥
    ``keep_keys``."""
    lower, strict = causal_masks(T, device)
    mask = lower if diagonal == "fit" else strict
    return mask & (torch.arange(T, device=device) >= keep_keys)[None]


def shift_invariant_part(
    scores: Float[Tensor, "*batch query_pos key_pos"], diagonal: str = "fit",
    keep_keys: int = 0,
) -> Float[Tensor, "*batch query_pos key_pos"]:
    """Each matrix's shift-invariant part on the causal triangle: A(t, s), s < t, replaced
    by the mean of its sub-diagonal g(t − s) (the Track A fit, float64 sums); the diagonal
    by its mean (``diagonal="fit"``) or kept (``"keep"``); the first ``keep_keys`` key
    columns kept and left out of the fit; entries above the diagonal keep their values
    (masked fills included)."""
    T = scores.shape[-1]
    fit = replace_mask(T, "fit", keep_keys, scores.device)
    z = torch.where(fit, scores.double(), 0.0).flatten(-2)
    idx = lag_index(T, scores.device).flatten().expand_as(z)
    sums = torch.zeros(*z.shape[:-1], T, dtype=torch.float64, device=scores.device)
    counts = (T - keep_keys - torch.arange(T, dtype=torch.float64, device=scores.device))
    g = sums.scatter_add_(-1, idx, z) / counts.clamp(min=1)
    keep = replace_mask(T, diagonal, keep_keys, scores.device)
    return torch.where(keep, kernel_from_g(g).to(scores.dtype), scores)


def next_token_loss(logits: Float[Tensor, "batch pos d_vocab"],
                    tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, " batch"]:
    """Mean cross-entropy of positions 0..T−2 predicting tokens 1..T−1, per row."""
    b, T, _ = logits.shape
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(),
                         reduction="none")
    return ce.view(b, T - 1).double().mean(-1)


# ------------------------------------------------------------------ the passes
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
    def loss_ablated(self) -> Float[np.ndarray, "n_seqs layer head_index"]:
        return self.losses["ablated"]

    @property
    def dloss_patched(self) -> Float[np.ndarray, "n_seqs layer head_index"]:
        return self.dloss("patched")

    @property
    def dloss_ablated(self) -> Float[np.ndarray, "n_seqs layer head_index"]:
        return self.dloss("ablated")


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

    hooks = [(scores_hook_name(layer), observe) for layer in range(L)]
    losses = []
    with torch.no_grad(), bridge.hooks(fwd_hooks=hooks):
        for start in tqdm(range(0, len(ids), batch_size), desc="clean pass",
                          disable=not progress, unit="batch"):
            chunk = ids[start:start + batch_size].to(dev)
            losses.append(next_token_loss(bridge(chunk), chunk))
    return torch.cat(losses), sums / len(ids)


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


def pooled_kernels(g_pooled: Float[Tensor, "layer head_index lag"] | None,
                   mean_scores: Float[Tensor, "layer head_index query_pos key_pos"],
                   keep_keys: int = 0) -> Float[Tensor, "layer head_index query_pos key_pos"]:
    """K(t, s) = g_pooled(t − s) for Δ ≥ 1 and, for Δ = 0, the mean of the diagonal of the
    mean scores (the pooled diagonal mean over the evaluation sequences). Without
    ``g_pooled`` (or with ``keep_keys``) g is fitted to the mean scores themselves."""
    if g_pooled is None or keep_keys:
        return shift_invariant_part(mean_scores, "fit", keep_keys)
    g0 = torch.diagonal(mean_scores, dim1=-2, dim2=-1).double().mean(-1, keepdim=True)
    g = torch.cat([g0, g_pooled.to(g0)], dim=-1)
    return kernel_from_g(g).float()


def run_kernel_patching(
    model, eval_tokens: Int[Tensor, "batch pos"], *, g_pooled: np.ndarray | None = None,
    mode: str = "pooled", diagonal: str = "fit", keep_keys: int = 0, sink_keys: int = 1,
    layers=None, head_chunk: int | None = None, max_seqs: int | None = None,
    batch_size: int = 4, expand: bool | None = None, progress: bool = True,
) -> PatchingResult:
    """Clean, kernel-patched and mean-ablated losses of every head (see the module).

    ``g_pooled`` [layer, head_index, lag]: the pooled kernel of ``mode="pooled"`` (None:
    fitted to the patched sequences' mean scores); ``keep_keys``: key columns the main
    patch leaves clean; ``sink_keys`` > 0 adds the ``"patched_sink"`` variant that keeps
    that many first key columns (0: no extra variant); ``expand``: None tries the
    mid-forward expansion (one sequence per forward) and falls back to repeating the
    tokens; ``batch_size``: sequences per forward of the clean pass and of the repeat
    path."""
    t0 = time.time()
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {MODES}")
    if diagonal not in DIAGONALS:
        raise ValueError(f"diagonal={diagonal!r}: choose one of {DIAGONALS}")
    ids = eval_tokens[:max_seqs] if max_seqs else eval_tokens
    n, T = ids.shape
    spec, dev, bridge = model.spec, model.device, model.bridge
    L, H = spec.n_layers, spec.n_heads
    for name, k in (("keep_keys", keep_keys), ("sink_keys", sink_keys)):
        if not 0 <= k < T - 1:
            raise ValueError(f"{name}={k}: need 0 <= {name} < T - 1 = {T - 1}")
    layers = list(range(L)) if layers is None else sorted(int(x) for x in layers)
    head_chunk = head_chunk or H
    chunks = [list(range(h, min(H, h + head_chunk))) for h in range(0, H, head_chunk)]
    loss_clean, mean_scores = _clean_pass(model, ids, batch_size, progress)
    variants = {"patched": keep_keys}
    if sink_keys:
        variants["patched_sink"] = sink_keys
    kernels = dict.fromkeys(variants)
    kernel_from = "per-sequence fit"
    if mode == "pooled":
        g = None
        if g_pooled is not None:
            g = torch.as_tensor(np.asarray(g_pooled), device=dev)
            if g.shape != (L, H, T - 1):
                raise ValueError(f"g_pooled has shape {tuple(g.shape)}, expected "
                                 f"{(L, H, T - 1)} (was the result measured at this length?)")
        kernels = {v: pooled_kernels(g, mean_scores, k) for v, k in variants.items()}
        kernel_from = ("result.g_pooled" if g is not None and not keep_keys
                       else "mean scores of the patched sequences")
    losses = {v: np.full((n, L, H), np.nan) for v in (*variants, "ablated")}
    clean_row = np.full((n, L), np.nan)
    n_forwards = -(-n // batch_size)
    try_expand = expand is None or expand

    def run(patcher: _Patcher, rows: slice, use_expand: bool) -> Tensor:
        tok = ids[rows].to(dev)
        hooks = [(scores_hook_name(patcher.layer), patcher.scores)]
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

    step = 1 if try_expand else batch_size
    bar = tqdm(total=len(layers) * len(chunks) * -(-n // step), desc="kernel patching",
               disable=not progress, unit="fwd")
    start = 0
    while start < n:
        rows = slice(start, min(n, start + step))
        for layer in layers:
            for heads in chunks:
                patcher = _Patcher(layer, heads, H, mode, diagonal, mean_scores,
                                   [(k, None if kernels[v] is None else kernels[v][layer])
                                    for v, k in variants.items()])
                try:
                    loss = run(patcher, rows, try_expand)
                except RuntimeError as err:
                    if not try_expand or expand:
                        raise
                    warnings.warn(f"mid-forward expansion failed ({err}); repeating the "
                                  "tokens at the input instead", RuntimeWarning, stacklevel=2)
                    try_expand, step = False, batch_size
                    rows = slice(start, min(n, start + step))
                    bar.total = bar.n + len(layers) * len(chunks) * -(-(n - start) // step)
                    loss = run(patcher, rows, False)
                loss = loss.cpu().numpy()
                clean_row[rows, layer] = loss[:, 0]
                for v, block in zip(losses, patcher.blocks):
                    losses[v][rows, layer, heads] = loss[:, block.cpu().numpy()]
                n_forwards += 1
                bar.update(1)
        start = rows.stop
    bar.close()
    return PatchingResult(loss_clean.cpu().numpy(), clean_row, losses, mode, diagonal,
                          keep_keys, sink_keys, kernel_from, try_expand, n_forwards,
                          round(time.time() - t0, 1))


# ------------------------------------------------------------------ table, figure
def bootstrap(dloss: dict[str, np.ndarray], ratios: dict[str, tuple[str, str]],
              n_boot: int = 1000, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded percentile 95% intervals over sequences (axis 0) of the mean of each array
    in ``dloss`` and of each ratio of means ``ratios[name] = (numerator, denominator)``:
    ``{name: (lo, hi)}`` arrays shaped like one sequence's."""
    first = next(iter(dloss.values()))
    n = first.shape[0]
    nan = np.full(first.shape[1:], np.nan)
    if n < 2:
        return {k: (nan, nan) for k in (*dloss, *ratios)}
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    means = {k: v[idx].mean(1) for k, v in dloss.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, (num, den) in ratios.items():
            means[name] = means[num] / means[den]
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, x in means.items():
            x = np.where(np.isfinite(x), x, np.nan)
            out[name] = (np.nanpercentile(x, 2.5, axis=0), np.nanpercentile(x, 97.5, axis=0))
    return out


def patching_table(res: PatchingResult, extra: dict[str, np.ndarray] | None = None,
                   n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per patched (layer, head): mean losses, the loss changes ``dloss_patched``,
    ``dloss_ablated`` (and ``dloss_patched_sink``), the normalised patching loss
    ``dloss_ratio`` = dloss_patched / dloss_ablated (and ``dloss_ratio_sink``), seeded
    bootstrap intervals (``_lo``, ``_hi``), ``ablation_matters`` (the ablation interval
    lies above 0) and the ``extra`` per-head arrays [layer, head_index] (e.g. Track A's
    pooled R²)."""
    n, L, H = res.loss_patched.shape
    dloss = {f"dloss_{v}": res.dloss(v) for v in res.losses}
    ratios = {"dloss_ratio": ("dloss_patched", "dloss_ablated")}
    if "patched_sink" in res.losses:
        ratios["dloss_ratio_sink"] = ("dloss_patched_sink", "dloss_ablated")
    ci = bootstrap(dloss, ratios, n_boot, seed)
    layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    cols = {"layer": layer.ravel(), "head": head.ravel(), "mode": res.mode,
            "diagonal": res.diagonal, "keep_keys": res.keep_keys,
            "sink_keys": res.sink_keys, "kernel_from": res.kernel_from, "n_seqs": n,
            "loss_clean": res.loss_clean.mean()}
    for v, loss in res.losses.items():
        cols[f"loss_{v}"] = loss.mean(0).ravel()
    means = {k: v.mean(0) for k, v in dloss.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, (num, den) in ratios.items():
            r = means[num] / means[den]
            means[name] = np.where(np.isfinite(r), r, np.nan)
    for name, mean in means.items():
        cols[name] = mean.ravel()
        cols[f"{name}_lo"], cols[f"{name}_hi"] = (x.ravel() for x in ci[name])
    cols["ablation_matters"] = (ci["dloss_ablated"][0] > 0).ravel()
    for name, arr in (extra or {}).items():
        cols[name] = np.asarray(arr).ravel()
    table = pd.DataFrame(cols)
    return table[np.isfinite(table["dloss_patched"])].reset_index(drop=True)


def kernel_patching(model, eval_tokens, result=None, *, mode: str = "pooled",
                    diagonal: str = "fit", keep_keys: int = 0, sink_keys: int = 1,
                    max_seqs: int | None = MAX_SEQS, layers=None,
                    head_chunk: int | None = None, batch_size: int = 4,
                    expand: bool | None = None, n_boot: int = 1000, seed: int = 0,
                    progress: bool = True) -> pd.DataFrame:
    """Notebook entry: the per-head patching table (see :func:`patching_table`) on the first
    ``max_seqs`` evaluation sequences (``eval_tokens``: int tensor [n, T] or strings).
    ``result`` (the condition's :class:`~poskernel_tl.ConditionResult`) supplies the pooled
    kernel and Track A's R²; without it the pooled kernel is fitted to the patched
    sequences."""
    ids = as_tokens(model, eval_tokens)
    check_tokens(model, ids, "evaluation tokens")
    if result is not None and result.length != ids.shape[1]:
        raise ValueError(f"result measured at T={result.length}, tokens have T={ids.shape[1]}")
    res = run_kernel_patching(
        model, ids, g_pooled=None if result is None else result.g_pooled, mode=mode,
        diagonal=diagonal, keep_keys=keep_keys, sink_keys=sink_keys, layers=layers,
        head_chunk=head_chunk,
        max_seqs=max_seqs, batch_size=batch_size, expand=expand, progress=progress)
    extra = {} if result is None else {"R2_pooled": result.r2_pooled,
                                       "R2_pooled_nosink": result.r2_pooled_nosink}
    table = patching_table(res, extra, n_boot, seed)
    table["n_forwards"], table["seconds"] = res.n_forwards, res.seconds
    return table


@dataclass(frozen=True)
class KernelPatchingOptions:
    max_seqs: int = option(2, "evaluation sequences patched; each costs about R·L²/2 block "
                              "evaluations (≈ 450 single-sequence forwards on SmolLM2)")
    sink_keys: int = option(1, "key columns the second patch keeps clean (0: no second "
                               "patch, about a third cheaper)")
    mode: Literal["pooled", "per_seq"] = option(
        "pooled", "pooled: the condition's pooled kernel; per_seq: each sequence's own fit")


def analyze(inputs: AnalysisInputs, options: KernelPatchingOptions) -> pd.DataFrame:
    """``poskernel analyze kernel-patching``: kernel patching of every head on the first
    ``max_seqs`` evaluation sequences (centering sequences are not used)."""
    return kernel_patching(inputs.model, inputs.eval_tokens, inputs.result,
                           mode=options.mode, sink_keys=options.sink_keys,
                           max_seqs=options.max_seqs, batch_size=inputs.batch_size,
                           progress=inputs.progress)


def plot_kernel_patching(table: pd.DataFrame, title: str = "") -> Figure:
    """Layer × head heatmaps: the normalised loss change dloss_patched / dloss_ablated
    (clipped to [−0.25, 1.25]; grey where the ablation interval reaches 0, so that the
    ratio means nothing), the same with the sink kept when the table has it, and Track A's
    pooled R² when the table has it. The backend is not touched."""
    import matplotlib

    L, H = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    grid = lambda col: _grid(table, col, L, H)
    panels = [("dloss_ratio", "kernel / mean ablation", "RdBu_r", (-0.25, 1.25))]
    if "dloss_ratio_sink" in table:
        panels.append(("dloss_ratio_sink", "kernel + sink / mean ablation", "RdBu_r",
                       (-0.25, 1.25)))
    if "R2_pooled" in table:
        panels.append(("R2_pooled", "Track A pooled R²", "viridis", (0.0, 1.0)))
    fig = Figure(figsize=(3.4 * len(panels) + 1, 0.22 * L + 2))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    matters = grid("ablation_matters") > 0
    for ax, (col, label, cmap, (lo, hi)) in zip(axes, panels):
        values = np.clip(grid(col), lo, hi)
        if col.startswith("dloss_ratio"):
            values = np.where(matters, values, np.nan)
        im = ax.imshow(values, cmap=matplotlib.colormaps[cmap].with_extremes(bad="0.85"),
                       vmin=lo, vmax=hi, aspect="auto", interpolation="nearest")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(label, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title or f"kernel patching ({table['mode'].iloc[0]} g, "
                 f"{int(table['n_seqs'].iloc[0])} sequences; grey: ablation not significant)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def _grid(table: pd.DataFrame, col: str, L: int, H: int) -> np.ndarray:
    out = np.full((L, H), np.nan)
    out[table["layer"].to_numpy(), table["head"].to_numpy()] = table[col].astype(float)
    return out


SPEC = AnalysisSpec(
    name="kernel-patching", title="Kernel patching", compute=analyze,
    options=KernelPatchingOptions, needs_result=True, figure=plot_kernel_patching,
    columns=("dloss_patched", "dloss_ablated", "dloss_ratio"),
    head_rows=(("dloss_patched", "Δloss, kernel patched (nats)"),
               ("dloss_patched_sink", "Δloss, kernel patched, sink kept (nats)"),
               ("dloss_ablated", "Δloss, mean-ablated (nats)"),
               ("dloss_ratio", "kernel / ablation (normalised loss)"),
               ("dloss_ratio_sink", "kernel + sink / ablation")),
    guide="Each head's scores are replaced by its pooled kernel g(t − s) and the loss "
          "change is divided by that of mean-ablating the head: 0 means the kernel is all "
          "the head contributes, 1 means it does no better than the mean (the ratio means "
          "something only where ablation costs loss; grey cells in the figure).")


__all__ = ["SPEC", "KernelPatchingOptions", "PatchingResult", "analyze", "kernel_patching",
           "next_token_loss", "patching_table", "plot_kernel_patching", "pooled_kernels",
           "run_kernel_patching", "shift_invariant_part"]
