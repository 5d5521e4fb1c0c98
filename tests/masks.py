"""The tests' shorthand for the masks a reducer is built from: ``n_layers`` layers of length
``T``, their last kept offsets ``lasts`` and binding ``chunks`` (None: none), as
:attr:`~poskernel_tl.models.geometry.Geometry.masks` gives a run's."""

from poskernel_tl.mask import Mask


def masks(T: int, n_layers: int = 1, causal: bool = True, lasts=None, chunks=None
          ) -> list[Mask]:
    lasts = [None] * n_layers if lasts is None else list(lasts)
    chunks = [None] * n_layers if chunks is None else list(chunks)
    if len(lasts) != n_layers or len(chunks) != n_layers:
        raise ValueError(f"{n_layers} layers, {len(lasts)} lasts, {len(chunks)} chunks")
    return [Mask(T, causal, last, chunk) for last, chunk in zip(lasts, chunks)]
