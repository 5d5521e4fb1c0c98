"""The numerical core of the seq-pca analysis (:mod:`poskernel_tl.analyses.sequence_pca`,
whose docstring describes the method); nothing here runs the model.

**Sequence PCA**: :class:`SequencePCA` from streamed moments (:func:`pca_from_moments`,
:func:`sequence_pca`, per layer :class:`SequenceCovReducer` over :class:`StreamBatch` or
LayerBatch inputs), and :func:`synthetic_rope_queries`, the rotary head it is tested on.

**Position probes**: the training moments and sample (:class:`ProbeMomentsReducer`), the
ridge probe's fit (:func:`fit_linear_probes`), the MLP probe (:class:`PositionPredictor`,
:func:`train_mlp_probe`) and their error on evaluation batches (:class:`ProbeErrorReducer`).

Every name is also importable from ``sequence_pca``.
"""

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

PROBES = ("linear", "mlp")


# ------------------------------------------------------------------------ PCA
@dataclass
class SequencePCA:
    """Temporal components (rows, unit norm over positions), largest variance first."""

    components: Float[Tensor, "component pos"]
    explained_variance: Float[Tensor, " component"]
    explained_variance_ratio: Float[Tensor, " component"]
    mean: Float[Tensor, " pos"]
    n_samples: int

    def transform(self, x: Float[Tensor, "batch pos channel"]
                  ) -> Float[Tensor, "batch component channel"]:
        """Each channel's time series projected on the components (seed 002's
        ``pca.transform(emb.T).T``)."""
        c = self.components.to(x)
        return torch.einsum("kt,btc->bkc", c, x - self.mean.to(x)[:, None])

    def peak_positions(self) -> Int[np.ndarray, " component"]:
        """The position of each component's largest |loading| (a sink shows as 0)."""
        return self.components.abs().argmax(-1).cpu().numpy()

    def dominant_frequencies(self) -> Float[np.ndarray, " component"]:
        """Each component's largest rfft bin (its mean removed), in cycles per token."""
        c = self.components.double().cpu()
        spec = torch.fft.rfft(c - c.mean(-1, keepdim=True), dim=-1).abs()
        return (spec.argmax(-1).double() / c.shape[-1]).numpy()


def pca_from_moments(s1: Float[Tensor, " pos"], s2: Float[Tensor, "pos pos"], n: int,
                     n_components: int | None = None) -> SequencePCA:
    """PCA over positions from Σ x and Σ x xᵀ of ``n`` samples (float64)."""
    mean = s1.double() / n
    cov = s2.double() / n - torch.outer(mean, mean)
    vals, vecs = torch.linalg.eigh((cov + cov.T) / 2)
    vals, vecs = vals.flip(0).clamp(min=0), vecs.flip(1).T
    k = len(vals) if n_components is None else n_components
    vecs = vecs * torch.where(vecs.sum(-1, keepdim=True) < 0, -1.0, 1.0)  # fix the sign
    total = vals.sum().clamp(min=torch.finfo(torch.float64).tiny)
    return SequencePCA(vecs[:k], vals[:k], vals[:k] / total, mean, n)


def sequence_pca(x: Float[Tensor, "batch pos channel"], n_components: int | None = None
                 ) -> SequencePCA:
    """PCA with positions as variables and (sequence, channel) pairs as samples."""
    x = x.double()
    return pca_from_moments(x.sum((0, 2)), torch.einsum("btc,bsc->ts", x, x),
                            x.shape[0] * x.shape[2], n_components)


@dataclass
class StreamBatch:
    """One layer's residual stream (``name="resid"``) or queries (``"q"``, heads
    flattened into channels) for one batch; ``index`` holds the sequences' rows."""

    layer: int
    name: str
    x: Float[Tensor, "batch pos channel"]
    index: Int[Tensor, " batch"]


class SequenceCovReducer:
    """Σ x and Σ x xᵀ over (sequence, channel) samples per layer for one ``source``
    (``q``/``k`` of a :class:`~poskernel_tl.reducers.LayerBatch`, or ``resid``/``q`` of
    a :class:`StreamBatch`)."""

    def __init__(self, n_layers: int, length: int, device, source: str = "q"):
        self.source = source
        self.s1 = torch.zeros(n_layers, length, dtype=torch.float64, device=device)
        self.s2 = torch.zeros(n_layers, length, length, dtype=torch.float64, device=device)
        self.n = [0] * n_layers

    def update(self, batch) -> None:
        if isinstance(batch, StreamBatch):
            x = batch.x if batch.name == self.source else None
        else:
            x = getattr(batch, self.source, None) if self.source in ("q", "k") else None
        if x is None or batch.layer >= len(self.n):
            return
        x = x.reshape(x.shape[0], x.shape[1], -1).double()
        self.s1[batch.layer] += x.sum((0, 2))
        self.s2[batch.layer] += torch.einsum("btc,bsc->ts", x, x)
        self.n[batch.layer] += x.shape[0] * x.shape[2]

    def result(self, n_components: int | None = None) -> list[SequencePCA]:
        return [pca_from_moments(self.s1[i].cpu(), self.s2[i].cpu(), n, n_components)
                for i, n in enumerate(self.n)]


def synthetic_rope_queries(n_seqs: int, length: int, thetas, amplitudes, *,
                           noise: float = 0.0, seed: int = 0
                           ) -> Float[Tensor, "batch pos head_index d_head"]:
    """A synthetic rotary head: pair i of q(t) is R(t·θ_i)·c_i with content
    c_i ~ amplitude_i·N(0, I₂) fixed per sequence, plus white noise. Pairs are laid out
    like HF's rotate_half (dimension i with i + d_head/2)."""
    g = torch.Generator().manual_seed(seed)
    th = torch.as_tensor(thetas, dtype=torch.float64)
    amp = torch.as_tensor(amplitudes, dtype=torch.float64)
    c = torch.randn(n_seqs, 2, len(th), generator=g, dtype=torch.float64) * amp
    ang = torch.arange(length, dtype=torch.float64)[:, None] * th  # [T, pairs]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x = cos * c[:, None, 0] - sin * c[:, None, 1]
    y = sin * c[:, None, 0] + cos * c[:, None, 1]
    q = torch.cat([x, y], dim=-1)[:, :, None, :]
    return (q + noise * torch.randn(q.shape, generator=g, dtype=torch.float64)).float()


# --------------------------------------------------------------------- probes
class ProbeMomentsReducer:
    """Training statistics per residual layer: the moments of [x, t] for the ridge probe
    and a seeded sample of ``per_seq`` positions per sequence for the MLP probe."""

    def __init__(self, n_layers: int, n_seqs: int, length: int, d_model: int, device,
                 per_seq: int, seed: int = 0):
        f64 = dict(dtype=torch.float64, device=device)
        self.sx = torch.zeros(n_layers, d_model, **f64)
        self.sxx = torch.zeros(n_layers, d_model, d_model, **f64)
        self.sxy = torch.zeros(n_layers, d_model, **f64)
        self.n = torch.zeros(n_layers, **f64)
        g = torch.Generator().manual_seed(seed)
        self.pick = torch.stack([torch.randperm(length, generator=g)[:per_seq]
                                 for _ in range(n_seqs)]).to(device)  # [n_seqs, per_seq]
        self.sample = torch.zeros(n_layers, n_seqs, per_seq, d_model, device=device)
        self.t = torch.arange(length, dtype=torch.float64, device=device)

    def update(self, batch: StreamBatch) -> None:
        if batch.name != "resid":
            return
        x, i = batch.x.double(), batch.layer
        self.sx[i] += x.sum((0, 1))
        self.sxx[i] += torch.einsum("btc,btd->cd", x, x)
        self.sxy[i] += torch.einsum("btc,t->c", x, self.t)
        self.n[i] += x.shape[0] * x.shape[1]
        pick = self.pick[batch.index]  # [b, per_seq]
        self.sample[i, batch.index] = batch.x.gather(
            1, pick[..., None].expand(-1, -1, x.shape[-1])).float()


def fit_linear_probes(m: ProbeMomentsReducer, ridge: float = 1e-2
                      ) -> tuple[Float[Tensor, "layer d_model"], Float[Tensor, " layer"]]:
    """Ridge regression of the position on the standardised features per layer (penalty
    ``ridge`` per unit feature variance; the intercept is not penalised), returned as
    weights and intercept on the raw features."""
    T = len(m.t)
    n = m.n[:, None]
    mu, ybar = m.sx / n, (T - 1) / 2
    cov = m.sxx / n[..., None] - mu[:, :, None] * mu[:, None, :]
    sd = torch.diagonal(cov, dim1=-2, dim2=-1).clamp(min=1e-12).sqrt()  # [layer, d]
    cov_z = cov / (sd[:, :, None] * sd[:, None, :])
    cxy_z = (m.sxy / n - mu * ybar) / sd
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    w = torch.linalg.solve(cov_z + ridge * eye, cxy_z[..., None])[..., 0] / sd
    return w, ybar - (mu * w).sum(-1)


class PositionPredictor(nn.Module):
    """Seed 002's ``position_predictor`` with input standardisation: a distribution over
    positions, read out as its expectation."""

    def __init__(self, d_model: int, n_positions: int, mean: Tensor, std: Tensor):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_model // 2), nn.ReLU(),
                                 nn.Linear(d_model // 2, n_positions))
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float())
        self.register_buffer("pos", torch.arange(n_positions, dtype=torch.float32))

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... n_positions"]:
        return self.net((x.float() - self.mean) / self.std)  # logits

    def expected_position(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        return self(x).softmax(-1) @ self.pos


@contextmanager
def cpu_threads(n: int | None):
    """Temporarily run torch's CPU kernels on ``n`` threads (None: unchanged)."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_mlp_probe(x: Float[Tensor, "sample d_model"], y: Int[Tensor, " sample"],
                    n_positions: int, *, steps: int = 200, lr: float = 3e-3,
                    batch: int = 128, seed: int = 0, threads: int | None = 1
                    ) -> PositionPredictor:
    """Seeded Adam on the cross-entropy of the true position plus the L1 error of the
    expected position in units of T/16 (the readout the MAE scores). ``threads``: CPU threads
    while training (the matrices are small: one thread avoids the synchronisation cost
    that dominates on a busy machine; None keeps torch's setting)."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), cpu_threads(threads):
        torch.random.default_generator.manual_seed(seed)  # CPU only: CUDA state untouched
        std = x.std(0).clamp(min=1e-6)
        mlp = PositionPredictor(x.shape[1], n_positions, x.mean(0), std).to(x.device)
        opt = torch.optim.Adam(mlp.parameters(), lr=lr)
        g = torch.Generator(device="cpu").manual_seed(seed)
        for _ in range(steps):
            idx = torch.randint(len(x), (min(batch, len(x)),), generator=g).to(x.device)
            logits = mlp(x[idx])
            l1 = (logits.softmax(-1) @ mlp.pos - y[idx]).abs().mean() * 16 / n_positions
            loss = F.cross_entropy(logits, y[idx]) + l1
            opt.zero_grad()
            loss.backward()
            opt.step()
    return mlp.eval()


class ProbeErrorReducer:
    """Σ |predicted − true position| per probe, layer and position."""

    def __init__(self, linear: tuple[Tensor, Tensor], mlps: list[PositionPredictor],
                 length: int, device):
        self.w, self.b = linear
        self.mlps = mlps
        self.t = torch.arange(length, dtype=torch.float64, device=device)
        self.err = torch.zeros(len(PROBES), len(mlps), length, dtype=torch.float64,
                               device=device)
        self.count = torch.zeros(len(mlps), dtype=torch.float64, device=device)

    def update(self, batch: StreamBatch) -> None:
        if batch.name != "resid":
            return
        i, x = batch.layer, batch.x
        T = len(self.t)
        lin = (x.double() @ self.w[i] + self.b[i]).clamp(0, T - 1)
        mlp = self.mlps[i].expected_position(x).double()
        for p, pred in enumerate((lin, mlp)):
            self.err[p, i] += (pred - self.t).abs().sum(0)
        self.count[i] += x.shape[0]
