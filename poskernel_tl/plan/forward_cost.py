"""What the forward's attention costs, per kind of layer (causal, each sliding window).

On the sdpa path (:mod:`poskernel_tl.hooks.fast_attention`) a causal layer runs sdpa's
causal kernel: about T²/2 entries per head, nothing T×T held. A sliding-window layer of
w tokens runs :func:`~poskernel_tl.hooks.banded.banded_sdpa`: blocks of B queries against
at most 2B + w keys, at most T·(w + 2B) entries per head instead of T² (T·(w + B) for
a window that is a multiple of B: at T = 32,768, w = 512, 1/32 of the full-size masked
call), holding one block's bool mask and, where the kernel falls back to the plain math
path, its float scores. On TransformerLens's own
path every layer forms its [head, T, T] scores, whatever its window.

Hugging Face builds one float [T, T] mask per kind of layer before the first layer
(:func:`mask_bytes`) unless the masks are described instead
(:mod:`poskernel_tl.hooks.lazy_masks`, installed with the sdpa path on rotary bridges).
"""

from dataclasses import dataclass

from poskernel_tl.hooks import banded
from poskernel_tl.hooks.lazy_masks import PREFIX
from poskernel_tl.models.loading import LoadedModel

# [head, T, T] float32 tensors of the forward alive at once per sequence where scores are
# materialised (TransformerLens's eager attention, per layer)
SCORE_COPIES = 8
# a banded block's float32 [head, B, keys] scores alive at once where sdpa falls back to
# its math path (scores, softmax)
BLOCK_COPIES = 2


@dataclass(frozen=True)
class KindCost:
    """The forward's attention on the layers of one kind, per head and sequence."""

    kind: str  # "causal" or "sliding 512"
    layers: tuple[int, ...]
    window: int  # 0: causal
    kept: int  # (query, key) entries the mask keeps
    computed: int  # entries the kernel computes
    work_bytes: int  # bytes one layer's attention holds per sequence (all heads)


def kept_entries(length: int, window: int) -> int:
    """Entries of the causal triangle (window 0) or of a window's band over ``length``."""
    if not window or window >= length:
        return length * (length + 1) // 2
    return length * window - window * (window - 1) // 2


def banded_entries(length: int, window: int) -> int:
    """Entries :func:`~poskernel_tl.hooks.banded.banded_sdpa` computes per head."""
    return sum((end - start) * (end - key_start)
               for start, end, key_start in banded.band_blocks(length, window))


def _kind_cost(kind: str, layers: tuple[int, ...], window: int, n_heads: int, T: int,
               sdpa: bool) -> KindCost:
    window = 0 if window >= T else window
    kept = kept_entries(T, window)
    if not sdpa:
        return KindCost(kind, layers, window, kept, T * T, SCORE_COPIES * n_heads * T * T * 4)
    if not window:
        return KindCost(kind, layers, window, kept, kept, 0)
    block = min(banded.BAND_BLOCK, T)
    keys = min(T, 2 * block + window)
    work = block * keys + BLOCK_COPIES * n_heads * block * keys * 4
    return KindCost(kind, layers, window, kept, banded_entries(T, window), work)


def forward_costs(model: LoadedModel, length: int, sdpa: bool | None = None
                  ) -> list[KindCost]:
    """One :class:`KindCost` per kind of layer (``sdpa``: the fast path; default: the
    bridge's attention)."""
    if sdpa is None:
        sdpa = getattr(model, "attention", "eager") == "sdpa"
    s = model.spec
    kinds: dict[int, list[int]] = {}
    for i, scheme in enumerate(s.layers or ()):
        kinds.setdefault(int(scheme.window or 0) if scheme.mask == "sliding" else 0,
                         []).append(i)
    if not kinds:
        kinds = {0: list(range(s.n_layers))}
    return [_kind_cost(f"sliding {w}" if w else "causal", tuple(layers), w, s.n_heads,
                       length, sdpa) for w, layers in sorted(kinds.items())]


def masks_described(model: LoadedModel) -> bool:
    """Whether Hugging Face describes this model's causal and window masks instead of
    building them (the lazy masks of the sdpa path)."""
    config = getattr(getattr(model, "hf_model", None), "config", None)
    impl = getattr(config, "_attn_implementation", None)
    return isinstance(impl, str) and impl.startswith(PREFIX)


def mask_kinds(model: LoadedModel) -> int:
    """How many float [T, T] attention masks Hugging Face builds per sequence of a batch:
    one per kind of mask its layers use (causal, and each sliding window's)."""
    layers = model.spec.layers or ()
    return max(1, len({(s.mask, s.window) for s in layers}))


def mask_bytes(model: LoadedModel, length: int, built: bool = False) -> int:
    """Bytes of the float [T, T] masks Hugging Face builds per sequence of a batch: one
    per kind of layer; none where the masks are described, unless ``built`` (a layer on
    TransformerLens's path materialises its kind's)."""
    if masks_described(model) and not built:
        return 0
    return mask_kinds(model) * length * length * 4


def attention_bytes(model: LoadedModel, length: int, materialised: bool | None = None
                    ) -> int:
    """Per sequence: the largest layer's attention work (one layer at a time) plus the
    masks built. ``materialised``: TransformerLens's path (T×T scores on every layer, each
    kind's mask built); default: unless the bridge runs the sdpa path."""
    sdpa = getattr(model, "attention", "eager") == "sdpa" if materialised is None \
        else not materialised
    costs = forward_costs(model, length, sdpa)
    return max(c.work_bytes for c in costs) + mask_bytes(model, length, built=not sdpa)


def describe(model: LoadedModel, length: int, sdpa: bool | None = None) -> str:
    """One line per kind, e.g. at T = 32,768 on Gemma-3-270M: ``"3 causal layers: 0.537 G
    entries per head (1/2 of T²); 15 sliding 512 layers: 0.0333 G entries per head (1/32
    of T²)"``."""
    parts = []
    for c in forward_costs(model, length, sdpa):
        share = length * length / max(1, c.computed)
        how = f" (1/{share:.0f} of T²)" if share >= 2 else ""
        parts.append(f"{len(c.layers)} {c.kind} layer{'s' if len(c.layers) > 1 else ''}: "
                     f"{c.computed / 1e9:.3g} G entries per head{how}")
    return "; ".join(parts)


__all__ = ["KindCost", "attention_bytes", "banded_entries", "describe", "forward_costs",
           "kept_entries", "mask_bytes", "mask_kinds", "masks_described"]
