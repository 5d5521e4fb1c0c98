"""Streaming reducers fed by the hook layer (one per file)."""
