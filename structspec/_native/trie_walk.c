/*
 * trie_walk: vocabulary walks of a token trie through a terminal DFA, depth first.
 *
 * Twins (NumPy/Python, structspec/automata/grammar.py; tests/test_native_walk.py checks
 * that both give the same sets):
 *   walk    <->  _walk_levels    which tokens stay inside, where the terminal may end
 *   finish  <->  _finish_walk    mask words, crossing candidates, distinct remainders
 *
 * The trie is stored in depth-first order, one row of ``nodes`` (int32 [N, 6]) per node:
 *   NODE_BYTE   the node's last byte (0..255)
 *   NODE_DEPTH  its depth (1 for a first byte)
 *   NODE_END    one past the last node of its subtree (the next node not below it)
 *   NODE_LO     the first token row below it (tokens are sorted by bytes, so a prefix's
 *               tokens are the rows [lo, hi))
 *   NODE_HI     one past the last token row below it
 *   NODE_TOK    the row of the token spelling exactly this prefix (then it is lo), or -1
 *   NODE_DEEP   the length of the longest token below it (at least its depth)
 * and ``below`` (uint64 [N, 4]) is the set of bytes occurring anywhere below each node.
 *
 * Shortcut ("chains"): where every byte below a node sends its state s_0 to one same
 * state s_1, every byte below sends s_1 to one same s_2, and so on, every token m bytes
 * below the node ends in s_m, so the walk takes its rows at once (those whose s_m is
 * alive) instead of visiting the subtree; it does so when no s_j is accepting (no token
 * below can end the terminal midway). Per state, ``major`` is the most common live target
 * and ``dies`` the bytes to 0: a set of bytes moves s as one when it lies within the bytes
 * to ``major`` or within ``dies``. Inside a JSON string s_j = s (the plain characters loop),
 * inside a string with a length bound s_j counts characters: either way a fresh string walk
 * visits a few thousand nodes (tokens with quotes, backslashes, control or non-ASCII
 * bytes), not 100,000. Chains are tried within a budget proportional to the trie, so a DFA
 * where they keep failing late costs at most a constant factor more than the plain walk.
 *
 * Every index read from the inputs is bounds-checked (a malformed trie, or a table holding
 * a state out of range, raises ValueError instead of reading out of bounds); the loops run
 * without the GIL; scratch memory is freed on every path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include "arrays.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { NODE_BYTE, NODE_DEPTH, NODE_END, NODE_LO, NODE_HI, NODE_TOK, NODE_DEEP, NODE_COLS };

/* -- small helpers ------------------------------------------------------------------------ */

/* A growable int32 buffer (malloc'ed; the owner frees ``data``). */
typedef struct {
    int32_t *data;
    Py_ssize_t size, cap;
} ibuf;

static int ibuf_reserve(ibuf *b, Py_ssize_t extra) {
    if (b->size + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->size + extra) cap *= 2;
    int32_t *data = (int32_t *)realloc(b->data, (size_t)cap * sizeof(int32_t));
    if (!data) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int ibuf_push(ibuf *b, int32_t v) {
    if (b->size == b->cap && ibuf_reserve(b, 1)) return -1;
    b->data[b->size++] = v;
    return 0;
}

/* A new 1-d array of ``type`` (int32 or int64) holding a copy of ``n`` values of ``src``. */
static PyObject *new_array(const void *src, Py_ssize_t n, int type) {
    npy_intp dim = (npy_intp)n;
    PyObject *arr = PyArray_SimpleNew(1, &dim, type);
    if (arr && n) {
        size_t item = type == NPY_INT64 ? sizeof(int64_t) : sizeof(int32_t);
        memcpy(PyArray_DATA((PyArrayObject *)arr), src, (size_t)n * item);
    }
    return arr;
}

/* -- walk ----------------------------------------------------------------------------------- */

typedef struct {
    ibuf rows, split_lo, split_hi, split_pos;
} walk_out;

typedef struct {
    uint64_t to_major[4], dies[4];  /* bytes to ``major``; bytes to the dead state */
    int32_t major;                  /* the most common live target (0 if none) */
} moves;

typedef struct {
    const int32_t *nodes;
    const uint64_t *below;  /* [N, 4] */
    const int32_t *lengths; /* [T] token lengths in row order */
    Py_ssize_t n_nodes, n_rows, max_depth;
    const int32_t *table;
    const npy_bool *accepting;
    Py_ssize_t n_states;
    moves *moves;           /* [S], filled on first use */
    uint8_t *moves_known;   /* [S] */
    Py_ssize_t budget;      /* chain steps left to try */
} walk_in;

/* ``s``'s moves (computed once per state and walk). */
static const moves *moves_of(walk_in *in, int32_t s) {
    moves *m = in->moves + s;
    if (!in->moves_known[s]) {
        const int32_t *row = in->table + (Py_ssize_t)s * 256;
        int32_t best = 0, best_n = 0;
        for (int b = 0; b < 256; b++) {  /* the majority target: a Boyer-Moore vote... */
            if (!row[b]) continue;
            if (best_n == 0) best = row[b];
            best_n += row[b] == best ? 1 : -1;
        }
        memset(m, 0, sizeof(*m));
        m->major = best;  /* ...any live target is correct, the most common is useful */
        for (int b = 0; b < 256; b++) {
            if (!row[b]) m->dies[b >> 6] |= (uint64_t)1 << (b & 63);
            else if (row[b] == best) m->to_major[b >> 6] |= (uint64_t)1 << (b & 63);
        }
        in->moves_known[s] = 1;
    }
    return m;
}

static inline int subset(const uint64_t *x, const uint64_t *y) {
    return !(x[0] & ~y[0]) && !(x[1] & ~y[1]) && !(x[2] & ~y[2]) && !(x[3] & ~y[3]);
}

/*
 * The chain below a node reached in state ``s`` (not accepting) with bytes ``x`` below and
 * tokens at most ``span`` bytes deeper: returns J >= 1 such that a token m bytes below
 * (1 <= m <= span) stays inside iff m < J (span + 1: all of them), or 0 if there is no
 * chain (a set of bytes that does not move as one, or an accepting state on the way).
 * ``s`` must be in range; the states read from the table are checked (-1: out of range).
 */
static Py_ssize_t chain(walk_in *in, int32_t s, const uint64_t *x, Py_ssize_t span) {
    for (Py_ssize_t j = 1; j <= span; j++) {
        if (--in->budget < 0) return 0;
        const moves *m = moves_of(in, s);
        if (subset(x, m->dies)) return j;
        if (!m->major || !subset(x, m->to_major)) return 0;
        int32_t t = m->major;
        if (t < 0 || t >= in->n_states) return -1;
        if (in->accepting[t]) return 0;
        if (t == s) return span + 1;  /* a loop: every deeper token stays here */
        s = t;
    }
    return span + 1;
}

/*
 * Walk the subtrees of the first-byte nodes ``starts[k]`` entered in states ``states[k]``.
 * ``st`` has max_depth + 1 slots. Returns 0, -1 on a bad input (*why set), -2 out of memory.
 */
static int walk_loop(walk_in *in, const int32_t *starts, const int32_t *states,
                     Py_ssize_t n_starts, int32_t *st, walk_out *out, const char **why) {
    const int32_t *nodes = in->nodes;
    for (Py_ssize_t k = 0; k < n_starts; k++) {
        Py_ssize_t i = starts[k];
        if (i < 0 || i >= in->n_nodes || nodes[i * NODE_COLS + NODE_DEPTH] != 1) {
            *why = "a start is not a first-byte node";
            return -1;
        }
        if (states[k] <= 0 || states[k] >= in->n_states) {
            *why = "a start state is dead or out of range";
            return -1;
        }
        Py_ssize_t end = nodes[i * NODE_COLS + NODE_END];
        if (end <= i || end > in->n_nodes) {
            *why = "a subtree end is out of range";
            return -1;
        }
        int first = 1;
        while (i < end) {
            const int32_t *nd = nodes + i * NODE_COLS;
            int32_t d = nd[NODE_DEPTH], skip = nd[NODE_END], s;
            if (skip <= i || skip > end || d < 1 || d > in->max_depth) {
                *why = "a subtree end or depth is out of range";
                return -1;
            }
            if (first) {
                s = states[k];
                first = 0;
            } else {
                if (d < 2 || (uint32_t)nd[NODE_BYTE] > 255u) {
                    *why = "a node depth or byte is out of range";
                    return -1;
                }
                s = in->table[(Py_ssize_t)st[d - 1] * 256 + nd[NODE_BYTE]];
                if (s < 0 || s >= in->n_states) {
                    *why = "the table holds a state out of range";
                    return -1;
                }
            }
            if (!s) {  /* dead: nothing below this prefix */
                i = skip;
                continue;
            }
            int32_t lo = nd[NODE_LO], hi = nd[NODE_HI], tok = nd[NODE_TOK];
            if (lo < 0 || hi > in->n_rows || lo >= hi || (tok != -1 && tok != lo)) {
                *why = "a node's token rows are out of range";
                return -1;
            }
            if (!in->accepting[s] && skip > i + 1) {
                Py_ssize_t span = nd[NODE_DEEP] - d;
                if (span < 1 || nd[NODE_DEEP] > in->max_depth) {
                    *why = "a node's deepest token is out of range";
                    return -1;
                }
                Py_ssize_t J = chain(in, s, in->below + i * 4, span);
                if (J < 0) {
                    *why = "the table holds a state out of range";
                    return -1;
                }
                if (J > 0) {  /* a chain: take the rows whose tokens are alive at once */
                    if (ibuf_reserve(&out->rows, hi - lo)) return -2;
                    for (int32_t r = lo; r < hi; r++)
                        if (in->lengths[r] - d < J) out->rows.data[out->rows.size++] = r;
                    i = skip;
                    continue;
                }
            }
            st[d] = s;
            if (tok >= 0 && ibuf_push(&out->rows, tok)) return -2;
            if (in->accepting[s]) {  /* the terminal may end after d bytes: the rest follows */
                int32_t from = lo + (tok >= 0);
                if (from < hi && (ibuf_push(&out->split_lo, from) ||
                                  ibuf_push(&out->split_hi, hi) || ibuf_push(&out->split_pos, d)))
                    return -2;
            }
            i++;
        }
    }
    return 0;
}

PyDoc_STRVAR(walk_doc,
"walk(nodes, below, lengths, table, accepting, starts, states, max_depth)\n"
"    -> (rows, split_lo, split_hi, split_pos)\n\n"
"Walk the subtrees of the first-byte nodes ``starts`` (int32 [K], indices into ``nodes``)\n"
"entered in DFA states ``states`` (int32 [K], alive) through ``table`` (int32 [S, 256],\n"
"0 = dead) and ``accepting`` (bool [S]). ``nodes`` is the depth-first trie, int32 [N, 7]\n"
"(byte, depth, end, lo, hi, tok, deep) over the token rows of ``lengths`` (int32 [T]),\n"
"``below`` (uint64 [N, 4]) the bytes below each node; ``max_depth`` bounds the depths.\n\n"
"Returns int32 arrays: the rows of the tokens that stay inside the terminal, ascending,\n"
"and the splits: rows [split_lo, split_hi) may leave the terminal after split_pos bytes.\n"
"Pure; releases the GIL. Raises TypeError (dtype/layout) or ValueError (out of range).");

static PyObject *py_walk(PyObject *self, PyObject *args) {
    PyObject *o_nodes, *o_below, *o_lengths, *o_table, *o_acc, *o_starts, *o_states;
    Py_ssize_t max_depth;
    if (!PyArg_ParseTuple(args, "OOOOOOOn", &o_nodes, &o_below, &o_lengths, &o_table, &o_acc,
                          &o_starts, &o_states, &max_depth))
        return NULL;
    PyArrayObject *nodes = NULL, *below = NULL, *lengths = NULL, *table = NULL, *acc = NULL,
                  *starts = NULL, *states = NULL;
    PyObject *result = NULL;
    int32_t *st = NULL;
    walk_out out = {{0}};
    walk_in in = {0};
    if (!(nodes = as_array(o_nodes, NPY_INT32, 2, 0, "nodes")) ||
        !(below = as_array(o_below, NPY_UINT64, 2, 0, "below")) ||
        !(lengths = as_array(o_lengths, NPY_INT32, 1, 0, "lengths")) ||
        !(table = as_array(o_table, NPY_INT32, 2, 0, "table")) ||
        !(acc = as_array(o_acc, NPY_BOOL, 1, 0, "accepting")) ||
        !(starts = as_array(o_starts, NPY_INT32, 1, 0, "starts")) ||
        !(states = as_array(o_states, NPY_INT32, 1, 0, "states")))
        goto done;
    if (PyArray_DIM(nodes, 1) != NODE_COLS || PyArray_DIM(below, 1) != 4 ||
        PyArray_DIM(below, 0) != PyArray_DIM(nodes, 0)) {
        PyErr_SetString(PyExc_ValueError, "nodes must be [N, 7] and below [N, 4]");
        goto done;
    }
    if (PyArray_DIM(table, 1) != 256 || PyArray_DIM(acc, 0) != PyArray_DIM(table, 0) ||
        PyArray_DIM(table, 0) < 1 || PyArray_DIM(table, 0) > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "table must be [S, 256] and accepting [S], S >= 1");
        goto done;
    }
    if (PyArray_DIM(starts, 0) != PyArray_DIM(states, 0)) {
        PyErr_SetString(PyExc_ValueError, "starts and states differ in length");
        goto done;
    }
    Py_ssize_t n_rows = PyArray_DIM(lengths, 0);
    if (max_depth < 1 || max_depth > (1 << 20) || n_rows > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "max_depth or the number of rows out of range");
        goto done;
    }
    in.nodes = (const int32_t *)PyArray_DATA(nodes);
    in.below = (const uint64_t *)PyArray_DATA(below);
    in.lengths = (const int32_t *)PyArray_DATA(lengths);
    in.n_nodes = PyArray_DIM(nodes, 0);
    in.n_rows = n_rows;
    in.max_depth = max_depth;
    in.table = (const int32_t *)PyArray_DATA(table);
    in.accepting = (const npy_bool *)PyArray_DATA(acc);
    in.n_states = PyArray_DIM(table, 0);
    st = (int32_t *)malloc((size_t)(max_depth + 1) * sizeof(int32_t));
    in.moves = (moves *)malloc((size_t)in.n_states * sizeof(moves));
    in.moves_known = (uint8_t *)calloc((size_t)in.n_states, 1);
    in.budget = 8 * in.n_nodes + 4096;
    if (!st || !in.moves || !in.moves_known) {
        PyErr_NoMemory();
        goto done;
    }
    const char *why = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = walk_loop(&in, (const int32_t *)PyArray_DATA(starts),
                   (const int32_t *)PyArray_DATA(states), PyArray_DIM(starts, 0), st, &out, &why);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_SetString(PyExc_ValueError, why);
        goto done;
    }
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *a = new_array(out.rows.data, out.rows.size, NPY_INT32),
             *b = new_array(out.split_lo.data, out.split_lo.size, NPY_INT32),
             *c = new_array(out.split_hi.data, out.split_hi.size, NPY_INT32),
             *e = new_array(out.split_pos.data, out.split_pos.size, NPY_INT32);
    if (a && b && c && e) result = PyTuple_Pack(4, a, b, c, e);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    Py_XDECREF(e);
done:
    free(st);
    free(in.moves);
    free(in.moves_known);
    free(out.rows.data);
    free(out.split_lo.data);
    free(out.split_hi.data);
    free(out.split_pos.data);
    Py_XDECREF(nodes);
    Py_XDECREF(below);
    Py_XDECREF(lengths);
    Py_XDECREF(table);
    Py_XDECREF(acc);
    Py_XDECREF(starts);
    Py_XDECREF(states);
    return result;
}

/* -- finish --------------------------------------------------------------------------------- */

/* FNV-1a over a byte string. */
static inline uint64_t fnv1a(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

typedef struct {
    uint32_t *words;               /* [W] out */
    int64_t *cand_ids, *cand_rem;  /* [P] out (P <= total split rows) */
    ibuf rem_rows, rem_pos;        /* [R] out: one (row, pos) per distinct remainder */
    Py_ssize_t n_cand;
    int32_t *slots;                /* hash table of remainder indices, -1 = empty */
    Py_ssize_t n_slots;
} finish_out;

/*
 * Mask words of ``rows``; then every (row, pos) of the splits whose token is not inside,
 * with its remainder text[offsets[row] + pos : offsets[row + 1]] interned.
 */
static int finish_loop(const int64_t *ids, Py_ssize_t n_rows, Py_ssize_t size,
                       const int32_t *rows, Py_ssize_t n_inside, const int32_t *lo,
                       const int32_t *hi, const int32_t *pos, Py_ssize_t n_split,
                       const uint8_t *text, Py_ssize_t n_text, const int64_t *offsets,
                       finish_out *out, const char **why) {
    for (Py_ssize_t i = 0; i < n_inside; i++) {
        int32_t r = rows[i];
        if (r < 0 || r >= n_rows) {
            *why = "a row is out of range";
            return -1;
        }
        int64_t t = ids[r];
        if (t < 0 || t >= size) {
            *why = "a token id is out of range";
            return -1;
        }
        out->words[t >> 5] |= (uint32_t)1 << (t & 31);
    }
    for (Py_ssize_t j = 0; j < n_split; j++) {
        if (lo[j] < 0 || hi[j] > n_rows || lo[j] > hi[j] || pos[j] < 1) {
            *why = "a split is out of range";
            return -1;
        }
        for (int32_t r = lo[j]; r < hi[j]; r++) {
            int64_t t = ids[r];
            if (t < 0 || t >= size) {
                *why = "a token id is out of range";
                return -1;
            }
            if ((out->words[t >> 5] >> (t & 31)) & 1) continue;  /* inside: legal anyway */
            int64_t a = offsets[r] + pos[j], b = offsets[r + 1];
            if (offsets[r] < 0 || a > b || b > n_text) {
                *why = "a split position is past its token";
                return -1;
            }
            uint64_t h = fnv1a(text + a, (Py_ssize_t)(b - a));
            Py_ssize_t mask = out->n_slots - 1, slot = (Py_ssize_t)(h & (uint64_t)mask);
            int32_t found = -1;
            while (out->slots[slot] >= 0) {
                int32_t e = out->slots[slot];
                int64_t ea = offsets[out->rem_rows.data[e]] + out->rem_pos.data[e];
                int64_t eb = offsets[out->rem_rows.data[e] + 1];
                if (eb - ea == b - a && !memcmp(text + ea, text + a, (size_t)(b - a))) {
                    found = e;
                    break;
                }
                slot = (slot + 1) & mask;
            }
            if (found < 0) {
                found = (int32_t)out->rem_rows.size;
                if (ibuf_push(&out->rem_rows, r) || ibuf_push(&out->rem_pos, pos[j])) return -2;
                out->slots[slot] = found;
            }
            out->cand_ids[out->n_cand] = t;
            out->cand_rem[out->n_cand] = found;
            out->n_cand++;
        }
    }
    return 0;
}

PyDoc_STRVAR(finish_doc,
"finish(ids, size, rows, split_lo, split_hi, split_pos, text, offsets)\n"
"    -> (words, cand_ids, cand_rem, rem_rows, rem_pos)\n\n"
"Turn a walk into a mask: ``words`` (uint32 [ceil(size / 32)]) has the bits of the ids\n"
"``ids[rows]`` (ids: int64 [T], each in range(size)). Each row r of the splits\n"
"[split_lo, split_hi) whose token is not inside is a crossing candidate ``ids[r]`` with\n"
"remainder ``text[offsets[r] + pos:offsets[r + 1]]`` (text: uint8, the tokens' bytes in row\n"
"order; offsets: int64 [T + 1]); ``cand_rem`` (int64) numbers the distinct remainders in\n"
"order of first appearance and ``(rem_rows, rem_pos)`` (int32) spell each one.\n"
"Pure; releases the GIL. Raises TypeError (dtype/layout) or ValueError (out of range).");

static PyObject *py_finish(PyObject *self, PyObject *args) {
    PyObject *o_ids, *o_rows, *o_lo, *o_hi, *o_pos, *o_text, *o_off;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OnOOOOOO", &o_ids, &size, &o_rows, &o_lo, &o_hi, &o_pos,
                          &o_text, &o_off))
        return NULL;
    PyArrayObject *ids = NULL, *rows = NULL, *lo = NULL, *hi = NULL, *pos = NULL, *text = NULL,
                  *off = NULL;
    PyObject *result = NULL, *words = NULL;
    finish_out out = {0};
    if (!(ids = as_array(o_ids, NPY_INT64, 1, 0, "ids")) ||
        !(rows = as_array(o_rows, NPY_INT32, 1, 0, "rows")) ||
        !(lo = as_array(o_lo, NPY_INT32, 1, 0, "split_lo")) ||
        !(hi = as_array(o_hi, NPY_INT32, 1, 0, "split_hi")) ||
        !(pos = as_array(o_pos, NPY_INT32, 1, 0, "split_pos")) ||
        !(text = as_array(o_text, NPY_UINT8, 1, 0, "text")) ||
        !(off = as_array(o_off, NPY_INT64, 1, 0, "offsets")))
        goto done;
    Py_ssize_t n_rows = PyArray_DIM(ids, 0), n_split = PyArray_DIM(lo, 0);
    if (size < 0 || PyArray_DIM(off, 0) != n_rows + 1 || PyArray_DIM(hi, 0) != n_split ||
        PyArray_DIM(pos, 0) != n_split) {
        PyErr_SetString(PyExc_ValueError, "inconsistent lengths (offsets must be [T + 1])");
        goto done;
    }
    const int64_t *id = (const int64_t *)PyArray_DATA(ids);
    const int64_t *of = (const int64_t *)PyArray_DATA(off);
    /* at most as many candidates as split rows */
    const int32_t *l = (const int32_t *)PyArray_DATA(lo), *h = (const int32_t *)PyArray_DATA(hi);
    Py_ssize_t total = 0;
    for (Py_ssize_t j = 0; j < n_split; j++) {
        if (l[j] < 0 || h[j] > n_rows || l[j] > h[j]) {
            PyErr_SetString(PyExc_ValueError, "a split is out of range");
            goto done;
        }
        total += h[j] - l[j];
    }
    npy_intp n_words = (npy_intp)((size + 31) / 32);
    words = PyArray_ZEROS(1, &n_words, NPY_UINT32, 0);
    if (!words) goto done;
    out.words = (uint32_t *)PyArray_DATA((PyArrayObject *)words);
    out.n_slots = 16;
    while (out.n_slots < 2 * total) out.n_slots *= 2;
    out.slots = (int32_t *)malloc((size_t)out.n_slots * sizeof(int32_t));
    out.cand_ids = (int64_t *)malloc((size_t)(total ? total : 1) * sizeof(int64_t));
    out.cand_rem = (int64_t *)malloc((size_t)(total ? total : 1) * sizeof(int64_t));
    if (!out.slots || !out.cand_ids || !out.cand_rem) {
        PyErr_NoMemory();
        goto done;
    }
    memset(out.slots, 0xff, (size_t)out.n_slots * sizeof(int32_t));
    const char *why = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = finish_loop(id, n_rows, size, (const int32_t *)PyArray_DATA(rows), PyArray_DIM(rows, 0),
                     l, h, (const int32_t *)PyArray_DATA(pos), n_split,
                     (const uint8_t *)PyArray_DATA(text), PyArray_DIM(text, 0), of, &out, &why);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_SetString(PyExc_ValueError, why);
        goto done;
    }
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *a = new_array(out.cand_ids, out.n_cand, NPY_INT64),
             *b = new_array(out.cand_rem, out.n_cand, NPY_INT64),
             *c = new_array(out.rem_rows.data, out.rem_rows.size, NPY_INT32),
             *e = new_array(out.rem_pos.data, out.rem_pos.size, NPY_INT32);
    if (a && b && c && e) result = PyTuple_Pack(5, words, a, b, c, e);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    Py_XDECREF(e);
done:
    Py_XDECREF(words);
    free(out.slots);
    free(out.cand_ids);
    free(out.cand_rem);
    free(out.rem_rows.data);
    free(out.rem_pos.data);
    Py_XDECREF(ids);
    Py_XDECREF(rows);
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    Py_XDECREF(pos);
    Py_XDECREF(text);
    Py_XDECREF(off);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", py_walk, METH_VARARGS, walk_doc},
    {"finish", py_finish, METH_VARARGS, finish_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "trie_walk",
    "Depth-first walks of a token trie through a DFA (twins in structspec.automata.grammar).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_trie_walk(void) {
    import_array();
    return PyModule_Create(&module);
}
