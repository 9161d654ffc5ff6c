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

#endif
