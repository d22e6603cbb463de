"""Starting a run from the notebook: ``launch()``, ``attach()``, ``runs()`` and the checks before them.

Runs in the notebook's process, before any rank exists: the training function is
checked for shipping (``serialization``), the options and the cluster's room are
checked (``checks``, ``data_room``), then the run's supervisor is created (``launch``).
"""
