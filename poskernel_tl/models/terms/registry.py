"""The term registry: every positional term a layer's softmax may read
(:class:`~poskernel_tl.models.terms.term.Term`), in listing order. Adding a term: one module
in this folder ending with its ``TERM`` (the class); nothing else to edit.
"""

import importlib
import pkgutil
from pathlib import Path

from poskernel_tl.models.terms.term import KINDS, Term


def check(term: type[Term]) -> None:
    """A ValueError where ``term`` is not a term the fits can read: a kind none of
    :data:`~poskernel_tl.models.terms.term.KINDS`, or an offset term that neither folds
    into q and k nor gives its known kernel (what the fits add to the scores)."""
    if term.KIND not in KINDS:
        raise ValueError(f"term {term.NAME!r}: kind {term.KIND!r} is none of {KINDS}")
    if term.KIND == "offset" and not term.FOLDS and term.known_kernel is Term.known_kernel:
        raise ValueError(f"term {term.NAME!r}: an offset term that does not fold into q and "
                         "k needs its known_kernel (what the fits add to the scores)")


def discover() -> dict[str, type[Term]]:
    """The ``TERM`` of every module of this folder that defines one, by name, in ORDER."""
    found: dict[str, type[Term]] = {}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        term = getattr(importlib.import_module(f"{__package__}.{info.name}"), "TERM", None)
        if isinstance(term, type) and issubclass(term, Term):
            if term.NAME in found:
                raise ValueError(f"two terms are named {term.NAME!r}")
            check(term)
            found[term.NAME] = term
    return dict(sorted(found.items(), key=lambda kv: kv[1].ORDER))


TERMS: dict[str, type[Term]] = discover()

__all__ = ["TERMS", "check", "discover"]
