"""The analysis registry: every analysis's :class:`~poskernel_tl.analyses.base.AnalysisSpec`
by name. ``poskernel analyze NAME`` (its subcommands and flags), the grid's
``--analyses`` and the report iterate over :data:`REGISTRY`.

Adding an analysis: one module or package with its ``SPEC`` (see ``base.py``):
``analyses/my_analysis.py``, or ``analyses/my_analysis/`` when it needs several modules,
its ``__init__`` holding the entry points and the ``SPEC``; then add the ``SPEC`` to
:data:`REGISTRY` below.
"""



from poskernel_tl.analyses import (
    fourier_kernel,
    freq_usage,
    gk_baseline,
    kernel_patching,
    mean_field,
    pe_correlation,
    qig_kernel,
    separable,
    sequence_pca,
    spectral,
)
from poskernel_tl.analyses.base import AnalysisSpec
from poskernel_tl.analyses.sequence_pca import compression
from poskernel_tl.errors import UnknownNameError

REGISTRY: dict[str, AnalysisSpec] = {s.name: s for s in (
    spectral.SPEC, freq_usage.SPEC, gk_baseline.SPEC, fourier_kernel.SPEC, sequence_pca.SPEC,
    qig_kernel.SPEC, kernel_patching.SPEC, separable.SPEC, mean_field.SPEC,
    pe_correlation.SPEC, compression.SPEC)}


def get(name: str) -> AnalysisSpec:
    """The spec of analysis ``name`` (an UnknownNameError lists the valid names)."""
    if name not in REGISTRY:
        raise UnknownNameError(f"unknown analysis {name!r}; choose one of "
                               f"{', '.join(REGISTRY)}")
    return REGISTRY[name]
