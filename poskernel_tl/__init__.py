"""poskernel_tl: how shift-invariant is each attention head's positional kernel?

The public API, re-exported from the layers below (the package's top layer).
"""

from poskernel_tl.analyses.spectral.align import spectral_alignment
from poskernel_tl.apps.head_view import HeadView, inspect_head
from poskernel_tl.apps.head_zoom import HeadZoom
from poskernel_tl.constants import VERSION
from poskernel_tl.errors import UserError
from poskernel_tl.fit.toeplitz import shift_invariance_r2
from poskernel_tl.measurement.measure import measure
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.loading import LoadedModel, load_model
from poskernel_tl.models.registry import REGISTRY, ModelSpec, resolve
from poskernel_tl.report import plots

__version__ = VERSION

__all__ = [
    "REGISTRY",
    "ConditionResult",
    "HeadView",
    "HeadZoom",
    "LoadedModel",
    "ModelSpec",
    "UserError",
    "__version__",
    "inspect_head",
    "load_model",
    "measure",
    "plots",
    "resolve",
    "shift_invariance_r2",
    "spectral_alignment",
]
