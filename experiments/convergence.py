"""The convergence check: training through PHub follows single-process training, epoch by epoch.

For each framework (MXNet's gluon with the phub kvstore; PyTorch with DDP + the phub hook; PyTorch
with `ServerOptimizer`) the digits MLP (see `experiments.digits`) is trained once in one
process without PHub, and then by 2 and 4 PHub workers (real processes on loopback) with the same
global batch. The check passes when every epoch's training loss of every PHub run is within
`LOSS_TOLERANCE` (absolute) of the single-process loss at that epoch, and test accuracy within
`ACCURACY_TOLERANCE`. Both are wide against float32 rounding (the measured loss differences are
below 1e-7) and narrow against real errors: a learning rate 2% off already moves the loss by more
than the tolerance (the tests check that), a wrong scale or a lost gradient by far more.

    python -m experiments.convergence --out convergence.csv --plot convergence.png

writes one CSV row per (framework, workers, epoch) (workers 1 = the single-process reference)
and exits 1 if the check failed. `run()` and `plot()` are what a pipeline calls. `run()` starts
the PHub jobs with `phub.launching.launch.run_job`, so call it from the main thread.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from . import fileio
from .digits import FRAMEWORKS, curve

LOSS_TOLERANCE = 1e-4  # absolute, per epoch, on the mean training cross-entropy
ACCURACY_TOLERANCE = 1 / 360  # one test sample (the test split has 360)
COLUMNS = ("framework", "workers", "global_batch", "epoch", "train_loss", "test_accuracy",
           "loss_diff", "accuracy_diff", "run_seconds")


@dataclass(frozen=True)
class Settings:
    epochs: int = 10
    global_batch: int = 64
    lr: float = 0.05
    momentum: float = 0.9


@dataclass
class Result:
    rows: List[Dict[str, object]]
    seconds: float
    failures: List[str]

    @property
    def passed(self) -> bool:
        return not self.failures


def _phub_curve(framework: str, workers: int, settings: Settings) -> List[Dict[str, float]]:
    """Run `workers` PHub workers training `framework`; return rank 0's per-epoch rows."""
    from phub.launching.launch import run_job

    with tempfile.TemporaryDirectory(prefix="phub-convergence-") as tmp:
        out = os.path.join(tmp, "curve.jsonl")
        command = [sys.executable, "-m", "experiments.digits", "--framework", framework,
                   "--epochs", str(settings.epochs), "--global-batch", str(settings.global_batch),
                   "--lr", str(settings.lr), "--momentum", str(settings.momentum), "--out", out]
        # One thread per worker: the workers share the machine's cores.
        log = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        result = run_job(command, workers, extra_env={"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"},
                         stdout=log, stderr=log)
        if result.status != 0:
            log.flush()
            tail = log.buffer.getvalue().decode("utf-8", "replace")[-4000:]
            raise RuntimeError(f"{framework} with {workers} PHub workers failed ({result.failed}):\n{tail}")
        with open(out) as f:
            return [json.loads(line) for line in f]


def run(frameworks: Sequence[str] = FRAMEWORKS, workers: Sequence[int] = (2, 4),
        settings: Settings = Settings()) -> Result:
    """Train every framework single-process and with each worker count; compare the curves.

    Blocks until all runs finished (about 90 s on two cores). Raises ValueError for an
    unknown framework, RuntimeError (with the workers' output) if a PHub job fails.
    """
    unknown = set(frameworks) - set(FRAMEWORKS)
    if unknown:
        raise ValueError(f"unknown framework(s) {sorted(unknown)}; known: {', '.join(FRAMEWORKS)}")
    started = time.monotonic()
    rows: List[Dict[str, object]] = []
    failures: List[str] = []
    for framework in frameworks:
        t0 = time.monotonic()
        reference = curve(framework, settings.epochs, settings.global_batch, settings.lr, settings.momentum)
        runs = {1: (reference, time.monotonic() - t0)}
        for n in workers:
            t0 = time.monotonic()
            runs[n] = (_phub_curve(framework, n, settings), time.monotonic() - t0)
        for n, (points, seconds) in runs.items():
            if len(points) != settings.epochs:
                failures.append(f"{framework}, {n} workers: {len(points)} epochs reported, expected {settings.epochs}")
                continue
            for point, ref in zip(points, reference):
                loss_diff = point["train_loss"] - ref["train_loss"]
                acc_diff = point["test_accuracy"] - ref["test_accuracy"]
                rows.append({"framework": framework, "workers": n, "global_batch": settings.global_batch,
                             "epoch": point["epoch"], "train_loss": point["train_loss"],
                             "test_accuracy": point["test_accuracy"], "loss_diff": loss_diff,
                             "accuracy_diff": acc_diff, "run_seconds": round(seconds, 3)})
                if abs(loss_diff) > LOSS_TOLERANCE or abs(acc_diff) > ACCURACY_TOLERANCE + 1e-12:
                    failures.append(f"{framework}, {n} workers, epoch {point['epoch']}: loss "
                                    f"{point['train_loss']:.6f} vs {ref['train_loss']:.6f}, accuracy "
                                    f"{point['test_accuracy']:.4f} vs {ref['test_accuracy']:.4f}")
    return Result(rows, time.monotonic() - started, failures)


def write_csv(rows: Sequence[Dict[str, object]], path: str) -> None:
    """Write `rows` as CSV (COLUMNS), atomically: a temporary file renamed into place."""
    fileio.write_csv(path, rows, COLUMNS)


def plot(csv_path: str, out_path: str) -> None:
    """Plot training loss per epoch (one panel per framework, one line per worker count) from a
    CSV written by `write_csv`. Raises RuntimeError if matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: install the harness: pip install -e ./lab") from None
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    frameworks = list(dict.fromkeys(r["framework"] for r in rows))
    fig, axes = plt.subplots(1, len(frameworks), figsize=(4 * len(frameworks), 3.2), squeeze=False, sharey=True)
    for ax, framework in zip(axes[0], frameworks):
        mine = [r for r in rows if r["framework"] == framework]
        for n in sorted({int(r["workers"]) for r in mine}):
            points = sorted((int(r["epoch"]), float(r["train_loss"])) for r in mine if int(r["workers"]) == n)
            label = "1 process, no PHub" if n == 1 else f"{n} workers, PHub"
            style = {"linewidth": 3, "alpha": 0.4} if n == 1 else {"marker": "o", "markersize": 3, "linestyle": "--"}
            ax.plot([e for e, _ in points], [v for _, v in points], label=label, **style)
        ax.set_title(framework)
        ax.set_xlabel("epoch")
        ax.set_yscale("log")
    axes[0][0].set_ylabel("training loss (digits MLP)")
    axes[0][-1].legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="PHub convergence check on scikit-learn's digits.")
    parser.add_argument("--out", required=True, help="CSV file to write")
    parser.add_argument("--plot", help="also draw the curves into this image (needs matplotlib)")
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--epochs", type=int, default=Settings.epochs)
    args = parser.parse_args(argv)
    result = run(args.frameworks, args.workers, Settings(epochs=args.epochs))
    write_csv(result.rows, args.out)
    if args.plot:
        plot(args.out, args.plot)
    for failure in result.failures:
        print(f"FAIL {failure}", file=sys.stderr)
    worst = max((abs(r["loss_diff"]) for r in result.rows), default=0.0)
    print(json.dumps({"convergence": "ok" if result.passed else "failed", "seconds": round(result.seconds, 1),
                      "max_loss_diff": worst, "loss_tolerance": LOSS_TOLERANCE, "rows": len(result.rows)}))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
