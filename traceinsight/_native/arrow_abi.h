/* The Arrow C data interface (arrow/c/abi.h) and the release functions of the arrays the
 * native modules export: each array's buffers (up to three) are malloc'ed and owned by it.
 * Shared by kscan.c and kreplay.c; every function is static (each module has its copy). */
#ifndef TRACEINSIGHT_ARROW_ABI_H
#define TRACEINSIGHT_ARROW_ABI_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#define ARROW_FLAG_NULLABLE 2

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *out);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *out);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

typedef struct {
    void *bufs[3];
    const void *ptrs[3];
} arr_priv_t;

static void release_schema(struct ArrowSchema *s) {
    if (!s->release) return;
    for (int64_t i = 0; i < s->n_children; i++) {
        struct ArrowSchema *c = s->children[i];
        if (c && c->release) c->release(c);
        free(c);
    }
    free(s->children);
    free(s->private_data); /* the name's copy */
    s->release = NULL;
}

static void release_array(struct ArrowArray *a) {
    if (!a->release) return;
    for (int64_t i = 0; i < a->n_children; i++) {
        struct ArrowArray *c = a->children[i];
        if (c && c->release) c->release(c);
        free(c);
    }
    free(a->children);
    arr_priv_t *pr = a->private_data;
    if (pr) {
        for (int i = 0; i < 3; i++) free(pr->bufs[i]);
        free(pr);
    }
    a->release = NULL;
}

static void schema_capsule_free(PyObject *cap) {
    struct ArrowSchema *s = PyCapsule_GetPointer(cap, "arrow_schema");
    if (s) {
        if (s->release) s->release(s);
        free(s);
    }
}

static void array_capsule_free(PyObject *cap) {
    struct ArrowArray *a = PyCapsule_GetPointer(cap, "arrow_array");
    if (a) {
        if (a->release) a->release(a);
        free(a);
    }
}

/* A struct array under construction: its parent schema and array, with room for ``n``
 * children (each NULL until the caller fills it in; one left with release NULL is only freed
 * by the parent's release). */
typedef struct {
    struct ArrowSchema *s;
    struct ArrowArray *a;
} arrow_table_t;

/* 0, or -1 with nothing left allocated (out of memory). */
static int arrow_table_new(arrow_table_t *t, int n, int64_t length) {
    static const void *no_buffers[1] = {NULL};
    struct ArrowSchema *s = calloc(1, sizeof *s);
    struct ArrowArray *a = calloc(1, sizeof *a);
    struct ArrowSchema **sch = calloc((size_t)(n > 0 ? n : 1), sizeof(void *));
    struct ArrowArray **arr = calloc((size_t)(n > 0 ? n : 1), sizeof(void *));
    if (!s || !a || !sch || !arr) {
        free(s);
        free(a);
        free(sch);
        free(arr);
        t->s = NULL;
        t->a = NULL;
        return -1;
    }
    s->format = "+s";
    s->name = "";
    s->n_children = n;
    s->children = sch;
    s->release = release_schema;
    a->length = length;
    a->n_buffers = 1;
    a->buffers = no_buffers;
    a->n_children = n;
    a->children = arr;
    a->release = release_array;
    t->s = s;
    t->a = a;
    return 0;
}

/* The finished table as a (schema capsule, array capsule) pair; with ``ok`` 0 (a child could
 * not be made) or on any failure, everything is released and NULL returned with the error. */
static PyObject *arrow_table_capsules(arrow_table_t *t, int ok) {
    struct ArrowSchema *s = t->s;
    struct ArrowArray *a = t->a;
    PyObject *sc = ok ? PyCapsule_New(s, "arrow_schema", schema_capsule_free) : NULL;
    if (!sc) {
        s->release(s);
        free(s);
        a->release(a);
        free(a);
        return ok ? NULL : PyErr_NoMemory();
    }
    PyObject *ac = PyCapsule_New(a, "arrow_array", array_capsule_free);
    if (!ac) {
        Py_DECREF(sc); /* its destructor releases the schema */
        a->release(a);
        free(a);
        return NULL;
    }
    PyObject *res = PyTuple_Pack(2, sc, ac);
    Py_DECREF(sc);
    Py_DECREF(ac);
    return res;
}

#endif
