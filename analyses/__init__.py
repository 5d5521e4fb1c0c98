"""Analyses built on the core measurements: one module per analysis, or one package
when it needs several (its ``__init__`` holds the entry points and the ``SPEC``)."""
