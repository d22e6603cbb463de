"""Code that draws, in the notebook kernel: the magics, the live dashboard, the launch panel, static plots.

Views read a :class:`~nbtrain.Run`; they never talk to the supervisor themselves.
"""
