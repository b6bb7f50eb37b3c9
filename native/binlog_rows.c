/*
 * MySQL/MariaDB row images -> lists of Debezium JSON values (capture/mysql/binlog/rows.py's
 * RowDecoder is the Python twin, and what its readers return is the definition).
 *
 * A table's plan (capture/mysql/types/row_plan.py) is 8 bytes per column: code, then three
 * little-endian arguments (a: 1 byte, b: 2 bytes, c: 4 bytes), and a tuple with each ENUM/SET
 * column's labels (None for other columns). The plan names only what this file writes exactly;
 * a table with any other column never gets one. Bytes past the body's end, a DECIMAL group out
 * of range, text that is not UTF-8 or an ENUM index past its labels hand the whole event back
 * (None), before anything is returned: the twin then decodes it, or raises what it raises.
 */
#include "speedups.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    C_SKIP_FIXED = 0,  /* a: size; the value is None */
    C_SKIP_VAR = 1,    /* a: length-prefix size; None */
    C_INT = 2,         /* a: size 1, 2, 3, 4 or 8, signed (an unsigned BIGINT as a Java long is this) */
    C_UINT = 3,        /* a: size 1, 2, 3 or 4 */
    C_FLOAT = 4,       /* the shortest decimal of the 32-bit value, as a double */
    C_DOUBLE = 5,
    C_DECIMAL = 6,     /* b: precision, c: scale; the plain text */
    C_DECIMAL_DBL = 7, /* the same text as a double */
    C_YEAR = 8,
    C_BIT1 = 9,
    C_UTF8 = 10,       /* a: length-prefix size */
    C_BINARY = 11,     /* a: prefix size, b: 0 base64, 1 base64-url-safe, 2 hex; c: BINARY(n) width (0: none) */
    C_ENUM = 12,       /* a: size 1 or 2 */
    C_SET = 13,        /* a: size 1-8 */
    C_DATE = 14,       /* a: 1 nullable */
    C_DATETIME2 = 15,  /* a: bit 0 nullable, bit 1 milliseconds; b: fsp */
    C_TIMESTAMP2 = 16, /* a: 1 nullable; b: fsp */
    C_TIME2 = 17,      /* a: 1 connect mode (milliseconds of a time of day, else None); b: fsp */
};

#define PLAN_BYTES 8
#define MICROS 1000000LL

typedef struct {
    int code, a, b;
    int32_t c;
    PyObject *labels; /* borrowed: a tuple of str (ENUM: "" first), or NULL */
} Column;

/* The event is handed back to the twin. */
#define HAND_BACK ((PyObject *)1)

static inline uint64_t be_uint(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t le_uint(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline long long floor_div(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static inline int fraction_size(int fsp) { return (fsp + 1) / 2; }

/* temporal.read_fraction */
static inline long long fraction_micros(const unsigned char *p, int fsp) {
    int size = fraction_size(fsp);
    if (!size) return 0;
    long long v = (long long)be_uint(p, size);
    return v * (size == 1 ? 10000 : size == 2 ? 100 : 1);
}

static int leap(long long y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* temporal.days_since_epoch: 0 and sets *days, or -1 for a zero or impossible date (datetime.date's range). */
static int days_since_epoch(long long year, long long month, long long day, long long *days) {
    static const int dim[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (year < 1 || year > 9999 || month < 1 || month > 12 || day < 1) return -1;
    if (day > dim[month - 1] + (month == 2 && leap(year))) return -1;
    /* Howard Hinnant's days_from_civil */
    long long y = year - (month <= 2);
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    *days = era * 146097 + doe - 719468;
    return 0;
}

/* civil_from_days, for a TIMESTAMP's text */
static void civil(long long z, long long *year, int *month, int *day) {
    z += 719468;
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    long long doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    *day = (int)(doy - (153 * mp + 2) / 5 + 1);
    *month = (int)(mp < 10 ? mp + 3 : mp - 9);
    *year = yoe + era * 400 + (*month <= 2);
}

/* decimal_codec.decode_decimal into out (the caller's 160 bytes hold a sign, 65 digits, a point and 38);
 * its length, or -1 when a group holds more digits than it may (the twin then decides). */
static const int dig2bytes[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
static const uint32_t pow10_u32[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000,
                                       1000000000};

static Py_ssize_t decimal_text(const unsigned char *src, int size, int precision, int scale, char *out) {
    unsigned char raw[64];
    if (size > (int)sizeof raw || precision > 65 || scale > 38) return -1;
    int negative = !(src[0] & 0x80);
    for (int i = 0; i < size; i++) raw[i] = negative ? (unsigned char)~src[i] : src[i];
    raw[0] ^= 0x80;
    int integral = precision - scale;
    int lead_digits = integral % 9, lead = dig2bytes[lead_digits];
    char whole[128];
    int w = 0, pos = 0;
    if (lead) {
        uint32_t v = (uint32_t)be_uint(raw, lead);
        if (v >= pow10_u32[lead_digits]) return -1;
        w += sprintf(whole + w, "%0*u", lead_digits, v);
        pos = lead;
    }
    for (int g = 0; g < integral / 9; g++, pos += 4) {
        uint32_t v = (uint32_t)be_uint(raw + pos, 4);
        if (v >= 1000000000u) return -1;
        w += sprintf(whole + w, "%09u", v);
    }
    char fraction[64];
    int f = 0;
    for (int g = 0; g < scale / 9; g++, pos += 4) {
        uint32_t v = (uint32_t)be_uint(raw + pos, 4);
        if (v >= 1000000000u) return -1;
        f += sprintf(fraction + f, "%09u", v);
    }
    int trail = scale % 9;
    if (trail) {
        uint32_t v = (uint32_t)be_uint(raw + pos, dig2bytes[trail]);
        if (v >= pow10_u32[trail]) return -1;
        f += sprintf(fraction + f, "%0*u", trail, v);
    }
    /* str(int): leading zeros dropped, "0" for none */
    int start = 0;
    while (start < w - 1 && whole[start] == '0') start++;
    if (w == 0) whole[w++] = '0';
    int nonzero = 0;
    for (int i = start; i < w; i++) nonzero |= whole[i] != '0';
    for (int i = 0; i < f; i++) nonzero |= fraction[i] != '0';
    Py_ssize_t n = 0;
    if (negative && nonzero) out[n++] = '-';
    memcpy(out + n, whole + start, (size_t)(w - start));
    n += w - start;
    if (scale) {
        out[n++] = '.';
        memcpy(out + n, fraction, (size_t)f);
        n += f;
    }
    return n;
}

static int decimal_size(int precision, int scale) {
    int integral = precision - scale;
    return integral / 9 * 4 + dig2bytes[integral % 9] + scale / 9 * 4 + dig2bytes[scale % 9];
}

/* values.float32_value: the double nearest the shortest decimal (6-9 digits) that reads back as the same float. */
static PyObject *float32(const unsigned char *p) {
    uint32_t bits = (uint32_t)le_uint(p, 4);
    float f;
    memcpy(&f, &bits, 4);
    double raw = (double)f;
    if (isnan(raw) || isinf(raw)) return PyFloat_FromDouble(raw);
    char text[64];
    for (int digits = 6; digits < 10; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, raw);
        double candidate = strtod(text, NULL);
        float back = (float)candidate;
        if (isinf(back)) return HAND_BACK; /* struct.pack raises OverflowError there */
        uint32_t back_bits;
        memcpy(&back_bits, &back, 4);
        if (back_bits == bits) return PyFloat_FromDouble(candidate);
    }
    return PyFloat_FromDouble(raw);
}

static const char b64_std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char b64_url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* values.binary_encoder of s[0:n] padded with zero bytes to width. */
static PyObject *binary_text(const unsigned char *s, Py_ssize_t n, int mode, Py_ssize_t width) {
    Py_ssize_t len = n < width ? width : n;
    Py_ssize_t out_len = mode == 2 ? 2 * len : (len + 2) / 3 * 4;
    PyObject *out = PyUnicode_New(out_len, 127);
    if (out == NULL) return NULL;
    char *o = (char *)PyUnicode_1BYTE_DATA(out);
#define BYTE(i) ((i) < n ? s[i] : 0)
    if (mode == 2) {
        static const char hex[] = "0123456789abcdef";
        for (Py_ssize_t i = 0; i < len; i++) {
            unsigned char c = BYTE(i);
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
        return out;
    }
    const char *abc = mode == 1 ? b64_url : b64_std;
    Py_ssize_t i = 0;
    for (; i + 2 < len; i += 3) {
        uint32_t v = (uint32_t)BYTE(i) << 16 | (uint32_t)BYTE(i + 1) << 8 | BYTE(i + 2);
        *o++ = abc[v >> 18];
        *o++ = abc[(v >> 12) & 63];
        *o++ = abc[(v >> 6) & 63];
        *o++ = abc[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)BYTE(i) << 16 | (i + 1 < len ? (uint32_t)BYTE(i + 1) << 8 : 0);
        *o++ = abc[v >> 18];
        *o++ = abc[(v >> 12) & 63];
        *o++ = i + 1 < len ? abc[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
#undef BYTE
    return out;
}

/* temporal.unpack_time2 */
static long long time2_micros(const unsigned char *p, int fsp) {
    long long packed;
    if (fsp == 5 || fsp == 6) {
        packed = (long long)be_uint(p, 6) - 0x800000000000LL;
    } else {
        long long integral = (long long)be_uint(p, 3) - 0x800000LL;
        if (fsp == 1 || fsp == 2) {
            long long frac = p[3];
            if (integral < 0 && frac) {
                integral += 1;
                frac -= 0x100;
            }
            packed = integral * (1LL << 24) + frac * 10000;
        } else if (fsp == 3 || fsp == 4) {
            long long frac = (long long)be_uint(p + 3, 2);
            if (integral < 0 && frac) {
                integral += 1;
                frac -= 0x10000;
            }
            packed = integral * (1LL << 24) + frac * 100;
        } else {
            packed = integral * (1LL << 24);
        }
    }
    long long sign = packed < 0 ? -1 : 1;
    if (packed < 0) packed = -packed;
    long long hms = packed >> 24, micro = packed & 0xFFFFFF;
    return sign * ((((hms >> 12) & 0x3FF) * 3600 + ((hms >> 6) & 63) * 60 + (hms & 63)) * MICROS + micro);
}

/* temporal.zoned_timestamp */
static PyObject *zoned_timestamp(long long micros, int fsp) {
    long long seconds = floor_div(micros, MICROS), micro = micros - seconds * MICROS;
    long long days = floor_div(seconds, 86400), rest = seconds - days * 86400;
    long long year;
    int month, day;
    civil(days, &year, &month, &day);
    char text[64];
    int n = snprintf(text, sizeof text, "%04lld-%02d-%02dT%02d:%02d:%02d", year, month, day, (int)(rest / 3600),
                     (int)(rest / 60 % 60), (int)(rest % 60));
    if (fsp) {
        char digits[16];
        snprintf(digits, sizeof digits, "%06lld", micro);
        text[n++] = '.';
        for (int i = 0; i < fsp && i < 6; i++) text[n++] = digits[i];
    }
    text[n++] = 'Z';
    return PyUnicode_DecodeASCII(text, n, NULL);
}

/* One value at data[*pos]; NULL with an error set, or HAND_BACK. */
static PyObject *value_at(const Column *col, const unsigned char *data, Py_ssize_t end, Py_ssize_t *pos) {
    const unsigned char *p = data + *pos;
    Py_ssize_t room = end - *pos;
#define NEED(n)                             \
    do {                                    \
        if (room < (Py_ssize_t)(n)) return HAND_BACK; \
        *pos += (n);                        \
    } while (0)
    switch (col->code) {
    case C_SKIP_FIXED:
        NEED(col->a);
        return Py_NewRef(Py_None);
    case C_SKIP_VAR: {
        if (room < col->a) return HAND_BACK;
        Py_ssize_t len = (Py_ssize_t)le_uint(p, col->a);
        NEED(col->a + len);
        return Py_NewRef(Py_None);
    }
    case C_INT: {
        NEED(col->a);
        int64_t v;
        switch (col->a) {
        case 1: v = (int8_t)p[0]; break;
        case 2: v = (int16_t)le_uint(p, 2); break;
        case 3: v = (int32_t)(le_uint(p, 3) << 8) >> 8; break;
        case 4: v = (int32_t)le_uint(p, 4); break;
        default: v = (int64_t)le_uint(p, 8); break;
        }
        return PyLong_FromLongLong(v);
    }
    case C_UINT:
        NEED(col->a);
        return PyLong_FromUnsignedLongLong(le_uint(p, col->a));
    case C_FLOAT:
        NEED(4);
        return float32(p);
    case C_DOUBLE: {
        NEED(8);
        uint64_t bits = le_uint(p, 8);
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case C_DECIMAL:
    case C_DECIMAL_DBL: {
        int size = decimal_size(col->b, col->c);
        NEED(size);
        char text[160];
        Py_ssize_t n = decimal_text(p, size, col->b, col->c, text);
        if (n < 0) return HAND_BACK;
        if (col->code == C_DECIMAL) return PyUnicode_DecodeASCII(text, n, NULL);
        text[n] = 0;
        double d = PyOS_string_to_double(text, NULL, NULL);
        if (d == -1.0 && PyErr_Occurred()) return NULL;
        return PyFloat_FromDouble(d);
    }
    case C_YEAR:
        NEED(1);
        return PyLong_FromLong(p[0] ? p[0] + 1900 : 0);
    case C_BIT1:
        NEED(1);
        return PyBool_FromLong(p[0] != 0);
    case C_UTF8:
    case C_BINARY: {
        if (room < col->a) return HAND_BACK;
        Py_ssize_t len = (Py_ssize_t)le_uint(p, col->a);
        NEED(col->a + len);
        const char *s = (const char *)p + col->a;
        if (col->code == C_BINARY) return binary_text((const unsigned char *)s, len, col->b, col->c);
        PyObject *text = PyUnicode_DecodeUTF8(s, len, NULL);
        if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return HAND_BACK;
        }
        return text;
    }
    case C_ENUM: {
        NEED(col->a);
        Py_ssize_t index = col->a == 1 ? p[0] : (Py_ssize_t)le_uint(p, 2);
        if (index >= PyTuple_GET_SIZE(col->labels)) return HAND_BACK;
        return Py_NewRef(PyTuple_GET_ITEM(col->labels, index));
    }
    case C_SET: {
        NEED(col->a);
        uint64_t mask = le_uint(p, col->a);
        PyObject *members = PyList_New(0);
        if (members == NULL) return NULL;
        Py_ssize_t count = PyTuple_GET_SIZE(col->labels);
        for (Py_ssize_t i = 0; i < count && i < 64; i++) {
            if (mask >> i & 1 && PyList_Append(members, PyTuple_GET_ITEM(col->labels, i)) < 0) {
                Py_DECREF(members);
                return NULL;
            }
        }
        static PyObject *comma = NULL;
        if (comma == NULL && (comma = PyUnicode_InternFromString(",")) == NULL) {
            Py_DECREF(members);
            return NULL;
        }
        PyObject *joined = PyUnicode_Join(comma, members);
        Py_DECREF(members);
        return joined;
    }
    case C_DATE: {
        NEED(3);
        uint32_t v = (uint32_t)le_uint(p, 3);
        long long days;
        if (days_since_epoch(v >> 9, (v >> 5) & 15, v & 31, &days) < 0)
            return col->a & 1 ? Py_NewRef(Py_None) : PyLong_FromLong(0);
        return PyLong_FromLongLong(days);
    }
    case C_DATETIME2: {
        int fsp = col->b;
        NEED(5 + fraction_size(fsp));
        long long packed = (long long)be_uint(p, 5) - 0x8000000000LL;
        long long days = 0;
        /* A negative packed value has a negative year: no date (the twin's datetime.date refuses it). */
        long long ymd = packed >> 17, hms = packed & 0x1FFFF, year_month = ymd >> 5;
        if (packed < 0 || days_since_epoch(year_month / 13, year_month % 13, ymd & 31, &days) < 0)
            return col->a & 1 ? Py_NewRef(Py_None) : PyLong_FromLong(0);
        long long micros = ((days * 24 + (hms >> 12)) * 60 + ((hms >> 6) & 63)) * 60 * MICROS +
                           (hms & 63) * MICROS + fraction_micros(p + 5, fsp);
        return PyLong_FromLongLong(col->a & 2 ? floor_div(micros, 1000) : micros);
    }
    case C_TIMESTAMP2: {
        int fsp = col->b;
        NEED(4 + fraction_size(fsp));
        long long micros = (long long)be_uint(p, 4) * MICROS + fraction_micros(p + 4, fsp);
        if (micros == 0 && col->a & 1) return Py_NewRef(Py_None);
        return zoned_timestamp(micros, fsp);
    }
    case C_TIME2: {
        int fsp = col->b;
        NEED(3 + fraction_size(fsp));
        long long micros = time2_micros(p, fsp);
        if (!(col->a & 1)) return PyLong_FromLongLong(micros);
        if (micros < 0 || micros >= 86400LL * MICROS) return Py_NewRef(Py_None);
        return PyLong_FromLongLong(micros / 1000);
    }
    default:
        return HAND_BACK;
    }
#undef NEED
}

/* One image at *pos: a list, NULL with an error set, or HAND_BACK. */
static PyObject *image_at(const Column *cols, Py_ssize_t ncols, const unsigned char *data, Py_ssize_t end,
                          Py_ssize_t *pos) {
    Py_ssize_t width = (ncols + 7) / 8;
    if (end - *pos < width) return HAND_BACK;
    const unsigned char *nulls = data + *pos;
    *pos += width;
    PyObject *values = PyList_New(ncols);
    if (values == NULL) return NULL;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *v;
        if (nulls[i >> 3] >> (i & 7) & 1) {
            v = Py_NewRef(Py_None);
        } else {
            v = value_at(&cols[i], data, end, pos);
            if (v == NULL || v == HAND_BACK) {
                Py_DECREF(values);
                return v;
            }
        }
        PyList_SET_ITEM(values, i, v);
    }
    return values;
}

/* binlog_rows(body, pos, op, plan, labels) -> [(before, after), ...] | None. op: 0 insert (after
 * images), 1 delete (before images), 2 update (both). None: the twin decodes the event. */
static PyObject *py_binlog_rows(PyObject *self, PyObject *args) {
    PyObject *body, *labels;
    Py_ssize_t pos;
    int op;
    const char *plan;
    Py_ssize_t plan_len;
    if (!PyArg_ParseTuple(args, "O!niy#O!", &PyBytes_Type, &body, &pos, &op, &plan, &plan_len, &PyTuple_Type,
                          &labels))
        return NULL;
    Py_ssize_t ncols = plan_len / PLAN_BYTES;
    if (plan_len % PLAN_BYTES || PyTuple_GET_SIZE(labels) != ncols || op < 0 || op > 2 || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "binlog_rows: a plan of 8 bytes and one labels entry per column");
        return NULL;
    }
    Column stack[64];
    Column *cols = ncols <= 64 ? stack : PyMem_Malloc(sizeof(Column) * (size_t)ncols);
    if (cols == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < ncols; i++) {
        const unsigned char *q = (const unsigned char *)plan + i * PLAN_BYTES;
        cols[i].code = q[0];
        cols[i].a = q[1];
        cols[i].b = (int)le_uint(q + 2, 2);
        cols[i].c = (int32_t)le_uint(q + 4, 4);
        PyObject *l = PyTuple_GET_ITEM(labels, i);
        cols[i].labels = PyTuple_Check(l) ? l : NULL;
        if ((cols[i].code == C_ENUM || cols[i].code == C_SET) && cols[i].labels == NULL) {
            if (cols != stack) PyMem_Free(cols);
            PyErr_SetString(PyExc_ValueError, "binlog_rows: an ENUM or SET column without labels");
            return NULL;
        }
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t end = PyBytes_GET_SIZE(body);
    PyObject *out = PyList_New(0);
    PyObject *result = out;
    while (out != NULL && pos < end) {
        PyObject *before = Py_None, *after = Py_None;
        if (op != 0) {
            before = image_at(cols, ncols, data, end, &pos);
            if (before == NULL || before == HAND_BACK) {
                result = before;
                break;
            }
        }
        if (op != 1) {
            after = image_at(cols, ncols, data, end, &pos);
            if (after == NULL || after == HAND_BACK) {
                if (op != 0) Py_DECREF(before);
                result = after;
                break;
            }
        }
        PyObject *pair = PyTuple_Pack(2, before, after);
        if (op != 0) Py_DECREF(before);
        if (op != 1) Py_DECREF(after);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            result = NULL;
            break;
        }
        Py_DECREF(pair);
    }
    if (cols != stack) PyMem_Free(cols);
    if (result == out) return out;
    Py_XDECREF(out);
    if (result == HAND_BACK) Py_RETURN_NONE;
    return NULL;
}

PyMethodDef hw_binlog_rows_methods[] = {
    {"binlog_rows", py_binlog_rows, METH_VARARGS,
     "binlog_rows(body, pos, op, plan, labels) -> [(before, after), ...] of a row event, or None (the twin decodes)."},
    {NULL, NULL, 0, NULL},
};
