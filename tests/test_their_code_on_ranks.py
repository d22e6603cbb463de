"""Code written for torchrun, run unchanged on nbtrain's ranks (issue 46): its own ``init_process_group``,
SummaryWriter curves, optimizers steered with no nbtrain call (plain, Accelerate's, ZeroRedundancyOptimizer),
a note when it reports nothing, and a clear error when it starts processes of its own.

Every run is real: 2 ranks on the session's loopback cluster, gloo, real Accelerate and TensorBoard.
The steered functions report nothing to nbtrain unless said: what the tests read comes from the code's own
SummaryWriter, or from ``nbtrain.report`` where the test needs each rank's values to compare replicas.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _steering_fakes import AgreedAsAsked

import nbtrain
from nbtrain._cluster.supervisor.missing_rows import NO_ROWS_NOTE

from _helpers import wait_for


def _reached(run, step: int) -> bool:
    run.refresh()
    workers = run.workers  # read once: each read asks the supervisor afresh
    return bool(workers) and min((w.get("step") or 0) for w in workers) >= step


def _rows_by_step(run, key: str) -> dict[int, dict[int, dict]]:
    by_step: dict[int, dict[int, dict]] = {}
    for row in run.metrics:
        if key in row:
            by_step.setdefault(row["step"], {})[row["rank"]] = row
    return by_step


def own_process_group(config):
    """A torchrun script's body: its own init_process_group and destroy_process_group, DDP, no nbtrain call."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    assert dist.is_initialized() and dist.get_world_size() == int(os.environ["WORLD_SIZE"]) == 2
    assert dist.get_rank() == int(os.environ["RANK"])
    torchrun_sets = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                     "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                     "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS")
    assert not [name for name in torchrun_sets if name not in os.environ]
    assert os.environ["TORCHELASTIC_RUN_ID"] == "their-own-process-group" and os.environ["GROUP_WORLD_SIZE"] == "1"
    dist.init_process_group("gloo")  # again: said once
    dist.init_process_group(backend="nccl")  # for a backend this CPU rank has not: the run's group
    torch.manual_seed(dist.get_rank())  # different starts: DDP's first broadcast makes them one
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
    total = torch.tensor([float(sum(p.detach().double().sum() for p in model.parameters()))])
    gathered = [torch.zeros(1), torch.zeros(1)]
    dist.all_gather(gathered, total)
    dist.destroy_process_group()
    assert dist.is_initialized(), "nbtrain keeps the run's group until the function returned"
    return [float(t) for t in gathered]


def test_the_codes_own_init_process_group_gets_the_runs_group_and_a_run_without_rows_says_how_to_get_curves(
        cluster):
    run = nbtrain.launch(own_process_group, workers=2, name="their-own-process-group")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    first, second = run.result
    assert first == second and first[0] == first[1], "the replicas are not identical"
    for rank in (0, 1):
        log = run.logs(rank)
        said = f"rank {rank}'s init_process_group() reused the run's process group (gloo, 2 ranks)"
        assert log.count(said) == 2, log  # once for gloo, once for nccl
        assert "(it asked for 'nccl'; the run's 'gloo' group fits this rank's cpu device)" in log
    assert run.metrics == []
    assert [e["message"] for e in run.events if e["kind"] == "note"] == [NO_ROWS_NOTE]
    assert "nbtrain.report(loss=...)" in NO_ROWS_NOTE and "SummaryWriter" in NO_ROWS_NOTE


def plain_torch_with_a_summary_writer(config):
    """No nbtrain call: its own group, optimizer, DistributedSampler and SummaryWriter (on every rank).
    Epochs of 10 steps until the test leaves a file named ``done`` in ``logdir``; then it closes its writer."""
    import os

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    from torch.utils.tensorboard import SummaryWriter

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    data = TensorDataset(torch.randn(80, 4), torch.randn(80, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    writer = SummaryWriter(os.path.join(config["logdir"], f"rank{dist.get_rank()}"))
    step = 0
    for epoch in range(10_000):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            writer.add_scalar("loss", loss.item(), step)
            writer.add_scalar("lr", optimizer.param_groups[0]["lr"], step)
            writer.add_scalars("params", {"sum": float(sum(p.detach().sum() for p in model.parameters()))}, step)
            time.sleep(config["step_time"])
        if os.path.exists(os.path.join(config["logdir"], "done")):
            break
    writer.close()
    dist.destroy_process_group()
    return step


def _event_scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, dict[int, float]] = {}
    for events in sorted({path.parent for path in folder.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            name = tag if events == folder else f"{tag}/{events.name.removeprefix(tag + '_')}"  # add_scalars' folders
            found[name] = {event.step: event.value for event in accumulator.Scalars(tag)}
    return found


def test_summary_writer_scalars_are_rows_and_unchanged_code_is_paused_and_adjusted(cluster, tmp_path):
    run = nbtrain.launch(plain_torch_with_a_summary_writer, workers=2, name="their-summary-writer",
                         config={"logdir": str(tmp_path), "step_time": 0.05})
    try:
        wait_for(lambda: _reached(run, 5), timeout=120, message="the run to take 5 steps",
                 describe=lambda: run.workers)

        paused_at = run.pause(wait=True)
        wait_for(lambda: {w["state"] for w in run.workers} == {"paused"}, timeout=30, message="both ranks paused")
        # held before the update of step paused_at: the table says that step, as the header does, and the
        # rank has written only the steps before it
        assert [w["step"] for w in run.workers] == [paused_at, paused_at]
        assert max(row["step"] for row in run.metrics) <= paused_at - 1
        run.resume()
        wait_for(lambda: _reached(run, paused_at + 3), timeout=60, message="the run to go on after resume()")

        applied = run.adjust(lr=0.01, wait=True)
        wait_for(lambda: len(_rows_by_step(run, "lr")) > applied + 2, timeout=60, message="rows past the change")
        [change] = [c for c in run.changes if c["kind"] == "adjust"]
        assert change["step"] == applied and change["before"]["lr"] == [0.1]
        (tmp_path / "done").touch()
        assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED, run.error
    finally:
        if not run.state.is_terminal:
            run.stop()

    last = run.result[0]
    assert run.result == [last, last] and last % 10 == 0
    rows = _rows_by_step(run, "lr")
    assert sorted(rows) == list(range(1, last + 1)), "one row per step, the scalars of a step together"
    for step, ranks in rows.items():
        assert set(ranks) == {0, 1}, step
        assert set(ranks[0]) == {"rank", "step", "attempt", "time", "loss", "lr", "params/sum"}
        assert ranks[0]["params/sum"] == ranks[1]["params/sum"], f"replicas differ at step {step}"
        assert ranks[0]["lr"] == ranks[1]["lr"] == pytest.approx(0.1 if step < applied else 0.01), step
    assert not any(e["kind"] == "note" and e["message"] == NO_ROWS_NOTE for e in run.events)
    for rank in (0, 1):  # the event files have them still, the same
        written = _event_scalars(tmp_path / f"rank{rank}")
        assert sorted(written["loss"]) == list(range(1, last + 1))
        assert written["lr"] == {step: pytest.approx(ranks[rank]["lr"]) for step, ranks in rows.items()}
        assert written["params/sum"] == {step: pytest.approx(ranks[rank]["params/sum"])
                                         for step, ranks in rows.items()}


def accelerate_program(config):
    """An Accelerate program (Accelerator(cpu=True), prepare()); reports lr and the parameters' sum so the test
    can compare both ranks, nothing else of nbtrain."""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert nbtrain.steerable(optimizer) is optimizer  # an AcceleratedOptimizer: it used to raise AttributeError
    step = 0
    for _epoch in range(10_000):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            step += 1
            nbtrain.report(step=step, lr=optimizer.param_groups[0]["lr"],
                           params=float(sum(p.detach().sum() for p in model.parameters())),
                           world=accelerator.num_processes)
            time.sleep(config["step_time"])
            if step == config["steps"]:
                return step
    return step


def test_an_accelerate_program_is_adjusted_live_on_both_ranks(cluster):
    run = nbtrain.launch(accelerate_program, workers=2, name="their-accelerate",
                         config={"step_time": 0.05, "steps": 10_000})
    try:
        wait_for(lambda: _reached(run, 5), timeout=180, message="the Accelerate run to take 5 steps",
                 describe=lambda: (run.state, run.workers, run.error))
        applied = run.adjust(lr=0.01, wait=True)
        wait_for(lambda: _reached(run, applied + 3), timeout=60, message="steps past the change")
    finally:
        run.stop()
    rows = _rows_by_step(run, "lr")
    assert {row["world"] for ranks in rows.values() for row in ranks.values()} == {2}
    for step, ranks in rows.items():
        if len(ranks) == 2 and step < applied + 3:
            assert ranks[0]["params"] == ranks[1]["params"], f"replicas differ at step {step}"
            assert ranks[0]["lr"] == ranks[1]["lr"] == (0.1 if step < applied else 0.01), step
    [change] = run.changes
    assert change["step"] == applied and change["before"]["lr"] == [0.1]


def zero_redundancy(config):
    """ZeroRedundancyOptimizer (its step steps a local optimizer too) over DDP, no nbtrain steering call; epochs
    of 10 steps counted by its DistributedSampler."""
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    data = TensorDataset(torch.randn(80, 4), torch.randn(80, 1))
    sampler = DistributedSampler(data)
    step = 0
    for epoch in range(10_000):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=4, sampler=sampler):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            step += 1
            nbtrain.report(step=step, lr=optimizer.param_groups[0]["lr"],
                           local_lr=optimizer.optim.param_groups[0]["lr"],
                           params=float(sum(p.detach().sum() for p in model.parameters())))
            time.sleep(config["step_time"])


def test_a_zero_redundancy_optimizer_takes_a_change_once_and_stops_after_its_epoch(cluster):
    run = nbtrain.launch(zero_redundancy, workers=2, name="their-zero", config={"step_time": 0.05})
    try:
        wait_for(lambda: _reached(run, 5), timeout=120, message="the run to take 5 steps")
        applied = run.adjust(lr=0.01, wait=True)
        run.stop(after="epoch")
        assert run.wait(timeout=120, raise_on_failure=False) == nbtrain.RunState.STOPPED
    finally:
        if not run.state.is_terminal:
            run.stop()
    rows = _rows_by_step(run, "lr")
    for step, ranks in rows.items():
        assert set(ranks) == {0, 1}, step
        assert ranks[0]["params"] == ranks[1]["params"], f"replicas differ at step {step}"
        for rank in (0, 1):
            assert ranks[rank]["lr"] == ranks[rank]["local_lr"] == (0.1 if step < applied else 0.01), (step, rank)
    [change] = [c for c in run.changes if c["kind"] == "adjust"]
    assert change["step"] == applied and change["before"]["lr"] == [0.1], "the ZeRO optimizer's one param group"
    assert max(rows) % 10 == 0, f"stopped at step {max(rows)}, not at an epoch's end"
    assert any("every rank finished epoch" in e["message"] for e in run.events), run.events


def spawns_its_own_processes(config):
    """A DataLoader with worker processes works; then torch.multiprocessing.spawn, as a script run by python
    would start its workers."""
    import torch
    import torch.multiprocessing as mp

    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    seen = sorted(float(x) for (batch,) in torch.utils.data.DataLoader(data, batch_size=2, num_workers=1)
                  for x in batch)
    assert seen == [float(i) for i in range(8)]
    mp.spawn(print, nprocs=2)


def test_a_script_that_spawns_its_own_processes_is_told_what_to_write_instead(cluster):
    run = nbtrain.launch(spawns_its_own_processes, workers=2, name="their-own-processes")
    assert run.wait(timeout=120, raise_on_failure=False) == nbtrain.RunState.FAILED
    assert "NbtrainError" in run.error and "Rank 0 called torch.multiprocessing.spawn()" in run.error, run.error
    assert "Call the worker function directly instead" in run.error
    assert "nbtrain.get_context().local_rank" in run.error and "workers=" in run.error
    assert "--workers" in run.error


@pytest.mark.quick
def test_wrapped_optimizers_are_steered_through_the_one_whose_step_runs_the_hooks():
    """Without a cluster: a RankSteering, its global hooks, and wrappers of the kinds Lightning and nbtrain make."""
    from types import SimpleNamespace

    import torch
    from lightning.pytorch.core.optimizer import LightningOptimizer

    from nbtrain._cluster.rank.parallel import ScaledOptimizer
    from nbtrain._cluster.rank.rank_steering import RankSteering

    session = SimpleNamespace(supervisor=None, context=SimpleNamespace(rank=0), uses_loader=False, report_calls=0,
                              last_step=0, step=0, epoch=0, commands_due=lambda due: None, timing=None)
    steering = RankSteering(session, [], AgreedAsAsked())
    try:
        model = torch.nn.Linear(2, 1)
        plain, inner = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam(model.parameters(), lr=0.1)
        lightning = LightningOptimizer(inner)
        assert steering.steer(lightning) is lightning
        assert steering.steer(ScaledOptimizer(inner, None)) is not None
        assert steering.optimizers == [inner], "a wrapper is adopted as the optimizer it steps, once"
        model(torch.ones(1, 2)).sum().backward()
        plain.step()  # never given to nbtrain: adopted as it steps
        assert steering.optimizers == [inner, plain]
        assert steering.updates == 0, "updates are counted on the first adopted optimizer"
        inner.step()
        assert steering.updates == 1
    finally:
        steering.unhook()
    plain.step()
    assert steering.optimizers == [inner, plain] and steering.updates == 1, "unhooked: no longer seen"


def plain_lightning(config):
    """A Lightning script as written for torchrun (2 processes on one machine): a plain Trainer, no nbtrain."""
    import lightning.pytorch as pl
    import torch

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))
    return {"world": trainer.world_size, "rank": trainer.global_rank, "steps": trainer.global_step,
            "environment": type(trainer.strategy.cluster_environment).__name__,
            "params": float(sum(p.detach().double().sum() for p in trainer.lightning_module.parameters()))}


def test_a_plain_lightning_trainer_runs_in_the_runs_group(cluster):
    run = nbtrain.launch(plain_lightning, workers=2, name="their-lightning")
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED, run.error
    first, second = run.result
    assert (first["rank"], second["rank"]) == (0, 1)
    assert first["world"] == second["world"] == 2 and first["environment"] == "TorchElasticEnvironment"
    assert first["steps"] == second["steps"] == 8, "4 batches per rank and epoch (the sampler shards over 2)"
    assert first["params"] == second["params"], "the replicas are not identical"


def _stand_in_session(rows: list | None = None):
    """What the patches read of a rank's TrainingSession: its context, payload, steering, and write_row."""
    from types import SimpleNamespace

    import torch

    return SimpleNamespace(
        context=SimpleNamespace(rank=0, world_size=1, local_world_size=1, attempt=1, run_name="stand-in",
                                device=torch.device("cpu")),
        payload=SimpleNamespace(cpus_per_worker=1), steering=SimpleNamespace(epochs_counted=False),
        write_row=lambda step, values: rows.append((step, values)) if rows is not None else None)


@pytest.mark.quick
def test_summary_writer_scalars_of_a_step_make_one_row_and_still_reach_the_event_file(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from nbtrain._cluster.rank.their_code import summary_writer

    rows: list = []
    undo = summary_writer.install(_stand_in_session(rows))
    try:
        writer = SummaryWriter(str(tmp_path))
        for step in (1, 2):
            writer.add_scalar("loss", 1.0 / step, step)
            writer.add_scalars("acc", {"train": 0.5, "valid": 0.25}, step)
        assert rows == [(1, {"loss": 1.0, "acc/train": 0.5, "acc/valid": 0.25})], "step 2's row is still filling"
        writer.add_scalar("lr", 0.1)  # no global_step: a row of its own, at the rank's step
        writer.close()
        assert rows[1:] == [(None, {"lr": 0.1}), (2, {"loss": 0.5, "acc/train": 0.5, "acc/valid": 0.25})]
        writer = SummaryWriter(str(tmp_path / "second"))
        writer.add_scalar("loss", 0.1, 3)
    finally:
        undo()  # the session's end sends the row still filling, and gives the class back
    assert rows[-1] == (3, {"loss": 0.1})
    writer.add_scalar("loss", 0.05, 4)
    writer.close()
    assert len(rows) == 4, "undone: the writer only writes its event file"
    written = _event_scalars(tmp_path)
    assert written["loss"] == {1: 1.0, 2: 0.5} and written["acc/valid"] == {1: 0.25, 2: 0.25}


@pytest.mark.quick
def test_spawning_on_a_rank_raises_before_anything_starts_and_is_undone_after():
    import torch.multiprocessing as mp

    from nbtrain._cluster.rank.their_code import own_processes
    from nbtrain._exceptions import NbtrainError

    original = mp.spawn
    undo = own_processes.install(_stand_in_session())
    try:
        with pytest.raises(NbtrainError, match=r"Rank 0 called torch\.multiprocessing\.spawn\(\)"):
            mp.spawn(print, nprocs=2)
        with pytest.raises(NbtrainError, match=r"torch\.multiprocessing\.start_processes\(\)"):
            mp.start_processes(print, nprocs=2)
        from torch.distributed.launcher.api import elastic_launch

        with pytest.raises(NbtrainError, match=r"elastic_launch\(\)"):
            elastic_launch(config=None, entrypoint=print)()
    finally:
        undo()
    assert mp.spawn is original


@pytest.mark.quick
def test_the_codes_init_process_group_returns_with_the_group_in_place_and_its_destroy_waits():
    import torch.distributed as dist

    from nbtrain._cluster.rank.their_code import process_group

    original = dist.init_process_group
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # as nbtrain joins it
    running = [True]
    undo = process_group.install(_stand_in_session(), lambda: running[0])
    try:
        dist.init_process_group("gloo", init_method="env://")
        dist.destroy_process_group()
        assert dist.is_initialized(), "the code's destroy is nbtrain's to do"
        with pytest.raises(nbtrain.NbtrainError, match=r"does not match the run's group.*launch with workers=4"):
            dist.init_process_group("gloo", world_size=4, rank=2)
        running[0] = False
        dist.destroy_process_group()  # the worker's, after the function returned
        assert not dist.is_initialized()
    finally:
        undo()
        if dist.is_initialized():
            dist.destroy_process_group()
    assert dist.init_process_group is original
