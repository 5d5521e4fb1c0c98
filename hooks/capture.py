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

from poskernel_tl.hooks.names import QKSource, qk_source, scores_hook_name, site_of
from poskernel_tl.hooks.rotary import LayerScheme, hooked_angles, pair_angles, rotate


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
        self.length = 0  # the tokens' length (a model may pad them inside)

    def forward(self, tokens: torch.Tensor, context: Any = None):
        """``bridge(tokens)`` with ``context`` handed to every callback of this pass (None
        when the capture stopped the pass after its last layer); an encoder-decoder's
        decoder is fed ``tokens`` too."""
        self.context, self.length = context, tokens.shape[-1]
        config = getattr(getattr(self.bridge, "original_model", None), "config", None)
        # an encoder-decoder's decoder reads the same tokens (not shifted right)
        same = {"decoder_input": tokens} if getattr(config, "is_encoder_decoder", False) else {}
        try:
            return self.bridge(tokens, **same)
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
    schemes: Sequence[LayerScheme] | None = None,
) -> Iterator[Capture]:
    """Within the block, every :meth:`Capture.forward` calls ``on_layer`` once per layer
    of ``layers`` (default: all; indices into ``schemes``, whose ``block`` names a hybrid's
    block) with the tensors that enter Q·Kᵀ (keys are not expanded
    for GQA), and with ``hook_attn_scores`` too when ``scores=True`` (the bridge computes
    them anyway when it runs attention eagerly). ``stop``: end each pass right after the
    last of ``layers`` is delivered (see the module docstring). ``schemes``: every layer's
    positional scheme (``model.spec.layers``), needed where the bridge hooks q and k only
    before rotary (GPT-NeoX, Phi-3, GPT-J: :func:`~poskernel_tl.hooks.names.qk_source`)."""
    n_layers = bridge.cfg.n_layers if schemes is None else len(schemes)
    layers = list(range(n_layers) if layers is None else layers)
    last = max(layers) if stop and layers else None
    capture = Capture(bridge)
    hooks = []
    for layer in layers:
        scheme = None if schemes is None else schemes[layer]
        site = site_of(layer, scheme)
        src = qk_source(bridge, site, rope=scheme is not None and scheme.pe == "rope",
                        norm_after_rotary=getattr(scheme, "norm_after_rotary", None) is not None)
        if src.rotation != "as-is" and scheme is None:
            raise ValueError(f"layer {layer}: the bridge hooks q/k before rotary; pass the "
                             "layers' schemes (schemes=model.spec.layers)")
        names = {"q": src.q, "k": src.k}
        if src.angles is not None:
            names.update(cos=src.angles[0], sin=src.angles[1])
        if scores:
            names["scores"] = scores_hook_name(site)
        pending: dict[str, Tensor] = {}

        def emit(layer: int = layer, pending: dict = pending, src: QKSource = src,
                 scheme: LayerScheme | None = scheme) -> None:
            q, k = _finished(pending, src, scheme, capture.length)
            on_layer(CapturedLayer(layer, q, k, pending.pop("scores", None),
                                   capture.context))
            pending.clear()
            if layer == last:
                raise StopForward

        def make(slot: str, pending: dict = pending, emit=emit, n: int = len(names)):
            def hook(x: Tensor, hook) -> None:
                pending[slot] = x
                if len(pending) == n:
                    emit()
            return hook

        hooks += [(name, make(slot)) for slot, name in names.items()]
    with bridge.hooks(fwd_hooks=hooks):
        yield capture


def _finished(pending: dict, src: QKSource, scheme: LayerScheme | None, length: int
              ) -> tuple[Float[Tensor, "batch pos head_index d_head"],
                         Float[Tensor, "batch pos kv_head_index d_head"]]:
    """The layer's q and k as they enter Q·Kᵀ: as hooked, or rotated here by the hooked
    angles or the layer's own frequencies; of a sequence-first capture over a padded input,
    the first ``length`` positions, copied (the model scales its queries in place next)."""
    q, k = pending.pop("q"), pending.pop("k")
    if src.seq_first:  # (a copy: the model scales its queries in place next)
        q, k = (x.transpose(0, 1)[:, :length].contiguous() for x in (q, k))
    if src.heads_first:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    if q.ndim == 3:  # a norm over the whole width (OLMo hybrid): one head per d_head dims
        q, k = q.unflatten(-1, (-1, src.d_head)), k.unflatten(-1, (-1, src.d_head))
    if src.rotation == "as-is":
        return q, k
    if src.rotation == "hooked-angles":
        cos, sin = hooked_angles(pending.pop("cos"), pending.pop("sin"))
    else:
        cos, sin = pair_angles(scheme, q.shape[1], q.device, torch.float64)
    q, k = rotate(q, scheme, cos, sin), rotate(k, scheme, cos, sin)
    eps = scheme.norm_after_rotary
    if eps is not None:  # Llama 4: x·(mean(x²) + ε)^(−1/2) per head, in float32
        q, k = ((x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps))
                .to(x.dtype) for x in (q, k))
    return q, k
