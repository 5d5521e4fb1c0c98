"""The analysis registry: every analysis's :class:`~poskernel_tl.analyses.base.AnalysisSpec`
by name. ``poskernel analyze NAME`` (its subcommands and flags), the grid's
``--analyses`` and the report iterate over :data:`REGISTRY`.

Adding an analysis: one module or package of this folder with its ``SPEC`` (see
``base.py``): ``analyses/my_analysis.py``, or ``analyses/my_analysis/`` when it needs
several modules, its ``__init__`` holding the entry points and the ``SPEC``; every one
that defines a ``SPEC`` is registered (:func:`~poskernel_tl.plugins.discover`), listed by
its ``order``; nothing else to edit.
"""


from poskernel_tl.analyses.base import AnalysisSpec
from poskernel_tl.errors import UnknownNameError
from poskernel_tl.plugins import by_name, discover

REGISTRY: dict[str, AnalysisSpec] = by_name(
    sorted(discover(__package__, "SPEC", lambda x: isinstance(x, AnalysisSpec)),
           key=lambda s: (s.order, s.name)), lambda s: s.name, "analyses")


def get(name: str) -> AnalysisSpec:
    """The spec of analysis ``name`` (an UnknownNameError lists the valid names)."""
    if name not in REGISTRY:
        raise UnknownNameError(f"unknown analysis {name!r}; choose one of "
                               f"{', '.join(REGISTRY)}")
    return REGISTRY[name]
