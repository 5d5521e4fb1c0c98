"""The family registry: every module of this folder ending with its ``FAMILY`` (a
:class:`~poskernel_tl.models.families.family.Family`) claims the ``config.model_type``
values it names. Adding a family: one module here; nothing else to edit.
"""

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from poskernel_tl.models.families.family import Family


def discover() -> dict[str, Family]:
    """model_type -> its family, from every module of this folder that defines one."""
    found: dict[str, Family] = {}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        family = getattr(importlib.import_module(f"{__package__}.{info.name}"), "FAMILY", None)
        if isinstance(family, Family):
            for kind in family.MODEL_TYPES:
                if kind in found:
                    raise ValueError(f"model type {kind!r} is claimed by {found[kind].NAME} "
                                     f"and {family.NAME}")
                found[kind] = family
    return found


FAMILIES: dict[str, Family] = discover()


def family_of(cfg: Any) -> Family | None:
    """The family claiming ``cfg.model_type``, or None (the generic path)."""
    return FAMILIES.get(getattr(cfg, "model_type", None))


__all__ = ["FAMILIES", "discover", "family_of"]
