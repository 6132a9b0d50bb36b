/*
 * trie_walk: the vocabulary walk of a token trie through a terminal DFA, depth first.
 *
 * The NumPy twin is ``_walk_levels`` in structspec/automata/grammar.py (level by level);
 * both yield the same sets (tests/test_native_walk.py compares them). See the docstrings
 * of ``walk`` and ``rows_to_words`` below for the contracts; the Python side builds the
 * flat trie once per vocabulary (``_dfs_trie`` in grammar.py).
 *
 * The trie is stored in depth-first order, one row of ``nodes`` (int32 [N, 6]) per node:
 *   NODE_BYTE   the node's last byte (0..255)
 *   NODE_DEPTH  its depth (1 for a first byte)
 *   NODE_END    one past the last node of its subtree (the next node not below it)
 *   NODE_LO     the first token row below it (tokens sorted by bytes: a prefix's tokens
 *               are the rows [lo, hi))
 *   NODE_HI     one past the last token row below it
 *   NODE_TOK    the row of the token spelling exactly this prefix, or -1 (then it is lo)
 *
 * Every index read from the inputs is bounds-checked in the loop (a malformed trie or a
 * table with an out-of-range state raises ValueError instead of reading out of bounds);
 * the loops run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { NODE_BYTE, NODE_DEPTH, NODE_END, NODE_LO, NODE_HI, NODE_TOK, NODE_COLS };

/* A growable int32 buffer (malloc'ed; freed by the caller). */
typedef struct {
    int32_t *data;
    Py_ssize_t size, cap;
} ibuf;

static int ibuf_push(ibuf *b, int32_t v) {
    if (b->size == b->cap) {
        Py_ssize_t cap = b->cap ? 2 * b->cap : 256;
        int32_t *data = (int32_t *)realloc(b->data, (size_t)cap * sizeof(int32_t));
        if (!data) return -1;
        b->data = data;
        b->cap = cap;
    }
    b->data[b->size++] = v;
    return 0;
}

/* A new 1-d int32 array holding a copy of ``b``'s contents. */
static PyObject *ibuf_to_array(const ibuf *b) {
    npy_intp n = (npy_intp)b->size;
    PyObject *arr = PyArray_SimpleNew(1, &n, NPY_INT32);
    if (arr && n) memcpy(PyArray_DATA((PyArrayObject *)arr), b->data, (size_t)n * sizeof(int32_t));
    return arr;
}

/* ``obj`` as an aligned, C-contiguous array of ``type`` with ``ndim`` dimensions (a new
 * reference; no copy is made: a wrong dtype or layout is a TypeError). */
static PyArrayObject *as_array(PyObject *obj, int type, int ndim, const char *name) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy array", name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != ndim || !PyArray_IS_C_CONTIGUOUS(a) ||
        !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous %d-d %s array", name, ndim,
                     type == NPY_INT32 ? "int32" : type == NPY_INT64 ? "int64"
                     : type == NPY_BOOL ? "bool" : "uint32");
        return NULL;
    }
    Py_INCREF(a);
    return a;
}

typedef struct {
    ibuf rows, split_lo, split_hi, split_pos;
} walk_out;

/*
 * Walk the subtrees of the first-byte nodes ``starts[k]`` (entered in states ``states[k]``,
 * alive) through the DFA. Returns 0, -1 on a bad input (*why set), -2 out of memory.
 */
static int walk_loop(const int32_t *nodes, Py_ssize_t n_nodes, Py_ssize_t n_rows,
                     const int32_t *table, Py_ssize_t n_states, const npy_bool *accepting,
                     const int32_t *starts, const int32_t *states, Py_ssize_t n_starts,
                     int32_t *st, Py_ssize_t max_depth, walk_out *out, const char **why) {
    for (Py_ssize_t k = 0; k < n_starts; k++) {
        Py_ssize_t i = starts[k];
        if (i < 0 || i >= n_nodes || nodes[i * NODE_COLS + NODE_DEPTH] != 1) {
            *why = "a start is not a first-byte node";
            return -1;
        }
        if (states[k] <= 0 || states[k] >= n_states) {
            *why = "a start state is dead or out of range";
            return -1;
        }
        Py_ssize_t end = nodes[i * NODE_COLS + NODE_END];
        if (end <= i || end > n_nodes) {
            *why = "a subtree end is out of range";
            return -1;
        }
        st[1] = states[k];
        int first = 1;
        while (i < end) {
            const int32_t *nd = nodes + i * NODE_COLS;
            int32_t d = nd[NODE_DEPTH];
            int32_t s;
            if (first) {
                s = st[1];
                first = 0;
            } else {
                if (d < 2 || d > max_depth || (uint32_t)nd[NODE_BYTE] > 255u) {
                    *why = "a node depth or byte is out of range";
                    return -1;
                }
                s = table[(Py_ssize_t)st[d - 1] * 256 + nd[NODE_BYTE]];
                if (s < 0 || s >= n_states) {
                    *why = "the table holds a state out of range";
                    return -1;
                }
            }
            int32_t skip = nd[NODE_END];
            if (skip <= i || skip > end) {
                *why = "a subtree end is out of range";
                return -1;
            }
            if (!s) {  /* dead: nothing below this prefix */
                i = skip;
                continue;
            }
            st[d] = s;
            int32_t lo = nd[NODE_LO], hi = nd[NODE_HI], tok = nd[NODE_TOK];
            if (lo < 0 || hi > n_rows || lo >= hi || (tok != -1 && tok != lo)) {
                *why = "a node's token rows are out of range";
                return -1;
            }
            if (tok >= 0 && ibuf_push(&out->rows, tok)) return -2;
            if (accepting[s]) {  /* the terminal may end after d bytes: the rest must follow */
                int32_t from = lo + (tok >= 0);
                if (from < hi) {
                    if (ibuf_push(&out->split_lo, from) || ibuf_push(&out->split_hi, hi) ||
                        ibuf_push(&out->split_pos, d))
                        return -2;
                }
            }
            i++;
        }
    }
    return 0;
}

static void walk_out_free(walk_out *o) {
    free(o->rows.data);
    free(o->split_lo.data);
    free(o->split_hi.data);
    free(o->split_pos.data);
}

PyDoc_STRVAR(walk_doc,
"walk(nodes, n_rows, table, accepting, starts, states, max_depth)\n"
"    -> (rows, split_lo, split_hi, split_pos)\n\n"
"Walk the subtrees of the first-byte nodes ``starts`` (int32 [K], indices into ``nodes``)\n"
"entered in DFA states ``states`` (int32 [K], alive) through ``table`` (int32 [S, 256],\n"
"0 = dead) and ``accepting`` (bool [S]). ``nodes`` is the depth-first trie, int32 [N, 6]\n"
"(byte, depth, end, lo, hi, tok) over ``n_rows`` token rows; ``max_depth`` bounds the\n"
"node depths.\n\n"
"Returns int32 arrays: the rows of the tokens that stay inside the terminal, ascending,\n"
"and the splits: rows [split_lo, split_hi) may leave the terminal after split_pos bytes.\n"
"Raises TypeError (dtype/layout) or ValueError (an index out of range).");

static PyObject *py_walk(PyObject *self, PyObject *args) {
    PyObject *o_nodes, *o_table, *o_acc, *o_starts, *o_states;
    Py_ssize_t n_rows, max_depth;
    if (!PyArg_ParseTuple(args, "OnOOOOn", &o_nodes, &n_rows, &o_table, &o_acc, &o_starts,
                          &o_states, &max_depth))
        return NULL;
    PyArrayObject *nodes = NULL, *table = NULL, *acc = NULL, *starts = NULL, *states = NULL;
    PyObject *result = NULL;
    int32_t *st = NULL;
    walk_out out = {{0}};
    if (!(nodes = as_array(o_nodes, NPY_INT32, 2, "nodes")) ||
        !(table = as_array(o_table, NPY_INT32, 2, "table")) ||
        !(acc = as_array(o_acc, NPY_BOOL, 1, "accepting")) ||
        !(starts = as_array(o_starts, NPY_INT32, 1, "starts")) ||
        !(states = as_array(o_states, NPY_INT32, 1, "states")))
        goto done;
    if (PyArray_DIM(nodes, 1) != NODE_COLS) {
        PyErr_SetString(PyExc_ValueError, "nodes must have 6 columns");
        goto done;
    }
    if (PyArray_DIM(table, 1) != 256 || PyArray_DIM(acc, 0) != PyArray_DIM(table, 0) ||
        PyArray_DIM(table, 0) < 1) {
        PyErr_SetString(PyExc_ValueError, "table must be [S, 256] and accepting [S], S >= 1");
        goto done;
    }
    if (PyArray_DIM(starts, 0) != PyArray_DIM(states, 0)) {
        PyErr_SetString(PyExc_ValueError, "starts and states differ in length");
        goto done;
    }
    if (max_depth < 1 || max_depth > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "max_depth out of range");
        goto done;
    }
    st = (int32_t *)malloc((size_t)(max_depth + 1) * sizeof(int32_t));
    if (!st) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n_nodes = PyArray_DIM(nodes, 0);
    if (n_rows < 0 || n_rows > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "n_rows out of range");
        goto done;
    }
    const char *why = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = walk_loop((const int32_t *)PyArray_DATA(nodes), n_nodes, n_rows,
                   (const int32_t *)PyArray_DATA(table), PyArray_DIM(table, 0),
                   (const npy_bool *)PyArray_DATA(acc), (const int32_t *)PyArray_DATA(starts),
                   (const int32_t *)PyArray_DATA(states), PyArray_DIM(starts, 0), st,
                   max_depth, &out, &why);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_SetString(PyExc_ValueError, why);
        goto done;
    }
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *a = ibuf_to_array(&out.rows), *b = ibuf_to_array(&out.split_lo),
             *c = ibuf_to_array(&out.split_hi), *e = ibuf_to_array(&out.split_pos);
    if (a && b && c && e) result = PyTuple_Pack(4, a, b, c, e);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    Py_XDECREF(e);
done:
    free(st);
    walk_out_free(&out);
    Py_XDECREF(nodes);
    Py_XDECREF(table);
    Py_XDECREF(acc);
    Py_XDECREF(starts);
    Py_XDECREF(states);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", py_walk, METH_VARARGS, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "trie_walk",
    "Depth-first walks of a token trie through a DFA (twin: grammar._walk_levels).", -1,
    methods,
};

PyMODINIT_FUNC PyInit_trie_walk(void) {
    import_array();
    return PyModule_Create(&module);
}
