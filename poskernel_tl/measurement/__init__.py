"""The measurement: ``pk.measure`` (both tracks for a set of sequences), the result it
returns and the head-projected positional kernel of learned-absolute-PE models."""
