"""Train a small MLP on scikit-learn's digits with PyTorch, through PHub.

    phub launch -n 2 -- python examples/torch_train.py --mode ddp      # DDP, PHub averages gradients
    phub launch -n 2 -- python examples/torch_train.py --mode server   # NAG runs on the PHub server
    phub launch -n 2 --max-restarts 3 -- python examples/torch_train.py --mode server --checkpoint ckpt.pt

`ddp`: a DistributedDataParallel model whose gradient buckets go through PHub (the phub comm
hook); each worker's torch optimizer then updates. `server`: no DDP; `ServerOptimizer` pushes
every gradient and receives the new weights. Rank 0 prints loss and test accuracy per epoch.
With `--checkpoint FILE`, rank 0 saves the model, the optimizer (in server mode its momentum, as
the server holds it) and the schedule there after every epoch, and a start that finds the file
resumes after that epoch: with `--max-restarts`, a job that lost a worker continues where it was.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel

import phub
import phub.integrations.torch as phub_torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ddp", "server"), default="ddp")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=64, help="rows per step, over all workers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", help="a file for the checkpoint (saved after every epoch, resumed from)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # the workers share this machine's cores
    torch.manual_seed(0)  # the same run every time (rank 0's initial weights win anyway)
    client = phub.connect()  # the server `phub launch` started
    rank, workers = client.rank, client.num_workers
    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = np.random.RandomState(0).permutation(len(x))
    train, test = order[:1400], order[1400:]

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    saved = torch.load(args.checkpoint) if args.checkpoint and os.path.exists(args.checkpoint) else None
    if saved:
        model.load_state_dict(saved["model"])  # before the optimizer hands out rank 0's weights
    if args.mode == "ddp":
        phub_torch.init_process_group(client)  # DDP needs one for its setup; gradients go via PHub
        model = DistributedDataParallel(model)  # starts every worker from rank 0's weights
        hook = phub_torch.register_hook(model, client)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    else:
        opt = phub_torch.ServerOptimizer(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                                         client=client)  # also hands out rank 0's weights
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.8)
    local = args.global_batch // workers
    done = 0
    if saved:
        opt.load_state_dict(saved["optimizer"])  # server mode: the momentum goes back to the server
        schedule.load_state_dict(saved["schedule"])
        done = saved["epoch"]
        if rank == 0:
            print(f"resumed after epoch {done} from {args.checkpoint}", flush=True)

    for epoch in range(done + 1, args.epochs + 1):
        shuffled = np.random.RandomState(epoch).permutation(train)  # the same on every worker
        total, count = 0.0, 0
        for start in range(0, len(shuffled) - args.global_batch + 1, args.global_batch):
            rows = torch.from_numpy(shuffled[start + rank * local:start + (rank + 1) * local])
            opt.zero_grad()
            loss = F.cross_entropy(model(x[rows]), y[rows])
            loss.backward()
            opt.step()
            total, count = total + loss.item() * len(rows), count + len(rows)
        schedule.step()
        with torch.no_grad():
            accuracy = (model(x[test]).argmax(dim=1) == y[test]).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch}: training loss {total / count:.4f} (rank 0's share), "
                  f"test accuracy {accuracy:.3f}, lr {schedule.get_last_lr()[0]:.4f}", flush=True)
        if args.checkpoint and rank == 0:  # written whole, then renamed: a checkpoint is never half one
            module = model.module if args.mode == "ddp" else model
            torch.save({"model": module.state_dict(), "optimizer": opt.state_dict(), "schedule": schedule.state_dict(),
                        "epoch": epoch}, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
    if args.mode == "ddp":
        hook.close()
        torch.distributed.destroy_process_group()
    client.close()


if __name__ == "__main__":
    main()
