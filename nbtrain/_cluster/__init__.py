"""Code that runs on the Ray cluster: a run's supervisor actor and its parts, the worker actors,
and the worker-side API a training function calls (``report``, ``prepare_model``, checkpoints).

The kernel imports from here only the actor classes it starts and small pure helpers
(names, the spec, checkpoint loading); everything else runs inside actors.
"""
