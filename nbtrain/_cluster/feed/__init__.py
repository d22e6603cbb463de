"""The feed: a run's history and the cursor notebooks read it through; how pushes get there from the
ranks (directly, or gathered by a node's relay); and the metric loggers (TensorBoard, MLflow) that
write the same rows where teams already look.

:mod:`.feed` and :mod:`.metric_loggers` run in the supervisor's process, :mod:`.push_relay` in one
actor per node, :mod:`.relay_link` in each rank.
"""
