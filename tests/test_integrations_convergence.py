"""The convergence check (experiments.convergence), as CI runs it: the full check, which
must finish in under 3 minutes, and a check that its tolerance catches a small real error."""
import csv

import pytest

pytest.importorskip("mxnet", reason="mxnet is not installed (pip install -e '.[test]')")
pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")

from experiments import convergence  # noqa: E402
from experiments.digits import FRAMEWORKS, curve  # noqa: E402

BUDGET_S = 180  # the whole check: 3 frameworks x (1 process, 2 and 4 PHub workers)


@pytest.mark.timeout(BUDGET_S)
def test_convergence_check_passes_within_three_minutes(tmp_path):
    result = convergence.run()
    assert result.passed, "\n".join(result.failures)
    assert result.seconds < BUDGET_S
    epochs = convergence.Settings().epochs
    assert len(result.rows) == len(FRAMEWORKS) * 3 * epochs
    for framework in FRAMEWORKS:
        for workers in (1, 2, 4):
            losses = [r["train_loss"] for r in result.rows if (r["framework"], r["workers"]) == (framework, workers)]
            assert losses[-1] < 0.2 * losses[0], f"{framework}, {workers} workers did not learn: {losses}"
    # The pipeline's products: the CSV and its plot.
    path = tmp_path / "convergence.csv"
    convergence.write_csv(result.rows, str(path))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.rows) and tuple(rows[0]) == convergence.COLUMNS
    convergence.plot(str(path), str(tmp_path / "convergence.png"))
    assert (tmp_path / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tolerance_catches_a_learning_rate_two_percent_off():
    settings = convergence.Settings(epochs=4)
    args = (settings.epochs, settings.global_batch)
    good = curve("torch-server", *args, settings.lr, settings.momentum)
    off = curve("torch-server", *args, settings.lr * 1.02, settings.momentum)
    assert max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(good, off)) > convergence.LOSS_TOLERANCE
