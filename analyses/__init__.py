"""Analyses built on the core measurements (one module per analysis)."""
