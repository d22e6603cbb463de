"""IPython's debugger on a rank's post-mortem: ``%ray_debug`` and the frames it walks.

Runs in the notebook's kernel: ``debugger`` rebuilds the captured frames as real
code objects for ``pdb``; ``debug_magics`` is the ``%ray_debug`` magic.
"""
