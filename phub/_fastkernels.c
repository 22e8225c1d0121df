/*
 * phub._fastkernels: the server's float32 hot loops (aggregation and optimizer passes).
 *
 * Why C rather than numba, and the exact float32 operation order each kernel follows, are
 * documented in phub/reduction/kernels.py; its `reference` backend is the pure-numpy specification these
 * loops must match bit for bit. That is why setup.py builds this file with -ffp-contract=off (no
 * fused multiply-add) and why no -ffast-math style flag may ever be added: every operation here
 * must round exactly like the corresponding numpy float32 operation.
 *
 * Arguments arrive through the buffer protocol (no numpy C API, so the extension does not depend
 * on the numpy ABI). Each buffer must be contiguous, hold a whole number of float32 values, be
 * float32-aligned, and all buffers of one call must have the same length. Checking the dtype is
 * the caller's job (phub/reduction/kernels.py does it): a buffer carries no element type under PyBUF_SIMPLE.
 *
 * The loops (in _fastkernels.h, which phub/_fastpath.c shares) are plain element-wise loops that gcc
 * -O3 auto-vectorizes; each reads and writes every element once. The pointers are not declared
 * `restrict`: gcc versions each loop with a cheap runtime overlap check instead, so the vector
 * path is still taken for distinct arrays, and an in-place call such as scale(acc, acc, None, f)
 * stays well defined.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_fastkernels.h"

/* ---------------------------------------------------------------------------------------------
 * Buffer handling
 * ------------------------------------------------------------------------------------------- */

/* Release every acquired buffer (views whose obj is NULL were never acquired, e.g. a None). */
static void
release_all(Py_buffer **bufs, int n)
{
    for (int i = 0; i < n; i++) {
        if (bufs[i]->obj != NULL) {
            PyBuffer_Release(bufs[i]);
        }
    }
}

/*
 * Check bufs[0..n) (skipping absent ones, i.e. buf == NULL) against the first one: float32-sized,
 * float32-aligned and all of the same byte length. On failure sets ValueError and returns -1.
 */
static int
check_all(const char *func, Py_buffer **bufs, const char **names, int n)
{
    const Py_buffer *ref = bufs[0];
    for (int i = 0; i < n; i++) {
        const Py_buffer *b = bufs[i];
        if (b->buf == NULL) {
            continue;
        }
        if (b->len % (Py_ssize_t)sizeof(float) != 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: '%s' has %zd bytes, which is not a whole number of float32 "
                         "values (a multiple of 4 bytes)", func, names[i], b->len);
            return -1;
        }
        if ((uintptr_t)b->buf % _Alignof(float) != 0) {
            PyErr_Format(PyExc_ValueError, "%s: '%s' is not aligned to 4 bytes (float32)",
                         func, names[i]);
            return -1;
        }
        if (b->len != ref->len) {
            PyErr_Format(PyExc_ValueError,
                         "%s: length mismatch: '%s' has %zd float32 values but '%s' has %zd",
                         func, names[i], b->len / (Py_ssize_t)sizeof(float), names[0],
                         ref->len / (Py_ssize_t)sizeof(float));
            return -1;
        }
    }
    return 0;
}

/*
 * Acquire an optional buffer: None leaves `view` zeroed (buf == NULL, obj == NULL), anything else
 * must export a contiguous buffer (writable if `writable`). Returns -1 with an exception set.
 */
static int
get_optional(PyObject *obj, Py_buffer *view, int writable, const char *func, const char *name)
{
    memset(view, 0, sizeof *view);
    if (obj == Py_None) {
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        memset(view, 0, sizeof *view);
        /* Keep the exporter's exception type and message (numpy: ValueError "ndarray is not
         * C-contiguous"; a non-buffer: TypeError) but say which argument it was about. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(type != NULL ? type : PyExc_TypeError,
                     "%s: '%s' must be None or a contiguous %sfloat32 buffer (%S)",
                     func, name, writable ? "writable " : "", value != NULL ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Python entry points
 * ------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(aggregate_doc,
"aggregate(acc, src, first)\n--\n\n"
"acc[:] = src if first else acc + src (float32, in place).");

static PyObject *
fk_aggregate(PyObject *self, PyObject *args)
{
    Py_buffer acc, src;
    int first;
    if (!PyArg_ParseTuple(args, "w*y*p:aggregate", &acc, &src, &first)) {
        return NULL;
    }
    Py_buffer *bufs[] = {&acc, &src};
    const char *names[] = {"acc", "src"};
    if (check_all("aggregate", bufs, names, 2) < 0) {
        release_all(bufs, 2);
        return NULL;
    }
    float *a = (float *)acc.buf;
    const float *s = (const float *)src.buf;
    const Py_ssize_t n = acc.len / (Py_ssize_t)sizeof(float);
    Py_BEGIN_ALLOW_THREADS
    if (first) {
        if (a != s) {
            memmove(a, s, (size_t)n * sizeof(float));
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            a[i] = a[i] + s[i];
        }
    }
    Py_END_ALLOW_THREADS
    release_all(bufs, 2);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(nag_doc,
"nag(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient)\n--\n\n"
"MXNet's NAG update fused with the final aggregation step; see phub.reduction.kernels.");

static PyObject *
fk_nag(PyObject *self, PyObject *args)
{
    Py_buffer weight, mom, acc, last;
    PyObject *last_obj;
    float lr, mu, wd, rescale, clip;
    if (!PyArg_ParseTuple(args, "w*w*y*Offfff:nag", &weight, &mom, &acc, &last_obj, &lr, &mu,
                          &wd, &rescale, &clip)) {
        return NULL;
    }
    Py_buffer *bufs[] = {&weight, &mom, &acc, &last};
    const char *names[] = {"weight", "mom", "acc", "last"};
    if (get_optional(last_obj, &last, 0, "nag", "last") < 0 ||
        check_all("nag", bufs, names, 4) < 0) {
        release_all(bufs, 4);
        return NULL;
    }
    float *w = (float *)weight.buf, *m = (float *)mom.buf;
    const float *a = (const float *)acc.buf, *l = (const float *)last.buf;
    const Py_ssize_t n = weight.len / (Py_ssize_t)sizeof(float);
    Py_BEGIN_ALLOW_THREADS
    nag_pass(w, m, a, l, n, lr, mu, wd, rescale, clip);
    Py_END_ALLOW_THREADS
    release_all(bufs, 4);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(sgd_doc,
"sgd(weight, mom, acc, last, lr, momentum, wd, rescale_grad, clip_gradient)\n--\n\n"
"SGD (with momentum when mom is not None) fused with the final aggregation step;\n"
"see phub.reduction.kernels.");

static PyObject *
fk_sgd(PyObject *self, PyObject *args)
{
    Py_buffer weight, mom, acc, last;
    PyObject *mom_obj, *last_obj;
    float lr, mu, wd, rescale, clip;
    if (!PyArg_ParseTuple(args, "w*Oy*Offfff:sgd", &weight, &mom_obj, &acc, &last_obj, &lr, &mu,
                          &wd, &rescale, &clip)) {
        return NULL;
    }
    /* Zeroed so that release_all is safe whichever step below fails. */
    memset(&mom, 0, sizeof mom);
    memset(&last, 0, sizeof last);
    Py_buffer *bufs[] = {&weight, &mom, &acc, &last};
    const char *names[] = {"weight", "mom", "acc", "last"};
    if (mom_obj == Py_None && mu != 0.0f) {
        PyErr_Format(PyExc_ValueError, "sgd: 'mom' is None but momentum is %R (it must be 0)",
                     PyTuple_GET_ITEM(args, 5));
        release_all(bufs, 4);
        return NULL;
    }
    if (get_optional(mom_obj, &mom, 1, "sgd", "mom") < 0 ||
        get_optional(last_obj, &last, 0, "sgd", "last") < 0 ||
        check_all("sgd", bufs, names, 4) < 0) {
        release_all(bufs, 4);
        return NULL;
    }
    float *w = (float *)weight.buf, *m = (float *)mom.buf;
    const float *a = (const float *)acc.buf, *l = (const float *)last.buf;
    const Py_ssize_t n = weight.len / (Py_ssize_t)sizeof(float);
    Py_BEGIN_ALLOW_THREADS
    sgd_pass(w, m, a, l, n, lr, mu, wd, rescale, clip);
    Py_END_ALLOW_THREADS
    release_all(bufs, 4);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(scale_doc,
"scale(out, acc, last, factor)\n--\n\n"
"out[:] = (acc + last) * factor, or acc * factor when last is None (float32).");

static PyObject *
fk_scale(PyObject *self, PyObject *args)
{
    Py_buffer out, acc, last;
    PyObject *last_obj;
    float factor;
    if (!PyArg_ParseTuple(args, "w*y*Of:scale", &out, &acc, &last_obj, &factor)) {
        return NULL;
    }
    Py_buffer *bufs[] = {&out, &acc, &last};
    const char *names[] = {"out", "acc", "last"};
    if (get_optional(last_obj, &last, 0, "scale", "last") < 0 ||
        check_all("scale", bufs, names, 3) < 0) {
        release_all(bufs, 3);
        return NULL;
    }
    float *o = (float *)out.buf;
    const float *a = (const float *)acc.buf, *l = (const float *)last.buf;
    const Py_ssize_t n = out.len / (Py_ssize_t)sizeof(float);
    Py_BEGIN_ALLOW_THREADS
    if (l != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            o[i] = (a[i] + l[i]) * factor;
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            o[i] = a[i] * factor;
        }
    }
    Py_END_ALLOW_THREADS
    release_all(bufs, 3);
    Py_RETURN_NONE;
}

static PyMethodDef fk_methods[] = {
    {"aggregate", fk_aggregate, METH_VARARGS, aggregate_doc},
    {"nag", fk_nag, METH_VARARGS, nag_doc},
    {"sgd", fk_sgd, METH_VARARGS, sgd_doc},
    {"scale", fk_scale, METH_VARARGS, scale_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "phub._fastkernels",
    .m_doc = "float32 aggregation and optimizer kernels for the PHub server (see phub.reduction.kernels).",
    .m_size = -1,
    .m_methods = fk_methods,
};

PyMODINIT_FUNC
PyInit__fastkernels(void)
{
    return PyModule_Create(&fk_module);
}
