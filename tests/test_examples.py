"""The training examples of the README and docs/integrations.md, run as written under `phub
launch`: a run resumed from its checkpoint prints the same last epoch as one that ran through."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _last_epoch(example, *args):
    argv = [sys.executable, "-m", "phub", "launch", "-n", "2", "--timeout", "120", "--", "python",
            str(ROOT / "examples" / example), *args]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if "epoch" in line]
    return lines[-1], run.stdout


@pytest.mark.parametrize("example, args, checkpoint", [
    ("mxnet_train.py", [], "ckpt"),
    ("torch_train.py", ["--mode", "server"], "ckpt.pt"),
], ids=["mxnet", "torch-server"])
def test_a_resumed_example_ends_like_one_that_ran_through(tmp_path, example, args, checkpoint):
    through, _ = _last_epoch(example, *args, "--epochs", "2")
    path = str(tmp_path / checkpoint)
    first, _ = _last_epoch(example, *args, "--epochs", "1", "--checkpoint", path)
    resumed, out = _last_epoch(example, *args, "--epochs", "2", "--checkpoint", path)
    assert "resumed after epoch 1" in out and "epoch 1:" in first
    assert resumed == through and "epoch 2:" in resumed
