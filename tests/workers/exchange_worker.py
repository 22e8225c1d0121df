"""A test worker: registers known arrays, pushes known gradients for K steps, saves what it got.

Parameters come as JSON in PHUB_TEST: sizes (list of shapes), steps, optimizer (dict or null for
the server's default sum), out_dir, and optionally announce (print "step N" lines as it goes),
split_init (register the first array in one init call and the rest in a second: two batches),
slow: {"rank": R, "seconds": S} (rank R computes for S seconds before each push: a straggler) and
share (rank 0 shares SHARED_EARLY before its init, which the others ask for after theirs, and
SHARED_LATE after the exchange; every rank saves what it got), checkpoint (a path: rank 0 saves
its weights, the server's optimizer state and the step there after every step, and every rank
resumes from it when it exists) and die: {"rank", "step", "marker"} (that rank kills itself with
SIGKILL after that step, once: the marker file says it did).
Rank r's gradient for array a at step s is (r + 1) * s * pattern(a): exact sums in float32.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import phub
from phub.reduction.optim import optimizer_from_dict


def pattern(size, seed, period=11, scale=1 / 32):
    return (((np.arange(size) + seed) % period - period // 2) * scale).astype(np.float32)


def initial(size, seed):
    return pattern(size, seed, period=7, scale=1 / 8) + np.float32(1.0)


SHARED_EARLY = {"port": 29500, "hosts": ["198.18.0.1", "198.18.0.2"], "text": "säkert"}
SHARED_LATE = [1.5, None, True, 2**40]


def main():
    params = json.loads(os.environ["PHUB_TEST"])
    kv = phub.connect()
    rank = kv.rank
    share = params.get("share")
    if share and rank == 0:
        early = kv.share("early", SHARED_EARLY)
    shapes = [tuple(s) for s in params["sizes"]]
    keys = [f"array{i}" for i in range(len(shapes))]
    rng = np.random.default_rng(rank)
    weights = [initial(int(np.prod(s)), i).reshape(s) if rank == 0 else
               rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)]
    checkpoint, start, resumed = params.get("checkpoint"), 0, None
    if checkpoint and os.path.exists(checkpoint):
        with np.load(checkpoint) as saved_state:
            start = int(saved_state["step"])
            weights = [saved_state[f"w{i}"] for i in range(len(shapes))]
            resumed = {key: saved_state[f"m{i}"] for i, key in enumerate(keys)}
    if params.get("split_init"):
        kv.init(keys[:1], weights[:1])
        kv.init(keys[1:], weights[1:])
    else:
        kv.init(keys, weights)
    if params.get("optimizer"):
        kv.set_optimizer(optimizer_from_dict(params["optimizer"]))
    if resumed is not None:
        kv.load_optimizer_state(resumed)
    saved = {f"init{i}": w.copy() for i, w in enumerate(weights)}
    if share and rank != 0:
        early = kv.share("early")  # handed out before this worker's init completed
    saved["transport"] = np.array(kv.transport)
    slow = params.get("slow") or {}
    for step in range(start + 1, params["steps"] + 1):
        if slow.get("rank") == rank:
            time.sleep(slow["seconds"])  # emulated slow compute, not synchronization
        grads = [pattern(w.size, i).reshape(w.shape) * np.float32((rank + 1) * step) for i, w in enumerate(weights)]
        if params.get("optimizer"):
            outs = weights
        else:
            outs = [np.empty_like(w) for w in weights]
        handles = [kv.pushpull_async(k, g, out=o) for k, g, o in reversed(list(zip(keys, grads, outs)))]
        for h in handles:
            h.wait()
        if not params.get("optimizer"):
            for i, o in enumerate(outs):
                saved[f"sum{step}_{i}"] = o.copy()
        if params.get("announce"):
            print(f"step {step}", flush=True)
        if checkpoint and rank == 0:
            state = kv.optimizer_state()
            arrays = {**{f"w{i}": w for i, w in enumerate(weights)}, **{f"m{i}": state[k] for i, k in enumerate(keys)}}
            np.savez(checkpoint + ".tmp.npz", step=step, **arrays)
            os.replace(checkpoint + ".tmp.npz", checkpoint)
        die = params.get("die") or {}
        if die.get("rank") == rank and die["step"] == step and not os.path.exists(die["marker"]):
            open(die["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    if share:
        saved["shared"] = np.array(json.dumps([early, kv.share("late", SHARED_LATE if rank == 0 else None)]))
    kv.close()
    for i, w in enumerate(weights):
        saved[f"final{i}"] = w
    path = os.path.join(params["out_dir"], f"rank{rank}.npz")
    np.savez(path + ".tmp.npz", **saved)
    os.replace(path + ".tmp.npz", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
