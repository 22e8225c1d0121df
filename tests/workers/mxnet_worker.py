"""A test worker: trains small gluon nets through the phub kvstore and saves their weights.

Run under `phub launch -n N`; PHUB_TEST holds JSON {"out_dir": ..., "steps": ...}. Each scenario
in SCENARIOS gets its own kvstore (sharing one client, keys prefixed by the scenario name).
Worker r trains on rows [r*b, (r+1)*b) of every global batch; `train(..., workers=None)` is the
single-process reference the tests run with MXNet's `local` kvstore on the whole batch.
Rank r > 0 initializes its net with a different seed: broadcast must hand it rank 0's weights.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

IN, HIDDEN, CLASSES, BATCH_PER_WORKER = 8, 16, 4, 6

# name -> (optimizer, optimizer params, trainer extras, devices per worker, lr_mult of the last bias)
SCENARIOS = {
    "nag": ("nag", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.0}, {}, 1, 1.0),
    "nag_two_devices": ("nag", {"learning_rate": 0.1, "momentum": 0.9}, {}, 2, 1.0),
    "sgd_schedule_clip": ("sgd", {"learning_rate": 0.2, "momentum": 0.9, "wd": 1e-3, "clip_gradient": 0.05,
                                  "lr_scheduler": ("factor", 2, 0.5)}, {}, 1, 1.0),
    "sgd_lr_mult_set_lr": ("sgd", {"learning_rate": 0.3, "wd": 1e-3}, {}, 1, 3.0),
    "nag_update_on_worker": ("nag", {"learning_rate": 0.1, "momentum": 0.9}, {"update_on_kvstore": False}, 1, 1.0),
    "adam_fallback": ("adam", {"learning_rate": 0.01}, {}, 1, 1.0),
    # dist_sync's convention: the workers' gradients summed, each worker's step(b) with its own b
    "nag_dist_sync_sum": ("nag", {"learning_rate": 0.05, "momentum": 0.9, "wd": 0.0}, {}, 1, 1.0),
    "sgd_update_on_worker_sum": ("sgd", {"learning_rate": 0.1, "momentum": 0.9}, {"update_on_kvstore": False}, 1, 1.0),
}
SUMMED = {"nag_dist_sync_sum", "sgd_update_on_worker_sum"}  # created with reduce="sum"


def make_net(seed, devices):
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(HIDDEN, activation="relu", in_units=IN), gluon.nn.Dense(CLASSES, in_units=HIDDEN))
    net.initialize(ctx=devices)
    rng = np.random.RandomState(seed)
    for param in layer_params(net).values():  # by position: gluon's names depend on a global counter
        param.set_data(mx.nd.array(rng.normal(0, 0.5, param.shape).astype(np.float32)))
    return net


def layer_params(net):
    return {f"{i}.{kind}": getattr(layer, kind) for i, layer in enumerate(net) for kind in ("weight", "bias")}


def batch(step, workers):
    rng = np.random.RandomState(1000 + step)
    x = rng.normal(size=(BATCH_PER_WORKER * workers, IN)).astype(np.float32)
    y = rng.randint(0, CLASSES, size=BATCH_PER_WORKER * workers).astype(np.float32)
    return x, y


def train(name, steps, kvstore, rank, workers, local_workers=None):
    """Train scenario `name` for `steps`; return {param name: weights}.

    `workers`: the job's size (each rank takes its share of every global batch). With
    `local_workers`, one process trains on the whole global batch of that many workers.
    """
    optimizer, params, extras, ndev, lr_mult = SCENARIOS[name]
    params = dict(params)
    if "lr_scheduler" in params:
        _, step, factor = params["lr_scheduler"]
        params["lr_scheduler"] = mx.lr_scheduler.FactorScheduler(step=step, factor=factor,
                                                                 base_lr=params["learning_rate"])
    devices = [mx.cpu(i) for i in range(ndev)]
    net = make_net(rank, devices)
    net[1].bias.lr_mult = lr_mult
    trainer = gluon.Trainer(net.collect_params(), optimizer, params, kvstore=kvstore, **extras)
    if local_workers is None:
        from phub.integrations.mxnet import sync_initial_weights
        sync_initial_weights(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    global_workers = local_workers or workers
    for step in range(1, steps + 1):
        x, y = batch(step, global_workers)
        if local_workers is None:
            share = slice(rank * BATCH_PER_WORKER, (rank + 1) * BATCH_PER_WORKER)
            x, y = x[share], y[share]
        if name == "sgd_lr_mult_set_lr" and step == 3:
            trainer.set_learning_rate(0.1)
        xs = gluon.utils.split_and_load(x, devices, even_split=False)
        ys = gluon.utils.split_and_load(y, devices, even_split=False)
        with autograd.record():
            losses = [loss_fn(net(xi), yi) for xi, yi in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        # dist_sync-style: step(one worker's batch); PHub's own: step(the rows this process saw)
        trainer.step(BATCH_PER_WORKER if name in SUMMED else len(x))
    return {n: p.data(devices[0]).asnumpy() for n, p in layer_params(net).items()}


def main():
    import phub
    from phub.integrations import mxnet as phub_mx

    params = json.loads(os.environ["PHUB_TEST"])
    client = phub.connect()
    saved = {}
    for name in SCENARIOS:
        kv = phub_mx.create(client=client, prefix=f"{name}/", reduce="sum" if name in SUMMED else "mean")
        assert kv.type == "phub" and kv.num_workers == client.num_workers
        weights = train(name, params["steps"], kv, client.rank, client.num_workers)
        saved.update({f"{name}|{k}": v for k, v in weights.items()})
    client.close()
    path = os.path.join(params["out_dir"], f"rank{client.rank}.npz")
    np.savez(path + ".tmp.npz", **saved)
    os.replace(path + ".tmp.npz", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
