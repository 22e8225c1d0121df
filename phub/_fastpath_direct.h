/*
 * phub._fastpath, continued: the worker's direct reader, `recv_results`. Where drain_results
 * walks the frames a staged link read in large reads (and copies each payload out of the staging
 * buffer), this one reads the connection itself, frame by frame: each payload straight into the
 * caller's output array, together with the next frame's header; one system call per frame and no
 * copy in user space. The system call per frame only pays off for large chunks (see
 * links.DIRECT_MIN_BYTES). A server core keeps its staged reads: there a round's last copy
 * is never copied anyway, and reading each push by itself measured slower (docs/data-path-log.md).
 * Included by _fastpath.c, after the helpers it uses.
 *
 * A link's reading position lives in its `cursor` (a bytearray of CURSOR_BYTES, see
 * links.DirectLink): how much of the current frame's header and payload is in, the header,
 * and room for the next header. Every time a payload is (re)entered its header is checked again,
 * and its place looked up again, so nothing but bytes is kept between calls.
 */
#ifndef PHUB_FASTPATH_DIRECT_H
#define PHUB_FASTPATH_DIRECT_H

#include <errno.h>
#include <sys/uio.h>

typedef struct {
    uint32_t header_got, payload_got;
    unsigned char header[HEADER_BYTES], next[HEADER_BYTES];
} read_cursor;

#define CURSOR_BYTES ((Py_ssize_t)sizeof(read_cursor))

/* What recv_results returns (links.DirectLink names them): */
enum {
    READ_WOULD_BLOCK = 0, /* everything the socket had is handled */
    READ_FOREIGN = 1,     /* a frame this reader does not take: its header is in the cursor */
    READ_CLOSED = 2,      /* the peer closed the connection (the cursor says whether mid-frame) */
    READ_STALE = 3,       /* the frame being read stopped being expected mid-way (its header is there) */
};

/* One read: the header's missing bytes, or the payload's (into `dest`, `length` bytes in all)
 * and the next header. Bytes read, 0 at EOF, -1 when it would block; -2 with an OSError set. */
static Py_ssize_t
read_some(int fd, read_cursor *c, char *dest, uint32_t length)
{
    struct iovec iov[2];
    int parts = 1;
    if (c->header_got < HEADER_BYTES) {
        iov[0].iov_base = c->header + c->header_got;
        iov[0].iov_len = HEADER_BYTES - c->header_got;
    } else {
        iov[0].iov_base = dest + c->payload_got;
        iov[0].iov_len = length - c->payload_got;
        iov[1].iov_base = c->next;
        iov[1].iov_len = HEADER_BYTES;
        parts = 2;
    }
    Py_ssize_t n;
    do {
        n = readv(fd, iov, parts);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return -1;
        }
        PyErr_SetFromErrno(PyExc_OSError);
        return -2;
    }
    return n;
}

/* Account for `n` payload bytes read by read_some; 1 when they complete the payload (the next
 * header's first bytes, if any came with it, become the current header), else 0. */
static int
payload_read(read_cursor *c, Py_ssize_t n, uint32_t length)
{
    const Py_ssize_t rest = (Py_ssize_t)(length - c->payload_got);
    if (n < rest) {
        c->payload_got += (uint32_t)n;
        return 0;
    }
    c->header_got = (uint32_t)(n - rest);
    c->payload_got = 0;
    memcpy(c->header, c->next, c->header_got);
    return 1;
}

/* Read the current frame's header to its end; READ_* code to return, or -1 to go on (header in). */
static int
read_header(int fd, read_cursor *c)
{
    while (c->header_got < HEADER_BYTES) {
        Py_ssize_t n = read_some(fd, c, NULL, 0);
        if (n < 0) {
            return n == -1 ? READ_WOULD_BLOCK : -2;
        }
        if (n == 0) {
            return READ_CLOSED;
        }
        c->header_got += (uint32_t)n;
    }
    return -1;
}

/* A frame this reader does not take (or no longer expects): leave its header for Python. */
static int
hand_over(read_cursor *c)
{
    int stale = c->payload_got > 0;
    if (!stale) {
        c->header_got = 0; /* Python feeds the header to the link's FrameReceiver */
    }
    return stale ? READ_STALE : READ_FOREIGN;
}

static read_cursor *
get_cursor(Py_buffer *view)
{
    if (view->len != CURSOR_BYTES) {
        PyErr_Format(PyExc_ValueError, "a read cursor has %zd bytes, not %zd", view->len, CURSOR_BYTES);
        return NULL;
    }
    return (read_cursor *)view->buf;
}

PyDoc_STRVAR(recv_results_doc,
"recv_results(fd, cursor, job, lane, table, expect)\n--\n\n"
"The worker's direct reader: read one lane's RESULT frames straight into the caller's arrays, as\n"
"drain_results takes them from a staging buffer (the same checks; `expect` loses each entry and\n"
"its handle is told with _arrived(count), as there), until the socket has nothing more.\n"
"Returns 0: it would block; 1: a frame it does not take (its header is in the cursor); 2: the\n"
"peer closed the connection; 3: the result being read stopped being expected.");

static PyObject *
fp_recv_results(PyObject *self, PyObject *args)
{
    Py_buffer cursor_view, table;
    int fd, lane;
    unsigned int job;
    PyObject *expect;
    if (ensure_contract() < 0 || !PyArg_ParseTuple(args, "iw*Iiy*O!:recv_results", &fd, &cursor_view, &job, &lane,
                                                   &table, &PyDict_Type, &expect)) {
        return NULL;
    }
    int code = -2;
    arrivals landed = {NULL, 0};
    read_cursor *c = get_cursor(&cursor_view);
    if (c == NULL) {
        goto done;
    }
    const Py_ssize_t chunks = chunk_table_rows(&table, "recv_results");
    if (chunks < 0) {
        goto done;
    }
    const int32_t *rows = (const int32_t *)table.buf;
    for (;;) {
        if ((code = read_header(fd, c)) != -1) {
            break;
        }
        const unsigned char *h = c->header;
        uint32_t chunk = le32(h + 16), iteration = le32(h + 20), length = le32(h + 24);
        if (!result_for_lane(h, job, lane, rows, chunks)) {
            code = hand_over(c);
            break;
        }
        PyObject *key = PyLong_FromUnsignedLong(chunk);
        if (key == NULL) {
            code = -2;
            break;
        }
        PyObject *entry = expected_result(expect, key, iteration);
        if (entry == NULL) {
            Py_DECREF(key);
            code = PyErr_Occurred() ? -2 : hand_over(c); /* unexpected: the Python path names it */
            break;
        }
        Py_buffer dest;
        Py_ssize_t n = -2;
        if (get_floats(entry_destination(entry), (Py_ssize_t)length, &dest) == 0) {
            n = read_some(fd, c, (char *)dest.buf, length);
            PyBuffer_Release(&dest);
        }
        int status = n > 0 && payload_read(c, n, length) ? result_landed(expect, key, entry, &landed) : 0;
        Py_DECREF(entry);
        Py_DECREF(key);
        if (n <= 0 || status < 0) {
            code = n == 0 ? READ_CLOSED : n == -1 ? READ_WOULD_BLOCK : -2;
            break;
        }
    }
done:
    if (tell_arrivals_on_exit(&landed) < 0) {
        code = -2;
    }
    PyBuffer_Release(&cursor_view);
    PyBuffer_Release(&table);
    return code == -2 ? NULL : PyLong_FromLong(code);
}

#endif /* PHUB_FASTPATH_DIRECT_H */
