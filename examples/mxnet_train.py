"""Train a small MLP on scikit-learn's digits with MXNet gluon, through PHub.

    phub launch -n 2 -- python examples/mxnet_train.py --epochs 5

The Trainer's NAG runs on the PHub server (fused with aggregation); each worker trains on its
share of every global batch and calls `trainer.step` with its own batch size. Rank 0 prints the
training loss and test accuracy after each epoch.
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits

import phub.integrations.mxnet as phub_mx


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=64, help="rows per step, over all workers")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    kv = phub_mx.create()  # connects to the server `phub launch` started
    rank, workers = kv.rank, kv.num_workers
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.float32)
    order = np.random.RandomState(0).permutation(len(x))
    train, test = order[:1400], order[1400:]

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(64, activation="relu", in_units=64), gluon.nn.Dense(10, in_units=64))
    net.initialize(mx.init.Xavier())
    # Pass the kvstore *instance*: MXNet ignores kvstore="phub" (by name) on a single device.
    schedule = mx.lr_scheduler.FactorScheduler(step=50, factor=0.8, base_lr=args.lr)
    trainer = gluon.Trainer(net.collect_params(), "nag",
                            {"learning_rate": args.lr, "momentum": 0.9, "lr_scheduler": schedule}, kvstore=kv)
    phub_mx.sync_initial_weights(trainer)  # everyone starts from rank 0's weights
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    local = args.global_batch // workers

    for epoch in range(1, args.epochs + 1):
        shuffled = np.random.RandomState(epoch).permutation(train)  # the same on every worker
        total, count = 0.0, 0
        for start in range(0, len(shuffled) - args.global_batch + 1, args.global_batch):
            rows = shuffled[start + rank * local:start + (rank + 1) * local]  # this worker's share
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x[rows])), mx.nd.array(y[rows]))
            loss.backward()
            trainer.step(local)
            total, count = total + loss.sum().asscalar(), count + len(rows)
        predicted = net(mx.nd.array(x[test])).argmax(axis=1).asnumpy()
        if rank == 0:
            print(f"epoch {epoch}: training loss {total / count:.4f} (rank 0's share), "
                  f"test accuracy {(predicted == y[test]).mean():.3f}, lr {trainer.learning_rate:.4f}", flush=True)
    kv.close()


if __name__ == "__main__":
    main()
