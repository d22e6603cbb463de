"""One run as the notebook holds it: the :class:`~nbtrain.Run` handle and what it does.

Runs in the notebook's process. ``handle`` is the ``Run``, made of parts it holds; ``reader`` is what
every part and every view reads the run through (``run.reader``, and the channel to its supervisor).
The parts: acting on the run (``control``, and ``forking``), reading what it kept (``files``,
``checkpoint_files``, ``stored``), looking inside it (``inspection``, ``debugging``) and waiting for it
(``following``).
"""
