"""The progress bar every long step shows: tqdm's notebook widget where ``ipywidgets`` is
installed (``pip install poskernel_tl[notebook]``), text bars otherwise — chosen here, so a
notebook without the widgets gets text bars and no ``TqdmWarning``."""

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm

__all__ = ["tqdm"]
