"""Streaming reducers fed by the hook layer, one per file (protocol: ``base.py``)."""

from poskernel_tl.reducers.base import LayerBatch, Reducer, Workspace
from poskernel_tl.reducers.freq_usage import FreqUsage, FreqUsageReducer
from poskernel_tl.reducers.gram import GramReducer
from poskernel_tl.reducers.gram_result import GramResult
from poskernel_tl.reducers.logits import LogitSaver, SavedLogits
from poskernel_tl.reducers.moments import CenteringMeans, Moments, MomentsReducer
from poskernel_tl.reducers.perm_null import PermNull, PermNullReducer
from poskernel_tl.reducers.prev_token import PrevTokenReducer, PrevTokenScore
from poskernel_tl.reducers.track_a import TrackAReducer
from poskernel_tl.reducers.track_a_result import TrackAResult
from poskernel_tl.reducers.whitened_gram import WhitenedGramReducer, WhitenedGramResult

__all__ = ["CenteringMeans", "FreqUsage", "FreqUsageReducer", "GramReducer", "GramResult",
           "LayerBatch", "LogitSaver", "Moments", "MomentsReducer", "PermNull",
           "PermNullReducer", "PrevTokenReducer", "PrevTokenScore", "Reducer", "SavedLogits",
           "TrackAReducer", "TrackAResult",
           "Workspace", "WhitenedGramReducer", "WhitenedGramResult"]
