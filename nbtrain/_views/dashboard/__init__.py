"""The live dashboard a run's cell becomes, and the static picture it leaves in the saved notebook.

Runs in the notebook's kernel: ``dashboard`` is the widget; ``control_row``,
``worker_table``, ``step_time_plot`` and ``summary_text`` are its parts;
``history`` holds the curves it draws, thinned by ``downsample``; ``static_plot``
is what a finished run leaves behind.
"""
