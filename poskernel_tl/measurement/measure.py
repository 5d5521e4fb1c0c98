"""``pk.measure``: Track A and Track B for a set of sequences, as a value.

Pass 1 runs the centering sequences (if any) and keeps per-position q/k means. Pass 2
runs the evaluation sequences once and feeds Track A, the Track B Gram accumulator,
the rotary frequency-usage reducer (and, on request, the whitened Gram and a few full
logit matrices) from the same hooked tensors. Nothing is written to disk.

Every forward stops once the last layer's q/k are captured (nothing reads the model's
output). The run is planned against a memory budget before it starts
(:func:`poskernel_tl.plan.batching.plan_measure`): where Track B's accumulator for every layer
does not fit, pass 2 carries it for the last block of layers only and one more pass per
other block accumulates Track B alone, its forward stopped after the block's last layer.
The numbers are the same either way.

Track A forms its per-lag sums and sums of squares from the post-rotary q and k without
the T×T logits (:mod:`poskernel_tl.reducers.lag_sums`); ``scores="hook"`` (read
``hook_attn_scores``) and ``scores="qk"`` (form q·kᵀ) keep the materialised reference
path. Both give the same numbers.

A bidirectional model (``model.spec.causal`` false: no causal mask) is fitted on both
triangles — Track A, Track B, the permutation null and the whitened Gram — with one g per
signed lag; the other side's g and the diagonal's mean come in the ``*_back`` and
``*_self`` fields (see :mod:`poskernel_tl.reducers.track_a`). Provenance records
``"mask": "causal"`` or ``"none"``. ``scores="hook"`` is refused there (what an encoder
bridge's ``hook_attn_scores`` holds need not be scale·q·kᵀ), and so is grouped-query
attention (the upper triangle's sums swap q and k).
"""

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from poskernel_tl import constants as C
from poskernel_tl.data.inputs import CenteringTokens, Tokens, checked_tokens
from poskernel_tl.errors import UserError
from poskernel_tl.hooks import capture_qk, scores_hook_name
from poskernel_tl.measurement.pe_kernel import NoPositionTableError, is_post_ln, pe_kernel_part
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel, dtype_name
from poskernel_tl.models.scheme import summary as scheme_summary
from poskernel_tl.plan.batching import Plan, Workload, batched, plan_measure
from poskernel_tl.plan.config import MeasureConfig
from poskernel_tl.plan.groups import Groups, grouping, layer_groups
from poskernel_tl.reducers import (
    CenteringMeans,
    GramReducer,
    GramResult,
    LayerBatch,
    Moments,
    MomentsReducer,
    TrackAReducer,
    Workspace,
)
from poskernel_tl.reducers.gram import concat_layers
from poskernel_tl.statistics.registry import STATISTICS
from poskernel_tl.statistics.statistic import StatisticContext

ScoresPath = str  # "auto" | "hook" | "qk"


def choose_scores_path(model: LoadedModel, scores: ScoresPath) -> bool:
    """True to read ``hook_attn_scores`` (``scores="hook"``, which makes the bridge run
    its eager attention so that the hook fires). ``auto``: Track A from the lag sums of q
    and k, no T×T logits; ``qk``: the logits formed from q and k (the reference path)."""
    if scores not in ("auto", "hook", "qk"):
        raise UserError(f"--scores {scores}: choose auto, hook or qk")
    if scores == "hook" and scores_hook_name(model.site(0)) not in model.bridge.hook_dict:
        raise UserError("this bridge has no hook_attn_scores; use --scores qk")
    if scores == "hook" and model.spec.softmax_terms():
        raise UserError(f"--scores hook: {model.spec.name}'s softmax reads more than "
                        "scale·q·kᵀ (its layers' terms are folded in from q and k); use "
                        "--scores qk or auto")
    if scores == "hook" and not model.spec.causal:
        raise UserError(f"--scores hook: {model.spec.name} is bidirectional and its bridge's "
                        "hook_attn_scores is not scale·q·kᵀ; use --scores qk or auto")
    return scores == "hook"


def check_mask(model: LoadedModel) -> str:
    """``"causal"``, or ``"none"`` for a bidirectional model (its upper-triangle fits swap
    q and k, grouped keys repeated to their query heads:
    :func:`~poskernel_tl.reducers.two_sided.per_query_head`)."""
    return "causal" if model.spec.causal else "none"


def forward_pass(model: LoadedModel, ids: torch.Tensor,
                 make_reducers: Callable[[], list | dict], batch_size: int, desc: str,
                 progress: bool = True, hook_scores: bool = False,
                 after_batch: Callable[[list | dict], None] | None = None, *,
                 layers: Sequence[int] | None = None, groups: Groups | None = None
                 ) -> list | dict:
    """Run ``ids`` through the model in batches, feeding fresh reducers from
    ``make_reducers()`` (a list, or a dict by name) the q/k of ``layers`` (default: all);
    each forward stops after the last of them; returns the reducers as made. ``groups``:
    the layers handed over together (:mod:`poskernel_tl.plan.groups`; default one at a
    time): a reducer marked ``GROUPED`` gets each group as one batch, any other each of
    its layers. On out-of-memory the pass restarts with half the batch size."""
    layers = list(range(model.spec.n_layers) if layers is None else layers)
    groups = tuple((L,) for L in layers) if groups is None else groups
    closes = {group[-1]: group for group in groups}
    geometry = Geometry.of(model.spec, ids.shape[-1])
    state: dict = {}

    def restart() -> None:
        reducers = make_reducers()
        state.update(reducers=reducers, workspace=Workspace(), pending={},
                     each=list(reducers.values() if isinstance(reducers, dict) else reducers),
                     positions=torch.arange(len(ids), device=model.device))

    def on_layer(c) -> None:
        pending = state["pending"]
        pending[c.layer] = c
        group = closes.get(c.layer)
        if group is not None:
            feed(group, [pending.pop(L) for L in group])

    def feed(group: tuple[int, ...], parts: list) -> None:
        rows, terms = parts[0].context, model.spec.layer_terms(group[0])
        joined = lambda name: getattr(parts[0], name) if len(parts) == 1 else \
            torch.cat([getattr(p, name) for p in parts], dim=2)
        batch = LayerBatch(group, joined("q"), joined("k"),
                           state["positions"][rows[0]:rows[-1] + 1], model.logit_scale,
                           rows=rows, workspace=state["workspace"],
                           hooked_scores=parts[0].scores if len(parts) == 1 else None,
                           terms=terms.repeated(len(group)), layer_terms=terms,
                           mask=geometry.mask(group[0]))
        layers = batch.split()  # one split for every reducer: they share its caches
        for r in state["each"]:
            for one in [batch] if getattr(r, "GROUPED", False) else layers:
                r.update(one)

    def run(rows: tuple[int, ...], tokens: torch.Tensor) -> None:
        state["pending"].clear()
        capture.forward(tokens, rows)
        if after_batch is not None:
            after_batch(state["reducers"])

    restart()
    with capture_qk(model.bridge, on_layer, scores=hook_scores, layers=layers, stop=True,
                    schemes=model.spec.layers) as capture:
        batched(ids, batch_size, model.device, desc, progress, run, restart)
    return state["reducers"]


def measure(model: LoadedModel, tokens, centering_tokens=None, *, progress: bool = True,
            seq_id=None, logits_for: Sequence[int] = (), keep_gram: bool | None = None,
            dataset: str = "custom", config: dict | None = None, length: int | None = None,
            geometry: Geometry | None = None, **options) -> ConditionResult:
    """Track A and Track B of every head on ``tokens`` (evaluation sequences, an int
    tensor [n, T] or a list of strings), centered by the per-position means of
    ``centering_tokens`` (none: Track B uncentered, as the protocol does for random
    tokens).

    ``options`` are the fields of :class:`~poskernel_tl.plan.config.MeasureConfig`:
    ``batch_size`` (sequences per forward or ``"auto"``; halved on out-of-memory),
    ``seed`` (the 80/20 subsets, the random half of the centering set, the null),
    ``whiten``, ``scores`` (``auto``: Track A from q and k without the T×T logits;
    ``hook``/``qk``: the materialised reference path), ``null_perms``, ``null_seqs``.
    ``logits_for``: evaluation positions whose full logits to keep; ``keep_gram``: keep
    the full Gram matrices (default: T ≤ 256); ``seq_id``: ids of the evaluation
    sequences (default 0..n−1); ``config``: saved with the result. ``length``: strings
    (and tensors) are cut to this many tokens, a shorter one refused; without it both sets
    are cut to their shortest sequence and the result's notes say so. ``geometry``: the
    run's, already checked against ``model`` (:class:`~poskernel_tl.models.geometry.Geometry`;
    default: made and checked here), handed to every reducer.
    """
    t0, opts = time.time(), MeasureConfig(**options)
    opts.validate()  # bad values fail before any work
    ev_ids, cen_ids, cut = checked_tokens(model, tokens, centering_tokens, length)
    T, dev = ev_ids.shape[1], model.device
    if geometry is None:
        geometry = Geometry.checked(model.spec, T)
    elif geometry.length != T:  # a caller's bug, not the user's input
        raise ValueError(f"the geometry given is for {geometry.length} tokens, the "
                         f"sequences have {T}")
    hook_scores = choose_scores_path(model, opts.scores)
    mask = check_mask(model)
    if opts.whiten and cen_ids is None:
        raise UserError("--whiten needs centering sequences")
    seq_id = np.arange(len(ev_ids)) if seq_id is None else np.asarray(seq_id, dtype=np.int64)
    wanted = {i: int(seq_id[i]) for i in logits_for if i < len(ev_ids)}
    keep_gram = T <= C.GRAM_SAVE_MAX_T if keep_gram is None else keep_gram
    plan = plan_run(model, opts, ev_ids, cen_ids, keep_gram, len(wanted))
    centering = centering_pass(model, cen_ids, plan.batch_size, opts, progress)
    reds, track_b = evaluation_passes(model, geometry, ev_ids, centering, wanted, opts, plan,
                                      keep_gram, hook_scores, progress)
    parts, notes = result_parts(model, geometry, reds, track_b, centering, ev_ids, opts)
    notes = [cut] * bool(cut) + [plan.note()] * plan.blocked + notes
    provenance = {"weights": model.weights_note, "logit_scale": model.logit_scale,
                  "scores_from": {"hook": "hook_attn_scores", "qk": "q·kᵀ"}.get(
                      opts.scores, "lag sums of q and k"),
                  "mask": mask, "layers": scheme_summary(model.spec.layers),
                  "softmax": model.spec.softmax_terms(),
                  "n_eval": len(ev_ids), "n_centering": 0 if cen_ids is None else len(cen_ids),
                  "bos_first": bos_first(model.tokenizer, ev_ids),
                  "device": str(dev), "dtype": dtype_name(model.dtype),
                  "attention": getattr(model, "attention", "eager"),
                  "self_check": model.self_check, "track_b": plan.why,
                  "seconds": round(time.time() - t0, 1), "notes": notes,
                  "versions": versions()}
    return ConditionResult(
        model.spec.name, dataset, T, model.spec, seq_id, parts=parts,
        config=dict(config or {}, **dict(opts.measure_kwargs(), batch_size=plan.batch_size)),
        provenance=provenance)



def bos_first(tokenizer, ids: Int[Tensor, "batch pos"]) -> bool | None:
    """Whether every evaluation sequence starts with the tokenizer's BOS token (None: the
    tokenizer names none): the sink statistics depend on it (Gu et al. prepend Llama's)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return None if bos is None else bool((ids[:, 0] == bos).all())


def centering_pass(model: LoadedModel, cen_ids, batch_size: int, opts: MeasureConfig,
                   progress: bool) -> Moments | None:
    """Pass 1: the per-position means of the centering sequences (None without any)."""
    if cen_ids is None:
        return None
    s, (n, T) = model.spec, cen_ids.shape
    (mom,) = forward_pass(
        model, cen_ids,
        lambda: [MomentsReducer(n, s.n_layers, s.n_heads, s.n_kv_heads, T, s.d_head,
                                model.device, half_seed=opts.seed,
                                second_moments=opts.whiten)],
        batch_size, "centering pass", progress)
    return mom.result()


def plan_run(model: LoadedModel, opts: MeasureConfig, ev_ids: Tokens,
             cen_ids: CenteringTokens | None,
             keep_gram: bool, n_logits: int) -> Plan:
    """The batch size and Track B's blocks of layers that fit ``--max-memory`` (a
    :class:`~poskernel_tl.errors.PlanError` before any work where nothing fits); a split
    is announced in one line."""
    materialised = opts.scores != "auto" or getattr(model, "attention", "eager") != "sdpa" \
        or any(not s.terms.bilinear for s in model.spec.layers or ())  # capped, tables
    work = Workload(ev_ids.shape[1], len(ev_ids), 0 if cen_ids is None else len(cen_ids),
                    materialised, keep_gram, n_logits, opts.whiten, opts.null_perms)
    plan = plan_measure(model, work, opts.batch_size, opts.max_memory)
    if plan.blocked:
        print(plan.note())
    return plan


def gram_reducer(model: LoadedModel, geometry: Geometry, centering: Moments | None,
                 layers: Sequence[int], full: bool, factors: Sequence[bool] | bool
                 ) -> GramReducer:
    """Track B's reducer for ``layers`` (``full``: every key, to keep the matrices;
    ``factors``: the sequences' q/k instead of an accumulator, as the plan chose)."""
    s = model.spec
    return GramReducer(geometry.masks, s.n_heads, s.n_kv_heads, s.d_head, model.logit_scale,
                       model.device, reference=centering, layers=layers, full=full,
                       factors=factors)


def eval_reducers(model: LoadedModel, geometry: Geometry, n: int, centering: Moments | None,
                  wanted: dict[int, int], opts: MeasureConfig,
                  gram_layers: Sequence[int] | None = None, full: bool = False,
                  factors: Sequence[bool] | bool = False) -> dict:
    """Pass 2's reducers by the name of the result part each makes: Track A, Track B (for
    ``gram_layers``, default all), then every statistic of the registry this run wants
    (:data:`~poskernel_tl.statistics.registry.STATISTICS`)."""
    s, run = model.spec, StatisticContext(model, geometry, n, opts, centering, wanted)
    layers = range(s.n_layers) if gram_layers is None else gram_layers
    reds = {"track_a": TrackAReducer(n, geometry.masks, s.n_heads, model.device,
                                     seed=opts.seed, source=run.source),
            "track_b": gram_reducer(model, geometry, centering, layers, full, factors)}
    for stat in STATISTICS.values():
        if (red := stat.build(run)) is not None:
            reds[stat.name] = red
    return reds


def evaluation_passes(model: LoadedModel, geometry: Geometry, ev_ids: Tokens,
                      centering: Moments | None,
                      wanted: dict[int, int], opts: MeasureConfig, plan: Plan,
                      keep_gram: bool, hook_scores: bool, progress: bool
                      ) -> tuple[dict, GramResult]:
    """Pass 2 (every reducer; Track B for the plan's last block of layers), then one pass
    per other block (Track B alone, each forward stopped after the block's last layer),
    each block's accumulator fitted and freed before the next is built. Returns pass 2's
    other reducers by name and Track B's result over every layer."""
    n = len(ev_ids)
    *others, last = plan.layer_blocks
    grouped = grouping(model, geometry, hook_scores or opts.scores != "auto")
    groups = lambda layers: layer_groups(model, geometry, layers, grouped, plan.group_layers,
                                         [b[0] for b in plan.layer_blocks])
    reds = forward_pass(model, ev_ids,
                        lambda: eval_reducers(model, geometry, n, centering, wanted, opts,
                                              range(*last), keep_gram, plan.factors),
                        plan.batch_size, "evaluation pass", progress, hook_scores,
                        groups=groups(range(geometry.n_layers)))
    reds["track_a"].check_finite()  # once, after the pass: no host read per batch
    fits = {last: reds.pop("track_b").result(centering, keep_matrices=keep_gram)}
    for block in others:
        (gram,) = forward_pass(
            model, ev_ids, lambda block=block: [gram_reducer(model, geometry, centering,
                                                             range(*block), keep_gram,
                                                             plan.factors)],
            plan.batch_size, f"Track B, layers {block[0]}-{block[1] - 1}", progress,
            layers=range(*block), groups=groups(range(*block)))
        fits[block] = gram.result(centering, keep_matrices=keep_gram)
        del gram
    return reds, concat_layers([fits[b] for b in plan.layer_blocks])


def result_parts(model: LoadedModel, geometry: Geometry, reds: dict, track_b: GramResult,
                 centering: Moments | None, ev_ids: Tokens, opts: MeasureConfig | None = None
                 ) -> tuple[dict, list[str]]:
    """The result's parts from the evaluation pass's reducers and Track B's result, and
    notes. S_PE of a post-LN model (BERT) uses the LayerNorm statistics measured on the
    evaluation sequences ``ev_ids`` (one more forward of them;
    :mod:`poskernel_tl.measurement.pe_kernel`)."""
    n, T = ev_ids.shape
    notes = []
    parts = {"track_a": reds["track_a"].result(), "track_b": track_b,
             "centering": CenteringMeans.from_moments(centering)}
    if centering is None:
        parts["track_b"] = dataclasses.replace(parts["track_b"], gram_centered=None)
    run = StatisticContext(model, geometry, n, opts, centering)
    for name, red in reds.items():
        if name in STATISTICS:
            stat = STATISTICS[name]
            part = red.result()
            parts[name] = part if stat.finish is None else stat.finish(part, reds, run)
    if model.spec.pe == "learned-absolute":
        if getattr(model.bridge, "compatibility_mode", False):
            # compatibility mode folds ln_1 into separate q/k modules and leaves the HF
            # c_attn weights that S_PE reads stale: skip it rather than report a wrong one
            notes.append("S_PE not computed: the bridge runs in compatibility mode")
        else:
            try:
                parts["pe_kernel"] = pe_kernel_part(model.hf_model, T, ev_ids.to(model.device))
                if is_post_ln(model.hf_model):
                    notes.append("S_PE: the position table through the LayerNorm route with "
                                 "the evaluation sequences' LayerNorm statistics")
            except NoPositionTableError as err:  # learned positions in no known layout
                notes.append(f"S_PE not computed: {err}")
    return parts, notes


def versions() -> dict:
    import transformer_lens
    import transformers

    return {"poskernel_tl": C.VERSION, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "transformer_lens": getattr(transformer_lens, "__version__", "unknown")}


__all__ = ["forward_pass", "measure", "versions"]
