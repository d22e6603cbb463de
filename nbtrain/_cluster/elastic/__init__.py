"""Elastic runs: how many ranks a run should have and why it changes (:mod:`.policy`, the sizing policy the
run's controller asks, and its rules in :mod:`.sizing`; in the supervisor), and per-rank batch sizes from the
gradient noise scale (:mod:`.gradient_noise`, :mod:`.adaptive_batch`, in the ranks).
"""
