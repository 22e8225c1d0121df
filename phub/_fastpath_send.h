/*
 * phub._fastpath, continued: `send_queued`, what links.Link.flush and on_writable do with a
 * link's output queue, without the interpreter per part: gather the parts at the front of the
 * queue into one sendmsg, drop what went, keep the rest of a part cut short. In Python that cost
 * about a microsecond per part (the buffer of each part, the batch's list, the bookkeeping of
 * what was sent), a frame being two parts; `send_queued_python` in network/links.py is the same in Python,
 * the reference the tests compare this with. Included by _fastpath.c.
 */
#ifndef PHUB_FASTPATH_SEND_H
#define PHUB_FASTPATH_SEND_H

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define SEND_PARTS 256 /* parts per sendmsg: 128 frames of header + payload (IOV_MAX is 1024) */

static PyObject *s_popleft;

static void
release_all(Py_buffer *views, int count)
{
    for (int i = 0; i < count; i++) {
        PyBuffer_Release(&views[i]);
    }
}

/* Drop the `sent` bytes at the front of `outq`, whose first `count` parts (`iov`) went to
 * sendmsg; a part sent in part is replaced by a memoryview of its rest. 0 or -1. */
static int
consume_sent(PyObject *outq, const struct iovec *iov, int count, size_t sent)
{
    for (int i = 0; i < count; i++) {
        if (sent < iov[i].iov_len) {
            if (sent == 0) {
                return 0;
            }
            PyObject *head = PySequence_GetItem(outq, 0);
            PyObject *view = head == NULL ? NULL : PyMemoryView_FromObject(head);
            Py_XDECREF(head);
            PyObject *rest = view == NULL ? NULL : PySequence_GetSlice(view, (Py_ssize_t)sent, PY_SSIZE_T_MAX);
            Py_XDECREF(view);
            int status = rest == NULL ? -1 : PySequence_SetItem(outq, 0, rest);
            Py_XDECREF(rest);
            return status;
        }
        sent -= iov[i].iov_len;
        PyObject *part = PyObject_CallMethodNoArgs(outq, s_popleft);
        if (part == NULL) {
            return -1;
        }
        Py_DECREF(part);
    }
    return 0;
}

PyDoc_STRVAR(send_queued_doc,
"send_queued(fd, outq)\n--\n\n"
"Send the parts queued in `outq` (a deque of bytes-like objects) on the non-blocking socket `fd`\n"
"as far as it takes them without blocking, up to 256 parts per sendmsg: sent parts leave the\n"
"queue, a part sent in part is replaced by a memoryview of its rest. True when the queue is\n"
"empty, False when the socket is full. OSError for any other failure of sendmsg (what was sent\n"
"before it is gone from the queue).");

static PyObject *
fp_send_queued(PyObject *self, PyObject *args)
{
    int fd;
    PyObject *outq;
    if (!PyArg_ParseTuple(args, "iO:send_queued", &fd, &outq)) {
        return NULL;
    }
    Py_buffer views[SEND_PARTS];
    struct iovec iov[SEND_PARTS];
    for (;;) {
        PyObject *parts = PyObject_GetIter(outq);
        if (parts == NULL) {
            return NULL;
        }
        int count = 0;
        size_t total = 0;
        PyObject *part;
        while (count < SEND_PARTS && (part = PyIter_Next(parts)) != NULL) {
            int status = PyObject_GetBuffer(part, &views[count], PyBUF_SIMPLE);
            Py_DECREF(part); /* the queue keeps the part, and the view its buffer */
            if (status < 0) {
                break;
            }
            iov[count].iov_base = views[count].buf;
            iov[count].iov_len = (size_t)views[count].len;
            total += iov[count].iov_len;
            count++;
        }
        Py_DECREF(parts);
        if (PyErr_Occurred()) {
            release_all(views, count);
            return NULL;
        }
        if (count == 0) {
            Py_RETURN_TRUE;
        }
        struct msghdr message = {.msg_iov = iov, .msg_iovlen = (size_t)count};
        ssize_t sent;
        int error;
        Py_BEGIN_ALLOW_THREADS
        sent = sendmsg(fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
        error = errno;
        Py_END_ALLOW_THREADS
        int status = sent < 0 ? 0 : consume_sent(outq, iov, count, (size_t)sent);
        release_all(views, count);
        if (status < 0) {
            return NULL;
        }
        if (sent < 0) {
            if (error == EAGAIN || error == EWOULDBLOCK) {
                Py_RETURN_FALSE;
            }
            if (error == EINTR) {
                if (PyErr_CheckSignals() < 0) {
                    return NULL;
                }
                continue;
            }
            errno = error;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if ((size_t)sent < total) { /* the socket took what it had room for: the rest waits */
            Py_RETURN_FALSE;
        }
    }
}

#endif /* PHUB_FASTPATH_SEND_H */
