"""MXNet's gluon.Trainer through the phub kvstore, checked against MXNet's own `local` kvstore.

Two real worker processes (`phub launch -n 2`) train each scenario of workers/mxnet_worker.py for
STEPS steps; one process with MXNet's local kvstore trains the same net on the summed batch. The
weights must agree within 1e-5 (relative to the array's largest weight). NAG runs at wd=0: MXNet's
nag_mom_update deviates from the NAG formula when wd != 0 (see the paper notes); SGD is checked
with wd != 0, clipping, an lr schedule, a set_learning_rate and a per-parameter lr_mult. The
SUMMED scenarios run a dist_sync-style script (`create(reduce="sum")`, each worker's
`trainer.step(b)` on the sum of the workers' gradients); their reference steps by one worker's
batch on the summed batch, which is what MXNet's dist_sync computes.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mxnet", reason="mxnet is not installed (pip install -e '.[test]')")

import phub  # noqa: E402
from phub.client.api import ENV_RANK, ENV_SERVER, ENV_TIMEOUT, ENV_WORKERS  # noqa: E402
from workers.mxnet_worker import SCENARIOS, train  # noqa: E402

WORKER = str(Path(__file__).parent / "workers" / "mxnet_worker.py")
STEPS = 4


@pytest.fixture(scope="module")
def phub_weights(tmp_path_factory):
    """Every scenario trained by 2 PHub workers: [rank 0's arrays, rank 1's arrays]."""
    out = tmp_path_factory.mktemp("mxnet")
    env = dict(os.environ, PHUB_TEST=json.dumps({"out_dir": str(out), "steps": STEPS}),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "phub", "launch", "-n", "2", "--timeout", "120", "--",
                           sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"phub launch failed:\n{proc.stdout}\n{proc.stderr}"
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(2)]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_trainer_matches_local_kvstore_on_summed_batch(phub_weights, scenario):
    want = train(scenario, STEPS, mx.kv.create("local"), rank=0, workers=1, local_workers=2)
    start = train(scenario, 0, None, rank=0, workers=1, local_workers=2)
    for name, expected in want.items():
        got = [saved[f"{scenario}|{name}"] for saved in phub_weights]
        assert np.array_equal(got[0], got[1]), f"{scenario} {name}: the two workers disagree"
        err = np.max(np.abs(got[0] - expected)) / np.max(np.abs(expected))
        assert err <= 1e-5, f"{scenario} {name}: relative error {err:.3g} against MXNet's local kvstore"
        # The comparison means something only if training moved the weights well past 1e-5.
        assert np.max(np.abs(expected - start[name])) > 1e-2


@pytest.fixture
def one_worker(monkeypatch):
    """A one-worker job whose address is in the environment, as `phub launch` would set it."""
    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 1),), once=True, timeout=30)).start()
    for name, value in {ENV_SERVER: server.address, ENV_RANK: "0", ENV_WORKERS: "1", ENV_TIMEOUT: "30"}.items():
        monkeypatch.setenv(name, value)
    yield server
    server.stop()


def test_registered_by_name_and_raw_kvstore_api(one_worker, tmp_path):
    import pickle

    from phub.integrations.mxnet import SERVER_STATE, PHub, create  # importing it registers the name

    kv = mx.kv.create("phub")  # builds the class, connected from the environment

    assert isinstance(kv, PHub) and kv.type == "phub" and (kv.rank, kv.num_workers) == (0, 1)
    assert kv.is_capable("optimizer")
    with pytest.raises(ValueError, match="unknown capability"):
        kv.is_capable("sparse")
    w = mx.nd.array([[1.0, 2.0], [3.0, 4.0]])
    outs = [mx.nd.zeros((2, 2)), mx.nd.zeros((2, 2))]
    kv.broadcast("w", w, outs)  # str keys; one output per device
    kv.init([3, 4], [mx.nd.ones(5), mx.nd.ones(3)])  # int keys, several at once
    assert all(np.array_equal(o.asnumpy(), w.asnumpy()) for o in outs)
    with pytest.raises(phub.ConfigError, match="was not initialized"):
        kv.pushpull("nope", mx.nd.ones(2))

    # No optimizer: the mean gradient (one worker: the sum over devices) comes back.
    grads = [mx.nd.full((2, 2), 0.5), mx.nd.full((2, 2), 1.5, dtype="float64")]
    kv.pushpull("w", grads)
    assert all(np.array_equal(g.asnumpy(), np.full((2, 2), 2.0)) for g in grads)
    assert grads[1].dtype == np.float64  # written back in the output's own dtype

    # With MXNet's SGD the server updates: w - lr * rescale_grad * g.
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, rescale_grad=0.25))
    out = mx.nd.zeros((2, 2))
    kv.pushpull("w", mx.nd.full((2, 2), 4.0), out=out)
    np.testing.assert_array_equal(out.asnumpy(), w.asnumpy() - 0.5)
    kv.pushpull([3, 4], [mx.nd.ones(5), mx.nd.ones(3)], out=[mx.nd.zeros(5), mx.nd.zeros(3)])

    # Re-broadcast, as MXNet's stores allow: the new value replaces the old one everywhere, and
    # the server's optimizer state (momentum) starts afresh.
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    kv.pushpull(3, mx.nd.ones(5), out=mx.nd.zeros(5))  # builds momentum on key 3
    fresh = [mx.nd.zeros(5)]
    kv.broadcast(3, mx.nd.full(5, 10.0), fresh)
    np.testing.assert_array_equal(fresh[0].asnumpy(), np.full(5, 10.0))
    out = mx.nd.zeros(5)
    kv.pushpull(3, mx.nd.ones(5), out=out)
    np.testing.assert_array_equal(out.asnumpy(), np.full(5, 10.0 - 0.5))  # 9.05 with the old momentum

    # Checkpoint: the server's momentum (key 3: -0.5 after one step of SGD with momentum) to a
    # file, one more step (momentum -0.95), the file loaded back, and the next step uses -0.5 again.
    states = tmp_path / "states"
    kv.save_optimizer_states(str(states))
    with open(states, "rb") as f:
        saved = pickle.load(f)[SERVER_STATE]
    assert set(saved) == {"w", 3, 4}
    np.testing.assert_allclose(saved[3], np.full(5, -0.5), rtol=1e-6)
    kv.pushpull(3, mx.nd.ones(5), out=out)  # 9.5 - 0.95
    kv.load_optimizer_states(str(states))
    kv.pushpull(3, mx.nd.ones(5), out=out)  # 8.55 + (0.9 * -0.5 - 0.5); 7.195 without the load
    np.testing.assert_allclose(out.asnumpy(), np.full(5, 7.6), rtol=1e-6)
    with pytest.raises(phub.ConfigError, match="not initialized in this store"):
        other = create(client=kv.client, prefix="other/")
        other.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
        other.load_optimizer_states(str(states))
    kv.close()


def test_reduce_must_be_mean_or_sum():
    from phub.integrations.mxnet import create

    with pytest.raises(phub.ConfigError, match="reduce must be 'mean' or 'sum'"):
        create(reduce="max")  # refused before connecting


BY_NAME = """
import mxnet as mx
import phub.integrations.mxnet  # registers the name "phub"
net = mx.gluon.nn.Dense(2, in_units=3)
net.initialize()
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="phub")
with mx.autograd.record():
    loss = net(mx.nd.ones((1, 3))).sum()
loss.backward()
trainer.step(1)
"""


def test_kvstore_given_by_name_is_ignored_on_one_device():
    """The MXNet 1.9.1 behaviour the docs warn about: by name, one device, no kvstore at all."""
    names = {}
    exec(BY_NAME, names)  # its step would fail to connect (no server here) if the kvstore were used
    assert names["trainer"]._kvstore is None


def test_a_worker_that_gave_the_kvstore_by_name_and_never_connected_gets_the_likely_cause():
    import io

    from phub.launching.launch import run_job

    out = io.StringIO()
    env = dict(PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = run_job([sys.executable, "-c", BY_NAME], 1, phub.ServerConfig(timeout=60), extra_env=env, stdout=out,
                     stderr=out, time_limit=120)
    assert result.status == 1, out.getvalue()
    assert result.failed.startswith("rank(s) [0] exited (status 0) without ever connecting to the phub server; "
                                    "hint: ") and 'kvstore="phub" given by name' in result.failed, result.failed
    assert "kvstore=phub.integrations.mxnet.create()" in result.failed
