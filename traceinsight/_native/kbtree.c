/* The rows of one SQLite table read from its B-tree pages -> Arrow columns, the GIL released.
 *
 * Why: on a 1 GB Nsight Systems export SQLite's own stepping (its VDBE and the per-value API
 * calls) was most of the fetch even through the native row reader (ksqlite.c); the rows of an
 * export's tables are plain records of integers and text, decoded here straight from the pages
 * (https://www.sqlite.org/fileformat2.html: table B-trees, records, overflow pages).
 *
 * A fast path only: anything it does not handle exactly as SQLite would (a page of another
 * kind, a value of another storage class than asked, a sum that overflows, invalid UTF-8, a
 * non-UTF-8 database, any inconsistency of the file) declines (returns None) and the caller
 * reads the rows through SQLite, which has the last word on every input (parsers/nsys/db.py).
 * The caller holds a read transaction (SQLite's shared lock: no writer commits meanwhile) and
 * never calls it while a rollback journal or a WAL file holds pages of the database.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arrow_columns.h"

#define MAX_OUT 64
#define MAX_TERMS 4
#define MAX_DEPTH 32 /* a table B-tree of 4 KB pages is ~5 deep at 10^9 rows: deeper is a loop */
#define MAX_IN 64
#define MAX_COL (MAX_OUT * MAX_TERMS) /* record columns a scan may read: 0..MAX_COL-1 */

enum { SCAN_OK = 0, SCAN_NOMEM = -1, SCAN_DECLINED = -2 };

/* A text column read as dictionary codes: each distinct value once, in first-seen order, and
 * per row its index into them. A trace's names repeat (an NVTX table's 8.8M ranges hold 16k
 * distinct texts a part): each distinct one is copied and validated once, and the caller maps
 * the few values (a regex) before one gather instead of the millions of rows. */
typedef struct {
    col_t values;      /* K_STR: the distinct texts */
    uint32_t *slots;   /* open addressing: code + 1, 0 = empty; cap slots, a power of two */
    uint64_t *hashes;  /* per code: its text's hash (a probe's first test, and the rehash) */
    size_t cap, hcap;
} dict_t;

typedef struct {
    int kind;              /* K_I64, K_STR, or K_U32 (text as dictionary codes) */
    int n_terms;           /* integers: the sum of these columns; text: one column */
    int terms[MAX_TERMS];  /* record column index, -1 = the rowid */
    int64_t add;           /* integers: added to each non-NULL sum (the caller's time shift) */
} out_t;

typedef struct {
    int fd;
    uint32_t page_size, usable, n_pages;
    int64_t lo, hi;                 /* the rowids wanted, inclusive */
    out_t outs[MAX_OUT];
    col_t *cols;
    dict_t *dicts;                  /* per output; used by K_U32 outputs only */
    int n_out, max_col;             /* the highest record column any output or the filter reads */
    int filter_col;                 /* -2: no filter; else keep rows whose column is IN filter_vals */
    int n_filter;
    int64_t filter_vals[MAX_IN];
    unsigned char *pages[MAX_DEPTH]; /* one page buffer per tree level */
    unsigned char *payload;          /* a record spilled to overflow pages, reassembled */
    size_t payload_cap;
    int64_t visited;                 /* pages read: more than the file holds means a cycle */
    /* per record: each column's serial type and body offset */
    uint64_t types[MAX_COL];
    size_t offs[MAX_COL];
} scan_t;

static int read_page(scan_t *s, uint32_t pgno, unsigned char *buf) {
    if (pgno < 1 || pgno > s->n_pages || ++s->visited > (int64_t)s->n_pages * 2) return -1;
    off_t at = (off_t)(pgno - 1) * s->page_size;
    size_t got = 0;
    while (got < s->page_size) {
        ssize_t r = pread(s->fd, buf + got, s->page_size - got, at + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* A varint at p (1-9 bytes, big-endian 7-bit groups, the ninth byte whole); 0 if it runs past end. */
static int varint(const unsigned char *p, const unsigned char *end, uint64_t *v) {
    uint64_t x = 0;
    for (int i = 0; i < 9; i++) {
        if (p + i >= end) return 0;
        if (i == 8) {
            *v = (x << 8) | p[8];
            return 9;
        }
        x = (x << 7) | (p[i] & 0x7F);
        if (!(p[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static unsigned be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

/* Bytes of a serial type's body; -1 for the reserved types 10 and 11. */
static int64_t body_len(uint64_t t) {
    static const int64_t fixed[12] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0, -1, -1};
    return t < 12 ? fixed[t] : (int64_t)((t - 12) / 2);
}

/* An integer serial type's value (types 1-6, 8, 9); 0 (not an integer) for any other. */
static int int_value(uint64_t t, const unsigned char *p, int64_t *v) {
    if (t == 8 || t == 9) {
        *v = (int64_t)t - 8;
        return 1;
    }
    switch (t) { /* big-endian, sign-extended */
    case 1:
        *v = (int8_t)p[0];
        return 1;
    case 2:
        *v = (int16_t)(((unsigned)p[0] << 8) | p[1]);
        return 1;
    case 3:
        *v = ((int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8))) >> 8;
        return 1;
    case 4:
        *v = (int32_t)be32(p);
        return 1;
    case 5:
        *v = ((int64_t)(((uint64_t)be32(p) << 32) | ((uint64_t)be16(p + 4) << 16))) >> 16;
        return 1;
    case 6:
        *v = (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4));
        return 1;
    default:
        return 0;
    }
}

/* A 64-bit hash of n bytes, eight at a time (names run to tens of bytes). */
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBULL;
    return h ^ (h >> 32);
}

static int dict_grow(dict_t *d) {
    size_t cap = d->cap ? d->cap * 2 : 1024;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t code = 0; code < (size_t)d->values.n; code++) {
        size_t i = d->hashes[code] & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)code + 1;
    }
    free(d->slots);
    d->slots = slots;
    d->cap = cap;
    return 0;
}

/* The code of the text [p, p + n), added where it is new (validated then, once). */
static int dict_code(dict_t *d, const unsigned char *p, size_t n, uint32_t *code) {
    if ((size_t)d->values.n * 2 >= d->cap && dict_grow(d)) return SCAN_NOMEM;
    uint64_t h = hash_bytes(p, n);
    const int64_t *offs = (const int64_t *)d->values.offs.p;
    size_t i = h & (d->cap - 1);
    for (uint32_t slot; (slot = d->slots[i]); i = (i + 1) & (d->cap - 1)) {
        uint32_t c = slot - 1;
        if (d->hashes[c] == h && (size_t)(offs[c + 1] - offs[c]) == n &&
            !memcmp(d->values.data.p + offs[c], p, n)) {
            *code = c;
            return SCAN_OK;
        }
    }
    if (!utf8_valid(p, n)) return SCAN_DECLINED;
    if (d->values.n >= UINT32_MAX - 1) return SCAN_DECLINED;
    if ((size_t)d->values.n >= d->hcap) {
        size_t hcap = d->hcap ? d->hcap * 2 : 1024;
        uint64_t *q = realloc(d->hashes, hcap * sizeof *q);
        if (!q) return SCAN_NOMEM;
        d->hashes = q;
        d->hcap = hcap;
    }
    if (buf_reserve(&d->values.data, n)) return SCAN_NOMEM;
    memcpy(d->values.data.p + d->values.data.len, p, n);
    d->values.data.len += n;
    *code = (uint32_t)d->values.n;
    d->hashes[*code] = h;
    d->slots[i] = *code + 1;
    return col_str_end(&d->values, 1) ? SCAN_NOMEM : SCAN_OK;
}

static void dict_free(dict_t *d) {
    col_free(&d->values);
    free(d->slots);
    free(d->hashes);
}

/* One record (the cell's whole payload) into the output columns, or dropped by the filter. */
static int take_record(scan_t *s, int64_t rowid, const unsigned char *rec, size_t len) {
    const unsigned char *end = rec + len;
    uint64_t hdr;
    int k = varint(rec, end, &hdr);
    if (!k || hdr > len || hdr < (uint64_t)k) return SCAN_DECLINED;
    const unsigned char *h = rec + k, *hend = rec + hdr;
    size_t body = (size_t)hdr;
    int n = 0; /* columns this record holds, up to max_col + 1 */
    while (h < hend && n <= s->max_col) {
        uint64_t t = *h;
        int m = 1; /* most serial types are one byte: integers, short text */
        if (t & 0x80 && !(m = varint(h, hend, &t))) return SCAN_DECLINED;
        int64_t bl = body_len(t);
        if (bl < 0 || body + (uint64_t)bl > len) return SCAN_DECLINED;
        s->types[n] = t;
        s->offs[n] = body;
        body += (size_t)bl;
        h += m;
        n++;
    }
    /* a record may hold fewer columns than the table (added later by ALTER TABLE): the rest
     * read as NULL (the caller only asks for columns without a DEFAULT) */
    for (int i = n; i <= s->max_col; i++) s->types[i] = 0;
    if (s->filter_col >= 0) {
        uint64_t t = s->types[s->filter_col];
        if (t == 0) return SCAN_OK; /* NULL IN (...) is not true */
        int64_t v;
        if (!int_value(t, rec + s->offs[s->filter_col], &v)) return SCAN_DECLINED;
        int hit = 0;
        for (int i = 0; i < s->n_filter && !hit; i++) hit = s->filter_vals[i] == v;
        if (!hit) return SCAN_OK;
    }
    for (int o = 0; o < s->n_out; o++) {
        out_t *out = &s->outs[o];
        col_t *c = &s->cols[o];
        if (out->kind == K_STR || out->kind == K_U32) {
            int i = out->terms[0];
            uint64_t t = s->types[i];
            if (t == 0) {
                if (out->kind == K_U32 ? col_u32(c, 0, 0) : col_str_end(c, 0)) return SCAN_NOMEM;
                continue;
            }
            if (t < 13 || !(t & 1)) return SCAN_DECLINED; /* not TEXT */
            size_t bl = (size_t)body_len(t);
            const unsigned char *p = rec + s->offs[i];
            if (out->kind == K_U32) {
                uint32_t code;
                int r = dict_code(&s->dicts[o], p, bl, &code);
                if (r) return r;
                if (col_u32(c, code, 1)) return SCAN_NOMEM;
                continue;
            }
            if (!utf8_valid(p, bl)) return SCAN_DECLINED;
            if (buf_reserve(&c->data, bl)) return SCAN_NOMEM;
            memcpy(c->data.p + c->data.len, p, bl);
            c->data.len += bl;
            if (col_str_end(c, 1)) return SCAN_NOMEM;
            continue;
        }
        int64_t sum = 0;
        int null = 0;
        for (int j = 0; j < out->n_terms; j++) {
            int i = out->terms[j];
            int64_t v;
            if (i < 0)
                v = rowid;
            else if (s->types[i] == 0) {
                null = 1; /* NULL + x is NULL; the other terms are still checked */
                continue;
            } else if (!int_value(s->types[i], rec + s->offs[i], &v))
                return SCAN_DECLINED; /* a REAL, text or BLOB: SQLite's arithmetic, not ours */
            if (__builtin_add_overflow(sum, v, &sum)) return SCAN_DECLINED; /* SQLite: a REAL */
        }
        if (!null && __builtin_add_overflow(sum, out->add, &sum)) return SCAN_DECLINED;
        if (col_i64(c, null ? 0 : sum, !null)) return SCAN_NOMEM;
    }
    return SCAN_OK;
}

/* A leaf cell: its rowid and payload (reassembled from its overflow pages where it spills). */
static int take_cell(scan_t *s, const unsigned char *page, size_t at, int64_t *rowid_out) {
    const unsigned char *end = page + s->usable, *p = page + at;
    uint64_t size, rowid;
    int k = varint(p, end, &size);
    if (!k) return SCAN_DECLINED;
    p += k;
    k = varint(p, end, &rowid);
    if (!k) return SCAN_DECLINED;
    p += k;
    *rowid_out = (int64_t)rowid;
    if ((int64_t)rowid < s->lo || (int64_t)rowid > s->hi) return SCAN_OK;
    uint64_t u = s->usable, x = u - 35;
    if (size <= x) {
        if (p + size > end) return SCAN_DECLINED;
        return take_record(s, (int64_t)rowid, p, (size_t)size);
    }
    if (size > (1u << 30)) return SCAN_DECLINED;
    uint64_t m = ((u - 12) * 32 / 255) - 23, kk = m + ((size - m) % (u - 4));
    uint64_t local = kk <= x ? kk : m;
    if (p + local + 4 > end) return SCAN_DECLINED;
    if (s->payload_cap < size) {
        unsigned char *q = realloc(s->payload, (size_t)size);
        if (!q) return SCAN_NOMEM;
        s->payload = q;
        s->payload_cap = (size_t)size;
    }
    memcpy(s->payload, p, (size_t)local);
    uint64_t got = local;
    uint32_t next = be32(p + local);
    unsigned char *buf = s->pages[MAX_DEPTH - 1]; /* the deepest level's buffer: never a tree page */
    while (got < size) {
        if (!next || read_page(s, next, buf)) return SCAN_DECLINED;
        uint64_t n = size - got < u - 4 ? size - got : u - 4;
        memcpy(s->payload + got, buf + 4, (size_t)n);
        got += n;
        next = be32(buf);
    }
    return take_record(s, (int64_t)rowid, s->payload, (size_t)size);
}

/* The rows of the subtree at pgno with rowids in [lo, hi], in rowid order. *past: a rowid
 * beyond hi was seen (the scan can stop). */
static int visit(scan_t *s, uint32_t pgno, int depth, int *past) {
    if (depth >= MAX_DEPTH - 1) return SCAN_DECLINED;
    unsigned char *page = s->pages[depth];
    if (read_page(s, pgno, page)) return SCAN_DECLINED;
    size_t h = pgno == 1 ? 100 : 0; /* page 1 starts with the file header */
    unsigned type = page[h], n = be16(page + h + 3);
    size_t ptrs = h + (type == 0x05 ? 12 : 8);
    if ((type != 0x05 && type != 0x0D) || ptrs + 2 * (size_t)n > s->usable) return SCAN_DECLINED;
    if (type == 0x0D) {
        for (unsigned i = 0; i < n; i++) {
            size_t at = be16(page + ptrs + 2 * i);
            if (at < ptrs + 2 * (size_t)n || at >= s->usable) return SCAN_DECLINED;
            int64_t rowid;
            int r = take_cell(s, page, at, &rowid);
            if (r) return r;
            if (rowid > s->hi) {
                *past = 1;
                return SCAN_OK;
            }
        }
        return SCAN_OK;
    }
    /* interior: child i holds the rowids up to its key; the right-most child those above */
    for (unsigned i = 0; i < n; i++) {
        size_t at = be16(page + ptrs + 2 * i);
        if (at < ptrs + 2 * (size_t)n || at + 5 > s->usable) return SCAN_DECLINED;
        uint32_t child = be32(page + at);
        uint64_t key;
        if (!varint(page + at + 4, page + s->usable, &key)) return SCAN_DECLINED;
        if ((int64_t)key < s->lo) continue;
        int r = visit(s, child, depth + 1, past);
        if (r || *past) return r;
        page = s->pages[depth]; /* unchanged: each level has its own buffer */
        if ((int64_t)key >= s->hi) {
            *past = 1;
            return SCAN_OK;
        }
    }
    return visit(s, be32(page + h + 8), depth + 1, past);
}

static int scan_table(const char *path, uint32_t root, scan_t *s) {
    int res = SCAN_DECLINED;
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) return SCAN_DECLINED;
    unsigned char hdr[100];
    struct stat st;
    if (fstat(s->fd, &st) || pread(s->fd, hdr, 100, 0) != 100 ||
        memcmp(hdr, "SQLite format 3", 16) || be32(hdr + 56) != 1 /* UTF-8 */)
        goto done;
    s->page_size = be16(hdr + 16) == 1 ? 65536 : be16(hdr + 16);
    if (s->page_size < 512 || (s->page_size & (s->page_size - 1))) goto done;
    s->usable = s->page_size - hdr[20];
    if (s->usable < 480) goto done;
    /* the header's page count where it is valid (its change counter matches), else the size */
    uint64_t by_size = (uint64_t)st.st_size / s->page_size;
    uint32_t in_hdr = be32(hdr + 28);
    uint64_t pages = (in_hdr && be32(hdr + 92) == be32(hdr + 24)) ? in_hdr : by_size;
    if (pages > by_size || pages > UINT32_MAX) goto done;
    s->n_pages = (uint32_t)pages;
    for (int i = 0; i < MAX_DEPTH; i++)
        if (!(s->pages[i] = malloc(s->page_size))) {
            res = SCAN_NOMEM;
            goto done;
        }
    int past = 0;
    res = visit(s, root, 0, &past);
done:
    for (int i = 0; i < MAX_DEPTH; i++) free(s->pages[i]);
    free(s->payload);
    close(s->fd);
    return res;
}

static int int_tuple(PyObject *t, int64_t *vals, int max, int *n, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > max) {
        PyErr_Format(PyExc_ValueError, "scan: %s is a tuple of at most %d ints", what, max);
        return -1;
    }
    *n = (int)PyTuple_GET_SIZE(t);
    for (int i = 0; i < *n; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        vals[i] = v;
    }
    return 0;
}

/* The columns as export_columns makes them; a dictionary output's entry is the pair (codes,
 * distinct values), each an Arrow array (a pair of PyCapsules). */
static PyObject *export_scan(col_t *cols, dict_t *dicts, const out_t *outs, int n) {
    PyObject *out = export_columns(cols, n);
    for (int i = 0; out && i < n; i++) {
        if (outs[i].kind != K_U32) continue;
        PyObject *values = export_columns(&dicts[i].values, 1);
        PyObject *pair = values ? PyTuple_Pack(2, PyTuple_GET_ITEM(out, i),
                                               PyTuple_GET_ITEM(values, 0))
                                : NULL;
        Py_XDECREF(values);
        if (!pair) {
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(PyTuple_GET_ITEM(out, i));
        PyTuple_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *kbtree_scan(PyObject *self, PyObject *args) {
    (void)self;
    const char *path, *kinds;
    unsigned long root;
    long long lo, hi;
    int filter_col;
    PyObject *terms, *names, *filter_vals, *adds = NULL;
    if (!PyArg_ParseTuple(args, "skLLO!O!siO!|O!", &path, &root, &lo, &hi, &PyTuple_Type, &terms,
                          &PyTuple_Type, &names, &kinds, &filter_col, &PyTuple_Type, &filter_vals,
                          &PyTuple_Type, &adds))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n < 1 || n > MAX_OUT || PyTuple_GET_SIZE(terms) != n || (size_t)n != strlen(kinds) ||
        root < 1 || root > UINT32_MAX || filter_col < -2 || filter_col >= MAX_COL) {
        PyErr_SetString(PyExc_ValueError,
                        "scan: one term tuple and kind ('i' or 's') per name, 1-64 columns");
        return NULL;
    }
    scan_t *s = calloc(1, sizeof *s);
    col_t *cols = calloc((size_t)n, sizeof *cols);
    dict_t *dicts = calloc((size_t)n, sizeof *dicts);
    if (!s || !cols || !dicts) {
        free(s);
        free(cols);
        free(dicts);
        return PyErr_NoMemory();
    }
    s->dicts = dicts;
    s->lo = lo;
    s->hi = hi;
    s->n_out = (int)n;
    s->cols = cols;
    s->filter_col = filter_col < 0 ? -2 : filter_col;
    s->max_col = filter_col >= 0 ? filter_col : -1;
    PyObject *out = NULL;
    int made = 0;
    if (int_tuple(filter_vals, s->filter_vals, MAX_IN, &s->n_filter, "filter_vals")) goto fail;
    int64_t add[MAX_OUT] = {0};
    int n_add = 0;
    if (adds && (int_tuple(adds, add, MAX_OUT, &n_add, "adds") || (n_add && n_add != n))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "scan: one add per name");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out_t *o = &s->outs[i];
        int64_t vals[MAX_TERMS];
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (!name || int_tuple(PyTuple_GET_ITEM(terms, i), vals, MAX_TERMS, &o->n_terms, "terms"))
            goto fail;
        o->kind = kinds[i] == 's' ? K_STR : kinds[i] == 'd' ? K_U32 : K_I64;
        o->add = o->kind == K_I64 ? add[i] : 0;
        if ((kinds[i] != 'i' && kinds[i] != 's' && kinds[i] != 'd') || o->n_terms < 1 ||
            (o->kind != K_I64 && o->n_terms != 1)) {
            PyErr_SetString(PyExc_ValueError,
                            "scan: kinds are 'i' (1-4 terms), 's' or 'd' (1 term)");
            goto fail;
        }
        for (int j = 0; j < o->n_terms; j++) {
            if (vals[j] < (o->kind == K_I64 ? -1 : 0) || vals[j] >= MAX_COL) {
                PyErr_SetString(PyExc_ValueError,
                                "scan: a term is a column index (0-255) or, for integers, -1 (rowid)");
                goto fail;
            }
            o->terms[j] = (int)vals[j];
            if (o->terms[j] > s->max_col) s->max_col = o->terms[j];
        }
        /* the names stay alive with the tuple until export_col copies them */
        if (col_init(&cols[i], o->kind, name) || col_init(&dicts[i].values, K_STR, name)) {
            made = (int)i + 1;
            PyErr_NoMemory();
            goto fail;
        }
        made = (int)i + 1;
        /* a rowid range (the caller's parts) sizes the columns once: no copies while they grow */
        if (hi >= lo && (uint64_t)hi - (uint64_t)lo < (1u << 24) &&
            col_presize(&cols[i], (size_t)(hi - lo) + 1, ((size_t)(hi - lo) + 1) * 16)) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    int res;
    Py_BEGIN_ALLOW_THREADS
    res = scan_table(path, (uint32_t)root, s);
    Py_END_ALLOW_THREADS
    if (res == SCAN_OK)
        out = export_scan(cols, dicts, s->outs, (int)n);
    else if (res == SCAN_NOMEM)
        PyErr_NoMemory();
    else {
        Py_INCREF(Py_None);
        out = Py_None;
    }
fail:
    for (int i = 0; i < made; i++) {
        col_free(&cols[i]);
        dict_free(&dicts[i]);
    }
    free(cols);
    free(dicts);
    free(s);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", kbtree_scan, METH_VARARGS,
     "scan(path, root_page, lo, hi, terms, names, kinds, filter_col, filter_vals[, adds])\n"
     "    -> ((schema, array), ...) | None\n\n"
     "The rows with rowid in [lo, hi] of the table whose B-tree starts at ``root_page`` of the\n"
     "SQLite file ``path``, in rowid order. Output column i is named names[i]: int64 where\n"
     "kinds[i] is 'i', the sum of the record columns terms[i] (-1: the rowid; NULL if any is\n"
     "NULL), UTF-8 text where it is 's' (one column), where it is 'd' the pair (uint32 codes,\n"
     "distinct texts in first-seen order). With filter_col >= 0 only rows whose\n"
     "integer in that column is one of filter_vals; adds (optional, one per name): added to\n"
     "each non-NULL integer. None where SQLite should read it instead."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kbtree",
                                    "Native reader of SQLite table B-trees (see kbtree.c).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kbtree(void) { return PyModule_Create(&module); }
