"""A run: its supervisor (the detached actor that owns it), the controller that runs its attempts,
the worker group of each attempt and how a failed attempt is judged; and a run read from its
files once no supervisor holds it.

Runs in the supervisor's process (one per run, on the head node); :mod:`.stored_run` also in a
short task on the head node that answers for a finished run.
"""
