/*
 * lark_walk: vocabulary walks through the Lark lexer's combined DFA, one token row each.
 *
 * Twin (NumPy, structspec/automata/lexer.py ``ContextualLexer._walk_rows_numpy``;
 * tests/test_lark_walk_native.py checks that both give identical arrays):
 *   walk  <->  _walk_rows_numpy
 *
 * Row i of the walk is token row ``rows[i]`` of the vocabulary's byte matrix ``data``
 * (uint8 [T, L], ``lengths[r]`` bytes used), started at byte ``offs[i]`` in lexer state
 * ``state[i]``. It steps byte by byte through ``table`` (int32 [n, 256]; 0 = dead) and ends
 *   INSIDE (1)  when its bytes run out: ``state`` is where the lexeme stands;
 *   CROSS  (2)  when byte ``pos`` (> offs[i]) cannot extend the lexeme and the lexeme
 *               accepts there (``winner[state] >= 0``): the rest starts the next lexeme;
 *   DEAD   (3)  when a byte cannot extend a lexeme that does not accept (or the first byte
 *               cannot extend it: the caller judges those from the state after the lexeme).
 * ``pos``/``state`` are where it ended (for DEAD: the failing byte and the state before it).
 *
 * The lexer's table is built lazily: a row whose state is not ``expanded`` yet stops there
 * with status PENDING (0), ``pos``/``state`` saved. The caller expands those states and
 * calls again; rows already finished are skipped. ``pos``, ``state`` and ``status`` are
 * updated in place; the return value is the number of rows still pending.
 *
 * Every index read from the inputs is bounds-checked (ValueError, nothing read out of
 * bounds); the loop runs without the GIL; nothing is allocated.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include "arrays.h"
#include <stdint.h>

enum { PENDING = 0, INSIDE = 1, CROSS = 2, DEAD = 3 };

typedef struct {
    const int32_t *table;      /* [n_table, 256] */
    Py_ssize_t n_table;
    const npy_bool *expanded;  /* [n_expanded] */
    Py_ssize_t n_expanded;
    const int32_t *winner;     /* [n_winner] */
    Py_ssize_t n_winner;
    const uint8_t *data;       /* [n_tokens, width] */
    Py_ssize_t n_tokens, width;
    const int64_t *lengths;    /* [n_tokens] */
    const int64_t *rows, *offs;
    int64_t *pos;
    int32_t *state;
    int8_t *status;
    Py_ssize_t n;
} walk_args;

/* The loop. Returns the number of pending rows, or -1 with *why set on a bad input. */
static Py_ssize_t walk_loop(const walk_args *a, const char **why) {
    Py_ssize_t pending = 0;
    for (Py_ssize_t i = 0; i < a->n; i++) {
        if (a->status[i] != PENDING) continue;
        int64_t r = a->rows[i];
        if (r < 0 || r >= a->n_tokens) {
            *why = "a token row is out of range";
            return -1;
        }
        int64_t len = a->lengths[r], p = a->pos[i], off = a->offs[i];
        if (len < 0 || len > a->width || p < off || off < 0) {
            *why = "a token length or position is out of range";
            return -1;
        }
        const uint8_t *text = a->data + r * a->width;
        int32_t s = a->state[i];
        int8_t result = PENDING;
        for (;;) {
            if (s < 0 || s >= a->n_table || s >= a->n_winner) {  /* 0 (dead) dies below */
                *why = "a lexer state is out of range";
                return -1;
            }
            if (p >= len) {
                result = INSIDE;
                break;
            }
            if (s >= a->n_expanded || !a->expanded[s]) break;  /* the caller expands it */
            int32_t nxt = a->table[(Py_ssize_t)s * 256 + text[p]];
            if (nxt == 0) {
                result = (a->winner[s] >= 0 && p > off) ? CROSS : DEAD;
                break;
            }
            s = nxt;
            p++;
        }
        a->pos[i] = p;
        a->state[i] = s;
        a->status[i] = result;
        pending += result == PENDING;
    }
    return pending;
}

PyDoc_STRVAR(walk_doc,
"walk(table, expanded, winner, data, lengths, rows, offs, pos, state, status) -> int\n\n"
"Walk token rows through the lexer table (see the module source). table int32 [n, 256],\n"
"expanded bool [m], winner int32 [k], data uint8 [T, L], lengths int64 [T], rows int64\n"
"[R], offs int64 [R]; pos int64 [R], state int32 [R] and status int8 [R] are updated in\n"
"place (rows whose status is not 0 are skipped). Returns how many rows are pending.");

static PyObject *py_walk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[10];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &o[8], &o[9]))
        return NULL;
    static const int types[10] = {NPY_INT32, NPY_BOOL, NPY_INT32, NPY_UINT8, NPY_INT64,
                                  NPY_INT64, NPY_INT64, NPY_INT64, NPY_INT32, NPY_INT8};
    static const int dims[10] = {2, 1, 1, 2, 1, 1, 1, 1, 1, 1};
    static const char *names[10] = {"table", "expanded", "winner", "data", "lengths",
                                    "rows", "offs", "pos", "state", "status"};
    PyArrayObject *arr[10] = {NULL};
    PyObject *result = NULL;
    for (int k = 0; k < 10; k++) {
        arr[k] = as_array(o[k], types[k], dims[k], k >= 7, names[k]);
        if (!arr[k]) goto done;
    }
    walk_args a;
    a.table = (const int32_t *)PyArray_DATA(arr[0]);
    a.n_table = PyArray_DIM(arr[0], 0);
    a.expanded = (const npy_bool *)PyArray_DATA(arr[1]);
    a.n_expanded = PyArray_DIM(arr[1], 0);
    a.winner = (const int32_t *)PyArray_DATA(arr[2]);
    a.n_winner = PyArray_DIM(arr[2], 0);
    a.data = (const uint8_t *)PyArray_DATA(arr[3]);
    a.n_tokens = PyArray_DIM(arr[3], 0);
    a.width = PyArray_DIM(arr[3], 1);
    a.lengths = (const int64_t *)PyArray_DATA(arr[4]);
    a.rows = (const int64_t *)PyArray_DATA(arr[5]);
    a.offs = (const int64_t *)PyArray_DATA(arr[6]);
    a.pos = (int64_t *)PyArray_DATA(arr[7]);
    a.state = (int32_t *)PyArray_DATA(arr[8]);
    a.status = (int8_t *)PyArray_DATA(arr[9]);
    a.n = PyArray_DIM(arr[5], 0);
    if (PyArray_DIM(arr[0], 1) != 256) {
        PyErr_SetString(PyExc_ValueError, "table must have 256 columns");
        goto done;
    }
    if (PyArray_DIM(arr[4], 0) != a.n_tokens) {
        PyErr_SetString(PyExc_ValueError, "lengths must have one entry per token row");
        goto done;
    }
    for (int k = 6; k < 10; k++) {
        if (PyArray_DIM(arr[k], 0) != a.n) {
            PyErr_Format(PyExc_ValueError, "%s must have one entry per walked row", names[k]);
            goto done;
        }
    }
    const char *why = NULL;
    Py_ssize_t pending;
    Py_BEGIN_ALLOW_THREADS
    pending = walk_loop(&a, &why);
    Py_END_ALLOW_THREADS
    if (pending < 0) {
        PyErr_SetString(PyExc_ValueError, why);
        goto done;
    }
    result = PyLong_FromSsize_t(pending);
done:
    for (int k = 0; k < 10; k++) Py_XDECREF(arr[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", py_walk, METH_VARARGS, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "lark_walk",
    "Token walks through the Lark lexer DFA (twin in structspec.automata.lexer).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_lark_walk(void) {
    import_array();
    return PyModule_Create(&module);
}
