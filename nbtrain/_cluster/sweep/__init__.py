"""Sweeps: the sweep's supervisor (a detached actor running Ray Tune's ``Tuner`` on the head node) and
a trial as Tune sees it, a trainable whose training is an nbtrain run.

Runs in the sweep supervisor's process and in each trial's actor.
"""
