"""Train a small MLP on scikit-learn's digits with MXNet gluon, through PHub.

    phub launch -n 2 -- python examples/mxnet_train.py --epochs 5
    phub launch -n 2 --max-restarts 3 -- python examples/mxnet_train.py --checkpoint ckpt/

The Trainer's NAG runs on the PHub server (fused with aggregation); each worker trains on its
share of every global batch and calls `trainer.step` with its own batch size. Rank 0 prints the
training loss and test accuracy after each epoch. With `--checkpoint DIR`, rank 0 saves the
weights and the server's optimizer state (NAG's momentum) there after every epoch, and a start
that finds them resumes after that epoch: with `--max-restarts`, a job that lost a worker
continues where it was.
"""
import argparse
import json
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits

import phub.integrations.mxnet as phub_mx


def save_checkpoint(folder, epoch, net, kv):
    """This epoch's weights and server-side optimizer state, then epoch.json naming them (a
    checkpoint counts once that file says so), then the previous epoch's files removed."""
    os.makedirs(folder, exist_ok=True)
    net.save_parameters(os.path.join(folder, f"net-{epoch}.params"))
    kv.save_optimizer_states(os.path.join(folder, f"optimizer-{epoch}.states"))  # NAG's momentum, from the server
    with open(os.path.join(folder, "epoch.json.tmp"), "w") as f:
        json.dump({"epoch": epoch}, f)
    os.replace(os.path.join(folder, "epoch.json.tmp"), os.path.join(folder, "epoch.json"))
    for old in (f"net-{epoch - 1}.params", f"optimizer-{epoch - 1}.states"):
        if os.path.exists(os.path.join(folder, old)):
            os.remove(os.path.join(folder, old))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=64, help="rows per step, over all workers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", help="a folder for the checkpoint (saved after every epoch, resumed from)")
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
    done = 0  # epochs already trained (a checkpoint's)
    if args.checkpoint and os.path.exists(os.path.join(args.checkpoint, "epoch.json")):
        with open(os.path.join(args.checkpoint, "epoch.json")) as f:
            done = json.load(f)["epoch"]
        net.load_parameters(os.path.join(args.checkpoint, f"net-{done}.params"))
    # Pass the kvstore *instance*: MXNet ignores kvstore="phub" (by name) on a single device.
    trainer = gluon.Trainer(net.collect_params(), "nag", {"learning_rate": args.lr, "momentum": 0.9}, kvstore=kv)
    phub_mx.sync_initial_weights(trainer)  # everyone starts from rank 0's weights
    if done:
        kv.load_optimizer_states(os.path.join(args.checkpoint, f"optimizer-{done}.states"))  # momentum, to the server
        if rank == 0:
            print(f"resumed after epoch {done} from {args.checkpoint}", flush=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    local = args.global_batch // workers

    for epoch in range(done + 1, args.epochs + 1):
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
                  f"test accuracy {(predicted == y[test]).mean():.3f}", flush=True)
        if args.checkpoint and rank == 0:
            save_checkpoint(args.checkpoint, epoch, net, kv)
    kv.close()


if __name__ == "__main__":
    main()
