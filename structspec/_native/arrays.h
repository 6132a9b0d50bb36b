/* Argument checks shared by the kernels: every array crossing the boundary is validated
 * here (dtype, dimensions, layout) and never copied. Include after <Python.h> and
 * <numpy/arrayobject.h>. */
#ifndef STRUCTSPEC_NATIVE_ARRAYS_H
#define STRUCTSPEC_NATIVE_ARRAYS_H

static const char *type_name(int type) {
    switch (type) {
    case NPY_INT8: return "int8";
    case NPY_INT32: return "int32";
    case NPY_INT64: return "int64";
    case NPY_UINT64: return "uint64";
    case NPY_UINT8: return "uint8";
    case NPY_BOOL: return "bool";
    default: return "?";
    }
}

/* ``obj`` as an aligned, C-contiguous array of ``type`` with ``ndim`` dimensions (a new
 * reference), writable when ``write``. No copy: a wrong dtype or layout is a TypeError. */
static PyArrayObject *as_array(PyObject *obj, int type, int ndim, int write, const char *name) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy array", name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != ndim || !PyArray_IS_C_CONTIGUOUS(a) ||
        !PyArray_ISALIGNED(a) || (write && !PyArray_ISWRITEABLE(a))) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s %d-d %s array", name,
                     write ? ", writable" : "", ndim, type_name(type));
        return NULL;
    }
    Py_INCREF(a);
    return a;
}

#endif
