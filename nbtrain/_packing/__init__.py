"""What travels with a run from the notebook to the ranks: code, modules and the Ray runtime environment.

Used on both sides: the notebook packs (``shipping`` finds the notebook's own
modules, ``runtime_env`` checks and uploads the environment), and a rank unpacks
(``code_origin`` keeps the user's file and cell names in its tracebacks).
"""
