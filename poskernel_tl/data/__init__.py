"""The sequences: text sources by dataset name, the sequence files built from them and
what ``pk.measure`` accepts as sequences."""
