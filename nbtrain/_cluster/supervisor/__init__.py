"""The run supervisor's process (one detached actor per run, on the head node): the actor and its faces
for ranks and notebooks, the controller that runs its attempts with the callbacks it is handed, the worker
group of each attempt and how a failed attempt is judged, the run's history and the cursor feed notebooks
read it through (:mod:`.feed`), its metric loggers, and its side of steering.

:mod:`.stored_run` also runs in a short task on the head node that answers for a finished run.
"""
