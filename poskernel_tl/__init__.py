"""poskernel_tl: how shift-invariant is each attention head's positional kernel?

The public API, re-exported from the layers below (the package's top layer). Each name
loads its module on first access (PEP 562): ``import poskernel_tl`` alone imports no
torch, so that the command line can answer ``--help`` and check its flags before it pays
for torch, transformers and TransformerLens.
"""

import importlib
from typing import TYPE_CHECKING

from poskernel_tl.constants import VERSION

if TYPE_CHECKING:  # the names below, for type checkers and editors
    from poskernel_tl.analyses.spectral.align import spectral_alignment
    from poskernel_tl.apps.head_view import HeadView, inspect_head
    from poskernel_tl.apps.head_zoom import HeadZoom
    from poskernel_tl.errors import UserError
    from poskernel_tl.fit.toeplitz import shift_invariance_r2
    from poskernel_tl.measurement.measure import measure
    from poskernel_tl.measurement.result import ConditionResult
    from poskernel_tl.models.loading import LoadedModel, load_model
    from poskernel_tl.models.registry import REGISTRY, ModelSpec, resolve
    from poskernel_tl.report import plots

# name → the module that defines it
_API = {
    "spectral_alignment": "poskernel_tl.analyses.spectral.align",
    "HeadView": "poskernel_tl.apps.head_view",
    "inspect_head": "poskernel_tl.apps.head_view",
    "HeadZoom": "poskernel_tl.apps.head_zoom",
    "UserError": "poskernel_tl.errors",
    "shift_invariance_r2": "poskernel_tl.fit.toeplitz",
    "measure": "poskernel_tl.measurement.measure",
    "ConditionResult": "poskernel_tl.measurement.result",
    "LoadedModel": "poskernel_tl.models.loading",
    "load_model": "poskernel_tl.models.loading",
    "REGISTRY": "poskernel_tl.models.registry",
    "ModelSpec": "poskernel_tl.models.registry",
    "resolve": "poskernel_tl.models.registry",
    "plots": "poskernel_tl.report.plots",
}

__version__ = VERSION


def __getattr__(name: str):
    if name in _API:
        module = importlib.import_module(_API[name])
        value = module if name == "plots" else getattr(module, name)
        globals()[name] = value  # later accesses skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


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
