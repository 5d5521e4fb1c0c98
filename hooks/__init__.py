"""The capture layer: hook names per architecture, GQA head map, rotary pairing, and
the context manager that streams post-rotary q/k into reducers."""

from poskernel_tl.hooks.capture import Capture, CapturedLayer, capture_qk
from poskernel_tl.hooks.names import (
    block_site,
    kv_head_map,
    logit_scale,
    qk_hook_names,
    qk_source,
    scores_hook_name,
)
from poskernel_tl.hooks.rotary import pair_indices, rotate

__all__ = ["Capture", "CapturedLayer", "block_site", "capture_qk", "kv_head_map", "logit_scale",
           "pair_indices", "qk_hook_names", "qk_source", "rotate", "scores_hook_name"]
