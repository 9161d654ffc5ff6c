/* Growable column buffers and their export as Arrow arrays (pairs of PyCapsules): the columns
 * the native readers write (kscan.c: Kineto events; ksqlite.c, kbtree.c: SQLite rows).
 * Every function is static (each module has its copy). */
#ifndef TRACEINSIGHT_ARROW_COLUMNS_H
#define TRACEINSIGHT_ARROW_COLUMNS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_abi.h"

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    char *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

enum { K_I64, K_F64, K_STR, K_U32 };

typedef struct {
    int kind;
    const char *name;
    buf_t data;    /* int64 / double values, or string bytes */
    buf_t offs;    /* strings: int64 offsets, n + 1 of them */
    buf_t valid;   /* validity bitmap, from the first null on (has_bitmap) */
    int64_t n, nulls;
    int has_bitmap;
} col_t;

/* The validity bitmap is written from a column's first null on (all bits before it set): a
 * column without nulls has none, which Arrow allows, and its values skip the bit writes. */
static int col_first_null(col_t *c) {
    size_t bytes = (size_t)(c->n + 7) / 8;
    if (buf_reserve(&c->valid, bytes + 1)) return -1;
    memset(c->valid.p, 0xFF, (size_t)c->n / 8);
    if (c->n & 7) c->valid.p[c->n / 8] = (char)((1 << (c->n & 7)) - 1);
    c->valid.len = bytes;
    c->has_bitmap = 1;
    return 0;
}

static int col_valid(col_t *c, int ok) {
    if (!c->has_bitmap) {
        if (ok) {
            c->n++;
            return 0;
        }
        if (col_first_null(c)) return -1;
    }
    if ((c->n & 7) == 0) {
        if (buf_reserve(&c->valid, 1)) return -1;
        c->valid.p[c->valid.len++] = 0;
    }
    if (ok)
        c->valid.p[c->n >> 3] |= (char)(1 << (c->n & 7));
    else
        c->nulls++;
    c->n++;
    return 0;
}

static int col_i64(col_t *c, int64_t v, int ok) {
    if (buf_reserve(&c->data, 8)) return -1;
    if (!ok) v = 0;
    memcpy(c->data.p + c->data.len, &v, 8);
    c->data.len += 8;
    return col_valid(c, ok);
}

static int col_f64(col_t *c, double v, int ok) {
    if (buf_reserve(&c->data, 8)) return -1;
    if (!ok) v = 0.0;
    memcpy(c->data.p + c->data.len, &v, 8);
    c->data.len += 8;
    return col_valid(c, ok);
}

static int col_u32(col_t *c, uint32_t v, int ok) {
    if (buf_reserve(&c->data, 4)) return -1;
    if (!ok) v = 0;
    memcpy(c->data.p + c->data.len, &v, 4);
    c->data.len += 4;
    return col_valid(c, ok);
}

static int col_str_end(col_t *c, int ok) {
    int64_t off = (int64_t)c->data.len;
    if (buf_reserve(&c->offs, 8)) return -1;
    memcpy(c->offs.p + c->offs.len, &off, 8);
    c->offs.len += 8;
    return col_valid(c, ok);
}

static int col_init(col_t *c, int kind, const char *name) {
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    c->name = name;
    if (kind == K_STR) {
        int64_t zero = 0;
        if (buf_reserve(&c->offs, 8)) return -1;
        memcpy(c->offs.p, &zero, 8);
        c->offs.len = 8;
    }
    return 0;
}

static void col_free(col_t *c) {
    free(c->data.p);
    free(c->offs.p);
    free(c->valid.p);
    c->data.p = c->offs.p = c->valid.p = NULL;
}

/* Room for about the rows a span of n bytes holds (events are ~300 bytes; untouched pages of
 * a large malloc cost nothing), so the columns rarely move while they grow. */
static int col_presize(col_t *c, size_t rows, size_t text) {
    if (buf_reserve(&c->data, c->kind == K_STR ? text : rows * (c->kind == K_U32 ? 4 : 8)))
        return -1;
    if (buf_reserve(&c->valid, rows / 8 + 1)) return -1;
    if (c->kind == K_STR && buf_reserve(&c->offs, rows * 8 + 8)) return -1;
    return 0;
}

/* A column's schema and array; its buffers move into the array (the column is emptied). */
static int export_col(col_t *c, struct ArrowSchema *s, struct ArrowArray *a) {
    char *name = strdup(c->name);
    arr_priv_t *pr = calloc(1, sizeof *pr);
    if (!name || !pr) {
        free(name);
        free(pr);
        return -1;
    }
    memset(s, 0, sizeof *s);
    s->format = c->kind == K_I64 ? "l" : c->kind == K_F64 ? "g" : c->kind == K_U32 ? "I" : "U";
    s->name = name;
    s->private_data = name;
    s->flags = ARROW_FLAG_NULLABLE;
    s->release = release_schema;
    memset(a, 0, sizeof *a);
    a->length = c->n;
    a->null_count = c->nulls;
    pr->bufs[0] = c->has_bitmap ? c->valid.p : NULL; /* no nulls: no bitmap (Arrow allows it) */
    if (!c->has_bitmap) free(c->valid.p);
    if (c->kind == K_STR) {
        pr->bufs[1] = c->offs.p;
        pr->bufs[2] = c->data.p;
        if (!pr->bufs[2]) pr->bufs[2] = malloc(1); /* a non-null data buffer, even empty */
        a->n_buffers = 3;
    } else {
        pr->bufs[1] = c->data.p;
        if (!pr->bufs[1]) pr->bufs[1] = malloc(8);
        a->n_buffers = 2;
    }
    for (int i = 0; i < 3; i++) pr->ptrs[i] = pr->bufs[i];
    a->buffers = pr->ptrs;
    a->private_data = pr;
    a->release = release_array;
    c->valid.p = c->offs.p = c->data.p = NULL;
    return 0;
}

/* Each column as an array of its own, a tuple of (schema, array) pairs of PyCapsules (the SQLite
 * readers): one struct array of them all would keep every column's buffers alive while any one
 * column lives (the text column's buffer does, under the names' views), 0.8 GB on a 1 GB export. */
static inline PyObject *export_columns(col_t *cols, int n) {
    PyObject *out = PyTuple_New(n);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        struct ArrowSchema *s = calloc(1, sizeof *s);
        struct ArrowArray *a = calloc(1, sizeof *a);
        if (!s || !a || export_col(&cols[i], s, a)) {
            free(s);
            free(a);
            Py_DECREF(out);
            return PyErr_NoMemory();
        }
        PyObject *sc = PyCapsule_New(s, "arrow_schema", schema_capsule_free);
        if (!sc) {
            s->release(s);
            free(s);
            a->release(a);
            free(a);
            Py_DECREF(out);
            return NULL;
        }
        PyObject *ac = PyCapsule_New(a, "arrow_array", array_capsule_free);
        if (!ac) {
            Py_DECREF(sc);
            a->release(a);
            free(a);
            Py_DECREF(out);
            return NULL;
        }
        PyObject *pair = PyTuple_Pack(2, sc, ac);
        Py_DECREF(sc);
        Py_DECREF(ac);
        if (!pair) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, pair);
    }
    return out;
}

/* A table -> (schema capsule, array capsule) of one struct array. */
static PyObject *export_table(col_t *cols, int n, int64_t length) {
    arrow_table_t t;
    if (arrow_table_new(&t, n, length)) return PyErr_NoMemory();
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        struct ArrowSchema *cs = t.s->children[i] = calloc(1, sizeof *cs);
        struct ArrowArray *ca = t.a->children[i] = calloc(1, sizeof *ca);
        ok = cs && ca && export_col(&cols[i], cs, ca) == 0;
    }
    return arrow_table_capsules(&t, ok);
}

/* One UTF-8 sequence starting at a byte >= 0x80: its length, 0 if invalid (overlong,
 * surrogate, beyond U+10FFFF, truncated). */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        if (end - p < 2 || (p[1] & 0xC0) != 0x80) return 0;
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;  /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

/* All of [p, p + n) valid UTF-8; ASCII eight bytes at a time (most names are ASCII). */
static inline int utf8_valid(const unsigned char *p, size_t n) {
    const unsigned char *end = p + n;
    while (p < end) {
        if (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (!(w & 0x8080808080808080ULL)) {
                p += 8;
                continue;
            }
        }
        if (*p < 0x80) {
            p++;
            continue;
        }
        int k = utf8_len(p, end);
        if (!k) return 0;
        p += k;
    }
    return 1;
}

#endif
