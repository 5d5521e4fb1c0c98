"""The positional terms a layer's softmax may read beyond scale·q·k, one module each
(:mod:`~poskernel_tl.models.terms.term`, :mod:`~poskernel_tl.models.terms.registry`)."""
