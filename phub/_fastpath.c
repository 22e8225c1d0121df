/*
 * phub._fastpath: the per-chunk loops of a server core and of a worker, in C.
 *
 * A server core reads a worker's connection in large reads into a staging buffer (see
 * StagedLink in phub/network/links.py). `drain_pushes` walks the frames in it and, for every
 * well-formed PUSH that belongs on this connection now, does what JobState.push_target and
 * JobState.on_push do in Python: copy the payload into the worker's slot, fold it into the
 * chunk's merge buffer, and when the round is complete hand (state, acc, last) back for the
 * optimizer and the results (the round's last copy is not copied at all: `last` is a view of it
 * in the staging buffer). It stops at the first frame it does not handle in full (any other
 * kind, a wrong field, a push out of turn, or bytes still missing) and leaves that frame to the
 * Python path, which raises the same errors as always. So this file holds no protocol rule that
 * Python does not also check; it only takes the common case off the interpreter.
 *
 * The round state stays in the Python ChunkState objects (rounds, arrived, mask), so the rest of
 * the server (stall checks, failures, the pure-Python path) sees one truth. Every Python field the
 * loops read or write (ChunkState's slots, the tables' columns, the positions in the tuples they
 * read and build) is reached through the round contract (_fastpath_contract.h), a table filled
 * once at import by phub/network/fastpath_contract.py, which lists every field, its type and its owner.
 * The folds are the same float32 operations in the same order as JobState.on_push with the
 * kernels of phub/_fastkernels.c (a + b, then + c, ...), so results are bit-identical to the Python
 * path.
 *
 * Given the lane's optimizers and a dict for the frames (a job on one rack whose lane runs NAG
 * or SGD), `drain_pushes` also finishes the rounds it completes as JobState.finish_round and
 * TcpServerPath.send_result do (_fastpath_rounds.h): the optimizer pass (the loops of _fastkernels.h,
 * as the kernels the Python path calls) straight from the round's last copy where it landed, the
 * round's bookkeeping, and the RESULT frames, queued per lane for the caller to send. Any other
 * round (a chunk's first, whose momentum Python allocates) it hands back as above.
 *
 * On a rack's server (two-phase reduction), `rack_rounds_done` and `drain_rack_frames`
 * (_fastpath_racks.h) take the cross-rack part of those rounds: partials to the owner rack, its
 * sum over the racks, the totals back, and the rounds finished as above.
 *
 * `drain_results` is the worker's counterpart: the RESULT frames of one lane, copied into the
 * caller's output arrays, the same checks as WorkerProtocol.payload_target (protocol/worker.py),
 * the rest left to Python.
 * `recv_results` (_fastpath_direct.h) does the same reading the connection itself, each payload
 * straight into its array, for large chunks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define HEADER_BYTES 32
#define KIND_PUSH 7
#define KIND_RESULT 8
#define SERVER_SENDER 0xFFFFFFFFu

static inline uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Whether the header at h starts a frame of `kind` from `sender` in `job` (magic, version, kind,
 * job, sender: the fields both loops check alike; each checks chunk, iteration and length itself). */
static inline int
frame_from(const unsigned char *h, int kind, uint32_t job, uint32_t sender)
{
    return memcmp(h, "PHUB", 4) == 0 && h[4] == 1 && h[5] == kind && le32(h + 8) == job && le32(h + 12) == sender;
}

#include "_fastpath_contract.h"

/* The address of slot `st` of `state` when it is exactly a ChunkState (the registered class), or
 * NULL: a subclass's, or any other object's, attributes are looked up by name as always. Reading
 * the slot in place skips the attribute lookup through the type, which cost more than the rest of
 * a push's bookkeeping at small chunks. */
static inline PyObject **
state_slot(PyObject *state, int st)
{
    if (Py_TYPE(state) != contract.chunk_state) {
        return NULL;
    }
    return (PyObject **)((char *)state + contract.state[st]);
}

/* state.<field st> as a new reference, or NULL with an exception set. */
static PyObject *
get_field(PyObject *state, int st)
{
    PyObject **slot = state_slot(state, st);
    if (slot == NULL) {
        return PyObject_GetAttr(state, field_names[st]);
    }
    if (*slot == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%U'", Py_TYPE(state)->tp_name,
                     field_names[st]);
        return NULL;
    }
    return Py_NewRef(*slot);
}

/* state.<field st> = value; 0, or -1 with an exception set. */
static int
set_field(PyObject *state, int st, PyObject *value)
{
    PyObject **slot = state_slot(state, st);
    if (slot == NULL) {
        return PyObject_SetAttr(state, field_names[st], value);
    }
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

/* An int (a Python int converted), or -1 with an exception set; steals `value`. */
static long long
as_int(PyObject *value)
{
    if (value == NULL) {
        return -1;
    }
    long long result = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return result;
}

/* An int field of a ChunkState, or -1 with an exception set. */
static long long
get_int(PyObject *state, int st)
{
    return as_int(get_field(state, st));
}

static int
set_int(PyObject *state, int st, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return -1;
    }
    int status = set_field(state, st, number);
    Py_DECREF(number);
    return status;
}

/* A round's arrival mask (ChunkState.mask: bit r set when rank r's copy is in) is a Python int
 * as wide as the job. A job of up to NARROW_WORKERS workers keeps it in a long long; a wider one
 * (the configuration allows thousands of workers) is read and written as the int it is, with the
 * three operations below: slower per push, but the same arithmetic as aggregation.py's. */
#define NARROW_WORKERS 63

/* Whether bit `rank` of the wide mask `mask` is set: 1 or 0, -1 with an exception set. */
static int
wide_mask_has(PyObject *mask, long long rank)
{
    PyObject *shift = PyLong_FromLongLong(rank), *shifted = NULL;
    if (shift == NULL || (shifted = PyNumber_Rshift(mask, shift)) == NULL) {
        Py_XDECREF(shift);
        return -1;
    }
    Py_DECREF(shift);
    unsigned long long low = PyLong_AsUnsignedLongLongMask(shifted); /* its low bits */
    Py_DECREF(shifted);
    return low == (unsigned long long)-1 && PyErr_Occurred() ? -1 : (int)(low & 1);
}

/* The wide mask `mask` with bit `rank` set, as a new reference (NULL with an exception set). */
static PyObject *
wide_mask_with(PyObject *mask, long long rank)
{
    PyObject *one = PyLong_FromLong(1), *shift = PyLong_FromLongLong(rank), *bit = NULL, *result = NULL;
    if (one != NULL && shift != NULL && (bit = PyNumber_Lshift(one, shift)) != NULL) {
        result = PyNumber_Or(mask, bit);
    }
    Py_XDECREF(one);
    Py_XDECREF(shift);
    Py_XDECREF(bit);
    return result;
}

/* The rank whose copy arrived first in a round whose arrival mask is `mask` (the only bit set
 * before the second copy): its index, as aggregation.py's mask.bit_length() - 1. */
static inline long long
first_arrival(long long mask)
{
    return 63 - __builtin_clzll((unsigned long long)mask);
}

/* first_arrival of a wide mask; -1 with an exception set. */
static long long
wide_first_arrival(PyObject *mask)
{
    PyObject *bits = PyObject_CallMethod(mask, "bit_length", NULL);
    if (bits == NULL) {
        return -1;
    }
    long long first = PyLong_AsLongLong(bits) - 1;
    Py_DECREF(bits);
    return first;
}

/* What a push of `rank` needs from its chunk's arrival mask, `arrived` copies being in: whether
 * rank's copy is in already (*taken), the rank whose copy came first when one is in (*first),
 * and a narrow job's mask itself (*narrow, for add_arrival). 0, or -1 with an exception set. */
static int
read_arrivals(PyObject *state, long long rank, long long arrived, int wide, int *taken, long long *first,
              long long *narrow)
{
    *first = -1;
    if (!wide) {
        long long mask = *narrow = get_int(state, ST_MASK);
        if (mask < 0) {
            return -1;
        }
        *taken = (int)(mask >> rank & 1);
        if (arrived == 1) {
            *first = first_arrival(mask);
        }
        return 0;
    }
    PyObject *mask = get_field(state, ST_MASK);
    if (mask == NULL || (*taken = wide_mask_has(mask, rank)) < 0 ||
        (arrived == 1 && (*first = wide_first_arrival(mask)) < 0)) {
        Py_XDECREF(mask);
        return -1;
    }
    Py_DECREF(mask);
    return 0;
}

/* Mark rank's copy in: set bit `rank` of the chunk's arrival mask (`narrow`: a narrow job's mask,
 * as read_arrivals read it). 0, or -1 with an exception set. */
static int
add_arrival(PyObject *state, long long rank, int wide, long long narrow)
{
    if (!wide) {
        return set_int(state, ST_MASK, narrow | 1LL << rank);
    }
    PyObject *mask = get_field(state, ST_MASK), *with = mask == NULL ? NULL : wide_mask_with(mask, rank);
    int status = with == NULL ? -1 : set_field(state, ST_MASK, with);
    Py_XDECREF(mask);
    Py_XDECREF(with);
    return status;
}

/* A writable float32 view of exactly `nbytes` bytes; -1 with an exception set otherwise. */
static int
get_floats(PyObject *array, Py_ssize_t nbytes, Py_buffer *view)
{
    if (PyObject_GetBuffer(array, view, PyBUF_WRITABLE) < 0) {
        return -1;
    }
    if (view->len != nbytes) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_AssertionError, "a chunk buffer has %zd bytes, the table says %zd", view->len, nbytes);
        return -1;
    }
    return 0;
}

#include "_fastpath_rounds.h"

/* Fold one landed push (`mine`: slots[rank], or the payload in the staging buffer when it
 * completes the round) into its chunk; append to `completed` when the round is complete.
 * `first_rank`: the rank whose copy came first this round (read only when this push is the
 * second). Mirrors JobState.on_push. Returns -1 with an exception set on failure. */
static int
fold(PyObject *state, PyObject *slots, PyObject *mine, long long first_rank, long long arrived,
     long long num_workers, Py_ssize_t nbytes, PyObject *completed)
{
    if (arrived == num_workers) {
        PyObject *acc, *last = mine;
        if (arrived == 1) {
            acc = mine;
            last = Py_None;
        } else if (arrived == 2) {
            acc = PyList_GET_ITEM(slots, first_rank);
        } else {
            acc = get_field(state, ST_ACC);
            if (acc == NULL) {
                return -1;
            }
            Py_DECREF(acc); /* the state keeps it alive */
        }
        PyObject *item = PyTuple_New(contract.local_round.width);
        if (item == NULL) {
            return -1;
        }
        PyTuple_SET_ITEM(item, contract.local_round.state, Py_NewRef(state));
        PyTuple_SET_ITEM(item, contract.local_round.acc, Py_NewRef(acc));
        PyTuple_SET_ITEM(item, contract.local_round.last, Py_NewRef(last));
        int status = PyList_Append(completed, item);
        Py_DECREF(item);
        return status;
    }
    if (arrived < 2) {
        return 0; /* the first copy waits in its slot (see aggregation.py) */
    }
    PyObject *acc_obj = get_field(state, ST_ACC);
    if (acc_obj == NULL) {
        return -1;
    }
    Py_buffer acc, src, first;
    int status = get_floats(acc_obj, nbytes, &acc);
    Py_DECREF(acc_obj);
    if (status < 0) {
        return -1;
    }
    if (get_floats(mine, nbytes, &src) < 0) {
        PyBuffer_Release(&acc);
        return -1;
    }
    float *a = (float *)acc.buf;
    const float *s = (const float *)src.buf;
    const Py_ssize_t n = nbytes / (Py_ssize_t)sizeof(float);
    if (arrived == 2) { /* acc = first + second, as scale(acc, first, second, 1.0) */
        if (get_floats(PyList_GET_ITEM(slots, first_rank), nbytes, &first) < 0) {
            PyBuffer_Release(&acc);
            PyBuffer_Release(&src);
            return -1;
        }
        const float *f = (const float *)first.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            a[i] = (f[i] + s[i]) * 1.0f;
        }
        PyBuffer_Release(&first);
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            a[i] = a[i] + s[i];
        }
    }
    PyBuffer_Release(&acc);
    PyBuffer_Release(&src);
    return 0;
}

PyDoc_STRVAR(drain_pushes_doc,
"drain_pushes(staging, start, end, job, sender, lane, rank, num_workers, table, states, completed,\n"
"             optimizers=None, parts=None)\n--\n\n"
"Handle the complete, in-turn PUSH frames of one worker connection found in staging[start:end].\n"
"Returns (offset, stopped_at_frame): the offset of the first byte not consumed, and whether a\n"
"frame this loop does not handle starts there (False: the bytes there are an incomplete frame).\n"
"`table` is the job's int32 fast_table [lane, payload bytes, ready]; `states` the list of\n"
"ChunkState by chunk id. With `optimizers` (JobState.loop_optimizers) and `parts` (a dict), a\n"
"round it completes on a lane that runs NAG or SGD is finished here, as JobState.finish_round and\n"
"TcpServerPath.send_result would: the RESULT frames go on parts[lane], a small one copied onto a\n"
"bytearray, a larger one as header and weights view. Every other completed round is appended\n"
"to `completed` as (state, acc, last), where the round's last copy may be a view of staging:\n"
"finish them before staging changes.");

static PyObject *
fp_drain_pushes(PyObject *self, PyObject *args)
{
    Py_buffer staging, table;
    Py_ssize_t start, end;
    unsigned int job, sender;
    int lane;
    long long rank, num_workers;
    PyObject *states, *completed, *optimizers = Py_None, *parts = Py_None;
    PyObject *staging_obj = PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0) : NULL;
    if (ensure_contract() < 0 ||
        !PyArg_ParseTuple(args, "w*nnIIiLLy*O!O!|OO:drain_pushes", &staging, &start, &end, &job, &sender,
                          &lane, &rank, &num_workers, &table, &PyList_Type, &states, &PyList_Type,
                          &completed, &optimizers, &parts)) {
        return NULL;
    }
    PyObject *result = NULL, *staging_view = NULL; /* a memoryview of staging, made on first use */
    /* The lane's optimizer, when this call finishes the rounds it completes (see finish_in_place) */
    PyObject *lane_key = NULL;
    fast_optimizer optimizer;
    int finishing = 0; /* 1 when the lane runs an optimizer this loop runs */
    if (optimizers != Py_None || parts != Py_None) {
        if (!PyDict_Check(optimizers) || !PyDict_Check(parts)) {
            PyErr_SetString(PyExc_TypeError, "drain_pushes: optimizers and parts must both be dicts");
            goto done;
        }
        if ((lane_key = PyLong_FromLong(lane)) == NULL) {
            goto done;
        }
        PyObject *params = PyDict_GetItemWithError(optimizers, lane_key); /* borrowed */
        finishing = params == NULL ? (PyErr_Occurred() ? -1 : 0) : parse_optimizer(params, &optimizer);
        if (finishing < 0) {
            goto done;
        }
    }
    int stopped_at_frame = 0;
    const fast_table_layout columns = contract.fast_table;
    if (start < 0 || end > staging.len || start > end || table.len % (columns.width * 4) != 0 ||
        rank < 0 || rank >= num_workers) {
        PyErr_SetString(PyExc_ValueError, "drain_pushes: inconsistent arguments");
        goto done;
    }
    const int wide = num_workers > NARROW_WORKERS; /* the arrival masks are wider than a long long */
    const unsigned char *base = (const unsigned char *)staging.buf;
    const int32_t *rows = (const int32_t *)table.buf;
    const Py_ssize_t chunks = table.len / (columns.width * 4);
    const Py_ssize_t listed = PyList_GET_SIZE(states);
    while (end - start >= HEADER_BYTES) {
        const unsigned char *h = base + start;
        /* magic, version, kind, flags, job, sender, chunk, iteration, length, reserved */
        uint32_t chunk = le32(h + 16), iteration = le32(h + 20), length = le32(h + 24);
        if (!frame_from(h, KIND_PUSH, job, sender) || chunk >= (uint32_t)chunks || chunk >= (uint32_t)listed) {
            stopped_at_frame = 1;
            break;
        }
        const int32_t *row = rows + (Py_ssize_t)chunk * columns.width;
        if (row[columns.lane] != lane || row[columns.ready] != 1 || (uint32_t)row[columns.nbytes] != length) {
            stopped_at_frame = 1;
            break;
        }
        if (end - start - HEADER_BYTES < (Py_ssize_t)length) {
            break; /* the payload is not all here yet */
        }
        PyObject *state = PyList_GET_ITEM(states, chunk);
        long long rounds = get_int(state, ST_ROUNDS);
        long long arrived = rounds < 0 ? -1 : get_int(state, ST_ARRIVED);
        int taken;
        long long first, mask = 0;
        if (arrived < 0 || read_arrivals(state, rank, arrived, wide, &taken, &first, &mask) < 0) {
            goto done;
        }
        if ((long long)iteration != rounds + 1 || taken) {
            stopped_at_frame = 1; /* out of turn: the Python path says what is wrong */
            break;
        }
        PyObject *slots = get_field(state, ST_SLOTS);
        if (slots == NULL) {
            goto done;
        }
        if (!PyList_Check(slots) || PyList_GET_SIZE(slots) != num_workers) {
            Py_DECREF(slots);
            PyErr_SetString(PyExc_AssertionError, "drain_pushes: a chunk's slots are not one list entry per worker");
            goto done;
        }
        arrived += 1;
        const int aligned = ((uintptr_t)(h + HEADER_BYTES) & (sizeof(float) - 1)) == 0;
        if (arrived == num_workers && aligned && finishing) {
            int finished = finish_in_place(state, slots, first, num_workers, h + HEADER_BYTES, (Py_ssize_t)length, rounds,
                                           chunk, lane_key, job, &optimizer, parts);
            if (finished != 0) {
                Py_DECREF(slots);
                if (finished < 0) {
                    goto done;
                }
                start += HEADER_BYTES + (Py_ssize_t)length;
                continue;
            }
        }
        PyObject *mine;
        if (arrived == num_workers && aligned) {
            /* The round's last copy: the kernel reads it where it landed, one copy fewer. Safe
             * because the caller finishes the completed rounds before the staging buffer is read
             * into again (see fast_pushes); a control frame of odd length before it leaves the
             * payload unaligned, and then it is copied like the others. */
            if (staging_view == NULL && (staging_view = PyMemoryView_FromObject(staging_obj)) == NULL) {
                Py_DECREF(slots);
                goto done;
            }
            mine = PySequence_GetSlice(staging_view, start + HEADER_BYTES, start + HEADER_BYTES + length);
        } else {
            Py_buffer slot;
            mine = PyList_GET_ITEM(slots, rank);
            Py_INCREF(mine);
            if (get_floats(mine, (Py_ssize_t)length, &slot) < 0) {
                Py_DECREF(mine);
                mine = NULL;
            } else {
                memcpy(slot.buf, h + HEADER_BYTES, length);
                PyBuffer_Release(&slot);
            }
        }
        if (mine == NULL || add_arrival(state, rank, wide, mask) < 0 || set_int(state, ST_ARRIVED, arrived) < 0 ||
            fold(state, slots, mine, first, arrived, num_workers, (Py_ssize_t)length, completed) < 0) {
            Py_XDECREF(mine);
            Py_DECREF(slots);
            goto done;
        }
        Py_DECREF(mine);
        Py_DECREF(slots);
        start += HEADER_BYTES + (Py_ssize_t)length;
    }
    result = Py_BuildValue("nO", start, stopped_at_frame ? Py_True : Py_False);
done:
    Py_XDECREF(staging_view);
    Py_XDECREF(lane_key);
    PyBuffer_Release(&staging);
    PyBuffer_Release(&table);
    return result;
}

/* Whether the header at h is a RESULT of `job` for a chunk of `lane` with the plan's length
 * (`rows`: the worker's int32 chunk_table of `chunks` chunks, see contract.chunk_table): the
 * checks drain_results and recv_results make before they look the result up. */
static inline int
result_for_lane(const unsigned char *h, uint32_t job, int lane, const int32_t *rows, Py_ssize_t chunks)
{
    const chunk_table_layout columns = contract.chunk_table;
    uint32_t chunk = le32(h + 16), length = le32(h + 24);
    if (!frame_from(h, KIND_RESULT, job, SERVER_SENDER) || chunk >= (uint32_t)chunks) {
        return 0;
    }
    const int32_t *row = rows + (Py_ssize_t)chunk * columns.width;
    return row[columns.lane] == lane && (uint32_t)row[columns.nbytes] == length;
}

/* How many chunks the worker's chunk_table `table` lists; -1 with ValueError set when its size
 * is not a whole number of rows (`who`: the loop, for the message). */
static Py_ssize_t
chunk_table_rows(const Py_buffer *table, const char *who)
{
    const Py_ssize_t row_bytes = contract.chunk_table.width * 4;
    if (table->len % row_bytes != 0) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent arguments", who);
        return -1;
    }
    return table->len / row_bytes;
}

/* The client's `expect` entry (chunk id -> an "expect entry" of the contract: destination bytes
 * and the list "awaited" [iteration, handle], in the positions protocol/worker.py declares)
 * awaiting the RESULT of chunk `key` after `iteration` rounds, as a new reference; NULL when
 * none does (with an exception set only when the lookup itself failed). */
static PyObject *
expected_result(PyObject *expect, PyObject *key, uint32_t iteration)
{
    PyObject *entry = PyDict_GetItemWithError(expect, key); /* borrowed */
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != contract.entry.width) {
        return NULL;
    }
    PyObject *awaited = PyTuple_GET_ITEM(entry, contract.entry.awaited);
    if (!PyList_Check(awaited) || PyList_GET_SIZE(awaited) != contract.awaited.width ||
        PyLong_AsLongLong(PyList_GET_ITEM(awaited, contract.awaited.iteration)) != (long long)iteration) {
        return NULL;
    }
    Py_INCREF(entry);
    return entry;
}

/* The destination bytes of an `expect` entry that expected_result returned (borrowed). */
static inline PyObject *
entry_destination(PyObject *entry)
{
    return PyTuple_GET_ITEM(entry, contract.entry.destination);
}

/* Results landed but not yet counted in for their handle: consecutive results mostly belong to
 * one pushpull, which is told once, `count` at a time (a Python call per result cost more than
 * the rest of a small result's handling). Told at the latest before the loop returns. */
typedef struct {
    PyObject *handle; /* a reference of its own: the key's next pushpull may replace it */
    long count;
} arrivals;

/* Tell the handle its results (handle._arrived(count)); 0, or -1 with an exception set. */
static int
tell_arrivals(arrivals *a)
{
    if (a->handle == NULL) {
        return 0;
    }
    PyObject *count = PyLong_FromLong(a->count);
    PyObject *called = count == NULL ? NULL
                                     : PyObject_CallMethodOneArg(a->handle, field_names[FIELD_HANDLE_ARRIVED], count);
    Py_XDECREF(count);
    Py_CLEAR(a->handle);
    Py_XDECREF(called);
    return called == NULL ? -1 : 0;
}

/* What a loop does on its way out: tell what landed, keeping an exception already set (the
 * results are in their arrays either way). -1 when one is set after it. */
static int
tell_arrivals_on_exit(arrivals *a)
{
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    int status = tell_arrivals(a);
    if (type != NULL) {
        PyErr_Clear();
        PyErr_Restore(type, value, trace);
        return -1;
    }
    return status;
}

/* A result is in its destination: drop its `expect` entry and count it in for its handle (what
 * WorkerProtocol.frame_received does). 0, or -1 with an exception set. */
static int
result_landed(PyObject *expect, PyObject *key, PyObject *entry, arrivals *a)
{
    PyObject *handle = PyList_GET_ITEM(PyTuple_GET_ITEM(entry, contract.entry.awaited), contract.awaited.handle);
    if (handle != a->handle) {
        if (tell_arrivals(a) < 0) {
            return -1;
        }
        a->handle = Py_NewRef(handle);
        a->count = 0;
    }
    if (PyDict_DelItem(expect, key) < 0) {
        return -1;
    }
    a->count += 1;
    return 0;
}

PyDoc_STRVAR(drain_results_doc,
"drain_results(staging, start, end, job, lane, table, expect)\n--\n\n"
"The worker's side: copy the complete RESULT frames in staging[start:end] that the client\n"
"expects on this lane into their destinations (what WorkerProtocol.payload_target and\n"
"frame_received do). `table` is the worker's int32 chunk_table [lane, payload bytes]; `expect`\n"
"its dict chunk id -> (destination bytes, [iteration, handle]): an entry is removed and its handle's\n"
"_arrived(count) told what landed, once per run of results of one handle, before it returns.\n"
"Returns (offset, stopped_at_frame) as drain_pushes does.");

static PyObject *
fp_drain_results(PyObject *self, PyObject *args)
{
    Py_buffer staging, table;
    Py_ssize_t start, end;
    unsigned int job;
    int lane;
    PyObject *expect;
    if (ensure_contract() < 0 || !PyArg_ParseTuple(args, "w*nnIiy*O!:drain_results", &staging, &start, &end, &job,
                                                   &lane, &table, &PyDict_Type, &expect)) {
        return NULL;
    }
    PyObject *result = NULL;
    arrivals landed = {NULL, 0};
    int stopped_at_frame = 0;
    const Py_ssize_t chunks = chunk_table_rows(&table, "drain_results");
    if (chunks < 0) {
        goto done;
    }
    if (start < 0 || end > staging.len || start > end) {
        PyErr_SetString(PyExc_ValueError, "drain_results: inconsistent arguments");
        goto done;
    }
    const unsigned char *base = (const unsigned char *)staging.buf;
    const int32_t *rows = (const int32_t *)table.buf;
    while (end - start >= HEADER_BYTES) {
        const unsigned char *h = base + start;
        uint32_t chunk = le32(h + 16), iteration = le32(h + 20), length = le32(h + 24);
        if (!result_for_lane(h, job, lane, rows, chunks)) {
            stopped_at_frame = 1;
            break;
        }
        if (end - start - HEADER_BYTES < (Py_ssize_t)length) {
            break;
        }
        PyObject *key = PyLong_FromUnsignedLong(chunk);
        if (key == NULL) {
            goto done;
        }
        PyObject *entry = expected_result(expect, key, iteration);
        if (entry == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred()) {
                goto done;
            }
            stopped_at_frame = 1; /* unexpected: the Python path names it */
            break;
        }
        Py_buffer dest;
        int status = get_floats(entry_destination(entry), (Py_ssize_t)length, &dest);
        if (status == 0) {
            memcpy(dest.buf, h + HEADER_BYTES, length);
            PyBuffer_Release(&dest);
            status = result_landed(expect, key, entry, &landed);
        }
        Py_DECREF(entry);
        Py_DECREF(key);
        if (status < 0) {
            goto done;
        }
        start += HEADER_BYTES + (Py_ssize_t)length;
    }
    result = Py_BuildValue("nO", start, stopped_at_frame ? Py_True : Py_False);
done:
    if (tell_arrivals_on_exit(&landed) < 0) {
        Py_CLEAR(result);
    }
    PyBuffer_Release(&staging);
    PyBuffer_Release(&table);
    return result;
}

#include "_fastpath_direct.h"
#include "_fastpath_send.h"
#include "_fastpath_racks.h"

static PyMethodDef fp_methods[] = {
    {"drain_pushes", fp_drain_pushes, METH_VARARGS, drain_pushes_doc},
    {"drain_results", fp_drain_results, METH_VARARGS, drain_results_doc},
    {"recv_results", fp_recv_results, METH_VARARGS, recv_results_doc},
    {"register_contract", fp_register_contract, METH_O, register_contract_doc},
    {"contract_fields", fp_contract_fields, METH_NOARGS, contract_fields_doc},
    {"registered_contract", fp_registered_contract, METH_NOARGS, registered_contract_doc},
    {"send_queued", fp_send_queued, METH_VARARGS, send_queued_doc},
    {"rack_rounds_done", fp_rack_rounds_done, METH_VARARGS, rack_rounds_done_doc},
    {"drain_rack_frames", fp_drain_rack_frames, METH_VARARGS, drain_rack_frames_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fp_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "phub._fastpath",
    .m_doc = "The per-chunk loops in C (see phub/network/links.py, StagedLink, and phub/protocol/core.py).",
    .m_size = -1,
    .m_methods = fp_methods,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    if ((s_popleft = PyUnicode_InternFromString("popleft")) == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&fp_module);
    if (module == NULL || contract_init(module) < 0 ||
        PyModule_AddIntConstant(module, "CURSOR_BYTES", CURSOR_BYTES) < 0) {
        Py_XDECREF(module);
        return NULL;
    }
    return module;
}
