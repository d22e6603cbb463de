"""What a rank process loads before any run asks it to: torch's lazy imports that a first step would pay for.

``import torch`` is not all of torch: DDP and ``torch.distributed`` come with the training code's first lines,
and building the first optimizer imports ``torch._dynamo`` (1.6 s of CPU on a 2-core machine, as much as
``import torch`` itself). Nothing here touches the random generators, a device or the process group: a run
starts from what a fresh process would start from.

Who loads what, and why:

* A worker warmed ahead of any launch (``connect()`` warms the first run's ranks; the warm pool keeps the next
  run's) loads all of it, ``torch._dynamo`` and a first optimizer included, so the first launch's first step is
  a step. It imports at a bookkeeping priority, so the notebook's next cells and the first launch's supervisor
  come first on a small machine. The imports run on a thread of their own for that: on Linux a thread has its
  own niceness, and an unprivileged process can raise a thread's but never lower it again, so the main thread,
  which trains, keeps its own.
* A rank process started for a launch is on that launch's path whatever it loads, so it loads torch and
  ``torch.distributed`` and leaves ``torch._dynamo`` to the code's first optimizer, which needs it then at no
  extra wait; code that builds no optimizer (a loop that only reports) never pays for it.
"""

from __future__ import annotations

import importlib
import os
import threading

LAZY_MODULES = ("torch", "torch.distributed", "torch.nn.parallel")  # what DDP training code's first lines import
OPTIMIZER_MODULES = ("torch._dynamo",)  # what building the first optimizer imports


def load_lazy_torch(niceness: int) -> None:
    """A worker warmed ahead of any launch: torch and what the first step of most training code imports lazily,
    the first optimizer's work included, on a thread at ``niceness``."""
    thread = threading.Thread(target=_import_at, args=(niceness,), name="nbtrain-torch-warmup")
    thread.start()
    thread.join()
    import torch

    parameter = torch.nn.Parameter(torch.zeros(1))
    torch.optim.SGD([parameter], lr=0.0)  # the optimizer's own first-use work, once its imports are loaded


def load_torch_for_a_launch() -> None:
    """A rank process started for a launch: torch and ``torch.distributed``; its code's first optimizer, if any,
    imports the rest as it needs it."""
    _import(LAZY_MODULES)


def _import_at(niceness: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)  # this thread only (Linux)
    except OSError:
        pass
    _import(LAZY_MODULES + OPTIMIZER_MODULES)


def _import(names: tuple[str, ...]) -> None:
    for name in names:
        importlib.import_module(name)
