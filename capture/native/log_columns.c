/*
 * File-log record batches -> Arrow-ready columns (the read side of derived feeds).
 *
 * decode_columns(parts, min_offset, end_offset, max_records, max_bytes) walks the plain
 * records sections of CRC-checked batches (log/batch_codec.py's record layout) and returns
 * the selected records as the buffers of Arrow arrays, without a Python object per record.
 * log/columns.py's _decode_columns_python is its twin and defines the result.
 */
#include "speedups.h"

#include <string.h>

#define RECORD_SIZE 24 /* offset_delta u32 | timestamp i64 | key_len i32 | value_len i32 | headers_len u32 */

typedef struct {
    Py_buffer view;
    Py_ssize_t start;
    Py_ssize_t stop;
    Py_ssize_t count;
    long long base;
    int held;
} LogPart;

typedef struct {
    long long offset;
    long long timestamp;
    int32_t key_len;
    int32_t value_len;
    const uint8_t *key;
    const uint8_t *value;
    Py_ssize_t size; /* the record's bytes, header included */
} LogRecord;

/* The record at *pos of part, or -1 with ValueError when it runs past the section. */
static int read_record(const LogPart *part, Py_ssize_t *pos, LogRecord *out) {
    const uint8_t *data = (const uint8_t *)part->view.buf;
    Py_ssize_t p = *pos;
    uint32_t delta, headers_len;
    if (part->stop - p < RECORD_SIZE)
        goto bad;
    memcpy(&delta, data + p, 4);
    memcpy(&out->timestamp, data + p + 4, 8);
    memcpy(&out->key_len, data + p + 12, 4);
    memcpy(&out->value_len, data + p + 16, 4);
    memcpy(&headers_len, data + p + 20, 4);
    p += RECORD_SIZE;
    if (out->key_len < -1 || out->value_len < -1)
        goto bad;
    out->key = data + p;
    if (out->key_len > 0) {
        if (part->stop - p < out->key_len)
            goto bad;
        p += out->key_len;
    }
    out->value = data + p;
    if (out->value_len > 0) {
        if (part->stop - p < out->value_len)
            goto bad;
        p += out->value_len;
    }
    if ((uint64_t)(part->stop - p) < headers_len)
        goto bad;
    p += headers_len;
    out->offset = part->base + (long long)delta;
    out->size = p - *pos;
    *pos = p;
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "batch at offset %lld: its records run past the batch's end", part->base);
    return -1;
}

typedef struct {
    Py_ssize_t n;
    Py_ssize_t key_bytes;
    Py_ssize_t value_bytes;
    int key_nulls;
    int value_nulls;
    long long next_offset; /* -1: every part read to its end */
} Selection;

/* Walk the records in order, applying the same rules as batch_codec.decode_records plus the range end;
   fill (when columns is not NULL) or only measure. */
typedef struct {
    int64_t *offsets;
    int64_t *timestamps;
    int32_t *key_offsets;
    uint8_t *key_data;
    uint8_t *key_valid;
    int32_t *value_offsets;
    uint8_t *value_data;
    uint8_t *value_valid;
} Columns;

static int walk(LogPart *parts, Py_ssize_t nparts, long long min_offset, long long end_offset,
                Py_ssize_t max_records, long long max_bytes, Selection *sel, Columns *cols, Py_ssize_t limit) {
    Py_ssize_t n = 0, kb = 0, vb = 0;
    long long used = 0;
    sel->key_nulls = sel->value_nulls = 0;
    sel->next_offset = -1;
    for (Py_ssize_t i = 0; i < nparts; i++) {
        Py_ssize_t pos = parts[i].start;
        for (Py_ssize_t r = 0; r < parts[i].count; r++) {
            LogRecord rec;
            if (read_record(&parts[i], &pos, &rec) < 0)
                return -1;
            if (rec.offset < min_offset)
                continue;
            if (rec.offset >= end_offset) {
                sel->next_offset = end_offset;
                goto done;
            }
            used += rec.size;
            if ((used > max_bytes && n > 0) || (cols != NULL && n >= limit)) {
                sel->next_offset = rec.offset;
                goto done;
            }
            if (cols != NULL) {
                cols->offsets[n] = rec.offset;
                cols->timestamps[n] = rec.timestamp;
                cols->key_offsets[n] = (int32_t)kb;
                cols->value_offsets[n] = (int32_t)vb;
                if (rec.key_len >= 0) {
                    memcpy(cols->key_data + kb, rec.key, (size_t)rec.key_len);
                    if (cols->key_valid)
                        cols->key_valid[n >> 3] |= (uint8_t)(1u << (n & 7));
                }
                if (rec.value_len >= 0) {
                    memcpy(cols->value_data + vb, rec.value, (size_t)rec.value_len);
                    if (cols->value_valid)
                        cols->value_valid[n >> 3] |= (uint8_t)(1u << (n & 7));
                }
            }
            if (rec.key_len >= 0)
                kb += rec.key_len;
            else
                sel->key_nulls = 1;
            if (rec.value_len >= 0)
                vb += rec.value_len;
            else
                sel->value_nulls = 1;
            n++;
            if (n >= max_records) {
                sel->next_offset = rec.offset + 1;
                goto done;
            }
        }
    }
done:
    if (kb > INT32_MAX || vb > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "the selected keys or values exceed 2 GiB: read fewer bytes at once");
        return -1;
    }
    if (cols != NULL) {
        cols->key_offsets[n] = (int32_t)kb;
        cols->value_offsets[n] = (int32_t)vb;
    }
    sel->n = n;
    sel->key_bytes = kb;
    sel->value_bytes = vb;
    return 0;
}

static void release_parts(LogPart *parts, Py_ssize_t nparts) {
    for (Py_ssize_t i = 0; i < nparts; i++)
        if (parts[i].held)
            PyBuffer_Release(&parts[i].view);
    PyMem_Free(parts);
}

static PyObject *new_bytes(Py_ssize_t size, char **data) {
    PyObject *obj = PyBytes_FromStringAndSize(NULL, size);
    if (obj != NULL) {
        *data = PyBytes_AS_STRING(obj);
        memset(*data, 0, (size_t)size);
    }
    return obj;
}

static PyObject *decode_columns(PyObject *self, PyObject *args) {
    PyObject *seq;
    long long min_offset, end_offset, max_bytes;
    Py_ssize_t max_records;
    (void)self;
    if (!PyArg_ParseTuple(args, "OLLnL:decode_columns", &seq, &min_offset, &end_offset, &max_records, &max_bytes))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "parts must be a sequence of (buffer, start, stop, count, base_offset)");
    if (fast == NULL)
        return NULL;
    Py_ssize_t nparts = PySequence_Fast_GET_SIZE(fast);
    LogPart *parts = PyMem_Calloc((size_t)(nparts > 0 ? nparts : 1), sizeof(LogPart));
    if (parts == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nparts; i++) {
        LogPart *part = &parts[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "y*nnnL:decode_columns part", &part->view,
                              &part->start, &part->stop, &part->count, &part->base)) {
            release_parts(parts, i);
            Py_DECREF(fast);
            return NULL;
        }
        part->held = 1;
        if (part->start < 0 || part->stop < part->start || part->stop > part->view.len || part->count < 0) {
            PyErr_Format(PyExc_ValueError, "batch at offset %lld: its section lies outside its buffer", part->base);
            release_parts(parts, i + 1);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    if (max_records < 0)
        max_records = 0;

    PyObject *result = NULL;
    PyObject *objs[8] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    Selection sel;
    if (max_records == 0) {
        sel.n = sel.key_bytes = sel.value_bytes = 0;
        sel.key_nulls = sel.value_nulls = 0;
        sel.next_offset = min_offset;
    } else if (walk(parts, nparts, min_offset, end_offset, max_records, max_bytes, &sel, NULL, 0) < 0) {
        goto out;
    }
    Py_ssize_t n = sel.n, bitmap = (n + 7) / 8;
    Columns cols;
    char *data;
    if ((objs[0] = new_bytes(n * 8, &data)) == NULL)
        goto out;
    cols.offsets = (int64_t *)data;
    if ((objs[1] = new_bytes(n * 8, &data)) == NULL)
        goto out;
    cols.timestamps = (int64_t *)data;
    cols.key_valid = NULL;
    if (sel.key_nulls) {
        if ((objs[2] = new_bytes(bitmap, &data)) == NULL)
            goto out;
        cols.key_valid = (uint8_t *)data;
    }
    if ((objs[3] = new_bytes((n + 1) * 4, &data)) == NULL)
        goto out;
    cols.key_offsets = (int32_t *)data;
    if ((objs[4] = new_bytes(sel.key_bytes, &data)) == NULL)
        goto out;
    cols.key_data = (uint8_t *)data;
    cols.value_valid = NULL;
    if (sel.value_nulls) {
        if ((objs[5] = new_bytes(bitmap, &data)) == NULL)
            goto out;
        cols.value_valid = (uint8_t *)data;
    }
    if ((objs[6] = new_bytes((n + 1) * 4, &data)) == NULL)
        goto out;
    cols.value_offsets = (int32_t *)data;
    if ((objs[7] = new_bytes(sel.value_bytes, &data)) == NULL)
        goto out;
    cols.value_data = (uint8_t *)data;
    if (n > 0) {
        Selection again;
        if (walk(parts, nparts, min_offset, end_offset, max_records, max_bytes, &again, &cols, n) < 0)
            goto out;
    } else {
        cols.key_offsets[0] = 0;
        cols.value_offsets[0] = 0;
    }
    result = Py_BuildValue("(nLOOOOOOOO)", n, sel.next_offset, objs[0], objs[1], objs[2] ? objs[2] : Py_None,
                           objs[3], objs[4], objs[5] ? objs[5] : Py_None, objs[6], objs[7]);
out:
    for (int i = 0; i < 8; i++)
        Py_XDECREF(objs[i]);
    release_parts(parts, nparts);
    return result;
}

PyMethodDef hw_log_columns_methods[] = {
    {"decode_columns", decode_columns, METH_VARARGS,
     "decode_columns(parts, min_offset, end_offset, max_records, max_bytes) -> (count, next_offset, offsets, "
     "timestamps_ms, key_validity, key_offsets, key_data, value_validity, value_offsets, value_data)\n\n"
     "parts: (buffer, start, stop, record_count, base_offset) of plain records sections. See log/columns.py."},
    {NULL, NULL, 0, NULL},
};
