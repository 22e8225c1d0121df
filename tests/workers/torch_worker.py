"""A test worker: trains a small net through PHub from PyTorch and saves the weights.

Run under `phub launch -n N`; PHUB_TEST holds JSON {"out_dir": ..., "steps": ...}. Scenarios:
"gloo" (DDP with its default allreduce over gloo), "hook" (the same DDP model with the phub
hook), "server_nag" and "server_sgd" (no DDP: `ServerOptimizer`). Worker r trains on rows
[r*b, (r+1)*b) of each global batch; `train_single` is the one-process reference on the whole
batch. Rank r initializes with seed r: DDP and ServerOptimizer must hand out rank 0's weights.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

IN, HIDDEN, CLASSES, BATCH_PER_WORKER = 8, 16, 4, 6
LR, MOMENTUM = 0.1, 0.9
# The scenarios without DDP: ServerOptimizer / torch.optim.SGD arguments, and a StepLR step (or 0)
SERVER = {"server_nag": (dict(lr=LR, momentum=MOMENTUM, weight_decay=1e-3, nesterov=True), 2),
          "server_sgd": (dict(lr=LR, momentum=0.5, weight_decay=1e-3), 0)}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # Registered in the opposite order of use: DDP's first buckets (reverse registration
        # order) then differ from the order gradients become ready, so it rebuilds them.
        self.out = torch.nn.Linear(HIDDEN, CLASSES)
        self.hidden = torch.nn.Linear(IN, HIDDEN)

    def forward(self, x):
        return self.out(F.relu(self.hidden(x)))


def make_net(seed):
    torch.manual_seed(seed)
    return Net()


def batch(step, workers, rank=None):
    rng = np.random.RandomState(1000 + step)
    x = torch.from_numpy(rng.normal(size=(BATCH_PER_WORKER * workers, IN)).astype(np.float32))
    y = torch.from_numpy(rng.randint(0, CLASSES, size=BATCH_PER_WORKER * workers))
    if rank is None:
        return x, y
    share = slice(rank * BATCH_PER_WORKER, (rank + 1) * BATCH_PER_WORKER)
    return x[share], y[share]


def weights(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def run_steps(model, optimizer, steps, workers, rank=None, scheduler=None):
    for step in range(1, steps + 1):
        x, y = batch(step, workers, rank)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()  # the mean over this worker's rows
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def train_single(name, steps, workers):
    """The one-process reference for every scenario: torch's SGD on the whole global batch."""
    model = make_net(0)
    args, lr_step = SERVER.get(name, (dict(lr=LR, momentum=MOMENTUM, nesterov=True), 0))
    opt = torch.optim.SGD(model.parameters(), **args)
    sched = torch.optim.lr_scheduler.StepLR(opt, lr_step, 0.5) if lr_step else None
    run_steps(model, opt, steps, workers, None, sched)
    return weights(model)


def main():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import phub
    from phub.integrations import torch as phub_torch

    params = json.loads(os.environ["PHUB_TEST"])
    steps = params["steps"]
    client = phub.connect()
    rank, workers = client.rank, client.num_workers
    phub_torch.init_process_group(client)
    saved = {}
    for name in ("gloo", "hook"):
        model = DDP(make_net(rank), bucket_cap_mb=200 / 2**20)  # ~50 floats a bucket: several buckets
        if name == "hook":
            state = phub_torch.register_hook(model, client)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
        run_steps(model, opt, steps, workers, rank)
        saved.update({f"{name}|{k}": v for k, v in weights(model.module).items()})
    saved["hook_layouts"] = np.array(sorted(state.keys), dtype=np.int64)
    state.close()
    for name, (args, lr_step) in SERVER.items():
        model = make_net(rank)
        opt = phub_torch.ServerOptimizer(model.parameters(), client=client, prefix=f"{name}.", **args)
        sched = torch.optim.lr_scheduler.StepLR(opt, lr_step, 0.5) if lr_step else None
        run_steps(model, opt, steps, workers, rank, sched)
        saved.update({f"{name}|{k}": v for k, v in weights(model).items()})
    client.close()
    dist.destroy_process_group()
    path = os.path.join(params["out_dir"], f"rank{rank}.npz")
    np.savez(path + ".tmp.npz", **saved)
    os.replace(path + ".tmp.npz", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
