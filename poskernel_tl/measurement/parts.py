"""The parts a :class:`~poskernel_tl.measurement.result.ConditionResult` is composed of:
Track A, Track B, the centering means and S_PE, then every statistic of the registry
(:data:`~poskernel_tl.reducers.registry.STATISTICS`), and which part declares each field."""

import dataclasses
import functools

from poskernel_tl.measurement.pe_kernel import PEKernel
from poskernel_tl.reducers import CenteringMeans, GramResult, TrackAResult
from poskernel_tl.reducers.registry import STATISTICS
from poskernel_tl.schema import Part

CORE_PARTS: tuple[type[Part], ...] = (TrackAResult, GramResult, CenteringMeans, PEKernel)
UNSHOWN = ("seq_index", "eval_moments", "perms", "n_seqs", "seed")


def part_classes() -> tuple[type[Part], ...]:
    """Track A, Track B, the centering means and S_PE, then every registered statistic's
    part (read from the registry each time: a statistic registered later joins)."""
    return CORE_PARTS + tuple(s.part for s in STATISTICS.values())


@functools.cache
def _owners(classes: tuple[type[Part], ...]) -> dict[str, type[Part]]:
    return {f.name: cls for cls in classes for f in dataclasses.fields(cls)
            if f.name not in UNSHOWN}


def owner() -> dict[str, type[Part]]:
    """Field name -> the part that declares it (fields a result does not show left out)."""
    return _owners(part_classes())


def build_part(cls: type[Part], values: dict) -> Part:
    """A part from some of its fields; the rest take their defaults (None where absent)."""
    for f in dataclasses.fields(cls):
        if f.name not in values and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            values[f.name] = None
    return cls(**values)


__all__ = ["CORE_PARTS", "UNSHOWN", "build_part", "owner", "part_classes"]
