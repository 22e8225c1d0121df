"""Multi-process exchanges on loopback: real server cores, real worker processes, known answers.

Worker r pushes (r + 1) * s * P_a at step s for array a (see workers/exchange_worker.py), so the
aggregate is exactly N(N+1)/2 * s * P_a and the weights after k steps follow from the optimizer's
formula. The oracles here are written out in float64 from the formulas in the paper's notes, not
taken from phub's kernels.
"""
import json

import numpy as np
import pytest

import phub
from workers.exchange_worker import SHARED_EARLY, SHARED_LATE, initial, pattern

# Sizes around the 8192-element chunk: 1 element, one short, exact, one over, several chunks, 3-d.
SIZES = [[1], [8191], [8192], [8193], [20000], [3, 5, 7]]
STEPS = 4


def aggregate(n, step, i, size):
    return (n * (n + 1) // 2) * step * pattern(size, i).astype(np.float64)


def nag_oracle(n, i, size, steps, lr, momentum, wd, rescale):
    w = initial(size, i).astype(np.float64)
    mom = np.zeros_like(w)
    for step in range(1, steps + 1):
        g = rescale * aggregate(n, step, i, size) + wd * w
        mom = momentum * mom + g
        w = w - lr * (g + momentum * mom)
    return w


def sgd_oracle(n, i, size, steps, lr, momentum, wd, rescale):
    w = initial(size, i).astype(np.float64)
    mom = np.zeros_like(w)
    for step in range(1, steps + 1):
        g = rescale * aggregate(n, step, i, size)
        if momentum:
            mom = momentum * mom - lr * (g + wd * w)
            w = w + mom
        else:
            w = w - lr * (g + wd * w)
    return w


def assert_close(got, want, what):
    err = np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))
    assert err <= 1e-6, f"{what}: relative error {err:.3g}"


@pytest.mark.parametrize("interfaces", [("127.0.0.1",), ("127.0.0.1", "127.0.0.2")], ids=["1if", "2if"])
@pytest.mark.parametrize("cores", [1, 2], ids=["1core", "2core"])
@pytest.mark.parametrize("workers", [1, 2, 4], ids=["1w", "2w", "4w"])
def test_nag_matches_closed_form(run_exchange, workers, cores, interfaces):
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=1.0 / workers)
    results = run_exchange(workers, SIZES, STEPS, opt, cores=cores, interfaces=interfaces)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        want = nag_oracle(workers, i, size, STEPS, 0.1, 0.9, 1e-2, 1.0 / workers)
        for rank, saved in enumerate(results):
            assert np.array_equal(saved[f"init{i}"].reshape(-1), initial(size, i)), f"rank {rank}: init of array {i}"
            assert_close(saved[f"final{i}"].reshape(-1), want, f"rank {rank}, array {i}")
        # every worker ends with bit-identical weights
        for saved in results[1:]:
            assert np.array_equal(saved[f"final{i}"], results[0][f"final{i}"])


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_sgd_matches_closed_form(run_exchange, momentum):
    opt = phub.SGD(learning_rate=0.25, momentum=momentum, wd=1e-3, rescale_grad=0.5)
    results = run_exchange(2, SIZES, STEPS, opt, cores=2)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        want = sgd_oracle(2, i, size, STEPS, 0.25, momentum, 1e-3, 0.5)
        for rank, saved in enumerate(results):
            assert_close(saved[f"final{i}"].reshape(-1), want, f"rank {rank}, array {i}")


def test_aggregation_only_returns_exact_sums(run_exchange):
    results = run_exchange(3, SIZES, STEPS, None, cores=2, interfaces=("127.0.0.1", "127.0.0.2"))
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        for step in range(1, STEPS + 1):
            want = aggregate(3, step, i, size).astype(np.float32)
            for rank, saved in enumerate(results):
                assert np.array_equal(saved[f"sum{step}_{i}"].reshape(-1), want), f"rank {rank} step {step} array {i}"
        # the weights themselves are untouched by a pure aggregation
        assert np.array_equal(results[1][f"final{i}"].reshape(-1), initial(size, i))


def test_aggregation_average(run_exchange):
    # With an optimizer object given, the worker writes results into its weights: the last
    # step's mean is what remains.
    results = run_exchange(4, [[8193]], 2, phub.Aggregate(average=True))
    want = (aggregate(4, 2, 0, 8193) / 4).astype(np.float32)
    for saved in results:
        assert np.array_equal(saved["final0"].reshape(-1), want)


def test_small_chunks_and_many_lanes(run_exchange):
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=0.0, rescale_grad=0.5)
    results = run_exchange(2, SIZES, 2, opt, cores=2, chunk_bytes=4096, lanes_per_pair=2)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        want = nag_oracle(2, i, size, 2, 0.1, 0.9, 0.0, 0.5)
        assert_close(results[0][f"final{i}"].reshape(-1), want, f"array {i}")


@pytest.mark.parametrize("workers", [1, 3])
def test_rank_0_shares_values_that_are_not_tensors_with_every_worker(run_exchange, workers):
    """Client.share: what rank 0 shares before its init reaches workers that ask after theirs,
    and a value shared at the end reaches everyone too, decoded as rank 0 passed it."""
    results = run_exchange(workers, [[5]], 2, share=True)
    for saved in results:
        assert json.loads(str(saved["shared"])) == [SHARED_EARLY, SHARED_LATE]
