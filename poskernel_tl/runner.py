"""One condition (model, dataset, length) end to end: sequences → forward passes with
the hook layer → reducers → result files.

Pass 1 runs the centering set through the model and keeps per-position q/k means
(skipped for random tokens, which the seed leaves uncentered). Pass 2 runs the
evaluation set once and feeds Track A, the Track B Gram accumulator and the rotary
frequency-usage reducer from the same q/k tensors.
"""

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from poskernel_tl import constants as C
from poskernel_tl.hooks import capture_qk, kv_head_map, logit_scale, rotary_pairs
from poskernel_tl.io import save_csv, save_json, save_npz, save_torch
from poskernel_tl.loading import LoadedModel, load_model
from poskernel_tl.reducers import (
    CenteringReducer,
    FreqUsageReducer,
    GramReducer,
    LayerBatch,
    Reducer,
    TrackAReducer,
    WhitenedGramReducer,
)
from poskernel_tl.registry import resolve
from poskernel_tl.sequences import centering_mask, ensure_sequences, eval_mask

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RunConfig:
    """Arguments of ``poskernel run``; saved as the condition's ``cfg.json``."""

    model: str
    dataset: str
    length: int
    n_seqs: int = 200
    out: str = "artifacts/run"
    device: str = "auto"
    batch_size: int = 4
    seed: int = 0
    dtype: str = "float32"
    save_logits: str = "auto"  # auto: Wikipedia-like datasets at T=256 only
    allow_cross_doc: bool = False
    whiten: bool = False  # Track B diagnostic: also fit the centered + whitened Gram
    progress: bool = True

    def wants_logits(self) -> bool:
        if self.save_logits != "auto":
            return self.save_logits == "yes"
        wiki = self.dataset == "wikipedia" or (
            self.dataset.startswith("text:") and "wiki" in self.dataset.lower())
        return wiki and self.length == 256


class _LogitSaver(Reducer):
    """Keeps the full logit tensors [layer, head_index, T, T] of a few eval sequences."""

    name = "logit_saver"

    def __init__(self, wanted: dict[int, int], n_layers: int):
        self.wanted, self.n_layers = wanted, n_layers  # eval index -> seq_id
        self.layers: dict[int, list] = {i: [None] * n_layers for i in wanted}

    def update(self, batch: LayerBatch) -> None:
        for row, i in enumerate(batch.index.tolist()):
            if i in self.wanted:
                # clone: ``scores`` lives in a buffer that the next layer overwrites
                self.layers[i][batch.layer] = batch.scores[row].detach().float().cpu().clone()

    def result(self) -> dict:
        return {self.wanted[i]: torch.stack(v) for i, v in self.layers.items()
                if all(x is not None for x in v)}


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def forward_pass(model: LoadedModel, ids: torch.Tensor, make_reducers, batch_size: int,
                 desc: str, progress: bool = True, after_batch=None) -> list[Reducer]:
    """Run ``ids`` through the model in batches, feeding fresh reducers from
    ``make_reducers()``. On out-of-memory the pass restarts with half the batch size."""
    scale = logit_scale(model.hf_model, model.spec.d_head)
    device = model.device
    while True:
        reducers = make_reducers()
        state: dict = {}
        workspace: dict = {}

        def on_qk(layer, q, k, state=state, reducers=reducers, workspace=workspace):
            batch = LayerBatch(layer, q, k, state["index"], scale, workspace)
            for r in reducers:
                r.update(batch)

        try:
            with torch.no_grad(), capture_qk(model.bridge, on_qk):
                bar = tqdm(range(0, len(ids), batch_size), desc=desc, disable=not progress,
                           unit="batch")
                for start in bar:
                    idx = torch.arange(start, min(len(ids), start + batch_size))
                    state["index"] = idx.to(device)
                    model.bridge(ids[idx].to(device))
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


def run_condition(cfg: RunConfig, model: LoadedModel | None = None) -> dict:
    """Run one condition and write its result files under ``cfg.out``; returns a
    summary with the paths written and per-layer means."""
    t0 = time.time()
    dtype = DTYPES[cfg.dtype]
    known = model.spec if model is not None else resolve(cfg.model)
    if known.n_ctx and cfg.length > known.n_ctx:  # before spending time on loading
        raise ValueError(f"--length {cfg.length} exceeds {known.name}'s context of {known.n_ctx}")
    if model is None:
        model = load_model(cfg.model, device=cfg.device, dtype=dtype)
    spec = model.spec
    if cfg.length > spec.n_ctx:
        raise ValueError(f"--length {cfg.length} exceeds {spec.name}'s context of {spec.n_ctx}")
    out = Path(cfg.out)
    seqs, seq_file, _ = ensure_sequences(
        out, model.tokenizer, cfg.dataset, cfg.length, cfg.n_seqs, cfg.seed,
        model_name=cfg.model, n_ctx=spec.n_ctx, allow_cross_doc=cfg.allow_cross_doc)
    ids = seqs["input_ids"]
    if int(ids.max()) >= model.bridge.cfg.d_vocab:
        raise ValueError(f"token id {int(ids.max())} is outside the model's vocabulary")
    ev, cen = eval_mask(seqs), centering_mask(seqs)
    eval_ids, cen_ids = ids[ev], ids[cen]
    eval_seq_id = seqs["seq_id"][ev].numpy()
    L, H, Hkv, d, T = spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head, cfg.length
    dev = model.device
    path = lambda suffix: C.result_path(out, cfg.model, cfg.dataset, T, suffix)
    written = {"sequences": seq_file}

    centering = None
    if len(cen_ids):
        (cred,) = forward_pass(
            model, cen_ids,
            lambda: [CenteringReducer(len(cen_ids), L, H, Hkv, T, d, dev, cfg.whiten)],
            cfg.batch_size, "centering pass", cfg.progress)
        centering = cred.result()
        if cfg.whiten:
            centering["white_q"], centering["white_k"] = cred.whitening()
        written["centering_means"] = save_torch(
            {k: (v.float().cpu() if torch.is_tensor(v) else v) for k, v in centering.items()
             if not k.startswith("white_")}, path(C.CENTERING_MEANS))

    pairs = None
    if spec.pe == "rope":
        pairs = rotary_pairs(model.bridge, d)
    vis = {}
    if cfg.wants_logits():
        vis = {i: int(eval_seq_id[i]) for i in C.VIS_EVAL_INDICES if i < len(eval_ids)}

    def make_eval():
        reds = [TrackAReducer(len(eval_ids), L, H, T, dev),
                GramReducer(L, H, Hkv, T, d, logit_scale(model.hf_model, d), dev)]
        if pairs is not None:
            reds.append(FreqUsageReducer(L, H, Hkv, *pairs, device=dev))
        if vis:
            reds.append(_LogitSaver(vis, L))
        if cfg.whiten and centering is not None:
            reds.append(WhitenedGramReducer(
                centering["mean_q"], centering["mean_k"], centering["white_q"],
                centering["white_k"], logit_scale(model.hf_model, d)))
        return reds

    reducers = forward_pass(model, eval_ids, make_eval, cfg.batch_size, "evaluation pass",
                            cfg.progress, after_batch=lambda rs: rs[0].check_finite())
    reducers = {r.name: r for r in reducers}
    track_a = reducers["track_a"].result(cfg.seed)
    track_b = reducers["gram"].result(centering, keep_matrices=T <= C.GRAM_SAVE_MAX_T)
    if "whitened_gram" in reducers:
        track_b.update(reducers["whitened_gram"].result())

    kv = np.array(kv_head_map(H, Hkv))
    base = dict(model=cfg.model, dataset=cfg.dataset, length=T)
    written["trackA"] = save_csv(_track_a_table(base, track_a, eval_seq_id, kv),
                                 path(C.TRACK_A_CSV))
    written["trackB"] = save_csv(_track_b_table(base, track_b, kv, centering),
                                 path(C.TRACK_B_CSV))
    nan_g = np.full_like(track_b["g_gram_raw"], np.nan)
    written["g"] = save_npz(
        path(C.G_ARRAYS), lags=np.arange(1, T), seq_id=eval_seq_id,
        trackA_pooled=track_a["g_pooled"], trackA_per_seq=track_a["g_per_seq"],
        gram_centered=track_b.get("g_gram", nan_g), gram_raw=track_b["g_gram_raw"])
    if "gram_raw" in track_b:
        written["gram_raw"] = save_torch(track_b["gram_raw"], path(C.GRAM_RAW))
    if "gram_centered" in track_b:
        written["gram_centered"] = save_torch(track_b["gram_centered"], path(C.GRAM_CENTERED))
    if pairs is not None:
        fu = reducers["freq_usage"].result()
        written["freq_usage"] = save_npz(path(C.FREQ_USAGE), theta=spec.rotary_frequencies(),
                                         **fu)
    if vis:
        for seq_id, tensor in reducers["logit_saver"].result().items():
            written[f"A_vis_{seq_id}"] = save_torch(
                tensor, path(C.VIS_DIR) / f"seq_{seq_id}.pt")
    if spec.pe == "learned-absolute":
        from poskernel_tl.analyses.pe_kernel import head_projected_pe_kernel

        written["pe_kernel"] = save_npz(
            path(C.PE_KERNEL), s_pe=head_projected_pe_kernel(model.hf_model, T))
    meta = dataclasses.asdict(cfg) | {
        "spec": spec.to_dict(), "centered": centering is not None,
        "logit_scale": logit_scale(model.hf_model, d), "weights": model.weights_note,
        "n_eval": len(eval_ids), "n_centering": len(cen_ids),
        "seconds": round(time.time() - t0, 1),
        "versions": _versions(),
    }
    written["cfg"] = save_json(meta, path(C.CFG))
    return {"written": written, "summary": layer_summary(track_a, track_b), "cfg": meta}


def _versions() -> dict:
    import transformer_lens
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "transformer_lens": getattr(transformer_lens, "__version__", "unknown")}


def _track_a_table(base: dict, res: dict, seq_id: np.ndarray, kv: np.ndarray) -> pd.DataFrame:
    n, L, H = res["R2_per_seq"].shape
    grid = np.meshgrid(np.arange(n), np.arange(L), np.arange(H), indexing="ij")
    s, layer, head = (g.ravel() for g in grid)
    per_head = ["R2_pooled", "R2_pooled_nosink", "R2_pooled_early", "R2_pooled_interior",
                "R2_split_mean", "R2_split_std"]
    df = pd.DataFrame({**base, "layer": layer, "head": head, "seq_id": seq_id[s],
                       "R2_per_seq": res["R2_per_seq"].ravel()})
    df["R2_pooled"] = res["R2_pooled"][layer, head]
    df["kv_head"] = kv[head]
    df["R2_per_seq_nosink"] = res["R2_per_seq_nosink"].ravel()
    df["R2_per_seq_mean"] = np.nanmean(res["R2_per_seq"], axis=0)[layer, head]
    df["R2_per_seq_std"] = np.nanstd(res["R2_per_seq"], axis=0, ddof=1)[layer, head]
    for col in per_head[1:]:
        df[col] = res[col][layer, head]
    return df


def _track_b_table(base: dict, res: dict, kv: np.ndarray, centering: dict | None
                   ) -> pd.DataFrame:
    L, H = res["R2_gram_raw"].shape
    layer, head = (g.ravel() for g in np.meshgrid(np.arange(L), np.arange(H), indexing="ij"))
    raw = res["R2_gram_raw"][layer, head]
    centered = centering is not None
    extra = {"R2_gram_whitened": res["R2_gram_whitened"][layer, head]} \
        if "R2_gram_whitened" in res else {}
    return pd.DataFrame({
        **base, "layer": layer, "head": head,
        # random tokens are not centered (seed, Track B): R2_gram is then the raw fit
        "R2_gram": res["R2_gram"][layer, head] if centered else raw,
        "R2_gram_raw": raw,
        "R2_gram_half": res["R2_gram_half"][layer, head] if centered else np.nan,
        "centered": centered, "kv_head": kv[head],
        "n_centering": centering["n_centering"] if centered else 0,
        "n_centering_half": centering["n_centering_half"] if centered else 0,
        **extra,
    })


def layer_summary(track_a: dict, track_b: dict) -> pd.DataFrame:
    """Mean over heads of each layer: pooled Track A, Track B centered and raw."""
    df = pd.DataFrame({
        "R2_A_pooled": np.nanmean(track_a["R2_pooled"], axis=1),
        "R2_A_per_seq": np.nanmean(track_a["R2_per_seq"], axis=(0, 2)),
        "R2_A_nosink": np.nanmean(track_a["R2_pooled_nosink"], axis=1),
        "R2_B_centered": np.nanmean(track_b["R2_gram"], axis=1) if "R2_gram" in track_b
        else np.nan,
        "R2_B_raw": np.nanmean(track_b["R2_gram_raw"], axis=1),
    })
    df.index.name = "layer"
    return df
