/*
 * A file-log batch's records as StoredRecord tuples (log/file/batch_codec.py's decode_records is
 * the Python twin, and what it does is the definition): each record's fixed part ("<Iqiii":
 * offset delta, timestamp, key length, value length, headers length), then its key and value
 * sliced out as bytes. A record with headers, bytes past the buffer's end or a buffer that is
 * not bytes hand the whole batch back to the twin (None), before anything is appended.
 */
#include "speedups.h"

#include <string.h>

#define RECORD_BYTES 24 /* struct.calcsize("<Iqiii") */

static inline uint32_t le_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline int64_t le_i64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return (int64_t)v;
}

/* The bytes s[at:at+n], or None for n < 0. */
static PyObject *slice_or_none(const char *s, Py_ssize_t at, int32_t n) {
    if (n < 0) return Py_NewRef(Py_None);
    return PyBytes_FromStringAndSize(s + at, n);
}

/* decode_records(buf, pos, count, base, min_offset, topic, partition, record_type, room, max_bytes, held)
 * -> (records, used) | None. `room`: records that may still be taken; `held`: records the
 * caller's list already holds (a read returns at least one, so bytes stop it only then). `used`
 * is -1 when it stopped early, as the twin returns. */
static PyObject *py_decode_records(PyObject *self, PyObject *args) {
    PyObject *buf, *topic, *partition, *record_type;
    Py_ssize_t pos, count, room, held;
    long long base, min_offset, max_bytes;
    if (!PyArg_ParseTuple(args, "OnnLLOOOnLn", &buf, &pos, &count, &base, &min_offset, &topic, &partition,
                          &record_type, &room, &max_bytes, &held))
        return NULL;
    if (!PyBytes_Check(buf) || !PyType_Check(record_type)) Py_RETURN_NONE; /* a memoryview's slices differ */
    const char *s = PyBytes_AS_STRING(buf);
    const Py_ssize_t n = PyBytes_GET_SIZE(buf);
    PyTypeObject *type = (PyTypeObject *)record_type;
    /* First pass: every record is whole and has no headers, or the twin reads the batch. */
    Py_ssize_t p = pos;
    if (p < 0) Py_RETURN_NONE;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (n - p < RECORD_BYTES) Py_RETURN_NONE;
        const unsigned char *r = (const unsigned char *)s + p;
        int32_t klen = (int32_t)le_u32(r + 12), vlen = (int32_t)le_u32(r + 16), hlen = (int32_t)le_u32(r + 20);
        if (hlen != 0) Py_RETURN_NONE;
        p += RECORD_BYTES;
        if (klen > 0) {
            if (n - p < klen) Py_RETURN_NONE;
            p += klen;
        }
        if (vlen > 0) {
            if (n - p < vlen) Py_RETURN_NONE;
            p += vlen;
        }
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    long long used = 0;
    int stopped = 0;
    p = pos;
    for (Py_ssize_t k = 0; k < count; k++) {
        const unsigned char *r = (const unsigned char *)s + p;
        uint32_t delta = le_u32(r);
        int64_t ts = le_i64(r + 4);
        int32_t klen = (int32_t)le_u32(r + 12), vlen = (int32_t)le_u32(r + 16);
        Py_ssize_t start = p;
        p += RECORD_BYTES;
        Py_ssize_t key_at = p;
        if (klen >= 0) p += klen;
        Py_ssize_t value_at = p;
        if (vlen >= 0) p += vlen;
        if (base + (long long)delta < min_offset) continue;
        used += p - start;
        if (used > max_bytes && (held + PyList_GET_SIZE(out)) > 0) {
            stopped = 1;
            break;
        }
        PyObject *item = type->tp_alloc(type, 7);
        if (item == NULL) goto fail;
        PyObject *offset = PyLong_FromLongLong(base + (long long)delta);
        PyObject *stamp = PyLong_FromLongLong(ts);
        PyObject *key = slice_or_none(s, key_at, klen);
        PyObject *value = slice_or_none(s, value_at, vlen);
        PyTuple_SET_ITEM(item, 0, Py_NewRef(topic));
        PyTuple_SET_ITEM(item, 1, Py_NewRef(partition));
        PyTuple_SET_ITEM(item, 2, offset);
        PyTuple_SET_ITEM(item, 3, stamp);
        PyTuple_SET_ITEM(item, 4, key);
        PyTuple_SET_ITEM(item, 5, value);
        PyTuple_SET_ITEM(item, 6, Py_NewRef(empty));
        if (offset == NULL || stamp == NULL || key == NULL || value == NULL) {
            Py_DECREF(item);
            goto fail;
        }
        hw_untrack_record(item);
        if (PyList_Append(out, item) < 0) {
            Py_DECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        if (--room <= 0) {
            stopped = 1;
            break;
        }
    }
    Py_DECREF(empty);
    return Py_BuildValue("(NL)", out, stopped ? -1LL : used);
fail:
    Py_DECREF(empty);
    Py_DECREF(out);
    return NULL;
}

PyMethodDef hw_log_records_methods[] = {
    {"decode_records", py_decode_records, METH_VARARGS,
     "decode_records(buf, pos, count, base, min_offset, topic, partition, record_type, room, max_bytes, held) -> "
     "(records, used) | None: a plain batch's records (None: the Python twin reads it)."},
    {NULL, NULL, 0, NULL},
};
