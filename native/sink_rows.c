/*
 * The PostgreSQL sink's rows straight from the log's events (sinks/postgres/sink.py is the Python
 * twin): each event's op, and the COPY text of the upserted rows, without a Python object per
 * value. Only what is written exactly as the twin writes it is answered; anything else (a value
 * of another JSON type, an escape the twin would refuse, a key the table lacks, a number that
 * is not a plain integer) returns None and the twin handles the batch, so the bytes sent to
 * PostgreSQL are the same either way (tests/unit/native/test_sink_rows.py).
 *
 * COPY text as psycopg writes it: \N for null, \b \t \n \v \f \r \\ escaped, t/f for booleans,
 * a date as YYYY-MM-DD, a timestamp as YYYY-MM-DD HH:MM:SS[.ffffff] (Python's str of a datetime).
 */
#include "speedups.h"

#include <limits.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_COLUMNS 1600 /* PostgreSQL's own limit */

/* The text of a bytes object, read without the GIL (the caller holds a reference to it). */
typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
} Text;

/* The texts of a tuple's items, or NULL (an error set); *all_bytes = 0 when one is not bytes
 * (its text is then empty). A tuple, not the caller's list: it keeps its items alive while
 * another thread could change the list. */
static Text *texts_of(PyObject *tuple, int *all_bytes) {
    Py_ssize_t count = PyTuple_GET_SIZE(tuple);
    Text *texts = PyMem_Malloc(sizeof(Text) * (size_t)(count ? count : 1));
    if (texts == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *all_bytes = 1;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, k);
        if (PyBytes_Check(item)) {
            texts[k].s = (const unsigned char *)PyBytes_AS_STRING(item);
            texts[k].n = PyBytes_GET_SIZE(item);
        } else {
            texts[k].s = NULL;
            texts[k].n = 0;
            *all_bytes = 0;
        }
    }
    return texts;
}

/* -- a JSON reader over one event: positions only, nothing allocated ------------------------ */

typedef struct {
    const unsigned char *s;
    Py_ssize_t i, n;
} Json;

static inline void ws(Json *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r')) j->i++;
}

static inline int hex_digit(unsigned char h) {
    return (h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F');
}

/* Bytes of the valid UTF-8 sequence at s[0:n] that starts with a byte >= 0x80 (no overlong
 * forms, no surrogates, nothing past U+10FFFF), 0 when it is not one. */
static Py_ssize_t utf8_sequence(const unsigned char *s, Py_ssize_t n) {
    unsigned char c = s[0];
    if (c >= 0xC2 && c <= 0xDF) return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F)) return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F)) return 0;
        return 4;
    }
    return 0;
}

/* What a byte is inside a JSON string: 0 plain ASCII (taken as it is), 1 the closing quote, 2 a
 * backslash, 3 a control character (not allowed), 4 the lead of a UTF-8 sequence (checked). */
static const unsigned char STRING_BYTE[256] = {
    [0x00 ... 0x1F] = 3, ['"'] = 1, ['\\'] = 2, [0x80 ... 0xFF] = 4,
};

#define BYTES_OF(c) (0x0101010101010101ULL * (c))
#define HIGH_BITS BYTES_OF(0x80)

/* Whether none of the 8 bytes at s is a closing quote, a backslash, a control character or a
 * UTF-8 byte: all STRING_BYTE 0 (exact: each test says whether any byte of the word matches). */
static inline int plain_word(const unsigned char *s) {
    uint64_t x;
    memcpy(&x, s, 8);
    uint64_t quote = x ^ BYTES_OF('"'), backslash = x ^ BYTES_OF('\\');
    uint64_t special = ((quote - BYTES_OF(1)) & ~quote) | ((backslash - BYTES_OF(1)) & ~backslash) |
                       ((x - BYTES_OF(0x20)) & ~x) | x;
    return (special & HIGH_BITS) == 0;
}

/* Past a valid JSON string whose opening quote is at j->i; 0 on success. *escaped: it holds a backslash.
 * Runs of plain bytes are passed 8 at a time, then by one table look-up each (most of an event's
 * bytes are these). */
static int skip_string(Json *j, int *escaped) {
    const unsigned char *s = j->s;
    Py_ssize_t i = j->i + 1, n = j->n;
    *escaped = 0;
    for (;;) {
        while (n - i >= 8 && plain_word(s + i)) i += 8;
        while (i < n && STRING_BYTE[s[i]] == 0) i++;
        if (i >= n) return -1;
        switch (STRING_BYTE[s[i]]) {
            case 1:
                j->i = i + 1;
                return 0;
            case 2: {
                *escaped = 1;
                if (i + 1 >= n) return -1;
                unsigned char e = s[i + 1];
                if (e == 'u') {
                    if (i + 5 >= n) return -1;
                    for (int d = 2; d <= 5; d++)
                        if (!hex_digit(s[i + d])) return -1;
                    i += 6;
                    continue;
                }
                if (!strchr("\"\\/bfnrt", e) || e == 0) return -1;
                i += 2;
                continue;
            }
            case 4: {
                Py_ssize_t k = utf8_sequence(s + i, n - i);
                if (k == 0) return -1;
                i += k;
                continue;
            }
            default: return -1;
        }
    }
}

/* Past a JSON number (RFC 8259's grammar) at j->i; 0 on success. */
static int skip_number(Json *j) {
    const unsigned char *s = j->s;
    Py_ssize_t i = j->i, n = j->n;
    if (i < n && s[i] == '-') i++;
    if (i >= n) return -1;
    if (s[i] == '0') i++;
    else if (s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return -1;
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return -1;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return -1;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    j->i = i;
    return 0;
}

static int skip_value(Json *j, int depth);

static int skip_container(Json *j, int depth, unsigned char close) {
    if (depth > MAX_DEPTH) return -1;
    j->i++;
    ws(j);
    if (j->i < j->n && j->s[j->i] == close) {
        j->i++;
        return 0;
    }
    for (;;) {
        int escaped;
        if (close == '}') {
            if (j->i >= j->n || j->s[j->i] != '"' || skip_string(j, &escaped) < 0) return -1;
            ws(j);
            if (j->i >= j->n || j->s[j->i] != ':') return -1;
            j->i++;
            ws(j);
        }
        if (skip_value(j, depth + 1) < 0) return -1;
        ws(j);
        if (j->i >= j->n) return -1;
        if (j->s[j->i] == ',') {
            j->i++;
            ws(j);
            continue;
        }
        if (j->s[j->i] != close) return -1;
        j->i++;
        return 0;
    }
}

static int skip_value(Json *j, int depth) {
    if (j->i >= j->n) return -1;
    unsigned char c = j->s[j->i];
    int escaped;
    if (c == '"') return skip_string(j, &escaped);
    if (c == '{') return skip_container(j, depth, '}');
    if (c == '[') return skip_container(j, depth, ']');
    const char *literal = c == 't' ? "true" : c == 'f' ? "false" : c == 'n' ? "null" : NULL;
    if (literal == NULL) return skip_number(j);
    Py_ssize_t len = c == 'f' ? 5 : 4;
    if (j->n - j->i < len || memcmp(j->s + j->i, literal, (size_t)len) != 0) return -1;
    j->i += len;
    return 0;
}

/* One member of an object: its key's span (quotes excluded) and its value's span. */
typedef struct {
    Py_ssize_t key, key_len, value, value_len;
} Member;

/* The next member of the object being read (j->i after '{' or ','); 1: one read, 0: the end,
 * -1: not JSON, or a key with an escape (which only the twin compares as it decodes). */
static int next_member(Json *j, Member *m, int first) {
    ws(j);
    if (j->i >= j->n) return -1;
    if (j->s[j->i] == '}') {
        j->i++;
        return 0;
    }
    if (!first) {
        if (j->s[j->i] != ',') return -1;
        j->i++;
        ws(j);
    }
    if (j->i >= j->n || j->s[j->i] != '"') return -1;
    m->key = j->i + 1;
    int escaped;
    if (skip_string(j, &escaped) < 0 || escaped) return -1;
    m->key_len = j->i - 1 - m->key;
    ws(j);
    if (j->i >= j->n || j->s[j->i] != ':') return -1;
    j->i++;
    ws(j);
    m->value = j->i;
    if (skip_value(j, 1) < 0) return -1;
    m->value_len = j->i - m->value;
    return 1;
}

static inline int key_is(const Json *j, const Member *m, const char *name, Py_ssize_t len) {
    return m->key_len == len && memcmp(j->s + m->key, name, (size_t)len) == 0;
}

/* A plain JSON integer within a signed 64-bit range (what int() and str() give back the same). */
static int plain_integer(const unsigned char *s, Py_ssize_t n, long long *value) {
    Py_ssize_t i = 0;
    int negative = 0;
    if (n > 0 && s[0] == '-') {
        negative = 1;
        i = 1;
    }
    if (i >= n || n - i > 19 || (s[i] == '0' && n - i > 1)) return 0;
    unsigned long long v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (unsigned long long)(s[i] - '0'); /* 19 digits fit in 64 unsigned bits */
    }
    if (v > (unsigned long long)LLONG_MAX) return 0;
    if (negative && v == 0) return 0; /* -0: int() gives 0, written "0" */
    *value = negative ? -(long long)v : (long long)v;
    return 1;
}

/* -- the op of each event ---------------------------------------------------------------------- */

/* The event's top-level "op" if it is one character, ' ' when absent or longer, '?' when the
 * event is not a JSON object the reader follows (the twin then parses it, and refuses it). */
static char event_op(const unsigned char *s, Py_ssize_t n) {
    Json j = {s, 0, n};
    ws(&j);
    if (j.i >= n || s[j.i] != '{') return '?';
    j.i++;
    Member m;
    char op = ' ';
    int seen = 0;
    for (int first = 1;; first = 0) {
        int r = next_member(&j, &m, first);
        if (r < 0) return '?';
        if (r == 0) break;
        if (key_is(&j, &m, "op", 2)) {
            seen++;
            const unsigned char *v = s + m.value;
            if (v[0] != '"') op = ' ';
            else if (memchr(v, '\\', (size_t)m.value_len) != NULL) return '?'; /* the twin decodes it */
            else op = (m.value_len == 3 && v[1] < 0x80) ? (char)v[1] : ' ';
        }
    }
    ws(&j);
    if (j.i != n || seen > 1) return '?';
    return op;
}

/* event_ops(values) -> bytes: each event's op character (see event_op). The scan runs without
 * the GIL: the sink delivers the last batch in another thread meanwhile. */
static PyObject *py_event_ops(PyObject *self, PyObject *values) {
    if (!PyList_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "event_ops takes a list of bytes");
        return NULL;
    }
    PyObject *held = PyList_AsTuple(values);
    if (held == NULL) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(held);
    int all_bytes;
    Text *texts = texts_of(held, &all_bytes);
    PyObject *ops = texts == NULL ? NULL : PyBytes_FromStringAndSize(NULL, count);
    if (ops == NULL) {
        PyMem_Free(texts);
        Py_DECREF(held);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(ops);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count; k++) out[k] = texts[k].s != NULL ? event_op(texts[k].s, texts[k].n) : '?';
    Py_END_ALLOW_THREADS
    PyMem_Free(texts);
    Py_DECREF(held);
    return ops;
}

/* -- COPY text of row images ------------------------------------------------------------------ */

/* The code unit of the four hex digits at s (a \\u escape's); 0 when one is not a hex digit. */
static int hex4(const unsigned char *s, unsigned int *code) {
    unsigned int v = 0;
    for (int d = 0; d < 4; d++) {
        if (!hex_digit(s[d])) return 0;
        v = (v << 4) | (unsigned int)(s[d] <= '9' ? s[d] - '0' : (s[d] | 0x20) - 'a' + 10);
    }
    *code = v;
    return 1;
}

/* A JSON string's text (quotes excluded) as COPY text; 0, or 1 when the twin must handle it
 * (\u0000, a lone surrogate), -1 on memory. */
static int copy_string(Buf *o, const unsigned char *s, Py_ssize_t n) {
    if (buf_reserve(o, n * 2) < 0) return -1; /* no escape writes more than twice its input */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            /* up to the next escape as it is: COPY's own escapes are JSON escapes too (the JSON
             * text holds no raw control characters nor a lone backslash) */
            const unsigned char *escape = memchr(s + i, '\\', (size_t)(n - i));
            Py_ssize_t plain = (escape != NULL ? escape - s : n) - i;
            memcpy(o->data + o->len, s + i, (size_t)plain);
            o->len += plain;
            i += plain - 1;
            continue;
        }
        if (++i >= n) return 1;
        char esc = 0;
        switch (s[i]) {
            case '"': o->data[o->len++] = '"'; continue;
            case '/': o->data[o->len++] = '/'; continue;
            case '\\': esc = '\\'; break;
            case 'b': esc = 'b'; break;
            case 'f': esc = 'f'; break;
            case 'n': esc = 'n'; break;
            case 'r': esc = 'r'; break;
            case 't': esc = 't'; break;
            case 'u': {
                unsigned int code;
                if (i + 4 >= n || !hex4(s + i + 1, &code)) return 1;
                i += 4;
                if (code >= 0xD800 && code <= 0xDBFF) {
                    /* a high surrogate: its low one must follow as \uDC00-\uDFFF */
                    if (i + 6 >= n) return 1;
                    unsigned int low;
                    if (s[i + 1] != '\\' || s[i + 2] != 'u' || !hex4(s + i + 3, &low)) return 1;
                    if (low < 0xDC00 || low > 0xDFFF) return 1;
                    i += 6;
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                } else if (code >= 0xDC00 && code <= 0xDFFF) {
                    return 1;
                }
                if (code == 0) return 1; /* PostgreSQL text holds no NUL: the twin's error */
                if (code < 0x80) {
                    switch (code) {
                        case '\b': esc = 'b'; break;
                        case '\t': esc = 't'; break;
                        case '\n': esc = 'n'; break;
                        case '\v': esc = 'v'; break;
                        case '\f': esc = 'f'; break;
                        case '\r': esc = 'r'; break;
                        case '\\': esc = '\\'; break;
                        default: o->data[o->len++] = (char)code; continue;
                    }
                    break;
                }
                if (code < 0x800) {
                    o->data[o->len++] = (char)(0xC0 | (code >> 6));
                } else if (code < 0x10000) {
                    o->data[o->len++] = (char)(0xE0 | (code >> 12));
                    o->data[o->len++] = (char)(0x80 | ((code >> 6) & 0x3F));
                } else {
                    o->data[o->len++] = (char)(0xF0 | (code >> 18));
                    o->data[o->len++] = (char)(0x80 | ((code >> 12) & 0x3F));
                    o->data[o->len++] = (char)(0x80 | ((code >> 6) & 0x3F));
                }
                o->data[o->len++] = (char)(0x80 | (code & 0x3F));
                continue;
            }
            default: return 1;
        }
        o->data[o->len++] = '\\';
        o->data[o->len++] = esc;
    }
    return 0;
}

/* Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted). */
static void civil(long long days, long long *y, unsigned *m, unsigned *d) {
    days += 719468;
    long long era = (days >= 0 ? days : days - 146096) / 146097;
    unsigned doe = (unsigned)(days - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long year = (long long)yoe + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = year + (*m <= 2);
}

static int put_digits(Buf *o, long long v, int width) {
    char tmp[24];
    int k = 0;
    do {
        tmp[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && k < 20);
    while (k < width) tmp[k++] = '0';
    if (buf_reserve(o, k) < 0) return -1;
    while (k) o->data[o->len++] = tmp[--k];
    return 0;
}

/* YYYY-MM-DD of `days` since the epoch; 1 when outside years 1-9999 (Python's date refuses it). */
static int copy_date(Buf *o, long long days) {
    if (days < -719162 || days > 2932896) return 1; /* 0001-01-01 .. 9999-12-31 */
    long long y;
    unsigned m, d;
    civil(days, &y, &m, &d);
    if (put_digits(o, y, 4) < 0 || buf_put(o, "-", 1) < 0 || put_digits(o, m, 2) < 0 || buf_put(o, "-", 1) < 0 ||
        put_digits(o, d, 2) < 0)
        return -1;
    return 0;
}

/* str(datetime(1970, 1, 1) + timedelta(microseconds=us)); 1 outside years 1-9999. */
static int copy_timestamp(Buf *o, long long us) {
    const long long day_us = 86400000000LL;
    long long days = us / day_us, rest = us % day_us;
    if (rest < 0) {
        rest += day_us;
        days -= 1;
    }
    int r = copy_date(o, days);
    if (r != 0) return r;
    long long secs = rest / 1000000, micros = rest % 1000000;
    if (buf_put(o, " ", 1) < 0 || put_digits(o, secs / 3600, 2) < 0 || buf_put(o, ":", 1) < 0 ||
        put_digits(o, secs / 60 % 60, 2) < 0 || buf_put(o, ":", 1) < 0 || put_digits(o, secs % 60, 2) < 0)
        return -1;
    if (micros && (buf_put(o, ".", 1) < 0 || put_digits(o, micros, 6) < 0)) return -1;
    return 0;
}

/* One value of a column of `kind` as COPY text; 0 written, 1 the twin's, -1 memory. */
static int copy_value(Buf *o, const unsigned char *s, Py_ssize_t n, char kind) {
    if (n == 4 && memcmp(s, "null", 4) == 0) return buf_put(o, "\\N", 2);
    long long v;
    switch (kind) {
        case 'i': /* written as it is: a string, a plain integer, a boolean */
            if (s[0] == '"') return copy_string(o, s + 1, n - 2);
            if (n == 4 && memcmp(s, "true", 4) == 0) return buf_put(o, "t", 1);
            if (n == 5 && memcmp(s, "false", 5) == 0) return buf_put(o, "f", 1);
            if (plain_integer(s, n, &v)) return buf_put(o, (const char *)s, n);
            return 1;
        case 'd': /* date: days since the epoch */
            return plain_integer(s, n, &v) ? copy_date(o, v) : 1;
        case 'T': /* timestamp: microseconds since the epoch */
            return plain_integer(s, n, &v) ? copy_timestamp(o, v) : 1;
        case 't': /* timestamp: milliseconds since the epoch */
            if (!plain_integer(s, n, &v) || v > 9223372036854775LL || v < -9223372036854775LL) return 1;
            return copy_timestamp(o, v * 1000);
        default: return 1;
    }
}

/* The source position of an event's "source" object value: commit_lsn and txn_index as plain
 * integers (absent: 0; the object null: both 0); 0 read, 1 the twin's. */
static int source_position(const unsigned char *s, Py_ssize_t n, long long *lsn, long long *index) {
    *lsn = *index = 0;
    if (n == 4 && memcmp(s, "null", 4) == 0) return 0;
    if (s[0] != '{') return 1;
    Json j = {s, 1, n};
    Member m;
    int seen_lsn = 0, seen_index = 0;
    for (int first = 1;; first = 0) {
        int r = next_member(&j, &m, first);
        if (r < 0) return 1;
        if (r == 0) break;
        if (key_is(&j, &m, "commit_lsn", 10)) {
            if (seen_lsn++ || !plain_integer(s + m.value, m.value_len, lsn)) return 1;
        } else if (key_is(&j, &m, "txn_index", 9)) {
            if (seen_index++ || !plain_integer(s + m.value, m.value_len, index)) return 1;
        }
    }
    return 0;
}

/* One event's row as a COPY line; 0 written, 1 the twin's, -1 memory. `spans` has room for
 * 2 x count entries. */
static int copy_row(Buf *o, const unsigned char *s, Py_ssize_t n, const Text *names, const char *kinds,
                    Py_ssize_t count, Py_ssize_t *spans) {
    Json j = {s, 0, n};
    ws(&j);
    if (j.i >= n || s[j.i] != '{') return 1;
    j.i++;
    Member m, after = {0}, source = {0};
    int seen_after = 0, seen_source = 0;
    for (int first = 1;; first = 0) {
        int r = next_member(&j, &m, first);
        if (r < 0) return 1;
        if (r == 0) break;
        if (key_is(&j, &m, "after", 5)) {
            after = m;
            seen_after++;
        } else if (key_is(&j, &m, "source", 6)) {
            source = m;
            seen_source++;
        }
    }
    if (seen_after != 1 || seen_source > 1 || s[after.value] != '{') return 1;
    long long lsn = 0, index = 0;
    if (seen_source && source_position(s + source.value, source.value_len, &lsn, &index) != 0) return 1;
    for (Py_ssize_t c = 0; c < count; c++) spans[2 * c] = -1;
    Json a = {s, after.value + 1, after.value + after.value_len};
    Py_ssize_t next = 0;
    for (int first = 1;; first = 0) {
        int r = next_member(&a, &m, first);
        if (r < 0) return 1;
        if (r == 0) break;
        /* the column after the last one found first: events list them in the table's order */
        Py_ssize_t c = next;
        if (c >= count || names[c].n != m.key_len || memcmp(names[c].s, s + m.key, (size_t)m.key_len) != 0) {
            for (c = 0; c < count; c++) {
                if (names[c].n == m.key_len && memcmp(names[c].s, s + m.key, (size_t)m.key_len) == 0) break;
            }
        }
        /* a column the table lacks (the twin evolves it), a position column, or a key twice */
        if (c == count || kinds[c] == 'L' || kinds[c] == 'X' || spans[2 * c] >= 0) return 1;
        spans[2 * c] = m.value;
        spans[2 * c + 1] = m.value_len;
        next = c + 1;
    }
    for (Py_ssize_t c = 0; c < count; c++) {
        if (c && buf_put(o, "\t", 1) < 0) return -1;
        int r;
        if (kinds[c] == 'L' || kinds[c] == 'X') {
            r = hw_buf_int(o, kinds[c] == 'L' ? lsn : index);
        } else if (spans[2 * c] < 0) {
            r = buf_put(o, "\\N", 2);
        } else {
            r = copy_value(o, s + spans[2 * c], spans[2 * c + 1], kinds[c]);
        }
        if (r != 0) return r;
    }
    return buf_put(o, "\n", 1);
}

/* copy_text(values, names, kinds) -> bytes | None: the COPY text of each event's row image in
 * the columns `names` (bytes, UTF-8) of `kinds` (i: as it is, d: date, T: timestamp in us, t: in
 * ms, L: the source's commit_lsn, X: its txn_index), or None for the twin. */
static PyObject *py_copy_text(PyObject *self, PyObject *args) {
    PyObject *values, *names;
    const char *kinds;
    Py_ssize_t kinds_len;
    if (!PyArg_ParseTuple(args, "O!O!y#", &PyList_Type, &values, &PyList_Type, &names, &kinds, &kinds_len)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(names);
    if (count != kinds_len || count == 0 || count > MAX_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "copy_text: names and kinds differ in length (or no columns)");
        return NULL;
    }
    PyObject *held_names = PyList_AsTuple(names), *held_values = held_names ? PyList_AsTuple(values) : NULL;
    Text *columns = NULL, *rows = NULL;
    Py_ssize_t *spans = NULL;
    Buf o = {NULL, 0, 0};
    PyObject *result = NULL;
    int names_bytes, all_bytes, r;
    if (held_values == NULL || (columns = texts_of(held_names, &names_bytes)) == NULL ||
        (rows = texts_of(held_values, &all_bytes)) == NULL)
        goto done;
    if (!names_bytes) {
        PyErr_SetString(PyExc_TypeError, "copy_text: names must be bytes");
        goto done;
    }
    if ((spans = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)count)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    r = all_bytes ? 0 : 1;
    /* without the GIL: the sink reads and prepares the next batch in another thread meanwhile */
    Py_BEGIN_ALLOW_THREADS
    hw_without_gil = 1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(held_values) && r == 0; k++) r = copy_row(&o, rows[k].s, rows[k].n, columns, kinds, count, spans);
    hw_without_gil = 0;
    Py_END_ALLOW_THREADS
    if (r == 0) result = PyBytes_FromStringAndSize(o.data ? o.data : "", o.len);
    else if (r > 0) result = Py_NewRef(Py_None);
    else PyErr_NoMemory();
done:
    PyMem_Free(columns);
    PyMem_Free(rows);
    PyMem_Free(spans);
    buf_free(&o);
    Py_XDECREF(held_names);
    Py_XDECREF(held_values);
    return result;
}

/* -- COPY text to one array literal per column (sinks/postgres/arrays.py is the twin) ---------- */

/* One COPY field (s[0:n], escaped) as a quoted array element, or NULL for \N; 0 written, 1 a
 * field COPY text as written here and by psycopg never holds (another escape), -1 memory. */
static int array_element(Buf *o, const unsigned char *s, Py_ssize_t n) {
    if (n == 2 && s[0] == '\\' && s[1] == 'N') return buf_put(o, "NULL", 4);
    if (buf_reserve(o, n * 2 + 2) < 0) return -1; /* every byte at most doubled, and the quotes */
    o->data[o->len++] = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"') {
            o->data[o->len++] = '\\';
            o->data[o->len++] = '"';
            continue;
        }
        if (c != '\\') {
            o->data[o->len++] = (char)c;
            continue;
        }
        if (++i >= n) return 1;
        switch (s[i]) {
            case '\\': o->data[o->len++] = '\\'; o->data[o->len++] = '\\'; continue;
            case 'b': c = '\b'; break;
            case 't': c = '\t'; break;
            case 'n': c = '\n'; break;
            case 'v': c = '\v'; break;
            case 'f': c = '\f'; break;
            case 'r': c = '\r'; break;
            default: return 1;
        }
        o->data[o->len++] = (char)c;
    }
    o->data[o->len++] = '"';
    return 0;
}

/* Each row's fields of `text` appended to its column's literal; 0, 1 a row of another width or
 * an unknown escape, -1 memory. */
static int split_columns(Buf *columns, Py_ssize_t count, const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        for (Py_ssize_t c = 0; c < count; c++) {
            Py_ssize_t start = i;
            while (i < n && s[i] != '\t' && s[i] != '\n') i++;
            if (i >= n || (s[i] == '\n') != (c == count - 1)) return 1;
            Buf *o = &columns[c];
            if (o->len > 1 && buf_put(o, ",", 1) < 0) return -1;
            int r = array_element(o, s + start, i - start);
            if (r != 0) return r;
            i++;
        }
    }
    return 0;
}

/* copy_arrays(text, count) -> list[str] | None: the COPY text's `count` columns, each as an array
 * literal ({"value",NULL,...}), or None when it is not COPY text of that many columns. */
static PyObject *py_copy_arrays(PyObject *self, PyObject *args) {
    PyObject *text;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!n", &PyBytes_Type, &text, &count)) return NULL;
    if (count <= 0 || count > MAX_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "copy_arrays: between 1 and 1600 columns");
        return NULL;
    }
    Buf *columns = PyMem_Calloc((size_t)count, sizeof(Buf));
    if (columns == NULL) return PyErr_NoMemory();
    PyObject *result = NULL;
    int r = 0;
    for (Py_ssize_t c = 0; c < count && r == 0; c++) r = buf_put(&columns[c], "{", 1);
    if (r == 0) {
        const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(text);
        Py_ssize_t n = PyBytes_GET_SIZE(text);
        /* without the GIL: the bytes object is immutable and the caller holds it */
        Py_BEGIN_ALLOW_THREADS
        hw_without_gil = 1;
        r = split_columns(columns, count, s, n);
        for (Py_ssize_t c = 0; c < count && r == 0; c++) r = buf_put(&columns[c], "}", 1);
        hw_without_gil = 0;
        Py_END_ALLOW_THREADS
    }
    if (r < 0) {
        PyErr_NoMemory();
    } else if (r > 0) {
        result = Py_NewRef(Py_None);
    } else if ((result = PyList_New(count)) != NULL) {
        for (Py_ssize_t c = 0; c < count; c++) {
            PyObject *literal = PyUnicode_DecodeUTF8(columns[c].data, columns[c].len, "strict");
            if (literal == NULL) {
                Py_CLEAR(result);
                break;
            }
            PyList_SET_ITEM(result, c, literal);
        }
    }
    for (Py_ssize_t c = 0; c < count; c++) buf_free(&columns[c]);
    PyMem_Free(columns);
    return result;
}

/* -- a batch's sink records ------------------------------------------------------------------- */

/* sink_records(records, record_type) -> list | None: each StoredRecord (topic, partition, offset,
 * timestamp_ms, key, value, headers) that has a value as record_type(topic, partition, offset,
 * timestamp_ms, key, value, value), in order; tombstones (value None) left out. The twin is
 * sinks/records.py's as_sent loop. None (the twin's turn) when an item is not a 7-tuple. */
static PyObject *py_sink_records(PyObject *self, PyObject *args) {
    PyObject *records, *record_type;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &records, &PyType_Type, &record_type)) return NULL;
    PyTypeObject *type = (PyTypeObject *)record_type;
    if (!PyType_IsSubtype(type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "sink_records takes a tuple type");
        return NULL;
    }
    const Py_ssize_t n = PyList_GET_SIZE(records);
    Py_ssize_t kept = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyList_GET_ITEM(records, k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7) Py_RETURN_NONE;
        kept += PyTuple_GET_ITEM(item, 5) != Py_None;
    }
    PyObject *out = PyList_New(kept);
    if (out == NULL) return NULL;
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyList_GET_ITEM(records, k);
        PyObject *value = PyTuple_GET_ITEM(item, 5);
        if (value == Py_None) continue;
        PyObject *record = type->tp_alloc(type, 7);
        if (record == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < 6; i++) PyTuple_SET_ITEM(record, i, Py_NewRef(PyTuple_GET_ITEM(item, i)));
        PyTuple_SET_ITEM(record, 6, Py_NewRef(value));
        hw_untrack_record(record);
        PyList_SET_ITEM(out, at++, record);
    }
    return out;
}

PyMethodDef hw_sink_rows_methods[] = {
    {"sink_records", py_sink_records, METH_VARARGS,
     "sink_records(records, record_type) -> list | None: the records with a value, each with it as its payload."},
    {"event_ops", py_event_ops, METH_O, "event_ops(values) -> bytes: each event's one-character op, ' ' or '?'."},
    {"copy_text", py_copy_text, METH_VARARGS,
     "copy_text(values, names, kinds) -> bytes | None: COPY text of each event's row image, or None for the twin."},
    {"copy_arrays", py_copy_arrays, METH_VARARGS,
     "copy_arrays(text, count) -> list[str] | None: COPY text's columns as array literals, or None."},
    {NULL, NULL, 0, NULL},
};
