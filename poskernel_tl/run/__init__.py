"""Running conditions: one condition end to end, a registered analysis on one condition,
the grid (resumable, shardable, its manifest) and its cluster executor."""
