"""Fused tiled kernels for the statistics on a GPU (Triton), and the one rule that says
when the reducers take them.

On a CPU the reducers stream running moments in chunks, so that no T × T block is ever
held (:mod:`poskernel_tl.reducers.lag_sums`). On a GPU that design turns into tens of
thousands of tiny launches, while a T × T tile of logits is cheap: there the reducers
read the same sums from a few tiled kernels per batch, each launched once for every layer
of a group (:mod:`poskernel_tl.plan.groups`) —

- :mod:`~poskernel_tl.kernels.lag_tiles`: per head and lag Σ logit and Σ logit² over the
  strictly lower triangle (a window, a permutation of the positions, every draw of the
  null in one launch), for Track A and the permutation null;
- :mod:`~poskernel_tl.kernels.strip_regions`: the sums of Track A's regions (the
  variants) over the strip of the first keys, every region in one launch;
- :mod:`~poskernel_tl.kernels.pattern_pass`: each query row's normaliser under the layer's
  mask and, from it, every sum the pattern statistics read, in one pass;
- :mod:`~poskernel_tl.kernels.gram_tiles`: Track B's accumulator of Σ_x q̃ k̃ᵀ, every row
  block of every layer of a group in one launch, and :mod:`~poskernel_tl.kernels.gram_fit_tiles` its
  fit's pieces read from it by tiles;

each forming its logits as the layer's softmax reads them
(:mod:`~poskernel_tl.kernels.tile_logits`: the scale, a temperature, ALiBi, the soft-cap).

:func:`~poskernel_tl.kernels.dispatch.active` is the rule, and
:func:`~poskernel_tl.kernels.dispatch.takes` the same for a layer's mask (no chunk binds),
read by :attr:`~poskernel_tl.reducers.base.LayerBatch.on_kernels` and Track B: CUDA
tensors take the kernels when Triton imports; CPU tensors never do, unless
:func:`forced` (the tests, under ``TRITON_INTERPRET=1``, Triton's interpreter on CPU
tensors). ``POSKERNEL_KERNELS=0`` keeps a GPU on the chunked CPU path. Triton is
imported only when a kernel is first used (the entry points below load their module on
first access): a CPU install needs none.
"""

import importlib

from poskernel_tl.kernels.dispatch import active, forced, interpreting, takes

# the kernels' entry points, importable as ``kernels.NAME`` without importing Triton
# until one is first used (PEP 562)
_ENTRY = {"lag_tile_sums": "lag_tiles", "pattern_sums": "pattern_pass",
          "strip_region_sums": "strip_regions",
          "gram_tile_update": "gram_tiles", "gram_layout": "gram_tiles",
          "layer_views": "gram_tiles",
          "block_table": "gram_fit_tiles", "stored_lag_sums": "gram_fit_tiles",
          "stored_apply": "gram_fit_tiles"}


def __getattr__(name: str):
    if name in _ENTRY:
        module = importlib.import_module(f"{__name__}.{_ENTRY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["active", "block_table", "forced", "gram_layout", "gram_tile_update",
           "interpreting", "lag_tile_sums", "layer_views", "pattern_sums", "stored_apply",
           "stored_lag_sums", "strip_region_sums", "takes"]
