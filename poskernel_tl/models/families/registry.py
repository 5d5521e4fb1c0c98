"""The family registry: every module of this folder ending with its ``FAMILY`` (a
:class:`~poskernel_tl.models.families.family.Family`) claims the ``config.model_type``
values it names. Adding a family: one module here; nothing else to edit.
"""

from typing import Any

from poskernel_tl.models.families.family import Family
from poskernel_tl.plugins import discover


def families() -> dict[str, Family]:
    """model_type -> its family, from every module of this folder that defines one."""
    found: dict[str, Family] = {}
    for family in discover(__package__, "FAMILY", lambda x: isinstance(x, Family)):
        for kind in family.MODEL_TYPES:
            if kind in found:
                raise ValueError(f"model type {kind!r} is claimed by {found[kind].NAME} "
                                 f"and {family.NAME}")
            found[kind] = family
    return found


FAMILIES: dict[str, Family] = families()


def family_of(cfg: Any) -> Family | None:
    """The family claiming ``cfg.model_type``, or None (the generic path)."""
    return FAMILIES.get(getattr(cfg, "model_type", None))


__all__ = ["FAMILIES", "families", "family_of"]
