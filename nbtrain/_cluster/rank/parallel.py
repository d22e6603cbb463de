"""How a model is spread over the ranks and cast: DDP, FSDP2 sharding, mixed precision.

``nbtrain.prepare_model`` moves the model to the rank's device and then:

- ``strategy="ddp"`` (the default): DistributedDataParallel, each rank a full copy;
- ``strategy="fsdp"``: PyTorch's FSDP2 ``fully_shard``: each rank keeps 1/N of the
  parameters, gradients and optimizer state. ``auto_wrap_policy`` picks the
  submodules sharded as units of their own (module classes, or a function of a
  module), which bounds the memory of one all-gather; the root is always one;
- ``precision="bf16-mixed" | "16-mixed"`` (the run's ``precision`` option by
  default): the model's forward runs under ``torch.autocast``. With float16 the
  loss is scaled: call ``nbtrain.backward(loss)`` and step the optimizer from
  ``nbtrain.prepare_optimizer`` (both do the plain thing otherwise, so code
  written with them runs at every precision).

Works on CPU with gloo (tests) and on GPUs with NCCL.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from nbtrain._exceptions import InvalidOptionError
from nbtrain._options import PRECISION_CHOICES

STRATEGY_CHOICES = ("ddp", "fsdp")
AUTOCAST_DTYPES = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}


def check_choices(strategy: str | None, precision: str | None) -> None:
    if strategy is not None and strategy not in STRATEGY_CHOICES:
        msg = (f"prepare_model(strategy={strategy!r}): unknown strategy; choose one of "
               f"{', '.join(map(repr, STRATEGY_CHOICES))}, or None to only move the model.")
        raise InvalidOptionError(msg)
    if precision is not None and precision not in PRECISION_CHOICES:
        msg = (f"prepare_model(precision={precision!r}): unknown precision; choose one of "
               f"{', '.join(map(repr, PRECISION_CHOICES))}, or None for full precision.")
        raise InvalidOptionError(msg)


def distribute(model: Any, device: Any, world_size: int, strategy: str | None,
               auto_wrap_policy: Iterable[type] | Callable[[Any], bool] | None,
               fsdp_kwargs: dict[str, Any], ddp_kwargs: dict[str, Any]) -> Any:
    """``model`` on ``device``, wrapped by ``strategy`` (DDP only when there is more than one rank)."""
    import torch

    model = model.to(device)
    if strategy == "fsdp":
        return _fully_shard(model, device, auto_wrap_policy, fsdp_kwargs)
    if strategy == "ddp" and world_size > 1:
        return torch.nn.parallel.DistributedDataParallel(model, **ddp_arguments(device, ddp_kwargs))
    return model


def ddp_arguments(device: Any, ddp_kwargs: dict[str, Any]) -> dict[str, Any]:
    """DistributedDataParallel's arguments on ``device``: on a GPU, its own index as the one device id."""
    if device.type == "cuda":
        return {"device_ids": [device.index], **ddp_kwargs}
    return dict(ddp_kwargs)


def _fully_shard(model: Any, device: Any, policy: Iterable[type] | Callable[[Any], bool] | None,
                 fsdp_kwargs: dict[str, Any]) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy

    offload = fsdp_kwargs.get("offload_policy")
    if device.type != "cuda" and isinstance(offload, CPUOffloadPolicy) and offload.pin_memory:
        msg = ("prepare_model(strategy='fsdp', fsdp_kwargs={'offload_policy': CPUOffloadPolicy(pin_memory=True)}) "
               "pins memory for GPU copies, and this run has no GPU: launch with gpus_per_worker=1 or more, or pass "
               "CPUOffloadPolicy(pin_memory=False).")
        raise InvalidOptionError(msg)
    shard(model, policy, fsdp_kwargs)
    return model


def shard(model: Any, policy: Iterable[type] | Callable[[Any], bool] | None, fsdp_kwargs: dict[str, Any]) -> None:
    """``fully_shard`` the submodules ``policy`` picks, innermost first as FSDP2 wants, then ``model``."""
    from torch.distributed.fsdp import fully_shard

    wanted = _policy(policy)
    for _name, module in reversed(list(model.named_modules())):
        if module is not model and wanted(module):
            fully_shard(module, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)


def _policy(policy: Iterable[type] | Callable[[Any], bool] | None) -> Callable[[Any], bool]:
    if policy is None:
        return lambda module: False
    if callable(policy) and not isinstance(policy, type):
        return policy
    classes = tuple(policy) if not isinstance(policy, type) else (policy,)
    if not all(isinstance(cls, type) for cls in classes):
        msg = (f"prepare_model(auto_wrap_policy={policy!r}): give module classes (e.g. {{TransformerBlock}}) or a "
               f"function that takes a module and returns True for those to shard as units of their own.")
        raise InvalidOptionError(msg)
    return lambda module: isinstance(module, classes)


def autocast_forward(model: Any, device: Any, precision: str) -> Any:
    """Make ``model``'s forward run under ``torch.autocast`` of ``precision`` on ``device``'s type."""
    import torch

    dtype = getattr(torch, AUTOCAST_DTYPES[precision])
    forward = model.forward

    @functools.wraps(forward)
    def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device.type, dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = forward_in_autocast
    return model


class ScaledOptimizer:
    """An optimizer whose ``step`` goes through a GradScaler (float16 training); everything else is the optimizer's."""

    def __init__(self, optimizer: Any, scaler: Any) -> None:
        self.optimizer = optimizer
        self.scaler = scaler

    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            msg = "prepare_optimizer: a closure cannot go through float16 loss scaling; call step() without one."
            raise InvalidOptionError(msg)
        result = self.scaler.step(self.optimizer)
        self.scaler.update()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def gather_shards(obj: Any) -> Any:
    """``obj`` with every sharded tensor (DTensor) replaced by the full tensor on the CPU.

    A collective when ``obj`` holds any: every rank gathers the same tensors in the same order.
    """
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return obj.full_tensor().cpu()
    if isinstance(obj, dict):
        return type(obj)((key, gather_shards(value)) for key, value in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(gather_shards(value) for value in obj)
    return obj
