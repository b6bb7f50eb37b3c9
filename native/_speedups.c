/*
 * Native hot path of capture and of the file log (see native/__init__.py).
 *
 * Every function here has a pure-Python twin that defines its behaviour; whenever an
 * input is outside what this file handles exactly, the function says so (returns None,
 * or a column falls back to its Python converter) and the Python twin decides. The
 * equivalence is pinned by tests/unit/native/test_native.py.
 *
 * (Over 500 lines: this unit creates the module, and capture's per-row codecs (pgoutput decode,
 * the type map's conversions, the JSON writer, the RowEncoder type and the COPY-to-batch pass)
 * share its static helpers and state; what stands alone is in its own file: log_columns.c,
 * batch_columns.c, column_masks.c.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "speedups.h"

static PyTypeObject *wal_message_type; /* WalMessage: tuple subclass (wal_start, payload); bind_libpq */

/* ------------------------------------------------------------------------------------ */
/* The growable byte buffer of speedups.h.                                               */

_Thread_local int hw_without_gil; /* see speedups.h; RowEncoder.copy_batches, sink_rows.c */

int hw_buf_grow(Buf *b, Py_ssize_t extra) {
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            if (!hw_without_gil) PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = PyMem_RawRealloc(b->data, (size_t)cap);
    if (p == NULL) {
        if (!hw_without_gil) PyErr_NoMemory();
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

int hw_buf_int(Buf *b, long long v) {
    char tmp[24];
    char *end = tmp + sizeof tmp, *p = end;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    return buf_put(b, p, end - p);
}

/* A JSON string as orjson writes it: ", \\ and control characters escaped (\b \t \n \f \r,
 * else \u00xx in lowercase hex); everything else, DEL and non-ASCII included, verbatim. */
static int buf_json_string(Buf *b, const char *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (buf_reserve(b, n + 2) < 0) return -1;
    b->data[b->len++] = '"';
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        if (buf_put(b, s + start, i - start) < 0) return -1;
        start = i + 1;
        char esc[6];
        int m = 2;
        esc[0] = '\\';
        switch (c) {
            case '"': esc[1] = '"'; break;
            case '\\': esc[1] = '\\'; break;
            case '\b': esc[1] = 'b'; break;
            case '\t': esc[1] = 't'; break;
            case '\n': esc[1] = 'n'; break;
            case '\f': esc[1] = 'f'; break;
            case '\r': esc[1] = 'r'; break;
            default:
                esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
                esc[4] = hex[c >> 4]; esc[5] = hex[c & 15];
                m = 6;
        }
        if (buf_put(b, esc, m) < 0) return -1;
    }
    if (buf_put(b, s + start, n - start) < 0) return -1;
    return buf_byte(b, '"');
}

/* For the other translation units of the extension (speedups.h). */
int hw_buf_json_string(Buf *b, const char *s, Py_ssize_t n) { return buf_json_string(b, s, n); }

/* ------------------------------------------------------------------------------------ */
/* Kafka's murmur2 partitioner (log/partitioner.py).                                      */

static int32_t murmur2(const unsigned char *data, Py_ssize_t length) {
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cU ^ (uint32_t)length;
    Py_ssize_t i = 0;
    for (; i + 4 <= length; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) | ((uint32_t)data[i + 2] << 16) |
                     ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
        case 3: h ^= (uint32_t)data[i + 2] << 16; /* fall through */
        case 2: h ^= (uint32_t)data[i + 1] << 8;  /* fall through */
        case 1:
            h ^= (uint32_t)data[i];
            h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

/* For the other translation units of the extension (speedups.h). */
int32_t hw_murmur2(const unsigned char *data, Py_ssize_t length) { return murmur2(data, length); }

static PyObject *py_murmur2(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int32_t h = murmur2((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong(h);
}

static PyObject *py_partition_for(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partition_for() takes 2 arguments");
        return NULL;
    }
    long n = PyLong_AsLong(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "partitions must be positive");
        return NULL;
    }
    if (args[0] == Py_None) return PyLong_FromLong(0);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    int32_t h = murmur2((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)((uint32_t)h & 0x7fffffffU) % n);
}

/* group_records(records, counts) -> {topic: [records of partition 0, ...]}: the agent's
 * per-(topic, partition) grouping of pending records (OutRecord: topic, key first), Kafka's
 * partitioner on the key (None, or a one-partition topic: 0). A topic missing from counts
 * comes back alone (a str: the caller creates it and calls again); a key that is not bytes
 * gives None (the Python loop decides). */
static PyObject *py_group_records(PyObject *self, PyObject *args) {
    PyObject *records, *counts;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &records, &PyDict_Type, &counts)) return NULL;
    PyObject *groups = PyDict_New();
    if (groups == NULL) return NULL;
    PyObject *last_topic = NULL, *last_buckets = NULL; /* borrowed */
    Py_ssize_t total = PyList_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < total; i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 2) goto fallback;
        PyObject *topic = PyTuple_GET_ITEM(record, 0), *key = PyTuple_GET_ITEM(record, 1);
        PyObject *buckets;
        if (topic == last_topic) {
            buckets = last_buckets;
        } else {
            if (!PyUnicode_CheckExact(topic)) goto fallback;
            buckets = PyDict_GetItemWithError(groups, topic);
            if (buckets == NULL) {
                if (PyErr_Occurred()) goto error;
                PyObject *count = PyDict_GetItemWithError(counts, topic);
                if (count == NULL) {
                    if (PyErr_Occurred()) goto error;
                    Py_DECREF(groups);
                    return Py_NewRef(topic);
                }
                Py_ssize_t n = PyLong_AsSsize_t(count);
                if (n == -1 && PyErr_Occurred()) goto error;
                if (n <= 0) goto fallback;
                buckets = PyList_New(n);
                if (buckets == NULL) goto error;
                for (Py_ssize_t p = 0; p < n; p++) {
                    PyObject *bucket = PyList_New(0);
                    if (bucket == NULL) {
                        Py_DECREF(buckets);
                        goto error;
                    }
                    PyList_SET_ITEM(buckets, p, bucket);
                }
                int rc = PyDict_SetItem(groups, topic, buckets);
                Py_DECREF(buckets); /* the dict holds it */
                if (rc < 0) goto error;
            }
            last_topic = topic;
            last_buckets = buckets;
        }
        Py_ssize_t n = PyList_GET_SIZE(buckets), partition = 0;
        if (key != Py_None && n > 1) {
            if (!PyBytes_Check(key)) goto fallback;
            int32_t h = murmur2((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
            partition = (Py_ssize_t)(((uint32_t)h & 0x7fffffffU) % (uint32_t)n);
        }
        if (PyList_Append(PyList_GET_ITEM(buckets, partition), record) < 0) goto error;
    }
    return groups;
fallback:
    Py_DECREF(groups);
    Py_RETURN_NONE;
error:
    Py_DECREF(groups);
    return NULL;
}


static PyObject *py_partitions(PyObject *self, PyObject *args) {
    PyObject *keys;
    long n;
    if (!PyArg_ParseTuple(args, "Ol", &keys, &n)) return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "partitions must be positive");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(count);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        long p = 0;
        if (key != Py_None) {
            if (!PyBytes_Check(key)) {
                PyErr_SetString(PyExc_TypeError, "keys must be bytes or None");
                goto fail;
            }
            int32_t h = murmur2((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
            p = (long)((uint32_t)h & 0x7fffffffU) % n;
        }
        PyObject *v = PyLong_FromLong(p);
        if (v == NULL) goto fail;
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}


/* ------------------------------------------------------------------------------------ */
/* CRC-32C (Castagnoli, as Kafka's record batches): log/file/batch_codec.py crc32c_python.     */
/* SSE4.2's crc32 instruction where the CPU has it, else slicing-by-8 tables; both give    */
/* the same value. Chained like zlib.crc32: crc32c(b, crc32c(a)) == crc32c(a + b).         */

static uint32_t crc32c_table[8][256];

static void crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78U : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
}

static uint32_t crc32c_portable(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian host */
        crc = crc32c_table[7][w & 0xff] ^ crc32c_table[6][(w >> 8) & 0xff] ^ crc32c_table[5][(w >> 16) & 0xff] ^
              crc32c_table[4][(w >> 24) & 0xff] ^ crc32c_table[3][(w >> 32) & 0xff] ^
              crc32c_table[2][(w >> 40) & 0xff] ^ crc32c_table[1][(w >> 48) & 0xff] ^ crc32c_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_CRC32C_HW 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

static int crc32c_hardware; /* set at import: the CPU has SSE4.2 */

static inline uint32_t crc32c(uint32_t crc, const void *data, size_t n);

/* For the other translation units of the extension (speedups.h). */
uint32_t hw_crc32c(uint32_t crc, const void *data, size_t n) { return crc32c(crc, data, n); }

static inline uint32_t crc32c(uint32_t crc, const void *data, size_t n) {
#ifdef HAVE_CRC32C_HW
    if (crc32c_hardware) return crc32c_hw(crc, data, n);
#endif
    return crc32c_portable(crc, data, n);
}

/* crc32c(data, value=0, portable=False) -> int; the GIL is released for large inputs. */
static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int value = 0;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "y*|Ip", &view, &value, &portable)) return NULL;
    uint32_t crc;
    if (view.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        crc = portable ? crc32c_portable(value, view.buf, (size_t)view.len) : crc32c(value, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = portable ? crc32c_portable(value, view.buf, (size_t)view.len) : crc32c(value, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* seal_batch_header(batch, base_offset, count, max_ts): fill the header of a batch whose records
 * follow a 38-byte placeholder (length, magic, attributes = CRC-32C, offsets, count, max timestamp)
 * and its CRC-32C; the GIL is released for the CRC of a large batch. */
#define BATCH_HEADER 38
#define ATTR_CRC32C 0x0100
static inline void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); } /* little-endian host */
static inline void put_i64(char *p, int64_t v) { memcpy(p, &v, 8); }

static void fill_header(char *p, Py_ssize_t total, long long base, Py_ssize_t count, long long max_ts) {
    put_u32(p, (uint32_t)total);
    put_u32(p + 4, 0);
    memcpy(p + 8, "HWB1", 4);
    uint16_t attrs = ATTR_CRC32C;
    memcpy(p + 12, &attrs, 2);
    put_i64(p + 14, (int64_t)base);
    put_u32(p + 22, (uint32_t)(count - 1));
    put_u32(p + 26, (uint32_t)count);
    put_i64(p + 30, (int64_t)max_ts);
}

static inline uint32_t batch_crc(const char *p, Py_ssize_t total) {
    return crc32c(crc32c(0, p, 4), p + 8, (size_t)(total - 8));
}

static PyObject *py_seal_batch_header(PyObject *self, PyObject *args) {
    PyObject *batch;
    long long base, max_ts;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!LnL", &PyByteArray_Type, &batch, &base, &count, &max_ts)) return NULL;
    Py_ssize_t total = PyByteArray_GET_SIZE(batch);
    if (total < BATCH_HEADER || total > UINT32_MAX || count < 1 || count > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "seal_batch_header(): not a batch");
        return NULL;
    }
    char *p = PyByteArray_AS_STRING(batch);
    fill_header(p, total, base, count, max_ts);
    uint32_t crc;
    if (total >= 65536) {
        /* The bytearray cannot be resized meanwhile: only this thread's caller holds it. */
        Py_BEGIN_ALLOW_THREADS
        crc = batch_crc(p, total);
        Py_END_ALLOW_THREADS
    } else {
        crc = batch_crc(p, total);
    }
    put_u32(p + 4, crc);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------ */
/* zstd for compressed batches (log/file/batch_codec.py: codec 4, ``raw_length u32 | frame``).  */
/*                                                                                       */
/* The system's libzstd, opened at first use (never linked at build time): without it the */
/* batches come back plain and the Python side compresses them (pyarrow's codec).         */

typedef void *(*zstd_create_cctx_fn)(void);
typedef size_t (*zstd_free_cctx_fn)(void *cctx);
typedef size_t (*zstd_compress_cctx_fn)(void *cctx, void *dst, size_t cap, const void *src, size_t n, int level);
typedef size_t (*zstd_bound_fn)(size_t n);
typedef unsigned (*zstd_is_error_fn)(size_t code);
typedef unsigned (*zstd_version_fn)(void);
typedef size_t (*zstd_decompress_fn)(void *dst, size_t cap, const void *src, size_t n);

static int zstd_state; /* 0: not tried yet, 1: bound, -1: no usable libzstd */
static zstd_create_cctx_fn zstd_create_cctx;
static zstd_free_cctx_fn zstd_free_cctx;
static zstd_compress_cctx_fn zstd_compress_cctx;
static zstd_bound_fn zstd_bound;
static zstd_is_error_fn zstd_is_error;
static zstd_decompress_fn zstd_decompress;
static unsigned zstd_version_number;

/* Called with the GIL held (it serialises the first binding). */
static int zstd_bind(void) {
    if (zstd_state != 0) return zstd_state > 0;
    zstd_state = -1;
    const char *off = getenv("HEADWATER_NATIVE_ZSTD");
    if (off != NULL && strcmp(off, "0") == 0) return 0;
    void *handle = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) return 0;
    zstd_version_fn version = (zstd_version_fn)dlsym(handle, "ZSTD_versionNumber");
    zstd_create_cctx = (zstd_create_cctx_fn)dlsym(handle, "ZSTD_createCCtx");
    zstd_free_cctx = (zstd_free_cctx_fn)dlsym(handle, "ZSTD_freeCCtx");
    zstd_compress_cctx = (zstd_compress_cctx_fn)dlsym(handle, "ZSTD_compressCCtx");
    zstd_bound = (zstd_bound_fn)dlsym(handle, "ZSTD_compressBound");
    zstd_is_error = (zstd_is_error_fn)dlsym(handle, "ZSTD_isError");
    zstd_decompress = (zstd_decompress_fn)dlsym(handle, "ZSTD_decompress");
    /* Negative levels (level -1, batch_codec.ZSTD_LEVEL) need 1.3.4; the frame format is the same. */
    if (!version || !zstd_create_cctx || !zstd_free_cctx || !zstd_compress_cctx || !zstd_bound || !zstd_is_error ||
        !zstd_decompress || version() < 10304) {
        dlclose(handle);
        return 0;
    }
    zstd_version_number = version();
    zstd_state = 1;
    return 1;
}

static void zstd_free_context(void *cctx) {
    if (cctx != NULL && zstd_free_cctx != NULL) zstd_free_cctx(cctx);
}

/* zstd_compress(data, level) -> one zstd frame of data, or None without libzstd (zstd_version()).
 * The GIL is released while compressing. */
static PyObject *py_zstd_compress(PyObject *self, PyObject *args) {
    Py_buffer view;
    int level;
    if (!PyArg_ParseTuple(args, "y*i", &view, &level)) return NULL;
    if (!zstd_bind()) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    size_t bound = zstd_bound((size_t)view.len);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bound);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    size_t got;
    Py_BEGIN_ALLOW_THREADS
    void *cctx = zstd_create_cctx();
    got = cctx ? zstd_compress_cctx(cctx, PyBytes_AS_STRING(out), bound, view.buf, (size_t)view.len, level) : 0;
    if (cctx == NULL) got = (size_t)-1;
    zstd_free_context(cctx);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (zstd_is_error(got)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_MemoryError, "zstd could not compress (no memory)");
        return NULL;
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)got) < 0) return NULL;
    return out;
}

/* zstd_decompress(frame, size) -> the size bytes frame holds (ValueError when it does not hold
 * exactly that many, or is no zstd frame), or None without libzstd. The GIL is released. */
static PyObject *py_zstd_decompress(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "y*n", &view, &size)) return NULL;
    if (!zstd_bind()) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    if (size < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "zstd_decompress(): negative size");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    size_t got;
    Py_BEGIN_ALLOW_THREADS
    got = zstd_decompress(PyBytes_AS_STRING(out), (size_t)size, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (zstd_is_error(got) || got != (size_t)size) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, zstd_is_error(got) ? "not a zstd frame of that size" : "zstd frame of another size");
        return NULL;
    }
    return out;
}

/* zstd_version() -> the bound libzstd's version number (10504 for 1.5.4), or None when batches
 * are compressed by the Python side (no libzstd, or HEADWATER_NATIVE_ZSTD=0). */
static PyObject *py_zstd_version(PyObject *self, PyObject *unused) {
    if (!zstd_bind()) Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(zstd_version_number);
}

/* ------------------------------------------------------------------------------------ */
/* File-log record encoding (log/file/batch_codec.py encode_batch).                            */

static PyObject *s_key, *s_value, *s_headers, *s_timestamp_ms;

/* encode_batch(base_offset, records, now_ms) -> (bytearray, max_ts) | None
 *
 * log/file/batch_codec.py's batch, header, records and CRC-32C, in one buffer. None when a record
 * needs the Python encoder (headers, odd types) or there are none. */
static PyObject *py_encode_batch(PyObject *self, PyObject *args) {
    long long base, now_ms;
    PyObject *records;
    if (!PyArg_ParseTuple(args, "LOL", &base, &records, &now_ms)) return NULL;
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **keys = NULL, **values = NULL;
    long long *stamps = NULL;
    PyObject *result = NULL;
    int fallback = count == 0 || count > UINT32_MAX;
    if (!fallback) {
        keys = PyMem_Calloc((size_t)count, sizeof(PyObject *));
        values = PyMem_Calloc((size_t)count, sizeof(PyObject *));
        stamps = PyMem_Calloc((size_t)count, sizeof(long long));
        if (!keys || !values || !stamps) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_ssize_t total = 38;
    long long max_ts = INT64_MIN;
    for (Py_ssize_t i = 0; i < count && !fallback; i++) {
        PyObject *r = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *headers = PyObject_GetAttr(r, s_headers);
        if (headers == NULL) goto done;
        int truthy = PyObject_IsTrue(headers);
        Py_DECREF(headers);
        if (truthy < 0) goto done;
        if (truthy) {
            fallback = 1;
            break;
        }
        /* Borrowed for the call: a record's fields do not change while it is being appended. */
        PyObject *key = PyObject_GetAttr(r, s_key);
        if (key == NULL) goto done;
        Py_DECREF(key);
        PyObject *value = PyObject_GetAttr(r, s_value);
        if (value == NULL) goto done;
        Py_DECREF(value);
        PyObject *ts = PyObject_GetAttr(r, s_timestamp_ms);
        if (ts == NULL) goto done;
        long long t = now_ms;
        if (ts != Py_None) {
            t = PyLong_AsLongLong(ts);
            if (t == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                fallback = 1;
            }
        }
        Py_DECREF(ts);
        if ((key != Py_None && !PyBytes_Check(key)) || (value != Py_None && !PyBytes_Check(value))) fallback = 1;
        if (fallback) break;
        Py_ssize_t klen = key == Py_None ? 0 : PyBytes_GET_SIZE(key);
        Py_ssize_t vlen = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        if (klen > INT32_MAX || vlen > INT32_MAX) {
            fallback = 1;
            break;
        }
        keys[i] = key;
        values[i] = value;
        stamps[i] = t;
        if (t > max_ts) max_ts = t;
        total += 24 + klen + vlen;
    }
    if (fallback || total > UINT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *batch = PyByteArray_FromStringAndSize(NULL, total);
    if (batch == NULL) goto done;
    char *start = PyByteArray_AS_STRING(batch), *p = start;
    fill_header(p, total, base, count, max_ts);
    p += BATCH_HEADER;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = keys[i], *value = values[i];
        Py_ssize_t klen = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
        Py_ssize_t vlen = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
        put_u32(p, (uint32_t)i);
        put_i64(p + 4, (int64_t)stamps[i]);
        put_u32(p + 12, (uint32_t)(int32_t)klen);
        put_u32(p + 16, (uint32_t)(int32_t)vlen);
        put_u32(p + 20, 0);
        p += 24;
        if (klen > 0) {
            memcpy(p, PyBytes_AS_STRING(key), (size_t)klen);
            p += klen;
        }
        if (vlen > 0) {
            memcpy(p, PyBytes_AS_STRING(value), (size_t)vlen);
            p += vlen;
        }
    }
    put_u32(start + 4, batch_crc(start, total));
    result = Py_BuildValue("(NL)", batch, max_ts);
done:
    PyMem_Free(keys);
    PyMem_Free(values);
    PyMem_Free(stamps);
    Py_DECREF(seq);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* pgoutput TupleData (capture/postgres/decoding/pgoutput.py _read_tuple).                                  */

/* TupleData at *pos of d[0:n]: a new tuple and *pos after it; NULL without an error set when
 * malformed (the Python twin raises), NULL with an error set on memory errors. */
static PyObject *read_tuple_at(const unsigned char *d, Py_ssize_t n, Py_ssize_t *ppos, PyObject *unchanged) {
    Py_ssize_t pos = *ppos;
    if (pos < 0 || pos + 2 > n) return NULL;
    int16_t count = (int16_t)((d[pos] << 8) | d[pos + 1]);
    pos += 2;
    if (count < 0) count = 0; /* range(negative) is empty in the Python twin */
    PyObject *tuple = PyTuple_New(count);
    if (tuple == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos >= n) goto malformed;
        unsigned char kind = d[pos];
        PyObject *v;
        if (kind == 't' || kind == 'b') {
            if (pos + 5 > n) goto malformed;
            int32_t len = (int32_t)(((uint32_t)d[pos + 1] << 24) | ((uint32_t)d[pos + 2] << 16) |
                                    ((uint32_t)d[pos + 3] << 8) | (uint32_t)d[pos + 4]);
            pos += 5;
            if (len < 0 || pos + len > n) goto malformed;
            if (kind == 't') {
                v = PyUnicode_DecodeUTF8((const char *)d + pos, len, NULL);
                if (v == NULL) {
                    PyErr_Clear();
                    goto malformed;
                }
            } else {
                v = PyBytes_FromStringAndSize((const char *)d + pos, len);
                if (v == NULL) {
                    Py_DECREF(tuple);
                    return NULL;
                }
            }
            pos += len;
        } else if (kind == 'n') {
            v = Py_NewRef(Py_None);
            pos += 1;
        } else if (kind == 'u') {
            v = Py_NewRef(unchanged);
            pos += 1;
        } else {
            goto malformed;
        }
        PyTuple_SET_ITEM(tuple, i, v);
    }
    *ppos = pos;
    return tuple;
malformed:
    Py_DECREF(tuple);
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* Row-change messages (capture/postgres/decoding/pgoutput.py _insert/_update/_delete).                      */

/* The message classes and the slot descriptors of their fields, set once by configure(). */
enum { F_OID, F_NEW, F_OLD, F_OLD_IS_KEY, F_XID, F_COUNT };
static const char *field_names[F_COUNT] = {"relation_oid", "new", "old", "old_is_key", "xid"};
static PyTypeObject *msg_types[3];          /* Insert, Update, Delete */
static PyObject *msg_fields[3][F_COUNT];    /* member descriptors (NULL: no such field) */
static PyObject *unchanged_marker;

static PyObject *py_configure(PyObject *self, PyObject *args) {
    PyObject *types[3], *unchanged;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyType_Type, &types[0], &PyType_Type, &types[1], &PyType_Type, &types[2],
                          &unchanged))
        return NULL;
    for (int t = 0; t < 3; t++) {
        Py_XSETREF(msg_types[t], (PyTypeObject *)Py_NewRef(types[t]));
        for (int f = 0; f < F_COUNT; f++) {
            PyObject *descr = PyDict_GetItemString(((PyTypeObject *)types[t])->tp_dict, field_names[f]);
            if (descr != NULL && !(Py_TYPE(descr)->tp_descr_set)) descr = NULL;
            Py_XSETREF(msg_fields[t][f], Py_XNewRef(descr));
        }
    }
    Py_XSETREF(unchanged_marker, Py_NewRef(unchanged));
    Py_RETURN_NONE;
}

/* Set a slot through its member descriptor (frozen dataclasses refuse setattr, slots do not). */
static int set_field(PyObject *obj, int t, int f, PyObject *value) {
    PyObject *descr = msg_fields[t][f];
    int rc = descr ? Py_TYPE(descr)->tp_descr_set(descr, obj, value) : -1;
    if (descr == NULL) PyErr_SetString(PyExc_TypeError, "message class has no such slot");
    Py_DECREF(value);
    return rc;
}

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* decode_change(data, in_stream) -> Insert | Update | Delete, or None (not one, or malformed:
 * the Python decoder decides and raises). */
static PyObject *decode_change_at(const unsigned char *d, Py_ssize_t n, int in_stream) {
    PyObject *old = NULL, *new = NULL, *xid = NULL, *obj = NULL;
    int t = -1;
    if (n < 1 || msg_types[0] == NULL) goto fallback;
    t = d[0] == 'I' ? 0 : d[0] == 'U' ? 1 : d[0] == 'D' ? 2 : -1;
    if (t < 0) goto fallback;
    Py_ssize_t pos = 1;
    if (in_stream) {
        if (n < 5) goto fallback;
        xid = PyLong_FromUnsignedLong(be32(d + 1));
        if (xid == NULL) goto error;
        pos = 5;
    } else {
        xid = Py_NewRef(Py_None);
    }
    if (pos + 5 > n) goto fallback;
    uint32_t oid = be32(d + pos);
    unsigned char kind = d[pos + 4];
    pos += 5;
    int old_is_key = 0;
    if (t == 0) {
        if (kind != 'N') goto fallback;
        new = read_tuple_at(d, n, &pos, unchanged_marker);
        if (new == NULL) goto maybe_error;
    } else if (t == 1) {
        if (kind == 'K' || kind == 'O') {
            old_is_key = kind == 'K';
            old = read_tuple_at(d, n, &pos, unchanged_marker);
            if (old == NULL) goto maybe_error;
            if (pos >= n) goto fallback;
            kind = d[pos++];
        }
        if (kind != 'N') goto fallback;
        new = read_tuple_at(d, n, &pos, unchanged_marker);
        if (new == NULL) goto maybe_error;
        if (old == NULL) old = Py_NewRef(Py_None);
    } else {
        if (kind != 'K' && kind != 'O') goto fallback;
        old_is_key = kind == 'K';
        old = read_tuple_at(d, n, &pos, unchanged_marker);
        if (old == NULL) goto maybe_error;
    }
    obj = msg_types[t]->tp_alloc(msg_types[t], 0);
    if (obj == NULL) goto error;
    PyObject *oid_obj = PyLong_FromUnsignedLong(oid);
    if (oid_obj == NULL || set_field(obj, t, F_OID, oid_obj) < 0) goto error;
    if (new != NULL) {
        if (set_field(obj, t, F_NEW, new) < 0) {
            new = NULL;
            goto error;
        }
        new = NULL;
    }
    if (old != NULL) {
        if (set_field(obj, t, F_OLD, old) < 0) {
            old = NULL;
            goto error;
        }
        old = NULL;
        if (set_field(obj, t, F_OLD_IS_KEY, PyBool_FromLong(old_is_key)) < 0) goto error;
    }
    int rc = set_field(obj, t, F_XID, xid);
    xid = NULL;
    if (rc < 0) goto error;
    return obj;
maybe_error:
    if (PyErr_Occurred()) goto error;
fallback:
    Py_XDECREF(old);
    Py_XDECREF(new);
    Py_XDECREF(xid);
    Py_XDECREF(obj);
    Py_RETURN_NONE;
error:
    Py_XDECREF(old);
    Py_XDECREF(new);
    Py_XDECREF(xid);
    Py_XDECREF(obj);
    return NULL;
}

static PyObject *py_decode_change(PyObject *self, PyObject *args) {
    Py_buffer view;
    int in_stream;
    if (!PyArg_ParseTuple(args, "y*p", &view, &in_stream)) return NULL;
    PyObject *out = decode_change_at(view.buf, view.len, in_stream);
    PyBuffer_Release(&view);
    return out;
}

/* take_changes(frames, pos, changes, lsns) -> pos: from frames[pos] on, each WalMessage whose
 * payload is an Insert/Update/Delete outside a streamed transaction goes decoded into
 * ``changes`` and its wal_start into ``lsns`` (TransactionAssembler.feed's open-transaction
 * case); stops at the first other frame (or one decode_change hands back), returning its index. */
static PyObject *py_take_changes(PyObject *self, PyObject *args) {
    PyObject *frames, *changes, *lsns;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "O!nO!O!", &PyList_Type, &frames, &pos, &PyList_Type, &changes, &PyList_Type, &lsns))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(frames);
    for (; pos < count; pos++) {
        PyObject *frame = PyList_GET_ITEM(frames, pos);
        if (wal_message_type == NULL || Py_TYPE(frame) != wal_message_type) break;
        PyObject *payload = PyTuple_GET_ITEM(frame, 1);
        if (!PyBytes_Check(payload)) break;
        PyObject *change =
            decode_change_at((const unsigned char *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), 0);
        if (change == NULL) return NULL;
        if (change == Py_None) {
            Py_DECREF(change);
            break;
        }
        int rc = PyList_Append(changes, change);
        Py_DECREF(change);
        if (rc < 0 || PyList_Append(lsns, PyTuple_GET_ITEM(frame, 0)) < 0) return NULL;
    }
    return PyLong_FromSsize_t(pos);
}

static PyObject *py_read_tuple(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    PyObject *unchanged;
    if (!PyArg_ParseTuple(args, "y*nO", &view, &pos, &unchanged)) return NULL;
    PyObject *tuple = read_tuple_at(view.buf, view.len, &pos, unchanged);
    PyBuffer_Release(&view);
    if (tuple == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE; /* malformed: the Python twin raises the decode error with its position */
    }
    return Py_BuildValue("(Nn)", tuple, pos);
}

/* ------------------------------------------------------------------------------------ */
/* Row images as JSON (capture/postgres/types/typemap.py converters + orjson.dumps).                     */

enum {
    K_PYTHON = 0,        /* the column's Python converter, then orjson */
    K_INT = 1,           /* int2/int4/int8/oid */
    K_STRING = 2,        /* text as is */
    K_BOOL = 3,          /* 't' -> true */
    K_DECIMAL_STRING = 4,/* numeric, decimal_handling_mode=string */
    K_TIMESTAMP_US = 5,
    K_TIMESTAMP_MS = 6,
    K_TIMESTAMPTZ = 7,   /* param: fraction width */
    K_DATE = 8,
    K_BYTEA_BASE64 = 9,
    K_BYTEA_HEX = 10,
    /* Masks (capture/column_masks.py): the value's text is masked, never converted. */
    K_MASK_REPLACE = 11, /* blob: the replacement as JSON */
    K_MASK_TRUNCATE = 12,/* param: characters kept */
    K_MASK_SHA256 = 13,  /* param: hash version | length << 2 (0: the whole digest); blob: the salt */
};

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    int *kinds;
    int *params;
    char *emit;               /* 0: excluded column (converted, then dropped) */
    PyObject **names_json;    /* bytes b'"name":' */
    PyObject **converters;    /* Python converters, one per column */
    PyObject **blobs;         /* per column: bytes a mask kind needs (salt, replacement JSON), else NULL */
    Py_ssize_t nkeys;
    Py_ssize_t *key_cols;
    PyObject *dumps;          /* orjson.dumps */
    PyObject *unchanged;      /* UNCHANGED_TOAST */
    Buf buf;
    Buf key;
    Buf value;
    Py_ssize_t *starts, *ends;  /* value span of each column in buf */
    const char **vals;          /* the row being encoded: UTF-8 text (NULL: SQL NULL) */
    Py_ssize_t *lens;
    PyObject **objs;            /* the same values as str where known (borrowed), else NULL */
    Buf scratch;                /* unescaped COPY fields */
    Py_ssize_t *offs;           /* field offsets into scratch (-1: NULL) */
    PyThreadState *released;    /* copy_batches runs without the GIL: its saved thread state */
    int busy;                   /* inside copy_batches (one thread at a time per encoder) */
    /* copy_batches' buffers, kept from call to call: a fresh multi-MiB buffer per piece costs a
     * page fault per 4 KiB (zeroing, unmapping), more than encoding the rows into it. */
    Buf *parts;                 /* per partition: header placeholder + records (compressing: the records
                                 * not yet compressed, at most about COMPRESS_SEGMENT) */
    Py_ssize_t nparts;          /* parts allocated */
    Py_ssize_t *counts;
    long long *lasts;
    Buf *zparts;                /* per partition, compressing: header placeholder + raw_length + zstd frames */
    Py_ssize_t *raws;           /* per partition: record bytes compressed into zparts so far */
    void *zcctx;                /* zstd compression context (libzstd, bound at first use) */
} RowEncoder;

static void zstd_free_context(void *cctx);

static void RowEncoder_free_parts(RowEncoder *self) {
    for (Py_ssize_t p = 0; p < self->nparts; p++) {
        if (self->parts) buf_free(&self->parts[p]);
        if (self->zparts) buf_free(&self->zparts[p]);
    }
    PyMem_RawFree(self->parts);
    PyMem_RawFree(self->counts);
    PyMem_RawFree(self->lasts);
    PyMem_RawFree(self->zparts);
    PyMem_RawFree(self->raws);
    self->parts = self->zparts = NULL;
    self->counts = self->raws = NULL;
    self->lasts = NULL;
    self->nparts = 0;
}

static void RowEncoder_dealloc(RowEncoder *self) {
    RowEncoder_free_parts(self);
    zstd_free_context(self->zcctx);
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        if (self->names_json) Py_XDECREF(self->names_json[i]);
        if (self->converters) Py_XDECREF(self->converters[i]);
        if (self->blobs) Py_XDECREF(self->blobs[i]);
    }
    PyMem_Free(self->blobs);
    PyMem_Free(self->kinds);
    PyMem_Free(self->params);
    PyMem_Free(self->emit);
    PyMem_Free(self->names_json);
    PyMem_Free(self->converters);
    PyMem_Free(self->key_cols);
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    PyMem_Free(self->vals);
    PyMem_Free(self->lens);
    PyMem_Free(self->objs);
    PyMem_Free(self->offs);
    buf_free(&self->scratch);
    Py_XDECREF(self->dumps);
    Py_XDECREF(self->unchanged);
    buf_free(&self->buf);
    buf_free(&self->key);
    buf_free(&self->value);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* RowEncoder(kinds, params, emit, names_json, converters, key_columns, dumps, unchanged, blobs=None) */
static int RowEncoder_init(RowEncoder *self, PyObject *args, PyObject *kwds) {
    PyObject *kinds, *params, *emit, *names, *convs, *keys, *dumps, *unchanged, *blobs = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!OO|O", &PyTuple_Type, &kinds, &PyTuple_Type, &params, &PyTuple_Type,
                          &emit, &PyTuple_Type, &names, &PyTuple_Type, &convs, &PyTuple_Type, &keys, &dumps,
                          &unchanged, &blobs))
        return -1;
    if (blobs != Py_None && (!PyTuple_Check(blobs) || PyTuple_GET_SIZE(blobs) != PyTuple_GET_SIZE(kinds))) {
        PyErr_SetString(PyExc_ValueError, "blobs must be None or a tuple as long as kinds");
        return -1;
    }
    if (self->kinds != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "RowEncoder is already initialised");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(kinds);
    if (PyTuple_GET_SIZE(params) != n || PyTuple_GET_SIZE(emit) != n || PyTuple_GET_SIZE(names) != n ||
        PyTuple_GET_SIZE(convs) != n) {
        PyErr_SetString(PyExc_ValueError, "kinds, params, emit, names_json and converters differ in length");
        return -1;
    }
    Py_ssize_t nk = PyTuple_GET_SIZE(keys);
    self->kinds = PyMem_Calloc((size_t)n + 1, sizeof(int));
    self->params = PyMem_Calloc((size_t)n + 1, sizeof(int));
    self->emit = PyMem_Calloc((size_t)n + 1, 1);
    self->names_json = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    self->converters = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    self->blobs = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    self->key_cols = PyMem_Calloc((size_t)nk + 1, sizeof(Py_ssize_t));
    self->starts = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    self->ends = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    self->vals = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    self->lens = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    self->objs = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    self->offs = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    if (!self->kinds || !self->params || !self->emit || !self->names_json || !self->converters || !self->blobs ||
        !self->key_cols ||
        !self->starts || !self->ends || !self->vals || !self->lens || !self->objs || !self->offs) {
        PyErr_NoMemory();
        return -1;
    }
    self->ncols = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        self->kinds[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(kinds, i));
        self->params[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(params, i));
        int e = PyObject_IsTrue(PyTuple_GET_ITEM(emit, i));
        if (PyErr_Occurred()) return -1;
        self->emit[i] = (char)e;
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "names_json must hold bytes");
            return -1;
        }
        self->names_json[i] = Py_NewRef(name);
        self->converters[i] = Py_NewRef(PyTuple_GET_ITEM(convs, i));
        PyObject *blob = blobs == Py_None ? Py_None : PyTuple_GET_ITEM(blobs, i);
        int kind = self->kinds[i];
        if ((kind == K_MASK_REPLACE || kind == K_MASK_SHA256) && !PyBytes_Check(blob)) {
            PyErr_SetString(PyExc_TypeError, "a replace or hash mask needs its bytes in blobs");
            return -1;
        }
        self->blobs[i] = blob == Py_None ? NULL : Py_NewRef(blob);
    }
    for (Py_ssize_t k = 0; k < nk; k++) {
        Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, k));
        if (PyErr_Occurred()) return -1;
        if (c < 0 || c >= n || !self->emit[c]) {
            PyErr_SetString(PyExc_ValueError, "key column out of range or excluded");
            return -1;
        }
        self->key_cols[k] = c;
    }
    self->nkeys = nk;
    self->dumps = Py_NewRef(dumps);
    self->unchanged = Py_NewRef(unchanged);
    return 0;
}

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

static inline long long digits(const char *s, int n) {
    long long v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (s[i] - '0');
    return v;
}

static long long days_from_civil(long long y, long long m, long long d) {
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline long long floor_div(long long a, long long b) {
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* "YYYY-MM-DD HH:MM:SS[.f{1,6}]": microseconds since the epoch; 0 if not this exact form. */
static int parse_timestamp(const char *s, Py_ssize_t n, long long *out) {
    if (n < 19 || n > 26) return 0;
    static const char pat[] = "dddd-dd-dd dd:dd:dd";
    for (int i = 0; i < 19; i++) {
        if (pat[i] == 'd' ? !is_digit(s[i]) : s[i] != pat[i]) return 0;
    }
    long long micros = 0;
    if (n > 19) {
        if (s[19] != '.' || n == 20) return 0;
        int w = (int)(n - 20);
        for (int i = 0; i < 6; i++) {
            if (i < w) {
                if (!is_digit(s[20 + i])) return 0;
                micros = micros * 10 + (s[20 + i] - '0');
            } else {
                micros *= 10;
            }
        }
    }
    long long days = days_from_civil(digits(s, 4), digits(s + 5, 2), digits(s + 8, 2));
    long long secs = (digits(s + 11, 2) * 60 + digits(s + 14, 2)) * 60 + digits(s + 17, 2);
    *out = days * 86400000000LL + secs * 1000000LL + micros;
    return 1;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static inline int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The native conversion of one text value; 1: written, 0: not this form (use the Python converter). */
static inline int put_bytes_obj(Buf *b, PyObject *o) { return buf_put(b, PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o)); }

static int convert_native(RowEncoder *self, Py_ssize_t col, const char *s, Py_ssize_t n) {
    Buf *b = &self->buf;
    int kind = self->kinds[col], param = self->params[col];
    switch (kind) {
        case K_STRING:
            return buf_json_string(b, s, n) < 0 ? -1 : 1;
        case K_BOOL:
            return (n == 1 && s[0] == 't' ? buf_put(b, "true", 4) : buf_put(b, "false", 5)) < 0 ? -1 : 1;
        case K_INT: {
            Py_ssize_t i = s[0] == '-' ? 1 : 0;
            Py_ssize_t nd = n - i;
            if (nd < 1 || nd > 18) return 0; /* int8 extremes: Python's int */
            if (s[i] == '0' && (nd > 1 || i == 1)) return 0;
            for (Py_ssize_t j = i; j < n; j++)
                if (!is_digit(s[j])) return 0;
            return buf_put(b, s, n) < 0 ? -1 : 1;
        }
        case K_DECIMAL_STRING: {
            if (n == 0) return 0;
            for (Py_ssize_t j = 0; j < n; j++)
                if (!(is_digit(s[j]) || s[j] == '.' || s[j] == '-')) return 0; /* NaN, Infinity: Python */
            return buf_json_string(b, s, n) < 0 ? -1 : 1;
        }
        case K_TIMESTAMP_US:
        case K_TIMESTAMP_MS: {
            long long us;
            if (!parse_timestamp(s, n, &us)) return 0;
            return hw_buf_int(b, kind == K_TIMESTAMP_MS ? floor_div(us, 1000) : us) < 0 ? -1 : 1;
        }
        case K_TIMESTAMPTZ: {
            /* The converter's UTC fast path: "YYYY-MM-DD HH:MM:SS[.f]+00" -> "YYYY-MM-DDTHH:MM:SS[.f]Z". */
            if (n < 22 || n > 40 || s[n - 3] != '+' || s[n - 2] != '0' || s[n - 1] != '0' || s[10] != ' ' ||
                s[4] != '-')
                return 0;
            for (Py_ssize_t j = 0; j < n; j++)
                if ((unsigned char)s[j] >= 0x80 || s[j] == '"' || s[j] == '\\' || (unsigned char)s[j] < 0x20)
                    return 0;
            char out[64];
            int m = 0;
            memcpy(out, s, 10);
            out[10] = 'T';
            memcpy(out + 11, s + 11, 8);
            m = 19;
            Py_ssize_t flen = n - 3 - 20;
            if (flen < 0) flen = 0;
            if (param > 0) {
                if (param > 6) return 0;
                out[m++] = '.';
                for (int i = 0; i < param; i++) out[m++] = i < flen ? s[20 + i] : '0';
            }
            out[m++] = 'Z';
            if (buf_reserve(b, m + 2) < 0) return -1;
            b->data[b->len++] = '"';
            memcpy(b->data + b->len, out, (size_t)m);
            b->len += m;
            b->data[b->len++] = '"';
            return 1;
        }
        case K_DATE: {
            if (n != 10 || s[4] != '-' || s[7] != '-') return 0;
            for (int i = 0; i < 10; i++)
                if (i != 4 && i != 7 && !is_digit(s[i])) return 0;
            return hw_buf_int(b, days_from_civil(digits(s, 4), digits(s + 5, 2), digits(s + 8, 2))) < 0 ? -1 : 1;
        }
        case K_BYTEA_HEX: {
            if (n < 2 || s[0] != '\\' || s[1] != 'x') return 0;
            return buf_json_string(b, s + 2, n - 2) < 0 ? -1 : 1;
        }
        case K_BYTEA_BASE64: {
            if (n < 2 || s[0] != '\\' || s[1] != 'x' || (n - 2) % 2 != 0) return 0;
            Py_ssize_t raw = (n - 2) / 2;
            if (buf_reserve(b, (raw + 2) / 3 * 4 + 2) < 0) return -1;
            Py_ssize_t mark = b->len;
            char *o = b->data + b->len;
            *o++ = '"';
            const char *h = s + 2;
            unsigned char chunk[3];
            Py_ssize_t i = 0;
            while (i < raw) {
                int got = 0;
                for (; got < 3 && i < raw; got++, i++) {
                    int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
                    if (hi < 0 || lo < 0) {
                        b->len = mark;
                        return 0;
                    }
                    chunk[got] = (unsigned char)(hi << 4 | lo);
                }
                uint32_t v = (uint32_t)chunk[0] << 16 | (got > 1 ? (uint32_t)chunk[1] << 8 : 0) |
                             (got > 2 ? chunk[2] : 0);
                *o++ = b64[(v >> 18) & 63];
                *o++ = b64[(v >> 12) & 63];
                *o++ = got > 1 ? b64[(v >> 6) & 63] : '=';
                *o++ = got > 2 ? b64[v & 63] : '=';
            }
            *o++ = '"';
            b->len = o - b->data;
            return 1;
        }
        case K_MASK_REPLACE:
            return put_bytes_obj(b, self->blobs[col]) < 0 ? -1 : 1;
        case K_MASK_TRUNCATE:
            return buf_json_string(b, s, hw_utf8_prefix(s, n, param)) < 0 ? -1 : 1;
        case K_MASK_SHA256: {
            char hex[64];
            PyObject *salt = self->blobs[col];
            if (!hw_mask_sha256_hex(hex, PyBytes_AS_STRING(salt), PyBytes_GET_SIZE(salt), s, n, param & 3)) return 0;
            Py_ssize_t length = param >> 2;
            if (length <= 0 || length > 64) length = 64;
            if (buf_reserve(b, length + 2) < 0) return -1;
            b->data[b->len++] = '"';
            memcpy(b->data + b->len, hex, (size_t)length);
            b->len += length;
            b->data[b->len++] = '"';
            return 1;
        }
        default:
            return 0;
    }
}

/* Python converter + orjson.dumps; 0 when the converter (or dumps) raises: the Python path decides. */
static int convert_python(RowEncoder *self, Py_ssize_t col, PyObject *value) {
    PyObject *owned = NULL;
    if (value == NULL) {
        value = owned = PyUnicode_DecodeUTF8(self->vals[col], self->lens[col], NULL);
        if (value == NULL) {
            PyErr_Clear();
            return 0;
        }
    }
    PyObject *converted = PyObject_CallOneArg(self->converters[col], value);
    Py_XDECREF(owned);
    if (converted == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *dumped = PyObject_CallOneArg(self->dumps, converted);
    Py_DECREF(converted);
    if (dumped == NULL) {
        PyErr_Clear();
        return 0;
    }
    int rc = buf_put(&self->buf, PyBytes_AS_STRING(dumped), PyBytes_GET_SIZE(dumped));
    Py_DECREF(dumped);
    return rc < 0 ? -1 : 1;
}

/* The row image of values into self->buf and, with key columns, the key into self->key.
 * 1: done; 0: the Python path must handle the row (an unchanged-TOAST or binary value, a column
 * count that does not match, a value the converters reject: the Python path raises the error
 * that quarantines the change); -1: error set. */
static int encode_row(RowEncoder *self);

/* convert_python, taking the GIL back for the call when copy_batches runs without it. */
static int convert_python_gil(RowEncoder *self, Py_ssize_t col, PyObject *value) {
    if (self->released == NULL) return convert_python(self, col, value);
    hw_without_gil = 0;
    PyEval_RestoreThread(self->released);
    int rc = convert_python(self, col, value);
    self->released = PyEval_SaveThread();
    hw_without_gil = 1;
    return rc;
}

static int encode_image(RowEncoder *self, PyObject *values) {
    if (!PyTuple_Check(values) || PyTuple_GET_SIZE(values) != self->ncols) return 0;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i);
        if (v == Py_None) {
            self->vals[i] = NULL;
            self->objs[i] = NULL;
        } else if (PyUnicode_CheckExact(v)) {
            self->vals[i] = PyUnicode_AsUTF8AndSize(v, &self->lens[i]);
            if (self->vals[i] == NULL) {
                PyErr_Clear();
                return 0;
            }
            self->objs[i] = v;
        } else {
            return 0; /* unchanged TOAST or a binary value */
        }
    }
    return encode_row(self);
}

/* encode_image of the row in self->vals / lens / objs. */
static int encode_row(RowEncoder *self) {
    Buf *b = &self->buf;
    b->len = 0;
    if (buf_byte(b, '{') < 0) return -1;
    int first = 1;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        const char *s = self->vals[i];
        Py_ssize_t n = self->lens[i];
        if (!self->emit[i]) continue; /* excluded: never converted, so no error can quote its value */
        if (!first && buf_byte(b, ',') < 0) return -1;
        PyObject *name = self->names_json[i];
        if (buf_put(b, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) < 0) return -1;
        Py_ssize_t start = b->len;
        if (s == NULL) {
            if (buf_put(b, "null", 4) < 0) return -1;
        } else {
            int rc = 0;
            int kind = self->kinds[i];
            if (kind != K_PYTHON && (n > 0 || kind == K_STRING || kind >= K_MASK_REPLACE))
                rc = convert_native(self, i, s, n);
            if (rc == 0) rc = convert_python_gil(self, i, self->objs[i]);
            if (rc <= 0) return rc;
        }
        self->starts[i] = start;
        self->ends[i] = b->len;
        first = 0;
    }
    if (buf_byte(b, '}') < 0) return -1;
    if (self->nkeys == 0) return 1;
    Buf *k = &self->key;
    k->len = 0;
    if (buf_byte(k, '{') < 0) return -1;
    for (Py_ssize_t j = 0; j < self->nkeys; j++) {
        Py_ssize_t c = self->key_cols[j];
        if (j && buf_byte(k, ',') < 0) return -1;
        PyObject *name = self->names_json[c];
        if (buf_put(k, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) < 0) return -1;
        if (buf_put(k, b->data + self->starts[c], self->ends[c] - self->starts[c]) < 0) return -1;
    }
    return buf_byte(k, '}') < 0 ? -1 : 1;
}

/* encode(values) -> (after_json, key_json | None), or None when the Python path must decide. */
static PyObject *RowEncoder_encode(RowEncoder *self, PyObject *values) {
    int rc = encode_image(self, values);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    PyObject *after = PyBytes_FromStringAndSize(self->buf.data, self->buf.len);
    if (after == NULL) return NULL;
    if (self->nkeys == 0) return Py_BuildValue("(NO)", after, Py_None);
    PyObject *key = PyBytes_FromStringAndSize(self->key.data, self->key.len);
    if (key == NULL) {
        Py_DECREF(after);
        return NULL;
    }
    return Py_BuildValue("(NN)", after, key);
}


/* The event value of the image in self->buf (key in self->key) into self->value: capture.postgres.events.builder._CHANGE_VALUE
 * filled as capture.postgres.events.builder._value fills it. op: 0 create, 1 update without old image, 2 delete (before = the
 * old tuple's image: the whole row, or the key with the other columns null). pieces: capture.postgres.events.builder._Pieces.native. */
static int write_value(RowEncoder *self, int op, PyObject *pieces, long long lsn, long long index, long long order) {
    Buf *v = &self->value;
    v->len = 0;
    const char *image = self->buf.data;
    Py_ssize_t image_len = self->buf.len;
    int block = op == 0 ? 3 : op == 1 ? 4 : 5;
    if (buf_put(v, "{\"before\":", 10) < 0) return -1;
    if (op <= 1) {
        if (buf_put(v, "null,\"after\":", 13) < 0 || buf_put(v, image, image_len) < 0) return -1;
    } else {
        /* A delete's old tuple: the whole row (FULL), or the key with the other columns NULL: every column. */
        if (buf_put(v, image, image_len) < 0 || buf_put(v, ",\"after\":null", 13) < 0) return -1;
    }
    if (put_bytes_obj(v, PyTuple_GET_ITEM(pieces, 0)) < 0 || hw_buf_int(v, lsn) < 0 ||
        put_bytes_obj(v, PyTuple_GET_ITEM(pieces, 1)) < 0 || hw_buf_int(v, lsn) < 0 ||
        put_bytes_obj(v, PyTuple_GET_ITEM(pieces, 2)) < 0 || hw_buf_int(v, index) < 0 ||
        put_bytes_obj(v, PyTuple_GET_ITEM(pieces, block)) < 0 || hw_buf_int(v, index + 1) < 0 ||
        buf_put(v, ",\"data_collection_order\":", 25) < 0 || hw_buf_int(v, order) < 0 || buf_put(v, "}}", 2) < 0)
        return -1;
    return 0;
}

/* A field of a configured message class, through its slot descriptor (new reference). */
static PyObject *get_field(PyObject *obj, int t, int f) {
    PyObject *descr = msg_fields[t][f];
    if (descr == NULL || Py_TYPE(descr)->tp_descr_get == NULL) {
        PyErr_SetString(PyExc_TypeError, "message class has no such slot");
        return NULL;
    }
    return Py_TYPE(descr)->tp_descr_get(descr, obj, (PyObject *)Py_TYPE(obj));
}

/* record_type(topic, key, value, commit, index, (), None) for a tuple subclass (capture.postgres.events.builder.OutRecord),
 * built as tuple's own __new__ builds subclass instances. Steals key, value and index. */
static PyObject *make_record(PyTypeObject *rt, PyObject *topic, PyObject *key, PyObject *value, PyObject *commit,
                             PyObject *index) {
    PyObject *r = rt->tp_alloc(rt, 7);
    PyObject *headers = r ? PyTuple_New(0) : NULL;
    if (headers == NULL) {
        Py_XDECREF(r);
        Py_DECREF(key);
        Py_DECREF(value);
        Py_DECREF(index);
        return NULL;
    }
    PyTuple_SET_ITEM(r, 0, Py_NewRef(topic));
    PyTuple_SET_ITEM(r, 1, key);
    PyTuple_SET_ITEM(r, 2, value);
    PyTuple_SET_ITEM(r, 3, Py_NewRef(commit));
    PyTuple_SET_ITEM(r, 4, index);
    PyTuple_SET_ITEM(r, 5, headers);
    PyTuple_SET_ITEM(r, 6, Py_NewRef(Py_None));
    return r;
}

/* For the other translation units of the extension (speedups.h). */
PyObject *hw_make_record(PyTypeObject *rt, PyObject *topic, PyObject *key, PyObject *value, PyObject *commit,
                         PyObject *index) {
    return make_record(rt, topic, key, value, commit, index);
}

/* events(changes, lsns, pos, relation_oid, pieces, index, order, commit, topic, record_type, out,
 *        images, old_images, limit) -> (consumed, index, order)
 *
 * EventBuilder.build's native loop: from changes[pos] on, while each change is an Insert, an
 * Update without old image or a Delete of relation_oid that encode_image answers, append its
 * records (a delete's tombstone too) to out, as event() + the Python loop would, and keep the
 * after-image cache: images[b"<topic>\0<key>"] = after JSON, a delete removes the key from both
 * generations. Stops at the first other change (the Python path takes it), or right after the
 * young generation reaches limit entries (the caller rotates). images None: no cache. */
static PyObject *RowEncoder_events(RowEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "events() takes 14 arguments");
        return NULL;
    }
    PyObject *changes = args[0], *lsns = args[1], *pieces = args[4], *commit = args[7], *topic = args[8];
    PyObject *rt_obj = args[9], *out = args[10], *images = args[11], *old_images = args[12];
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    unsigned long oid = PyLong_AsUnsignedLong(args[3]);
    long long index = PyLong_AsLongLong(args[5]);
    long long order = PyLong_AsLongLong(args[6]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[13]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(changes) || !PyList_Check(lsns) || !PyList_Check(out) || !PyType_Check(rt_obj) ||
        !PyType_IsSubtype((PyTypeObject *)rt_obj, &PyTuple_Type) || !PyTuple_Check(pieces) ||
        PyTuple_GET_SIZE(pieces) != 6 || (images != Py_None && !PyDict_Check(images)) ||
        (old_images != Py_None && !PyDict_Check(old_images)) || msg_types[0] == NULL) {
        PyErr_SetString(PyExc_TypeError, "events(): bad arguments");
        return NULL;
    }
    for (int i = 0; i < 6; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(pieces, i))) {
            PyErr_SetString(PyExc_TypeError, "pieces must be bytes");
            return NULL;
        }
    }
    PyTypeObject *rt = (PyTypeObject *)rt_obj;
    Py_ssize_t start = pos, n = PyList_GET_SIZE(changes);
    if (self->nkeys == 0) n = pos; /* a keyless table takes the Python path */
    while (pos < n && pos < PyList_GET_SIZE(lsns)) {
        PyObject *change = PyList_GET_ITEM(changes, pos);
        PyTypeObject *type = Py_TYPE(change);
        int t = type == msg_types[0] ? 0 : type == msg_types[1] ? 1 : type == msg_types[2] ? 2 : -1;
        if (t < 0) break;
        PyObject *oid_obj = get_field(change, t, F_OID);
        if (oid_obj == NULL) return NULL;
        unsigned long change_oid = PyLong_AsUnsignedLong(oid_obj);
        Py_DECREF(oid_obj);
        if (PyErr_Occurred()) return NULL;
        if (change_oid != oid) break;
        int op;
        PyObject *values;
        if (t == 0) {
            op = 0;
            values = get_field(change, t, F_NEW);
        } else if (t == 1) {
            PyObject *old = get_field(change, t, F_OLD);
            if (old == NULL) return NULL;
            int has_old = old != Py_None;
            Py_DECREF(old);
            if (has_old) break;
            op = 1;
            values = get_field(change, t, F_NEW);
        } else {
            op = 2;
            values = get_field(change, t, F_OLD);
        }
        if (values == NULL) return NULL;
        long long lsn = PyLong_AsLongLong(PyList_GET_ITEM(lsns, pos));
        if (lsn == -1 && PyErr_Occurred()) {
            Py_DECREF(values);
            return NULL;
        }
        int rc = encode_image(self, values);
        Py_DECREF(values);
        if (rc < 0) return NULL;
        if (rc == 0) break;
        if (write_value(self, op, pieces, lsn, index, order) < 0) return NULL;
        PyObject *key = PyBytes_FromStringAndSize(self->key.data, self->key.len);
        if (key == NULL) return NULL;
        PyObject *value = PyBytes_FromStringAndSize(self->value.data, self->value.len);
        PyObject *index_obj = value ? PyLong_FromLongLong(index) : NULL;
        if (index_obj == NULL) {
            Py_DECREF(key);
            Py_XDECREF(value);
            return NULL;
        }
        PyObject *record = make_record(rt, topic, Py_NewRef(key), value, commit, Py_NewRef(index_obj));
        if (record == NULL || PyList_Append(out, record) < 0) {
            Py_XDECREF(record);
            Py_DECREF(key);
            Py_DECREF(index_obj);
            return NULL;
        }
        Py_DECREF(record);
        if (op == 2) { /* the delete's tombstone shares its index */
            record = make_record(rt, topic, Py_NewRef(key), Py_NewRef(Py_None), commit, Py_NewRef(index_obj));
            if (record == NULL || PyList_Append(out, record) < 0) {
                Py_XDECREF(record);
                Py_DECREF(key);
                Py_DECREF(index_obj);
                return NULL;
            }
            Py_DECREF(record);
        }
        Py_DECREF(index_obj);
        int full = 0;
        if (images != Py_None) {
            PyObject *slot = NULL; /* b"<topic>\0<key>", as EventBuilder._remember keys it */
            Py_ssize_t topic_len;
            const char *topic_utf8 = PyUnicode_AsUTF8AndSize(topic, &topic_len);
            if (topic_utf8 != NULL) {
                slot = PyBytes_FromStringAndSize(NULL, topic_len + 1 + PyBytes_GET_SIZE(key));
                if (slot != NULL) {
                    char *p = PyBytes_AS_STRING(slot);
                    memcpy(p, topic_utf8, (size_t)topic_len);
                    p[topic_len] = 0;
                    memcpy(p + topic_len + 1, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
                }
            }
            if (slot == NULL) {
                Py_DECREF(key);
                return NULL;
            }
            int failed = 0;
            if (op <= 1) {
                PyObject *after = PyBytes_FromStringAndSize(self->buf.data, self->buf.len);
                failed = after == NULL || PyDict_SetItem(images, slot, after) < 0;
                Py_XDECREF(after);
                full = PyDict_GET_SIZE(images) >= limit;
            } else {
                PyObject *dicts[2] = {images, old_images};
                for (int d = 0; d < 2 && !failed; d++) {
                    if (dicts[d] == Py_None) continue;
                    int has = PyDict_Contains(dicts[d], slot);
                    failed = has < 0 || (has && PyDict_DelItem(dicts[d], slot) < 0);
                }
            }
            Py_DECREF(slot);
            if (failed) {
                Py_DECREF(key);
                return NULL;
            }
        }
        Py_DECREF(key);
        index++;
        order++;
        pos++;
        if (full) break;
    }
    return Py_BuildValue("(nLL)", pos - start, index, order);
}


/* The fields of the COPY text row d[pos:end] into self->vals / lens (NULL: SQL NULL); escaped
 * fields are unescaped into self->scratch. 1: done; 0: not ncols fields (the Python path decides);
 * -1: no memory. */
static int copy_fields(RowEncoder *self, const char *d, Py_ssize_t pos, Py_ssize_t end) {
    Py_ssize_t ncols = self->ncols;
    Buf *sc = &self->scratch;
    sc->len = 0;
    Py_ssize_t col = 0, f = pos;
    while (1) {
        const char *tab = memchr(d + f, '\t', (size_t)(end - f));
        Py_ssize_t fe = tab ? tab - d : end;
        if (col >= ncols) return 0;
        Py_ssize_t len = fe - f;
        if (len == 2 && d[f] == '\\' && d[f + 1] == 'N') {
            self->offs[col] = -1;
            self->vals[col] = NULL;
        } else if (memchr(d + f, '\\', (size_t)len) == NULL) {
            self->offs[col] = -2; /* points into data */
            self->vals[col] = d + f;
            self->lens[col] = len;
        } else {
            /* offsets, not pointers: scratch may move while growing */
            self->offs[col] = sc->len;
            if (buf_reserve(sc, len) < 0) return -1;
            for (Py_ssize_t i = f; i < fe; i++) {
                char c = d[i];
                if (c == '\\' && i + 1 < fe) {
                    char e = d[++i];
                    c = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t'
                      : e == 'v' ? '\v' : e;
                }
                sc->data[sc->len++] = c;
            }
            self->lens[col] = sc->len - self->offs[col];
        }
        self->objs[col] = NULL;
        col++;
        if (!tab) break;
        f = fe + 1;
    }
    if (col != ncols) return 0;
    for (Py_ssize_t c = 0; c < ncols; c++)
        if (self->offs[c] >= 0) self->vals[c] = sc->data + self->offs[c];
    return 1;
}

/* copy_records(data, pos, head, pre, tail, index, lsn, topic, record_type, out) -> (pos, index)
 *
 * EventBuilder.snapshot_records' native loop over COPY text (capture/postgres/snapshot/native_pass.py parse_copy_text):
 * from byte pos, each line (empty lines skipped) is a row of tab-separated fields, \N is NULL,
 * backslash escapes as _unescape reads them. A row whose image encode_row answers becomes
 * record_type(topic, key, head + image + pre + index + tail, lsn, index); the loop stops at the
 * first row it does not answer (wrong field count, a value for the Python path) and returns
 * that row's position, so the caller handles it in Python and calls again. data must be UTF-8. */
static PyObject *RowEncoder_copy_records(RowEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "copy_records() takes 10 arguments");
        return NULL;
    }
    PyObject *data = args[0], *head = args[2], *pre = args[3], *tail = args[4], *lsn = args[6], *topic = args[7];
    PyObject *rt_obj = args[8], *out = args[9];
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long long index = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(data) || !PyBytes_Check(head) || !PyBytes_Check(pre) || !PyBytes_Check(tail) ||
        !PyList_Check(out) || !PyType_Check(rt_obj) || !PyType_IsSubtype((PyTypeObject *)rt_obj, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "copy_records(): bad arguments");
        return NULL;
    }
    PyTypeObject *rt = (PyTypeObject *)rt_obj;
    const char *d = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    Buf *v = &self->value;
    while (pos < n) {
        const char *nl = memchr(d + pos, '\n', (size_t)(n - pos));
        Py_ssize_t end = nl ? nl - d : n;
        if (end == pos) {
            pos = end + 1;
            continue;
        }
        int split = copy_fields(self, d, pos, end);
        if (split < 0) return NULL;
        if (split == 0) break; /* the Python path decides (quarantines) this row */
        int rc = encode_row(self);
        if (rc < 0) return NULL;
        if (rc == 0) break;
        v->len = 0;
        if (put_bytes_obj(v, head) < 0 || buf_put(v, self->buf.data, self->buf.len) < 0 || put_bytes_obj(v, pre) < 0 ||
            hw_buf_int(v, index) < 0 || put_bytes_obj(v, tail) < 0)
            return NULL;
        PyObject *key = self->nkeys ? PyBytes_FromStringAndSize(self->key.data, self->key.len) : Py_NewRef(Py_None);
        PyObject *value = key ? PyBytes_FromStringAndSize(v->data, v->len) : NULL;
        PyObject *index_obj = value ? PyLong_FromLongLong(index) : NULL;
        if (index_obj == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            return NULL;
        }
        PyObject *record = make_record(rt, topic, key, value, lsn, index_obj);
        if (record == NULL) return NULL;
        int appended = PyList_Append(out, record);
        Py_DECREF(record);
        if (appended < 0) return NULL;
        index++;
        pos = end + 1;
    }
    return Py_BuildValue("(nL)", pos < n ? pos : n, index);
}

/* copy_batches(data, pos, end, head, pre, tail, index, nparts, now_ms, level=None) -> (pos, index, batches)
 *
 * The snapshot records copy_records builds for the COPY text rows of data[pos:end], written
 * straight into file-log batches instead of record objects: one per partition of nparts (Kafka's
 * partitioner on the key; no key or one partition: 0). batches[p] is None or (batch, count,
 * last_index, codec): a bytearray of a 38-byte header placeholder (filled in at append) and the
 * records section, offset deltas from 0, timestamp now_ms. With a zstd level (and libzstd bound:
 * zstd_version()) the records section is stored compressed (codec 4: raw_length u32 | frames,
 * one per COMPRESS_SEGMENT of records) when that is smaller, else plain (codec 0), as
 * batch_codec.compress_records decides. Runs
 * without the GIL (taken back only for a Python converter), compression included, so several
 * encoders (one per thread: see copy()) work in parallel. Stops at the first row encode_row does
 * not answer and returns its position, as copy_records does. data must be UTF-8. */
static int copy_batches_parts(RowEncoder *self, Py_ssize_t nparts) {
    if (self->nparts >= nparts) return 0;
    RowEncoder_free_parts(self);
    self->parts = PyMem_RawCalloc((size_t)nparts, sizeof(Buf));
    self->counts = PyMem_RawCalloc((size_t)nparts, sizeof(Py_ssize_t));
    self->lasts = PyMem_RawCalloc((size_t)nparts, sizeof(long long));
    self->zparts = PyMem_RawCalloc((size_t)nparts, sizeof(Buf));
    self->raws = PyMem_RawCalloc((size_t)nparts, sizeof(Py_ssize_t));
    if (!self->parts || !self->counts || !self->lasts || !self->zparts || !self->raws) {
        RowEncoder_free_parts(self);
        PyErr_NoMemory();
        return -1;
    }
    self->nparts = nparts;
    return 0;
}

/* Records compressed in segments of about this many bytes, each one zstd frame, as the rows come:
 * the plain records never leave the cache, and zstd runs faster on a segment this size than on
 * megabytes (3.5 vs 2.8 GB/s here). ZSTD_decompress reads concatenated frames as one. */
#define COMPRESS_SEGMENT (128 << 10)

/* The records in parts[p] (after its placeholder) as one more zstd frame of zparts[p]; parts[p]
 * emptied (without the GIL). 0, or -1: no memory. */
static int compress_segment(RowEncoder *self, Py_ssize_t p, int level) {
    Buf *src = &self->parts[p], *z = &self->zparts[p];
    size_t raw = (size_t)(src->len - BATCH_HEADER);
    if (src->len <= BATCH_HEADER) return 0;
    if (self->zcctx == NULL && (self->zcctx = zstd_create_cctx()) == NULL) return -1;
    if (z->len == 0) {
        if (buf_reserve(z, BATCH_HEADER + 4) < 0) return -1;
        memset(z->data, 0, BATCH_HEADER + 4); /* raw_length filled in at the end */
        z->len = BATCH_HEADER + 4;
    }
    size_t bound = zstd_bound(raw);
    if (buf_reserve(z, (Py_ssize_t)bound) < 0) return -1;
    size_t got = zstd_compress_cctx(self->zcctx, z->data + z->len, bound, src->data + BATCH_HEADER, raw, level);
    if (zstd_is_error(got)) return -1; /* with a bound-sized output only an allocation fails */
    z->len += (Py_ssize_t)got;
    self->raws[p] += (Py_ssize_t)raw;
    src->len = BATCH_HEADER;
    return 0;
}

/* Buffers larger than this are given back after a call (a huge row must not stay allocated). */
#define KEEP_BUFFER_BYTES (64 << 20)

static PyObject *RowEncoder_copy_batches(RowEncoder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 && nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "copy_batches() takes 9 or 10 arguments");
        return NULL;
    }
    PyObject *data = args[0], *head = args[3], *pre = args[4], *tail = args[5];
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    long long index = PyLong_AsLongLong(args[6]);
    Py_ssize_t nparts = PyLong_AsSsize_t(args[7]);
    long long now_ms = PyLong_AsLongLong(args[8]);
    int compress = nargs == 10 && args[9] != Py_None;
    int level = compress ? (int)PyLong_AsLong(args[9]) : 0;
    if (PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(data) || !PyBytes_Check(head) || !PyBytes_Check(pre) || !PyBytes_Check(tail) || nparts < 1 ||
        nparts > 1 << 16 || pos < 0 || end < pos || end > PyBytes_GET_SIZE(data)) {
        PyErr_SetString(PyExc_TypeError, "copy_batches(): bad arguments");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "copy_batches(): this RowEncoder is in use by another thread");
        return NULL;
    }
    if (compress && !zstd_bind()) compress = 0; /* plain: the caller compresses (zstd_version() is None) */
    if (copy_batches_parts(self, nparts) < 0) return NULL;
    Buf *parts = self->parts;
    Py_ssize_t *counts = self->counts;
    long long *lasts = self->lasts;
    Py_ssize_t first_pos = pos;
    long long first_index = index;
    PyObject *batches = NULL;
    const char *d = PyBytes_AS_STRING(data);
    const char *hd = PyBytes_AS_STRING(head), *pr = PyBytes_AS_STRING(pre), *tl = PyBytes_AS_STRING(tail);
    Py_ssize_t hn = PyBytes_GET_SIZE(head), pn = PyBytes_GET_SIZE(pre), tn = PyBytes_GET_SIZE(tail);
    int rc = 1;
    self->busy = 1;
    hw_without_gil = 1;
    self->released = PyEval_SaveThread();
again:
    for (Py_ssize_t p = 0; p < nparts; p++) {
        parts[p].len = self->zparts[p].len = 0;
        counts[p] = self->raws[p] = 0;
    }
    while (pos < end) {
        const char *nl = memchr(d + pos, '\n', (size_t)(end - pos));
        Py_ssize_t e = nl ? nl - d : end;
        if (e == pos) {
            pos = e + 1;
            continue;
        }
        if ((rc = copy_fields(self, d, pos, e)) <= 0 || (rc = encode_row(self)) <= 0) break;
        Py_ssize_t klen = self->nkeys ? self->key.len : -1, part = 0;
        if (klen >= 0 && nparts > 1)
            part = (Py_ssize_t)(((uint32_t)murmur2((const unsigned char *)self->key.data, klen) & 0x7fffffffU) %
                                (uint32_t)nparts);
        char digits_buf[24], *dend = digits_buf + sizeof digits_buf, *dp = dend;
        unsigned long long u = index < 0 ? 0ULL - (unsigned long long)index : (unsigned long long)index;
        do {
            *--dp = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (index < 0) *--dp = '-';
        Py_ssize_t dn = dend - dp;
        Py_ssize_t vlen = hn + self->buf.len + pn + dn + tn;
        Buf *b = &parts[part];
        Py_ssize_t need = (b->len ? 0 : BATCH_HEADER) + 24 + (klen > 0 ? klen : 0) + vlen;
        if (self->raws[part] + b->len + need > INT32_MAX) {
            rc = 0; /* a batch this large: the Python path appends the row */
            break;
        }
        if (buf_reserve(b, need) < 0) {
            rc = -1;
            break;
        }
        if (b->len == 0) {
            memset(b->data, 0, BATCH_HEADER);
            b->len = BATCH_HEADER;
        }
        char *o = b->data + b->len;
        put_u32(o, (uint32_t)counts[part]);
        put_i64(o + 4, (int64_t)now_ms);
        put_u32(o + 12, (uint32_t)(int32_t)klen);
        put_u32(o + 16, (uint32_t)vlen);
        put_u32(o + 20, 0);
        o += 24;
        if (klen > 0) {
            memcpy(o, self->key.data, (size_t)klen);
            o += klen;
        }
        memcpy(o, hd, (size_t)hn);
        o += hn;
        memcpy(o, self->buf.data, (size_t)self->buf.len);
        o += self->buf.len;
        memcpy(o, pr, (size_t)pn);
        o += pn;
        memcpy(o, dp, (size_t)dn);
        o += dn;
        memcpy(o, tl, (size_t)tn);
        o += tn;
        b->len = o - b->data;
        counts[part]++;
        lasts[part] = index;
        index++;
        pos = e + 1;
        if (compress && b->len - BATCH_HEADER >= COMPRESS_SEGMENT && compress_segment(self, part, level) < 0) {
            rc = -1;
            break;
        }
    }
    if (rc >= 0 && compress) {
        int smaller = 1;
        for (Py_ssize_t p = 0; p < nparts && rc >= 0; p++) {
            if (counts[p] == 0) continue;
            if (compress_segment(self, p, level) < 0) {
                rc = -1;
                break;
            }
            Buf *z = &self->zparts[p];
            put_u32(z->data + BATCH_HEADER, (uint32_t)self->raws[p]);
            smaller &= z->len - BATCH_HEADER < self->raws[p]; /* as batch_codec.compress_records decides */
        }
        if (rc >= 0 && !smaller) { /* rare (incompressible values): the same rows again, stored plain */
            compress = 0;
            pos = first_pos;
            index = first_index;
            goto again;
        }
    }
    PyEval_RestoreThread(self->released);
    self->released = NULL;
    hw_without_gil = 0;
    self->busy = 0;
    if (rc < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    batches = PyList_New(nparts);
    if (batches == NULL) goto done;
    for (Py_ssize_t p = 0; p < nparts; p++) {
        PyObject *item;
        if (counts[p] == 0) {
            item = Py_NewRef(Py_None);
        } else {
            Buf *out = compress ? &self->zparts[p] : &parts[p];
            PyObject *batch = PyByteArray_FromStringAndSize(out->data, out->len);
            item = batch ? Py_BuildValue("(NnLi)", batch, counts[p], lasts[p], compress ? 4 : 0) : NULL;
        }
        if (item == NULL) {
            Py_CLEAR(batches);
            goto done;
        }
        PyList_SET_ITEM(batches, p, item);
    }
done:
    for (Py_ssize_t p = 0; p < nparts; p++) {
        if (parts[p].cap > KEEP_BUFFER_BYTES) buf_free(&parts[p]);
        if (self->zparts[p].cap > KEEP_BUFFER_BYTES) buf_free(&self->zparts[p]);
    }
    if (batches == NULL) return NULL;
    return Py_BuildValue("(nLN)", pos < end ? pos : end, index, batches);
}

/* copy() -> a new RowEncoder of the same configuration (its own buffers: one per thread). */
static PyObject *RowEncoder_copy(RowEncoder *self, PyObject *unused) {
    Py_ssize_t n = self->ncols;
    PyObject *kinds = PyTuple_New(n), *params = PyTuple_New(n), *emit = PyTuple_New(n), *names = PyTuple_New(n);
    PyObject *convs = PyTuple_New(n), *keys = PyTuple_New(self->nkeys), *blobs = PyTuple_New(n), *args = NULL;
    PyObject *copy = NULL;
    if (!kinds || !params || !emit || !names || !convs || !keys || !blobs) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyLong_FromLong(self->kinds[i]), *p = PyLong_FromLong(self->params[i]);
        if (!k || !p) {
            Py_XDECREF(k);
            Py_XDECREF(p);
            goto done;
        }
        PyTuple_SET_ITEM(kinds, i, k);
        PyTuple_SET_ITEM(params, i, p);
        PyTuple_SET_ITEM(emit, i, PyBool_FromLong(self->emit[i]));
        PyTuple_SET_ITEM(names, i, Py_NewRef(self->names_json[i]));
        PyTuple_SET_ITEM(convs, i, Py_NewRef(self->converters[i]));
        PyTuple_SET_ITEM(blobs, i, Py_NewRef(self->blobs[i] ? self->blobs[i] : Py_None));
    }
    for (Py_ssize_t j = 0; j < self->nkeys; j++) {
        PyObject *c = PyLong_FromSsize_t(self->key_cols[j]);
        if (c == NULL) goto done;
        PyTuple_SET_ITEM(keys, j, c);
    }
    args = PyTuple_Pack(9, kinds, params, emit, names, convs, keys, self->dumps, self->unchanged, blobs);
    if (args != NULL) copy = PyObject_Call((PyObject *)Py_TYPE(self), args, NULL);
done:
    Py_XDECREF(kinds);
    Py_XDECREF(params);
    Py_XDECREF(emit);
    Py_XDECREF(names);
    Py_XDECREF(convs);
    Py_XDECREF(keys);
    Py_XDECREF(blobs);
    Py_XDECREF(args);
    return copy;
}

static PyMethodDef RowEncoder_methods[] = {
    {"encode", (PyCFunction)RowEncoder_encode, METH_O,
     "encode(values) -> (after_json, key_json | None), or None when the Python path must decide."},
    {"copy_records", (PyCFunction)(void (*)(void))RowEncoder_copy_records, METH_FASTCALL,
     "copy_records(data, pos, head, pre, tail, index, lsn, topic, record_type, out) -> (pos, index)."},
    {"copy_batches", (PyCFunction)(void (*)(void))RowEncoder_copy_batches, METH_FASTCALL,
     "copy_batches(data, pos, end, head, pre, tail, index, nparts, now_ms, level=None) -> (pos, index, batches)."},
    {"copy", (PyCFunction)RowEncoder_copy, METH_NOARGS, "copy() -> a RowEncoder of the same configuration."},
    {"events", (PyCFunction)(void (*)(void))RowEncoder_events, METH_FASTCALL,
     "events(changes, lsns, pos, relation_oid, pieces, index, order, commit, topic, record_type, out, images, "
     "old_images, limit) -> (consumed, index, order)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RowEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "native._speedups.RowEncoder",
    .tp_basicsize = sizeof(RowEncoder),
    .tp_dealloc = (destructor)RowEncoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Text tuples of one relation -> row-image JSON and key JSON.",
    .tp_methods = RowEncoder_methods,
    .tp_init = (initproc)RowEncoder_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------ */
/* libpq reads without a Python call per message.                                        */
/*                                                                                       */
/* psycopg owns the connection; its PGconn pointer (``pgconn.pgconn_ptr``) is only valid  */
/* for the libpq psycopg itself loaded, so the functions are looked up in that very       */
/* library (found among the loaded objects; its PQlibVersion must equal psycopg's          */
/* ``pq.version()``), never linked at build time.                                         */

typedef int (*pq_get_copy_data_fn)(void *conn, char **buffer, int async);
typedef void (*pq_freemem_fn)(void *ptr);
typedef int (*pq_lib_version_fn)(void);

static pq_get_copy_data_fn pq_get_copy_data;
static pq_freemem_fn pq_freemem;

struct libpq_search {
    int version;
    void *handle;
};

static int find_libpq(struct dl_phdr_info *info, size_t size, void *data) {
    struct libpq_search *search = data;
    const char *name = info->dlpi_name;
    (void)size;
    if (name == NULL || name[0] == '\0') return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libpq", 5) != 0 || (base[5] != '.' && base[5] != '-')) return 0;
    void *handle = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) return 0;
    pq_lib_version_fn version = (pq_lib_version_fn)dlsym(handle, "PQlibVersion");
    if (version != NULL && version() == search->version && dlsym(handle, "PQgetCopyData") != NULL) {
        search->handle = handle;
        return 1;
    }
    dlclose(handle);
    return 0;
}

static PyObject *py_bind_libpq(PyObject *self, PyObject *args) {
    int version;
    PyObject *message_type;
    if (!PyArg_ParseTuple(args, "iO!", &version, &PyType_Type, &message_type)) return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)message_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the message type must be a tuple subclass");
        return NULL;
    }
    Py_INCREF(message_type);
    Py_XSETREF(wal_message_type, (PyTypeObject *)message_type);
    if (pq_get_copy_data != NULL) Py_RETURN_TRUE;
    struct libpq_search search = {version, NULL};
    dl_iterate_phdr(find_libpq, &search);
    if (search.handle == NULL) Py_RETURN_FALSE;
    pq_freemem = (pq_freemem_fn)dlsym(search.handle, "PQfreemem");
    if (pq_freemem == NULL) Py_RETURN_FALSE;
    pq_get_copy_data = (pq_get_copy_data_fn)dlsym(search.handle, "PQgetCopyData");
    Py_RETURN_TRUE;
}

static void *conn_arg(PyObject *arg) {
    void *conn = PyLong_AsVoidPtr(arg);
    if (conn == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no libpq connection");
    if (conn != NULL && pq_get_copy_data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libpq is not bound (bind_libpq)");
        return NULL;
    }
    return conn;
}

/* copy_chunk(conn_ptr, max_bytes, piece_bytes=0) -> (data, status, pieces, blank): CopyData
 * messages of a COPY OUT, concatenated, read blocking (the GIL released) until at least max_bytes
 * are in hand (status 1), the copy ends (-1) or fails (-2; the data read before comes along).
 * A COPY TO text message is one row ending in a newline, so the reader knows what
 * capture.postgres.snapshot.native_pass.copy_pieces and encodable would scan the block for: pieces is the block cut
 * after the first row ending at or past each piece_bytes, as [(start, end, rows), ...] (None
 * when piece_bytes is 0 or a message does not end in a newline), blank whether a row is an
 * empty line. */
static PyObject *py_copy_chunk(PyObject *self, PyObject *args) {
    PyObject *ptr;
    Py_ssize_t max_bytes, piece_bytes = 0;
    if (!PyArg_ParseTuple(args, "On|n", &ptr, &max_bytes, &piece_bytes)) return NULL;
    void *conn = conn_arg(ptr);
    if (conn == NULL) return NULL;
    /* The messages go straight into the bytes object returned (one copy, no scratch buffer). */
    Py_ssize_t cap = (max_bytes > 0 ? max_bytes : 0) + 65536, len = 0;
    PyObject *data = PyBytes_FromStringAndSize(NULL, cap);
    if (data == NULL) return NULL;
    Py_ssize_t *cuts = NULL, ncuts = 0, cuts_cap = 0; /* (end, rows) pairs */
    Py_ssize_t rows = 0, piece_start = 0, piece_rows = 0;
    int status = 1, blank = 0, whole = piece_bytes > 0, nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    while (len < max_bytes) {
        char *row = NULL;
        int n = pq_get_copy_data(conn, &row, 0);
        if (n < 0) {
            status = n == -1 ? -1 : -2;
            break;
        }
        if (n == 0) continue; /* cannot happen when blocking */
        if (len + n > cap) {
            Py_ssize_t grown = cap * 2 > len + n ? cap * 2 : len + n;
            Py_BLOCK_THREADS
            int failed = _PyBytes_Resize(&data, grown) < 0; /* data is NULL then, MemoryError set */
            Py_UNBLOCK_THREADS
            if (failed) {
                pq_freemem(row);
                break;
            }
            cap = grown;
        }
        memcpy(PyBytes_AS_STRING(data) + len, row, (size_t)n);
        len += n;
        rows++;
        blank |= n == 1 && row[0] == '\n';
        whole &= row[n - 1] == '\n';
        pq_freemem(row);
        if (whole && len - piece_start >= piece_bytes) {
            if (ncuts == cuts_cap) {
                Py_ssize_t grown = cuts_cap ? cuts_cap * 2 : 16;
                Py_ssize_t *bigger = realloc(cuts, (size_t)grown * 2 * sizeof(Py_ssize_t));
                if (bigger == NULL) {
                    nomem = 1;
                    break;
                }
                cuts = bigger;
                cuts_cap = grown;
            }
            cuts[2 * ncuts] = len;
            cuts[2 * ncuts + 1] = rows - piece_rows;
            ncuts++;
            piece_start = len;
            piece_rows = rows;
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *pieces = NULL;
    if (nomem) PyErr_NoMemory();
    if (nomem || data == NULL || _PyBytes_Resize(&data, len) < 0) goto fail;
    if (!whole) {
        pieces = Py_NewRef(Py_None);
    } else {
        if ((pieces = PyList_New(0)) == NULL) goto fail;
        Py_ssize_t at = 0;
        for (Py_ssize_t i = 0; i <= ncuts; i++) {
            Py_ssize_t end = i < ncuts ? cuts[2 * i] : len, count = i < ncuts ? cuts[2 * i + 1] : rows - piece_rows;
            if (end == at) continue;
            PyObject *piece = Py_BuildValue("(nnn)", at, end, count);
            if (piece == NULL || PyList_Append(pieces, piece) < 0) {
                Py_XDECREF(piece);
                goto fail;
            }
            Py_DECREF(piece);
            at = end;
        }
    }
    free(cuts);
    return Py_BuildValue("(NiNO)", data, status, pieces, blank ? Py_True : Py_False);
fail:
    free(cuts);
    Py_XDECREF(data);
    Py_XDECREF(pieces);
    return NULL;
}

#define XLOG_HEADER_BYTES 25

/* wal_frames(conn_ptr, max_frames) -> (frames, others, status): the CopyData frames libpq
 * already holds (non-blocking reads), at most max_frames. XLogData frames become
 * (wal_start, payload) tuples of the bound message type; any other frame stays bytes
 * (``others`` counts them). Status 0: nothing more buffered, 1: max_frames reached, -1:
 * the stream ended, -2: it failed. */
static PyObject *py_wal_frames(PyObject *self, PyObject *args) {
    PyObject *ptr;
    Py_ssize_t max_frames;
    if (!PyArg_ParseTuple(args, "On", &ptr, &max_frames)) return NULL;
    void *conn = conn_arg(ptr);
    if (conn == NULL) return NULL;
    if (wal_message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no message type bound (bind_libpq)");
        return NULL;
    }
    PyObject *frames = PyList_New(0);
    if (frames == NULL) return NULL;
    Py_ssize_t others = 0;
    int status = 1;
    while (PyList_GET_SIZE(frames) < max_frames) {
        char *data = NULL;
        int n = pq_get_copy_data(conn, &data, 1);
        if (n <= 0) {
            status = n == 0 ? 0 : (n == -1 ? -1 : -2);
            break;
        }
        PyObject *item;
        if (data[0] == 'w' && n >= XLOG_HEADER_BYTES) {
            const unsigned char *u = (const unsigned char *)data;
            uint64_t start = 0;
            for (int i = 1; i < 9; i++) start = (start << 8) | u[i];
            item = wal_message_type->tp_alloc(wal_message_type, 2);
            if (item != NULL) {
                PyObject *lsn = PyLong_FromUnsignedLongLong(start);
                PyObject *payload = PyBytes_FromStringAndSize(data + XLOG_HEADER_BYTES, n - XLOG_HEADER_BYTES);
                if (lsn == NULL || payload == NULL) {
                    Py_XDECREF(lsn);
                    Py_XDECREF(payload);
                    Py_CLEAR(item);
                } else {
                    PyTuple_SET_ITEM(item, 0, lsn);
                    PyTuple_SET_ITEM(item, 1, payload);
                }
            }
        } else {
            item = PyBytes_FromStringAndSize(data, n);
            others++;
        }
        pq_freemem(data);
        if (item == NULL || PyList_Append(frames, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(frames);
            return NULL;
        }
        Py_DECREF(item);
    }
    return Py_BuildValue("(Nni)", frames, others, status);
}

/* ------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"murmur2", py_murmur2, METH_O, "Kafka's murmur2 of a bytes-like key (signed 32-bit)."},
    {"partition_for", (PyCFunction)(void (*)(void))py_partition_for, METH_FASTCALL,
     "partition_for(key, n): Kafka's partition of key among n (None -> 0)."},
    {"partitions", py_partitions, METH_VARARGS, "partitions(keys, n): Kafka partition of each key (None -> 0)."},
    {"encode_batch", py_encode_batch, METH_VARARGS,
     "encode_batch(base_offset, records, now_ms) -> (batch, max_ts), or None for the Python encoder."},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0, portable=False) -> CRC-32C, chained as zlib.crc32."},
    {"seal_batch_header", py_seal_batch_header, METH_VARARGS,
     "seal_batch_header(batch, base_offset, count, max_ts): header and CRC-32C of a batch after its placeholder."},
    {"configure", py_configure, METH_VARARGS,
     "configure(Insert, Update, Delete, unchanged): the classes decode_change builds."},
    {"decode_change", py_decode_change, METH_VARARGS,
     "decode_change(data, in_stream) -> Insert | Update | Delete, or None (the Python decoder decides)."},
    {"read_tuple", py_read_tuple, METH_VARARGS,
     "read_tuple(data, pos, unchanged) -> (values, end), or None if malformed (the Python twin raises)."},
    {"group_records", py_group_records, METH_VARARGS,
     "group_records(records, counts) -> {topic: [[record, ...] per partition]} | missing topic | None."},
    {"take_changes", py_take_changes, METH_VARARGS,
     "take_changes(frames, pos, changes, lsns) -> pos: decoded changes of an open transaction, appended."},
    {"bind_libpq", py_bind_libpq, METH_VARARGS,
     "bind_libpq(version, WalMessage) -> bool: find psycopg's loaded libpq (PQlibVersion == version)."},
    {"zstd_compress", py_zstd_compress, METH_VARARGS, "zstd_compress(data, level) -> a zstd frame, or None."},
    {"zstd_decompress", py_zstd_decompress, METH_VARARGS,
     "zstd_decompress(frame, size) -> its size bytes (ValueError otherwise), or None."},
    {"zstd_version", py_zstd_version, METH_NOARGS,
     "zstd_version() -> libzstd's version number, or None: copy_batches leaves compression to Python."},
    {"copy_chunk", py_copy_chunk, METH_VARARGS,
     "copy_chunk(conn_ptr, max_bytes, piece_bytes=0) -> (data, status, pieces, blank): COPY OUT rows read blocking."},
    {"wal_frames", py_wal_frames, METH_VARARGS,
     "wal_frames(conn_ptr, max_frames) -> (frames, others, status): buffered COPY BOTH frames, non-blocking."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_speedups", .m_doc = "Native hot path of capture and the file log.",
    .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    s_key = PyUnicode_InternFromString("key");
    s_value = PyUnicode_InternFromString("value");
    s_headers = PyUnicode_InternFromString("headers");
    s_timestamp_ms = PyUnicode_InternFromString("timestamp_ms");
    if (!s_key || !s_value || !s_headers || !s_timestamp_ms) return NULL;
    crc32c_init();
#ifdef HAVE_CRC32C_HW
    __builtin_cpu_init();
    crc32c_hardware = __builtin_cpu_supports("sse4.2");
#endif
    if (PyType_Ready(&RowEncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "RowEncoder", (PyObject *)&RowEncoderType) < 0 ||
        PyModule_AddFunctions(m, hw_log_columns_methods) < 0 || PyModule_AddFunctions(m, hw_batch_columns_methods) < 0 ||
        PyModule_AddFunctions(m, hw_column_masks_methods) < 0 || PyModule_AddFunctions(m, hw_sink_rows_methods) < 0 ||
        PyModule_AddFunctions(m, hw_log_records_methods) < 0 || PyModule_AddFunctions(m, hw_binlog_rows_methods) < 0 ||
        PyModule_AddFunctions(m, hw_binlog_events_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
