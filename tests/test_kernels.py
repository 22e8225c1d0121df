"""Tests for phub.reduction.kernels: the numpy reference against hand-worked values and an independent
element-by-element oracle, the C backend bit for bit against the reference, and argument checks."""
import warnings

import numpy as np
import pytest

from phub.reduction import kernels
from phub.reduction.kernels import FAST_AVAILABLE, get_backend, reference

F32 = np.float32
SIZES = [1, 7, 8192, 8193, 100003]

needs_fast = pytest.mark.skipif(not FAST_AVAILABLE, reason="phub._fastkernels is not built")


def f32(values):
    return np.array(values, dtype=np.float32)


def assert_bits_equal(actual, expected):
    """Bit-identical, which is stricter than np.array_equal (it also tells -0.0 from 0.0)."""
    assert actual.dtype == expected.dtype == np.float32
    assert np.array_equal(actual.view(np.uint32), expected.view(np.uint32))


def backends():
    return [reference] + ([kernels.fast] if FAST_AVAILABLE else [])


def test_fast_backend_is_built():
    # CI always builds the extension (`pip install -e .`): a silent fallback would hide a
    # broken build behind a 10x slower server.
    assert FAST_AVAILABLE, f"phub._fastkernels did not import: {kernels._FAST_IMPORT_ERROR!r}"


# ------------------------------------------------------------------------------------------------
# Hand-worked examples. All values below are exact in binary, so no rounding is involved:
# lr = 0.25, momentum = 0.5, wd = 0.5, rescale_grad = 0.5, and three elements
# w = [1, -2, 0], mom = [0.5, 0, 1], acc = [2, -3, -8], last = [2, 1, 0]
# so g = rescale*(acc+last) = [2, -1, -4] (clipped to [-1, 1] when clip = 1: [1, -1, -1]).
# ------------------------------------------------------------------------------------------------
HP = dict(lr=0.25, momentum=0.5, wd=0.5, rescale_grad=0.5)


def hand_inputs():
    return f32([1, -2, 0]), f32([0.5, 0, 1]), f32([2, -3, -8]), f32([2, 1, 0])


# NAG, element 0 without clip: g = 2 + 0.5*1 = 2.5; mom = 0.5*0.5 + 2.5 = 2.75;
#   g = 2.5 + 0.5*2.75 = 3.875; w = 1 - 0.25*3.875 = 0.03125.
# element 1: g = -1 + 0.5*(-2) = -2; mom = -2; g = -2 + 0.5*(-2) = -3; w = -2 + 0.75 = -1.25.
# element 2: g = -4 + 0 = -4; mom = 0.5 - 4 = -3.5; g = -4 - 1.75 = -5.75; w = 0 + 1.4375.
# With clip = 1, element 0: g = 1 + 0.5 = 1.5; mom = 0.25 + 1.5 = 1.75; g = 1.5 + 0.875 = 2.375;
#   w = 1 - 0.59375 = 0.40625. Element 2: g = -1; mom = -0.5; g = -1.25; w = 0.3125.
@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
@pytest.mark.parametrize("clip, w_expected, mom_expected", [
    (0.0, [0.03125, -1.25, 1.4375], [2.75, -2.0, -3.5]),
    (-1.0, [0.03125, -1.25, 1.4375], [2.75, -2.0, -3.5]),   # negative clip also means "off"
    (1.0, [0.40625, -1.25, 0.3125], [1.75, -2.0, -0.5]),
])
def test_nag_hand_worked(backend, clip, w_expected, mom_expected):
    w, mom, acc, last = hand_inputs()
    backend.nag(w, mom, acc, last, clip_gradient=clip, **HP)
    assert_bits_equal(w, f32(w_expected))
    assert_bits_equal(mom, f32(mom_expected))
    assert_bits_equal(acc, f32([2, -3, -8]))  # inputs untouched
    assert_bits_equal(last, f32([2, 1, 0]))


# SGD, step = lr*(g + wd*w): without clip [0.625, -0.5, -1], with clip 1 [0.375, -0.5, -0.25].
# With momentum: mom = 0.5*mom - step, w = w + mom. Without: w = w - step.
@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
@pytest.mark.parametrize("clip, use_mom, w_expected, mom_expected", [
    (0.0, True, [0.625, -1.5, 1.5], [-0.375, 0.5, 1.5]),
    (1.0, True, [0.875, -1.5, 0.75], [-0.125, 0.5, 0.75]),
    (0.0, False, [0.375, -1.5, 1.0], None),
    (1.0, False, [0.625, -1.5, 0.25], None),
])
def test_sgd_hand_worked(backend, clip, use_mom, w_expected, mom_expected):
    w, mom, acc, last = hand_inputs()
    hp = dict(HP) if use_mom else dict(HP, momentum=0.0)
    backend.sgd(w, mom if use_mom else None, acc, last, clip_gradient=clip, **hp)
    assert_bits_equal(w, f32(w_expected))
    if use_mom:
        assert_bits_equal(mom, f32(mom_expected))


@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
def test_scale_hand_worked(backend):
    out = np.full(3, np.nan, dtype=np.float32)
    backend.scale(out, f32([1, 2, 3]), f32([1, 1, 1]), 0.5)
    assert_bits_equal(out, f32([1, 1.5, 2]))
    backend.scale(out, f32([4, -8, 2]), None, 0.25)
    assert_bits_equal(out, f32([1, -2, 0.5]))
    acc = f32([3, 5, 7])
    backend.scale(acc, acc, None, 1.0)  # in place, factor 1: plain sum, unchanged
    assert_bits_equal(acc, f32([3, 5, 7]))


# ------------------------------------------------------------------------------------------------
# An independent oracle: the formulas evaluated one element at a time with np.float32 scalars,
# so rounding happens exactly as specified. Checked against the reference on data that rounds.
# ------------------------------------------------------------------------------------------------
def scalar_nag(w, m, a, l, lr, mu, wd, rs, clip):
    lr, mu, wd, rs, clip = map(F32, (lr, mu, wd, rs, clip))
    g = a if l is None else a + l
    g = rs * g
    if clip > 0:
        g = min(max(g, -clip), clip)
    g = g + wd * w
    m = mu * m + g
    g = g + mu * m
    return w - lr * g, m


def scalar_sgd(w, m, a, l, lr, mu, wd, rs, clip):
    lr, mu, wd, rs, clip = map(F32, (lr, mu, wd, rs, clip))
    g = a if l is None else a + l
    g = rs * g
    if clip > 0:
        g = min(max(g, -clip), clip)
    step = lr * (g + wd * w)
    if m is None:
        return w - step, None
    m = mu * m - step
    return w + m, m


def random_state(rng, n):
    w = rng.standard_normal(n).astype(np.float32)
    mom = (0.1 * rng.standard_normal(n)).astype(np.float32)
    acc = rng.standard_normal(n).astype(np.float32)
    last = rng.standard_normal(n).astype(np.float32)
    return w, mom, acc, last


@pytest.mark.parametrize("kind", ["nag", "sgd"])
@pytest.mark.parametrize("with_last", [False, True])
@pytest.mark.parametrize("clip", [0.0, 0.3])
def test_reference_matches_scalar_oracle(kind, with_last, clip):
    rng = np.random.default_rng(1)
    w, mom, acc, last = random_state(rng, 64)
    last = last if with_last else None
    hp = (0.1, 0.9, 1e-4, 1 / 3, clip)
    expected = [(scalar_nag if kind == "nag" else scalar_sgd)(
        w[i], mom[i], acc[i], None if last is None else last[i], *hp) for i in range(w.size)]
    getattr(reference, kind)(w, mom, acc, last, *hp)
    assert_bits_equal(w, f32([e[0] for e in expected]))
    assert_bits_equal(mom, f32([e[1] for e in expected]))


# ------------------------------------------------------------------------------------------------
# fast vs reference, bit for bit
# ------------------------------------------------------------------------------------------------
def run_both(kind, n, seed, with_last, mom_mode, args):
    """Run kernel `kind` on identical copies of random data with both backends; return the
    (reference, fast) arrays it writes."""
    rng = np.random.default_rng(seed)
    w, mom, acc, last = random_state(rng, n)
    outs = []
    for backend in (reference, kernels.fast):
        bw, bmom, bacc = w.copy(), mom.copy(), acc.copy()
        blast = last.copy() if with_last else None
        if mom_mode == "none":
            bmom = None
        getattr(backend, kind)(bw, bmom, bacc, blast, *args)
        assert_bits_equal(bacc, acc)
        outs.append((bw, bmom))
    return outs


@needs_fast
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("with_last", [False, True])
@pytest.mark.parametrize("clip", [0.0, 0.5])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("wd", [0.0, 1e-4])
def test_nag_fast_matches_reference(n, with_last, clip, momentum, wd):
    (rw, rmom), (fw, fmom) = run_both("nag", n, n, with_last, "array",
                                      (0.05, momentum, wd, 0.25, clip))
    assert_bits_equal(fw, rw)
    assert_bits_equal(fmom, rmom)


@needs_fast
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("with_last", [False, True])
@pytest.mark.parametrize("clip", [0.0, 0.5])
@pytest.mark.parametrize("momentum, mom_mode", [(0.0, "none"), (0.0, "array"), (0.9, "array")])
@pytest.mark.parametrize("wd", [0.0, 1e-4])
def test_sgd_fast_matches_reference(n, with_last, clip, momentum, mom_mode, wd):
    (rw, rmom), (fw, fmom) = run_both("sgd", n, n + 1, with_last, mom_mode,
                                      (0.05, momentum, wd, 0.25, clip))
    assert_bits_equal(fw, rw)
    if mom_mode == "array":
        assert_bits_equal(fmom, rmom)


@needs_fast
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("with_last", [False, True])
@pytest.mark.parametrize("factor", [1.0, 0.25, 1 / 3])
def test_scale_fast_matches_reference(n, with_last, factor):
    rng = np.random.default_rng(n)
    acc, last = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    last = last if with_last else None
    outs = [np.empty(n, np.float32) for _ in range(2)]
    reference.scale(outs[0], acc, last, factor)
    kernels.fast.scale(outs[1], acc, last, factor)
    assert_bits_equal(outs[1], outs[0])


@needs_fast
@pytest.mark.parametrize("n", SIZES)
def test_aggregate_fast_matches_reference(n):
    rng = np.random.default_rng(n)
    srcs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    accs = [np.full(n, np.nan, np.float32) for _ in range(2)]
    for i, src in enumerate(srcs):
        reference.aggregate(accs[0], src, i == 0)
        kernels.fast.aggregate(accs[1], src, i == 0)
    assert_bits_equal(accs[1], accs[0])


@needs_fast
@pytest.mark.parametrize("kind", ["nag", "sgd"])
def test_special_values_match(kind):
    """inf, NaN, subnormals and signed zeros go through both backends the same way."""
    special = f32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 3e38, -3e38, 1, -1])
    rng = np.random.default_rng(7)
    n = special.size
    w, mom, acc, last = (special[rng.permutation(n)] for _ in range(4))
    results = []
    for backend in (reference, kernels.fast):
        bw, bmom = w.copy(), mom.copy()
        with np.errstate(all="ignore"):
            getattr(backend, kind)(bw, bmom, acc, last, 0.5, 0.9, 0.1, 1.0, 2.0)
        results.append((bw, bmom))
    for r, f in zip(*results):
        nan = np.isnan(r)
        assert np.array_equal(nan, np.isnan(f))
        assert_bits_equal(f[~nan], r[~nan])


# ------------------------------------------------------------------------------------------------
# Aggregation semantics
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
def test_aggregate_four_sources_is_their_sum(backend):
    rng = np.random.default_rng(4)
    srcs = [rng.standard_normal(1001).astype(np.float32) for _ in range(4)]
    acc = np.full(1001, np.nan, np.float32)  # stale contents must be overwritten by `first`
    backend.aggregate(acc, srcs[0], True)
    assert_bits_equal(acc, srcs[0])
    assert acc is not srcs[0] and not np.shares_memory(acc, srcs[0])
    for src in srcs[1:]:
        backend.aggregate(acc, src, False)
    assert_bits_equal(acc, ((srcs[0] + srcs[1]) + srcs[2]) + srcs[3])
    for src in srcs:  # sources untouched
        assert not np.isnan(src).any()


# ------------------------------------------------------------------------------------------------
# Argument checking
# ------------------------------------------------------------------------------------------------
def call(backend, kind, arrays):
    if kind == "aggregate":
        backend.aggregate(arrays[0], arrays[1], False)
    elif kind == "scale":
        backend.scale(arrays[0], arrays[1], arrays[2], 0.5)
    else:
        getattr(backend, kind)(*arrays, 0.1, 0.9, 0.0, 1.0, 0.0)


ARITY = {"aggregate": 2, "scale": 3, "nag": 4, "sgd": 4}


@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
@pytest.mark.parametrize("kind", sorted(ARITY))
def test_wrong_dtype_raises(backend, kind):
    for pos in range(ARITY[kind]):
        arrays = [np.zeros(8, np.float32) for _ in range(ARITY[kind])]
        arrays[pos] = np.zeros(8, np.float64)
        with pytest.raises(ValueError, match=r"must be a 1-D C-contiguous float32 numpy array, "
                                             r"got float64 array of shape \(8,\)"):
            call(backend, kind, arrays)


@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
@pytest.mark.parametrize("kind", sorted(ARITY))
def test_non_contiguous_or_not_an_array_raises(backend, kind):
    arrays = [np.zeros(8, np.float32) for _ in range(ARITY[kind])]
    arrays[-1] = np.zeros(16, np.float32)[::2]
    with pytest.raises(ValueError, match="not C-contiguous"):
        call(backend, kind, arrays)
    arrays[-1] = [0.0] * 8
    with pytest.raises(ValueError, match="got list"):
        call(backend, kind, arrays)


@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
@pytest.mark.parametrize("kind", sorted(ARITY))
def test_length_mismatch_raises(backend, kind):
    first = {"aggregate": "acc", "scale": "out", "nag": "weight", "sgd": "weight"}[kind]
    arrays = [np.zeros(8, np.float32) for _ in range(ARITY[kind])]
    arrays[-1] = np.zeros(7, np.float32)
    with pytest.raises(ValueError, match=rf"{kind}: length mismatch: '\w+' has 7 float32 values "
                                         rf"but '{first}' has 8"):
        call(backend, kind, arrays)


@needs_fast
def test_extension_checks_raw_buffers():
    """The extension itself rejects buffers that are not whole float32 arrays of one length."""
    from phub import _fastkernels as fk
    acc = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match=r"aggregate: 'src' has 7 bytes, which is not a whole "
                                         r"number of float32 values"):
        fk.aggregate(acc, bytes(7), False)
    with pytest.raises(ValueError, match=r"aggregate: length mismatch: 'src' has 3 float32 values "
                                         r"but 'acc' has 2"):
        fk.aggregate(acc, bytes(12), False)
    with pytest.raises(ValueError, match=r"scale: length mismatch: 'last' has 1 float32 values"):
        fk.scale(acc, acc, bytes(4), 1.0)
    with pytest.raises(TypeError, match=r"nag: 'last' must be None or a contiguous float32 buffer"):
        fk.nag(acc, acc.copy(), acc, 3.0, 0.1, 0.9, 0.0, 1.0, 0.0)
    fk.aggregate(acc, bytes(8), False)  # any buffer of the right size is accepted
    assert_bits_equal(acc, f32([0, 0]))


@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.name)
def test_sgd_without_mom_needs_zero_momentum(backend):
    w, acc = np.ones(4, np.float32), np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"sgd: 'mom' is None but momentum is 0.9 \(it must be 0\)"):
        backend.sgd(w, None, acc, None, 0.1, 0.9, 0.0, 1.0, 0.0)
    assert_bits_equal(w, np.ones(4, np.float32))


# ------------------------------------------------------------------------------------------------
# Backend selection
# ------------------------------------------------------------------------------------------------
def test_get_backend_names():
    assert get_backend("reference") is reference
    if FAST_AVAILABLE:
        assert get_backend("fast") is kernels.fast
        assert get_backend("auto") is kernels.fast
    with pytest.raises(ValueError, match="unknown kernel backend 'numba'; valid names: "
                                         "reference, fast, auto"):
        get_backend("numba")


def test_auto_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(kernels, "FAST_AVAILABLE", False)
    monkeypatch.setattr(kernels, "_FAST_IMPORT_ERROR", ImportError("no module _fastkernels"))
    with pytest.warns(RuntimeWarning, match="no module _fastkernels"):
        assert kernels.get_backend("auto") is reference
    with pytest.raises(ImportError, match="no module _fastkernels"):
        kernels.get_backend("fast")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.get_backend("reference") is reference
