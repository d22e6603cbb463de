"""Seeing inside a rank while it trains or after it fails; runs in the rank's process, never on its step.

Where the time goes (``step_timing``, ``resources``), where each thread is now
(``stacks``), a profile of a few steps (``profiling``), and the frames of a rank
that raised (``post_mortem``).
"""
