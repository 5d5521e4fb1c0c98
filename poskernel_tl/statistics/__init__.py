"""The per-head statistics computed during the forward, one module each, every one ending
with its ``STATISTIC`` (:class:`~poskernel_tl.statistics.statistic.StatisticSpec`) and
registered by :mod:`~poskernel_tl.statistics.registry`. Each builds its reducer on the
engine of :mod:`poskernel_tl.reducers` from the run's
:class:`~poskernel_tl.statistics.statistic.StatisticContext`."""

from poskernel_tl.statistics.freq_usage import FreqUsage, FreqUsageReducer
from poskernel_tl.statistics.logits import LogitSaver, SavedLogits
from poskernel_tl.statistics.perm_null import PermNull, PermNullReducer
from poskernel_tl.statistics.prev_token import PrevTokenReducer, PrevTokenScore
from poskernel_tl.statistics.whitened_gram import WhitenedGramReducer, WhitenedGramResult

__all__ = ["FreqUsage", "FreqUsageReducer", "LogitSaver", "PermNull", "PermNullReducer",
           "PrevTokenReducer", "PrevTokenScore", "SavedLogits", "WhitenedGramReducer",
           "WhitenedGramResult"]
