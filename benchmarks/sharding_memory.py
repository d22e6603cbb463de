"""Parameter and optimizer memory per rank: DDP vs FSDP (nbtrain.prepare_model), 2 ranks, in one run.

Each rank builds the same model (``--blocks`` blocks of Linear(``--width``, ``--width``)),
prepares it with ``strategy="ddp"`` or ``"fsdp"`` (one FSDP unit per block), takes a few
Adam steps, and reports the bytes of the parameters and of the optimizer state it holds,
and its process RSS. Also checks that both strategies' losses agree at the first step.

    python benchmarks/sharding_memory.py                 # 8 blocks of 1024: 8.4 M parameters
    python benchmarks/sharding_memory.py --blocks 16 --width 2048
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _own_cluster import own_cluster


def train(config: dict[str, Any]) -> dict[str, Any]:
    import psutil
    import torch

    import nbtrain

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(config["width"], config["width"]), torch.nn.ReLU())
              for _ in range(config["blocks"])]
    model = nbtrain.prepare_model(torch.nn.Sequential(*blocks), strategy=config["strategy"],
                                  auto_wrap_policy={torch.nn.Sequential} if config["strategy"] == "fsdp" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(32, config["width"], generator=torch.Generator().manual_seed(nbtrain.get_context().rank))
    losses = []
    for _ in range(config["steps"]):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    def local(tensor: Any) -> Any:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    param_bytes = sum(local(p).numel() * local(p).element_size() for p in model.parameters())
    optimizer_bytes = sum(local(v).numel() * local(v).element_size() for state in optimizer.state.values()
                          for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
    return {"param_mb": param_bytes / 2**20, "optimizer_mb": optimizer_bytes / 2**20,
            "rss_mb": psutil.Process().memory_info().rss / 2**20, "first_loss": losses[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {}
    with own_cluster("nbtrain-sharding-", num_cpus=2):
        import nbtrain

        for strategy in ("ddp", "fsdp"):
            config = {"blocks": args.blocks, "width": args.width, "steps": args.steps, "strategy": strategy}
            run = nbtrain.launch(train, config=config, workers=2, warm=False, name=f"sharding-{strategy}")
            run.wait(timeout=600)
            results[strategy] = run.result
            run.delete()
    params = args.blocks * (args.width * args.width + args.width)
    print(f"\n**Memory per rank, 2 ranks** ({params / 1e6:.1f} M fp32 parameters, Adam, {args.steps} steps)\n")
    print("| strategy | parameters / rank | optimizer state / rank | process RSS (rank 0) | first loss (rank 0) |")
    print("|---|---|---|---|---|")
    for strategy, ranks in results.items():
        print(f"| {strategy} | {ranks[0]['param_mb']:.1f} MB | {ranks[0]['optimizer_mb']:.1f} MB | "
              f"{ranks[0]['rss_mb']:.0f} MB | {ranks[0]['first_loss']:.6f} |")
    ddp, fsdp = results["ddp"][0], results["fsdp"][0]
    print(f"\nFSDP / DDP: parameters {fsdp['param_mb'] / ddp['param_mb']:.2f}x, "
          f"optimizer state {fsdp['optimizer_mb'] / ddp['optimizer_mb']:.2f}x")


if __name__ == "__main__":
    main()
