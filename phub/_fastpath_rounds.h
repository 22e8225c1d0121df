/*
 * phub._fastpath, continued: `finish_rounds`, which finishes in C the rounds drain_pushes
 * completed (see the top of _fastpath.c). Included by _fastpath.c, after the helpers it uses
 * (get_int, set_int, get_floats, the interned attribute names): one translation unit, two files.
 */
#ifndef PHUB_FASTPATH_ROUNDS_H
#define PHUB_FASTPATH_ROUNDS_H

#include "_kernels.h"

static void
release_acquired(Py_buffer *view)
{
    if (view->obj != NULL) {
        PyBuffer_Release(view);
    }
}

/* An optimizer as JobState.loop_optimizers holds it (Optimizer.loop_params):
 * (kind, needs_momentum, lr, momentum, wd, rescale, clip). */
enum { OPT_NAG = 1, OPT_SGD = 2 };
typedef struct {
    int kind, needs_mom;
    float lr, mu, wd, rescale, clip;
} fast_optimizer;

/* The optimizer parameters parsed last, by the tuple they came from: the rounds of one call
 * mostly share their lane's, and parsing them per round cost more than the rest of a round's
 * bookkeeping at small chunks. */
typedef struct {
    PyObject *params; /* borrowed: `optimizers` holds it for the whole call */
    int usable;
    fast_optimizer opt;
} parsed_optimizer;

/* Parse one; 0 when it is not one this loop runs, -1 with an exception set on a malformed one. */
static int
get_optimizer(PyObject *params, parsed_optimizer *parsed)
{
    if (params == parsed->params) {
        return parsed->usable;
    }
    fast_optimizer *opt = &parsed->opt;
    int usable = params != Py_None;
    if (usable && !PyArg_ParseTuple(params, "ipfffff", &opt->kind, &opt->needs_mom, &opt->lr, &opt->mu, &opt->wd,
                                    &opt->rescale, &opt->clip)) {
        return -1;
    }
    parsed->params = params;
    parsed->usable = usable && (opt->kind == OPT_NAG || opt->kind == OPT_SGD);
    return parsed->usable;
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

/* Finish one completed round if this loop can: 1 done, 0 left to Python, -1 error. */
static int
finish_one(PyObject *item, uint32_t job, PyObject *optimizers, PyObject *parts, parsed_optimizer *parsed)
{
    PyObject *state = PyTuple_GET_ITEM(item, 0), *acc_obj = PyTuple_GET_ITEM(item, 1);
    PyObject *last_obj = PyTuple_GET_ITEM(item, 2);
    PyObject *chunk = NULL, *lane = NULL, *mom_obj = NULL, *weight_obj = NULL, *view = NULL, *shown = NULL;
    Py_buffer w = {0}, m = {0}, a = {0}, l = {0};
    int done = -1;
    if ((chunk = get_attr(state, s_chunk)) == NULL || (lane = PyObject_GetAttr(chunk, s_lane)) == NULL) {
        goto out;
    }
    PyObject *params = PyDict_GetItemWithError(optimizers, lane); /* borrowed */
    int usable = params == NULL ? (PyErr_Occurred() ? -1 : 0) : get_optimizer(params, parsed);
    if (usable <= 0) {
        done = usable;
        goto out;
    }
    const fast_optimizer opt = parsed->opt;
    if ((mom_obj = get_attr(state, s_mom)) == NULL || (view = get_attr(state, s_weight_view)) == NULL ||
        (shown = get_attr(state, s_result_view)) == NULL) {
        goto out;
    }
    const int needs_mom = opt.needs_mom;
    if ((needs_mom && mom_obj == Py_None) || shown != view) {
        done = 0; /* its first round (momentum to allocate) or a result of its own: finish_round */
        goto out;
    }
    long long cid = get_int(chunk, s_id), rounds = cid < 0 ? -1 : get_int(state, s_rounds);
    if (cid < 0 || rounds < 0 || (weight_obj = get_attr(state, s_weight)) == NULL ||
        PyObject_GetBuffer(weight_obj, &w, PyBUF_WRITABLE) < 0) {
        goto out;
    }
    if (get_floats(acc_obj, w.len, &a) < 0 || (last_obj != Py_None && get_floats(last_obj, w.len, &l) < 0) ||
        (needs_mom && get_floats(mom_obj, w.len, &m) < 0)) {
        goto out;
    }
    const Py_ssize_t n = w.len / (Py_ssize_t)sizeof(float);
    float *mom = needs_mom ? (float *)m.buf : NULL;
    const float *last = last_obj != Py_None ? (const float *)l.buf : NULL;
    if (opt.kind == OPT_NAG) {
        nag_pass((float *)w.buf, mom, (const float *)a.buf, last, n, opt.lr, opt.mu, opt.wd, opt.rescale, opt.clip);
    } else {
        sgd_pass((float *)w.buf, mom, (const float *)a.buf, last, n, opt.lr, opt.mu, opt.wd, opt.rescale, opt.clip);
    }
    /* JobState.finish_round's bookkeeping, then TcpServerPath.send_result's frame */
    if (set_int(state, s_rounds, rounds + 1) < 0 || set_int(state, s_arrived, 0) < 0 || set_int(state, s_mask, 0) < 0 ||
        queue_result(parts, lane, job, (uint32_t)cid, (uint32_t)(rounds + 1), &w, view) < 0) {
        goto out;
    }
    done = 1;
out:
    release_acquired(&w);
    release_acquired(&m);
    release_acquired(&a);
    release_acquired(&l);
    Py_XDECREF(chunk);
    Py_XDECREF(lane);
    Py_XDECREF(mom_obj);
    Py_XDECREF(weight_obj);
    Py_XDECREF(view);
    Py_XDECREF(shown);
    return done;
}

PyDoc_STRVAR(finish_rounds_doc,
"finish_rounds(completed, job, optimizers, parts)\n--\n\n"
"Finish the rounds drain_pushes completed (a list of (state, acc, last)) as JobState.finish_round\n"
"and TcpServerPath.send_result would, for every lane whose entry in `optimizers` (lane ->\n"
"Optimizer.loop_params(): kind 1 NAG or 2 SGD, or None) this loop runs: the RESULT frames go on\n"
"parts[lane], a small one copied onto a bytearray, a larger one as header and weights view.\n"
"Returns the rounds left to Python, in order.");

static PyObject *
fp_finish_rounds(PyObject *self, PyObject *args)
{
    PyObject *completed, *optimizers, *parts;
    unsigned int job;
    if (!PyArg_ParseTuple(args, "O!IO!O!:finish_rounds", &PyList_Type, &completed, &job, &PyDict_Type, &optimizers,
                          &PyDict_Type, &parts)) {
        return NULL;
    }
    PyObject *rest = PyList_New(0);
    parsed_optimizer parsed = {NULL, 0, {0}};
    for (Py_ssize_t i = 0; rest != NULL && i < PyList_GET_SIZE(completed); i++) {
        PyObject *item = PyList_GET_ITEM(completed, i);
        int done = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3 ? finish_one(item, job, optimizers, parts, &parsed)
                                                                        : 0;
        if (done < 0 || (done == 0 && PyList_Append(rest, item) < 0)) {
            Py_CLEAR(rest);
        }
    }
    return rest;
}

#endif /* PHUB_FASTPATH_ROUNDS_H */
