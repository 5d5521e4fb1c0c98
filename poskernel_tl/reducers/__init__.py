"""The engine the statistics stand on, fed by the hook layer one layer batch at a time
(protocol: ``base.py``): Track A's lag sums, bands and regions, Track B's Gram, the
centering moments, the rows of the attention pattern. The per-head statistics that plug
into a run are in :mod:`poskernel_tl.statistics`."""

from poskernel_tl.reducers.base import LayerBatch, Reducer, Workspace
from poskernel_tl.reducers.gram import GramReducer
from poskernel_tl.reducers.gram_result import GramResult
from poskernel_tl.reducers.moments import CenteringMeans, Moments, MomentsReducer
from poskernel_tl.reducers.track_a import TrackAReducer
from poskernel_tl.reducers.track_a_result import TrackAResult

__all__ = ["CenteringMeans", "GramReducer", "GramResult", "LayerBatch", "Moments",
           "MomentsReducer", "Reducer", "TrackAReducer", "TrackAResult", "Workspace"]
