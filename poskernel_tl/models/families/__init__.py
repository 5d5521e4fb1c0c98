"""One module per model family: what is particular to it (:mod:`.family`)."""
