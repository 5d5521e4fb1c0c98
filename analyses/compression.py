"""Seed 002's compression experiment (:func:`compression_experiment`, part of the seq-pca
analysis, :mod:`poskernel_tl.analyses.sequence_pca`, but not run by ``analyze``).

T = 300 input embeddings are compressed to 128 temporal components with a sequence PCA
fitted on training sequences, passed through the seed's :class:`PositionalDecoder`
(position predictor → expected position → interpolated learned position embedding,
added, then the refiner), and fed with ``inputs_embeds`` into the frozen model followed
by a continuation; the decoder is trained on the continuation's next-token loss plus the
seed's auxiliary position (KL to the PCA loadings' position distribution |V_c,t|²) and
reconstruction terms (weights 0.1 and 0.05). Deviation from the seed, for a short CPU
budget: the refiner is applied residually with its last layer zero-initialised. Reported:
held-out next-token loss on the continuation (targets c_1..c_{C−1}) with the full
context, the decoder, the raw PCA components, naive average pooling to 128 and no context.
"""

import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from poskernel_tl.analyses.base import AnalysisInputs, AnalysisSpec
from poskernel_tl.analyses.sequence_pca.stats import SequencePCA, cpu_threads, sequence_pca
from poskernel_tl.data.sequences import build_sequences
from poskernel_tl.plan.config import option
from poskernel_tl.progress import tqdm

CONDITIONS = ("full", "pca_decoder", "pca_raw", "pool", "none")


class PositionalDecoder(nn.Module):
    """Seed 002's positional decoder: per component a distribution over the original
    positions, its expected position, a linearly interpolated learned position
    embedding added to the component, then the refiner (here residual, last layer
    zero-initialised)."""

    def __init__(self, d_model: int, n_positions: int, emb_std: float = 0.02):
        super().__init__()
        self.n_positions = n_positions
        self.position_embeddings = nn.Embedding(n_positions, d_model)
        nn.init.normal_(self.position_embeddings.weight, std=emb_std)
        self.position_predictor = nn.Sequential(
            nn.Linear(d_model, d_model // 2), nn.ReLU(), nn.Linear(d_model // 2, n_positions))
        self.refiner = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 2 * d_model),
                                     nn.GELU(), nn.Linear(2 * d_model, d_model))
        nn.init.zeros_(self.refiner[-1].weight)
        nn.init.zeros_(self.refiner[-1].bias)

    def forward(self, z: Float[Tensor, "batch component d_model"]
                ) -> tuple[Float[Tensor, "batch component d_model"],
                           Float[Tensor, "batch component n_positions"]]:
        scores = self.position_predictor(z).softmax(-1)
        idx = torch.arange(self.n_positions, device=z.device, dtype=z.dtype)
        pos = (scores * idx).sum(-1).clamp(0, self.n_positions - 1)
        lo = pos.floor().long()
        hi = (lo + 1).clamp(max=self.n_positions - 1)
        frac = (pos - lo.to(pos.dtype))[..., None]
        emb = self.position_embeddings
        x = z + emb(lo) * (1 - frac) + emb(hi) * frac
        return x + self.refiner(x), scores


@dataclass
class CompressionResult:
    """Held-out next-token loss (nats/token) per condition, and the training record."""

    table: pd.DataFrame
    steps_done: int
    seconds: float
    train_loss: list[float]
    pca: SequencePCA


def compression_tokens(model, dataset: str = "prose", n_train: int = 16,
                       n_heldout: int = 8, context: int = 300, continuation: int = 32,
                       seed: int = 0) -> tuple[Tensor, Tensor]:
    """Training and held-out windows of ``context + continuation`` tokens from one of
    the toolkit's datasets (disjoint windows; held-out ones drawn separately)."""
    n = 2 * max(n_train, n_heldout)
    seqs = build_sequences(model.tokenizer, dataset, context + continuation, n, seed,
                           model_name=model.spec.name, n_ctx=model.spec.n_ctx)
    ids = seqs["input_ids"]
    return ids[:n_train], ids[n // 2: n // 2 + n_heldout]


def _next_token_loss(hf, prefix: Tensor, cont: Int[Tensor, "batch cont"], embed) -> Tensor:
    """Mean CE of c_1..c_{C−1} given ``prefix`` embeddings then c_0..c_{C−2}."""
    x = torch.cat([prefix, embed(cont[:, :-1])], dim=1)
    k = cont.shape[1] - 1
    logits = hf(inputs_embeds=x, use_cache=False, logits_to_keep=k).logits[:, -k:]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                           cont[:, 1:].reshape(-1))


def _train_decoder(hf, decoder: PositionalDecoder, pca: SequencePCA, train_tokens: Tensor,
                   *, device, context: int, steps: int, batch_size: int, lr: float,
                   aux_weights: tuple[float, float], seed: int, t0: float,
                   max_seconds: float, progress: bool) -> list[float]:
    """Adam steps on the decoder with the model frozen (its ``requires_grad`` flags
    restored after): continuation loss plus the weighted position KL and reconstruction
    terms. Stops after ``steps`` or once ``max_seconds`` have passed since ``t0``;
    returns the continuation loss of every step."""
    embed = hf.get_input_embeddings()
    target = (pca.components.float().to(device) ** 2)  # [component, pos]: sums to 1
    opt = torch.optim.Adam(decoder.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    w_pos, w_rec = aux_weights
    frozen = [(p, p.requires_grad) for p in hf.parameters()]
    try:
        for p, _ in frozen:
            p.requires_grad_(False)
        bar = tqdm(range(steps), desc="positional decoder", disable=not progress)
        for _ in bar:
            if time.time() - t0 > max_seconds:
                break
            idx = torch.randint(len(train_tokens), (batch_size,), generator=g)
            ids = train_tokens[idx].to(device)
            with torch.no_grad():
                e = embed(ids[:, :context]).float()
                z = pca.transform(e)
            x, scores = decoder(z)
            loss = _next_token_loss(hf, x, ids[:, context:], embed)
            kl = F.kl_div(scores.clamp_min(1e-12).log(), target.expand_as(scores),
                          reduction="batchmean")
            rec = F.mse_loss(scores @ e, z)
            total = loss + w_pos * kl + w_rec * rec
            opt.zero_grad()
            total.backward()
            opt.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return losses


def _heldout_table(hf, decoder: PositionalDecoder, pca: SequencePCA, heldout_tokens: Tensor,
                   *, device, context: int, n_comp: int, batch_size: int) -> pd.DataFrame:
    """Held-out continuation loss per condition (:data:`CONDITIONS`), scored in batches
    of at least 4 windows, and its difference to the full context."""
    embed = hf.get_input_embeddings()
    conds: dict[str, list[float]] = {k: [] for k in CONDITIONS}
    for ids in heldout_tokens.to(device).split(max(batch_size, 4)):
        e = embed(ids[:, :context]).float()
        z = pca.transform(e)
        prefixes = {
            "full": e, "pca_decoder": decoder(z)[0], "pca_raw": z,
            "pool": F.adaptive_avg_pool1d(e.transpose(1, 2), n_comp).transpose(1, 2),
            "none": e[:, :0]}
        for name, prefix in prefixes.items():
            conds[name].append(float(_next_token_loss(hf, prefix, ids[:, context:], embed))
                               * len(ids))
    n = len(heldout_tokens)
    prefix_len = {"full": context, "pca_decoder": n_comp, "pca_raw": n_comp, "pool": n_comp,
                  "none": 0}
    table = pd.DataFrame([dict(condition=k, prefix_tokens=prefix_len[k],
                               heldout_loss=sum(v) / n) for k, v in conds.items()])
    table["delta_vs_full"] = table.heldout_loss - float(table.heldout_loss.iloc[0])
    return table


def compression_experiment(model, train_tokens: Int[Tensor, "n_train window"],
                           heldout_tokens: Int[Tensor, "n_heldout window"], *, context: int = 300,
                           n_components: int = 128, steps: int = 120,
                           max_seconds: float = 240.0, batch_size: int = 1, lr: float = 1e-3,
                           aux_weights: tuple[float, float] = (0.1, 0.05), seed: int = 0,
                           threads: int | None = None, progress: bool = True
                           ) -> CompressionResult:
    """Seed 002 in small form on a frozen model (see the module docstring). Windows are
    ``context`` tokens then a continuation; the decoder trains for ``steps`` steps of
    ``batch_size`` windows, or until ``max_seconds`` have passed (``steps_done`` says
    which); held-out windows are scored in batches of at least 4. ``threads``: CPU
    threads for the whole experiment (None keeps torch's setting)."""
    hf, dev = model.hf_model, model.device
    embed = hf.get_input_embeddings()
    if train_tokens.shape[1] <= context + 1:
        raise ValueError(f"windows of {train_tokens.shape[1]} tokens leave no continuation "
                         f"after a context of {context}")
    if n_components > context:
        raise ValueError(f"n_components={n_components} exceeds the context ({context})")
    t0 = time.time()
    with torch.no_grad():
        emb_tr = embed(train_tokens[:, :context].to(dev)).double()
        pca = sequence_pca(emb_tr, n_components)
    with torch.random.fork_rng(devices=[]), cpu_threads(threads):
        torch.random.default_generator.manual_seed(seed)  # CPU only: CUDA state untouched
        decoder = PositionalDecoder(emb_tr.shape[-1], context, float(emb_tr.std())).to(dev)
        losses = _train_decoder(
            hf, decoder, pca, train_tokens, device=dev, context=context, steps=steps,
            batch_size=batch_size, lr=lr, aux_weights=aux_weights, seed=seed, t0=t0,
            max_seconds=max_seconds, progress=progress)
    decoder.eval()
    with torch.no_grad(), cpu_threads(threads):
        table = _heldout_table(hf, decoder, pca, heldout_tokens, device=dev, context=context,
                               n_comp=n_components, batch_size=batch_size)
    return CompressionResult(table, len(losses), time.time() - t0, losses, pca)


@dataclass(frozen=True)
class CompressionOptions:
    continuation: int = option(32, "tokens after the compressed context whose loss is "
                                   "scored (the context is the rest of each window: "
                                   "--length 332 gives the seed's 300)")
    n_components: int = option(128, "temporal components the context is compressed to")
    steps: int = option(120, "decoder training steps")
    max_seconds: float = option(240.0, "stop training after this many seconds")
    threads: int = option(0, "CPU threads for the experiment (0: torch's setting)")


def analyze(inputs: AnalysisInputs, options: CompressionOptions) -> pd.DataFrame:
    """``poskernel analyze seq-compression``: the decoder trains on the condition's
    centering sequences (the first half of the evaluation sequences when there are none)
    and is scored on the evaluation sequences."""
    train, held = inputs.centering_tokens, inputs.eval_tokens
    if train is None or len(train) == 0:
        train, held = held[: len(held) // 2], held[len(held) // 2:]
    res = compression_experiment(
        inputs.model, train, held, context=held.shape[1] - options.continuation,
        n_components=options.n_components, steps=options.steps,
        max_seconds=options.max_seconds, threads=options.threads or None,
        progress=inputs.progress)
    return res.table.assign(steps_done=res.steps_done, seconds=res.seconds)


SPEC = AnalysisSpec(
    order=100,  # (where it is listed)
    name="seq-compression", title="Sequence compression (seed 002)", compute=analyze,
    options=CompressionOptions, columns=("condition", "heldout_loss"),
    guide="Each window's context compressed to its top temporal components and decoded "
          "back into the frozen model: held-out continuation loss against the full "
          "context, raw components, average pooling and no context.")


__all__ = ["SPEC", "CompressionOptions", "CompressionResult", "PositionalDecoder", "analyze",
           "compression_experiment", "compression_tokens"]
