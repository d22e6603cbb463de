"""nbtrain's version, in a module of its own: the notebook, the CLI and the cluster's actors compare it
without importing the public API (which imports everything)."""

__version__ = "0.1.0"
