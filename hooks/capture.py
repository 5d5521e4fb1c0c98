"""Stream per-layer post-rotary queries and keys from a forward pass into a callback.

Only the hooks asked for are attached, through the bridge's ``hooks`` context manager;
the hook functions observe and return None, so the forward pass is unchanged and no
activation cache is built.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from jaxtyping import Float
from torch import Tensor

from poskernel_tl.hooks.names import qk_hook_names, scores_hook_name

QKCallback = Callable[
    [int, Float[Tensor, "batch pos head_index d_head"],
     Float[Tensor, "batch pos kv_head_index d_head"]],
    None,
]
ScoresCallback = Callable[[int, Float[Tensor, "batch head_index query_pos key_pos"]], None]


@contextmanager
def capture_qk(
    bridge,
    on_qk: QKCallback,
    layers: Sequence[int] | None = None,
    on_scores: ScoresCallback | None = None,
) -> Iterator[None]:
    """Within the block, each forward pass of ``bridge`` calls ``on_qk(layer, q, k)``
    once per layer with the tensors that enter Q·Kᵀ (keys are not expanded for GQA; use
    :func:`poskernel_tl.hooks.kv_head_map`), and ``on_scores(layer, scores)`` with
    ``hook_attn_scores`` when given (masked entries hold an unspecified fill value: read
    the lower triangle by index)."""
    if layers is None:
        layers = range(bridge.cfg.n_layers)
    hooks = []
    for layer in layers:
        q_name, k_name = qk_hook_names(bridge, layer)
        pending: dict[str, Tensor] = {}

        def make(slot: str, layer: int = layer, pending: dict = pending):
            def hook(x: Tensor, hook) -> None:
                pending[slot] = x
                if "q" in pending and "k" in pending:
                    q, k = pending.pop("q"), pending.pop("k")
                    on_qk(layer, q, k)
            return hook

        hooks += [(q_name, make("q")), (k_name, make("k"))]
        if on_scores is not None:
            def scores_hook(x: Tensor, hook, layer: int = layer) -> None:
                on_scores(layer, x)

            hooks.append((scores_hook_name(layer), scores_hook))
    with bridge.hooks(fwd_hooks=hooks):
        yield
