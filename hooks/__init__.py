"""The capture layer: hook names per architecture, GQA head map, rotary pairing, and
the context manager that streams post-rotary q/k into reducers."""

from poskernel_tl.hooks.capture import Capture, CapturedLayer, capture_qk
from poskernel_tl.hooks.names import kv_head_map, logit_scale, qk_hook_names, scores_hook_name
from poskernel_tl.hooks.rotary import pairs_from_cos, rotary_pairs

__all__ = ["Capture", "CapturedLayer", "capture_qk", "kv_head_map", "logit_scale",
           "pairs_from_cos", "qk_hook_names", "rotary_pairs", "scores_hook_name"]
