"""FSDP sharding and mixed precision from nbtrain.prepare_model, on 2 real gloo ranks (CPU)."""

from __future__ import annotations

import pytest
import torch

import nbtrain


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(32), Block(32), torch.nn.Linear(32, 1))


def train_fsdp(config):
    model = nbtrain.prepare_model(make_model(), strategy="fsdp", auto_wrap_policy={Block})
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(nbtrain.get_context().rank)
    x = torch.randn(64, 32, generator=gen)
    y = x[:, :1] * 2
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        nbtrain.report(loss=loss.item())
    optimizer_numel = sum(state["exp_avg"].to_local().numel() for state in optimizer.state.values())
    nbtrain.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    return {"first": losses[0], "last": losses[-1], "optimizer_numel": optimizer_numel,
            "local_numel": sum(p.to_local().numel() for p in model.parameters())}


def test_fsdp_shards_trains_and_saves_a_full_state_dict(cluster):
    run = nbtrain.launch(train_fsdp, workers=2, name="fsdp-2")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    full = sum(p.numel() for p in make_model().parameters())
    for rank in run.result:
        assert rank["last"] < rank["first"] / 2, "the loss did not fall under FSDP"
        assert rank["local_numel"] <= full / 2 + 64, "each rank should hold about half of the parameters"
        assert rank["optimizer_numel"] == rank["local_numel"], "optimizer state is sharded with the parameters"
    assert sum(rank["local_numel"] for rank in run.result) == full
    checkpoint = run.load_checkpoint()
    plain = make_model()
    plain.load_state_dict(checkpoint["model"])  # full tensors, plain keys: an unsharded model loads them
    assert all(t.shape == p.shape for t, p in zip(checkpoint["model"].values(), plain.parameters(), strict=True))


def test_the_precision_option_runs_forward_under_autocast(cluster):
    def train():
        seen = {}

        class Probe(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.linear = torch.nn.Linear(4, 1)

            def forward(self, x):
                seen["autocast"] = torch.is_autocast_enabled("cpu")
                seen["dtype"] = str(torch.get_autocast_dtype("cpu"))
                return self.linear(x)

        model = nbtrain.prepare_model(Probe())
        out = model(torch.randn(2, 4))
        return {**seen, "out": str(out.dtype), "outside": torch.is_autocast_enabled("cpu")}

    run = nbtrain.launch(train, workers=2, precision="bf16-mixed", name="precision-bf16")
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    assert run.result == [{"autocast": True, "dtype": "torch.bfloat16", "out": "torch.bfloat16",
                           "outside": False}] * 2


def test_float16_scales_the_loss_through_backward_and_prepare_optimizer(cluster):
    def train():
        model = nbtrain.prepare_model(torch.nn.Linear(8, 1), precision="16-mixed")
        optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
        y = x.sum(dim=1, keepdim=True)
        losses = []
        for _ in range(40):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            optimizer.zero_grad()
            nbtrain.backward(loss)
            optimizer.step()
            losses.append(loss.item())
        return {"out": str(out.dtype), "scaled": type(optimizer).__name__, "scale": optimizer.scaler.get_scale(),
                "first": losses[0], "last": losses[-1]}

    run = nbtrain.launch(train, workers=2, name="precision-fp16")
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    for rank in run.result:
        assert rank["out"] == "torch.float16" and rank["scaled"] == "ScaledOptimizer"
        assert rank["scale"] > 1.0 and rank["last"] < rank["first"] / 4


@pytest.mark.quick
def test_unknown_precision_is_refused_before_launch_naming_the_choices():
    with pytest.raises(nbtrain.InvalidOptionError, match=r"bf16-mixed.*16-mixed"):
        nbtrain.launch(lambda: None, precision="fp8")


@pytest.mark.quick
def test_a_bad_strategy_and_a_cuda_only_fsdp_option_are_refused_naming_the_fix():
    """Decided where the rank would wrap the model, before any collective: an unknown strategy names the ones
    there are, and FSDP's pinned CPU offload without a GPU says what to give or pass instead. (How a rank's
    error reaches run.error is test_run_failures.py's.)"""
    from torch.distributed.fsdp import CPUOffloadPolicy

    from nbtrain._cluster.rank import parallel
    from nbtrain._exceptions import InvalidOptionError

    with pytest.raises(InvalidOptionError, match=r"unknown strategy; choose one of 'ddp', 'fsdp'") as raised:
        parallel.check_choices("deepspeed", None)
    assert "deepspeed" in str(raised.value)
    with pytest.raises(InvalidOptionError, match=r"gpus_per_worker=1 or more, or pass CPUOffloadPolicy\(pin_memory="
                                                 r"False\)"):
        parallel.distribute(torch.nn.Linear(2, 2), torch.device("cpu"), 2, "fsdp", None,
                            {"offload_policy": CPUOffloadPolicy(pin_memory=True)}, {})


def train_fsdp_sharded_resume(config):
    model = nbtrain.prepare_model(make_model(), strategy="fsdp", auto_wrap_policy={Block})
    state = {"model": model.state_dict()}
    if nbtrain.get_context().attempt == 1:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)  # a change the restart must find again
        nbtrain.save_checkpoint({"model": model.state_dict()}, sharded=True)
        raise RuntimeError("lost a node after the checkpoint")
    nbtrain.load_checkpoint(into=state)
    model.load_state_dict(state["model"])
    return float(sum(p.full_tensor().double().sum() for p in model.parameters()))


def test_sharded_checkpoints_restore_each_rank_and_load_whole_in_the_notebook(cluster, tmp_path):
    run = nbtrain.launch(train_fsdp_sharded_resume, workers=2, max_failures=1, storage=str(tmp_path / "shared"),
                         name="fsdp-dcp")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    expected = float(sum(p.double().sum() + p.numel() for p in make_model().parameters()))
    assert run.result == [pytest.approx(expected, rel=1e-6)] * 2
    shards = sorted(p.name for p in run.checkpoint_dir().iterdir())
    assert ".metadata" in shards and sum(name.endswith(".distcp") for name in shards) == 2  # one file per rank
    plain = make_model()
    plain.load_state_dict(run.load_checkpoint()["model"])
    assert float(sum(p.double().sum() for p in plain.parameters())) == pytest.approx(expected, rel=1e-6)


def test_sharded_checkpoint_without_storage_says_to_give_it(cluster):
    def train():
        model = nbtrain.prepare_model(make_model(), strategy="fsdp")
        nbtrain.save_checkpoint({"model": model.state_dict()}, sharded=True)

    run = nbtrain.launch(train, workers=2, name="fsdp-dcp-nostorage")
    assert run.wait(timeout=60, raise_on_failure=False) == nbtrain.RunState.FAILED
    assert "storage=" in run.error and "sharded=False" in run.error
