"""Warm workers: a notebook session's idle rank processes kept for its next run of the same shape,
the session's anchor actor that owns them, and a spare process for a relaunch's supervisor.

:mod:`.warm_pool` runs in the supervisor that leases the workers, :mod:`.session_anchor` in one
actor per notebook session, :mod:`.spare_process` on the head node.
"""
