"""The one path that starts a run, whoever asks: ``launch()``, ``run.fork()``, ``resume=True``, a sweep's template.

Runs in the notebook's process, before any rank exists. ``starting`` checks the spec once and starts
the run's supervisor: the training function checked for shipping (``serialization``), the spec and
the cluster's room checked (``checks``, ``room``). It hands back the supervisor's handle; the callers
above (``_client/entry``'s ``launch()``, ``_client/run``'s ``fork()``) make the ``Run`` of it, so this
folder imports neither of theirs.
"""
