"""nbtrain's version and the Ray releases it is tested with, in a module of their own: the notebook,
the CLI and the cluster's actors compare them without importing the public API (which imports
everything). ``pyproject.toml`` declares the same Ray range (``tests/test_dependency_bounds.py``
checks that the two agree)."""

__version__ = "0.1.0"

# Ray (major.minor) nbtrain supports, oldest first: nbtrain reaches into Ray's internals (Ray Train's seam,
# the raylet, the autoscaler's state), which a Ray release may change; _ray_compat absorbs the differences,
# read in each release's code. CI runs the whole suite on the newest and a tier on the oldest
# (scripts/run-tests); docs/compatibility.md is the table. connect() refuses a Ray outside these.
TESTED_RAY_MINORS = ("2.54", "2.55", "2.56", "2.57", "2.58", "2.59", "2.60")
