/*
 * phub._fastpath, continued: how drain_pushes finishes in C the rounds it completes on a lane
 * that runs NAG or SGD (see the top of _fastpath.c): the optimizer pass, the bookkeeping and the
 * RESULT frames. Included by _fastpath.c before drain_pushes, after the helpers it uses (get_field,
 * get_int, set_int, get_floats, the round contract): one translation unit, several files.
 */
#ifndef PHUB_FASTPATH_ROUNDS_H
#define PHUB_FASTPATH_ROUNDS_H

#include "_fastkernels.h"

static void
release_acquired(Py_buffer *view)
{
    if (view->obj != NULL) {
        PyBuffer_Release(view);
    }
}

/* An optimizer as JobState.loop_optimizers holds it (Optimizer.loop_params): a tuple whose
 * fields are where the contract's "loop params" layout (optim.LOOP_PARAMS_FIELDS) puts them. */
enum { OPT_NAG = 1, OPT_SGD = 2 };
typedef struct {
    int kind, needs_mom;
    float lr, mu, wd, rescale, clip;
} fast_optimizer;

/* Parse one (once per drain_pushes call: a call's pushes are all of one lane); 1 when this
 * loop runs it, 0 when not (None, or another kind), -1 with an exception set on a malformed one. */
static int
parse_optimizer(PyObject *params, fast_optimizer *opt)
{
    if (params == Py_None) {
        return 0;
    }
    const params_layout at = contract.params;
    if (!PyTuple_Check(params) || PyTuple_GET_SIZE(params) != at.width) {
        PyErr_Format(PyExc_TypeError, "an optimizer's loop params must be a tuple of %zd, not %R", at.width, params);
        return -1;
    }
    opt->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(params, at.kind));
    opt->needs_mom = PyObject_IsTrue(PyTuple_GET_ITEM(params, at.needs_momentum));
    opt->lr = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(params, at.learning_rate));
    opt->mu = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(params, at.momentum));
    opt->wd = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(params, at.wd));
    opt->rescale = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(params, at.rescale_grad));
    opt->clip = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(params, at.clip_gradient));
    if (PyErr_Occurred()) {
        return -1;
    }
    return opt->kind == OPT_NAG || opt->kind == OPT_SGD;
}

/* Results this small travel as one copy, header and payload side by side in one buffer per
 * lane: copying up to 2 KB costs less than the two iovec parts (and their Python objects) a frame
 * would otherwise take through Link.send and sendmsg. Larger ones are sent from the weights. */
#define COPIED_RESULT_BYTES 2048

/* Write a RESULT header (wire.pack_header) for `chunk` after `rounds` rounds at h. */
static void
write_result_header(unsigned char *h, uint32_t job, uint32_t chunk, uint32_t rounds, uint32_t nbytes)
{
    const uint32_t words[6] = {job, SERVER_SENDER, chunk, rounds, nbytes, 0};
    memcpy(h, "PHUB", 4);
    h[4] = 1;
    h[5] = KIND_RESULT;
    h[6] = h[7] = 0;
    for (int i = 0; i < 6; i++) {
        for (int b = 0; b < 4; b++) {
            h[8 + 4 * i + b] = (unsigned char)(words[i] >> (8 * b));
        }
    }
}

/* Append a finished round's RESULT frame to parts[lane] (a list, made when missing): a small
 * one copied onto the bytearray at the list's end (made when missing), a larger one as
 * (header, weight view). `weights`: the round's result, `view` over it. */
static int
queue_result(PyObject *parts, PyObject *lane, uint32_t job, uint32_t chunk, uint32_t rounds, const Py_buffer *weights,
             PyObject *view)
{
    PyObject *list = PyDict_GetItemWithError(parts, lane); /* borrowed */
    if (list == NULL) {
        if (PyErr_Occurred() || (list = PyList_New(0)) == NULL) {
            return -1;
        }
        int status = PyDict_SetItem(parts, lane, list);
        Py_DECREF(list); /* the dict keeps it */
        if (status < 0) {
            return -1;
        }
    }
    const Py_ssize_t nbytes = weights->len, queued = PyList_GET_SIZE(list);
    if (nbytes <= COPIED_RESULT_BYTES) {
        PyObject *frames = queued ? PyList_GET_ITEM(list, queued - 1) : NULL; /* borrowed */
        if (frames == NULL || !PyByteArray_CheckExact(frames)) {
            if ((frames = PyByteArray_FromStringAndSize(NULL, 0)) == NULL) {
                return -1;
            }
            int status = PyList_Append(list, frames);
            Py_DECREF(frames); /* the list keeps it */
            if (status < 0) {
                return -1;
            }
        }
        const Py_ssize_t at = PyByteArray_GET_SIZE(frames);
        if (PyByteArray_Resize(frames, at + HEADER_BYTES + nbytes) < 0) {
            return -1;
        }
        unsigned char *h = (unsigned char *)PyByteArray_AS_STRING(frames) + at;
        write_result_header(h, job, chunk, rounds, (uint32_t)nbytes);
        memcpy(h + HEADER_BYTES, weights->buf, (size_t)nbytes);
        return 0;
    }
    PyObject *header = PyBytes_FromStringAndSize(NULL, HEADER_BYTES);
    if (header == NULL) {
        return -1;
    }
    write_result_header((unsigned char *)PyBytes_AS_STRING(header), job, chunk, rounds, (uint32_t)nbytes);
    int status = PyList_Append(list, header) < 0 || PyList_Append(list, view) < 0 ? -1 : 0;
    Py_DECREF(header);
    return status;
}

/* Finish a completed round of `state` (chunk `cid` on `lane`, after `rounds` rounds) as
 * JobState.finish_round and TcpServerPath.send_result would, if this loop can: the optimizer pass
 * over `nbytes` of the weights with the sum `acc` + `last` (`last` NULL: `acc` alone, one
 * worker), the bookkeeping, and the RESULT frame on parts[lane]. `opt`: the lane's optimizer, one
 * this loop runs. 1 done, 0 left to Python (nothing changed), -1 error. */
static int
finish_round_of(PyObject *state, PyObject *lane, long long cid, long long rounds, const float *acc,
                const float *last, Py_ssize_t nbytes, uint32_t job, const fast_optimizer *optimizer, PyObject *parts)
{
    const fast_optimizer opt = *optimizer;
    PyObject *mom_obj = NULL, *weight_obj = NULL, *view = NULL, *shown = NULL;
    Py_buffer w = {0}, m = {0};
    int done = -1;
    if ((mom_obj = get_field(state, ST_MOM)) == NULL || (view = get_field(state, ST_WEIGHT_VIEW)) == NULL ||
        (shown = get_field(state, ST_RESULT_VIEW)) == NULL) {
        goto out;
    }
    const int needs_mom = opt.needs_mom;
    if ((needs_mom && mom_obj == Py_None) || shown != view) {
        done = 0; /* its first round (momentum to allocate) or a result of its own: finish_round */
        goto out;
    }
    if ((weight_obj = get_field(state, ST_WEIGHT)) == NULL || get_floats(weight_obj, nbytes, &w) < 0 ||
        (needs_mom && get_floats(mom_obj, nbytes, &m) < 0)) {
        goto out;
    }
    const Py_ssize_t n = nbytes / (Py_ssize_t)sizeof(float);
    float *mom = needs_mom ? (float *)m.buf : NULL;
    if (opt.kind == OPT_NAG) {
        nag_pass((float *)w.buf, mom, acc, last, n, opt.lr, opt.mu, opt.wd, opt.rescale, opt.clip);
    } else {
        sgd_pass((float *)w.buf, mom, acc, last, n, opt.lr, opt.mu, opt.wd, opt.rescale, opt.clip);
    }
    if (set_int(state, ST_ROUNDS, rounds + 1) < 0 || set_int(state, ST_ARRIVED, 0) < 0 ||
        set_int(state, ST_MASK, 0) < 0 ||
        queue_result(parts, lane, job, (uint32_t)cid, (uint32_t)(rounds + 1), &w, view) < 0) {
        goto out;
    }
    done = 1;
out:
    release_acquired(&w);
    release_acquired(&m);
    Py_XDECREF(mom_obj);
    Py_XDECREF(weight_obj);
    Py_XDECREF(view);
    Py_XDECREF(shown);
    return done;
}

/* Finish the round that the push at `payload` completes, reading that push where it landed in
 * the staging buffer (finish_round_of): the sum is the other workers' copies (slots[first], the
 * rank whose copy came first, with two workers; the state's acc with more) and this one. 1 done,
 * 0 left to the usual path (nothing changed), -1 error. */
static int
finish_in_place(PyObject *state, PyObject *slots, long long first, long long num_workers, const unsigned char *payload,
                Py_ssize_t nbytes, long long rounds, uint32_t chunk, PyObject *lane, uint32_t job,
                const fast_optimizer *opt, PyObject *parts)
{
    const float *mine = (const float *)payload;
    if (num_workers == 1) {
        return finish_round_of(state, lane, chunk, rounds, mine, NULL, nbytes, job, opt, parts);
    }
    PyObject *acc_obj = num_workers == 2 ? Py_NewRef(PyList_GET_ITEM(slots, first)) : get_field(state, ST_ACC);
    Py_buffer acc;
    int status = acc_obj == NULL ? -1 : get_floats(acc_obj, nbytes, &acc);
    Py_XDECREF(acc_obj);
    if (status < 0) {
        return -1;
    }
    status = finish_round_of(state, lane, chunk, rounds, (const float *)acc.buf, mine, nbytes, job, opt, parts);
    PyBuffer_Release(&acc);
    return status;
}

#endif /* PHUB_FASTPATH_ROUNDS_H */
