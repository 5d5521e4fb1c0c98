"""poskernel_tl: how shift-invariant is each attention head's positional kernel?"""

__version__ = "0.2.0"

from poskernel_tl.inspect import HeadView, inspect_head  # noqa: E402
from poskernel_tl.loading import LoadedModel, load_model  # noqa: E402
from poskernel_tl.measure import measure  # noqa: E402
from poskernel_tl.registry import REGISTRY, ModelSpec, resolve  # noqa: E402
from poskernel_tl.result import ConditionResult  # noqa: E402
from poskernel_tl.toeplitz import shift_invariance_r2  # noqa: E402


def spectral_alignment(g, thetas, *, length=None, **kw) -> dict:
    """Spectral alignment of one head's g(Δ) with rotary frequencies θ_i; see
    :func:`poskernel_tl.analyses.spectral.spectral_alignment`."""
    from poskernel_tl.analyses.spectral import spectral_alignment as run

    return run(g, thetas, length=length, **kw)

__all__ = [
    "REGISTRY",
    "ConditionResult",
    "HeadView",
    "LoadedModel",
    "ModelSpec",
    "inspect_head",
    "load_model",
    "measure",
    "resolve",
    "shift_invariance_r2",
    "spectral_alignment",
]
