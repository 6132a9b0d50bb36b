/* Compaction of a key-value cache to a verified tree's accepted path, all layers in one call.
 *
 * Why by hand: after every speculative pass the cache keeps the accepted path's rows and
 * drops the rest of the tree (structspec/spec/verify.py keep_path). In torch that is a
 * gather and a copy per key and value tensor of every layer — ~240 operator calls on the
 * default model, ~0.3 ms a pass on one CPU thread, for a few kilobytes of rows. Here it is
 * one loop of row copies.
 *
 * keep_rows(ptrs, heads, head_stride, row_bytes, past, nodes): for every tensor base pointer
 * in ptrs (each [heads, L, D] rows of row_bytes bytes, heads head_stride bytes apart), row
 * past + i takes row past + nodes[i], for i = 0, 1, ... in order. nodes ascends with
 * nodes[i] >= i, so a row is read before anything overwrites it (a destination i < j never
 * equals a later source nodes[j] >= j > i). Rows where nodes[i] == i are left alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The longest path keep_rows takes (its index buffer; trees are far shorter). Exported as
 * MAX_PATH: longer paths take keep_path's torch route. */
#define KV_MAX_PATH 4096

static PyObject *kv_keep_rows(PyObject *self, PyObject *args) {
    PyObject *ptrs_obj, *nodes_obj;
    Py_ssize_t heads, head_stride, row_bytes, past;
    if (!PyArg_ParseTuple(args, "OnnnnO", &ptrs_obj, &heads, &head_stride, &row_bytes, &past,
                          &nodes_obj))
        return NULL;
    PyObject *ptrs = PySequence_Fast(ptrs_obj, "ptrs must be a sequence of ints");
    if (ptrs == NULL) return NULL;
    PyObject *nodes = PySequence_Fast(nodes_obj, "nodes must be a sequence of ints");
    if (nodes == NULL) {
        Py_DECREF(ptrs);
        return NULL;
    }
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(ptrs), k = PySequence_Fast_GET_SIZE(nodes);
    if (heads < 1 || head_stride < 0 || row_bytes < 1 || past < 0 || k > KV_MAX_PATH) {
        PyErr_SetString(PyExc_ValueError, "keep_rows: bad sizes");
        goto fail;
    }
    Py_ssize_t idx[KV_MAX_PATH];
    for (Py_ssize_t i = 0; i < k; i++) {
        idx[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(nodes, i));
        if (idx[i] == -1 && PyErr_Occurred()) goto fail;
        if (idx[i] < i || (i && idx[i] <= idx[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "keep_rows: nodes must ascend with nodes[i] >= i");
            goto fail;
        }
    }
    for (Py_ssize_t t = 0; t < nt; t++) {
        void *p = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(ptrs, t));
        if (p == NULL && PyErr_Occurred()) goto fail;
        char *base = (char *)p;
        for (Py_ssize_t h = 0; h < heads; h++) {
            char *head = base + h * head_stride;
            for (Py_ssize_t i = 0; i < k; i++)
                if (idx[i] != i)
                    memcpy(head + (past + i) * row_bytes, head + (past + idx[i]) * row_bytes,
                           (size_t)row_bytes);
        }
    }
    Py_DECREF(ptrs);
    Py_DECREF(nodes);
    Py_RETURN_NONE;
fail:
    Py_DECREF(ptrs);
    Py_DECREF(nodes);
    return NULL;
}

static PyMethodDef methods[] = {
    {"keep_rows", kv_keep_rows, METH_VARARGS,
     "keep_rows(ptrs, heads, head_stride, row_bytes, past, nodes): row past+i of each "
     "tensor takes row past+nodes[i] (see kvmove.c)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvmove",
                                    "Key-value cache compaction to an accepted path.", -1,
                                    methods};

PyMODINIT_FUNC PyInit_kvmove(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_PATH", KV_MAX_PATH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
