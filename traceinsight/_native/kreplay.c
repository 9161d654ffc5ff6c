/* The step model's replay loop (traceinsight/causal/graph.py, ``replay``) over int64 arrays,
 * and three sweeps beside it: the replayed steps' durations, the intervals' coverage and
 * their nesting.
 *
 * Why native: one replay is a few rounds of chain passes over ~100k nodes; in polars each
 * round is ~30 small queries (a fifth of a second of CPU per analysis of the 10x benchmark
 * trace, 13 replays). Here a round is one sequential pass per chain.
 *
 * Exactly the polars loop's arithmetic: ``replay.py`` prepares the columns (chain order,
 * drain positions, launch offsets) and checks that both give the same times on real traces
 * (tests/test_native_replay.py). Every input is an Arrow int64 stream (PyCapsule interface)
 * without nulls; a null anywhere returns None and the polars loop decides.
 *
 * A chain (a host thread, a GPU stream) is the rows of one key in row order:
 *   start_0 = anchor_0 + gap_0,        end_0 = max(floor_0, anchor_0 + gap_0 + dur_0)
 *   start_i = end_{i-1} + gap_i,       end_i = max(end_{i-1} + gap_i + dur_i, floor_i)
 * (the closed form replay.py evaluates with a cumulative sum and a cumulative max).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_abi.h"

/* causal/graph.py's WAIT_* codes */
enum { WAIT_NONE = 0, WAIT_DEVICE = 1, WAIT_OWN_OP = 2, WAIT_QUEUE = 3 };

/* A column: the producer's buffer where the stream is one chunk (kept alive by ``keep``),
 * else a copy in ``owned``. Read-only either way. */
typedef struct {
    const int64_t *v;
    int64_t n;
    int64_t *owned;
    struct ArrowArray keep;
} vec_t;

static void vec_free(vec_t *c) {
    free(c->owned);
    if (c->keep.release) c->keep.release(&c->keep);
    memset(c, 0, sizeof *c);
}

/* ---- input: an Arrow int64 stream ------------------------------------------------------ */

enum { READ_OK = 0, READ_NULLS = 1, READ_ERROR = -1 };

/* Appends chunk ``a`` (released here) to ``out``; the first chunk is kept without a copy. */
static int take_chunk(vec_t *out, struct ArrowArray *a, size_t *cap_n) {
    if (a->length > 0 && (a->n_buffers < 2 || !a->buffers[1])) {
        a->release(a);
        PyErr_SetString(PyExc_ValueError, "kreplay: an int64 array without data");
        return READ_ERROR;
    }
    const int64_t *data = a->length > 0 ? (const int64_t *)a->buffers[1] + a->offset : NULL;
    if (!out->v && !out->owned && !out->keep.release) { /* the first: no copy */
        out->keep = *a;
        a->release = NULL;
        out->v = data;
        out->n = a->length;
        return READ_OK;
    }
    size_t need = (size_t)(out->n + a->length);
    if (!out->owned || need > *cap_n) {
        size_t nc = *cap_n ? *cap_n : 1024;
        while (nc < need) nc *= 2;
        int64_t *q = realloc(out->owned, nc * sizeof(int64_t));
        if (!q) {
            a->release(a);
            PyErr_NoMemory();
            return READ_ERROR;
        }
        if (!out->owned && out->n) memcpy(q, out->v, (size_t)out->n * sizeof(int64_t));
        out->owned = q;
        *cap_n = nc;
        if (out->keep.release) out->keep.release(&out->keep); /* copied: not needed now */
    }
    if (a->length) memcpy(out->owned + out->n, data, (size_t)a->length * sizeof(int64_t));
    out->n += a->length;
    out->v = out->owned;
    a->release(a);
    return READ_OK;
}

/* Consumes the stream (it is released here). READ_NULLS: a null value (the caller declines). */
static int read_i64(PyObject *cap, vec_t *out) {
    memset(out, 0, sizeof *out);
    struct ArrowArrayStream *st = PyCapsule_GetPointer(cap, "arrow_array_stream");
    if (!st) return READ_ERROR;
    if (!st->release) {
        PyErr_SetString(PyExc_ValueError, "kreplay: the stream was already consumed");
        return READ_ERROR;
    }
    int rc = READ_OK;
    struct ArrowSchema sc;
    memset(&sc, 0, sizeof sc);
    if (st->get_schema(st, &sc) != 0) {
        PyErr_SetString(PyExc_ValueError, "kreplay: the stream has no schema");
        rc = READ_ERROR;
    } else {
        if (!sc.format || strcmp(sc.format, "l") != 0) {
            PyErr_Format(PyExc_TypeError, "kreplay: expected int64, got Arrow format %s",
                         sc.format ? sc.format : "?");
            rc = READ_ERROR;
        }
        if (sc.release) sc.release(&sc);
    }
    size_t cap_n = 0;
    while (rc == READ_OK) {
        struct ArrowArray a;
        memset(&a, 0, sizeof a);
        if (st->get_next(st, &a) != 0) {
            PyErr_SetString(PyExc_ValueError, "kreplay: reading the stream failed");
            rc = READ_ERROR;
            break;
        }
        if (!a.release) break; /* the end of the stream */
        if (a.null_count != 0) {
            a.release(&a);
            rc = READ_NULLS;
            break;
        }
        rc = take_chunk(out, &a, &cap_n);
    }
    st->release(st);
    if (rc != READ_OK) vec_free(out);
    return rc;
}

/* ---- output: a struct array of int64 columns ------------------------------------------ */

/* (schema capsule, array capsule) of a struct of ``n`` int64 columns of ``length`` rows; the
 * arrays in ``cols`` move into it (set to NULL here), whether or not it succeeds. */
static PyObject *export_i64_table(const char *const *names, int64_t **cols, int n,
                                  int64_t length) {
    arrow_table_t t;
    if (arrow_table_new(&t, n, length)) {
        for (int i = 0; i < n; i++) {
            free(cols[i]);
            cols[i] = NULL;
        }
        return PyErr_NoMemory();
    }
    int ok = 1;
    for (int i = 0; i < n; i++) {
        int64_t *data = cols[i] ? cols[i] : malloc(sizeof(int64_t)); /* non-null, even empty */
        cols[i] = NULL;
        struct ArrowSchema *cs = ok ? (t.s->children[i] = calloc(1, sizeof *cs)) : NULL;
        struct ArrowArray *ca = ok ? (t.a->children[i] = calloc(1, sizeof *ca)) : NULL;
        arr_priv_t *pr = ok ? calloc(1, sizeof *pr) : NULL;
        char *name = ok ? strdup(names[i]) : NULL;
        if (!cs || !ca || !pr || !name || !data) {
            free(pr);
            free(name);
            free(data);
            ok = 0;
            continue;
        }
        cs->format = "l";
        cs->name = name;
        cs->private_data = name;
        cs->release = release_schema;
        pr->bufs[1] = data; /* no validity buffer: no nulls */
        for (int b = 0; b < 3; b++) pr->ptrs[b] = pr->bufs[b];
        ca->length = length;
        ca->n_buffers = 2;
        ca->buffers = pr->ptrs;
        ca->private_data = pr;
        ca->release = release_array;
    }
    return arrow_table_capsules(&t, ok);
}

/* ---- chains ------------------------------------------------------------------------- */

/* Each key's last end, found by open addressing (a few keys: threads, streams). */
typedef struct {
    int64_t *keys, *ends;
    unsigned char *used;
    size_t cap, n;
} chains_t;

static int chains_reset(chains_t *c) {
    if (!c->cap) {
        c->cap = 64;
        c->keys = malloc(c->cap * sizeof(int64_t));
        c->ends = malloc(c->cap * sizeof(int64_t));
        c->used = malloc(c->cap);
        if (!c->keys || !c->ends || !c->used) return -1;
    }
    memset(c->used, 0, c->cap);
    c->n = 0;
    return 0;
}

static void chains_free(chains_t *c) {
    free(c->keys);
    free(c->ends);
    free(c->used);
    memset(c, 0, sizeof *c);
}

static size_t chains_slot(const chains_t *c, int64_t key) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    size_t i = (size_t)(h >> 32) & (c->cap - 1);
    while (c->used[i] && c->keys[i] != key) i = (i + 1) & (c->cap - 1);
    return i;
}

static int chains_grow(chains_t *c) {
    chains_t g = {0};
    g.cap = c->cap * 2;
    g.keys = malloc(g.cap * sizeof(int64_t));
    g.ends = malloc(g.cap * sizeof(int64_t));
    g.used = calloc(g.cap, 1);
    if (!g.keys || !g.ends || !g.used) {
        chains_free(&g);
        return -1;
    }
    for (size_t i = 0; i < c->cap; i++) {
        if (!c->used[i]) continue;
        size_t j = chains_slot(&g, c->keys[i]);
        g.used[j] = 1;
        g.keys[j] = c->keys[i];
        g.ends[j] = c->ends[i];
    }
    g.n = c->n;
    chains_free(c);
    *c = g;
    return 0;
}

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Rows ``idx`` (all rows when NULL) of each column, in that order, as chains of ``key``:
 * their starts and ends (see the file's comment) into start[k], end[k] for the k-th row. */
static int chain_pass(chains_t *c, int64_t n, const int64_t *idx, const int64_t *key,
                      const int64_t *gap, const int64_t *dur, const int64_t *floor,
                      const int64_t *anchor, int64_t *start, int64_t *end) {
    if (chains_reset(c)) return -1;
    int64_t run_key = 0, prev = 0;
    int in_run = 0;
    size_t slot = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t i = idx ? idx[k] : k;
        int64_t kk = key[i];
        if (!in_run || kk != run_key) {
            if (in_run) c->ends[slot] = prev; /* the run's key keeps its last end */
            if (2 * (c->n + 1) > c->cap && chains_grow(c)) return -1;
            slot = chains_slot(c, kk);
            if (!c->used[slot]) {
                c->used[slot] = 1;
                c->keys[slot] = kk;
                c->n++;
                /* a chain's first row */
                start[k] = anchor[i] + gap[i];
                prev = max64(floor[i], anchor[i] + gap[i] + dur[i]);
                end[k] = prev;
                run_key = kk;
                in_run = 1;
                continue;
            }
            prev = c->ends[slot];
            run_key = kk;
            in_run = 1;
        }
        start[k] = prev + gap[i];
        prev = max64(prev + gap[i] + dur[i], floor[i]);
        end[k] = prev;
    }
    if (in_run) c->ends[slot] = prev;
    return 0;
}

/* ---- the replay ----------------------------------------------------------------------- */

enum { H_TID, H_GAP, H_DUR, H_ANCHOR, H_WAIT, H_OWN, H_QUEUE, H_FOLLOWS, H_ORIG_END, H_START, H_N };
enum { G_CHAIN, G_GAP, G_DUR, G_ANCHOR, G_LAUNCH, G_OFFSET, G_END, G_KEY, G_N };

typedef struct {
    vec_t h[H_N], g[G_N], order, node_order;
    int has_node_order, has_main;
    int64_t main_tid, neg_ns, converged_ns;
    int blocking, max_rounds, warm;
    /* work: one block (fresh pages cost more than the passes) */
    int64_t *block;
    int64_t *floor_h, *h_start, *h_end, *drained, *ready, *floor_g, *g_cur, *new_end, *before;
    int64_t *main_idx, *rest_idx, *m_start, *m_end, *r_start, *r_end, *r_gap, *r_floor;
    int64_t *shift_key, *shift_val, *sort_tmp, *node_start, *drain, *keys;
    int64_t n_main, n_rest;
    /* results (each moves into an exported array) */
    int64_t *out_hs, *out_he, *out_gs, *out_ge;
    chains_t chains;
} job_t;

static int cmp_idx_by_key(const int64_t *key, int64_t a, int64_t b) {
    return key[a] < key[b] ? -1 : key[a] > key[b] ? 1 : (a < b ? -1 : a > b);
}

/* A stable sort of idx[0..n) by key[idx] (merge sort; tmp holds n). */
static void sort_by_key(int64_t *idx, int64_t *tmp, int64_t n, const int64_t *key) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                tmp[o++] = cmp_idx_by_key(key, idx[b], idx[a]) < 0 ? idx[b++] : idx[a++];
            while (a < mid) tmp[o++] = idx[a++];
            while (b < hi) tmp[o++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof(int64_t));
    }
}

/* The step thread's last call (its index among that thread's rows) that ended in the trace at
 * or before ``t``, -1 if none: a follower's clock moves with it (run() sorts them by end). */
static int64_t main_call_before(const job_t *j, int64_t t) {
    const int64_t *by_end = j->shift_key, *end_sorted = j->shift_val;
    int64_t lo = 0, hi = j->n_main;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (end_sorted[mid] <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 ? by_end[lo - 1] : -1;
}

/* replay.py's _host_chains on the chain-ordered host rows: h_start, h_end. */
static int host_chains(job_t *j) {
    int64_t n = j->h[H_TID].n;
    const int64_t *tid = j->h[H_TID].v, *gap = j->h[H_GAP].v, *dur = j->h[H_DUR].v;
    const int64_t *anchor = j->h[H_ANCHOR].v, *follows = j->h[H_FOLLOWS].v;
    const int64_t *wait = j->h[H_WAIT].v, *orig_end = j->h[H_ORIG_END].v;
    int any_follows = 0;
    for (int64_t i = 0; i < n && !any_follows; i++) any_follows = follows[i] != 0;
    if (!j->has_main || !any_follows)
        return chain_pass(&j->chains, n, NULL, tid, gap, dur, j->floor_h, anchor, j->h_start,
                          j->h_end);
    /* the step thread's rows on their own, then the others following its clock */
    int64_t nm = j->n_main, nr = j->n_rest;
    if (chain_pass(&j->chains, nm, j->main_idx, tid, gap, dur, j->floor_h, anchor, j->m_start,
                   j->m_end))
        return -1;
    for (int64_t q = 0; q < nr; q++) {
        int64_t i = j->rest_idx[q];
        int64_t p = main_call_before(j, anchor[i]);
        int64_t lead = p < 0 ? 0 : j->m_end[p] - orig_end[j->main_idx[p]];
        int f = follows[i] != 0;
        j->r_floor[i] = f ? max64(j->floor_h[i], anchor[i] + lead + dur[i]) : j->floor_h[i];
        j->r_gap[i] = f ? 0 : gap[i];
    }
    if (chain_pass(&j->chains, nr, j->rest_idx, tid, j->r_gap, dur, j->r_floor, anchor,
                   j->r_start, j->r_end))
        return -1;
    for (int64_t k = 0; k < nm; k++) {
        j->h_start[j->main_idx[k]] = j->m_start[k];
        j->h_end[j->main_idx[k]] = j->m_end[k];
    }
    for (int64_t q = 0; q < nr; q++) {
        int64_t i = j->rest_idx[q];
        int64_t s = j->r_start[q], e = j->r_end[q];
        /* a follower that does not wait starts no earlier than dur before its end */
        if (follows[i] != 0 && wait[i] == WAIT_NONE) s = max64(s, e - dur[i]);
        j->h_start[i] = s;
        j->h_end[i] = e;
    }
    return 0;
}

static int64_t *alloc_n(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t)); }

/* The work block's arrays: 16 of the host's length, 6 of the GPU's, one of the GPU's + 1. */
static int job_alloc(job_t *j) {
    int64_t nh = j->h[H_TID].n, ng = j->g[G_CHAIN].n;
    int64_t **hw[] = {&j->floor_h, &j->h_start, &j->h_end,    &j->main_idx,  &j->rest_idx,
                      &j->m_start, &j->m_end,   &j->r_start,  &j->r_end,     &j->r_gap,
                      &j->r_floor, &j->shift_key, &j->shift_val, &j->sort_tmp, &j->node_start,
                      &j->drain};
    int64_t **gw[] = {&j->ready, &j->floor_g, &j->g_cur, &j->new_end, &j->before, &j->keys};
    size_t nhw = sizeof hw / sizeof *hw, ngw = sizeof gw / sizeof *gw;
    j->block = malloc(((size_t)nh * nhw + (size_t)ng * ngw + (size_t)ng + 1) * sizeof(int64_t));
    j->out_hs = alloc_n(nh);
    j->out_he = alloc_n(nh);
    j->out_gs = alloc_n(ng);
    j->out_ge = alloc_n(ng);
    if (!j->block || !j->out_hs || !j->out_he || !j->out_gs || !j->out_ge) return -1;
    int64_t *p = j->block;
    for (size_t i = 0; i < nhw; i++, p += nh) *hw[i] = p;
    for (size_t i = 0; i < ngw; i++, p += ng) *gw[i] = p;
    j->drained = p;
    return 0;
}

/* ---- the warm start ------------------------------------------------------------------- */

/* The rounds above settle one more blocking call each: a loop that syncs 432 times in its
 * window took 432 rounds (and a large one more than REPLAY_WORK_MAX allows, cut unsettled).
 * Before them, one sweep takes every host call and GPU op in trace order (a call at its start,
 * an op at its launch; each chain in its own order) and computes it from what its edges read
 * at that point: the same arithmetic as a round, but a sync reads the ends of the ops launched
 * before it as this sweep computed them. Where every edge points back in trace time, that is
 * the replay's fixed point and the rounds only confirm it (two); where one does not, the
 * rounds go on from there as they would have from the trace's own times. */

typedef struct {
    int64_t key;
    int64_t chain; /* host chains first, then the GPU's */
    int cls;       /* at one time: a call's start, then the ops it launched, then its end */
} ev_t;

static int ev_before(const ev_t *a, const ev_t *b) {
    if (a->key != b->key) return a->key < b->key;
    if (a->cls != b->cls) return a->cls < b->cls;
    return a->chain < b->chain;
}

static void heap_push(ev_t *h, int64_t *n, ev_t e) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!ev_before(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static ev_t heap_pop(ev_t *h, int64_t *n) {
    ev_t top = h[0], last = h[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && ev_before(&h[c + 1], &h[c])) c++;
        if (!ev_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Rows 0..n-1 grouped by ``key`` into dense chains, each in row order: rows[first[c] ..
 * first[c + 1]) are chain c's; returns the number of chains, -1 out of memory. */
static int64_t group_rows(const int64_t *key, int64_t n, int64_t *chain_of, int64_t *rows,
                          int64_t **first_out) {
    chains_t c;
    memset(&c, 0, sizeof c);
    if (chains_reset(&c)) return -1;
    int64_t n_chains = 0;
    for (int64_t i = 0; i < n; i++) {
        if (2 * (c.n + 1) > c.cap && chains_grow(&c)) {
            chains_free(&c);
            return -1;
        }
        size_t s = chains_slot(&c, key[i]);
        if (!c.used[s]) {
            c.used[s] = 1;
            c.keys[s] = key[i];
            c.ends[s] = n_chains++;
            c.n++;
        }
        chain_of[i] = c.ends[s];
    }
    chains_free(&c);
    int64_t *first = calloc((size_t)n_chains + 1, sizeof(int64_t));
    if (!first) return -1;
    for (int64_t i = 0; i < n; i++) first[chain_of[i] + 1]++;
    for (int64_t k = 0; k < n_chains; k++) first[k + 1] += first[k];
    int64_t *fill = malloc(((size_t)n_chains + 1) * sizeof(int64_t));
    if (!fill) {
        free(first);
        return -1;
    }
    memcpy(fill, first, ((size_t)n_chains + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) rows[fill[chain_of[i]]++] = i;
    free(fill);
    *first_out = first;
    return n_chains;
}

/* The sweep; the GPU ops' ends into ``g_out``. 0, or -1 out of memory. */
static int warm_start(job_t *j, int64_t *g_out) {
    int64_t nh = j->h[H_TID].n, ng = j->g[G_CHAIN].n, neg = j->neg_ns;
    const int64_t *tid = j->h[H_TID].v, *gap = j->h[H_GAP].v, *dur = j->h[H_DUR].v;
    const int64_t *anchor = j->h[H_ANCHOR].v, *wait = j->h[H_WAIT].v, *own = j->h[H_OWN].v;
    const int64_t *queue = j->h[H_QUEUE].v, *follows = j->h[H_FOLLOWS].v;
    const int64_t *orig_end = j->h[H_ORIG_END].v, *h_key = j->h[H_START].v;
    const int64_t *launch = j->g[G_LAUNCH].v, *offset = j->g[G_OFFSET].v;
    const int64_t *g_anchor = j->g[G_ANCHOR].v, *g_gap = j->g[G_GAP].v, *g_dur = j->g[G_DUR].v;
    const int64_t *g_key = j->g[G_KEY].v, *order = j->order.v, *node = j->node_order.v;
    int fmode = 0;
    for (int64_t i = 0; i < nh && j->has_main && !fmode; i++) fmode = follows[i] != 0;
    int64_t size = 1;
    while (size < ng) size *= 2;
    int rc = -1;
    int64_t *hs = alloc_n(nh), *he = alloc_n(nh), *h_chain = alloc_n(nh), *h_rows = alloc_n(nh);
    int64_t *g_chain = alloc_n(ng), *g_rows = alloc_n(ng), *pos_of = alloc_n(ng);
    int64_t *tree = alloc_n(2 * size), *h_first = NULL, *g_first = NULL, *prev = NULL, *at = NULL;
    ev_t *heap = NULL;
    if (!hs || !he || !h_chain || !h_rows || !g_chain || !g_rows || !pos_of || !tree) goto out;
    int64_t nhc = group_rows(tid, nh, h_chain, h_rows, &h_first);
    if (nhc < 0) goto out;
    int64_t ngc = group_rows(j->g[G_CHAIN].v, ng, g_chain, g_rows, &g_first);
    if (ngc < 0) goto out;
    free(h_chain); /* read by the grouping only: freed before the sweep */
    free(g_chain);
    h_chain = g_chain = NULL;
    int64_t n_chains = nhc + ngc, n_heap = 0;
    prev = alloc_n(n_chains);
    at = alloc_n(n_chains); /* each chain's next row (an index into its rows) */
    heap = malloc((size_t)(n_chains > 0 ? n_chains : 1) * sizeof(ev_t));
    if (!prev || !at || !heap) goto out;
    memcpy(hs, h_key, (size_t)nh * sizeof(int64_t));
    memcpy(he, orig_end, (size_t)nh * sizeof(int64_t));
    if (ng) memcpy(g_out, j->g[G_END].v, (size_t)ng * sizeof(int64_t));
    /* the ends of the ops in launch order, for a sync's "everything launched before me" */
    for (int64_t p = 0; p < 2 * size; p++) tree[p] = neg;
    for (int64_t p = 0; p < ng; p++) {
        pos_of[order[p]] = p;
        tree[size + p] = g_out[order[p]];
    }
    for (int64_t p = size - 1; p >= 1; p--) tree[p] = max64(tree[2 * p], tree[2 * p + 1]);
    for (int64_t c = 0; c < nhc; c++) {
        at[c] = h_first[c];
        heap_push(heap, &n_heap, (ev_t){h_key[h_rows[at[c]]], c, 0});
    }
    for (int64_t c = 0; c < ngc; c++) {
        at[nhc + c] = g_first[c];
        heap_push(heap, &n_heap, (ev_t){g_key[g_rows[at[nhc + c]]], nhc + c, 1});
    }
    while (n_heap) {
        ev_t e = heap_pop(heap, &n_heap);
        if (e.chain >= nhc) { /* a GPU op, ready when its launch call began */
            int64_t c = e.chain - nhc, k = g_rows[at[e.chain]];
            int64_t ready = g_anchor[k];
            if (nh && launch[k] >= 0) {
                int64_t n = j->has_node_order ? node[launch[k]] : launch[k];
                ready = hs[n] + offset[k];
            }
            int first = at[e.chain] == g_first[c];
            int64_t end = ready + g_gap[k] + g_dur[k];
            if (!first) end = max64(prev[e.chain] + g_gap[k] + g_dur[k], end);
            g_out[k] = prev[e.chain] = end;
            int64_t p = size + pos_of[k];
            for (tree[p] = end, p /= 2; p >= 1; p /= 2) tree[p] = max64(tree[2 * p], tree[2 * p + 1]);
            if (++at[e.chain] < g_first[c + 1])
                heap_push(heap, &n_heap, (ev_t){g_key[g_rows[at[e.chain]]], e.chain, 1});
            continue;
        }
        int64_t c = e.chain, i = h_rows[at[c]];
        int main_row = j->has_main && tid[i] == j->main_tid;
        int follower = fmode && !main_row && follows[i] != 0;
        if (e.cls == 0) { /* its start: the thread's previous end and the host work between */
            int64_t g = follower ? 0 : gap[i];
            hs[i] = (at[c] == h_first[c] ? anchor[i] : prev[c]) + g;
            if (wait[i] != WAIT_NONE && ng) { /* its end once the ops launched by then ran */
                heap_push(heap, &n_heap, (ev_t){e.key, c, 2});
                continue;
            }
        }
        int64_t floor = neg;
        if (ng) {
            if (wait[i] == WAIT_DEVICE) {
                int64_t lo = size, hi = size + j->drain[i]; /* max over positions [0, drain) */
                int64_t m = neg;
                for (; lo < hi; lo /= 2, hi /= 2) {
                    if (lo & 1) m = max64(m, tree[lo++]);
                    if (hi & 1) m = max64(m, tree[--hi]);
                }
                floor = m + dur[i];
            } else if (wait[i] == WAIT_OWN_OP)
                floor = g_out[own[i]] + dur[i];
            else if (wait[i] == WAIT_QUEUE)
                floor = g_out[queue[i]] + dur[i];
        }
        if (follower) { /* on the step thread's clock: as host_chains */
            int64_t p = main_call_before(j, anchor[i]), m = p < 0 ? 0 : j->main_idx[p];
            int64_t lead = p < 0 ? 0 : he[m] - orig_end[m];
            floor = max64(floor, anchor[i] + lead + dur[i]);
        }
        int64_t end = max64(hs[i] + dur[i], floor);
        if (follower && wait[i] == WAIT_NONE) hs[i] = max64(hs[i], end - dur[i]);
        he[i] = prev[c] = end;
        if (++at[c] < h_first[c + 1]) heap_push(heap, &n_heap, (ev_t){h_key[h_rows[at[c]]], c, 0});
    }
    rc = 0;
out:
    free(hs);
    free(he);
    free(h_chain);
    free(h_rows);
    free(g_chain);
    free(g_rows);
    free(pos_of);
    free(tree);
    free(h_first);
    free(g_first);
    free(prev);
    free(at);
    free(heap);
    return rc;
}

/* Runs the loop; 0, -1 (out of memory) or -2 (an index out of range: a broken model). */
static int run(job_t *j, int *rounds_out, int *converged_out) {
    int64_t nh = j->h[H_TID].n, ng = j->g[G_CHAIN].n, neg = j->neg_ns;
    const int64_t *wait = j->h[H_WAIT].v, *own = j->h[H_OWN].v, *queue = j->h[H_QUEUE].v;
    const int64_t *drain = j->drain, *hdur = j->h[H_DUR].v;
    const int64_t *launch = j->g[G_LAUNCH].v, *offset = j->g[G_OFFSET].v;
    const int64_t *g_anchor = j->g[G_ANCHOR].v, *g_gap = j->g[G_GAP].v, *g_dur = j->g[G_DUR].v;
    const int64_t *order = j->order.v, *node = j->node_order.v;
    for (int64_t k = 0; k < ng; k++)
        if (order[k] < 0 || order[k] >= ng || launch[k] >= nh) return -2;
    /* which GPU ops a device sync waits for: those launched before the call starts (the
     * number of launch times below its start) */
    for (int64_t k = 0; k < ng; k++) j->keys[k] = j->g[G_KEY].v[order[k]];
    int64_t lo = 0, prev_t = 0;
    for (int64_t i = 0; i < nh; i++) {
        /* a thread's calls come in start order: gallop on from the previous call's position
         * (a binary search over all of them misses the cache on each step) */
        int64_t t = j->h[H_START].v[i], hi = ng;
        if (i && t >= prev_t) {
            int64_t step = 1;
            hi = lo;
            while (hi < ng && j->keys[hi] < t) {
                lo = hi + 1;
                hi += step;
                step *= 2;
            }
            if (hi > ng) hi = ng;
        } else {
            lo = 0;
        }
        prev_t = t;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (j->keys[mid] < t)
                lo = mid + 1;
            else
                hi = mid;
        }
        j->drain[i] = lo;
    }
    for (int64_t i = 0; i < nh; i++) {
        if (ng && (own[i] < 0 || own[i] >= ng || queue[i] < 0 || queue[i] >= ng)) return -2;
        if (j->has_node_order && (node[i] < 0 || node[i] >= nh)) return -2;
    }
    /* the step thread's rows and the others, in chain order */
    j->n_main = j->n_rest = 0;
    for (int64_t i = 0; i < nh; i++) {
        if (j->has_main && j->h[H_TID].v[i] == j->main_tid)
            j->main_idx[j->n_main++] = i;
        else
            j->rest_idx[j->n_rest++] = i;
    }
    /* the step thread's calls by their trace end, once (stable: of equal ends the last in row
     * order is the one an as-of join takes): host_chains finds each follower's lead there */
    {
        int64_t nm = j->n_main, *by_end = j->shift_key, *end_sorted = j->shift_val;
        const int64_t *orig_end = j->h[H_ORIG_END].v;
        int sorted = 1;
        for (int64_t k = 0; k < nm; k++) {
            by_end[k] = k;
            end_sorted[k] = orig_end[j->main_idx[k]];
            if (k && end_sorted[k] < end_sorted[k - 1]) sorted = 0;
        }
        if (!sorted) { /* calls on one thread end in order but for clock noise: rarely runs */
            sort_by_key(by_end, j->sort_tmp, nm, end_sorted);
            for (int64_t k = 0; k < nm; k++) j->sort_tmp[k] = orig_end[j->main_idx[by_end[k]]];
            memcpy(end_sorted, j->sort_tmp, (size_t)nm * sizeof(int64_t));
        }
    }
    int64_t *g_end = j->g_cur, *node_start = j->has_node_order ? j->node_start : j->h_start;
    if (j->warm && j->blocking && ng) {
        if (warm_start(j, g_end)) return -1;
    } else if (ng)
        memcpy(g_end, j->g[G_END].v, (size_t)ng * sizeof(int64_t));
    int have_before = 0, rounds = 0, converged = 0;
    for (rounds = 1; rounds <= j->max_rounds; rounds++) {
        j->drained[0] = neg;
        for (int64_t k = 0; k < ng; k++) j->drained[k + 1] = max64(j->drained[k], g_end[order[k]]);
        for (int64_t i = 0; i < nh; i++) {
            int64_t w = wait[i], f = neg;
            if (ng) {
                if (w == WAIT_DEVICE)
                    f = j->drained[drain[i]] + hdur[i];
                else if (w == WAIT_OWN_OP)
                    f = g_end[own[i]] + hdur[i];
                else if (w == WAIT_QUEUE)
                    f = g_end[queue[i]] + hdur[i];
            }
            j->floor_h[i] = f;
        }
        if (host_chains(j)) return -1;
        if (j->has_node_order)
            for (int64_t k = 0; k < nh; k++) node_start[k] = j->h_start[node[k]];
        for (int64_t k = 0; k < ng; k++) {
            j->ready[k] = (nh && launch[k] >= 0) ? node_start[launch[k]] + offset[k] : g_anchor[k];
            j->floor_g[k] = j->ready[k] + g_gap[k] + g_dur[k];
        }
        if (chain_pass(&j->chains, ng, NULL, j->g[G_CHAIN].v, g_gap, g_dur, j->floor_g, j->ready,
                       j->out_gs, j->new_end))
            return -1;
        int64_t moved = 0;
        for (int64_t k = 0; k < ng; k++) {
            int64_t d = j->new_end[k] - g_end[k];
            if (d < 0) d = -d;
            if (d > moved) moved = d;
        }
        int cycle = have_before && memcmp(j->new_end, j->before, (size_t)ng * sizeof(int64_t)) == 0;
        /* before_last, g_end = g_end, new_end */
        int64_t *t = j->before;
        j->before = g_end;
        g_end = j->new_end;
        j->new_end = t;
        have_before = 1;
        if (!j->blocking || (moved <= j->converged_ns && rounds > 1)) {
            converged = 1;
            break;
        }
        if (cycle) break; /* a two-round cycle: edges that contradict each other */
    }
    if (rounds > j->max_rounds) rounds = j->max_rounds;
    if (ng) memcpy(j->out_ge, g_end, (size_t)ng * sizeof(int64_t));
    if (j->has_node_order) {
        for (int64_t k = 0; k < nh; k++) {
            j->out_hs[k] = j->h_start[node[k]];
            j->out_he[k] = j->h_end[node[k]];
        }
    } else if (nh) {
        memcpy(j->out_hs, j->h_start, (size_t)nh * sizeof(int64_t));
        memcpy(j->out_he, j->h_end, (size_t)nh * sizeof(int64_t));
    }
    *rounds_out = rounds;
    *converged_out = converged;
    return 0;
}

static void job_free(job_t *j) {
    for (int i = 0; i < H_N; i++) vec_free(&j->h[i]);
    for (int i = 0; i < G_N; i++) vec_free(&j->g[i]);
    vec_free(&j->order);
    vec_free(&j->node_order);
    free(j->block);
    free(j->out_hs);
    free(j->out_he);
    free(j->out_gs);
    free(j->out_ge);
    chains_free(&j->chains);
    memset(j, 0, sizeof *j);
}

/* Reads a tuple of ``n`` streams into vecs of one length; 1: a null somewhere (decline). */
static int read_all(PyObject *tuple, vec_t *out, int n, const char *what) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != n) {
        PyErr_Format(PyExc_TypeError, "kreplay: %s must be a tuple of %d streams", what, n);
        return -1;
    }
    int declined = 0;
    for (int i = 0; i < n; i++) {
        int rc = read_i64(PyTuple_GET_ITEM(tuple, i), &out[i]);
        if (rc == READ_ERROR) return -1;
        if (rc == READ_NULLS) declined = 1;
        if (!declined && out[i].n != out[0].n) {
            PyErr_Format(PyExc_ValueError, "kreplay: %s columns differ in length", what);
            return -1;
        }
    }
    return declined;
}

static PyObject *kreplay_replay(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *host, *gpu, *order, *node_order, *main_tid;
    int blocking, max_rounds, warm = 1;
    long long neg_ns, converged_ns;
    if (!PyArg_ParseTuple(args, "OOOOOpiLL|p", &host, &gpu, &order, &node_order, &main_tid,
                          &blocking, &max_rounds, &neg_ns, &converged_ns, &warm))
        return NULL;
    job_t j;
    memset(&j, 0, sizeof j);
    j.blocking = blocking;
    j.max_rounds = max_rounds;
    j.warm = warm;
    j.neg_ns = neg_ns;
    j.converged_ns = converged_ns;
    if (main_tid != Py_None) {
        j.main_tid = PyLong_AsLongLong(main_tid);
        if (j.main_tid == -1 && PyErr_Occurred()) return NULL;
        j.has_main = 1;
    }
    PyObject *result = NULL;
    int dh = read_all(host, j.h, H_N, "host");
    int dg = dh < 0 ? -1 : read_all(gpu, j.g, G_N, "gpu");
    int dord = dg < 0 ? -1 : read_i64(order, &j.order);
    int dnode = 0;
    if (dord >= 0 && node_order != Py_None) {
        dnode = read_i64(node_order, &j.node_order);
        j.has_node_order = 1;
    }
    if (dh < 0 || dg < 0 || dord < 0 || dnode < 0) goto done;
    if (dh || dg || dord || dnode) {
        result = Py_None; /* nulls: the polars loop decides */
        Py_INCREF(result);
        goto done;
    }
    int64_t nh = j.h[H_TID].n, ng = j.g[G_CHAIN].n;
    if (j.order.n != ng || (j.has_node_order && j.node_order.n != nh)) {
        PyErr_SetString(PyExc_ValueError, "kreplay: order columns differ in length");
        goto done;
    }
    if (job_alloc(&j)) {
        PyErr_NoMemory();
        goto done;
    }
    int rounds = 0, converged = 0, rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run(&j, &rounds, &converged);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc == -2) {
        PyErr_SetString(PyExc_IndexError, "kreplay: a node index is out of range");
        goto done;
    }
    static const char *const names[2] = {"start", "end"};
    int64_t *hcols[2] = {j.out_hs, j.out_he}, *gcols[2] = {j.out_gs, j.out_ge};
    j.out_hs = j.out_he = j.out_gs = j.out_ge = NULL; /* they move into the tables */
    PyObject *ht = export_i64_table(names, hcols, 2, nh);
    PyObject *gt = ht ? export_i64_table(names, gcols, 2, ng) : NULL;
    if (!gt) {
        free(gcols[0]);
        free(gcols[1]);
    }
    if (ht && gt)
        result = Py_BuildValue("(NNii)", ht, gt, rounds, converged);
    else {
        Py_XDECREF(ht);
        Py_XDECREF(gt);
    }
done:
    job_free(&j);
    return result;
}

/* ---- step times ----------------------------------------------------------------------- */

static int64_t last_at_or_before(const int64_t *sorted, int64_t n, int64_t v) {
    int64_t lo = 0, hi = n; /* the count of values <= v */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - 1;
}

enum { S_START, S_END, S_N };
enum { T_TID, T_END, T_REPLAYED_END, T_N };
enum { O_LAUNCHED, O_KEY, O_END, O_N };

/* replay.py's step_times_ns on the replayed times: each step's duration. */
static int step_times(vec_t *st, vec_t *th, vec_t *op, int has_tid, int64_t tid, int64_t *dur) {
    int64_t n = st[S_START].n, nh = th[T_TID].n, ng = op[O_KEY].n;
    const int64_t *ss = st[S_START].v, *se = st[S_END].v;
    int64_t *idx = alloc_n(nh), *ends = alloc_n(nh), *tmp = alloc_n(nh);
    int64_t *hs = alloc_n(n), *he = alloc_n(n), *gend = alloc_n(n), *start = alloc_n(n);
    int64_t *end = alloc_n(n);
    unsigned char *has_g = calloc((size_t)(n > 0 ? n : 1), 1);
    int rc = -1;
    if (!idx || !ends || !tmp || !hs || !he || !gend || !start || !end || !has_g) goto out;
    /* the step thread's calls by their trace end (stable: the last of equal ends wins, as in
     * an as-of join); a host time moves with the last of them that ended at or before it */
    int64_t m = 0;
    int sorted = 1;
    for (int64_t i = 0; i < nh; i++) {
        if (!has_tid || th[T_TID].v[i] != tid) continue;
        idx[m] = i;
        ends[m] = th[T_END].v[i];
        if (m && ends[m] < ends[m - 1]) sorted = 0;
        m++;
    }
    if (!sorted) {
        int64_t *pos = alloc_n(m), *key = alloc_n(m);
        if (!pos || !key) {
            free(pos);
            free(key);
            goto out;
        }
        for (int64_t k = 0; k < m; k++) pos[k] = k;
        sort_by_key(pos, tmp, m, ends);
        for (int64_t k = 0; k < m; k++) {
            tmp[k] = idx[pos[k]];
            key[k] = ends[pos[k]];
        }
        memcpy(idx, tmp, (size_t)m * sizeof(int64_t));
        memcpy(ends, key, (size_t)m * sizeof(int64_t));
        free(pos);
        free(key);
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t a = last_at_or_before(ends, m, ss[i]), b = last_at_or_before(ends, m, se[i]);
        hs[i] = ss[i] + (a >= 0 ? th[T_REPLAYED_END].v[idx[a]] - th[T_END].v[idx[a]] : 0);
        he[i] = se[i] + (b >= 0 ? th[T_REPLAYED_END].v[idx[b]] - th[T_END].v[idx[b]] : 0);
    }
    /* the GPU work launched inside each step (the last step starting at or before the launch) */
    for (int64_t k = 0; k < ng; k++) {
        if (!op[O_LAUNCHED].v[k]) continue;
        int64_t key = op[O_KEY].v[k], i = last_at_or_before(ss, n, key);
        if (i < 0 || key >= se[i]) continue;
        if (!has_g[i] || op[O_END].v[k] > gend[i]) gend[i] = op[O_END].v[k];
        has_g[i] = 1;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t e = has_g[i] ? max64(he[i], gend[i]) : he[i];
        end[i] = i ? max64(end[i - 1], e) : e;
        start[i] = i ? max64(hs[i], end[i - 1]) : hs[i];
    }
    /* work queued before the first step runs first */
    if (n) {
        int found = 0;
        int64_t drained = 0;
        for (int64_t k = 0; k < ng; k++) {
            int queued = !op[O_LAUNCHED].v[k] || op[O_KEY].v[k] < ss[0];
            if (queued && op[O_END].v[k] > start[0]) {
                drained = found ? max64(drained, op[O_END].v[k]) : op[O_END].v[k];
                found = 1;
            }
        }
        if (found) start[0] = drained < end[0] ? drained : end[0];
    }
    for (int64_t i = 0; i < n; i++) dur[i] = end[i] - start[i];
    rc = 0;
out:
    free(idx);
    free(ends);
    free(tmp);
    free(hs);
    free(he);
    free(gend);
    free(start);
    free(end);
    free(has_g);
    return rc;
}

static PyObject *kreplay_step_times(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *steps, *host, *gpu, *tid_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &steps, &host, &gpu, &tid_obj)) return NULL;
    vec_t st[S_N], th[T_N], op[O_N];
    memset(st, 0, sizeof st);
    memset(th, 0, sizeof th);
    memset(op, 0, sizeof op);
    int64_t tid = 0;
    int has_tid = tid_obj != Py_None;
    if (has_tid) {
        tid = PyLong_AsLongLong(tid_obj);
        if (tid == -1 && PyErr_Occurred()) return NULL;
    }
    PyObject *result = NULL;
    int ds = read_all(steps, st, S_N, "steps");
    int dh = ds < 0 ? -1 : read_all(host, th, T_N, "host");
    int dg = dh < 0 ? -1 : read_all(gpu, op, O_N, "gpu");
    if (ds < 0 || dh < 0 || dg < 0) goto done;
    if (ds || dh || dg) {
        result = Py_None; /* nulls: the polars path decides */
        Py_INCREF(result);
        goto done;
    }
    int64_t n = st[S_START].n;
    int64_t *dur = alloc_n(n);
    if (!dur) {
        PyErr_NoMemory();
        goto done;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = step_times(st, th, op, has_tid, tid, dur);
    Py_END_ALLOW_THREADS
    if (rc) {
        free(dur);
        PyErr_NoMemory();
        goto done;
    }
    static const char *const names[1] = {"dur_ns"};
    int64_t *cols[1] = {dur};
    result = export_i64_table(names, cols, 1, n);
done:
    for (int i = 0; i < S_N; i++) vec_free(&st[i]);
    for (int i = 0; i < T_N; i++) vec_free(&th[i]);
    for (int i = 0; i < O_N; i++) vec_free(&op[i]);
    return result;
}

/* ---- interval coverage (model/intervals.py overlap_with) ------------------------------ */

/* The union's length covered up to t: the intervals before the last one starting at or before
 * t whole, that one up to t. Its index is found from the previous point's (*j): a gallop
 * forward, a bisection back, so points in a few ascending runs cost a merge, in any order
 * log(m) each. */
static int64_t covered_until(const int64_t *us, const int64_t *ue, const int64_t *full, int64_t m,
                             int64_t t, int64_t *j) {
    int64_t k = *j;
    if (k >= 0 && us[k] > t) { /* stepped back: the last start <= t by binary search */
        int64_t lo = 0, hi = k; /* us[hi] > t */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (us[mid] > t)
                hi = mid;
            else
                lo = mid + 1;
        }
        k = lo - 1;
    }
    if (k + 1 < m && us[k + 1] <= t) { /* forward: gallop, then bisect (points in any order) */
        int64_t lo = k + 1, step = 1;   /* us[lo] <= t */
        while (lo + step < m && us[lo + step] <= t) {
            lo += step;
            step <<= 1;
        }
        int64_t hi = lo + step < m ? lo + step : m; /* hi == m or us[hi] > t */
        while (hi - lo > 1) {
            int64_t mid = lo + (hi - lo) / 2;
            if (us[mid] <= t)
                lo = mid;
            else
                hi = mid;
        }
        k = lo;
    }
    *j = k;
    if (k < 0) return 0;
    int64_t reach = (t < ue[k] ? t : ue[k]) - us[k];
    return full[k] + (reach > 0 ? reach : 0);
}

static PyObject *kreplay_overlap(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *points, *u;
    if (!PyArg_ParseTuple(args, "OO", &points, &u)) return NULL;
    vec_t p[2], v[2];
    memset(p, 0, sizeof p);
    memset(v, 0, sizeof v);
    PyObject *result = NULL;
    int64_t *full = NULL;
    int dp = read_all(points, p, 2, "points");
    int du = dp < 0 ? -1 : read_all(u, v, 2, "union");
    if (dp < 0 || du < 0) goto done;
    if (dp || du) {
        result = Py_None; /* nulls: the polars path decides */
        Py_INCREF(result);
        goto done;
    }
    int64_t n = p[0].n, m = v[0].n;
    int64_t *out = alloc_n(n);
    full = alloc_n(m);
    if (!full || !out) {
        free(out);
        PyErr_NoMemory();
        goto done;
    }
    int64_t acc = 0;
    for (int64_t k = 0; k < m; k++) {
        full[k] = acc;
        acc += v[1].v[k] - v[0].v[k];
    }
    int64_t js = -1, je = -1; /* the start and end points each walk the union once */
    for (int64_t i = 0; i < n; i++)
        out[i] = covered_until(v[0].v, v[1].v, full, m, p[1].v[i], &je) -
                 covered_until(v[0].v, v[1].v, full, m, p[0].v[i], &js);
    static const char *const names[1] = {"overlap_ns"};
    int64_t *cols[1] = {out};
    result = export_i64_table(names, cols, 1, n);
done:
    free(full);
    for (int i = 0; i < 2; i++) {
        vec_free(&p[i]);
        vec_free(&v[i]);
    }
    return result;
}

/* ---- nesting (analyzers/sources.py _innermost) ---------------------------------------- */

/* Each row's parent: the last row before it on its thread whose range holds it, -1 if none.
 * Rows in (tid, start ascending, end descending) order. A stack per thread: a range that ends
 * before the row does holds no later row that a later-listed range does not also hold (that
 * one starts no earlier and ends later), so popping it loses no answer; what stays on the stack
 * ends no earlier than the row, and its top is the last listed. */
static PyObject *kreplay_parents(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rows;
    if (!PyArg_ParseTuple(args, "O", &rows)) return NULL;
    vec_t v[3];
    memset(v, 0, sizeof v);
    PyObject *result = NULL;
    int64_t *out = NULL, *stack = NULL;
    int d = read_all(rows, v, 3, "rows");
    if (d < 0) goto done;
    if (d) goto declined; /* nulls */
    int64_t n = v[0].n;
    out = alloc_n(n);
    stack = alloc_n(n);
    if (!out || !stack) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *tid = v[0].v, *start = v[1].v, *end = v[2].v;
    int64_t top = 0; /* stack[0..top) */
    for (int64_t i = 0; i < n; i++) {
        if (i && tid[i] != tid[i - 1]) {
            if (tid[i] < tid[i - 1]) goto declined;
            top = 0; /* the next thread */
        } else if (i && (start[i] < start[i - 1] ||
                         (start[i] == start[i - 1] && end[i] > end[i - 1])))
            goto declined;
        while (top && end[stack[top - 1]] < end[i]) top--;
        out[i] = top ? stack[top - 1] : -1;
        stack[top++] = i;
    }
    static const char *const names[1] = {"parent"};
    int64_t *cols[1] = {out};
    out = NULL;
    result = export_i64_table(names, cols, 1, n);
    goto done;
declined: /* a null, or not in the order the stack needs: the caller's join decides */
    Py_INCREF(Py_None);
    result = Py_None;
done:
    free(out);
    free(stack);
    for (int i = 0; i < 3; i++) vec_free(&v[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", kreplay_replay, METH_VARARGS,
     "replay(host, gpu, order, node_order, main_tid, blocking, max_rounds, neg_ns, converged_ns,\n"
     "       warm=True) -> (host_times, gpu_times, rounds, converged) | None\n\n"
     "The step model's replay loop (causal/graph.py) on int64 Arrow streams: host columns in\n"
     "chain order (tid gap dur anchor wait own queue follows orig_end start), GPU columns\n"
     "(chain gap dur anchor launch offset end launch_key), the GPU rows in launch order (the\n"
     "launch keys sorted by it), the chain->node\n"
     "order (or None). Times come as Arrow struct arrays (start, end); None where a null is.\n"
     "warm: the rounds start from one sweep in trace order (blocking models), not the trace."},
    {"step_times", kreplay_step_times, METH_VARARGS,
     "step_times(steps, host, gpu, tid) -> dur_ns table | None\n\n"
     "causal/graph.py's step_times_ns: steps (host_start host_end, by start), host calls (tid\n"
     "end_ns replayed_end), GPU ops (launched launch_key_ns replayed_end), the step thread (or\n"
     "None): each step's duration as an Arrow struct array (dur_ns); None where a null is."},
    {"parents", kreplay_parents, METH_VARARGS,
     "parents((tid, start, end)) -> parent table | None\n\n"
     "For rows in (tid, start ascending, end descending) order, each row's parent: the index of\n"
     "the last row before it on its thread whose [start, end] holds it, -1 if none (an Arrow\n"
     "struct array, parent); None where a null is or the rows are not in that order."},
    {"overlap", kreplay_overlap, METH_VARARGS,
     "overlap((starts, ends), (union_starts, union_ends)) -> overlap_ns table | None\n\n"
     "model/intervals.py's overlap_with: for each interval [starts, ends) the length of it the\n"
     "union (sorted, disjoint) covers, as an Arrow struct array (overlap_ns); None where a\n"
     "null is."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kreplay",
                                    "The step model's replay loop (see kreplay.c).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kreplay(void) { return PyModule_Create(&module); }
