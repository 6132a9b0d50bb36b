/*
 * bitset: token ids -> packed mask words (twin: TokenMask.from_ids's NumPy path in
 * structspec/automata/base.py, a bool array packed with np.packbits).
 *
 * Bit i % 32 of word i / 32 is set for each id i (little-endian bit order, the layout of
 * TokenMask, xgrammar and llguidance). Ids are bounds-checked; the loop runs without the
 * GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>

PyDoc_STRVAR(pack_ids_doc,
"pack_ids(ids, size) -> words\n\n"
"The mask words (uint32 [ceil(size / 32)]) with the bits of ``ids`` (a C-contiguous int64\n"
"array, each in range(size)) set. Raises TypeError (dtype/layout) or ValueError (an id\n"
"out of range).");

static PyObject *py_pack_ids(PyObject *self, PyObject *args) {
    PyObject *o_ids;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "On", &o_ids, &size)) return NULL;
    if (!PyArray_Check(o_ids)) {
        PyErr_SetString(PyExc_TypeError, "ids must be a numpy array");
        return NULL;
    }
    PyArrayObject *ids = (PyArrayObject *)o_ids;
    if (PyArray_TYPE(ids) != NPY_INT64 || PyArray_NDIM(ids) != 1 ||
        !PyArray_IS_C_CONTIGUOUS(ids) || !PyArray_ISALIGNED(ids)) {
        PyErr_SetString(PyExc_TypeError, "ids must be a C-contiguous 1-d int64 array");
        return NULL;
    }
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "size must be >= 0");
        return NULL;
    }
    npy_intp n_words = (npy_intp)((size + 31) / 32);
    PyObject *words = PyArray_ZEROS(1, &n_words, NPY_UINT32, 0);
    if (!words) return NULL;
    uint32_t *w = (uint32_t *)PyArray_DATA((PyArrayObject *)words);
    const int64_t *id = (const int64_t *)PyArray_DATA(ids);
    Py_ssize_t n = PyArray_DIM(ids, 0);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t t = id[i];
        if (t < 0 || t >= size) {
            bad = 1;
            break;
        }
        w[t >> 5] |= (uint32_t)1 << (t & 31);
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        Py_DECREF(words);
        PyErr_SetString(PyExc_ValueError, "token id outside the vocabulary");
        return NULL;
    }
    return words;
}

static PyMethodDef methods[] = {
    {"pack_ids", py_pack_ids, METH_VARARGS, pack_ids_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bitset", "Token ids -> packed mask words (twin: TokenMask.from_ids).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_bitset(void) {
    import_array();
    return PyModule_Create(&module);
}
