/* The rows of one SQLite SELECT -> Arrow columns (int64 or UTF-8 text), the GIL released.
 *
 * Why native: the ADBC SQLite driver appends each value through generic Arrow builders, and
 * on a 1 GB Nsight Systems export that costs as much again as SQLite's own stepping
 * (benchmarks/RESULTS.md, issue 33). Here each row's values go straight into the columns.
 *
 * A fast path only. SQLite keeps any value in any column: where a value is not of the kind
 * the caller asked for (a REAL or BLOB among integers, a number among text, invalid UTF-8)
 * or SQLite reports any error, it declines (returns None) and the caller reads the query
 * through ADBC or sqlite3, which have the last word on every input (parsers/nsys/db.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_columns.h"

#define MAX_COLUMNS 64

enum { READ_OK = 0, READ_NOMEM = -1, READ_DECLINED = -2 };

/* Every row of the prepared statement into the columns. Each value is taken once as an
 * sqlite3_value: the sqlite3_column_* calls each enter the API again (a third of the time). */
static int read_rows(sqlite3_stmt *st, col_t *cols, int n) {
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        for (int i = 0; i < n; i++) {
            col_t *c = &cols[i];
            sqlite3_value *v = sqlite3_column_value(st, i);
            int t = sqlite3_value_type(v);
            if (t == SQLITE_NULL) {
                if ((c->kind == K_I64 ? col_i64(c, 0, 0) : col_str_end(c, 0))) return READ_NOMEM;
            } else if (c->kind == K_I64) {
                if (t != SQLITE_INTEGER) return READ_DECLINED;
                if (col_i64(c, (int64_t)sqlite3_value_int64(v), 1)) return READ_NOMEM;
            } else {
                if (t != SQLITE_TEXT) return READ_DECLINED;
                const unsigned char *s = sqlite3_value_text(v);
                int len = sqlite3_value_bytes(v);
                if (!s || len < 0 || !utf8_valid(s, (size_t)len)) return READ_DECLINED;
                if (buf_reserve(&c->data, (size_t)len)) return READ_NOMEM;
                memcpy(c->data.p + c->data.len, s, (size_t)len);
                c->data.len += (size_t)len;
                if (col_str_end(c, 1)) return READ_NOMEM;
            }
        }
    }
    return rc == SQLITE_DONE ? READ_OK : READ_DECLINED;
}

/* Open read-only (no mutexes: one connection per call, on one thread), run ``sql``. */
static int run_query(const char *uri, const char *sql, col_t *cols, int n) {
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int res = READ_DECLINED;
    int flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(uri, &db, flags, NULL) == SQLITE_OK &&
        sqlite3_exec(db, "PRAGMA query_only = ON", NULL, NULL, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && st &&
        sqlite3_column_count(st) == n)
        res = read_rows(st, cols, n);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return res;
}

static PyObject *ksqlite_fetch(PyObject *self, PyObject *args) {
    (void)self;
    const char *uri, *sql, *kinds;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "ssO!s", &uri, &sql, &PyTuple_Type, &names, &kinds)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n < 1 || n > MAX_COLUMNS || (size_t)n != strlen(kinds)) {
        PyErr_SetString(PyExc_ValueError, "fetch: one kind ('i' or 's') per name, 1-64 columns");
        return NULL;
    }
    col_t cols[MAX_COLUMNS];
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (!name || (kinds[i] != 'i' && kinds[i] != 's')) {
            for (Py_ssize_t j = 0; j < i; j++) col_free(&cols[j]);
            if (name) PyErr_SetString(PyExc_ValueError, "fetch: kinds are 'i' or 's'");
            return NULL;
        }
        /* the names stay alive with the tuple until export_col copies them */
        if (col_init(&cols[i], kinds[i] == 'i' ? K_I64 : K_STR, name)) {
            for (Py_ssize_t j = 0; j <= i; j++) col_free(&cols[j]);
            return PyErr_NoMemory();
        }
    }
    int res;
    Py_BEGIN_ALLOW_THREADS
    res = run_query(uri, sql, cols, (int)n);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (res == READ_OK)
        out = export_columns(cols, (int)n);
    else if (res == READ_NOMEM)
        PyErr_NoMemory();
    else {
        Py_INCREF(Py_None);
        out = Py_None;
    }
    for (Py_ssize_t i = 0; i < n; i++) col_free(&cols[i]);
    return out;
}

static PyMethodDef methods[] = {
    {"fetch", ksqlite_fetch, METH_VARARGS,
     "fetch(uri, sql, names, kinds) -> ((schema, array), ...) | None\n\n"
     "Every row of ``sql`` on the read-only database ``uri``, each column an Arrow array (a pair\n"
     "of PyCapsules), column i named names[i], int64 where kinds[i] is 'i', UTF-8 text where it\n"
     "is 's'; None where a value is of another kind or SQLite reports an error."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ksqlite",
                                    "Native reader of SQLite rows (see ksqlite.c).", -1, methods};

PyMODINIT_FUNC PyInit__ksqlite(void) { return PyModule_Create(&module); }
