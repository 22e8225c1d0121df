#!/usr/bin/env python3
"""A PyTorch training loop through phub against DDP's own Gloo allreduce, 2 workers on loopback.

    python benchmarks/ddp_loop.py [--shapes mlp,resnet] [--workers 2] [--blocks 5] [--steps 4]
        [--warmup 2] [--threads 1] [--cores 1] [--chunk-bytes 32768]
        [--timeout 900] [--out FILE]

One `phub launch` process tree (a phub server and the workers, which also form a Gloo group)
runs, per model shape, these systems alternately in blocks of `--steps` steps, the order of the
systems rotating from block to block, so that the drifts of a shared machine hit all alike:

    gloo       DDP with its default allreduce (Gloo), SGD with momentum on every worker
    hook       the same DDP model with phub's communication hook (the server averages buckets)
    server     no DDP: `ServerOptimizer` (SGD with momentum on the server)
    compute    the same loop without any communication (what all three would cost alone)
    xchg_gloo  the allreduces of DDP's bucket layout, no compute (the layout the hook saw)
    xchg_phub  phub's pushpulls of the same buckets, no compute
    xchg_param phub's pushpulls of one key per parameter (ServerOptimizer's layout), no compute

Shapes: `mlp` is communication-heavy (16.8M parameters, 67 MB of float32 gradients in DDP's
three buckets of 17, 34 and 17 MB, batch 16); `resnet` has many small layers (a CIFAR-style
ResNet-14 with batch norm, 0.18M parameters in 47 tensors, one bucket, batch 16).

A system's figure is the median over blocks of its block's seconds per step on rank 0 (every
block starts at a barrier). The ratios to Gloo DDP are paired: the median over blocks of gloo's
time over the system's in the same block (`ratio_of_medians`: the ratio of the medians).
`overhead_share` is each system's loop time minus compute minus its raw exchange, as a share of
its loop time: negative where communication overlaps with compute, as DDP's overlaps with
backward. `cpu_seconds_per_step` is a worker's CPU time (all its threads), which the load of
other processes on a shared machine changes much less than the wall time.

The last line of stdout is one JSON object: {"shapes": {shape: {"steps_per_s": {system: s},
"ratio_over_gloo": {"hook": r, "server": r}, "ratio_of_medians": {...}, "overhead_share": {...},
"cpu_seconds_per_step": {...}, "seconds_per_step": {...}, "buckets": [...]}}, settings}.
`--out FILE` also writes it there (atomically) with every block's time. Bounded: the launch is
killed after `--timeout` seconds (then the exit status is non-zero).
"""
import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYSTEMS = ("gloo", "hook", "server", "compute", "xchg_gloo", "xchg_phub", "xchg_param")
SHAPES = ("mlp", "resnet")
LR, MOMENTUM, BATCH = 0.01, 0.9, 16
ENV = "PHUB_DDP_LOOP"


# -- the worker side (runs under `phub launch`) -------------------------------------------------
def make_model(shape: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if shape == "mlp":
        return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 2048), nn.ReLU(),
                             nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))

    layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    for cin, cout, stride in ((16, 16, 1), (16, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)):
        layers.append(Block(cin, cout, stride))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def make_batch(shape: str, rank: int):
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn((BATCH, 1024) if shape == "mlp" else (BATCH, 3, 32, 32), generator=generator)
    return x, torch.randint(0, 10, (BATCH,), generator=generator)


def bucket_layout(state) -> list:
    """The element counts of DDP's buckets as the hook last registered them (after the rebuild)."""
    layout = []
    for index, numel in state.keys:  # registration order: the rebuilt layout comes last
        if index == 0:
            layout = []
        layout.append(numel)
    return layout


def run_worker() -> int:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import phub
    from phub.reduction import optim
    from phub.integrations import torch as phub_torch
    from phub.integrations._common import ensure_optimizer

    settings = json.loads(os.environ[ENV])
    torch.set_num_threads(settings["threads"])
    client = phub.connect()
    rank = client.rank
    phub_torch.init_process_group(client)
    times = {}
    for shape in settings["shapes"]:
        x, y = make_batch(shape, rank)
        loops = {}
        for name in ("gloo", "hook", "server", "compute"):
            net = make_model(shape)
            if name in ("gloo", "hook"):
                net = DDP(net)
                hook_state = phub_torch.register_hook(net, client, prefix=f"{shape}.ddp") if name == "hook" else None
            if name == "server":
                opt = phub_torch.ServerOptimizer(net.parameters(), lr=LR, momentum=MOMENTUM, client=client,
                                                 prefix=f"{shape}.param")
            else:
                opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)

            def step(net=net, opt=opt):
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()
            loops[name] = step
        for _ in range(settings["warmup"]):  # DDP rebuilds its buckets after the first step
            for name in ("gloo", "hook", "server", "compute"):
                loops[name]()
        buckets = [torch.zeros(n) for n in bucket_layout(hook_state)]
        hosts = [b.numpy() for b in buckets]
        keys = [f"{shape}.xchg.bucket{i}" for i in range(len(buckets))]
        client.init(keys, [h.copy() for h in hosts])
        params = [np.zeros(p.numel(), np.float32) for p in make_model(shape).parameters()]
        param_keys = [f"{shape}.xchg.param{i}" for i in range(len(params))]
        client.init(param_keys, [p.copy() for p in params])
        server_optimizer = optim.SGD(learning_rate=LR, momentum=MOMENTUM, rescale_grad=1.0 / client.num_workers)

        def xchg_gloo():
            for work in [dist.all_reduce(b, async_op=True) for b in buckets]:
                work.wait()

        def xchg_phub():
            ensure_optimizer(client, optim.Aggregate(average=True))
            for handle in [client.pushpull_async(k, h) for k, h in zip(keys, hosts)]:
                handle.wait()

        def xchg_param():
            ensure_optimizer(client, server_optimizer)
            for handle in [client.pushpull_async(k, p) for k, p in zip(reversed(param_keys), reversed(params))]:
                handle.wait()
        loops.update(xchg_gloo=xchg_gloo, xchg_phub=xchg_phub, xchg_param=xchg_param)
        for name in ("xchg_gloo", "xchg_phub", "xchg_param"):
            loops[name]()
        times[shape] = {name: [] for name in SYSTEMS}
        cpu = times[shape]["cpu"] = {name: [] for name in SYSTEMS}  # this worker's threads, all of them
        times[shape]["buckets"] = bucket_layout(hook_state)
        for block in range(settings["blocks"]):
            order = SYSTEMS[block % len(SYSTEMS):] + SYSTEMS[:block % len(SYSTEMS)]
            for name in order:
                dist.barrier()
                started, cpu_started = time.perf_counter(), time.process_time()
                for _ in range(settings["steps"]):
                    loops[name]()
                times[shape][name].append((time.perf_counter() - started) / settings["steps"])
                cpu[name].append((time.process_time() - cpu_started) / settings["steps"])
        hook_state.close()
    client.close()
    dist.destroy_process_group()
    if rank == 0:
        from experiments.fileio import write_json
        write_json(Path(settings["out_dir"]) / "rank0.json", times)
    return 0


# -- the driver ----------------------------------------------------------------------------------
def summarize(times: dict) -> dict:
    shapes = {}
    for shape, per_system in times.items():
        seconds = {s: statistics.median(per_system[s]) for s in SYSTEMS}
        exchange = {"gloo": seconds["xchg_gloo"], "hook": seconds["xchg_phub"], "server": seconds["xchg_param"]}
        # Paired: each block's gloo time over the system's in the same block (they ran back to back).
        paired = {s: statistics.median(g / t for g, t in zip(per_system["gloo"], per_system[s]))
                  for s in ("hook", "server")}
        shapes[shape] = {
            "steps_per_s": {s: round(1.0 / seconds[s], 3) for s in SYSTEMS},
            "ratio_over_gloo": {s: round(v, 3) for s, v in paired.items()},
            "ratio_of_medians": {s: round(seconds["gloo"] / seconds[s], 3) for s in ("hook", "server")},
            "cpu_seconds_per_step": {s: round(statistics.median(per_system["cpu"][s]), 5) for s in SYSTEMS},
            "overhead_share": {s: round((seconds[s] - seconds["compute"] - exchange[s]) / seconds[s], 3)
                               for s in exchange},
            "seconds_per_step": {s: round(v, 5) for s, v in seconds.items()},
            "buckets": per_system["buckets"]}
    return shapes


def stop_group(proc: subprocess.Popen) -> None:
    """Stop `proc`'s process group: SIGTERM, up to 10 s for it to end, then SIGKILL to what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10.0)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per system and shape")
    parser.add_argument("--steps", type=int, default=4, help="steps per block")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per system (at least 2: DDP "
                        "rebuilds its buckets after the first)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--cores", type=int, default=1, help="phub server processes (phub launch --cores)")
    parser.add_argument("--chunk-bytes", type=int, default=32768, help="phub's chunk size (phub launch --chunk-bytes; "
                        "the paper's 32 KB by default)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the run is killed")
    parser.add_argument("--out", help="also write the summary and every block's time to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return run_worker()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        parser.error(f"--shapes: unknown {unknown or 'none given'}; choose from {', '.join(SHAPES)}")
    if args.blocks < 1 or args.steps < 1 or args.warmup < 2 or args.workers < 2 or args.threads < 1:
        parser.error("--blocks, --steps and --threads must be >= 1, --warmup and --workers >= 2")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ddp_loop.") as out_dir:
        settings = dict(shapes=shapes, blocks=args.blocks, steps=args.steps, warmup=args.warmup,
                        threads=args.threads, out_dir=out_dir)
        env = dict(os.environ, **{ENV: json.dumps(settings)}, OMP_NUM_THREADS=str(args.threads))
        env.pop("MASTER_ADDR", None)
        command = [sys.executable, "-m", "phub", "launch", "-n", str(args.workers), "--cores", str(args.cores),
                   "--chunk-bytes", str(args.chunk_bytes), "--timeout", str(args.timeout),
                   "--", sys.executable, os.path.abspath(__file__), "--worker"]
        proc = subprocess.Popen(command, env=env, start_new_session=True)  # its own group: stopped whole
        try:
            returncode = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            print(f"ddp_loop: the run took over {args.timeout:g} s (--timeout) and was stopped", file=sys.stderr)
            return 1
        if returncode != 0:
            print(f"ddp_loop: phub launch exited {returncode}", file=sys.stderr)
            return 1
        times = json.loads((Path(out_dir) / "rank0.json").read_text())
    summary = {"benchmark": "ddp_loop", "workers": args.workers, "cores": args.cores, "chunk_bytes": args.chunk_bytes,
               "blocks": args.blocks,
               "steps": args.steps, "threads": args.threads, "batch": BATCH, "shapes": summarize(times)}
    for shape, row in summary["shapes"].items():
        print(f"\n{shape}: median of {args.blocks} blocks x {args.steps} steps, {args.workers} workers")
        print(f"{'system':12s} {'s/step':>9s} {'steps/s':>9s} {'cpu s/step':>10s} {'/gloo':>7s} {'overhead':>9s}")
        for s in SYSTEMS:
            ratio = row["ratio_over_gloo"].get(s, "")
            overhead = row["overhead_share"].get(s, "")
            print(f"{s:12s} {row['seconds_per_step'][s]:9.4f} {row['steps_per_s'][s]:9.2f}"
                  f" {row['cpu_seconds_per_step'][s]:10.4f} {ratio!s:>7s}"
                  f" {overhead!s:>9s}")
    summary.update(wall_seconds=round(time.perf_counter() - started, 1), host=platform.node(), cpus=os.cpu_count())
    if args.out:
        from experiments.fileio import write_json
        write_json(args.out, {"summary": summary, "blocks": times}, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
