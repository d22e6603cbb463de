"""What a rank process loads before any run asks it to: torch's lazy imports that a first step would pay for.

``import torch`` is not all of torch: building the first optimizer imports ``torch._dynamo`` (1.5 s on a 2-core
machine, as long as ``import torch`` itself), and DDP and ``torch.distributed`` come with the training code's
first lines. A rank process pays them once, while it starts (a warm worker waits for its first run, a fresh one
is starting anyway), so a run's first step is a step. Nothing here touches the random generators, a device or
the process group: a run starts from what a fresh process would start from.

A worker warmed ahead of any launch (``connect()`` warms the first run's ranks) imports at a bookkeeping
priority, so the notebook's next cells and the first launch's supervisor come first on a small machine. The
imports run on a thread of their own for that: on Linux a thread has its own niceness, and an unprivileged
process can raise a thread's but never lower it again, so the main thread, which trains, keeps its own.
"""

from __future__ import annotations

import importlib
import os
import threading

# torch._dynamo: what building the first optimizer imports; the others come with DDP training code's first lines
LAZY_MODULES = ("torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel")


def load_lazy_torch(niceness: int | None = None) -> None:
    """Import torch and what the first step of most training code imports lazily; ``niceness``: on a thread
    at that niceness (a worker warmed in the background), else on this one."""
    if niceness is None:
        _import_torch_parts()
    else:
        thread = threading.Thread(target=_import_at, args=(niceness,), name="nbtrain-torch-warmup")
        thread.start()
        thread.join()
    import torch

    parameter = torch.nn.Parameter(torch.zeros(1))
    torch.optim.SGD([parameter], lr=0.0)  # the optimizer's own first-use work, once its imports are loaded


def _import_at(niceness: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)  # this thread only (Linux)
    except OSError:
        pass
    _import_torch_parts()


def _import_torch_parts() -> None:
    for name in LAZY_MODULES:
        importlib.import_module(name)
