"""The live dashboard a run's cell becomes, and the two renderers every chart of nbtrain goes through.

Runs in the notebook's kernel: ``dashboard`` is the view; ``control_row``,
``worker_table``, ``step_time_plot`` and ``summary_text`` are its parts;
``history`` holds the curves it draws, thinned by ``downsample``; ``front_end`` says
where it is shown and makes its one output. A chart (``chart``: traces and their looks, marks styled by
``mark_styles``, where lines break and which series are points by ``spacing``) is drawn live by
``charts_widget`` (our own anywidget, ``static/``) and as a static picture by ``static_plot``: the run's
dashboard, the sweep dashboard and ``compare()`` each use both.
"""
