"""The live dashboard a run's cell becomes, and the static picture it falls back to.

Runs in the notebook's kernel: ``dashboard`` is the view; ``control_row``,
``worker_table``, ``step_time_plot`` and ``summary_text`` are its parts;
``charts_widget`` draws its curves in the browser (our own anywidget, ``static/``);
``history`` holds the curves it draws, thinned by ``downsample``; ``front_end`` says
where it is shown and makes its one output; ``static_plot`` is that output's fallback.
"""
