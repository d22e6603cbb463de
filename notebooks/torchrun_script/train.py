"""A torchrun-style DDP training script, written the way the PyTorch examples write them: it joins the
process group itself, reads LOCAL_RANK, parses its arguments, keeps a snapshot it resumes from, and
writes its loss with TensorBoard's SummaryWriter. It knows nothing of nbtrain:

    torchrun --nproc_per_node 2 train.py --epochs 5
    nbtrain.launch_script("train.py", args=["--epochs", "5"], workers=2)     # the same, on a Ray cluster
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from datautils import NoisyLine
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.tensorboard import SummaryWriter


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fit a noisy line with DDP.")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--snapshot", default="snapshot.pt", help="kept after each epoch; resumed from if present")
    parser.add_argument("--logdir", default="runs", help="TensorBoard's event files")
    parser.add_argument("--out", default=None, help="rank 0 writes the final loss here (JSON)")
    parser.add_argument("--fail-once-after-epoch", type=int, default=None,
                        help="fail once after this epoch (to try resuming from the snapshot)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    first_epoch = 0
    if os.path.exists(args.snapshot):
        snapshot = torch.load(args.snapshot)
        model.module.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        first_epoch = snapshot["epoch"] + 1
        print(f"rank {rank} (local rank {local_rank}): resuming at epoch {first_epoch} from {args.snapshot}")
    data = NoisyLine()
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    writer = SummaryWriter(os.path.join(args.logdir, f"rank{rank}"))
    step = first_epoch * len(loader)
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            writer.add_scalar("loss", loss.item(), step)
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                       args.snapshot)
            print(f"epoch {epoch}: loss {loss.item():.4f}, snapshot kept")
        fail_now = args.fail_once_after_epoch == epoch and not os.path.exists(args.snapshot + ".failed")
        dist.barrier()  # the snapshot is kept, and every rank has looked for the mark
        if fail_now:
            if rank == 0:
                open(args.snapshot + ".failed", "w").close()
            dist.barrier()  # the mark is there before any rank fails
            raise RuntimeError(f"failing once after epoch {epoch}, as --fail-once-after-epoch asked")
    writer.close()
    with torch.no_grad():
        final = F.mse_loss(model.module(data.x), data.y).item()
    if rank == 0:
        print(f"final loss {final:.6f}")
        if args.out:
            with open(args.out, "w") as out:
                json.dump({"final_loss": final, "epochs": args.epochs}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
