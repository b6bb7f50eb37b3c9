/*
 * File-log record batches -> Arrow-ready columns (the read side of derived feeds).
 *
 * decode_columns(parts, min_offset, end_offset, max_records, max_bytes) walks the plain
 * records sections of CRC-checked batches (log/file/batch_codec.py's record layout) and returns
 * the selected records as the buffers of Arrow arrays, without a Python object per record.
 * log/file/column_decoder.py's _decode_columns_python is its twin and defines the result.
 *
 * (Over 500 lines: scan_envelopes, below, is a JSON reader that allocates nothing per value,
 * about 600 lines by itself, kept beside the record walk whose value column it reads.)
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

/*
 * Change envelopes (the Debezium-shaped JSON values) -> the envelope's columns.
 *
 * scan_envelopes(value_offsets, value_data, first, count) reads each value (Arrow binary
 * buffers: int32 offsets from index `first`, `count` values) as one JSON object and returns
 * op and the source fields as column buffers, and the before/after images as two streams of
 * JSON documents (a null or absent image is written `{}` and marked null), so that only the
 * images go through pyarrow.json. It validates each whole value (RFC 8259, UTF-8) and answers
 * None for anything it does not take exactly: text pyarrow.json might read otherwise, an
 * escaped key, escaped op/source strings, duplicate fields it reads, numbers that are no
 * plain int64 of at most 18 digits, a negative commit_lsn or txn_index, a wrong JSON type, a
 * value that is no envelope (op, before and after all null). The caller then builds the batch
 * the way it did without the scanner. It also returns the sequence column of (commit_lsn,
 * txn_index). spark_log/envelope_scanner.py's _scan_envelopes_python is its twin and
 * defines the result.
 */
#define ENV_MAX_DEPTH 200
#define ENV_SEQ_WIDTH 33

/* Scanning results: 1 taken, 0 not taken (the caller answers None), -1 Python error. */
typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} EnvCur;

static void env_ws(EnvCur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int env_hex4(const uint8_t *p, const uint8_t *end, unsigned *out) {
    unsigned v = 0;
    if (end - p < 4)
        return 0;
    for (int i = 0; i < 4; i++) {
        uint8_t h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9')
            v |= (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f')
            v |= (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F')
            v |= (unsigned)(h - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* A string at c->p (its opening quote): its raw content [*start, *start + *len) and whether it has escapes.
   Taken only with valid UTF-8, no control characters, valid escapes and surrogate escapes only in pairs. */
/* 1 for the bytes a string holds as they are: printable ASCII but the quote and the backslash. */
static const uint8_t env_plain[256] = {
    ['\x20'] = 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x20-0x2F, '"' is 0x22 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,              /* 0x30-0x3F */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,              /* 0x40-0x4F */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,              /* 0x50-0x5F, '\\' is 0x5C */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,              /* 0x60-0x6F */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,              /* 0x70-0x7F */
};

static int env_string(EnvCur *c, const uint8_t **start, Py_ssize_t *len, int *escaped) {
    const uint8_t *p = c->p + 1, *end = c->end;
    *escaped = 0;
    *start = p;
    while (p < end) {
        while (p < end && env_plain[*p])
            p++;
        if (p >= end)
            break;
        uint8_t ch = *p;
        if (ch == '"') {
            *len = p - *start;
            c->p = p + 1;
            return 1;
        }
        if (ch < 0x20)
            return 0;
        if (ch == '\\') {
            *escaped = 1;
            if (end - p < 2)
                return 0;
            uint8_t e = p[1];
            if (e == 'u') {
                unsigned cp;
                if (!env_hex4(p + 2, end, &cp))
                    return 0;
                p += 6;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return 0;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned low;
                    if (end - p < 2 || p[0] != '\\' || p[1] != 'u' || !env_hex4(p + 2, end, &low))
                        return 0;
                    if (low < 0xDC00 || low > 0xDFFF)
                        return 0;
                    p += 6;
                }
                continue;
            }
            if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't')
                return 0;
            p += 2;
            continue;
        }
        if (ch < 0x80) {
            p++;
            continue;
        }
        /* UTF-8 (Unicode table 3-7): no overlong forms, no surrogates, at most U+10FFFF. */
        Py_ssize_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (ch >= 0xC2 && ch <= 0xDF)
            need = 1;
        else if (ch >= 0xE0 && ch <= 0xEF) {
            need = 2;
            if (ch == 0xE0)
                lo = 0xA0;
            else if (ch == 0xED)
                hi = 0x9F;
        } else if (ch >= 0xF0 && ch <= 0xF4) {
            need = 3;
            if (ch == 0xF0)
                lo = 0x90;
            else if (ch == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (end - p <= need)
            return 0;
        if (p[1] < lo || p[1] > hi)
            return 0;
        for (Py_ssize_t k = 2; k <= need; k++)
            if (p[k] < 0x80 || p[k] > 0xBF)
                return 0;
        p += need + 1;
    }
    return 0;
}

/* A number at c->p (JSON grammar); *integer: it is -?digits with at most 18 digits, its value in *value. */
static int env_number(EnvCur *c, int *integer, long long *value) {
    const uint8_t *p = c->p, *end = c->end;
    int negative = 0;
    long long v = 0;
    Py_ssize_t digits = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return 0;
    if (*p == '0') {
        p++;
        digits = 1;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 18)
                v = v * 10 + (*p - '0');
            digits++;
            p++;
        }
    }
    *integer = digits <= 18;
    if (p < end && *p == '.') {
        *integer = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return 0;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9')
            return 0;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    *value = negative ? -v : v;
    c->p = p;
    return 1;
}

static int env_literal(EnvCur *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, word, (size_t)n) != 0)
        return 0;
    c->p += n;
    return 1;
}

/* Any JSON value at c->p (whitespace skipped before it), checked and passed over. */
static int env_skip(EnvCur *c, int depth) {
    env_ws(c);
    if (c->p >= c->end)
        return 0;
    uint8_t ch = *c->p;
    if (ch == '"') {
        const uint8_t *s;
        Py_ssize_t n;
        int esc;
        return env_string(c, &s, &n, &esc);
    }
    if (ch == '{' || ch == '[') {
        uint8_t close = ch == '{' ? '}' : ']';
        if (depth >= ENV_MAX_DEPTH)
            return 0;
        c->p++;
        env_ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 1;
        }
        for (;;) {
            if (ch == '{') {
                const uint8_t *s;
                Py_ssize_t n;
                int esc;
                env_ws(c);
                if (c->p >= c->end || *c->p != '"' || !env_string(c, &s, &n, &esc))
                    return 0;
                env_ws(c);
                if (c->p >= c->end || *c->p != ':')
                    return 0;
                c->p++;
            }
            if (!env_skip(c, depth + 1))
                return 0;
            env_ws(c);
            if (c->p >= c->end)
                return 0;
            if (*c->p == ',') {
                c->p++;
                continue;
            }
            if (*c->p == close) {
                c->p++;
                return 1;
            }
            return 0;
        }
    }
    if (ch == 't')
        return env_literal(c, "true", 4);
    if (ch == 'f')
        return env_literal(c, "false", 5);
    if (ch == 'n')
        return env_literal(c, "null", 4);
    int integer;
    long long v;
    return env_number(c, &integer, &v);
}

enum { ENV_OP, ENV_SNAPSHOT, ENV_DB, ENV_SCHEMA, ENV_TABLE, ENV_STRINGS };
enum { ENV_LSN, ENV_INDEX, ENV_TS, ENV_INTS };

typedef struct {
    Buf data[ENV_STRINGS];
    int32_t *offsets[ENV_STRINGS];
    uint8_t *string_valid[ENV_STRINGS];
    int64_t *ints[ENV_INTS];
    uint8_t *int_valid[ENV_INTS];
    Buf images[2]; /* before, after */
    uint8_t *image_valid[2];
} EnvColumns;

#define env_key_is(s, n, name) ((n) == (Py_ssize_t)sizeof(name) - 1 && memcmp((s), (name), sizeof(name) - 1) == 0)

/* An unescaped string or null into string column `col` of row i (its bytes at the end of its data). */
static int env_string_field(EnvCur *c, EnvColumns *cols, int col, Py_ssize_t i, int *seen) {
    if (*seen)
        return 0;
    *seen = 1;
    if (*c->p == 'n')
        return env_literal(c, "null", 4);
    if (*c->p != '"')
        return 0;
    const uint8_t *s;
    Py_ssize_t n;
    int esc;
    if (!env_string(c, &s, &n, &esc) || esc)
        return 0;
    if (buf_put(&cols->data[col], s, n) < 0)
        return -1;
    cols->string_valid[col][i >> 3] |= (uint8_t)(1u << (i & 7));
    return 1;
}

static int env_int_field(EnvCur *c, EnvColumns *cols, int col, Py_ssize_t i, int *seen) {
    if (*seen)
        return 0;
    *seen = 1;
    if (*c->p == 'n')
        return env_literal(c, "null", 4);
    int integer;
    long long v;
    if (!env_number(c, &integer, &v) || !integer)
        return 0;
    cols->ints[col][i] = v;
    cols->int_valid[col][i >> 3] |= (uint8_t)(1u << (i & 7));
    return 1;
}

/* The source object (or null) of row i. */
static int env_source(EnvCur *c, EnvColumns *cols, Py_ssize_t i) {
    static const char *const names[] = {"commit_lsn", "txn_index", "ts_us", "snapshot", "db", "schema", "table"};
    static const Py_ssize_t lengths[] = {10, 9, 5, 8, 2, 6, 5};
    int seen[7] = {0, 0, 0, 0, 0, 0, 0};
    if (*c->p == 'n')
        return env_literal(c, "null", 4);
    if (*c->p != '{')
        return 0;
    c->p++;
    env_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 1;
    }
    for (;;) {
        const uint8_t *key;
        Py_ssize_t n;
        int esc, r = -2;
        env_ws(c);
        if (c->p >= c->end || *c->p != '"' || !env_string(c, &key, &n, &esc) || esc)
            return 0;
        env_ws(c);
        if (c->p >= c->end || *c->p != ':')
            return 0;
        c->p++;
        env_ws(c);
        if (c->p >= c->end)
            return 0;
        for (int k = 0; k < 7; k++) {
            if (n == lengths[k] && memcmp(key, names[k], (size_t)n) == 0) {
                r = k < 3 ? env_int_field(c, cols, ENV_LSN + k, i, &seen[k])
                          : env_string_field(c, cols, ENV_SNAPSHOT + (k - 3), i, &seen[k]);
                break;
            }
        }
        if (r == -2)
            r = env_skip(c, 2);
        if (r <= 0)
            return r;
        env_ws(c);
        if (c->p >= c->end)
            return 0;
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == '}') {
            c->p++;
            return 1;
        }
        return 0;
    }
}

/* Value i: one envelope object filling row i of every column. */
static int env_value(const uint8_t *v, Py_ssize_t len, EnvColumns *cols, Py_ssize_t i) {
    EnvCur c = {v, v + len};
    int seen_op = 0, seen_source = 0, seen_image[2] = {0, 0};
    const uint8_t *image[2] = {NULL, NULL};
    Py_ssize_t image_len[2] = {0, 0};
    if (len < 2 || v[0] != '{' || v[len - 1] != '}')
        return 0;
    c.p++;
    env_ws(&c);
    if (c.p < c.end && *c.p == '}') {
        c.p++;
    } else {
        for (;;) {
            const uint8_t *key;
            Py_ssize_t n;
            int esc, r;
            env_ws(&c);
            if (c.p >= c.end || *c.p != '"' || !env_string(&c, &key, &n, &esc) || esc)
                return 0;
            env_ws(&c);
            if (c.p >= c.end || *c.p != ':')
                return 0;
            c.p++;
            env_ws(&c);
            if (c.p >= c.end)
                return 0;
            if (env_key_is(key, n, "op")) {
                r = env_string_field(&c, cols, ENV_OP, i, &seen_op);
            } else if (env_key_is(key, n, "source")) {
                r = seen_source ? 0 : env_source(&c, cols, i);
                seen_source = 1;
            } else if (env_key_is(key, n, "before") || env_key_is(key, n, "after")) {
                int side = key[0] == 'a';
                if (seen_image[side])
                    return 0;
                seen_image[side] = 1;
                if (*c.p == '{') {
                    const uint8_t *start = c.p;
                    r = env_skip(&c, 1);
                    image[side] = start;
                    image_len[side] = c.p - start;
                } else {
                    r = env_literal(&c, "null", 4);
                }
            } else {
                r = env_skip(&c, 1);
            }
            if (r <= 0)
                return r;
            env_ws(&c);
            if (c.p >= c.end)
                return 0;
            if (*c.p == ',') {
                c.p++;
                continue;
            }
            if (*c.p == '}') {
                c.p++;
                break;
            }
            return 0;
        }
    }
    if (c.p != c.end)
        return 0;
    if (image[0] == NULL && image[1] == NULL && !(cols->string_valid[ENV_OP][i >> 3] & (1u << (i & 7))))
        return 0; /* no envelope: the per-value path reads it as `after` */
    for (int side = 0; side < 2; side++) {
        if (image[side] == NULL) {
            if (buf_put(&cols->images[side], (const uint8_t *)"{}", 2) < 0)
                return -1;
        } else {
            if (buf_put(&cols->images[side], image[side], image_len[side]) < 0)
                return -1;
            cols->image_valid[side][i >> 3] |= (uint8_t)(1u << (i & 7));
        }
    }
    for (int col = 0; col < ENV_STRINGS; col++)
        cols->offsets[col][i + 1] = (int32_t)cols->data[col].len;
    return 1;
}

static PyObject *scan_envelopes(PyObject *self, PyObject *args) {
    Py_buffer offsets_view, data_view;
    Py_ssize_t first, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*nn:scan_envelopes", &offsets_view, &data_view, &first, &count))
        return NULL;
    PyObject *result = NULL;
    /* 0-4 string validity, 5-9 string offsets, 10-12 int validity, 13-15 ints, 16-17 image validity,
       18-20 sequence validity, offsets, data */
    PyObject *objs[21] = {NULL};
    EnvColumns cols;
    memset(&cols, 0, sizeof(cols));
    const int32_t *bounds = (const int32_t *)offsets_view.buf;
    const uint8_t *data = (const uint8_t *)data_view.buf;
    if (first < 0 || count < 0 || first > offsets_view.len / 4 || offsets_view.len / 4 - first < count + 1) {
        PyErr_SetString(PyExc_ValueError, "scan_envelopes: the offsets do not cover the values");
        goto out;
    }
    Py_ssize_t bitmap = (count + 7) / 8;
    char *raw;
    for (int col = 0; col < ENV_STRINGS; col++) {
        if ((objs[col] = new_bytes(bitmap, &raw)) == NULL)
            goto out;
        cols.string_valid[col] = (uint8_t *)raw;
        if ((objs[5 + col] = new_bytes((count + 1) * 4, &raw)) == NULL)
            goto out;
        cols.offsets[col] = (int32_t *)raw;
    }
    for (int col = 0; col < ENV_INTS; col++) {
        if ((objs[10 + col] = new_bytes(bitmap, &raw)) == NULL)
            goto out;
        cols.int_valid[col] = (uint8_t *)raw;
        if ((objs[13 + col] = new_bytes(count * 8, &raw)) == NULL)
            goto out;
        cols.ints[col] = (int64_t *)raw;
    }
    for (int side = 0; side < 2; side++) {
        if ((objs[16 + side] = new_bytes(bitmap, &raw)) == NULL)
            goto out;
        cols.image_valid[side] = (uint8_t *)raw;
    }
    int taken = 1;
    for (Py_ssize_t i = 0; i < count && taken == 1; i++) {
        int32_t lo, hi;
        memcpy(&lo, bounds + first + i, 4);
        memcpy(&hi, bounds + first + i + 1, 4);
        if (lo < 0 || hi < lo || hi > data_view.len) {
            PyErr_SetString(PyExc_ValueError, "scan_envelopes: a value's offsets lie outside the data");
            goto out;
        }
        taken = env_value(data + lo, hi - lo, &cols, i);
        if (taken < 0)
            goto out;
    }
    for (int col = 0; col < ENV_STRINGS; col++)
        if (cols.data[col].len > INT32_MAX)
            taken = 0;
    if (count > INT32_MAX / ENV_SEQ_WIDTH)
        taken = 0;
    if (taken) {
        /* The sequence column: Sequence(commit_lsn, txn_index).sortable() (16 hex digits, '.', 16 hex digits) in
           fixed-width slots, null unless both are present; a negative one is not taken (its Python form is signed). */
        static const char hex[] = "0123456789abcdef";
        char *seq_valid, *seq_offsets, *seq_data;
        if ((objs[18] = new_bytes(bitmap, &seq_valid)) == NULL ||
            (objs[19] = new_bytes((count + 1) * 4, &seq_offsets)) == NULL ||
            (objs[20] = new_bytes(count * ENV_SEQ_WIDTH, &seq_data)) == NULL)
            goto out;
        for (Py_ssize_t i = 0; i <= count; i++) {
            int32_t at = (int32_t)(i * ENV_SEQ_WIDTH);
            memcpy(seq_offsets + i * 4, &at, 4);
        }
        for (Py_ssize_t i = 0; i < count && taken; i++) {
            uint8_t bit = (uint8_t)(1u << (i & 7));
            long long lsn = cols.ints[ENV_LSN][i], index = cols.ints[ENV_INDEX][i];
            int valid = (cols.int_valid[ENV_LSN][i >> 3] & bit) && (cols.int_valid[ENV_INDEX][i >> 3] & bit);
            if (valid && (lsn < 0 || index < 0)) {
                taken = 0;
                break;
            }
            if (valid)
                seq_valid[i >> 3] |= (char)bit;
            else
                lsn = index = 0; /* a null row's slot: zeros */
            char *out = seq_data + i * ENV_SEQ_WIDTH;
            for (int d = 0; d < 16; d++) {
                out[d] = hex[((unsigned long long)lsn >> (60 - 4 * d)) & 15];
                out[17 + d] = hex[((unsigned long long)index >> (60 - 4 * d)) & 15];
            }
            out[16] = '.';
        }
    }
    if (!taken) {
        result = Py_NewRef(Py_None);
        goto out;
    }
    PyObject *strings[ENV_STRINGS] = {NULL}, *images[2] = {NULL};
    int failed = 0;
    for (int col = 0; col < ENV_STRINGS; col++)
        if ((strings[col] = PyBytes_FromStringAndSize((const char *)cols.data[col].data, cols.data[col].len)) == NULL)
            failed = 1;
    for (int side = 0; side < 2; side++)
        if ((images[side] = PyBytes_FromStringAndSize((const char *)cols.images[side].data, cols.images[side].len)) ==
            NULL)
            failed = 1;
    if (!failed) {
        result = PyTuple_New(28);
        if (result != NULL) {
            Py_ssize_t k = 0;
            for (int col = 0; col < ENV_STRINGS; col++) {
                PyTuple_SET_ITEM(result, k++, Py_NewRef(objs[col]));
                PyTuple_SET_ITEM(result, k++, Py_NewRef(objs[5 + col]));
                PyTuple_SET_ITEM(result, k++, Py_NewRef(strings[col]));
            }
            for (int col = 0; col < ENV_INTS; col++) {
                PyTuple_SET_ITEM(result, k++, Py_NewRef(objs[10 + col]));
                PyTuple_SET_ITEM(result, k++, Py_NewRef(objs[13 + col]));
            }
            for (int side = 0; side < 2; side++) {
                PyTuple_SET_ITEM(result, k++, Py_NewRef(objs[16 + side]));
                PyTuple_SET_ITEM(result, k++, Py_NewRef(images[side]));
            }
            for (int part = 18; part < 21; part++)
                PyTuple_SET_ITEM(result, k++, Py_NewRef(objs[part]));
        }
    }
    for (int col = 0; col < ENV_STRINGS; col++)
        Py_XDECREF(strings[col]);
    for (int side = 0; side < 2; side++)
        Py_XDECREF(images[side]);
out:
    for (int k = 0; k < 21; k++)
        Py_XDECREF(objs[k]);
    for (int col = 0; col < ENV_STRINGS; col++)
        buf_free(&cols.data[col]);
    for (int side = 0; side < 2; side++)
        buf_free(&cols.images[side]);
    PyBuffer_Release(&offsets_view);
    PyBuffer_Release(&data_view);
    return result;
}

PyMethodDef hw_log_columns_methods[] = {
    {"decode_columns", decode_columns, METH_VARARGS,
     "decode_columns(parts, min_offset, end_offset, max_records, max_bytes) -> (count, next_offset, offsets, "
     "timestamps_ms, key_validity, key_offsets, key_data, value_validity, value_offsets, value_data)\n\n"
     "parts: (buffer, start, stop, record_count, base_offset) of plain records sections. See log/file/column_decoder.py."},
    {"scan_envelopes", scan_envelopes, METH_VARARGS,
     "scan_envelopes(value_offsets, value_data, first, count) -> 28 column buffers or None. "
     "See spark_log/envelope_scanner.py."},
    {NULL, NULL, 0, NULL},
};
