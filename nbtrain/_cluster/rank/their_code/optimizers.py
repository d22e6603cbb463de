"""Which optimizer the steering hooks see when the code steps a wrapper of one.

Torch's step hooks run in the step of every class whose ``Optimizer.__init__`` ran. Accelerate's
``AcceleratedOptimizer``, Lightning's ``LightningOptimizer`` and nbtrain's ``ScaledOptimizer`` skip it and
step the optimizer they hold: that one is steered. ``ZeroRedundancyOptimizer`` runs it and steps a local
optimizer of its own as well: the ZeRO optimizer is steered, which hands its settings to the local one.
"""

from __future__ import annotations

from typing import Any

# where wrappers keep the optimizer they step: Accelerate's and nbtrain's ScaledOptimizer ``optimizer``,
# Lightning's ``_optimizer``, ZeroRedundancyOptimizer's ``optim``
_INNER = ("optimizer", "_optimizer", "optim")


def _fires_hooks(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` runs torch's step hooks (torch wraps the step of every class whose
    ``Optimizer.__init__`` ran; wrappers that skip it, such as Accelerate's, step an inner one)."""
    return bool(getattr(getattr(type(optimizer), "step", None), "hooked", False))


def stepped(optimizer: Any) -> Any:
    """The optimizer whose step fires the hooks when ``optimizer`` steps: itself, or the one a wrapper holds."""
    seen = optimizer
    for _ in range(8):  # wrappers of wrappers, never a cycle
        if _fires_hooks(seen):
            return seen
        inner = next((found for name in _INNER if (found := getattr(seen, name, None)) is not None
                      and hasattr(found, "param_groups")), None)
        if inner is None:
            break
        seen = inner
    return seen


def inside(optimizer: Any) -> list[Any]:
    """Optimizers stepped by ``optimizer``'s own step (ZeroRedundancyOptimizer's local one)."""
    return [found for name in _INNER if (found := getattr(optimizer, name, None)) is not None
            and found is not optimizer and _fires_hooks(found)]
