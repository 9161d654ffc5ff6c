/* A span of Kineto's events array -> Arrow columns, in one pass over the bytes.
 *
 * Why native: the typed msgspec decode plus building columns from its structs costs ~46 ms
 * of CPU per 8 MiB chunk, two thirds of it in the interpreter (benchmarks/RESULTS.md); this
 * scanner validates the JSON and writes the same columns directly, with the GIL released.
 *
 * It is a fast path only.  Whatever it is not sure to read exactly as the msgspec decoder
 * (decode.py) would, it declines (returns None): a number where a string is expected, a float
 * id, an escaped key, a duplicate key, deep nesting, invalid UTF-8, anything outside strict
 * JSON.  The caller then takes the msgspec path, which has the last word on every input.
 *
 * Output (see decode.py, ``native_chunk``): (n_other, frame, kernel_side, op_side, memory),
 * each table an object with ``__arrow_c_array__`` (the Arrow PyCapsule interface) holding a
 * struct array; the buffers are malloc'ed here and freed by the consumer's release call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_columns.h"

/* ---- JSON scanning ---------------------------------------------------------------- */

#define MAX_DEPTH 64 /* deeper values decline: msgspec and the repair path decide about them */

typedef struct {
    const char *s, *e; /* the value's text [s, e) */
    char t;            /* 's' string, 'n' number, 'N' null, 'b' bool, '{' object, '[' array; 0 absent */
    char esc;          /* a string holding escapes */
    /* a number, read while it was validated: its first 19 digits as an integer, how many
     * digits, how many after the point (-1: no point), an exponent, a minus sign */
    char expo, neg;
    int digits, frac;
    uint64_t m;
} span_t;

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static inline const char *skip_ws(const char *p, const char *end) {
    if (p < end && (unsigned char)*p > ' ') return p; /* the usual case: no blank at all */
    while (p < end && is_ws((unsigned char)*p)) p++;
    return p;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const char *p, const char *end, unsigned *out) {
    if (end - p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval((unsigned char)p[i]);
        if (h < 0) return -1;
        v = (v << 4) | (unsigned)h;
    }
    *out = v;
    return 0;
}

/* A string starting after its opening quote: validated; returns the position after the
 * closing quote, NULL if invalid. *esc is set when it holds escapes. */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The first byte of [p, end) that is '"', '\\', a control character or not ASCII, or a
 * position near end from which the caller goes byte by byte. */
static inline const char *plain_run(const char *p, const char *end) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        /* signed compare: below 0x20, or 0x80 and up (negative) */
        __m128i sp = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                  _mm_cmplt_epi8(x, space));
        int m = _mm_movemask_epi8(sp);
        if (m) return p + __builtin_ctz((unsigned)m);
        p += 16;
    }
#else
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    while (end - p >= 8) { /* SWAR: false positives only after a true one */
        uint64_t x, q, b;
        memcpy(&x, p, 8);
        q = x ^ (ones * '"');
        b = x ^ (ones * '\\');
        uint64_t m = (((q - ones) & ~q) | ((b - ones) & ~b) | (x - ones * 0x20) | x) & high;
        if (m) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            return p + (__builtin_ctzll(m) >> 3);
#else
            return p;
#endif
        }
        p += 8;
    }
#endif
    return p;
}

static const char *scan_string(const char *p, const char *end, char *esc) {
    *esc = 0;
    while (p < end) {
        p = plain_run(p, end);
        if (p >= end) break;
        unsigned char c = (unsigned char)*p;
        if (c == '"') return p + 1;
        if (c < 0x20) return NULL;
        if (c == '\\') {
            *esc = 1;
            if (end - p < 2) return NULL;
            char n = p[1];
            if (n == 'u') {
                unsigned u;
                if (hex4(p + 2, end, &u)) return NULL;
                p += 6;
                if (u >= 0xD800 && u <= 0xDBFF) { /* a high surrogate needs its low half */
                    unsigned lo;
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return NULL;
                    p += 6;
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    return NULL;
                }
                continue;
            }
            if (n != '"' && n != '\\' && n != '/' && n != 'b' && n != 'f' && n != 'n' && n != 'r' &&
                n != 't')
                return NULL;
            p += 2;
            continue;
        }
        if (c >= 0x80) {
            int k = utf8_len((const unsigned char *)p, (const unsigned char *)end);
            if (!k) return NULL;
            p += k;
            continue;
        }
        p++;
    }
    return NULL;
}

/* The decoded bytes of a validated string's body [s, e) (without quotes), appended. */
static int unescape_into(buf_t *b, const char *s, const char *e) {
    if (buf_reserve(b, (size_t)(e - s))) return -1; /* decoded text is never longer */
    char *o = b->p + b->len;
    while (s < e) {
        if (*s != '\\') {
            *o++ = *s++;
            continue;
        }
        char n = s[1];
        if (n != 'u') {
            char r = n;
            switch (n) {
                case 'b': r = '\b'; break;
                case 'f': r = '\f'; break;
                case 'n': r = '\n'; break;
                case 'r': r = '\r'; break;
                case 't': r = '\t'; break;
                default: break;
            }
            *o++ = r;
            s += 2;
            continue;
        }
        unsigned u;
        hex4(s + 2, e, &u);
        s += 6;
        if (u >= 0xD800 && u <= 0xDBFF) {
            unsigned lo;
            hex4(s + 2, e, &lo);
            s += 6;
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (u < 0x80) {
            *o++ = (char)u;
        } else if (u < 0x800) {
            *o++ = (char)(0xC0 | (u >> 6));
            *o++ = (char)(0x80 | (u & 0x3F));
        } else if (u < 0x10000) {
            *o++ = (char)(0xE0 | (u >> 12));
            *o++ = (char)(0x80 | ((u >> 6) & 0x3F));
            *o++ = (char)(0x80 | (u & 0x3F));
        } else {
            *o++ = (char)(0xF0 | (u >> 18));
            *o++ = (char)(0x80 | ((u >> 12) & 0x3F));
            *o++ = (char)(0x80 | ((u >> 6) & 0x3F));
            *o++ = (char)(0x80 | (u & 0x3F));
        }
    }
    b->len = (size_t)(o - b->p);
    return 0;
}

/* A number per JSON's grammar; returns the position after it, NULL if not one. */
static const char *scan_number(const char *p, const char *end, span_t *sp) {
    uint64_t m = 0;
    int digits = 0;
    sp->neg = p < end && *p == '-';
    p += sp->neg;
    sp->frac = -1;
    sp->expo = 0;
    if (p >= end) return NULL;
    if (*p == '0') {
        p++;
        digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        for (; p < end && (unsigned)(*p - '0') <= 9; p++, digits++)
            if (digits < 19) m = m * 10 + (unsigned)(*p - '0');
    } else {
        return NULL;
    }
    if (p < end && *p == '.') {
        p++;
        const char *f = p;
        for (; p < end && (unsigned)(*p - '0') <= 9; p++, digits++)
            if (digits < 19) m = m * 10 + (unsigned)(*p - '0');
        if (p == f) return NULL;
        sp->frac = (int)(p - f);
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') p++;
        sp->expo = 1;
    }
    sp->m = m;
    sp->digits = digits;
    return p;
}

static int lit(const char *p, const char *end, const char *w, size_t n) {
    return (size_t)(end - p) >= n && memcmp(p, w, n) == 0;
}

/* Any JSON value at p (no leading blanks): validated, without recursion; fills *sp. */
static const char *skip_value(const char *p, const char *end, span_t *sp) {
    char stack[MAX_DEPTH];
    int depth = 0;
    const char *start = p;
    char esc = 0;
    if (p >= end) return NULL;
    sp->esc = 0;
    switch (*p) {
        case '"':
            p = scan_string(p + 1, end, &esc);
            if (!p) return NULL;
            sp->t = 's';
            sp->esc = esc;
            goto done;
        case 'n':
            if (!lit(p, end, "null", 4)) return NULL;
            p += 4;
            sp->t = 'N';
            goto done;
        case 't':
            if (!lit(p, end, "true", 4)) return NULL;
            p += 4;
            sp->t = 'b';
            goto done;
        case 'f':
            if (!lit(p, end, "false", 5)) return NULL;
            p += 5;
            sp->t = 'b';
            goto done;
        case '{':
        case '[':
            sp->t = *p;
            break;
        default:
            p = scan_number(p, end, sp);
            if (!p) return NULL;
            sp->t = 'n';
            goto done;
    }
    /* containers: expect a value (or key) after an opener or comma, a comma or closer after */
    stack[depth++] = *p++;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        char top = stack[depth - 1];
        if (*p == (top == '{' ? '}' : ']')) { /* empty container */
            p++;
            goto closed;
        }
        for (;;) { /* elements of the container on top */
            if (top == '{') {
                if (*p != '"') return NULL;
                p = scan_string(p + 1, end, &esc);
                if (!p) return NULL;
                p = skip_ws(p, end);
                if (p >= end || *p != ':') return NULL;
                p = skip_ws(p + 1, end);
                if (p >= end) return NULL;
            }
            if (*p == '{' || *p == '[') {
                if (depth >= MAX_DEPTH) return NULL;
                stack[depth++] = *p++;
                goto opened;
            }
            span_t inner;
            p = skip_value(p, end, &inner); /* a scalar: no recursion beyond one level */
            if (!p) return NULL;
        after_element:
            p = skip_ws(p, end);
            if (p >= end) return NULL;
            if (*p == ',') {
                p = skip_ws(p + 1, end);
                if (p >= end) return NULL;
                continue;
            }
            if (*p == (top == '{' ? '}' : ']')) {
                p++;
                goto closed;
            }
            return NULL;
        closed:
            depth--;
            if (depth == 0) goto done;
            top = stack[depth - 1];
            goto after_element;
        }
    opened:;
    }
done:
    sp->s = start;
    sp->e = p;
    return p;
}

/* ---- values ------------------------------------------------------------------------ */

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* An integer token (no fraction or exponent) within int64: 0 and *out, else -1. */
/* An integer's text [-]digits within int64: 0 and *out, else -1. */
static int parse_int_text(const char *p, const char *e, int64_t *out) {
    int neg = 0;
    if (p < e && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= e || e - p > 19) return -1;
    uint64_t m = 0;
    for (const char *q = p; q < e; q++) {
        unsigned d = (unsigned)(*q - '0');
        if (d > 9) return -1;
        m = m * 10 + d; /* 19 digits fit in 64 bits unsigned */
    }
    if (neg) {
        if (m > (uint64_t)INT64_MAX + 1) return -1;
        *out = (int64_t)(0 - m);
    } else {
        if (m > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)m;
    }
    return 0;
}

/* A number token that is an integer (no point, no exponent) within int64. */
static inline int parse_int(const span_t *v, int64_t *out) {
    if (v->expo || v->frac >= 0) return -1;
    if (v->digits <= 18) {
        *out = v->neg ? -(int64_t)v->m : (int64_t)v->m;
        return 0;
    }
    return parse_int_text(v->s, v->e, out);
}

static int parse_double(const span_t *v, double *out, int exact_int) {
    if (!v->expo && v->frac < 0) { /* an integer: msgspec's int, converted as polars casts it */
        int64_t i;
        if (parse_int(v, &i)) return -1; /* beyond int64 */
        if (exact_int && (i > (1LL << 53) || i < -(1LL << 53))) return -1;
        *out = (double)i;
        return 0;
    }
    /* digits.digits with a mantissa up to 2^53 and at most 22 decimals: one correctly rounded
     * division of two exact doubles. Trailing zeros of the fraction go first (the same number):
     * Python's json.dump writes whole floats as "1669783687389245.0", 17 digits */
    uint64_t m = v->m;
    int frac = v->frac, digits = v->digits;
    if (!v->expo && digits <= 19) /* m holds every digit */
        while (frac > 0 && m % 10 == 0) {
            m /= 10;
            frac--;
            digits--;
        }
    if (!v->expo && digits <= 17 && m <= (1ULL << 53) && frac <= 22) {
        double d = (double)m / POW10[frac];
        *out = v->neg ? -d : d;
        return 0;
    }
    char tmp[64];
    size_t n = (size_t)(v->e - v->s);
    if (n >= sizeof tmp) return -1;
    memcpy(tmp, v->s, n);
    tmp[n] = 0;
    char *stop;
    errno = 0;
    double d = strtod(tmp, &stop); /* glibc: correctly rounded; JSON's '.' in the C locale */
    if (errno || stop != tmp + n || !isfinite(d)) return -1;
    *out = d;
    return 0;
}

#define TRY(x)                   \
    do {                         \
        int r_ = (x);            \
        if (r_) return r_;       \
    } while (0)

/* Column writers by the value's JSON type; -2 means decline. */
static int put_int(col_t *c, const span_t *v) {
    if (v->t == 0 || v->t == 'N') return col_i64(c, 0, 0);
    int64_t x;
    if (v->t != 'n' || parse_int(v, &x)) return -2;
    return col_i64(c, x, 1);
}

/* A pid or tid: an integer, or a string's trailing integer ("stream 7" -> 7, as decode.py's
 * _to_int_ids extracts with (-?\d+)\s*$), null where it has none or it overflows. */
static int put_id(col_t *c, const span_t *v) {
    if (v->t != 's') return put_int(c, v);
    if (v->esc) return -2;
    const char *s = v->s + 1, *e = v->e - 1;
    for (const char *q = s; q < e; q++)
        if ((unsigned char)*q >= 0x80) return -2; /* Unicode digits and blanks: polars decides */
    while (e > s && e[-1] == ' ') e--; /* raw tabs and newlines are not valid JSON strings */
    const char *d = e;
    while (d > s && d[-1] >= '0' && d[-1] <= '9') d--;
    if (d == e) return col_i64(c, 0, 0);
    if (d > s && d[-1] == '-') d--;
    int64_t x;
    return parse_int_text(d, e, &x) ? col_i64(c, 0, 0) : col_i64(c, x, 1);
}

static int put_num(col_t *c, const span_t *v, int exact_int) {
    if (v->t == 0 || v->t == 'N') return col_f64(c, 0, 0);
    double x;
    if (v->t != 'n' || parse_double(v, &x, exact_int)) return -2;
    return col_f64(c, x, 1);
}

static int put_str(col_t *c, const span_t *v) {
    if (v->t == 0 || v->t == 'N') return col_str_end(c, 0);
    if (v->t != 's') return -2;
    if (v->esc) {
        if (unescape_into(&c->data, v->s + 1, v->e - 1)) return -1;
    } else {
        size_t n = (size_t)(v->e - v->s - 2);
        if (buf_reserve(&c->data, n)) return -1;
        memcpy(c->data.p + c->data.len, v->s + 1, n);
        c->data.len += n;
    }
    return col_str_end(c, 1);
}

/* A launch grid or block: [x, y, z] integers into three columns (c[0..2]); null or absent:
 * nulls; any other shape declines (decode.py's _xyz decides what it makes of it). */
static int put_xyz(col_t *c, const span_t *v) {
    if (v->t == 0 || v->t == 'N') {
        for (int i = 0; i < 3; i++) TRY(col_i64(&c[i], 0, 0));
        return 0;
    }
    if (v->t != '[') return -2;
    int64_t xyz[3];
    const char *p = v->s + 1, *end = v->e;
    for (int i = 0; i < 3; i++) {
        span_t n;
        p = skip_ws(p, end);
        const char *q = p < end ? scan_number(p, end, &n) : NULL;
        if (!q) return -2;
        n.s = p;
        n.e = q;
        if (parse_int(&n, &xyz[i])) return -2;
        p = skip_ws(q, end);
        if (p >= end || *p != (i < 2 ? ',' : ']')) return -2;
        p++;
    }
    for (int i = 0; i < 3; i++) TRY(col_i64(&c[i], xyz[i], 1));
    return 0;
}

static int put_raw(col_t *c, const span_t *v) { /* any JSON value, as its text */
    if (v->t == 0) return col_str_end(c, 0);
    size_t n = (size_t)(v->e - v->s);
    if (buf_reserve(&c->data, n)) return -1;
    memcpy(c->data.p + c->data.len, v->s, n);
    c->data.len += n;
    return col_str_end(c, 1);
}

/* ---- keys -------------------------------------------------------------------------- */

enum { T_PH, T_CAT, T_NAME, T_PID, T_TID, T_TS, T_DUR, T_ARGS, T_N };

enum {
    A_DEVICE, A_STREAM, A_CORR, A_EXT, A_EXT_LOWER, A_BYTES, A_DIMS, A_TYPES, A_CONCRETE,
    A_FLOPS, A_GRID, A_BLOCK, A_REGS, A_SHMEM, A_OCC, A_BPSM, A_WPSM, A_COLL, A_NELEMS,
    A_MSGDTYPE, A_GROUP,
    M_BYTES, M_ALLOC, M_RES, M_ADDR, M_DTYPE, M_DID, A_N
};

static const char *TOP_KEYS[T_N] = {"ph", "cat", "name", "pid", "tid", "ts", "dur", "args"};
static const char *ARG_KEYS[A_N] = {
    "device", "stream", "correlation", "External id", "external id", "bytes", "Input Dims",
    "Input type", "Concrete Inputs", "flops", "grid", "block", "registers per thread",
    "shared memory", "est. achieved occupancy %", "blocks per SM", "warps per SM",
    "Collective name", "In msg nelems", "dtype", "Group size", "Bytes", "Total Allocated", "Total Reserved", "Addr", "Device Type",
    "Device Id"};

static size_t TOP_LENS[T_N], ARG_LENS[A_N];

/* Known keys by a hash of length, first and last byte: most members are rejected with one
 * table read. Two slots per bucket; PyInit checks that none overflows. */
#define KEY_BUCKETS 256
typedef struct {
    signed char idx[2];
} bucket_t;
static bucket_t TOP_TABLE[KEY_BUCKETS], ARG_TABLE[KEY_BUCKETS];

static inline unsigned key_hash(const char *s, size_t len) {
    return ((unsigned)len * 37u + (unsigned char)s[0] * 5u + (unsigned char)s[len - 1]) &
           (KEY_BUCKETS - 1);
}

static int table_build(bucket_t *table, const char **keys, size_t *lens, int n) {
    for (int b = 0; b < KEY_BUCKETS; b++) table[b].idx[0] = table[b].idx[1] = -1;
    for (int i = 0; i < n; i++) {
        lens[i] = strlen(keys[i]);
        bucket_t *b = &table[key_hash(keys[i], lens[i])];
        if (b->idx[0] < 0)
            b->idx[0] = (signed char)i;
        else if (b->idx[1] < 0)
            b->idx[1] = (signed char)i;
        else
            return -1;
    }
    return 0;
}

static inline int key_index(const bucket_t *table, const char **keys, const size_t *lens,
                            const char *s, size_t len) {
    if (len == 0) return -1;
    const bucket_t *b = &table[key_hash(s, len)];
    for (int j = 0; j < 2; j++) {
        int i = b->idx[j];
        if (i >= 0 && lens[i] == len) {
            const char *k = keys[i];
            size_t j = 0;
            while (j < len && k[j] == s[j]) j++; /* keys are short: no call to memcmp */
            if (j == len) return i;
        }
    }
    return -1;
}

/* The members of an object at p ('{'): known keys' values into slots. Returns the position
 * after it; NULL if invalid JSON; *decline for what the fast path leaves to msgspec. With
 * args_slots, the value of "args" (an object) is read one level further into them. */
static const char *read_object(const char *p, const char *end, const bucket_t *table,
                               const char **keys, const size_t *lens, span_t *slots,
                               uint32_t *set, span_t *args_slots, uint32_t *args_set,
                               int *decline) {
    p = skip_ws(p + 1, end);
    if (p >= end) return NULL;
    if (*p == '}') return p + 1;
    for (;;) {
        if (*p != '"') return NULL;
        const char *ks = p + 1;
        char esc;
        p = scan_string(ks, end, &esc);
        if (!p) return NULL;
        if (esc) { /* an escaped key might spell a known one */
            *decline = 1;
            return NULL;
        }
        int k = key_index(table, keys, lens, ks, (size_t)(p - 1 - ks));
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return NULL;
        p = skip_ws(p + 1, end);
        if (p >= end) return NULL;
        if (k >= 0 && slots[k].t) { /* a duplicate key: msgspec's choice, not guessed here */
            *decline = 1;
            return NULL;
        }
        if (k == T_ARGS && args_slots && *p == '{') {
            const char *s = p;
            p = read_object(p, end, ARG_TABLE, ARG_KEYS, ARG_LENS, args_slots, args_set, NULL, NULL,
                            decline);
            if (!p) return NULL;
            slots[k].t = '{';
            slots[k].s = s;
            slots[k].e = p;
            slots[k].esc = 0;
            *set |= 1u << k;
        } else if (k >= 0) {
            p = skip_value(p, end, &slots[k]);
            if (!p) return NULL;
            *set |= 1u << k;
        } else {
            span_t v;
            p = skip_value(p, end, &v);
            if (!p) return NULL;
        }
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        if (*p == '}') return p + 1;
        if (*p != ',') return NULL;
        p = skip_ws(p + 1, end);
        if (p >= end) return NULL;
    }
}

/* ---- tables ------------------------------------------------------------------------ */

enum { F_CAT, F_NAME, F_TS, F_DUR, F_PID, F_TID, F_DEVICE, F_STREAM, F_CORR, F_EXT, F_BYTES, F_N };
enum {
    KS_ROW, KS_GRID_X, KS_GRID_Y, KS_GRID_Z, KS_BLOCK_X, KS_BLOCK_Y, KS_BLOCK_Z, KS_REGS, KS_SHMEM,
    KS_OCC, KS_BPSM, KS_WPSM, KS_COLL, KS_NELEMS, KS_MSGDTYPE, KS_GROUP, KS_N
};
enum { OS_ROW, OS_DIMS, OS_TYPES, OS_CONCRETE, OS_FLOPS, OS_NELEMS, OS_MSGDTYPE, OS_GROUP, OS_N };
enum { MM_TS, MM_PID, MM_TID, MM_BYTES, MM_ALLOC, MM_RES, MM_ADDR, MM_DTYPE, MM_DID, MM_N };

typedef struct {
    col_t *cols;
    int n;
} table_t;

typedef struct {
    col_t f[F_N], ks[KS_N], os[OS_N], mm[MM_N];
    int64_t n_other;
} out_t;

static int out_init(out_t *o) {
    static const struct { int k; const char *n; } F[F_N] = {
        {K_STR, "cat"},      {K_STR, "name"},     {K_F64, "ts"},          {K_F64, "dur"},
        {K_I64, "pid"},      {K_I64, "tid"},      {K_I64, "a_device"},    {K_I64, "a_stream"},
        {K_I64, "correlation"}, {K_I64, "external_id"}, {K_I64, "bytes"}};
    static const struct { int k; const char *n; } KS[KS_N] = {
        {K_I64, "row"}, {K_I64, "grid_x"}, {K_I64, "grid_y"}, {K_I64, "grid_z"},
        {K_I64, "block_x"}, {K_I64, "block_y"}, {K_I64, "block_z"}, {K_F64, "registers_per_thread"},
        {K_F64, "shared_memory_bytes"}, {K_F64, "occupancy_pct"}, {K_F64, "blocks_per_sm"},
        {K_F64, "warps_per_sm"}, {K_STR, "collective"}, {K_F64, "msg_nelems"},
        {K_STR, "msg_dtype"}, {K_F64, "group_size"}};
    static const struct { int k; const char *n; } OS[OS_N] = {
        {K_I64, "row"}, {K_STR, "input_dims"}, {K_STR, "input_types"},
        {K_STR, "concrete_inputs"}, {K_F64, "flops"}, {K_F64, "msg_nelems"},
        {K_STR, "msg_dtype"}, {K_F64, "group_size"}};
    static const struct { int k; const char *n; } MM[MM_N] = {
        {K_F64, "ts"}, {K_I64, "pid"}, {K_I64, "tid"}, {K_I64, "mem_bytes"},
        {K_I64, "mem_allocated_bytes"}, {K_I64, "mem_reserved_bytes"}, {K_I64, "mem_addr"},
        {K_I64, "mem_device_type"}, {K_I64, "mem_device_id"}};
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < F_N; i++)
        if (col_init(&o->f[i], F[i].k, F[i].n)) return -1;
    for (int i = 0; i < KS_N; i++)
        if (col_init(&o->ks[i], KS[i].k, KS[i].n)) return -1;
    for (int i = 0; i < OS_N; i++)
        if (col_init(&o->os[i], OS[i].k, OS[i].n)) return -1;
    for (int i = 0; i < MM_N; i++)
        if (col_init(&o->mm[i], MM[i].k, MM[i].n)) return -1;
    return 0;
}

static void out_free(out_t *o) {
    for (int i = 0; i < F_N; i++) col_free(&o->f[i]);
    for (int i = 0; i < KS_N; i++) col_free(&o->ks[i]);
    for (int i = 0; i < OS_N; i++) col_free(&o->os[i]);
    for (int i = 0; i < MM_N; i++) col_free(&o->mm[i]);
}

static int span_is(const span_t *v, const char *text) { /* an unescaped string equal to text */
    size_t n = strlen(text);
    return v->t == 's' && !v->esc && (size_t)(v->e - v->s) == n + 2 && memcmp(v->s + 1, text, n) == 0;
}


/* A collective's message (three adjacent columns: elements, dtype, group size); a value of
 * another type is null, as the typed path leaves it. */
static int put_msg(col_t *c, const span_t *nelems, const span_t *dtype, const span_t *group) {
    static const span_t none = {0};
    TRY(put_num(&c[0], nelems->t == 'n' ? nelems : &none, 1));
    TRY(put_str(&c[1], dtype->t == 's' ? dtype : &none));
    return put_num(&c[2], group->t == 'n' ? group : &none, 1);
}


static int emit_x(out_t *o, const span_t *t, const span_t *a) {
    int64_t row = o->f[F_CAT].n;
    if (t[T_CAT].t == 's' && t[T_CAT].esc) return -2; /* it might spell kernel or cpu_op */
    TRY(put_str(&o->f[F_CAT], &t[T_CAT]));
    TRY(put_str(&o->f[F_NAME], &t[T_NAME]));
    TRY(put_num(&o->f[F_TS], &t[T_TS], 0));
    TRY(put_num(&o->f[F_DUR], &t[T_DUR], 0));
    TRY(put_id(&o->f[F_PID], &t[T_PID]));
    TRY(put_id(&o->f[F_TID], &t[T_TID]));
    TRY(put_int(&o->f[F_DEVICE], &a[A_DEVICE]));
    TRY(put_int(&o->f[F_STREAM], &a[A_STREAM]));
    TRY(put_int(&o->f[F_CORR], &a[A_CORR]));
    /* "External id", else the lower-case spelling of some eras */
    TRY(put_int(&o->f[F_EXT], (a[A_EXT].t && a[A_EXT].t != 'N') ? &a[A_EXT] : &a[A_EXT_LOWER]));
    TRY(put_int(&o->f[F_BYTES], &a[A_BYTES]));
    /* side rows: kernels with a launch grid, host ops with shapes or FLOPs */
    if (a[A_GRID].t && span_is(&t[T_CAT], "kernel")) {
        TRY(col_i64(&o->ks[KS_ROW], row, 1));
        TRY(put_xyz(&o->ks[KS_GRID_X], &a[A_GRID]));
        TRY(put_xyz(&o->ks[KS_BLOCK_X], &a[A_BLOCK]));
        TRY(put_num(&o->ks[KS_REGS], &a[A_REGS], 1));
        TRY(put_num(&o->ks[KS_SHMEM], &a[A_SHMEM], 1));
        TRY(put_num(&o->ks[KS_OCC], &a[A_OCC], 1));
        TRY(put_num(&o->ks[KS_BPSM], &a[A_BPSM], 1));
        TRY(put_num(&o->ks[KS_WPSM], &a[A_WPSM], 1));
        TRY(put_str(&o->ks[KS_COLL], &a[A_COLL]));
        TRY(put_msg(&o->ks[KS_NELEMS], &a[A_NELEMS], &a[A_MSGDTYPE], &a[A_GROUP]));
    }
    /* host ops with shapes, FLOPs or a collective's message (record_param_comms) */
    if ((a[A_DIMS].t || (a[A_FLOPS].t && a[A_FLOPS].t != 'N') || (a[A_NELEMS].t == 'n')) &&
        span_is(&t[T_CAT], "cpu_op")) {
        TRY(col_i64(&o->os[OS_ROW], row, 1));
        TRY(put_raw(&o->os[OS_DIMS], &a[A_DIMS]));
        TRY(put_raw(&o->os[OS_TYPES], &a[A_TYPES]));
        TRY(put_raw(&o->os[OS_CONCRETE], &a[A_CONCRETE]));
        TRY(put_num(&o->os[OS_FLOPS], &a[A_FLOPS], 1));
        TRY(put_msg(&o->os[OS_NELEMS], &a[A_NELEMS], &a[A_MSGDTYPE], &a[A_GROUP]));
    }
    return 0;
}

static int emit_memory(out_t *o, const span_t *t, const span_t *a) {
    TRY(put_num(&o->mm[MM_TS], &t[T_TS], 0));
    TRY(put_id(&o->mm[MM_PID], &t[T_PID]));
    TRY(put_id(&o->mm[MM_TID], &t[T_TID]));
    TRY(put_int(&o->mm[MM_BYTES], &a[M_BYTES]));
    TRY(put_int(&o->mm[MM_ALLOC], &a[M_ALLOC]));
    TRY(put_int(&o->mm[MM_RES], &a[M_RES]));
    TRY(put_int(&o->mm[MM_ADDR], &a[M_ADDR]));
    TRY(put_int(&o->mm[MM_DTYPE], &a[M_DTYPE]));
    TRY(put_int(&o->mm[MM_DID], &a[M_DID]));
    return 0;
}

/* The phases decode.py's union knows; any other fails msgspec's validation. */
static const char PHASES[] = "XiBEICbnestfPONDMVvRc()";

/* where the last scan of this thread declined: the offset of the event (for tests and
 * for finding out what a trace holds that the fast path leaves to msgspec) */
static _Thread_local Py_ssize_t declined_at = -1;

static int scan_events(const char *p, const char *end, out_t *o, const char **at);

static int scan(const char *p, const char *end, out_t *o) {
    const char *at = p;
    int rc = scan_events(p, end, o, &at);
    declined_at = rc == -2 ? (Py_ssize_t)(at - p) : -1;
    return rc;
}

/* 0: done; -1: out of memory; -2: decline. A partially written table is discarded then. */
static int scan_events(const char *p, const char *end, out_t *o, const char **at) {
    p = skip_ws(p, end);
    if (p >= end) return 0;
    span_t t[T_N], a[A_N];
    memset(t, 0, sizeof t);
    memset(a, 0, sizeof a);
    uint32_t tset = 0, aset = 0; /* the slots the last event filled: cleared for the next */
    for (;;) {
        *at = p;
        if (*p != '{') return -2;
        for (; tset; tset &= tset - 1) t[__builtin_ctz(tset)].t = 0;
        for (; aset; aset &= aset - 1) a[__builtin_ctz(aset)].t = 0;
        int decline = 0;
        p = read_object(p, end, TOP_TABLE, TOP_KEYS, TOP_LENS, t, &tset, a, &aset, &decline);
        if (!p) return -2;
        const span_t *ph = &t[T_PH];
        if (ph->t != 's' || ph->esc || ph->e - ph->s != 3 || !memchr(PHASES, ph->s[1], sizeof PHASES - 1))
            return -2;
        char phase = ph->s[1];
        const span_t *args = &t[T_ARGS];
        if (phase == 'X') {
            if (args->t && args->t != 'N' && args->t != '{') return -2;
            TRY(emit_x(o, t, a));
        } else if (phase == 'i' && t[T_NAME].t == 's' && t[T_NAME].esc) {
            return -2; /* an escaped name might spell [memory] */
        } else if (phase == 'i' && args->t && span_is(&t[T_NAME], "[memory]")) {
            if (args->t != '{') return -2;
            TRY(emit_memory(o, t, a));
        } else {
            o->n_other++;
        }
        p = skip_ws(p, end);
        if (p >= end) return 0;
        if (*p != ',') return -2;
        p = skip_ws(p + 1, end);
        if (p >= end) return -2; /* a trailing comma */
    }
}

static PyObject *kscan_scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    out_t o;
    int rc;
    size_t rows = (size_t)view.len / 128 + 16;
    int bad = out_init(&o) || col_presize(&o.f[F_CAT], rows, rows * 16) ||
              col_presize(&o.f[F_NAME], rows, (size_t)view.len / 3 + 64);
    for (int i = F_TS; i < F_N && !bad; i++) bad = col_presize(&o.f[i], rows, 0);
    if (bad) {
        out_free(&o);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    rc = scan((const char *)view.buf, (const char *)view.buf + view.len, &o);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc) {
        out_free(&o);
        if (rc == -1) return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
    PyObject *f = export_table(o.f, F_N, o.f[0].n);
    PyObject *ks = f ? export_table(o.ks, KS_N, o.ks[0].n) : NULL;
    PyObject *os = ks ? export_table(o.os, OS_N, o.os[0].n) : NULL;
    PyObject *mm = os ? export_table(o.mm, MM_N, o.mm[0].n) : NULL;
    out_free(&o);
    if (!mm) {
        Py_XDECREF(f);
        Py_XDECREF(ks);
        Py_XDECREF(os);
        return NULL;
    }
    return Py_BuildValue("(LNNNN)", (long long)o.n_other, f, ks, os, mm);
}

static PyObject *kscan_declined_at(PyObject *self, PyObject *noarg) {
    (void)self;
    (void)noarg;
    return PyLong_FromSsize_t(declined_at);
}

static PyObject *kscan_trim(PyObject *self, PyObject *noarg) {
    (void)self;
    (void)noarg;
#if defined(__GLIBC__)
    /* the columns polars released were malloc'ed in the decoding threads' arenas, which keep
     * freed blocks: give their pages back */
    Py_BEGIN_ALLOW_THREADS
    malloc_trim(0);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"trim", kscan_trim, METH_NOARGS,
     "trim() -> None\n\nReturn freed heap memory to the system (glibc's malloc_trim)."},
    {"declined_at", kscan_declined_at, METH_NOARGS,
     "declined_at() -> int\n\nThe offset of the event where this thread's last scan declined, -1 if none."},
    {"scan", kscan_scan, METH_O,
     "scan(elements) -> (n_other, frame, kernel_side, op_side, memory) | None\n\n"
     "The elements of a Kineto events array (without its brackets) as Arrow struct arrays,\n"
     "each a (schema, array) pair of PyCapsules; None where the msgspec path must decide."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kscan",
                                    "Native scanner of Kineto event spans (see kscan.c).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kscan(void) {
    if (table_build(TOP_TABLE, TOP_KEYS, TOP_LENS, T_N) ||
        table_build(ARG_TABLE, ARG_KEYS, ARG_LENS, A_N)) {
        PyErr_SetString(PyExc_ImportError, "_kscan: key table collision");
        return NULL;
    }
    return PyModule_Create(&module);
}
