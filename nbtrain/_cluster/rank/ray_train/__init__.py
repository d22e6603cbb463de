"""Ray Train code on nbtrain's ranks: ``ray.train.report``, ``get_context`` and checkpoints, answered by nbtrain.

Runs in the rank: ``seam`` answers Ray Train's calls from nbtrain's session, and
``on_import`` installs it when the user's code imports ``ray.train``.
"""
