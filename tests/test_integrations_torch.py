"""PyTorch through PHub: the DDP hook against DDP's own gloo allreduce, and ServerOptimizer
against torch's SGD in one process on the summed batch.

Two real worker processes (`phub launch -n 2`, gloo on loopback for DDP's setup) run every
scenario of workers/torch_worker.py for STEPS steps.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")

from workers.torch_worker import SERVER, train_single  # noqa: E402

WORKER = str(Path(__file__).parent / "workers" / "torch_worker.py")
STEPS = 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """What both workers saved: [rank 0's arrays, rank 1's arrays]."""
    out = tmp_path_factory.mktemp("torch")
    env = dict(os.environ, PHUB_TEST=json.dumps({"out_dir": str(out), "steps": STEPS}), OMP_NUM_THREADS="1")
    env.pop("MASTER_ADDR", None)  # exercise the store whose port travels through PHub
    proc = subprocess.run([sys.executable, "-m", "phub", "launch", "-n", "2", "--timeout", "120", "--",
                           sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"phub launch failed:\n{proc.stdout}\n{proc.stderr}"
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(2)]


def relative_error(got, want):
    return np.max(np.abs(got - want)) / np.max(np.abs(want))


def test_ddp_hook_matches_ddp_with_gloo(saved):
    start = train_single("gloo", 0, 2)
    for name in start:
        hook = [s[f"hook|{name}"] for s in saved]
        gloo = [s[f"gloo|{name}"] for s in saved]
        assert np.array_equal(hook[0], hook[1]) and np.array_equal(gloo[0], gloo[1]), name
        assert relative_error(hook[0], gloo[0]) <= 1e-6, f"{name}: phub hook vs gloo"
        assert np.max(np.abs(gloo[0] - start[name])) > 1e-2  # training moved the weights


def test_ddp_hook_follows_the_bucket_rebuild(saved):
    # DDP starts with one bucket and, after the first iteration, rebuilds it into two in the
    # order gradients became ready (out layer: 64 + 4 values, hidden: 128 + 16): the hook
    # registered a key for each layout it saw.
    layouts = [tuple(row) for row in saved[0]["hook_layouts"]]
    assert sorted(layouts) == [(0, 68), (0, 212), (1, 144)]
    assert layouts == [tuple(row) for row in saved[1]["hook_layouts"]]


@pytest.mark.parametrize("scenario", list(SERVER))
def test_server_optimizer_matches_torch_sgd_on_summed_batch(saved, scenario):
    want = train_single(scenario, STEPS, 2)
    start = train_single(scenario, 0, 2)
    for name, expected in want.items():
        got = [s[f"{scenario}|{name}"] for s in saved]
        assert np.array_equal(got[0], got[1]), f"{scenario} {name}: the two workers disagree"
        assert relative_error(got[0], expected) <= 1e-5, f"{scenario} {name}"
        assert np.max(np.abs(expected - start[name])) > 1e-2


def test_server_optimizer_rejects_bad_arguments():
    from phub.errors import ConfigError
    from phub.integrations.torch import ServerOptimizer

    with pytest.raises(ConfigError, match="must be >= 0"):
        ServerOptimizer([torch.nn.Parameter(torch.zeros(2))], lr=-1.0, client=object())


def test_server_optimizer_state_round_trips_through_the_server():
    """state_dict holds the server's momentum; load_state_dict puts a saved one back, and the
    next step uses it (SGD with momentum 0.9, lr 0.5, one worker, gradient 1)."""
    import phub
    from phub.integrations.torch import MOMENTUM, ServerOptimizer

    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 1),), once=True, timeout=30)).start()
    try:
        client = phub.connect(server.address, rank=0, num_workers=1, timeout=30)
        param = torch.nn.Parameter(torch.zeros(3))
        opt = ServerOptimizer([param], lr=0.5, momentum=0.9, client=client)
        param.grad = torch.ones(3)
        opt.step()  # momentum -0.5, weights -0.5
        saved = opt.state_dict()
        np.testing.assert_allclose(saved["state"][0][MOMENTUM].numpy(), np.full(3, -0.5), rtol=1e-6)
        opt.step()  # momentum -0.95, weights -1.45
        opt.load_state_dict(saved)
        opt.step()  # momentum 0.9 * -0.5 - 0.5 again: weights -2.4 (-2.805 without the load)
        np.testing.assert_allclose(param.detach().numpy(), np.full(3, -2.4), rtol=1e-6)
        client.close()
        assert server.wait(timeout=30) == 0
    finally:
        server.stop()


# -- other dtypes, and pushing during backward (one worker, an in-process server) ----------------
HALF = [torch.float16, torch.bfloat16]
GRAD = [1.0, 2.0, 0.5, 3.0]  # d/dw of sum(w * GRAD): every value and its multiples below are exact in half


@pytest.fixture
def one_worker():
    import phub

    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 1),), once=True, timeout=30)).start()
    try:
        client = phub.connect(server.address, rank=0, num_workers=1, timeout=30)
        yield client
        client.close()
        assert server.wait(timeout=30) == 0
    finally:
        server.stop()


def backward_of_weighted_sum(param):
    (param * torch.tensor(GRAD, dtype=param.dtype)).sum().backward()


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("dtype", HALF)
def test_server_optimizer_keeps_half_precision_parameters(one_worker, dtype, overlap):
    """SGD with momentum 0.9, lr 0.5, gradient GRAD: the server's float32 weights after k steps are
    -GRAD * (0.5, 1.45, 2.805)[k-1]; the half-precision parameter holds them rounded to its dtype,
    and its float32 buffer is the same one every step (no per-step copy allocated)."""
    from phub.integrations.torch import ServerOptimizer

    param = torch.nn.Parameter(torch.zeros(4, dtype=dtype))
    opt = ServerOptimizer([param], lr=0.5, momentum=0.9, client=one_worker, prefix=f"{dtype}.{overlap}.",
                          overlap=overlap)
    buffers = set()
    for step, total in enumerate((0.5, 1.45, 2.805), 1):
        opt.zero_grad()
        backward_of_weighted_sum(param)
        opt.step()
        buffers.add(opt._keys[0].buffer.data_ptr())
        want = (-total * torch.tensor(GRAD, dtype=torch.float32)).to(dtype)
        assert param.dtype == dtype
        assert torch.equal(param.detach(), want), f"step {step}: {param} != {want}"
    assert len(buffers) == 1


def test_server_optimizer_refuses_a_second_backward_before_step(one_worker):
    from phub.errors import PHubError
    from phub.integrations.torch import ServerOptimizer

    param = torch.nn.Parameter(torch.zeros(4))
    opt = ServerOptimizer([param], lr=0.5, client=one_worker)
    backward_of_weighted_sum(param)
    with pytest.raises(PHubError, match="overlap=False"):
        backward_of_weighted_sum(param)
    # refused before it was added into the gradient in flight
    np.testing.assert_array_equal(param.grad.numpy(), np.array(GRAD, np.float32))
    opt.step()  # the first gradient's round completes: -0.5 * GRAD
    np.testing.assert_array_equal(param.detach().numpy(), -0.5 * np.array(GRAD, np.float32))


def test_server_optimizer_pushes_during_backward_and_shares_keys(one_worker):
    """With overlap, backward hands each gradient over as it is produced: when backward returns,
    every key's push is already in flight, before step() is called. A large parameter has its
    own key; small ones (float32 and float16 alike) share one. SGD, lr 0.5, momentum 0.9 on
    gradients g: weights -0.5 g, then -1.45 g; the server's momentum -0.95 g, per parameter."""
    from phub.integrations.torch import MOMENTUM, SMALL_PARAMETER, ServerOptimizer

    large = torch.nn.Parameter(torch.zeros(SMALL_PARAMETER))
    small = torch.nn.Parameter(torch.zeros(3))
    half = torch.nn.Parameter(torch.zeros(5, dtype=torch.float16))
    scale = {large: 1.0, small: 2.0, half: 0.5}
    opt = ServerOptimizer([large, small, half], lr=0.5, momentum=0.9, client=one_worker, prefix="shared.")
    assert [len(key.params) for key in opt._keys] == [1, 2]  # the large one alone, the small ones together
    for total in (0.5, 1.45):
        opt.zero_grad()
        sum((p * s).sum() for p, s in scale.items()).backward()
        assert set(opt._inflight) == set(opt._keys)
        opt.step()
        assert not opt._inflight
        for p, s in scale.items():
            assert torch.equal(p.detach(), torch.full_like(p, -total * s)), (p.shape, total)
    state = opt.state_dict()["state"]
    for i, s in enumerate(scale.values()):
        np.testing.assert_allclose(state[i][MOMENTUM].numpy(), -0.95 * s, rtol=1e-6)


@pytest.mark.parametrize("dtype", HALF)
def test_ddp_hook_carries_half_precision_buckets(one_worker, dtype):
    """DDP (one worker) on a half-precision model with the phub hook: SGD lr 0.5 on gradient GRAD
    gives weights -0.5 * k * GRAD after k steps, exactly, in the model's own dtype."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from phub.integrations.torch import register_hook

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        weights = torch.nn.Linear(4, 1, bias=False).to(dtype)
        torch.nn.init.zeros_(weights.weight)
        model = DDP(weights)
        state = register_hook(model, one_worker, prefix=f"half.{dtype}")
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in range(1, 4):
            opt.zero_grad()
            model(torch.tensor([GRAD], dtype=dtype)).sum().backward()
            opt.step()
            want = (-0.5 * step * torch.tensor([GRAD])).to(dtype)
            assert weights.weight.dtype == dtype
            assert torch.equal(weights.weight.detach(), want), f"step {step}: {weights.weight} != {want}"
        assert [buffer.dtype for buffer in state.staging.values()] == [torch.float32]  # one key, one buffer
        state.close()
    finally:
        dist.destroy_process_group()


def test_server_optimizer_is_collected_while_its_model_lives(one_worker):
    """The hooks on the parameters must not keep the optimizer alive (it may own its client),
    and they go with it: backward then pushes nothing."""
    import gc
    import weakref

    from phub.integrations.torch import ServerOptimizer

    param = torch.nn.Parameter(torch.zeros(4))
    opt = ServerOptimizer([param], lr=0.5, client=one_worker, prefix="collected.")
    collected = weakref.ref(opt)
    del opt
    gc.collect()
    assert collected() is None
    backward_of_weighted_sum(param)
    backward_of_weighted_sum(param)  # accumulates: no optimizer refuses it
    np.testing.assert_array_equal(param.grad.numpy(), 2 * np.array(GRAD, np.float32))
