"""`--compute real`: the zoo network trained through each system, checked three ways.

* workers agree: every rank's network ends with rank 0's parameters (the run's own check);
* the loss per iteration matches a 2-worker training computed here, in one process, with the
  NAG update written out in numpy: so the systems exchanged the right gradients, in the right
  keys, and their weights were written back into the network;
* the loss falls on the fixed synthetic batch.
"""
import subprocess
import sys

import numpy as np
import pytest

from experiments import realcompute
from experiments.realcompute import Trainee
from experiments.replay import bench_optimizer
from experiments.runner import Options, run_exchange
from phub.errors import ConfigError

SIZE, BATCH, WORKERS, WARMUP, ITERATIONS = 32, 4, 2, 1, 3
FORWARDS = WARMUP + ITERATIONS + 2  # the loop's iterations, plus the final forward
OPTIONS = Options(compute="real", image_size=SIZE, batch=BATCH, time_limit=120)


@pytest.fixture(scope="module")
def zoo_parameters():
    """resnet18_v2's trainable parameter count, from the zoo directly."""
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    net = vision.get_model("resnet18_v2", pretrained=False, classes=1000)
    net.initialize()
    net(mx.nd.zeros((1, 3, SIZE, SIZE))).wait_to_read()
    return sum(p.data().size for p in net.collect_params().values() if p.grad_req != "null")


@pytest.fixture(scope="module")
def reference_losses():
    """The mean loss of both ranks at each forward of synchronous 2-worker training, in one
    process: rank 0's initial weights, each rank's own batch, the summed gradient, then MXNet's
    NAG formulation (the one every system runs) in float64."""
    ranks = [Trainee("resnet18", SIZE, BATCH, rank) for rank in range(WORKERS)]
    opt = bench_optimizer(WORKERS)
    weights = [w.astype(np.float64) for w in ranks[0].weights()]
    mom = [np.zeros_like(w) for w in weights]
    losses = []
    for step in range(FORWARDS):
        for trainee in ranks:
            for param, w in zip(trainee.params, weights):
                param.data()[:] = w.astype(np.float32)
        step_losses = [trainee.forward() for trainee in ranks]
        losses.append(float(np.mean([loss.asscalar() for loss in step_losses])))
        for k in range(len(weights)):
            g = opt["rescale_grad"] * sum(t.params[k].grad().asnumpy().astype(np.float64) for t in ranks)
            g += opt["wd"] * weights[k]
            mom[k] = opt["momentum"] * mom[k] + g
            weights[k] = weights[k] - opt["learning_rate"] * (g + opt["momentum"] * mom[k])
    return losses


@pytest.mark.parametrize("system", ["phub", "gloo-ring", "pslite-central"])
def test_resnet18_trains_through_system(system, zoo_parameters, reference_losses):
    row = run_exchange(system, "resnet18", WORKERS, ITERATIONS, WARMUP, verify=True, options=OPTIONS, quiet=True)
    assert row["verified"] is True and row["verify_kind"] == "workers_agree"
    assert 0 <= row["verify_max_error"] <= realcompute.AGREE_TOLERANCE
    assert row["bytes_per_worker"] == 4 * zoo_parameters
    assert (row["zoo_model"], row["image_size"], row["batch_per_gpu"]) == ("resnet18_v2", SIZE, BATCH)
    assert row["compute"] == "real" and row["compute_provenance"] == "measured"
    assert row["compute_seconds_per_iteration"] > 0
    assert len(row["seconds_per_iteration_all"]) == ITERATIONS
    assert row["samples_per_s"] == pytest.approx(WORKERS * BATCH / row["seconds_per_iteration"])
    losses = row["loss_per_iteration"]
    assert len(losses) == FORWARDS and all(np.isfinite(losses))
    assert all(b < a for a, b in zip(losses, losses[1:])), f"the loss did not fall at every step: {losses}"
    # The loss before and after the first update must match the reference closely: a gradient
    # under the wrong key, a missed write-back or a wrong rescale changes it at once. From the
    # second update on, float32 rounding (each system sums and updates in its own order) can flip
    # a ReLU: at this size stage 4's feature maps are 1x1 and its BatchNorm normalizes over 4
    # values, so some pre-activations sit within 1e-5 of zero. Measured: phub's weights after the
    # first update are as close to the float64 ones as gloo's (0.27 ulp on average for both), yet
    # one stage-4 pre-activation of rank 0 is -1.1e-7 with phub's and +5.7e-6 with gloo's; that
    # single flip moves rank 0's second gradient by up to 22% in one key and the third loss by
    # 0.45%; momentum carries the difference on, to 0.12 against 0.07 at the last loss. So the
    # later losses are held to the reference within 3% of the initial loss (0.2): without momentum
    # the third loss would be 4.1, with the second update skipped 5.5, against the reference's
    # 3.05. The server's NAG over many rounds is checked exactly, against closed forms, in the
    # exchange tests.
    np.testing.assert_allclose(losses[:2], reference_losses[:2], rtol=1e-4)
    np.testing.assert_allclose(losses, reference_losses, rtol=0, atol=0.03 * reference_losses[0])


def test_workers_disagreeing_fail_verification(tmp_path):
    same = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)]
    np.savez(tmp_path / "real_weights_rank0.npz", *same)
    np.savez(tmp_path / "real_weights_rank1.npz", *same)
    assert realcompute.disagreement(str(tmp_path), 2) == 0.0
    off = [same[0], same[1] * np.float32(1 + 1e-5)]
    np.savez(tmp_path / "real_weights_rank1.npz", *off)
    assert realcompute.disagreement(str(tmp_path), 2) == pytest.approx(1e-5, rel=0.01)
    ranks = [{"bytes": 40, "zoo_model": "m", "image_size": 32, "batch": 4, "device": "cpu(0)",
              "compute_seconds": 0.1, "losses": [2.0, 1.0]}] * 2
    fields = realcompute.row_fields(ranks, str(tmp_path), verify=True)
    assert fields["verified"] is False and fields["verify_max_error"] > realcompute.AGREE_TOLERANCE


@pytest.mark.parametrize("model, options, message", [
    ("googlenet", OPTIONS, "model googlenet is not in MXNet's gluon model zoo"),
    ("resnet269", OPTIONS, "model resnet269 is not in MXNet's gluon model zoo"),
    ("resnext269", OPTIONS, "the zoo has no ResNeXt"),
    ("synthetic:1", OPTIONS, "synthetic:1 has no network to train"),
    ("resnet18", Options(compute="real", image_size=16), "needs images of at least 32x32"),
    ("alexnet", Options(compute="real", image_size=32), "needs images of at least 63x63"),
    ("inception-v3", Options(compute="real", image_size=224), "needs images of at least 299x299"),
    ("resnet18", Options(compute="real", variant="no_optimizer"), "use --variant full"),
    ("resnet18", Options(compute="real", network="emulated"), "emulated rack cannot scale"),
    ("resnet18", Options(compute="replay", image_size=64), "use them with --compute real"),
])
def test_unsupported_real_compute_is_refused(model, options, message):
    with pytest.raises(ConfigError, match=message):
        run_exchange("phub", model, 2, 1, options=options)


def test_cli_refuses_model_without_zoo_network():
    result = subprocess.run([sys.executable, "-m", "experiments", "bench", "exchange", "--compute", "real",
                             "--model", "googlenet"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "googlenet is not in MXNet's gluon model zoo" in result.stderr
