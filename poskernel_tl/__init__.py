"""poskernel_tl: how shift-invariant is each attention head's positional kernel?"""

from poskernel_tl.loading import LoadedModel, load_model
from poskernel_tl.registry import REGISTRY, ModelSpec, resolve
from poskernel_tl.toeplitz import shift_invariance_r2

__all__ = [
           "REGISTRY",
           "LoadedModel",
           "ModelSpec",
           "load_model",
           "resolve",
           "shift_invariance_r2",
]
__version__ = "0.1.0"
