"""The server's float32 kernels: gradient aggregation and optimizer updates.

Two backends expose the same functions, on 1-D C-contiguous float32 numpy arrays, updated in place:

* ``reference``: pure numpy. It is the specification: every kernel is written as the exact
  sequence of float32 operations, with scalars converted to ``np.float32`` once.
* ``fast``: the same kernels in C (``phub._fastkernels``), bit-identical to ``reference``.

``get_backend("auto")`` picks ``fast`` when the extension is built and warns otherwise.
"""
# Why a small C extension rather than numba for the hot loops:
# * No JIT warm-up: every server core process would otherwise compile the kernels at start-up
#   (seconds each, per process), or depend on a fragile on-disk cache.
# * No heavy extra dependency: numba (and llvmlite) would have to be pinned to versions that
#   still support numpy 1.23.5, which the MXNet baseline forces on us.
# * The GIL is released during each loop, so server threads overlap kernels with network I/O.
# * Bit-identical to this numpy reference: setup.py builds it with -ffp-contract=off (no fused
#   multiply-add), and the C loops follow the same float32 operation order statement by statement.
import warnings

import numpy as np

try:
    from phub import _fastkernels as _fk
except ImportError as exc:  # not built (e.g. a source checkout without `pip install -e .`)
    _fk = None
    _FAST_IMPORT_ERROR = exc
else:
    _FAST_IMPORT_ERROR = None

FAST_AVAILABLE: bool = _fk is not None

BACKENDS = ("reference", "fast", "auto")

_F32 = np.dtype(np.float32)


def _describe(a):
    if isinstance(a, np.ndarray):
        layout = "" if a.flags.c_contiguous else ", not C-contiguous"
        return f"{a.dtype} array of shape {a.shape}{layout}"
    return type(a).__name__


def _check(func, named, check_lengths):
    """Raise ValueError unless every (name, array) pair, other than a None, is a 1-D C-contiguous
    float32 ndarray and (if check_lengths; the C extension checks lengths itself) all have the
    length of the first. Messages match the extension's ones."""
    for name, a in named:
        if a is None:
            continue
        if not (isinstance(a, np.ndarray) and a.dtype == _F32 and a.ndim == 1
                and a.flags.c_contiguous):
            raise ValueError(f"{func}: '{name}' must be a 1-D C-contiguous float32 numpy array, "
                             f"got {_describe(a)}")
    if check_lengths:
        ref_name, ref = named[0]
        for name, a in named[1:]:
            if a is not None and a.size != ref.size:
                raise ValueError(f"{func}: length mismatch: '{name}' has {a.size} float32 values "
                                 f"but '{ref_name}' has {ref.size}")


class reference:
    """Pure-numpy kernels; the float32 operation order here is the specification."""

    name = "reference"

    @staticmethod
    def _grad(acc, last, rescale_grad, clip):
        """g = clip(rescale_grad * (acc + last)), clipping to [-clip, clip] only when clip > 0."""
        g = acc if last is None else acc + last
        g = rescale_grad * g
        if clip > 0:
            # maximum/minimum (not np.clip) to mirror the C compares; both propagate NaN.
            g = np.minimum(np.maximum(g, -clip), clip)
        return g

    @staticmethod
    def aggregate(acc, src, first):
        """acc[:] = src if first else acc + src."""
        _check("aggregate", (("acc", acc), ("src", src)), True)
        if first:
            np.copyto(acc, src)
        else:
            np.add(acc, src, out=acc)

    @staticmethod
    def nag(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient):
        """MXNet's NAG update fused with the last aggregation step (last may be None):
        g = clip(rescale_grad*(acc + last)); g = g + wd*w; mom = momentum*mom + g;
        g = g + momentum*mom; w = w - lr*g."""
        _check("nag", (("weight", weight), ("mom", mom), ("acc", acc), ("last", last)), True)
        lr, mu, wd, rs, clip = map(np.float32, (lr, momentum, wd, rescale_grad, clip_gradient))
        g = reference._grad(acc, last, rs, clip)
        g = g + wd * weight
        mom[:] = mu * mom + g
        g = g + mu * mom
        weight[:] = weight - lr * g

    @staticmethod
    def sgd(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient):
        """SGD fused with the last aggregation step (last may be None):
        g = clip(rescale_grad*(acc + last)); step = lr*(g + wd*w); then, when mom is given,
        mom = momentum*mom - step; w = w + mom; otherwise (momentum must be 0) w = w - step."""
        _check("sgd", (("weight", weight), ("mom", mom), ("acc", acc), ("last", last)), True)
        lr, mu, wd, rs, clip = map(np.float32, (lr, momentum, wd, rescale_grad, clip_gradient))
        if mom is None and mu != 0:
            raise ValueError(f"sgd: 'mom' is None but momentum is {momentum!r} (it must be 0)")
        g = reference._grad(acc, last, rs, clip)
        step = lr * (g + wd * weight)
        if mom is not None:
            mom[:] = mu * mom - step
            weight[:] = weight + mom
        else:
            weight[:] = weight - step

    @staticmethod
    def scale(out, acc, last, factor):
        """out[:] = (acc + last) * factor, or acc * factor when last is None (aggregation-only
        mode: factor 1 sums, 1/N averages)."""
        _check("scale", (("out", out), ("acc", acc), ("last", last)), True)
        g = acc if last is None else acc + last
        np.multiply(g, np.float32(factor), out=out)


class fast:
    """The same kernels in C (phub._fastkernels); bit-identical to `reference`, GIL released."""

    name = "fast"

    # The wrappers only check what a bare buffer cannot tell the extension (dtype, layout);
    # the extension checks lengths. Each is called once per 8192-element chunk, so stay thin.
    @staticmethod
    def aggregate(acc, src, first):
        _check("aggregate", (("acc", acc), ("src", src)), False)
        _fk.aggregate(acc, src, first)

    @staticmethod
    def nag(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient):
        _check("nag", (("weight", weight), ("mom", mom), ("acc", acc), ("last", last)), False)
        _fk.nag(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient)

    @staticmethod
    def sgd(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient):
        _check("sgd", (("weight", weight), ("mom", mom), ("acc", acc), ("last", last)), False)
        _fk.sgd(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient)

    @staticmethod
    def scale(out, acc, last, factor):
        _check("scale", (("out", out), ("acc", acc), ("last", last)), False)
        _fk.scale(out, acc, last, factor)


class fast_owned(fast):
    """`fast` without the wrappers' dtype and layout checks, for the buffers a server allocates
    itself (1-D float32 slices of its own arrays, so every check would pass): the server calls a
    kernel once per chunk, and the checks cost more than the call (measured at 1 KB: a NAG step
    1.1 us bare, 2.8 us with them). The extension still checks lengths and contiguity."""

    if _fk is not None:
        aggregate = staticmethod(_fk.aggregate)
        nag = staticmethod(_fk.nag)
        sgd = staticmethod(_fk.sgd)
        scale = staticmethod(_fk.scale)


for _f in ("aggregate", "nag", "sgd", "scale"):  # the fast wrappers share the reference's docs
    getattr(fast, _f).__doc__ = getattr(reference, _f).__doc__
del _f


def for_owned_buffers(backend):
    """The variant of `backend` for buffers phub allocated (see `fast_owned`); reference keeps
    its checks: it is the specification."""
    return fast_owned if backend is fast else backend


def get_backend(name: str):
    """Return the kernel backend `name`: "reference", "fast" or "auto" (fast when the extension
    imports, else reference with a warning naming the import error)."""
    if name == "reference":
        return reference
    if name == "fast":
        if not FAST_AVAILABLE:
            raise ImportError(f"the fast kernel backend is not available: phub._fastkernels "
                              f"failed to import ({_FAST_IMPORT_ERROR!r}); build it with "
                              f"`pip install -e .`")
        return fast
    if name == "auto":
        if FAST_AVAILABLE:
            return fast
        warnings.warn(f"phub._fastkernels failed to import ({_FAST_IMPORT_ERROR!r}); falling back "
                      f"to the slow numpy reference kernels", RuntimeWarning, stacklevel=2)
        return reference
    raise ValueError(f"unknown kernel backend {name!r}; valid names: {', '.join(BACKENDS)}")
