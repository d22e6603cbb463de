"""A rank: the worker actor that runs the user's function (:mod:`.actor`, the top of the process), its
training session (what ``report()`` talks to), the worker-side API (``prepare_model``, ``prepare_loader``,
checkpoints), and the seam through which Ray Train code's own calls (``ray.train.report``,
``get_checkpoint``...) reach the same session, put in place when the run's code imports ``ray.train``.

Runs in each rank's process. The supervisor imports :mod:`.actor.worker` and :mod:`.payload` only to
create the actors and tell each what to run.
"""
