"""What every reducer sees: one layer's queries and keys for one batch of sequences."""

from dataclasses import dataclass
from functools import cached_property

import torch
from jaxtyping import Float, Int
from torch import Tensor


@dataclass
class LayerBatch:
    """Post-rotary q/k of one layer for one batch, and the eval/centering indices of
    the batch's sequences. The derived tensors are built on first use and shared by
    all reducers: ``scores``, q·kᵀ times the model's logit scale, per sequence and query
    head (GQA keys are broadcast, not copied)."""

    layer: int
    q: Float[Tensor, "batch pos head_index d_head"]
    k: Float[Tensor, "batch pos kv_head_index d_head"]
    index: Int[Tensor, " batch"]
    scale: float
    workspace: dict | None = None  # reusable output buffers shared across layers

    @property
    def group(self) -> int:
        return self.q.shape[2] // self.k.shape[2]

    @cached_property
    def scores(self) -> Float[Tensor, "batch head_index query_pos key_pos"]:
        b, t, h, d = self.q.shape
        kv = self.k.shape[2]
        # [b, kv, group, t, d] @ [b, kv, 1, d, t]: GQA without materialising repeated keys
        q = self.q.float().permute(0, 2, 1, 3).reshape(b, kv, h // kv, t, d) * self.scale
        k = self.k.float().permute(0, 2, 3, 1).unsqueeze(2)
        out = self._buffer("scores", (b, kv, h // kv, t, t), q)
        return torch.matmul(q, k, out=out).reshape(b, h, t, t)

    def _buffer(self, name: str, shape: tuple, like: Tensor) -> Tensor | None:
        """A workspace buffer reused from layer to layer (fresh CPU allocations of this
        size cost more than the matmul that fills them). Valid until the next layer."""
        if self.workspace is None:
            return None
        buf = self.workspace.get(name)
        if buf is None or buf.shape != shape or buf.device != like.device:
            buf = self.workspace[name] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buf


class Reducer:
    """Running statistics over batches. ``update`` keeps its state on the model's
    device and never syncs with the host; ``result`` syncs once at the end."""

    name: str = "reducer"

    def update(self, batch: LayerBatch) -> None:
        raise NotImplementedError

    def result(self) -> dict:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if isinstance(v, Tensor)}
