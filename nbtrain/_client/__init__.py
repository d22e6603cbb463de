"""Code that runs in the notebook kernel (and the ``nbtrain`` CLI): connecting, launching, reading runs.

Nothing here runs on the cluster; it talks to it over Ray Client.
"""
