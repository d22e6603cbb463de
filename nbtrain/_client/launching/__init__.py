"""Starting a run from the notebook: ``launch()``, ``attach()``, ``runs()`` and the checks before them.

Runs in the notebook's process, before any rank exists. Every run starts by one path
(``starting``): the training function checked for shipping (``serialization``), the spec
and the cluster's room checked (``checks``, ``room``), then the run's supervisor created.
"""
