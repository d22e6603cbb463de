"""Where a run is kept: its directory on the head node (history as an append-only log, state,
checkpoints) and ``storage=`` paths or URIs for checkpoints.

Used by the supervisor, the ranks (checkpoints) and the notebook (loading a checkpoint).
"""
