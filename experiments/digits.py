"""A real training task for the convergence check: scikit-learn's digits, a small MLP.

Everything here is deterministic: the train/test split, the initial weights (drawn once with
numpy, so MXNet and PyTorch start from the same point) and the order of the samples in every
epoch. One *global* batch of `global_batch` rows is one step; with N workers, worker r trains on
rows [r*b, (r+1)*b) of it (b = global_batch / N), so N workers through PHub compute the same
updates as one process on the whole batch, up to float32 rounding.

Run as a PHub worker (what `experiments.convergence` does):

    phub launch -n 2 -- python -m experiments.digits --framework mxnet --epochs 10 --out curve.jsonl

Rank 0 writes one JSON line per epoch: {"epoch", "train_loss", "test_accuracy"}.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Dict, List, Optional

import numpy as np

HIDDEN = 32
FRAMEWORKS = ("mxnet", "torch-ddp", "torch-server")  # how the PHub runs train (single: no PHub)


class Digits:
    """The data set, split 80/20 with a fixed permutation; features scaled to [0, 1]."""

    def __init__(self, seed: int = 0):
        from sklearn.datasets import load_digits  # ships with scikit-learn: no download

        data = load_digits()
        x = (data.data / 16.0).astype(np.float32)
        y = data.target.astype(np.int64)
        order = np.random.RandomState(seed).permutation(len(x))
        cut = int(0.8 * len(x))
        self.x_train, self.y_train = x[order[:cut]], y[order[:cut]]
        self.x_test, self.y_test = x[order[cut:]], y[order[cut:]]
        self.features, self.classes = x.shape[1], 10

    def batches(self, epoch: int, global_batch: int, rank: int = 0, workers: int = 1):
        """Yield this worker's (x, y) share of each global batch of `epoch` (incomplete batch dropped)."""
        if global_batch % workers:
            raise ValueError(f"global batch {global_batch} does not split over {workers} workers")
        local = global_batch // workers
        order = np.random.RandomState(1000 + epoch).permutation(len(self.x_train))
        for start in range(0, len(order) - global_batch + 1, global_batch):
            rows = order[start + rank * local:start + (rank + 1) * local]
            yield self.x_train[rows], self.y_train[rows]


def initial_weights(features: int, classes: int, seed: int = 0) -> List[np.ndarray]:
    """[w1 (HIDDEN x features), b1, w2 (classes x HIDDEN), b2]: the (out, in) layout both frameworks use."""
    rng = np.random.RandomState(seed)
    return [(rng.normal(0, np.sqrt(2.0 / features), (HIDDEN, features))).astype(np.float32),
            np.zeros(HIDDEN, np.float32),
            (rng.normal(0, np.sqrt(1.0 / HIDDEN), (classes, HIDDEN))).astype(np.float32),
            np.zeros(classes, np.float32)]


def _cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].mean())


def evaluate(data: Digits, weights: List[np.ndarray]) -> Dict[str, float]:
    """Mean cross-entropy on the whole training set and accuracy on the test set, in float64 numpy
    (one evaluation for both frameworks, from their weights)."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)

    def logits(x):
        return np.maximum(x @ w1.T + b1, 0.0) @ w2.T + b2

    return {"train_loss": _cross_entropy(logits(data.x_train), data.y_train),
            "test_accuracy": float((logits(data.x_test).argmax(axis=1) == data.y_test).mean())}


# Called after every epoch with (epoch, weights as numpy arrays).
EpochCallback = Callable[[int, List[np.ndarray]], None]


def train_mxnet(data: Digits, epochs: int, global_batch: int, lr: float, momentum: float,
                on_epoch: EpochCallback, kvstore=None, rank: int = 0, workers: int = 1) -> None:
    """Gluon MLP with MXNet's NAG. `kvstore=None`: one process, MXNet alone; else a phub kvstore."""
    import mxnet as mx
    from mxnet import autograd, gluon

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(HIDDEN, activation="relu", in_units=data.features),
            gluon.nn.Dense(data.classes, in_units=HIDDEN))
    net.initialize()
    params = [p for layer in net for p in (layer.weight, layer.bias)]
    for p, w in zip(params, initial_weights(data.features, data.classes)):
        p.set_data(mx.nd.array(w))
    trainer = gluon.Trainer(net.collect_params(), "nag", {"learning_rate": lr, "momentum": momentum},
                            kvstore=kvstore)
    if kvstore is not None:
        from phub.integrations.mxnet import sync_initial_weights
        sync_initial_weights(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for epoch in range(1, epochs + 1):
        for x, y in data.batches(epoch, global_batch, rank, workers):
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
            loss.backward()
            trainer.step(len(x))  # per-sample losses summed, normalized by the local batch
        on_epoch(epoch, [p.data().asnumpy() for p in params])


def train_torch(data: Digits, epochs: int, global_batch: int, lr: float, momentum: float,
                on_epoch: EpochCallback, mode: str = "single", client=None) -> None:
    """The same MLP in PyTorch with Nesterov SGD. `mode`: "single" (one process, torch alone),
    "ddp" (DDP with the phub hook, SGD on each worker) or "server" (ServerOptimizer)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(data.features, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, data.classes))
    layers = [model[0], model[2]]
    with torch.no_grad():
        for p, w in zip([p for m in layers for p in (m.weight, m.bias)], initial_weights(data.features, data.classes)):
            p.copy_(torch.from_numpy(w))
    rank, workers = (0, 1) if client is None else (client.rank, client.num_workers)
    trained = model
    if mode == "single":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=True)
    elif mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        from phub.integrations.torch import init_process_group, register_hook
        init_process_group(client)
        trained = DistributedDataParallel(model)
        hook = register_hook(trained, client)
        opt = torch.optim.SGD(trained.parameters(), lr=lr, momentum=momentum, nesterov=True)
    elif mode == "server":
        from phub.integrations.torch import ServerOptimizer
        opt = ServerOptimizer(model.parameters(), lr=lr, momentum=momentum, nesterov=True, client=client)
    else:
        raise ValueError(f"unknown mode {mode!r}: single, ddp or server")
    for epoch in range(1, epochs + 1):
        for x, y in data.batches(epoch, global_batch, rank, workers):
            opt.zero_grad()
            F.cross_entropy(trained(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            opt.step()
        on_epoch(epoch, [p.detach().numpy().copy() for m in layers for p in (m.weight, m.bias)])
    if mode == "ddp":
        hook.close()
        torch.distributed.destroy_process_group()


def train(framework: str, data: Digits, epochs: int, global_batch: int, lr: float, momentum: float,
          on_epoch: EpochCallback, client=None) -> None:
    """Train `framework` (see FRAMEWORKS) through PHub with `client`, or in one process without
    PHub when `client` is None ("torch-ddp" and "torch-server" then mean plain PyTorch)."""
    if framework == "mxnet":
        kvstore = None
        if client is not None:
            from phub.integrations.mxnet import create
            kvstore = create(client=client)
        workers = 1 if client is None else client.num_workers
        rank = 0 if client is None else client.rank
        train_mxnet(data, epochs, global_batch, lr, momentum, on_epoch, kvstore, rank, workers)
    elif framework in ("torch-ddp", "torch-server"):
        mode = "single" if client is None else framework.split("-")[1]
        train_torch(data, epochs, global_batch, lr, momentum, on_epoch, mode, client)
    else:
        raise ValueError(f"unknown framework {framework!r}; known: {', '.join(FRAMEWORKS)}")


def curve(framework: str, epochs: int, global_batch: int, lr: float, momentum: float,
          client=None) -> List[Dict[str, float]]:
    """Train and return one {"epoch", "train_loss", "test_accuracy"} per epoch."""
    data = Digits()
    rows: List[Dict[str, float]] = []
    train(framework, data, epochs, global_batch, lr, momentum,
          lambda epoch, weights: rows.append({"epoch": epoch, **evaluate(data, weights)}), client)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Train the digits MLP as a PHub worker (run under phub launch).")
    parser.add_argument("--framework", choices=FRAMEWORKS, required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--out", required=True, help="JSON-lines file rank 0 writes, one line per epoch")
    args = parser.parse_args(argv)

    import phub

    client = phub.connect()
    rows = curve(args.framework, args.epochs, args.global_batch, args.lr, args.momentum, client)
    client.close()
    if client.rank == 0:
        from phub.fileio import write_text

        write_text(args.out, "".join(json.dumps(row) + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
