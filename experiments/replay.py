"""The compute replay and the exchange oracle: one worker's training loop, the same for every system.

Per iteration, on an emulated GPU (sleeping is its compute):

* forward, layer by layer in forward order: wait for the layer's new weights (from the previous
  exchange), then compute the layer's forward time;
* backward, in reverse layer order: compute the layer's backward time, then write its gradient
  and hand it to the system at once, so communication overlaps the rest of backward;
* systems that exchange the consolidated gradient (gloo) exchange it once after backward.

Compute time runs on a deadline clock: each layer's time is added to a running deadline, so
sleep overshoot and the CPU work of pushing do not accumulate (the GPU would compute meanwhile);
a wait for weights moves the deadline to when they arrived (the GPU could not start earlier).
With compute zero nothing sleeps: the loop times pure exchanges (the paper's infinitely fast GPU).

An iteration's time is from the start of its forward to the start of the next forward, less any
time spent verifying. In steady state that period holds one exchange: its forward waits for the
previous iteration's exchange to finish, its backward starts its own. So the timed iterations are
the `iterations` after the first warmup + 1 (the period after the last warmup iteration still
finishes the warmup exchange), and the loop runs warmup + iterations + 1 iterations and then a
final forward that waits for the last exchange (untimed).

The oracle (`--verify`): rank 0 starts with weights I_k, worker r pushes (r+1)*G_k for array k
(small dyadic patterns, so their sum N(N+1)/2*G_k is exact in float32), and the expected weights
after each exchange are the reference NAG (phub's numpy kernels) applied to that sum. The initial
weights and each warm-up exchange are checked as they land; the timed exchanges are checked once,
after the last one (a wrong sum in any of them stays in the weights), because checking one means
waiting for every key before the next forward, which then cannot overlap the exchange's tail as
an unverified run's does: that made verified compute-bound points a few percent slower.
"""
from __future__ import annotations

import os
import time
from typing import List, Optional

import numpy as np

from phub.reduction.kernels import get_backend
from phub.reduction.optim import NAG

from .models import Model, compute_schedule
from .monitor import wait_for_sample
from .systems import WorkerSystem

VERIFY_TOLERANCE = 1e-5  # max |w - oracle| / max(1, |oracle|); float32 rounding of equivalent formulas


def pattern(size: int, period: int, scale: float, offset: int) -> np.ndarray:
    """Small dyadic values: sums and small multiples of them are exact in float32."""
    return (((np.arange(size, dtype=np.int64) + offset) % period - period // 2) * scale).astype(np.float32)


def initial_weights(size: int, key: int) -> np.ndarray:
    return pattern(size, 13, 1 / 64, key)


def gradient(size: int, key: int, rank: int) -> np.ndarray:
    return pattern(size, 17, 1 / 16, 3 * key) * np.float32(rank + 1)


def bench_optimizer(num_workers: int) -> dict:
    """The NAG every system runs. wd = 0: MXNet's NAG kernel reads the already-updated weight for
    its weight-decay term, so only at wd = 0 does it agree with the formula (see the paper notes)."""
    return {"learning_rate": 0.05, "momentum": 0.9, "wd": 0.0, "rescale_grad": 1.0 / num_workers}


class _Clock:
    """The emulated GPU's timeline (see the module docstring)."""

    def __init__(self):
        self.deadline = time.perf_counter()

    def waited(self) -> None:
        self.deadline = max(self.deadline, time.perf_counter())

    def compute(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self.deadline += seconds
        remaining = self.deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)  # the emulated GPU computing, not a synchronization


class _Oracle:
    """Expected weights after each exchange, and the largest error seen."""

    def __init__(self, model: Model, num_workers: int, optimizer: dict):
        self.sizes = [a.elements for a in model.arrays]
        self.names = [a.name for a in model.arrays]
        self.total = np.float32(num_workers * (num_workers + 1) // 2)
        self.nag = NAG(**optimizer)
        self.kernels = get_backend("reference")
        self.weights = [initial_weights(size, k) for k, size in enumerate(self.sizes)]
        self.mom = [np.zeros(size, np.float32) for size in self.sizes]
        self.max_error = 0.0
        self.exchanges = 0  # how many exchanges the oracle's weights have seen

    def check(self, system: WorkerSystem, exchanges: int) -> None:
        """Compare every key's weights with the oracle after `exchanges` exchanges (0: initial),
        advancing the oracle over those since its last check."""
        steps, self.exchanges = exchanges - self.exchanges, exchanges
        for k, size in enumerate(self.sizes):
            if steps:
                acc = pattern(size, 17, 1 / 16, 3 * k) * self.total
                for _ in range(steps):
                    self.nag.apply(self.kernels, self.weights[k], self.mom[k], acc, None, None, 1)
            got = np.asarray(system.read_weights(k), dtype=np.float32).reshape(-1)
            want = self.weights[k]
            error = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
            self.max_error = max(self.max_error, error)
            if not error <= VERIFY_TOLERANCE:  # also catches NaN
                raise SystemExit(f"rank {system.rank}: after exchange {exchanges}, key {k} ({self.names[k]}): "
                                 f"weights differ from the oracle by {error:.3g} (relative; tolerance "
                                 f"{VERIFY_TOLERANCE:g})")


def run(system: WorkerSystem, model: Model, compute: str, iterations: int, warmup: int, verify: bool,
        optimize: bool = True, monitor_clock: Optional[str] = None) -> dict:
    """Set the system up, run the replayed iterations (see the module docstring), close; return
    this rank's result: {"rank", "seconds" (the `iterations` timed ones), "verified", "max_error",
    and for experiments.monitor "pid", "stamps" (the start of every timed iteration and the end of
    the last, raw monotonic clock) and "checks" (per timed iteration: wall and CPU seconds of the
    oracle check inside it)}.
    Raises SystemExit naming the first key whose weights miss the oracle. `optimize=False` (the
    breakdown experiment's no_optimizer variant) exchanges gradients with no optimizer at all.
    `monitor_clock`: the runner's Monitor clock file; before closing, the worker waits (bounded)
    for a sample past its last stamp, so the last window's figures have one."""
    sizes = [a.elements for a in model.arrays]
    forward, backward = compute_schedule(model, compute)
    optimizer = bench_optimizer(system.num_workers) if optimize else None
    initial = [initial_weights(size, k) if system.rank == 0 else np.zeros(size, np.float32)
               for k, size in enumerate(sizes)]
    system.setup(sizes, initial, optimizer)
    del initial
    grads = [gradient(size, k, system.rank) for k, size in enumerate(sizes)]
    oracle = _Oracle(model, system.num_workers, optimizer) if verify else None
    if oracle:
        oracle.check(system, 0)
    layers = model.layers
    marks: List[float] = []  # start of each iteration's forward, and of the final forward
    paused = 0.0  # seconds spent verifying, taken out of the timeline
    stamps: List[float] = []  # the same starts on the raw monotonic clock (for experiments.monitor)
    checks: List[List[float]] = []  # per iteration: wall and CPU seconds of its oracle check
    clock = _Clock()
    for iteration in range(warmup + iterations + 1):
        stamps.append(time.perf_counter())
        marks.append(stamps[-1] - paused)
        checks.append([0.0, 0.0])
        if oracle and 0 < iteration <= warmup:  # untimed: the warm-up exchanges, as they land
            for key in range(len(sizes)):
                system.wait(key)
            checking, cpu = time.perf_counter(), time.process_time()
            oracle.check(system, iteration)
            checks[-1] = [time.perf_counter() - checking, time.process_time() - cpu]
            paused += checks[-1][0]
        clock.waited()
        for layer, t in zip(layers, forward):
            for key in layer.keys:
                system.wait(key)
            clock.waited()
            clock.compute(t)
        for layer, t in zip(reversed(layers), reversed(backward)):
            clock.compute(t)
            for key in reversed(layer.keys):
                system.write_gradient(key, grads[key])
                if not system.consolidated:
                    system.push(key)
        if system.consolidated:
            system.exchange_all()
    stamps.append(time.perf_counter())
    marks.append(stamps[-1] - paused)
    wait_for_sample(monitor_clock, stamps[-1])
    for key in range(len(sizes)):  # the final forward: the last exchange's weights
        system.wait(key)
    if oracle:
        oracle.check(system, warmup + iterations + 1)
    system.close()
    seconds = [b - a for a, b in zip(marks, marks[1:])][warmup + 1:]
    timed = slice(warmup + 1, None)
    return {"rank": system.rank, "seconds": seconds, "verified": bool(verify),
            "max_error": oracle.max_error if oracle else None,
            "pid": os.getpid(), "stamps": stamps[timed], "checks": checks[timed]}
