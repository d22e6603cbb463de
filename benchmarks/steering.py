"""What steering a live run costs: on the step when nothing is pending, and from the call to the change applied.

    python benchmarks/steering.py            # ~2 min
    python benchmarks/steering.py --step     # 1 and 2 only, no cluster (~1 min)

1. **The step, nothing pending** (no cluster): ``optimizer.step()`` of a small SGD (one 4→1 linear layer, so
   the hooks' share is as large as it can be) with and without nbtrain's step hooks, 200 000 steps,
   interleaved, best of 7 rounds; the difference per step. The hooks are torch's global optimizer
   pre-hook and post-hook (registered while a run's session runs, so they see every optimizer): with
   nothing pending, a set lookup and a truth test, and an identity test and a truth test.
2. **Not profiling costs nothing** (no cluster): a training step of a small MLP (64→256→256→10, batch 32: forward,
   backward, SGD update) plain and with nbtrain's step hooks and nothing pending, blocks of 200 steps alternating,
   the best of 40 blocks each: the hooks' share of the step in %, the case of every step of a run that is not
   being profiled (``run.profile()`` lives in the hooks' pending list, so the hooks test nothing more). For
   scale, the same step while torch.profiler runs (the steps ``run.profile()`` covers).
3. **Latency** (its own loopback cluster, 4 CPUs): a 2-rank DDP run at 10 steps/s; ``run.adjust(lr=...)``
   20 times, each ``wait=True`` (returns when rank 0 applied it). Call → applied, p50 and p95, and how many
   steps ahead of the furthest rank the supervisor put each change.
4. **A live run as a kernel** (the same run): ``run.exec("float(model.module.weight.detach().sum())")`` 20 times on both
   ranks; call → ``{rank: value}``, p50 and p95.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

STEPS = 200_000
ROUNDS = 7
CHANGES = 20


def hook_cost() -> tuple[float, float]:
    import torch

    from nbtrain._cluster.rank.rank_steering import RankSteering

    torch.set_num_threads(1)
    session = SimpleNamespace(uses_loader=False, report_calls=0, last_step=0, step=0,
                              context=SimpleNamespace(rank=0), commands_due=lambda due: None)

    def seconds_per_step(steered: bool) -> float:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 4)).sum().backward()
        steering = RankSteering(session, [])
        if steered:
            steering.steer(optimizer)
        started = time.perf_counter()
        for _ in range(STEPS):
            optimizer.step()
        took = (time.perf_counter() - started) / STEPS
        getattr(steering, "unhook", lambda: None)()  # torch's global hooks: gone before the plain round
        return took

    plain, steered = [], []
    for _ in range(ROUNDS):
        plain.append(seconds_per_step(False))
        steered.append(seconds_per_step(True))
    return min(plain), min(steered)


MLP_BLOCKS, MLP_BLOCK = 40, 200


def profiling_cost() -> tuple[float, float, float]:
    """Seconds per training step of a small MLP: plain, with nbtrain's hooks (nothing pending), and profiled.
    Blocks of steps of the two models alternate and the best block of each counts, so the machine's other load
    (a shared 2-core box) moves both alike."""
    import torch

    from nbtrain._cluster.commands import PROFILE, Command
    from nbtrain._cluster.rank.inspection.profiling import StepProfile
    from nbtrain._cluster.rank.rank_steering import RankSteering

    torch.set_num_threads(1)
    torch.manual_seed(0)
    session = SimpleNamespace(uses_loader=False, report_calls=0, last_step=0, step=0,
                              context=SimpleNamespace(rank=0), commands_due=lambda due: None)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def trainer(steered: bool) -> tuple[Any, Any, Any]:
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        steering = RankSteering(session, [])
        if steered:
            steering.steer(optimizer)
            getattr(steering, "unhook", lambda: None)()  # the hooks are torch's global ones: on for its blocks only
        return model, optimizer, steering if steered else None

    def seconds_per_step(model: Any, optimizer: Any, steering: Any, profile: Any = None) -> float:
        if steering is not None:
            getattr(steering, "hook", lambda: None)()
        started = time.perf_counter()
        for _ in range(MLP_BLOCK):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            if profile is not None:
                profile.step()
        took = (time.perf_counter() - started) / MLP_BLOCK
        if steering is not None:
            getattr(steering, "unhook", lambda: None)()
        return took

    plain, hooked = trainer(False), trainer(True)
    plain_s, hooked_s = [], []
    for _ in range(MLP_BLOCKS):
        plain_s.append(seconds_per_step(*plain))
        hooked_s.append(seconds_per_step(*hooked))
    profiled_s = []
    for _ in range(3):
        profile = StepProfile(Command(1, PROFILE, {"steps": MLP_BLOCK, "ranks": [0]}, 0, 0.0), torch.device("cpu"))
        profiled_s.append(seconds_per_step(*hooked, profile=profile))
        profile._profiler.stop()
    return min(plain_s), min(hooked_s), min(profiled_s)


def steered(config):
    import time as _time

    import torch

    import nbtrain

    model = nbtrain.prepare_model(torch.nn.Linear(4, 1))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(1, 100_000):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        nbtrain.report(step=step)
        _time.sleep(0.1)


def latency() -> tuple[list[float], list[int], list[float]]:
    import nbtrain

    from _own_cluster import own_cluster

    with own_cluster("nbtrain-bench-steering-", 4):
        run = nbtrain.launch(steered, workers=2, name="bench-steering")
        while len(run.metrics) < 40:
            run.refresh(wait_s=1.0)
        took, ahead = [], []
        for index in range(CHANGES):
            furthest = max(w["step"] for w in run.workers)
            started = time.perf_counter()
            applied = run.adjust(lr=0.1 / (index + 2), wait=True)
            took.append(time.perf_counter() - started)
            ahead.append((applied or 0) - furthest)
        execs = []
        for _ in range(CHANGES):
            started = time.perf_counter()
            values = run.exec("float(model.module.weight.detach().sum())")
            execs.append(time.perf_counter() - started)
            assert len(set(values.values())) == 1, values  # the replicas read at the same step
        run.stop()
    return took, ahead, execs


def main() -> None:
    plain, hooked = hook_cost()
    print(f"optimizer.step(), {STEPS} steps, best of {ROUNDS}: plain {plain * 1e6:.2f} µs, with nbtrain's "
          f"steering hooks {hooked * 1e6:.2f} µs: {(hooked - plain) * 1e9:+.0f} ns per step")
    plain, hooked, profiled = profiling_cost()
    print(f"a training step of a small MLP (64-256-256-10, batch 32), best of {MLP_BLOCKS} blocks of {MLP_BLOCK}: "
          f"plain {plain * 1e6:.1f} µs, with nbtrain's hooks and no profile {hooked * 1e6:.1f} µs "
          f"({(hooked - plain) / plain * 100:+.2f} %); while torch.profiler runs {profiled * 1e6:.1f} µs "
          f"({(profiled - plain) / plain * 100:+.0f} %)")
    if "--step" in sys.argv[1:]:
        return
    took, ahead, execs = latency()
    took.sort()
    execs.sort()
    print(f"run.adjust(lr=..., wait=True) at 10 steps/s, {CHANGES} changes: call → applied p50 "
          f"{statistics.median(took):.2f} s, p95 {took[int(0.95 * (len(took) - 1))]:.2f} s; "
          f"the change's step was {statistics.median(ahead):.0f} steps ahead of the furthest rank (median)")
    print(f"run.exec(...) on 2 ranks at 10 steps/s, {CHANGES} times: call → {{rank: value}} p50 "
          f"{statistics.median(execs):.2f} s, p95 {execs[int(0.95 * (len(execs) - 1))]:.2f} s")


if __name__ == "__main__":
    main()
