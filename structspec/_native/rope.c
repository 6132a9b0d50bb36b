/* Rotary position embeddings for the query and key states of one attention call, bitwise
 * what transformers' apply_rotary_pos_emb computes.
 *
 * Why by hand: transformers applies them as `q * cos + rotate_half(q) * sin` (and the same
 * for k): two slices, a negation, a concatenation, two products and a sum per tensor, ten
 * operators whose dispatch cost ~42 us per layer on a one-node pass here (1.3 ms of a ~15 ms
 * pass, ~4 ms of a 75-token prompt's). One call does both tensors in a few microseconds.
 *
 * Bitwise: with h = d/2, rotate_half(x)[i] = -x[i+h] and rotate_half(x)[i+h] = x[i], and
 * torch rounds each product and the sum separately, so
 *   out[i]   = (x[i] * cos[i])     - (x[i+h] * sin[i])
 *   out[i+h] = (x[i+h] * cos[i+h]) + (x[i] * sin[i+h])
 * with a product, a product, then a sum — never fused into an FMA (fp-contract off below).
 * Each element sees the same operations in any pass: speculation stays lossless, and
 * tests/test_rope_native.py checks equality with transformers' function.
 */
#pragma GCC optimize("fp-contract=off")
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RP_X86 1
#include <immintrin.h>
#else
#define RP_X86 0
#endif

#if RP_X86
/* x [heads, rows, d] at strides (sh, sr), cos/sin [rows, d] at stride sc, out likewise at
 * (oh, or); d even (vectors of 8, then one at a time). */
__attribute__((target("avx2"))) static void rotate(const float *x, Py_ssize_t heads,
                                                   Py_ssize_t rows, Py_ssize_t d,
                                                   Py_ssize_t sh, Py_ssize_t sr,
                                                   const float *cos, const float *sin,
                                                   Py_ssize_t sc, float *out, Py_ssize_t oh,
                                                   Py_ssize_t orr) {
    Py_ssize_t h = d / 2;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *c = cos + r * sc, *s = sin + r * sc;
        for (Py_ssize_t a = 0; a < heads; a++) {
            const float *xr = x + a * sh + r * sr;
            float *o = out + a * oh + r * orr;
            Py_ssize_t i = 0;
            for (; i + 8 <= h; i += 8) {
                __m256 lo = _mm256_loadu_ps(xr + i), hi = _mm256_loadu_ps(xr + h + i);
                __m256 p = _mm256_mul_ps(lo, _mm256_loadu_ps(c + i));
                __m256 m = _mm256_mul_ps(hi, _mm256_loadu_ps(s + i));
                _mm256_storeu_ps(o + i, _mm256_sub_ps(p, m));
                __m256 p2 = _mm256_mul_ps(hi, _mm256_loadu_ps(c + h + i));
                __m256 m2 = _mm256_mul_ps(lo, _mm256_loadu_ps(s + h + i));
                _mm256_storeu_ps(o + h + i, _mm256_add_ps(p2, m2));
            }
            for (; i < h; i++) { /* the same roundings, one element at a time */
                float p = xr[i] * c[i], m = xr[h + i] * s[i];
                o[i] = p - m;
                float p2 = xr[h + i] * c[h + i], m2 = xr[i] * s[h + i];
                o[h + i] = p2 + m2;
            }
        }
    }
}
#endif

static int cpu_ok(void) {
#if RP_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static PyObject *rp_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_ok());
}

/* rotate(x, heads, rows, d, sh, sr, cos, sin, sc, out, oh, or): one tensor (pointers as
 * integers, strides in floats; the innermost stride 1). */
static PyObject *rp_rotate(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long xp, cp, sp, op;
    Py_ssize_t heads, rows, d, sh, sr, sc, oh, orr;
    if (!PyArg_ParseTuple(args, "KnnnnnKKnKnn", &xp, &heads, &rows, &d, &sh, &sr, &cp, &sp,
                          &sc, &op, &oh, &orr))
        return NULL;
    if (heads < 0 || rows < 0 || d <= 0 || d % 2 != 0) {
        PyErr_SetString(PyExc_ValueError, "rotate: bad shape (an even head size)");
        return NULL;
    }
#if RP_X86
    if (!cpu_ok()) {
        PyErr_SetString(PyExc_RuntimeError, "rotate needs an x86-64 CPU with AVX2");
        return NULL;
    }
    rotate((const float *)(uintptr_t)xp, heads, rows, d, sh, sr, (const float *)(uintptr_t)cp,
           (const float *)(uintptr_t)sp, sc, (float *)(uintptr_t)op, oh, orr);
    Py_RETURN_NONE;
#else
    (void)xp; (void)cp; (void)sp; (void)op; (void)sh; (void)sr; (void)sc; (void)oh; (void)orr;
    PyErr_SetString(PyExc_RuntimeError, "rotate is built for x86-64 only");
    return NULL;
#endif
}

static PyMethodDef METHODS[] = {
    {"available", rp_available, METH_NOARGS, "Whether rotate runs on this CPU."},
    {"rotate", rp_rotate, METH_VARARGS, "Rotary embedding of one [heads, rows, d] tensor."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "rope",
                                    "Rotary position embeddings, bitwise transformers'.", -1,
                                    METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_rope(void) { return PyModule_Create(&MODULE); }
