"""The live dashboard a run's cell becomes, and the two renderers every chart of nbtrain goes through.

Runs in the notebook's kernel: ``dashboard`` is the view, drawn in one widget (``dashboard_widget``: its
parts as traits, points and logs as increments, the page's clicks as messages); ``controls`` (what the control
row shows and what its clicks call), ``log_panes``, ``workers_view``, ``step_time_plot`` and ``summary_text``
are its parts; ``history`` holds the curves it draws, thinned by ``downsample``; ``front_end`` says where it is
shown and makes its one output. A chart (``chart``: traces and their looks, marks styled by ``mark_styles``,
where lines break and which series are points by ``spacing``) is drawn live by ``static/charts.js`` (in
``charts_widget``, our own anywidget, and inside the dashboard's widget) and as a static picture by
``static_plot``: the run's dashboard, the sweep dashboard and ``compare()`` each use both.
"""
