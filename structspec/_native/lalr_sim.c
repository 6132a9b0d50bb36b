/*
 * lalr_sim: LALR(1) reductions simulated over array stacks, for the Lark constraint.
 *
 * Twin (Python, structspec/automata/lalr.py; tests/test_lalr_native.py checks that both
 * give identical answers):
 *   feed    <->  ParserStacks._feed_python   (the stack after a terminal, as pushes)
 *   takes   <->  ParserStacks._takes_python  (which of several terminals are taken)
 *   find    <->  ParserStacks._find_python   (a signature trie's value for a stack)
 *
 * A parser stack is a node of the interned tree of ``ParserStacks``: node ``s`` holds the
 * LALR state ``state[s]`` over node ``parent[s]`` (-1 below the bottom; the arrays may be
 * longer than the nodes interned so far, and any entry is bounds-checked). Feeding terminal ``t`` runs lark's ``feed_token`` loop: while the top state's
 * action for ``t`` is a reduction, pop ``rule_len[r]`` states and push the goto of
 * ``rule_lhs[r]`` from the state under them; a shift ends it (``t`` taken), no action is a
 * syntax error. The reductions run on a scratch array of states pushed over the part of
 * the stack not popped yet, so nothing is interned here; every answer also reports the
 * lowest stack height it read (the top of ``stack`` is at ``height``): the result is the
 * same on every stack whose states agree from that height up.
 *
 * Tables (int32, C-contiguous): ``actions[S, T]`` (code >= 0: shift to that state;
 * code in [-R, -1]: reduce rule -code-1; NO_ACTION = INT32_MIN: none), ``gotos[S, N]``
 * (-1: none), ``rule_len[R]``, ``rule_lhs[R]`` (nonterminal index). Every index read is
 * bounds-checked (ValueError, nothing read out of bounds); a reduction loop longer than
 * MAX_STEPS is a ValueError too (corrupt tables). The GIL is held (the calls are short).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include "arrays.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NO_ACTION INT32_MIN
#define MAX_STEPS (1 << 22)

typedef struct {
    const int32_t *actions;  /* [S, T] */
    const int32_t *gotos;    /* [S, N] */
    const int32_t *rule_len, *rule_lhs;  /* [R] */
    Py_ssize_t S, T, N, R;
    const int64_t *parent;   /* [n_nodes] */
    const int32_t *state;    /* [n_nodes] */
    Py_ssize_t n_nodes;
} tables;

/* A growable scratch array of LALR states (the states pushed by reductions). */
typedef struct {
    int32_t *v;
    Py_ssize_t n, cap;
    int32_t small[64];
} scratch;

static void scratch_init(scratch *s) { s->v = s->small; s->n = 0; s->cap = 64; }
static void scratch_free(scratch *s) { if (s->v != s->small) free(s->v); }
static int scratch_push(scratch *s, int32_t x) {
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap * 2;
        int32_t *v = malloc(sizeof(int32_t) * cap);
        if (!v) return -1;
        for (Py_ssize_t i = 0; i < s->n; i++) v[i] = s->v[i];
        scratch_free(s);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

enum { TAKEN = 1, REFUSED = 0, BAD = -1, NOMEM = -2 };

/* Run the reductions of terminal ``t`` on ``stack`` (height ``height``). Returns TAKEN
 * (``*shift`` = the state shifted to; ``*base`` = the node under the scratch pushes, which
 * are left in ``pushed``), REFUSED, or BAD/NOMEM (``*why`` set). ``*low`` = the lowest
 * height read. */
static int simulate(const tables *tb, int64_t stack, int64_t height, int64_t t,
                    scratch *pushed, int64_t *base_out, int32_t *shift, int64_t *low,
                    const char **why) {
    if (stack < 0 || stack >= tb->n_nodes) { *why = "the stack node is out of range"; return BAD; }
    if (t < 0 || t >= tb->T) { *why = "a terminal is out of range"; return BAD; }
    int64_t base = stack, h = height;
    *low = height;
    pushed->n = 0;
    int32_t top = tb->state[stack];
    for (long step = 0; step < MAX_STEPS; step++) {
        if (top < 0 || top >= tb->S) { *why = "an LALR state is out of range"; return BAD; }
        int32_t code = tb->actions[(Py_ssize_t)top * tb->T + t];
        if (code == NO_ACTION) { *base_out = base; return REFUSED; }
        if (code >= 0) { *base_out = base; *shift = code; return TAKEN; }
        int64_t rule = -(int64_t)code - 1;
        if (rule >= tb->R) { *why = "a rule is out of range"; return BAD; }
        int32_t n = tb->rule_len[rule];
        if (n < 0) { *why = "a rule length is negative"; return BAD; }
        if (n <= pushed->n) {
            pushed->n -= n;
        } else {
            for (int32_t k = pushed->n; k < n; k++) {
                base = tb->parent[base];
                h--;
                if (base < 0 || base >= tb->n_nodes) {
                    *why = "a reduction pops below the bottom of the stack";
                    return BAD;
                }
            }
            pushed->n = 0;
            if (h < *low) *low = h;
        }
        int32_t under = pushed->n ? pushed->v[pushed->n - 1] : tb->state[base];
        int32_t lhs = tb->rule_lhs[rule];
        if (under < 0 || under >= tb->S || lhs < 0 || lhs >= tb->N) {
            *why = "a goto is out of range";
            return BAD;
        }
        top = tb->gotos[(Py_ssize_t)under * tb->N + lhs];
        if (top < 0) { *base_out = base; return REFUSED; }  /* lark always has the goto */
        if (scratch_push(pushed, top) < 0) { *why = "out of memory"; return NOMEM; }
    }
    *why = "a reduction loop does not end (corrupt tables)";
    return BAD;
}

/* Parse the seven table/node arguments into ``tb`` (new references in ``arr[0..5]``). */
static int get_tables(PyObject **objs, PyArrayObject **arr, tables *tb) {
    static const char *names[6] = {"actions", "gotos", "rule_len", "rule_lhs", "parent",
                                   "state"};
    static const int types[6] = {NPY_INT32, NPY_INT32, NPY_INT32, NPY_INT32, NPY_INT64,
                                 NPY_INT32};
    static const int dims[6] = {2, 2, 1, 1, 1, 1};
    for (int k = 0; k < 6; k++) {
        arr[k] = as_array(objs[k], types[k], dims[k], 0, names[k]);
        if (!arr[k]) return -1;
    }
    tb->actions = PyArray_DATA(arr[0]);
    tb->S = PyArray_DIM(arr[0], 0);
    tb->T = PyArray_DIM(arr[0], 1);
    tb->gotos = PyArray_DATA(arr[1]);
    tb->N = PyArray_DIM(arr[1], 1);
    tb->rule_len = PyArray_DATA(arr[2]);
    tb->rule_lhs = PyArray_DATA(arr[3]);
    tb->R = PyArray_DIM(arr[2], 0);
    tb->parent = PyArray_DATA(arr[4]);
    tb->state = PyArray_DATA(arr[5]);
    tb->n_nodes = PyArray_DIM(arr[4], 0);
    if (PyArray_DIM(arr[1], 0) != tb->S) {
        PyErr_SetString(PyExc_ValueError, "gotos must have one row per LALR state");
        return -1;
    }
    if (PyArray_DIM(arr[3], 0) != tb->R) {
        PyErr_SetString(PyExc_ValueError, "rule_len and rule_lhs must have one entry per rule");
        return -1;
    }
    if (PyArray_DIM(arr[5], 0) != tb->n_nodes) {
        PyErr_SetString(PyExc_ValueError, "parent and state must have one entry per node");
        return -1;
    }
    return 0;
}

static int raise_for(int status, const char *why) {
    if (status == NOMEM) PyErr_NoMemory();
    else PyErr_SetString(PyExc_ValueError, why);
    return -1;
}

PyDoc_STRVAR(feed_doc,
"feed(actions, gotos, rule_len, rule_lhs, parent, state, stack, height, terminal)\n"
"-> (base, low, pushed)\n\n"
"Feed ``terminal`` to ``stack`` (of height ``height``): ``pushed`` is the tuple of LALR\n"
"states to push over node ``base`` (the last one is the shift), or ``base`` is -1 and\n"
"``pushed`` empty when the terminal is a syntax error. ``low``: the lowest height read.");

static PyObject *py_feed(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[6];
    long long stack, height, terminal;
    if (!PyArg_ParseTuple(args, "OOOOOOLLL", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &stack, &height, &terminal))
        return NULL;
    PyArrayObject *arr[6] = {NULL};
    PyObject *result = NULL;
    tables tb;
    scratch pushed;
    scratch_init(&pushed);
    if (get_tables(objs, arr, &tb) < 0) goto done;
    int64_t base, low;
    int32_t shift;
    const char *why = NULL;
    int st = simulate(&tb, stack, height, terminal, &pushed, &base, &shift, &low, &why);
    if (st < 0) { raise_for(st, why); goto done; }
    if (st == REFUSED) {
        result = Py_BuildValue("LL()", (long long)-1, (long long)low);
        goto done;
    }
    PyObject *tup = PyTuple_New(pushed.n + 1);
    if (!tup) goto done;
    for (Py_ssize_t i = 0; i <= pushed.n; i++) {
        PyObject *v = PyLong_FromLong(i < pushed.n ? pushed.v[i] : shift);
        if (!v) { Py_DECREF(tup); goto done; }
        PyTuple_SET_ITEM(tup, i, v);
    }
    result = Py_BuildValue("LLN", (long long)base, (long long)low, tup);
done:
    scratch_free(&pushed);
    for (int k = 0; k < 6; k++) Py_XDECREF(arr[k]);
    return result;
}

PyDoc_STRVAR(takes_doc,
"takes(actions, gotos, rule_len, rule_lhs, parent, state, stack, height, terminals, bits)\n"
"-> (taken, levels)\n\n"
"Which of ``terminals`` (int64 parser ids) ``stack`` takes, each named by its bit\n"
"``bits[i]`` (int64, >= 0): ``taken`` is the little-endian bytes of the bitmask of the\n"
"taken ones' bits; ``levels`` pairs each distinct lowest height read, ascending, with the\n"
"bytes of the bitmask of the terminals whose simulation read down to it.");

static PyObject *py_takes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[6], *terms_obj, *bits_obj;
    long long stack, height;
    if (!PyArg_ParseTuple(args, "OOOOOOLLOO", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &stack, &height, &terms_obj, &bits_obj))
        return NULL;
    PyArrayObject *arr[6] = {NULL}, *terms = NULL, *bitsa = NULL;
    PyObject *result = NULL, *taken = NULL, *levels = NULL;
    int64_t *lows = NULL;
    unsigned char *buf = NULL;
    tables tb;
    scratch pushed;
    scratch_init(&pushed);
    if (get_tables(objs, arr, &tb) < 0) goto done;
    terms = as_array(terms_obj, NPY_INT64, 1, 0, "terminals");
    bitsa = as_array(bits_obj, NPY_INT64, 1, 0, "bits");
    if (!terms || !bitsa) goto done;
    Py_ssize_t k = PyArray_DIM(terms, 0);
    if (PyArray_DIM(bitsa, 0) != k) {
        PyErr_SetString(PyExc_ValueError, "bits must have one entry per terminal");
        goto done;
    }
    const int64_t *t = PyArray_DATA(terms), *bits = PyArray_DATA(bitsa);
    int64_t max_bit = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (bits[i] < 0 || bits[i] >= (1 << 20)) {
            PyErr_SetString(PyExc_ValueError, "a bit is out of range");
            goto done;
        }
        if (bits[i] > max_bit) max_bit = bits[i];
    }
    Py_ssize_t nbytes = (Py_ssize_t)(max_bit / 8 + 1);
    lows = malloc(sizeof(int64_t) * (k ? k : 1));
    buf = calloc((size_t)nbytes, 1);
    if (!lows || !buf) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < k; i++) {
        const char *why = NULL;
        int64_t base, lo;
        int32_t shift;
        int st = simulate(&tb, stack, height, t[i], &pushed, &base, &shift, &lo, &why);
        if (st < 0) { raise_for(st, why); goto done; }
        lows[i] = lo;
        if (st == TAKEN) buf[bits[i] / 8] |= (unsigned char)(1u << (bits[i] % 8));
    }
    taken = PyBytes_FromStringAndSize((const char *)buf, nbytes);
    levels = PyList_New(0);
    if (!taken || !levels) goto done;
    int64_t prev = INT64_MIN;
    for (;;) {  /* the distinct lows, ascending (k is small) */
        int64_t cur = INT64_MAX;
        for (Py_ssize_t i = 0; i < k; i++)
            if (lows[i] > prev && lows[i] < cur) cur = lows[i];
        if (cur == INT64_MAX) break;
        memset(buf, 0, (size_t)nbytes);
        for (Py_ssize_t i = 0; i < k; i++)
            if (lows[i] == cur) buf[bits[i] / 8] |= (unsigned char)(1u << (bits[i] % 8));
        PyObject *pair = Py_BuildValue("Ly#", (long long)cur, (const char *)buf, nbytes);
        if (!pair || PyList_Append(levels, pair) < 0) { Py_XDECREF(pair); goto done; }
        Py_DECREF(pair);
        prev = cur;
    }
    result = PyTuple_Pack(2, taken, levels);
done:
    Py_XDECREF(taken);
    Py_XDECREF(levels);
    free(lows);
    free(buf);
    scratch_free(&pushed);
    Py_XDECREF(terms);
    Py_XDECREF(bitsa);
    for (int k2 = 0; k2 < 6; k2++) Py_XDECREF(arr[k2]);
    return result;
}

PyDoc_STRVAR(find_doc,
"find(child, value, parent, state, stack, n_states) -> object | None\n\n"
"The value a signature trie (``lalr.Signatures``: dicts ``child`` {node * n_states +\n"
"LALR state: node} and ``value`` {node: value}) keeps for ``stack``: from the root, the\n"
"first node holding a value while descending along the stack's states from the top\n"
"(node ``s`` holds ``state[s]`` over ``parent[s]``); None when the path ends first.");

static PyObject *py_find(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *child, *value, *par_obj, *st_obj;
    long long stack, n_states;
    if (!PyArg_ParseTuple(args, "O!O!OOLL", &PyDict_Type, &child, &PyDict_Type, &value,
                          &par_obj, &st_obj, &stack, &n_states))
        return NULL;
    PyArrayObject *par = as_array(par_obj, NPY_INT64, 1, 0, "parent");
    PyArrayObject *sta = par ? as_array(st_obj, NPY_INT32, 1, 0, "state") : NULL;
    PyObject *result = NULL;
    if (!sta) goto done;
    Py_ssize_t n = PyArray_DIM(par, 0);
    if (PyArray_DIM(sta, 0) != n) {
        PyErr_SetString(PyExc_ValueError, "parent and state must have one entry per node");
        goto done;
    }
    if (n_states <= 0) {
        PyErr_SetString(PyExc_ValueError, "n_states must be positive");
        goto done;
    }
    const int64_t *parent = PyArray_DATA(par);
    const int32_t *state = PyArray_DATA(sta);
    long long node = 0, s = stack;
    for (;;) {
        PyObject *key = PyLong_FromLongLong(node);
        if (!key) goto done;
        PyObject *got = PyDict_GetItemWithError(value, key);  /* borrowed */
        Py_DECREF(key);
        if (got) { Py_INCREF(got); result = got; goto done; }
        if (PyErr_Occurred()) goto done;
        if (s < 0) break;
        if (s >= n) {
            PyErr_SetString(PyExc_ValueError, "the stack node is out of range");
            goto done;
        }
        long long st = state[s];
        s = parent[s];
        key = PyLong_FromLongLong(node * n_states + st);
        if (!key) goto done;
        PyObject *nxt = PyDict_GetItemWithError(child, key);  /* borrowed */
        Py_DECREF(key);
        if (!nxt) {
            if (PyErr_Occurred()) goto done;
            break;
        }
        node = PyLong_AsLongLong(nxt);
        if (node == -1 && PyErr_Occurred()) goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(par);
    Py_XDECREF(sta);
    return result;
}

static PyMethodDef methods[] = {
    {"feed", py_feed, METH_VARARGS, feed_doc},
    {"takes", py_takes, METH_VARARGS, takes_doc},
    {"find", py_find, METH_VARARGS, find_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "lalr_sim",
    "LALR(1) reductions over array stacks (twin in structspec.automata.lalr).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_lalr_sim(void) {
    import_array();
    return PyModule_Create(&module);
}
