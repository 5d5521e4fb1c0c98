"""``pk.measure``: Track A and Track B for a set of sequences, as a value.

Pass 1 runs the centering sequences (if any) and keeps per-position q/k means. Pass 2
runs the evaluation sequences once and feeds Track A, the Track B Gram accumulator,
the rotary frequency-usage reducer (and, on request, the whitened Gram and a few full
logit matrices) from the same hooked tensors. Nothing is written to disk.

Track A reads the logits from ``hook_attn_scores`` when the bridge computes them anyway
(it runs attention eagerly so that the hook can fire: then forming q·kᵀ again would
double the work), and forms q·kᵀ from the post-rotary q/k otherwise
(``scores="qk"``); both paths give the same numbers.
"""

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from jaxtyping import Int
from tqdm.auto import tqdm

from poskernel_tl import constants as C
from poskernel_tl.batching import check_batch_size, resolve_batch_size
from poskernel_tl.errors import UserError
from poskernel_tl.hooks import capture_qk, scores_hook_name
from poskernel_tl.loading import LoadedModel, dtype_name
from poskernel_tl.pe_kernel import head_projected_pe_kernel
from poskernel_tl.reducers import (
    FreqUsageReducer,
    GramReducer,
    LayerBatch,
    LogitSaver,
    Moments,
    MomentsReducer,
    NonFiniteError,
    PermNullReducer,
    TrackAReducer,
    WhitenedGramReducer,
    Workspace,
)
from poskernel_tl.result import ConditionResult

ScoresPath = str  # "auto" | "hook" | "qk"


def as_tokens(model: LoadedModel, data) -> Int[torch.Tensor, "batch pos"] | None:
    """An int tensor [n, T] as given, or a list of strings tokenized without special
    tokens (BOS included: none) and cut to the shortest one's length."""
    if data is None:
        return None
    if torch.is_tensor(data):
        if data.dtype not in (torch.int64, torch.int32) or data.ndim != 2:
            raise UserError(f"tokens must be an int tensor [n_seqs, T], got {data.dtype} "
                             f"{tuple(data.shape)}")
        return data.long()
    if isinstance(data, str) or not isinstance(data, Sequence):
        raise UserError("tokens: an int tensor [n_seqs, T] or a list of strings")
    if model.tokenizer is None:
        raise UserError("this model has no tokenizer: pass token ids")
    ids = [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in data]
    T = min(len(x) for x in ids)
    return torch.tensor([x[:T] for x in ids], dtype=torch.long)


def check_tokens(model: LoadedModel, tokens: torch.Tensor, what: str) -> None:
    n, T = tokens.shape
    if T < 3:
        raise UserError(f"{what}: sequences of {T} tokens; the fit needs T >= 3")
    if model.spec.n_ctx and T > model.spec.n_ctx:
        raise UserError(f"{what}: T={T} exceeds {model.spec.name}'s context of "
                         f"{model.spec.n_ctx}")
    if n and (int(tokens.min()) < 0 or int(tokens.max()) >= model.bridge.cfg.d_vocab):
        raise UserError(f"{what}: token ids outside the vocabulary [0, "
                         f"{model.bridge.cfg.d_vocab})")


def choose_scores_path(model: LoadedModel, scores: ScoresPath) -> bool:
    """True to read ``hook_attn_scores``. ``auto``: whenever the bridge exposes it (its
    attention is then computed eagerly anyway) and the forward runs in float32; in half
    precision the hooked scores are rounded to 8 bits of mantissa, so q·kᵀ is formed in
    float32 from the post-rotary q/k instead."""
    if scores not in ("auto", "hook", "qk"):
        raise UserError(f"scores={scores!r}: choose auto, hook or qk")
    has_hook = scores_hook_name(0) in model.bridge.hook_dict
    if scores == "hook" and not has_hook:
        raise UserError("this bridge has no hook_attn_scores; use scores='qk'")
    full_precision = model.dtype == torch.float32
    return scores == "hook" or (scores == "auto" and has_hook and full_precision)


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def forward_pass(model: LoadedModel, ids: torch.Tensor, make_reducers: Callable[[], list],
                 batch_size: int, desc: str, progress: bool = True, hook_scores: bool = False,
                 after_batch: Callable[[list], None] | None = None) -> list:
    """Run ``ids`` through the model in batches, feeding fresh reducers from
    ``make_reducers()``. On out-of-memory the pass restarts with half the batch size."""
    device, scale = model.device, model.logit_scale
    while True:
        reducers = make_reducers()
        workspace = Workspace()

        def on_layer(c, reducers=reducers, workspace=workspace):
            index, rows = c.context
            batch = LayerBatch(c.layer, c.q, c.k, index, scale, rows=rows,
                               workspace=workspace, hooked_scores=c.scores)
            for r in reducers:
                r.update(batch)

        try:
            with torch.no_grad(), capture_qk(model.bridge, on_layer,
                                             scores=hook_scores) as capture:
                bar = tqdm(range(0, len(ids), batch_size), desc=desc, disable=not progress,
                           unit="batch")
                for start in bar:
                    rows = tuple(range(start, min(len(ids), start + batch_size)))
                    index = torch.as_tensor(rows, device=device)
                    capture.forward(ids[start:start + len(rows)].to(device), (index, rows))
                    if after_batch is not None:
                        after_batch(reducers)
            return reducers
        except (RuntimeError, torch.OutOfMemoryError) as err:
            if not _is_oom(err) or batch_size == 1:
                raise
            batch_size //= 2
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"out of memory: retrying {desc} with --batch-size {batch_size}")


def measure(model: LoadedModel, tokens, centering_tokens=None, *,
            batch_size: int | str = "auto",
            progress: bool = True, seq_id=None, seed: int = 0, whiten: bool = False,
            logits_for: Sequence[int] = (), scores: ScoresPath = "auto",
            null_perms: int = 4, null_seqs: int = 8,
            keep_gram: bool | None = None, dataset: str = "custom",
            config: dict | None = None) -> ConditionResult:
    """Track A and Track B of every head on ``tokens`` (evaluation sequences, an int
    tensor [n, T] or a list of strings), centered by the per-position means of
    ``centering_tokens`` (none: Track B uncentered, as the seed does for random tokens).

    ``batch_size``: sequences per forward, or ``"auto"`` (from the free memory, see
    :mod:`poskernel_tl.batching`; halved on out-of-memory either way);
    ``logits_for``: evaluation positions whose full logits to keep; ``keep_gram``: keep
    the full Gram matrices (default: T ≤ 256); ``seq_id``: ids of the evaluation
    sequences (default 0..n−1); ``seed``: the 80/20 subsets and the random half of the
    centering set; ``scores``: where Track A's logits come from (see the module).
    """
    t0 = time.time()
    check_batch_size(batch_size)  # bad values fail before any work
    ev_ids = as_tokens(model, tokens)
    cen_ids = as_tokens(model, centering_tokens)
    check_tokens(model, ev_ids, "evaluation tokens")
    if len(ev_ids) < 2:
        raise UserError("need at least 2 evaluation sequences")
    T = ev_ids.shape[1]
    if cen_ids is not None and len(cen_ids) == 0:
        cen_ids = None
    if cen_ids is not None:
        check_tokens(model, cen_ids, "centering tokens")
        if cen_ids.shape[1] != T:
            raise UserError(f"centering sequences have T={cen_ids.shape[1]}, evaluation "
                             f"sequences T={T}")
    spec, dev = model.spec, model.device
    L, H, Hkv, d = spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head
    hook_scores = choose_scores_path(model, scores)
    batch_size = resolve_batch_size(batch_size, model, T, len(ev_ids))
    keep_gram = T <= C.GRAM_SAVE_MAX_T if keep_gram is None else keep_gram
    seq_id = np.arange(len(ev_ids)) if seq_id is None else np.asarray(seq_id, dtype=np.int64)

    centering: Moments | None = None
    if cen_ids is not None:
        (mom,) = forward_pass(
            model, cen_ids,
            lambda: [MomentsReducer(len(cen_ids), L, H, Hkv, T, d, dev, half_seed=seed,
                                    second_moments=whiten)],
            batch_size, "centering pass", progress)
        centering = mom.result()
    if whiten and centering is None:
        raise UserError("whitening needs centering sequences")
    wanted = {i: int(seq_id[i]) for i in logits_for if i < len(ev_ids)}
    pairs = model.rotary_pairs

    def make_eval():
        reds = [TrackAReducer(len(ev_ids), L, H, T, dev, seed=seed),
                GramReducer(L, H, Hkv, T, d, model.logit_scale, dev, reference=centering)]
        if pairs is not None:
            reds.append(FreqUsageReducer(L, H, Hkv, *pairs, device=dev))
        if wanted:
            reds.append(LogitSaver(wanted, L))
        if whiten:
            reds.append(WhitenedGramReducer(centering, model.logit_scale))
        if null_perms > 0:
            reds.append(PermNullReducer(L, H, T, n_perm=null_perms, max_seqs=null_seqs,
                                        seed=seed, device=dev, include_identity=False))
        return reds

    def check(reds):
        reds[0].check_finite()

    reds = forward_pass(model, ev_ids, make_eval, batch_size, "evaluation pass", progress,
                        hook_scores, after_batch=check)
    a = reds[0].result()
    b = reds[1].result(centering, keep_matrices=keep_gram)
    by_type = {type(r).__name__: r for r in reds[2:]}
    fields: dict = {}
    if "FreqUsageReducer" in by_type:
        fu = by_type["FreqUsageReducer"].result()
        fields.update(q_pair_norm=fu.q_pair_norm, k_pair_norm=fu.k_pair_norm,
                      pair_first=fu.pair_first, pair_second=fu.pair_second)
    if "LogitSaver" in by_type:
        fields["logits"] = by_type["LogitSaver"].result().logits
    if "PermNullReducer" in by_type:
        null = by_type["PermNullReducer"].result()
        # the unpermuted fit of the same sequences comes from Track A's per-sequence sums
        same, _ = reds[0].pooled(torch.arange(null.n_seqs, device=dev))
        fields.update(r2_perm_null=null.r2_null, r2_perm_same_seqs=same.cpu().numpy())
    if whiten:
        fields["r2_gram_whitened"] = by_type["WhitenedGramReducer"].result().r2_gram_whitened
    if centering is not None:
        f32 = lambda t: None if t is None else t.float().cpu().numpy()
        fields.update(mean_q=f32(centering.mean_q), mean_k=f32(centering.mean_k),
                      mean_q_half=f32(centering.mean_q_half),
                      mean_k_half=f32(centering.mean_k_half),
                      n_centering=centering.n, n_centering_half=centering.n_half)
    notes = []
    if spec.pe == "learned-absolute":
        if getattr(model.bridge, "compatibility_mode", False):
            # compatibility mode folds ln_1 into separate q/k modules and leaves the HF
            # c_attn weights that S_PE reads stale: skip it rather than report a wrong one
            notes.append("S_PE not computed: the bridge runs in compatibility mode")
        else:
            fields["s_pe"] = head_projected_pe_kernel(model.hf_model, T)
    provenance = {"weights": model.weights_note, "logit_scale": model.logit_scale,
                  "scores_from": "hook_attn_scores" if hook_scores else "q·kᵀ",
                  "n_eval": len(ev_ids), "n_centering": 0 if cen_ids is None else len(cen_ids),
                  "device": str(dev), "dtype": dtype_name(model.dtype),
                  "seconds": round(time.time() - t0, 1), "notes": notes,
                  "versions": versions()}
    return ConditionResult(
        model=spec.name, dataset=dataset, length=T, spec=spec, seq_id=seq_id,
        r2_per_seq=a.r2_per_seq, r2_per_seq_nosink=a.r2_per_seq_nosink,
        g_per_seq=a.g_per_seq, r2_pooled=a.r2_pooled, r2_pooled_nosink=a.r2_pooled_nosink,
        g_pooled=a.g_pooled, r2_pooled_early=a.r2_pooled_early,
        r2_pooled_interior=a.r2_pooled_interior,
        r2_pooled_interior_keys=a.r2_pooled_interior_keys, r2_split=a.r2_split,
        centered=centering is not None, r2_gram=b.r2_gram, g_gram=b.g_gram,
        r2_gram_raw=b.r2_gram_raw, g_gram_raw=b.g_gram_raw, r2_gram_half=b.r2_gram_half,
        gram_raw=b.gram_raw, gram_centered=b.gram_centered if centering is not None else None,
        config=dict(config or {}, batch_size=batch_size, seed=seed, whiten=whiten,
                    null_perms=null_perms, null_seqs=null_seqs),
        provenance=provenance, **fields)


def versions() -> dict:
    import transformer_lens
    import transformers

    return {"poskernel_tl": C.VERSION, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "transformer_lens": getattr(transformer_lens, "__version__", "unknown")}


__all__ = ["NonFiniteError", "as_tokens", "forward_pass", "measure", "versions"]
