/*
 * phub._fastpath, continued: the cross-rack rounds of a rack's server in C (phub/reduction/hierarchy.py
 * says what they are; HierarchicalJobState keeps the state these loops read and write).
 *
 * `rack_rounds_done` takes the local rounds drain_pushes completed on a rack's server, as
 * HierarchicalJobState._local_round_done does: the rack's sum into its partial row, and either
 * the PARTIAL frame to the chunk's owner rack or, on the owner, the sum over every rack once all
 * partials are in. `drain_rack_frames` walks the PARTIAL and TOTAL frames of one link to another
 * rack's server, as partial_target / on_partial / total_target / on_total do. A round whose total
 * is in is finished as drain_pushes finishes one (finish_round_of: the optimizer, the bookkeeping,
 * the RESULT frames), or handed back to Python when that loop cannot (a chunk's first round,
 * another optimizer). The frames to the other racks are queued, copied whole, on one bytearray
 * per rack. Anything these loops do not handle in full (another kind of frame, a field or a turn
 * that is wrong) is left to the Python path, which raises the errors it always raises; the sums
 * are the Python path's float32 operations in its order (rack 0 + rack 1, then + rack 2, ...).
 * The tables' columns and the records these loops read and build are the round contract's
 * (_fastpath_contract.h; phub/network/fastpath_contract.py lists them).
 * Included by _fastpath.c after _fastpath_rounds.h: one translation unit, several files.
 */
#ifndef PHUB_FASTPATH_RACKS_H
#define PHUB_FASTPATH_RACKS_H

#define KIND_PARTIAL 11
#define KIND_TOTAL 16
#define MAX_RACKS 62   /* the arrival bits fit a signed 64-bit int */

/* What every call of the two loops shares: the job's tables and where the work goes. */
typedef struct {
    uint32_t job;
    long long rack, racks;
    const int32_t *table; /* JobState.fast_table, columns as contract.fast_table */
    int64_t *rack_table;  /* HierarchicalJobState.rack_table, columns as contract.rack_table */
    fast_table_layout columns;
    rack_table_layout rack_columns;
    Py_ssize_t chunks;
    PyObject *rack_rows, *states, *optimizers, *results, *out, *completed;
    /* the last lane's optimizer, parsed once per run of chunks of that lane */
    long long cached_lane;
    int cached_finishing;
    fast_optimizer cached_optimizer;
} rack_loop;

static void
write_header(unsigned char *h, int kind, uint32_t job, uint32_t sender, uint32_t chunk, uint32_t iteration,
             uint32_t nbytes)
{
    const uint32_t words[6] = {job, sender, chunk, iteration, nbytes, 0};
    memcpy(h, "PHUB", 4);
    h[4] = 1;
    h[5] = (unsigned char)kind;
    h[6] = h[7] = 0;
    for (int i = 0; i < 6; i++) {
        for (int b = 0; b < 4; b++) {
            h[8 + 4 * i + b] = (unsigned char)(words[i] >> (8 * b));
        }
    }
}

/* Append a whole frame (header and a copy of `payload`) to out[rack], a bytearray made when
 * missing. 0, or -1 with an exception set. */
static int
queue_rack_frame(rack_loop *loop, long long rack, int kind, uint32_t chunk, uint32_t iteration, const float *payload,
                 Py_ssize_t nbytes)
{
    PyObject *key = PyLong_FromLongLong(rack);
    if (key == NULL) {
        return -1;
    }
    PyObject *frames = PyDict_GetItemWithError(loop->out, key); /* borrowed */
    if (frames == NULL) {
        if (PyErr_Occurred() || (frames = PyByteArray_FromStringAndSize(NULL, 0)) == NULL) {
            Py_DECREF(key);
            return -1;
        }
        int status = PyDict_SetItem(loop->out, key, frames);
        Py_DECREF(frames); /* the dict keeps it */
        if (status < 0) {
            Py_DECREF(key);
            return -1;
        }
    }
    Py_DECREF(key);
    if (!PyByteArray_Check(frames)) {
        PyErr_SetString(PyExc_TypeError, "rack loop: out[rack] must be a bytearray");
        return -1;
    }
    const Py_ssize_t at = PyByteArray_GET_SIZE(frames);
    if (PyByteArray_Resize(frames, at + HEADER_BYTES + nbytes) < 0) {
        return -1;
    }
    unsigned char *h = (unsigned char *)PyByteArray_AS_STRING(frames) + at;
    write_header(h, kind, loop->job, (uint32_t)loop->rack, chunk, iteration, (uint32_t)nbytes);
    memcpy(h + HEADER_BYTES, payload, (size_t)nbytes);
    return 0;
}

/* The lane's optimizer, if finish_round_of runs it: 1 yes, 0 no, -1 error. */
static int
lane_optimizer(rack_loop *loop, long long lane, PyObject *lane_key, const fast_optimizer **opt)
{
    if (lane != loop->cached_lane) {
        PyObject *params = PyDict_GetItemWithError(loop->optimizers, lane_key); /* borrowed */
        int finishing = params == NULL ? (PyErr_Occurred() ? -1 : 0) : parse_optimizer(params, &loop->cached_optimizer);
        if (finishing < 0) {
            return -1;
        }
        loop->cached_lane = lane;
        loop->cached_finishing = finishing;
    }
    *opt = &loop->cached_optimizer;
    return loop->cached_finishing;
}

/* Finish the round of chunk `cid` whose total over every rack is row `row` of its rows `block`
 * (`total` points at it): in C when finish_round_of can, else (state, that row) goes to
 * `completed` for JobState.finish_round. 0, or -1 with an exception set. */
static int
finish_total(rack_loop *loop, PyObject *state, uint32_t cid, long long rounds, PyObject *block, Py_ssize_t row,
             const float *total, Py_ssize_t nbytes)
{
    const long long lane = loop->table[(Py_ssize_t)cid * loop->columns.width + loop->columns.lane];
    PyObject *lane_key = PyLong_FromLongLong(lane);
    if (lane_key == NULL) {
        return -1;
    }
    const fast_optimizer *opt;
    int finishing = lane_optimizer(loop, lane, lane_key, &opt), done = 0;
    if (finishing > 0) {
        done = finish_round_of(state, lane_key, cid, rounds, total, NULL, nbytes, loop->job, opt, loop->results);
    }
    Py_DECREF(lane_key);
    if (finishing < 0 || done < 0) {
        return -1;
    }
    if (done) {
        return 0;
    }
    PyObject *total_row = PySequence_GetItem(block, row); /* a view of the row, for Python */
    PyObject *item = total_row == NULL ? NULL : PyTuple_New(contract.rack_total.width);
    if (item != NULL) {
        PyTuple_SET_ITEM(item, contract.rack_total.state, Py_NewRef(state));
        PyTuple_SET_ITEM(item, contract.rack_total.total, Py_NewRef(total_row));
    }
    Py_XDECREF(total_row);
    int status = item == NULL ? -1 : PyList_Append(loop->completed, item);
    Py_XDECREF(item);
    return status;
}

/* The owner, every partial in: add them in rack order into the total (the last row), send it to
 * every other rack and finish the round on it (HierarchicalJobState._try_sum). */
static int
sum_racks(rack_loop *loop, PyObject *state, uint32_t cid, long long rounds, PyObject *block, float *rows,
          Py_ssize_t nbytes)
{
    const Py_ssize_t n = nbytes / (Py_ssize_t)sizeof(float);
    const long long racks = loop->racks;
    float *total = rows + racks * n;
    const float *first = rows, *second = rows + n;
    for (Py_ssize_t i = 0; i < n; i++) {
        total[i] = (first[i] + second[i]) * 1.0f; /* scale(total, rows[0], rows[1], 1.0) */
    }
    for (long long r = 2; r < racks; r++) {
        const float *partial = rows + r * n;
        for (Py_ssize_t i = 0; i < n; i++) {
            total[i] = total[i] + partial[i];
        }
    }
    loop->rack_table[(Py_ssize_t)cid * loop->rack_columns.width + loop->rack_columns.arrived] = 0;
    for (long long r = 0; r < racks; r++) {
        if (r != loop->rack &&
            queue_rack_frame(loop, r, KIND_TOTAL, cid, (uint32_t)(rounds + 1), total, nbytes) < 0) {
            return -1;
        }
    }
    return finish_total(loop, state, cid, rounds, block, (Py_ssize_t)racks, total, nbytes);
}

/* The rows of chunk `cid` (rack_rows[cid]) as a writable buffer of `height` rows of `nbytes`;
 * the block object (borrowed) in *block. 0, or -1 with an exception set. */
static int
chunk_rows(rack_loop *loop, uint32_t cid, Py_ssize_t height, Py_ssize_t nbytes, PyObject **block, Py_buffer *view)
{
    if ((Py_ssize_t)cid >= PyList_GET_SIZE(loop->rack_rows)) {
        PyErr_Format(PyExc_AssertionError, "rack loop: chunk %u has no rows", cid);
        return -1;
    }
    *block = PyList_GET_ITEM(loop->rack_rows, cid);
    return get_floats(*block, height * nbytes, view);
}

static int
parse_loop(rack_loop *loop, unsigned int job, long long rack, long long racks, Py_buffer *table, Py_buffer *rack_table,
           PyObject *rack_rows, PyObject *states, PyObject *optimizers, PyObject *results, PyObject *out,
           PyObject *completed)
{
    const fast_table_layout columns = contract.fast_table;
    const rack_table_layout rack_columns = contract.rack_table;
    if (racks < 2 || racks > MAX_RACKS || rack < 0 || rack >= racks || table->len % (columns.width * 4) != 0 ||
        rack_table->len != table->len / (columns.width * 4) * rack_columns.width * 8 || !PyDict_Check(optimizers) ||
        !PyDict_Check(results) || !PyDict_Check(out)) {
        PyErr_SetString(PyExc_ValueError, "rack loop: inconsistent arguments");
        return -1;
    }
    *loop = (rack_loop){.job = job, .rack = rack, .racks = racks, .table = (const int32_t *)table->buf,
                        .rack_table = (int64_t *)rack_table->buf, .chunks = table->len / (columns.width * 4),
                        .columns = columns, .rack_columns = rack_columns,
                        .rack_rows = rack_rows, .states = states, .optimizers = optimizers, .results = results,
                        .out = out, .completed = completed, .cached_lane = -1};
    return 0;
}

PyDoc_STRVAR(rack_rounds_done_doc,
"rack_rounds_done(local, job, rack, racks, table, rack_table, rack_rows, states, optimizers, results,\n"
"                 out, completed)\n--\n\n"
"The local rounds `local` ((state, acc, last) each, as drain_pushes completes them on a rack's\n"
"server), as HierarchicalJobState._local_round_done: the rack's sum into its partial row, then the\n"
"PARTIAL frame on out[owner] (a bytearray of whole frames per rack) or, on the owner with every\n"
"partial in, the TOTAL frames to every other rack and the round finished. A round finished here\n"
"puts its RESULT frames on results[lane] as drain_pushes does; one it cannot finish goes to\n"
"`completed` as (state, total) for JobState.finish_round. Call it before the staging buffer a\n"
"`last` may view is read into again.");

static PyObject *
fp_rack_rounds_done(PyObject *self, PyObject *args)
{
    PyObject *local, *rack_rows, *states, *optimizers, *results, *out, *completed;
    unsigned int job;
    long long rack, racks;
    Py_buffer table, rack_table;
    if (ensure_contract() < 0 ||
        !PyArg_ParseTuple(args, "O!ILLy*w*O!O!OOOO!:rack_rounds_done", &PyList_Type, &local, &job, &rack, &racks,
                          &table, &rack_table, &PyList_Type, &rack_rows, &PyList_Type, &states, &optimizers, &results,
                          &out, &PyList_Type, &completed)) {
        return NULL;
    }
    rack_loop loop;
    PyObject *result = NULL;
    if (parse_loop(&loop, job, rack, racks, &table, &rack_table, rack_rows, states, optimizers, results, out,
                   completed) < 0) {
        goto done;
    }
    const long long all = (1LL << racks) - 1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(local); k++) {
        PyObject *item = PyList_GET_ITEM(local, k);
        const local_round_layout at = contract.local_round;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != at.width) {
            PyErr_SetString(PyExc_TypeError, "rack_rounds_done: each local round is a tuple as drain_pushes makes");
            goto done;
        }
        PyObject *state = PyTuple_GET_ITEM(item, at.state), *acc_obj = PyTuple_GET_ITEM(item, at.acc);
        PyObject *last_obj = PyTuple_GET_ITEM(item, at.last);
        PyObject *chunk_obj = get_field(state, ST_CHUNK);
        long long cid = chunk_obj == NULL ? -1 : as_int(PyObject_GetAttr(chunk_obj, field_names[FIELD_CHUNK_ID]));
        Py_XDECREF(chunk_obj);
        long long rounds = cid < 0 ? -1 : get_int(state, ST_ROUNDS);
        if (rounds < 0) {
            goto done;
        }
        if (cid >= loop.chunks) {
            PyErr_Format(PyExc_AssertionError, "rack_rounds_done: chunk %lld is not in the table", cid);
            goto done;
        }
        int64_t *entry = loop.rack_table + cid * loop.rack_columns.width;
        const long long owner = entry[loop.rack_columns.owner];
        const Py_ssize_t nbytes = loop.table[cid * loop.columns.width + loop.columns.nbytes];
        const int owns = owner == rack;
        PyObject *block;
        Py_buffer rows_view, acc = {0}, last = {0};
        if (owner < 0 || owner >= racks) {
            PyErr_Format(PyExc_AssertionError, "rack_rounds_done: chunk %lld has no owner rack here", cid);
            goto done;
        }
        if (chunk_rows(&loop, (uint32_t)cid, owns ? racks + 1 : 2, nbytes, &block, &rows_view) < 0) {
            goto done;
        }
        if (get_floats(acc_obj, nbytes, &acc) < 0 || (last_obj != Py_None && get_floats(last_obj, nbytes, &last) < 0)) {
            release_acquired(&acc);
            PyBuffer_Release(&rows_view);
            goto done;
        }
        float *rows = (float *)rows_view.buf;
        float *mine = rows + (owns ? rack : 0) * (nbytes / (Py_ssize_t)sizeof(float));
        const float *a = (const float *)acc.buf, *l = (const float *)last.buf;
        const Py_ssize_t n = nbytes / (Py_ssize_t)sizeof(float);
        if (l != NULL) {
            for (Py_ssize_t i = 0; i < n; i++) {
                mine[i] = (a[i] + l[i]) * 1.0f; /* scale(row, acc, last, 1.0): the rack's sum */
            }
        } else {
            for (Py_ssize_t i = 0; i < n; i++) {
                mine[i] = a[i] * 1.0f;
            }
        }
        PyBuffer_Release(&acc);
        release_acquired(&last);
        const long long bits = entry[loop.rack_columns.arrived] | 1LL << rack;
        entry[loop.rack_columns.arrived] = bits;
        int status = 0;
        if (!owns) {
            status = queue_rack_frame(&loop, owner, KIND_PARTIAL, (uint32_t)cid, (uint32_t)(rounds + 1), mine, nbytes);
        } else if (bits == all) {
            status = sum_racks(&loop, state, (uint32_t)cid, rounds, block, rows, nbytes);
        }
        PyBuffer_Release(&rows_view);
        if (status < 0) {
            goto done;
        }
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&rack_table);
    return result;
}

PyDoc_STRVAR(drain_rack_frames_doc,
"drain_rack_frames(staging, start, end, job, rack, from_rack, racks, interface, table, rack_table,\n"
"                  rack_rows, states, optimizers, results, out, completed)\n--\n\n"
"Handle the complete, in-turn PARTIAL and TOTAL frames in staging[start:end], read from the link\n"
"to rack `from_rack`'s server on `interface`, as the Python path would (see rack_rounds_done for\n"
"where the work goes). Returns (offset, stopped_at_frame) as drain_pushes does.");

static PyObject *
fp_drain_rack_frames(PyObject *self, PyObject *args)
{
    Py_buffer staging, table, rack_table;
    Py_ssize_t start, end;
    unsigned int job;
    long long rack, from_rack, racks, interface;
    PyObject *rack_rows, *states, *optimizers, *results, *out, *completed;
    if (ensure_contract() < 0 ||
        !PyArg_ParseTuple(args, "y*nnILLLLy*w*O!O!OOOO!:drain_rack_frames", &staging, &start, &end, &job, &rack,
                          &from_rack, &racks, &interface, &table, &rack_table, &PyList_Type, &rack_rows, &PyList_Type,
                          &states, &optimizers, &results, &out, &PyList_Type, &completed)) {
        return NULL;
    }
    rack_loop loop;
    PyObject *result = NULL;
    int stopped_at_frame = 0;
    if (parse_loop(&loop, job, rack, racks, &table, &rack_table, rack_rows, states, optimizers, results, out,
                   completed) < 0) {
        goto done;
    }
    if (start < 0 || end > staging.len || start > end || from_rack < 0 || from_rack >= racks || from_rack == rack) {
        PyErr_SetString(PyExc_ValueError, "drain_rack_frames: inconsistent arguments");
        goto done;
    }
    const long long all = (1LL << racks) - 1;
    const Py_ssize_t listed = PyList_GET_SIZE(states);
    const unsigned char *base = (const unsigned char *)staging.buf;
    while (end - start >= HEADER_BYTES) {
        const unsigned char *h = base + start;
        uint32_t chunk = le32(h + 16), iteration = le32(h + 20), length = le32(h + 24);
        const int kind = h[5];
        if ((kind != KIND_PARTIAL && kind != KIND_TOTAL) || !frame_from(h, kind, job, (uint32_t)from_rack) ||
            chunk >= (uint32_t)loop.chunks || chunk >= (uint32_t)listed) {
            stopped_at_frame = 1;
            break;
        }
        const fast_table_layout columns = loop.columns;
        const rack_table_layout rack_columns = loop.rack_columns;
        const int32_t *row = loop.table + (Py_ssize_t)chunk * columns.width;
        int64_t *entry = loop.rack_table + (Py_ssize_t)chunk * rack_columns.width;
        const long long owner = entry[rack_columns.owner], bits = entry[rack_columns.arrived];
        const int in_turn_kind = kind == KIND_PARTIAL ? owner == rack && !(bits >> from_rack & 1)
                                                      : owner == from_rack && (bits >> rack & 1);
        if (row[columns.lane] < 0 || (uint32_t)row[columns.nbytes] != length || owner < 0 ||
            entry[rack_columns.interface] != interface || !in_turn_kind) {
            stopped_at_frame = 1; /* the Python path says what is wrong */
            break;
        }
        if (end - start - HEADER_BYTES < (Py_ssize_t)length) {
            break; /* the payload is not all here yet */
        }
        PyObject *state = PyList_GET_ITEM(states, chunk);
        long long rounds = get_int(state, ST_ROUNDS);
        if (rounds < 0) {
            goto done;
        }
        if ((long long)iteration != rounds + 1) {
            stopped_at_frame = 1;
            break;
        }
        const int owns = owner == rack;
        const Py_ssize_t nbytes = (Py_ssize_t)length, n = nbytes / (Py_ssize_t)sizeof(float);
        PyObject *block;
        Py_buffer rows_view;
        if (chunk_rows(&loop, chunk, owns ? racks + 1 : 2, nbytes, &block, &rows_view) < 0) {
            goto done;
        }
        float *rows = (float *)rows_view.buf;
        int status = 0;
        if (kind == KIND_PARTIAL) { /* partial_target + on_partial */
            memcpy(rows + from_rack * n, h + HEADER_BYTES, (size_t)nbytes);
            entry[rack_columns.arrived] = bits | 1LL << from_rack;
            if (entry[rack_columns.arrived] == all) {
                status = sum_racks(&loop, state, chunk, rounds, block, rows, nbytes);
            }
        } else { /* total_target + on_total */
            memcpy(rows + n, h + HEADER_BYTES, (size_t)nbytes);
            entry[rack_columns.arrived] = 0;
            status = finish_total(&loop, state, chunk, rounds, block, 1, rows + n, nbytes);
        }
        PyBuffer_Release(&rows_view);
        if (status < 0) {
            goto done;
        }
        start += HEADER_BYTES + (Py_ssize_t)length;
    }
    result = Py_BuildValue("nO", start, stopped_at_frame ? Py_True : Py_False);
done:
    PyBuffer_Release(&staging);
    PyBuffer_Release(&table);
    PyBuffer_Release(&rack_table);
    return result;
}

#endif /* PHUB_FASTPATH_RACKS_H */
