"""nbtrain's version and the Ray releases it is tested with, in a module of their own: the notebook,
the CLI and the cluster's actors compare them without importing the public API (which imports
everything). ``pyproject.toml`` declares the same Ray range (``tests/test_dependency_bounds.py``
checks that the two agree)."""

__version__ = "0.1.0"

# Ray (major.minor) that CI runs: nbtrain reaches into Ray's internals (Ray Train's seam, the raylet,
# the autoscaler's state), which a Ray release may change. connect() refuses a Ray outside these.
TESTED_RAY_MINORS = ("2.60",)
