"""The term registry: every positional term a layer's softmax may read
(:class:`~poskernel_tl.models.terms.term.Term`), in listing order. Adding a term: one module
in this folder ending with its ``TERM`` (the class); nothing else to edit.
"""

from poskernel_tl.models.terms.term import KINDS, Term
from poskernel_tl.plugins import by_name, discover


def check(term: type[Term]) -> None:
    """A ValueError where ``term`` is not a term the fits can read: a kind none of
    :data:`~poskernel_tl.models.terms.term.KINDS`, or an offset term that neither folds
    into q and k nor gives its known kernel (what the fits add to the scores)."""
    if term.KIND not in KINDS:
        raise ValueError(f"term {term.NAME!r}: kind {term.KIND!r} is none of {KINDS}")
    if term.KIND == "offset" and not term.FOLDS and term.known_kernel is Term.known_kernel:
        raise ValueError(f"term {term.NAME!r}: an offset term that does not fold into q and "
                         "k needs its known_kernel (what the fits add to the scores)")


def terms() -> dict[str, type[Term]]:
    """The ``TERM`` of every module of this folder that defines one, checked, by name, in
    ORDER."""
    found = discover(__package__, "TERM", lambda x: isinstance(x, type) and issubclass(x, Term))
    for term in found:
        check(term)
    return by_name(sorted(found, key=lambda t: t.ORDER), lambda t: t.NAME, "terms")


TERMS: dict[str, type[Term]] = terms()

__all__ = ["TERMS", "check", "terms"]
