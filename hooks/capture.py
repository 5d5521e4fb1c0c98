"""Stream per-layer post-rotary queries and keys (and the pre-softmax scores) from a
forward pass into a callback.

Only the hooks asked for are attached, through the bridge's ``hooks`` context manager;
the hook functions observe and return None, so the forward pass is unchanged and no
activation cache is built.

    with capture_qk(model.bridge, on_layer, scores=True) as capture:
        for index in batches:
            capture.forward(tokens[index], context=index)

``on_layer(layer)`` receives a :class:`CapturedLayer` per layer and forward pass, carrying
the ``context`` of the :meth:`Capture.forward` call that produced it (e.g. which
sequences the batch holds), so a callback needs no state of its own.

With ``stop=True`` a forward pass ends as soon as the last of ``layers`` has been
delivered: the capture hook raises :class:`StopForward`, which :meth:`Capture.forward`
catches (and then returns None). Nothing after that layer's q/k runs — its attention,
the later layers, the unembedding — which is all a measurement of q and k needs.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.hooks.names import qk_hook_names, scores_hook_name


@dataclass
class CapturedLayer:
    """One layer's tensors from one forward pass. ``scores`` is ``hook_attn_scores``
    (pre-softmax, causally masked: entries above the diagonal hold a fill value, read
    the lower triangle by index) when the capture asked for it, else None."""

    layer: int
    q: Float[Tensor, "batch pos head_index d_head"]
    k: Float[Tensor, "batch pos kv_head_index d_head"]
    scores: Float[Tensor, "batch head_index query_pos key_pos"] | None
    context: Any


class StopForward(Exception):
    """Raised by the capture hook of the last layer wanted (``capture_qk(stop=True)``) to
    end the forward pass there; caught by :meth:`Capture.forward`."""


class Capture:
    """Handle returned by :func:`capture_qk`; run forward passes through it."""

    def __init__(self, bridge):
        self.bridge = bridge
        self.context: Any = None

    def forward(self, tokens: torch.Tensor, context: Any = None):
        """``bridge(tokens)`` with ``context`` handed to every callback of this pass (None
        when the capture stopped the pass after its last layer)."""
        self.context = context
        try:
            return self.bridge(tokens)
        except StopForward:
            return None
        finally:
            self.context = None


@contextmanager
def capture_qk(
    bridge,
    on_layer: Callable[[CapturedLayer], None],
    *,
    scores: bool = False,
    layers: Sequence[int] | None = None,
    stop: bool = False,
) -> Iterator[Capture]:
    """Within the block, every :meth:`Capture.forward` calls ``on_layer`` once per layer
    of ``layers`` (default: all) with the tensors that enter Q·Kᵀ (keys are not expanded
    for GQA), and with ``hook_attn_scores`` too when ``scores=True`` (the bridge computes
    them anyway when it runs attention eagerly). ``stop``: end each pass right after the
    last of ``layers`` is delivered (see the module docstring)."""
    layers = list(range(bridge.cfg.n_layers) if layers is None else layers)
    last = max(layers) if stop and layers else None
    capture = Capture(bridge)
    hooks = []
    for layer in layers:
        q_name, k_name = qk_hook_names(bridge, layer)
        pending: dict[str, Tensor] = {}

        def emit(layer: int = layer, pending: dict = pending) -> None:
            on_layer(CapturedLayer(layer, pending.pop("q"), pending.pop("k"),
                                   pending.pop("scores", None), capture.context))
            if layer == last:
                raise StopForward

        def make(slot: str, pending: dict = pending, emit=emit):
            def hook(x: Tensor, hook) -> None:
                pending[slot] = x
                if len(pending) == (3 if scores else 2):
                    emit()
            return hook

        hooks += [(q_name, make("q")), (k_name, make("k"))]
        if scores:
            hooks.append((scores_hook_name(layer), make("scores")))
    with bridge.hooks(fwd_hooks=hooks):
        yield capture
