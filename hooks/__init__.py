"""The capture layer: hook names per architecture, GQA head map, streaming context."""

from poskernel_tl.hooks.capture import capture_qk
from poskernel_tl.hooks.names import kv_head_map, logit_scale, qk_hook_names, scores_hook_name

__all__ = ["capture_qk", "kv_head_map", "logit_scale", "qk_hook_names", "scores_hook_name"]
from poskernel_tl.hooks.rotary import rotary_pairs

__all__ += ["rotary_pairs"]
