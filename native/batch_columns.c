/*
 * Arrow-ready columns -> file-log record batches (the write side of derived feeds).
 *
 * column_batches() is log/file/column_batches.py's _column_batches_python in C: the same records
 * (a tombstone after each delete, the same headers on every record), routed by Kafka's murmur2
 * of the key, encoded as log/file/batch_codec.py's records behind a header placeholder that
 * EncodedBatch.seal fills at append time. The columns are read where Arrow keeps them (the
 * buffers of a string/binary array), so no Python object is made per record.
 */
#include "speedups.h"

#include <string.h>

#define PLACEHOLDER 38 /* log/file/batch_codec.py HEADER_SIZE: filled by EncodedBatch.seal */
#define RECORD_HEAD 24 /* offset_delta u32 | timestamp i64 | key_len i32 | value_len i32 | headers_len u32 */

/* One variable-length Arrow column (string/binary: 32-bit offsets; large_*: 64-bit). */
typedef struct {
    Py_buffer validity, offsets, data; /* validity.buf NULL: no nulls */
    Py_ssize_t offset;                 /* the array's offset into its buffers */
    int wide;
} Column;

static void column_release(Column *c) {
    if (c->validity.obj != NULL) PyBuffer_Release(&c->validity);
    if (c->offsets.obj != NULL) PyBuffer_Release(&c->offsets);
    if (c->data.obj != NULL) PyBuffer_Release(&c->data);
}

/* (validity | None, offsets, data, offset, wide) of n rows; checks that the buffers hold them. */
static int column_parse(PyObject *spec, Py_ssize_t n, Column *c, const char *name) {
    PyObject *validity, *offsets, *data;
    if (!PyArg_ParseTuple(spec, "OOOnp", &validity, &offsets, &data, &c->offset, &c->wide)) return -1;
    if (validity != Py_None && PyObject_GetBuffer(validity, &c->validity, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0) return -1;
    Py_ssize_t width = c->wide ? 8 : 4;
    if (c->offset < 0 || n < 0 || c->offsets.len / width < c->offset + n + 1 ||
        (c->validity.obj != NULL && c->validity.len < (c->offset + n + 7) / 8)) {
        PyErr_Format(PyExc_ValueError, "column_batches(): the %s buffers do not hold %zd rows", name, n);
        return -1;
    }
    return 0;
}

static inline int column_valid(const Column *c, Py_ssize_t i) {
    if (c->validity.obj == NULL) return 1;
    Py_ssize_t bit = c->offset + i;
    return (((const unsigned char *)c->validity.buf)[bit >> 3] >> (bit & 7)) & 1;
}

static inline int64_t column_at(const Column *c, Py_ssize_t i) {
    if (c->wide) {
        int64_t v;
        memcpy(&v, (const char *)c->offsets.buf + (c->offset + i) * 8, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, (const char *)c->offsets.buf + (c->offset + i) * 4, 4);
    return v;
}

/* Row i's bytes: *start and the length, -1 for a null; -2 when the offsets point outside the data. */
static inline int64_t column_slice(const Column *c, Py_ssize_t i, int64_t *start) {
    if (!column_valid(c, i)) return -1;
    int64_t a = column_at(c, i), b = column_at(c, i + 1);
    if (a < 0 || b < a || b > (int64_t)c->data.len || b - a > INT32_MAX) return -2;
    *start = a;
    return b - a;
}

static inline void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); } /* little-endian host */
static inline void put_i64(char *p, int64_t v) { memcpy(p, &v, 8); }

static inline char *put_record(char *p, uint32_t delta, int64_t ts, const char *key, int64_t klen, const char *value,
                               int64_t vlen, const char *headers, Py_ssize_t hlen) {
    put_u32(p, delta);
    put_i64(p + 4, ts);
    put_u32(p + 12, (uint32_t)(int32_t)klen);
    put_u32(p + 16, (uint32_t)(int32_t)vlen);
    put_u32(p + 20, (uint32_t)hlen);
    p += RECORD_HEAD;
    if (klen > 0) {
        memcpy(p, key, (size_t)klen);
        p += klen;
    }
    if (vlen > 0) {
        memcpy(p, value, (size_t)vlen);
        p += vlen;
    }
    if (hlen > 0) {
        memcpy(p, headers, (size_t)hlen);
        p += hlen;
    }
    return p;
}

/* A bytearray of size bytes for partition p: scratch[p] resized when nothing but the scratch list
 * holds it (no batch of an earlier call still uses it, no buffer export), else a new one put there.
 * Reusing the memory saves the page faults of a fresh multi-MiB buffer (~60 % of this function's
 * CPU for a 100k-event batch here). */
static PyObject *batch_buffer(PyObject *scratch, Py_ssize_t p, Py_ssize_t size) {
    if (scratch != Py_None) {
        PyObject *old = PyList_GET_ITEM(scratch, p);
        if (PyByteArray_CheckExact(old) && Py_REFCNT(old) == 1) {
            if (PyByteArray_Resize(old, size) == 0) return Py_NewRef(old);
            PyErr_Clear(); /* exported meanwhile: a new one */
        }
    }
    PyObject *fresh = PyByteArray_FromStringAndSize(NULL, size);
    if (fresh == NULL || scratch == Py_None) return fresh;
    if (PyList_SetItem(scratch, p, Py_NewRef(fresh)) < 0) {
        Py_DECREF(fresh);
        return NULL;
    }
    return fresh;
}

/* column_batches(n, keys, values, deletes, partitions, headers, now_ms, scratch) -> [(bytearray, count) | None]
 *
 * keys, values: (validity | None, offsets, data, offset, wide) of an Arrow string/binary array of
 * n rows; deletes: n bytes (non-zero: the row is a delete and a tombstone follows it) or None;
 * headers: every record's encoded headers; scratch: None or a list of `partitions` items whose
 * bytearrays are reused (see batch_buffer). One entry per partition: None, or the records routed
 * there behind a header placeholder and how many. Every record's timestamp is now_ms. */
static PyObject *py_column_batches(PyObject *self, PyObject *args) {
    Py_ssize_t n, partitions, hlen;
    PyObject *key_spec, *value_spec, *deletes_obj, *scratch;
    const char *headers;
    long long now_ms;
    if (!PyArg_ParseTuple(args, "nO!O!Ony#LO", &n, &PyTuple_Type, &key_spec, &PyTuple_Type, &value_spec,
                          &deletes_obj, &partitions, &headers, &hlen, &now_ms, &scratch))
        return NULL;
    if (partitions <= 0 || partitions > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "column_batches(): partitions must be positive");
        return NULL;
    }
    if (scratch != Py_None && (!PyList_CheckExact(scratch) || PyList_GET_SIZE(scratch) != partitions)) {
        PyErr_SetString(PyExc_TypeError, "column_batches(): scratch must be None or a list of one item per partition");
        return NULL;
    }
    if (hlen > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "column_batches(): headers too long");
        return NULL;
    }
    Column keys = {0}, values = {0};
    Py_buffer deletes = {0};
    uint32_t *routes = NULL;
    Py_ssize_t *sizes = NULL, *counts = NULL;
    char **cursors = NULL;
    PyObject *out = NULL, *result = NULL;
    if (column_parse(key_spec, n, &keys, "key") < 0 || column_parse(value_spec, n, &values, "value") < 0) goto done;
    if (deletes_obj != Py_None) {
        if (PyObject_GetBuffer(deletes_obj, &deletes, PyBUF_SIMPLE) < 0) goto done;
        if (deletes.len < n) {
            PyErr_SetString(PyExc_ValueError, "column_batches(): the delete flags do not hold every row");
            goto done;
        }
    }
    const unsigned char *is_delete = deletes.obj != NULL ? (const unsigned char *)deletes.buf : NULL;
    routes = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    sizes = PyMem_Calloc((size_t)partitions, sizeof(Py_ssize_t));
    counts = PyMem_Calloc((size_t)partitions, sizeof(Py_ssize_t));
    cursors = PyMem_Calloc((size_t)partitions, sizeof(char *));
    if (!routes || !sizes || !counts || !cursors) {
        PyErr_NoMemory();
        goto done;
    }
    /* Pass 1: each row's partition, and each partition's records and bytes. */
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t kstart = 0, vstart = 0;
        int64_t klen = column_slice(&keys, i, &kstart), vlen = column_slice(&values, i, &vstart);
        if (klen == -2 || vlen == -2) {
            bad = 1;
            break;
        }
        uint32_t p = 0;
        if (klen >= 0 && partitions > 1) {
            int32_t h = hw_murmur2((const unsigned char *)keys.data.buf + kstart, (Py_ssize_t)klen);
            p = ((uint32_t)h & 0x7fffffffU) % (uint32_t)partitions;
        }
        routes[i] = p;
        Py_ssize_t k = klen > 0 ? (Py_ssize_t)klen : 0, v = vlen > 0 ? (Py_ssize_t)vlen : 0;
        sizes[p] += RECORD_HEAD + k + v + hlen;
        counts[p] += 1;
        if (is_delete != NULL && is_delete[i]) {
            sizes[p] += RECORD_HEAD + k + hlen;
            counts[p] += 1;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "column_batches(): a row's offsets point outside its column's data");
        goto done;
    }
    out = PyList_New(partitions);
    if (out == NULL) goto done;
    for (Py_ssize_t p = 0; p < partitions; p++) {
        if (counts[p] == 0) {
            PyList_SET_ITEM(out, p, Py_NewRef(Py_None));
            continue;
        }
        if (PLACEHOLDER + sizes[p] > UINT32_MAX || counts[p] > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "column_batches(): a partition's batch would exceed 4 GiB");
            goto done;
        }
        PyObject *buffer = batch_buffer(scratch, p, PLACEHOLDER + sizes[p]);
        if (buffer == NULL) goto done;
        PyObject *entry = Py_BuildValue("(Nn)", buffer, counts[p]);
        if (entry == NULL) goto done;
        PyList_SET_ITEM(out, p, entry);
        char *start = PyByteArray_AS_STRING(buffer);
        memset(start, 0, PLACEHOLDER);
        cursors[p] = start + PLACEHOLDER;
        counts[p] = 0; /* from here: the next record's offset delta */
    }
    /* Pass 2: the records, in row order within each partition. The bytearrays are new and only
     * this call holds them, so the GIL can go. */
    const char *kdata = keys.data.buf, *vdata = values.data.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t kstart = 0, vstart = 0;
        int64_t klen = column_slice(&keys, i, &kstart), vlen = column_slice(&values, i, &vstart);
        uint32_t p = routes[i];
        char *c = put_record(cursors[p], (uint32_t)counts[p]++, now_ms, kdata + kstart, klen, vdata + vstart, vlen,
                             headers, hlen);
        if (is_delete != NULL && is_delete[i])
            c = put_record(c, (uint32_t)counts[p]++, now_ms, kdata + kstart, klen, NULL, -1, headers, hlen);
        cursors[p] = c;
    }
    Py_END_ALLOW_THREADS
    result = out;
    out = NULL;
done:
    Py_XDECREF(out);
    PyMem_Free(routes);
    PyMem_Free(sizes);
    PyMem_Free(counts);
    PyMem_Free(cursors);
    if (deletes.obj != NULL) PyBuffer_Release(&deletes);
    column_release(&keys);
    column_release(&values);
    return result;
}

PyMethodDef hw_batch_columns_methods[] = {
    {"column_batches", py_column_batches, METH_VARARGS,
     "column_batches(n, keys, values, deletes, partitions, headers, now_ms, scratch) -> [(batch, count) | None per "
     "partition]\n\nkeys, values: (validity, offsets, data, offset, wide) of Arrow string/binary arrays; scratch: "
     "None or a list of reusable bytearrays, one per partition. See log/file/column_batches.py."},
    {NULL, NULL, 0, NULL},
};
