"""mkdocs hook: the docstrings' Sphinx roles (:func:`x`, :class:`~a.b.C`) read as code on
the API pages (mkdocstrings renders the role's text as is)."""

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|data|meth|attr|obj|exc|const):(?=<code)")
TILDE = re.compile(r"<code>~([\w.]*\.)?")


def on_page_content(html, **kwargs):
    return TILDE.sub("<code>", ROLE.sub("", html))
