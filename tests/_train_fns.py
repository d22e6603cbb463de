"""Training functions used by several cluster tests (sent to workers by value)."""

from __future__ import annotations

import time

import torch

import nbtrain


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def make_data(n: int = 256, seed: int = 0) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=gen)
    return torch.utils.data.TensorDataset(x, y)


def param_checksum(model: torch.nn.Module) -> float:
    module = getattr(model, "module", model)
    return float(sum(p.detach().double().sum() for p in module.parameters()))


def train_regression(config):
    """A few epochs of DDP regression; returns this rank's parameter checksum."""
    torch.manual_seed(config.get("init_seed", 0))
    model = nbtrain.prepare_model(TinyNet())
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(
        make_data(seed=config.get("data_seed", 0)), batch_size=16, shuffle=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _epoch in range(config.get("epochs", 2)):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            nbtrain.report(loss=loss.item())
            time.sleep(config.get("sleep", 0.0))
    return param_checksum(model)


def train_steps(config):
    """Report once per step with a sleep, so a test can watch it live; optional checkpoints."""
    ctx = nbtrain.get_context()
    start = 0
    resumed = nbtrain.load_checkpoint()
    if resumed is not None:
        start = int(resumed["step"]) + 1
    for step in range(start, config["steps"]):
        nbtrain.report(step=step, loss=1.0 / (step + 1), sent=time.time())
        every = config.get("checkpoint_every")
        if every and step % every == 0:
            nbtrain.save_checkpoint({"step": step, "weights": torch.full((3,), float(step))})
        if config.get("fail_rank") == ctx.rank and step == config.get("fail_step") and ctx.attempt == 1:
            raise ValueError(f"boom at step {step}")
        time.sleep(config.get("sleep", 0.05))
    return ctx.rank


def elastic_train(config):
    """Steps from the latest checkpoint; saves when the run asks (a resize) and every ``every`` steps."""
    ctx = nbtrain.get_context()
    saved = nbtrain.load_checkpoint()
    start = saved["step"] if saved else 0
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(torch.arange(4096), batch_size=8))

    def batches():
        while True:
            yield from loader

    data = batches()
    for step in range(start + 1, config["steps"] + 1):
        batch = next(data)
        time.sleep(config["step_time"])  # a training step's duration
        nbtrain.report(step=step, world_size=ctx.world_size, resumed_from=start, batch=len(batch))
        if nbtrain.checkpoint_requested() or step % config["every"] == 0:
            nbtrain.save_checkpoint({"step": step})


class Point(torch.nn.Module):
    def __init__(self, d: int, value: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((d,), value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((self.w - x) ** 2).sum(dim=1).mean()


def noisy_point(config):
    """Fit a point ``w`` to samples ``x ~ N(0, sigma² I_d)`` under ``0.5·|w - x|²``: a known noise scale.

    One example's gradient is ``w - x``: its mean is ``w`` and its covariance ``sigma² I``,
    so the gradient noise scale is ``d·sigma² / |w|²`` for as long as ``w`` barely moves
    (the learning rate is tiny). Every step reports the loss and the learning rate.
    """
    d, sigma = config["d"], config["sigma"]
    generator = torch.Generator().manual_seed(1234)
    samples = torch.randn(config["examples"], d, generator=generator) * sigma
    model = nbtrain.prepare_model(Point(d, config["w"]))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=config["lr"]))
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(samples, batch_size=config["batch"], shuffle=True))
    for _epoch in range(config["epochs"]):
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch)
            loss.backward()
            optimizer.step()
            nbtrain.report(loss=loss.item(), lr=optimizer.param_groups[0]["lr"])


def checkpoint_then_fail_once(config):
    """Checkpoint every step; rank 0 fails once, in attempt 1, right after the checkpoint at ``fail_at``.

    Each step's checkpoint is what rank 0 saved at it. Returns the step the attempt started from.
    """
    ctx = nbtrain.get_context()
    saved = nbtrain.load_checkpoint()
    start = saved["step"] + 1 if saved else 1
    for step in range(start, config["steps"] + 1):
        nbtrain.report(step=step, started_at=start)
        nbtrain.save_checkpoint({"step": step, "weights": torch.full((3,), float(step))})
        if ctx.attempt == 1 and ctx.rank == 0 and step == config["fail_at"]:
            raise RuntimeError("failing once after a checkpoint, on purpose")
    return start


def make_two_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))


def sharded_checkpoint_then_fail_once(config):
    """FSDP over the ranks; attempt 1 adds 1 to every parameter, saves a sharded checkpoint and fails.
    The restart loads it (each rank its shards) and returns the sum of the full parameters."""
    model = nbtrain.prepare_model(make_two_layers(), strategy="fsdp")
    state = {"model": model.state_dict()}
    if nbtrain.get_context().attempt == 1:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)
        nbtrain.save_checkpoint({"model": model.state_dict()}, sharded=True)
        raise RuntimeError("failing once after a sharded checkpoint, on purpose")
    nbtrain.load_checkpoint(into=state)
    model.load_state_dict(state["model"])
    return float(sum(p.full_tensor().double().sum() for p in model.parameters()))
