"""Streaming reducers fed by the hook layer, one per file, registered by name."""

from poskernel_tl.reducers.base import LayerBatch, Reducer
from poskernel_tl.reducers.centering import CenteringReducer
from poskernel_tl.reducers.freq_usage import FreqUsageReducer
from poskernel_tl.reducers.gram import GramReducer
from poskernel_tl.reducers.track_a import NonFiniteError, TrackAReducer
from poskernel_tl.reducers.whitened_gram import WhitenedGramReducer

REDUCERS: dict[str, type[Reducer]] = {
    r.name: r for r in (TrackAReducer, CenteringReducer, GramReducer, FreqUsageReducer,
                        WhitenedGramReducer)
}

__all__ = ["REDUCERS", "CenteringReducer", "FreqUsageReducer", "GramReducer", "LayerBatch",
           "NonFiniteError", "Reducer", "TrackAReducer", "WhitenedGramReducer"]
