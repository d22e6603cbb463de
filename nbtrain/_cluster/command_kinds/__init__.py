"""Each kind of steering command as one module: its check in the notebook, the step the supervisor schedules it
at, the hook point where a rank applies it, how it is applied, and how the run's history describes it.

Every process that handles commands imports this folder: the notebook (its checks), the run's supervisor (its
scheduling) and each rank (its application). ``table.py`` is the one table they look a kind up in.
"""
