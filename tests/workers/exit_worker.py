"""A test worker that trains a few steps through PHub, then ends in a chosen way.

Run under `phub launch`; PHUB_TEST holds JSON {"framework": ..., "ending": ...}.

framework: plain (phub.connect, init, pushpull), mxnet (gluon.Trainer with the phub kvstore),
torch (ServerOptimizer, which opens its own client), torch_ddp (DDP with the phub hook).

ending:
  none       the script just ends: no close()
  close      the store's (or client's) close() first
  sys_exit   sys.exit(0) from inside a function
  in_flight  (plain) a pushpull_async is left unwaited: exit must finish it before saying BYE
  collected  (mxnet, torch) the store is dropped and garbage-collected, then os._exit(0), which
             skips every exit hook: only the collection can have said goodbye
  raise      rank 1 raises ValueError before its second step; the others go on pushing
  kill       rank 1 SIGKILLs itself before its second step; the others go on pushing

Rank 0 first prints "phub from DIR", so that a test can check which phub ran.
"""
import gc
import json
import os
import signal
import sys

import numpy as np

import phub

STEPS = 3


def before_step(ending, rank, step):
    if rank == 1 and step == 2:
        if ending == "raise":
            raise ValueError("rank 1 fails on purpose")
        if ending == "kill":
            os.kill(os.getpid(), signal.SIGKILL)


def _torch_steps(model, opt, ending, rank):
    """STEPS steps of a torch optimizer on rank-dependent inputs."""
    import torch

    x = torch.ones(2, 8) * (rank + 1)
    for step in range(1, STEPS + 1):
        before_step(ending, rank, step)
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.step()


def plain(ending, rank):
    kv = phub.connect()
    w = np.zeros(1000, np.float32)
    kv.init("w", w)
    kv.set_optimizer(phub.SGD(learning_rate=0.5))
    for step in range(1, STEPS + 1):
        before_step(ending, rank, step)
        kv.pushpull("w", np.ones(1000, np.float32), out=w)
    assert np.all(w == -0.5 * 2 * STEPS), w[:3]  # SGD on the sum of two workers' ones
    if ending == "in_flight":
        kv.pushpull_async("w", np.ones(1000, np.float32), out=w)
    return kv, kv.close


def mxnet(ending, rank):
    import mxnet as mx
    from mxnet import autograd, gluon

    import phub.integrations.mxnet as phub_mx

    kv = phub_mx.create()
    net = gluon.nn.Dense(4, in_units=8)
    net.initialize(mx.init.Normal(0.5))
    trainer = gluon.Trainer(net.collect_params(), "nag", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
    phub_mx.sync_initial_weights(trainer)
    x = mx.nd.ones((2, 8)) * (rank + 1)
    for step in range(1, STEPS + 1):
        before_step(ending, rank, step)
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        trainer.step(2)
    return kv, kv.close


def torch_server(ending, rank):
    import torch

    import phub.integrations.torch as phub_torch

    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 4)
    opt = phub_torch.ServerOptimizer(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)  # its own client
    _torch_steps(model, opt, ending, rank)
    return opt, opt.client.close


def torch_ddp(ending, rank):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import phub.integrations.torch as phub_torch

    client = phub.connect()
    phub_torch.init_process_group(client)
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    phub_torch.register_hook(model, client)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _torch_steps(model, opt, ending, rank)
    return client, client.close


FRAMEWORKS = {"plain": plain, "mxnet": mxnet, "torch": torch_server, "torch_ddp": torch_ddp}


def main():
    params = json.loads(os.environ["PHUB_TEST"])
    ending = params["ending"]
    rank = int(os.environ["PHUB_RANK"])
    if rank == 0:
        print(f"phub from {os.path.dirname(os.path.abspath(phub.__file__))}", flush=True)
    store, close = FRAMEWORKS[params["framework"]](ending, rank)
    if ending == "close":
        close()
    elif ending == "collected":
        client = getattr(store, "client", None)
        del store, close
        gc.collect()
        print(f"rank {rank} collected, client closed: {client._closing}", flush=True)
        os._exit(0)
    elif ending == "sys_exit":
        sys.exit(0)
    # none, in_flight: the script ends here, with the client still open


if __name__ == "__main__":
    main()
