/*
 * What the translation units of the _speedups extension share (every .c file in native, built
 * into one module by hatch_build.py; the module is created in _speedups.c).
 */
#ifndef HEADWATER_SPEEDUPS_H
#define HEADWATER_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Set while a thread runs without the GIL: a failed allocation then only returns -1 and the
 * caller raises MemoryError once it holds the GIL again. */
extern _Thread_local int hw_without_gil;

/* A growable byte buffer (raw allocator: usable without the GIL). hw_buf_grow sets MemoryError
 * unless hw_without_gil is set. Every function returns 0, or -1 when memory ran out. */
typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

int hw_buf_grow(Buf *b, Py_ssize_t extra);

/* Room for extra more bytes (the check inline: it runs several times per encoded value). */
static inline int buf_reserve(Buf *b, Py_ssize_t extra) {
    return b->len + extra <= b->cap ? 0 : hw_buf_grow(b, extra);
}

static inline int buf_put(Buf *b, const void *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n > 0) memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

static inline int buf_byte(Buf *b, char c) {
    if (buf_reserve(b, 1) < 0) return -1;
    b->data[b->len++] = c;
    return 0;
}

/* v in decimal. */
int hw_buf_int(Buf *b, long long v);

static inline void buf_free(Buf *b) {
    PyMem_RawFree(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* s[0:n] (UTF-8) as a JSON string, escaped as orjson escapes it. */
int hw_buf_json_string(Buf *b, const char *s, Py_ssize_t n);

/* record_type(topic, key, value, commit, index, (), None) of a tuple subclass (capture.records.OutRecord);
 * steals key, value and index. */
PyObject *hw_make_record(PyTypeObject *rt, PyObject *topic, PyObject *key, PyObject *value, PyObject *commit,
                         PyObject *index);

/* CRC-32C (Castagnoli), chained like zlib.crc32; SSE4.2 when the CPU has it. */
uint32_t hw_crc32c(uint32_t crc, const void *data, size_t n);

/* Kafka's Utils.murmur2 (log/partitioner.py), as the record path routes keys. */
int32_t hw_murmur2(const unsigned char *data, Py_ssize_t length);

/* The hash mask (column_masks.c): 64 lowercase hex digits of SHA-256(salt + the value's bytes),
 * version 2: its UTF-8; version 1: Java's serialization of the String. 0: s is not UTF-8. */
int hw_mask_sha256_hex(char hex[64], const char *salt, Py_ssize_t salt_len, const char *s, Py_ssize_t n, int version);

/* Bytes of the first `chars` characters of the UTF-8 text s[0:n] (all of it when shorter). */
Py_ssize_t hw_utf8_prefix(const char *s, Py_ssize_t n, Py_ssize_t chars);

/* Stop the cyclic GC from tracking `record`, a just-filled instance of a tuple subclass, when it can
 * never be part of a reference cycle: its type gives instances no __dict__ and every item is of a
 * type the GC does not track, or an untracked exact tuple (the rule CPython applies to exact
 * tuples only). A batch's records then cost the collector nothing while they live. */
static inline void hw_untrack_record(PyObject *record) {
    if (Py_TYPE(record)->tp_dictoffset != 0) return;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(record); i++) {
        PyObject *item = PyTuple_GET_ITEM(record, i);
        if (PyObject_IS_GC(item) && !(PyTuple_CheckExact(item) && !PyObject_GC_IsTracked(item))) return;
    }
    PyObject_GC_UnTrack(record);
}

/* Functions each file adds to the module (a {NULL} terminated table). */
extern PyMethodDef hw_log_columns_methods[];   /* log_columns.c: file-log batches -> Arrow columns */
extern PyMethodDef hw_batch_columns_methods[]; /* batch_columns.c: Arrow columns -> file-log batches */
extern PyMethodDef hw_column_masks_methods[];  /* column_masks.c: the hash mask, for its twin's tests */
extern PyMethodDef hw_log_records_methods[];  /* log_records.c: file-log batches -> StoredRecord tuples */
extern PyMethodDef hw_sink_rows_methods[];     /* sink_rows.c: sink records; the PostgreSQL sink's ops and COPY text */
extern PyMethodDef hw_binlog_rows_methods[];   /* binlog_rows.c: MySQL row images -> Debezium values */
extern PyMethodDef hw_binlog_events_methods[]; /* binlog_events.c: MySQL row changes -> change records */

#endif
