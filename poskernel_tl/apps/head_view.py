"""Interactive inspection of one attention head on one text: :func:`inspect_head`.

One forward pass with the capture hooks (only the chosen layer is hooked) gives the
head's pre-softmax logits A(t, s) (``hook_attn_scores`` when the bridge exposes it, else
q·kᵀ times the model's logit scale from the post-rotary ``hook_rot_q``/``hook_rot_k``),
its attention pattern (``hook_pattern``, else the softmax of the causal logits), the
shift-invariant fit g(Δ) with its R² and residual, and the spectrum of g(Δ) with the
spectral alignment against the rotary frequencies θᵢ. The result, a :class:`HeadView`,
renders in Jupyter (``_repr_html_``) and saves as a standalone HTML page.

The ``poskernel inspect`` subcommand (:mod:`poskernel_tl.apps.head_view_cli`) does the same
from the command line.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from poskernel_tl.analyses.spectral.processing import two_sided_for_spectrum
from poskernel_tl.analyses.spectral.summary import alignment_frames, alignment_line, kernel_spectrum
from poskernel_tl.apps.head_inputs import check_head, token_ids
from poskernel_tl.apps.head_statistics import head_statistics, statistic_values
from poskernel_tl.apps.head_zoom import HeadZoom
from poskernel_tl.data.sequences import token_strings
from poskernel_tl.fit.blocks import fit_mask
from poskernel_tl.fit.counts import lag_counts
from poskernel_tl.fit.kernel_class import head_kernels
from poskernel_tl.fit.toeplitz import shift_invariance_r2, shift_invariance_r2_two_sided, two_sided
from poskernel_tl.fit.variants import variant_r2
from poskernel_tl.hooks import capture_qk, scores_hook_name
from poskernel_tl.hooks.names import scores_hook_is_logits
from poskernel_tl.io import sentence
from poskernel_tl.mask import Mask
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel
from poskernel_tl.models.softmax_ops import attention_pattern, head_logits, sink_logits
from poskernel_tl.reducers.track_a_result import NO_SINK
from poskernel_tl.report import (
    SHARED,
    HeadPageData,
    assets_rel_for,
    first_display,
    head_html,
    write_assets,
    write_head_page,
)
from poskernel_tl.report.head_page import declared
from poskernel_tl.report.viewer_long import NOTEBOOK_FACTOR_BYTES
from poskernel_tl.schema import check_shapes
from poskernel_tl.statistics.perm_null import joint_permutations

PATTERN_HOOK = "{site}.hook_pattern"
VIEW_NULL_PERMS = 19  # permutations of the head view's null (its class's content rule)


# ----------------------------------------------------------------------- the view
@dataclass(repr=False)
class HeadView:
    """One head on one sequence. ``logits`` holds A(t, s) for s ≤ t and NaN above the
    diagonal (the causal mask); the fit uses s < t only: ``g[Δ−1]`` is the mean of
    sub-diagonal Δ, ``r2`` its R² (equal to :func:`poskernel_tl.shift_invariance_r2` of
    the hooked scores), ``r2_nosink`` the same fit without the key column s = 0,
    ``residual`` A − g(t−s) for s < t (NaN elsewhere). For a bidirectional model
    (``g_back`` not None) ``logits`` is the whole matrix, the fit reads every entry off the
    diagonal, ``g_back[Δ−1]`` is the mean of super-diagonal Δ (lag −Δ, keys after the
    query), ``g_self`` the diagonal's mean, and the spectrum is that of the two-sided g.
    ``spectrum`` is ``(omega, power)`` of g(Δ), ω in rad/token; ``alignment`` the
    :func:`spectral_alignment` dict for rotary models, else None. ``tokens`` are the
    token strings, one per position. ``kernel``: the class and descriptors of this
    sequence's g (:mod:`poskernel_tl.fit.kernel_class`, against a 19-permutation null of this
    matrix); ``statistics``: the registered statistics' per-head values on this sequence
    (:mod:`poskernel_tl.apps.head_statistics`). ``q`` (the head's post-rotary queries),
    ``k`` (its kv head's keys) and ``logit_scale``: past 256 tokens the page shows the whole
    matrix as blocks and zooms into any window from them
    (:mod:`poskernel_tl.report.viewer_long`)."""

    model_name: str
    layer: int
    head: int
    kv_head: int
    tokens: list[str]
    token_ids: Int[np.ndarray, " pos"]
    logits: Float[np.ndarray, "query_pos key_pos"]
    pattern: Float[np.ndarray, "query_pos key_pos"]
    g: Float[np.ndarray, " lag"]
    r2: float
    r2_nosink: float
    residual: Float[np.ndarray, "query_pos key_pos"]
    spectrum: tuple[Float[np.ndarray, " freq"], Float[np.ndarray, " freq"]]
    alignment: dict | None
    thetas: Float[np.ndarray, " pair"] | None = None
    scores_from: str = "hook_attn_scores"
    pattern_from: str = "hook_pattern"
    notes: list[str] = field(default_factory=list)
    g_back: Float[np.ndarray, " lag"] | None = None
    g_self: float | None = None
    last: int | None = None  # a sliding window's last kept offset (the fit reads Δ ≤ it)
    chunk: int | None = None  # a chunked mask's chunk where it binds (the fit reads within it)
    kernel: dict | None = None  # this sequence's kernel descriptors and class
    # the zoom of a long view: post-rotary q of the head, k of its kv head, logits = scale·q·kᵀ
    q: Float[np.ndarray, "pos d_head"] | None = None
    k: Float[np.ndarray, "pos d_head"] | None = None
    logit_scale: float | None = None
    # every registered statistic's per-head columns on this sequence (label -> value)
    statistics: dict[str, float] = field(default_factory=dict)
    # the statistics' parts on this sequence (their declared panels are drawn)
    parts: dict = field(default_factory=dict)

    @property
    def two_sided(self) -> bool:
        return self.g_back is not None

    @property
    def mask(self) -> Mask:
        """The entries the view's fit reads (:class:`~poskernel_tl.mask.Mask`)."""
        return Mask(len(self.tokens), not self.two_sided, self.last, self.chunk)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def title(self) -> str:
        return f"{self.model_name} · L{self.layer}H{self.head} · {self.n_tokens} tokens"

    def __repr__(self) -> str:
        return (f"HeadView({self.model_name!r}, layer={self.layer}, head={self.head}, "
                f"T={self.n_tokens}, r2={self.r2:.4f}, r2_nosink={self.r2_nosink:.4f})")

    def page_data(self):
        """This view as :class:`poskernel_tl.report.HeadPageData`."""
        notes = [f"Logits from {self.scores_from}; pattern from {self.pattern_from}. "
                 "g(Δ) (drawn as Track A) and its spectrum are this one sequence's fit; "
                 "Track B needs many sequences (pk.measure).", *self.notes]
        if self.last is not None and self.chunk is None:
            notes.append(f"The layer attends within a sliding window: the fit reads the "
                         f"offsets 1 ≤ t − s ≤ {self.last} only (g is not defined past).")
        if self.chunk is not None:
            notes.append(f"The layer attends within chunks of {self.chunk} positions: the fit "
                         "reads the entries t, s of one chunk only, each offset counted "
                         "where the mask keeps it.")
        if self.thetas is not None:
            notes.append(alignment_line(self.alignment))
        tables = alignment_frames(self.alignment, "this sequence's g(Δ)")
        if self.kernel is not None:
            tables["Kernel class of this sequence's g(Δ) (exploratory)"] = \
                pd.DataFrame({"quantity": list(self.kernel), "value": list(self.kernel.values())})
        if self.statistics:
            tables["Per-head statistics on this sequence"] = pd.DataFrame(
                {"quantity": list(self.statistics), "value": list(self.statistics.values())})
        numbers, panels = declared(self.parts, self.layer, self.head)
        return HeadPageData(
            title=self.title, tokens=list(self.tokens), pattern=self.pattern,
            logits=self.logits, g_trackA=self.g, g_trackA_back=self.g_back,
            two_sided=self.two_sided, spectrum=self.spectrum, thetas=self.thetas,
            tables=tables,
            r2_values={"R² without the sink column (key 0)": self.r2_nosink},
            notes=notes, last=self.last, chunk=self.chunk, q=self.q, k=self.k,
            logit_scale=self.logit_scale,
            fit=(self.r2, self.g, self.g_back), numbers=numbers, panels=panels)

    def to_html(self, assets_rel: str | None = None) -> str:
        """The view as an HTML block; ``assets_rel=None`` inlines the circuitsvis bundle."""
        return head_html(self.page_data(), assets_rel=assets_rel)

    def _repr_html_(self) -> str:
        """In a notebook the first view carries Plotly, circuitsvis and the viewer; later
        views reuse them (a few hundred kB each instead of ≈ 6 MB). A long view carries
        q and k whole up to ``NOTEBOOK_FACTOR_BYTES``, else its first window's only
        (:meth:`zoom` draws any other). ``to_html()`` and ``save()`` stay self-contained."""
        first = first_display("viewer", carries=("plotly",))
        return head_html(self.page_data(), assets_rel=None if first else SHARED,
                         factor_budget=NOTEBOOK_FACTOR_BYTES)

    def zoom(self, rows: tuple[int, int], keys: tuple[int, int] | None = None) -> HeadZoom:
        """The window of query rows ``rows`` = (R0, R1) and keys ``keys`` (default the
        same), ends included, at full resolution from this view's q and k: displays in a
        notebook, ``.save(path)`` writes it as a page. At most 512 rows and keys."""
        return HeadZoom.of(self.page_data(), rows, keys)

    def save(self, path, *, inline: bool = True) -> Path:
        """Write the view as a standalone HTML page at ``path`` and return the path.

        ``inline=True`` (default): one self-contained file with the circuitsvis bundle
        inside (≈ 1.3 MB more), to mail or open anywhere. ``inline=False``: the bundle
        is written once to ``assets/circuitsvis.js`` beside the page and loaded by the
        relative path ``assets/…`` (keep the folder together), for saving many views."""
        path = Path(path)
        assets_rel = None
        if not inline:
            write_assets(path.parent)
            assets_rel = assets_rel_for(path, path.parent)
        return write_head_page(path, self.page_data(), assets_rel=assets_rel)


# ------------------------------------------------------------------ the forward pass
def head_tensors(model: LoadedModel, ids: Int[Tensor, " pos"], layer: int, head: int, *,
                 hook_scores: bool | None = None) -> dict[str, Tensor | str]:
    """One forward pass hooking ``layer`` only: the head's logits A [query_pos key_pos]
    (``hook_attn_scores``, or q·kᵀ·scale from the q/k hooks when the bridge has no
    scores hook or ``hook_scores=False``), its pattern (``hook_pattern``, else the
    softmax of A over s ≤ t), and its q [pos d_head] and k [pos d_head] (kv head)."""
    bridge, terms = model.bridge, model.spec.layer_terms(layer)
    site = model.site(layer)
    if hook_scores is None:  # a BERT bridge's scores hook holds the pattern: use q·kᵀ
        hook_scores = scores_hook_name(site) in bridge.hook_dict and not terms and \
            scores_hook_is_logits(bridge, site)
    kv = int(model.kv_heads[head])
    got: dict = {}

    def on_layer(c) -> None:
        got["q_layer"], got["k_layer"] = c.q[0].detach().clone(), c.k[0].detach().clone()
        got["q"], got["k"] = got["q_layer"][:, head], got["k_layer"][:, kv]
        if c.scores is not None:
            got["scores"] = c.scores[0, head].detach().clone()

    def on_pattern(x: Tensor, hook) -> None:
        got["pattern"] = x[0, head].detach().clone()

    pattern_name = PATTERN_HOOK.format(site=site)
    extra = [(pattern_name, on_pattern)] if pattern_name in bridge.hook_dict else []
    with torch.no_grad(), capture_qk(bridge, on_layer, scores=hook_scores, layers=[layer],
                                     schemes=model.spec.layers) as capture, \
            bridge.hooks(fwd_hooks=extra):
        capture.forward(ids[None].to(model.device))
    q, k = got["q"], got["k"]
    if "scores" in got:
        A, scores_from = got["scores"], "hook_attn_scores"
    elif terms:  # what the softmax reads (ALiBi in the paper's form, caps, temperature)
        A = head_logits(q, k, terms, head, model.logit_scale)
        scores_from = f"q·kᵀ × logit scale with {', '.join(terms.labels())} (hook q/k)"
    else:
        A, scores_from = model.logit_scale * (q @ k.T), "q·kᵀ × logit scale (hook q/k)"
    T = A.shape[-1]
    causal = model.spec.causal
    removed = ~Geometry.of(model.spec, T).mask(layer).kept(device=A.device, diagonal=True)
    if "pattern" in got:
        pattern, pattern_from = got["pattern"], "hook_pattern"
    else:
        sinks = sink_logits(terms, A.device)  # the model's own normaliser (gpt-oss)
        pattern = attention_pattern(A.double().masked_fill(removed, float("-inf")),
                                    None if sinks is None else sinks[head])
        pattern_from = "softmax of the causal logits" if causal else "softmax of the logits"
    return {"scores": A, "pattern": pattern, "q": q, "k": k, "scores_from": scores_from,
            "pattern_from": pattern_from, "q_layer": got["q_layer"], "k_layer": got["k_layer"]}


def fit_one(A: Float[Tensor, "query_pos key_pos"], causal: bool,
            last: int | None = None, chunk: int | None = None) -> dict:
    """The head's fit on one matrix: ``r2``, ``g``, ``g_back``/``g_self`` (None when
    causal), ``residual`` (A − g(t − s) where the fit reads, NaN elsewhere) and ``logits``
    (A with NaN above the diagonal when causal). ``last``: a sliding window's last kept
    offset (the fit reads t − s ≤ last; g and the residual are NaN past it); ``chunk``:
    a chunked mask's (the fit reads within one chunk; the residual is NaN across)."""
    T = A.shape[-1]
    if causal:
        (r2, g), g_back, g_self = shift_invariance_r2(A, last, chunk), None, None
        full = g
    else:
        r2, g, g_back, g_self = shift_invariance_r2_two_sided(A, last)
        full = torch.from_numpy(two_sided(g.cpu().numpy(), g_back.cpu().numpy(),
                                          float(g_self)))
    lag = (torch.arange(T)[:, None] - torch.arange(T)[None]).to(A.device)
    fitted = torch.from_numpy(fit_mask(Mask(T, causal, last, chunk))).to(A.device)
    index = (lag.clamp(min=1) - 1) if causal else (lag + T - 1)
    residual = torch.where(fitted, A.double() - full.to(A.device)[index],
                           torch.full_like(A, math.nan, dtype=torch.float64))
    logits = A.float().masked_fill(lag < 0, math.nan) if causal else A.float()
    to_np = lambda x: None if x is None else x.cpu().numpy()
    return {"r2": float(r2), "g": to_np(g), "g_back": to_np(g_back),
            "g_self": None if g_self is None else float(g_self),
            "residual": to_np(residual), "logits": to_np(logits)}


def position_permutation_null(A: Float[Tensor, "query_pos key_pos"], causal: bool,
                              last: int | None, n_perm: int = VIEW_NULL_PERMS,
                              chunk: int | None = None) -> Float[np.ndarray, " perm"]:
    """R² of the fit to A[π][:, π] for ``n_perm`` joint position permutations π: the run's
    permutation null (:func:`~poskernel_tl.statistics.perm_null.joint_permutations`, seed
    0) on this one matrix, fitted as the view fits A."""
    out = []
    for pi in joint_permutations(A.shape[-1], n_perm).to(A.device):
        Ap = A[pi][:, pi]
        out.append(shift_invariance_r2(Ap, last, chunk)[0] if causal else
                   shift_invariance_r2_two_sided(Ap, last)[0])
    return torch.stack(out).double().cpu().numpy()


def kernel_of(fit: dict, A: Float[Tensor, "query_pos key_pos"], last: int | None,
              thetas: np.ndarray | None, chunk: int | None = None) -> dict:
    """:func:`~poskernel_tl.fit.kernel_class.head_kernels` of this one sequence's fit, against
    :func:`position_permutation_null`: class first, then the descriptors."""
    causal = fit["g_back"] is None
    counts = lag_counts(A.shape[-1], last=last, chunk=chunk).numpy()
    sink = np.where(counts > 0, A[1:, 0].double().cpu().numpy(), np.nan)
    back = None if causal else fit["g_back"][None, None]
    null = position_permutation_null(A, causal, last, chunk=chunk)
    row = head_kernels(fit["g"][None, None], sink[None, None], counts[None],
                       np.array([[fit["r2"]]]), null[:, None, None], back, thetas).iloc[0]
    return {"kernel_class": row["kernel_class"],
            **row.drop(["layer", "head", "kernel_class"]).rename({"R2_pooled": "R2"}).to_dict()}


def _usage(model: LoadedModel, q: Tensor, k: Tensor) -> np.ndarray | None:
    """Frequency usage of each rotary pair: mean |q| pair norm × mean |k| pair norm."""
    pairs = model.rotary_pairs
    if pairs is None:
        return None
    first, second = (p.to(q.device) for p in pairs)

    def norm(x: Tensor) -> Tensor:
        return torch.sqrt(x[:, first].double() ** 2 + x[:, second].double() ** 2).mean(0)

    return (norm(q) * norm(k)).cpu().numpy()


def inspect_head(model: LoadedModel, text_or_tokens, layer: int, head: int, *,
                 max_tokens: int | None = None) -> HeadView:
    """Inspect attention head ``head`` of ``layer`` on one text (or one sequence of
    token ids) in one forward pass; see :class:`HeadView` for what it holds.

    ``model``: a :class:`LoadedModel` (``pk.load_model`` or ``LoadedModel.from_bridge``).
    Strings are tokenized without special tokens; ``max_tokens`` keeps the first tokens
    only. Raises ValueError for a layer or head out of range (naming the range), fewer
    than 3 tokens, or more than the model's context."""
    spec = model.spec
    check_head(spec.name, spec.n_layers, spec.n_heads, layer, head)
    layer, head = int(layer), int(head)
    ids = token_ids(model, text_or_tokens, max_tokens)
    geometry = Geometry.checked(spec, len(ids), what="a sequence of")
    t = head_tensors(model, ids, layer, head)
    mask = geometry.mask(layer)
    last, chunk = mask.window_last, mask.chunk
    fit = fit_one(t["scores"], spec.causal, last, chunk)
    r2_nosink = variant_r2(t["scores"], NO_SINK, spec.causal, last, chunk)
    thetas = spec.rotary_frequencies(layer)
    usage = _usage(model, t["q"], t["k"]) if thetas is not None else None
    if usage is not None and len(usage) != len(thetas):
        usage = None
    g_spec = fit["g"][:last] if spec.causal else two_sided_for_spectrum(
        fit["g"][:last], fit["g_back"][:last])  # the offsets the window keeps
    omega, power, alignment, note = kernel_spectrum(g_spec, thetas, usage=usage,
                                                    two_sided=not spec.causal)
    notes = [sentence(model.weights_note)] if spec.loader == "gguf" else []
    if note:
        notes.append(note)
    view = HeadView(
        model_name=spec.name, layer=layer, head=head, kv_head=int(model.kv_heads[head]),
        tokens=token_strings(model.tokenizer, ids.tolist()), token_ids=ids.numpy(),
        logits=fit["logits"], pattern=t["pattern"].float().cpu().numpy(), g=fit["g"],
        r2=fit["r2"], r2_nosink=r2_nosink, residual=fit["residual"], g_back=fit["g_back"],
        g_self=fit["g_self"], last=last, chunk=chunk,
        kernel=kernel_of(fit, t["scores"], last, thetas, chunk),
        spectrum=(omega, power), alignment=alignment, thetas=thetas,
        scores_from=str(t["scores_from"]), pattern_from=str(t["pattern_from"]), notes=notes,
        q=t["q"].float().cpu().numpy(), k=t["k"].float().cpu().numpy(),
        logit_scale=float(model.logit_scale))
    view.parts = head_statistics(model, geometry, layer, t["q_layer"], t["k_layer"])
    view.statistics = statistic_values(view.parts, layer, head)
    T = len(ids)  # the view's arrays against the text's length (cheap: shapes only)
    check_shapes(view, {"pos": T, "query_pos": T, "key_pos": T, "lag": T - 1},
                 error=RuntimeError)
    return view


__all__ = ["HeadView", "inspect_head"]
