/*
 * MySQL/MariaDB row changes -> change records (capture/mysql/events.py's EventBuilder.records is
 * the Python twin, and what it writes is the definition).
 *
 * binlog_events() takes a run of RowChange objects of one table shape (decoded images: lists of
 * Debezium JSON values) and appends their records as EventBuilder does for a plan without row
 * filter or masks: the key and the event value JSON (orjson's bytes: the row image's columns in
 * order, the value's fields in the order of EventBuilder's dicts, the strings escaped as
 * buf_json_string writes them), a tombstone after each delete, a key-changing update as a delete
 * (and its tombstone) then a create, skipped operations dropped. Everything that is the same for
 * every event of the transaction and table comes as bytes pieces from the twin
 * (capture/mysql/events.py _native_pieces); only the numbers and images are written here. A value
 * that is not None, a bool, an int or a str is written by the `dumps` it is given (orjson.dumps);
 * one dumps refuses (or an int orjson cannot write) stops the run before that change, so the twin
 * builds it and raises what it raises.
 */
#include "speedups.h"

#include <stdio.h>
#include <structmember.h>

/* RowChange's slots (capture/mysql/streaming/transactions.py), read at their offsets. */
enum { R_SHAPE, R_OP, R_BEFORE, R_AFTER, R_EVENT_START, R_ROW, R_SERVER_ID, R_TIMESTAMP, R_COUNT };
static const char *row_change_fields[R_COUNT] = {"shape",       "op",  "before",    "after",
                                                 "event_start", "row", "server_id", "timestamp"};
static PyTypeObject *row_change_type;
static Py_ssize_t row_change_offsets[R_COUNT];

/* The offsets of type's slots; 0, or -1 with an error set when it is not a RowChange-like class. */
static int bind_row_change(PyTypeObject *type) {
    if (type == row_change_type) return 0;
    Py_ssize_t offsets[R_COUNT];
    for (int f = 0; f < R_COUNT; f++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, row_change_fields[f]);
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "binlog_events(): %s has no slot %s", type->tp_name, row_change_fields[f]);
            return -1;
        }
        offsets[f] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    Py_XSETREF(row_change_type, (PyTypeObject *)Py_NewRef(type));
    memcpy(row_change_offsets, offsets, sizeof offsets);
    return 0;
}

/* A slot of a RowChange (borrowed; NULL when unset). */
static inline PyObject *slot(PyObject *change, int f) {
    return *(PyObject **)((char *)change + row_change_offsets[f]);
}

/* The event-shaping arguments of one call. */
typedef struct {
    Py_ssize_t ncols;
    PyObject *names;          /* tuple of bytes b'"name":', one per column */
    const char *emit;         /* per column: 1 written in the image */
    Py_ssize_t nkeys;
    Py_ssize_t key[64];       /* key column positions (record key order) */
    PyObject *dumps;
    Py_ssize_t *starts, *ends; /* each column's value span in the image buffer */
} Shape;

/* One value as orjson writes it; 1 written, 0 the twin decides, -1 error set. */
static int put_value(Buf *b, PyObject *v, PyObject *dumps) {
    if (v == Py_None) return buf_put(b, "null", 4) < 0 ? -1 : 1;
    if (v == Py_True) return buf_put(b, "true", 4) < 0 ? -1 : 1;
    if (v == Py_False) return buf_put(b, "false", 5) < 0 ? -1 : 1;
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow == 0) {
            if (n == -1 && PyErr_Occurred()) return -1;
            return hw_buf_int(b, n) < 0 ? -1 : 1;
        }
        if (overflow < 0) return 0; /* orjson refuses it */
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        char tmp[24];
        int m = snprintf(tmp, sizeof tmp, "%llu", u);
        return buf_put(b, tmp, m) < 0 ? -1 : 1;
    }
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL) { /* a lone surrogate: orjson refuses it */
            PyErr_Clear();
            return 0;
        }
        return hw_buf_json_string(b, s, n) < 0 ? -1 : 1;
    }
    PyObject *dumped = PyObject_CallOneArg(dumps, v); /* floats and anything else */
    if (dumped == NULL || !PyBytes_Check(dumped)) {
        Py_XDECREF(dumped);
        PyErr_Clear();
        return 0;
    }
    int rc = buf_put(b, PyBytes_AS_STRING(dumped), PyBytes_GET_SIZE(dumped));
    Py_DECREF(dumped);
    return rc < 0 ? -1 : 1;
}

/* The image of row (a list of ncols values) into b, and with want_key its key into k; 1, 0, -1 as put_value. */
static int put_image(const Shape *s, PyObject *row, Buf *b, Buf *k, int want_key) {
    if (!PyList_CheckExact(row) || PyList_GET_SIZE(row) != s->ncols) return 0;
    b->len = 0;
    if (buf_byte(b, '{') < 0) return -1;
    int first = 1;
    for (Py_ssize_t i = 0; i < s->ncols; i++) {
        if (!s->emit[i]) continue;
        if (!first && buf_byte(b, ',') < 0) return -1;
        first = 0;
        PyObject *name = PyTuple_GET_ITEM(s->names, i);
        if (buf_put(b, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) < 0) return -1;
        s->starts[i] = b->len;
        int rc = put_value(b, PyList_GET_ITEM(row, i), s->dumps);
        if (rc <= 0) return rc;
        s->ends[i] = b->len;
    }
    if (buf_byte(b, '}') < 0) return -1;
    if (!want_key) return 1;
    k->len = 0;
    if (buf_byte(k, '{') < 0) return -1;
    for (Py_ssize_t j = 0; j < s->nkeys; j++) {
        Py_ssize_t c = s->key[j];
        if (j && buf_byte(k, ',') < 0) return -1;
        PyObject *name = PyTuple_GET_ITEM(s->names, c);
        if (buf_put(k, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) < 0 ||
            buf_put(k, b->data + s->starts[c], s->ends[c] - s->starts[c]) < 0)
            return -1;
    }
    return buf_byte(k, '}') < 0 ? -1 : 1;
}

static inline int put_piece(Buf *b, PyObject *pieces, int i) {
    PyObject *p = PyTuple_GET_ITEM(pieces, i);
    return buf_put(b, PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p));
}

#define PIECES 13

/* The numbers of one event's value besides its images. */
typedef struct {
    long long ts_us, server_id, pos, row, index, order;
} Numbers;

/* The event value: pieces and numbers interleaved as EventBuilder's dicts are ordered (see _native_pieces). */
static int put_event(Buf *v, PyObject *pieces, char op, const Buf *before, const Buf *after, const Numbers *n) {
    v->len = 0;
    if (put_piece(v, pieces, 0) < 0) return -1;
    if ((before ? buf_put(v, before->data, before->len) : buf_put(v, "null", 4)) < 0) return -1;
    if (put_piece(v, pieces, 1) < 0) return -1;
    if ((after ? buf_put(v, after->data, after->len) : buf_put(v, "null", 4)) < 0) return -1;
    long long ts_ms = n->ts_us >= 0 ? n->ts_us / 1000 : -((-n->ts_us + 999) / 1000); /* Python's // */
    const long long numbers[7] = {ts_ms, n->ts_us, n->ts_us * 1000, n->server_id, n->pos, n->row, n->index};
    for (int i = 0; i < 7; i++)
        if (put_piece(v, pieces, 2 + i) < 0 || hw_buf_int(v, numbers[i]) < 0) return -1;
    if (put_piece(v, pieces, 9) < 0 || buf_byte(v, op) < 0 || put_piece(v, pieces, 10) < 0 ||
        hw_buf_int(v, n->index + 1) < 0 || put_piece(v, pieces, 11) < 0 || hw_buf_int(v, n->order) < 0 ||
        put_piece(v, pieces, 12) < 0)
        return -1;
    return 0;
}

/* Append record_type(topic, key, value, commit, index, (), None); value NULL: a tombstone. */
static int append_record(PyObject *out, PyTypeObject *rt, PyObject *topic, const Buf *key, const Buf *value,
                         PyObject *commit, long long index) {
    PyObject *k = key ? PyBytes_FromStringAndSize(key->data, key->len) : Py_NewRef(Py_None);
    PyObject *v = value ? PyBytes_FromStringAndSize(value->data, value->len) : Py_NewRef(Py_None);
    PyObject *i = PyLong_FromLongLong(index);
    if (k == NULL || v == NULL || i == NULL) {
        Py_XDECREF(k);
        Py_XDECREF(v);
        Py_XDECREF(i);
        return -1;
    }
    PyObject *record = hw_make_record(rt, topic, k, v, commit, i);
    if (record == NULL) return -1;
    int rc = PyList_Append(out, record);
    Py_DECREF(record);
    return rc;
}

static int as_ll(PyObject *o, long long *out) {
    if (!PyLong_CheckExact(o)) return 0;
    *out = PyLong_AsLongLong(o);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* binlog_events(changes, pos, shape, names, emit, key, skipped, dumps, pieces, commit, index, order,
 *               topic, record_type, out, limit) -> (consumed, index, order)
 *
 * From changes[pos] on, while each change is a RowChange of `shape` (by identity) whose images
 * this file writes, append its records to out (see the file's comment) and count `index` (the
 * event's txn_index) and `order` (its data_collection_order) on. names: b'"column":' per column;
 * emit: bytes, 1 per column written in images; key: the record key's column positions (empty: no
 * key, the key is None); skipped: bit 0 creates, bit 1 updates, bit 2 deletes dropped. Stops at the
 * first other change (the twin builds it) or once `limit` changes are consumed. */
static PyObject *py_binlog_events(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "binlog_events() takes 16 arguments");
        return NULL;
    }
    PyObject *changes = args[0], *shape = args[2], *names = args[3], *emit = args[4], *key = args[5];
    PyObject *dumps = args[7], *pieces = args[8], *commit = args[9], *topic = args[12], *rt_obj = args[13];
    PyObject *out = args[14];
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long skipped = PyLong_AsLong(args[6]);
    long long index = PyLong_AsLongLong(args[10]), order = PyLong_AsLongLong(args[11]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[15]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(changes) || !PyTuple_Check(names) || !PyBytes_Check(emit) || !PyTuple_Check(key) ||
        !PyTuple_Check(pieces) || PyTuple_GET_SIZE(pieces) != PIECES || !PyUnicode_Check(topic) ||
        !PyType_Check(rt_obj) || !PyType_IsSubtype((PyTypeObject *)rt_obj, &PyTuple_Type) || !PyList_Check(out) ||
        PyBytes_GET_SIZE(emit) != PyTuple_GET_SIZE(names) || PyTuple_GET_SIZE(key) > 64 || pos < 0) {
        PyErr_SetString(PyExc_TypeError, "binlog_events(): bad arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PIECES; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(pieces, i))) {
            PyErr_SetString(PyExc_TypeError, "binlog_events(): pieces must be bytes");
            return NULL;
        }
    }
    Shape s = {.ncols = PyTuple_GET_SIZE(names), .names = names, .emit = PyBytes_AS_STRING(emit),
               .nkeys = PyTuple_GET_SIZE(key), .dumps = dumps};
    for (Py_ssize_t i = 0; i < s.ncols; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "binlog_events(): names must be bytes");
            return NULL;
        }
    }
    for (Py_ssize_t j = 0; j < s.nkeys; j++) {
        s.key[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, j));
        if (PyErr_Occurred()) return NULL;
        if (s.key[j] < 0 || s.key[j] >= s.ncols || !s.emit[s.key[j]]) {
            PyErr_SetString(PyExc_ValueError, "binlog_events(): a key column out of range or not written");
            return NULL;
        }
    }
    PyTypeObject *rt = (PyTypeObject *)rt_obj;
    s.starts = PyMem_Calloc((size_t)s.ncols + 1, sizeof(Py_ssize_t));
    s.ends = PyMem_Calloc((size_t)s.ncols + 1, sizeof(Py_ssize_t));
    Buf before = {0}, after = {0}, kbefore = {0}, kafter = {0}, value = {0};
    PyObject *result = NULL;
    if (s.starts == NULL || s.ends == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t start = pos, n = PyList_GET_SIZE(changes);
    if (n > pos && bind_row_change(Py_TYPE(PyList_GET_ITEM(changes, pos))) < 0) goto done;
    int keyed = s.nkeys > 0;
    while (pos < n && pos - start < limit) {
        PyObject *change = PyList_GET_ITEM(changes, pos);
        if (Py_TYPE(change) != row_change_type || slot(change, R_SHAPE) != shape) break;
        PyObject *op_obj = slot(change, R_OP), *old = slot(change, R_BEFORE), *new = slot(change, R_AFTER);
        if (op_obj == NULL || old == NULL || new == NULL || !PyUnicode_Check(op_obj) ||
            PyUnicode_GET_LENGTH(op_obj) != 1)
            break;
        Py_UCS4 op = PyUnicode_READ_CHAR(op_obj, 0);
        int bit = op == 'c' ? 1 : op == 'u' ? 2 : op == 'd' ? 4 : 0;
        if (bit == 0) break;
        Numbers num;
        long long timestamp;
        if (!as_ll(slot(change, R_TIMESTAMP), &timestamp) || !as_ll(slot(change, R_SERVER_ID), &num.server_id) ||
            !as_ll(slot(change, R_EVENT_START), &num.pos) || !as_ll(slot(change, R_ROW), &num.row) ||
            timestamp > 9000000000LL || timestamp < -9000000000LL)
            break;
        num.ts_us = timestamp * 1000000LL;
        if (skipped & bit) { /* dropped: no record, no index */
            pos++;
            continue;
        }
        /* Both images (and keys) first: a change is appended whole or left to the twin. */
        int has_before = op != 'c' && old != Py_None, has_after = op != 'd' && new != Py_None;
        if ((op != 'c' && !has_before) || (op != 'd' && !has_after) || (op == 'c' && old != Py_None) ||
            (op == 'd' && new != Py_None))
            break;
        int rc = 1;
        if (has_before) rc = put_image(&s, old, &before, &kbefore, keyed);
        if (rc > 0 && has_after) rc = put_image(&s, new, &after, &kafter, keyed);
        if (rc < 0) goto done;
        if (rc == 0) break;
        int key_changed = 0;
        if (op == 'u') {
            for (Py_ssize_t j = 0; j < s.nkeys && !key_changed; j++) {
                PyObject *ne = PyObject_RichCompare(PyList_GET_ITEM(old, s.key[j]), PyList_GET_ITEM(new, s.key[j]), Py_NE);
                int truth = ne == NULL ? -1 : PyObject_IsTrue(ne);
                Py_XDECREF(ne);
                if (truth < 0) goto done;
                key_changed = truth;
            }
        }
        if (key_changed || op == 'd') {
            num.index = index;
            num.order = order + 1;
            if (put_event(&value, pieces, 'd', &before, NULL, &num) < 0) goto done;
            const Buf *k = keyed ? &kbefore : NULL;
            if (append_record(out, rt, topic, k, &value, commit, index) < 0 ||
                append_record(out, rt, topic, k, NULL, commit, index) < 0)
                goto done;
            index++;
            order++;
        }
        if (op != 'd') {
            num.index = index;
            num.order = order + 1;
            char written = key_changed ? 'c' : (char)op;
            if (put_event(&value, pieces, written, written == 'u' ? &before : NULL, &after, &num) < 0) goto done;
            if (append_record(out, rt, topic, keyed ? &kafter : NULL, &value, commit, index) < 0) goto done;
            index++;
            order++;
        }
        pos++;
    }
    result = Py_BuildValue("(nLL)", pos - start, index, order);
done:
    PyMem_Free(s.starts);
    PyMem_Free(s.ends);
    buf_free(&before);
    buf_free(&after);
    buf_free(&kbefore);
    buf_free(&kafter);
    buf_free(&value);
    return result;
}

PyMethodDef hw_binlog_events_methods[] = {
    {"binlog_events", (PyCFunction)(void (*)(void))py_binlog_events, METH_FASTCALL,
     "binlog_events(changes, pos, shape, names, emit, key, skipped, dumps, pieces, commit, index, order, topic, "
     "record_type, out, limit) -> (consumed, index, order): the records of a run of MySQL row changes."},
    {NULL, NULL, 0, NULL},
};
