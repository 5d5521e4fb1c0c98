"""The one rule every registry of the project follows (statistics, positional terms, model
families, analyses): a part is one module (or package) of its folder that defines the
folder's attribute (``STATISTIC``, ``TERM``, ``FAMILY``, ``SPEC``); :func:`discover` finds
them all, so adding one is adding its module and nothing else.
"""

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any


def discover(package: str, attribute: str, accept: Callable[[Any], bool]) -> list[Any]:
    """The ``attribute`` of every module or package directly inside ``package`` (a dotted
    name) that defines one ``accept`` takes, in the order of the modules' names."""
    folder = importlib.import_module(package).__path__
    found = []
    for info in sorted(pkgutil.iter_modules(folder), key=lambda i: i.name):
        value = getattr(importlib.import_module(f"{package}.{info.name}"), attribute, None)
        if value is not None and accept(value):
            found.append(value)
    return found


def by_name(parts: list[Any], name: Callable[[Any], str], what: str) -> dict[str, Any]:
    """``parts`` by name, in their order; a ValueError where two share one."""
    out: dict[str, Any] = {}
    for part in parts:
        key = name(part)
        if key in out:
            raise ValueError(f"two {what} are named {key!r}")
        out[key] = part
    return out


__all__ = ["by_name", "discover"]
