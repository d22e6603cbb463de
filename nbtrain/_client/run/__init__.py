"""One run as the notebook holds it: the :class:`~nbtrain.Run` handle and what it does.

Runs in the notebook's process. ``handle`` is the reader of a run's supervisor;
the other modules are the handle's faces: acting on the run (``control``,
``forking``), reading what it kept (``files``, ``checkpoint_files``, ``stored``),
looking inside it (``inspection``, ``debugging``) and waiting for it (``following``).
"""
