/* A draft head's step and its level's choices, each in one native call.
 *
 * Why by hand: the draft head (structspec/spec/draft_head.py) runs right after each
 * verification pass, which has streamed ~130 MB of weights through the caches and evicted
 * everything else — the head's weights, but also the code and data of every torch operator.
 * Measured on the Zen 4 of session 62 (one thread, caches evicted before each call), a step
 * as torch operators (stack, norm, scale, two integer linears, SiLU, residual) took 184 us
 * where its two linears took 148 of it, and a level's choices (log-softmax, top-k, two
 * conversions to lists) 60-104 us for ~10 us of arithmetic: each cold operator call costs
 * 15-40 us of dispatch. Here a step is one call around qdot's integer linear (reached
 * through its capsule, so both run the same kernels), and a level's choices one pass over the
 * logits.
 *
 * Numbers: the head's numbers only rank drafts (every drafted token is verified by the
 * target), so these need not match torch's bit for bit; they match them to float rounding
 * (tests compare both). The norm sums in double; exp is attend.c's vector polynomial
 * (vexp.h, ~1 ulp) where AVX2 runs, expf elsewhere.
 *
 *     step(s, e, m, h, normw, eps, fc1, d, b1, sgn1, narrow1, fc2, b2, sgn2, narrow2, out,
 *          threads):
 *         z = [rmsnorm(s) * normw[0], rmsnorm(e) * normw[1]]      (m x 2h)
 *         out = s + fc2(silu(fc1(z)))                             (m x h)
 *     top(x, m, h, packed, vr, sgn, narrow, k, threads) -> (logps, ids):
 *         per row of logits = x W^T (vr columns): its k largest, as log-softmax values
 *         (descending; ties to the lower id) and their column ids, as lists of lists.
 *
 * Pointers are passed as integers (tensor data_ptr()), as qdot's are; shapes are checked,
 * the memory behind them is the caller's to keep alive.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qdot_api.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HS_X86 1
#include <immintrin.h>

#include "vexp.h"
#else
#define HS_X86 0
#endif

#define TOP_MAX 64

static const QdotLinearAPI *qd = NULL;

#if HS_X86
/* attend.c's vector exp (vexp.h): inputs clamped to [-87.34, 88.38]. */
EXP_FN(exp8, "avx2,fma", __m256, __m256i, _mm256, _mm256_round_ps, _mm256_castsi256_ps)

/* v = v / (1 + exp(-v)), n floats in place. */
__attribute__((target("avx2,fma"))) static void silu_avx2(float *v, Py_ssize_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        __m256 t = exp8(_mm256_sub_ps(zero, x));
        _mm256_storeu_ps(v + i, _mm256_div_ps(x, _mm256_add_ps(one, t)));
    }
    for (; i < n; i++) v[i] = v[i] / (1.0f + expf(-v[i]));
}

/* sum of exp(row[j] - mx) over n floats. */
__attribute__((target("avx2,fma"))) static double sum_exp_avx2(const float *row, Py_ssize_t n,
                                                               float mx) {
    const __m256 m8 = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), m8)));
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += lanes[j];
    for (; i < n; i++) s += expf(row[i] - mx);
    return s;
}
#endif

static void silu(float *v, Py_ssize_t n) {
#if HS_X86
    silu_avx2(v, n);
#else
    for (Py_ssize_t i = 0; i < n; i++) v[i] = v[i] / (1.0f + expf(-v[i]));
#endif
}

static double sum_exp(const float *row, Py_ssize_t n, float mx) {
#if HS_X86
    return sum_exp_avx2(row, n, mx);
#else
    double s = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) s += expf(row[i] - mx);
    return s;
#endif
}

/* dst = src / sqrt(mean(src^2) + eps) * w, h floats. */
static void rms_norm(const float *src, const float *w, float eps, Py_ssize_t h, float *dst) {
    double ss = 0.0;
    for (Py_ssize_t i = 0; i < h; i++) ss += (double)src[i] * src[i];
    float inv = (float)(1.0 / sqrt(ss / (double)h + (double)eps));
    for (Py_ssize_t i = 0; i < h; i++) dst[i] = src[i] * inv * w[i];
}

static int ready(void) {
    if (qd == NULL || !qd->ok()) {
        PyErr_SetString(PyExc_RuntimeError, "headstep needs qdot's integer kernels (AVX2)");
        return 0;
    }
    return 1;
}

static PyObject *hs_available(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyBool_FromLong(qd != NULL && qd->ok());
}

static PyObject *hs_step(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long s, e, normw, fc1, b1, fc2, b2, out;
    Py_ssize_t m, h, d;
    float eps;
    int sgn1, narrow1, sgn2, narrow2, threads;
    if (!PyArg_ParseTuple(args, "KKnnKfKnKppKKppKi", &s, &e, &m, &h, &normw, &eps, &fc1, &d,
                          &b1, &sgn1, &narrow1, &fc2, &b2, &sgn2, &narrow2, &out, &threads))
        return NULL;
    if (!ready()) return NULL;
    if (m < 0 || h <= 0 || d <= 0 || h % 32 || d % 32) {
        PyErr_Format(PyExc_ValueError, "step: need m >= 0 and h, d positive multiples of 32, "
                     "got m=%zd h=%zd d=%zd", m, h, d);
        return NULL;
    }
    if (m == 0) Py_RETURN_NONE;
    const float *sp = (const float *)(uintptr_t)s, *ep = (const float *)(uintptr_t)e;
    const float *wn = (const float *)(uintptr_t)normw;
    float *op = (float *)(uintptr_t)out;
    int rc = -1;
    Py_BEGIN_ALLOW_THREADS
    float *z = malloc(sizeof(float) * (size_t)(m * 2 * h + m * d));
    if (z != NULL) {
        float *hid = z + m * 2 * h;
        for (Py_ssize_t r = 0; r < m; r++) {
            rms_norm(sp + r * h, wn, eps, h, z + r * 2 * h);
            rms_norm(ep + r * h, wn + h, eps, h, z + r * 2 * h + h);
        }
        rc = qd->linear(z, m, 2 * h, (const uint8_t *)(uintptr_t)fc1, d,
                        b1 ? (const float *)(uintptr_t)b1 : NULL, hid, threads, sgn1, narrow1);
        if (rc == 0) {
            silu(hid, m * d);
            rc = qd->linear(hid, m, d, (const uint8_t *)(uintptr_t)fc2, h,
                            b2 ? (const float *)(uintptr_t)b2 : NULL, op, threads, sgn2,
                            narrow2);
        }
        if (rc == 0)
            for (Py_ssize_t i = 0; i < m * h; i++) op[i] += sp[i];
        free(z);
    }
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* The k largest of row[0..n) into val/idx, descending, ties to the lower index; NaN
 * skipped. Returns how many were found (< k only when n < k). */
static int top_of(const float *row, Py_ssize_t n, int k, float *val, int *idx) {
    int cnt = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        float v = row[j];
        if (cnt == k && !(v > val[k - 1])) continue;  /* the common case, and NaN */
        if (v != v) continue;
        int p = cnt < k ? cnt++ : k - 1;
        while (p > 0 && val[p - 1] < v) {
            val[p] = val[p - 1];
            idx[p] = idx[p - 1];
            p--;
        }
        val[p] = v;
        idx[p] = (int)j;
    }
    return cnt;
}

static PyObject *hs_top(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, packed;
    Py_ssize_t m, h, vr;
    int sgn, narrow, k, threads;
    if (!PyArg_ParseTuple(args, "KnnKnppii", &x, &m, &h, &packed, &vr, &sgn, &narrow, &k,
                          &threads))
        return NULL;
    if (!ready()) return NULL;
    if (m < 0 || h <= 0 || h % 32 || vr <= 0 || k < 1 || k > TOP_MAX) {
        PyErr_Format(PyExc_ValueError, "top: need m >= 0, h a positive multiple of 32, vr > 0 "
                     "and 1 <= k <= %d, got m=%zd h=%zd vr=%zd k=%d", TOP_MAX, m, h, vr, k);
        return NULL;
    }
    float *logits = malloc(sizeof(float) * (size_t)(m * vr) + 1);
    float *val = malloc(sizeof(float) * (size_t)(m * k) + 1);
    int *idx = malloc(sizeof(int) * (size_t)(m * k) + 1);
    int *cnt = malloc(sizeof(int) * (size_t)m + 1);
    double *lse = malloc(sizeof(double) * (size_t)m + 1);
    int rc = -1;
    if (logits != NULL && val != NULL && idx != NULL && cnt != NULL && lse != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = qd->linear((const float *)(uintptr_t)x, m, h, (const uint8_t *)(uintptr_t)packed,
                        vr, NULL, logits, threads, sgn, narrow);
        if (rc == 0)
            for (Py_ssize_t r = 0; r < m; r++) {
                const float *row = logits + r * vr;
                cnt[r] = top_of(row, vr, k, val + r * k, idx + r * k);
                float mx = cnt[r] ? val[r * k] : 0.0f;
                lse[r] = isfinite(mx) ? (double)mx + log(sum_exp(row, vr, mx)) : (double)mx;
            }
        Py_END_ALLOW_THREADS
    }
    PyObject *res = NULL;
    if (rc == 0) {
        PyObject *vals = PyList_New(m), *ids = PyList_New(m);
        int bad = vals == NULL || ids == NULL;
        for (Py_ssize_t r = 0; r < m && !bad; r++) {
            PyObject *vrow = PyList_New(cnt[r]), *irow = PyList_New(cnt[r]);
            if (vrow != NULL) PyList_SET_ITEM(vals, r, vrow);
            if (irow != NULL) PyList_SET_ITEM(ids, r, irow);
            bad = vrow == NULL || irow == NULL;
            for (int j = 0; j < cnt[r] && !bad; j++) {
                PyObject *fv = PyFloat_FromDouble((double)val[r * k + j] - lse[r]);
                PyObject *iv = PyLong_FromLong(idx[r * k + j]);
                if (fv != NULL) PyList_SET_ITEM(vrow, j, fv);
                if (iv != NULL) PyList_SET_ITEM(irow, j, iv);
                bad = fv == NULL || iv == NULL;
            }
        }
        if (!bad) res = PyTuple_Pack(2, vals, ids);
        Py_XDECREF(vals);
        Py_XDECREF(ids);
    } else {
        PyErr_NoMemory();
    }
    free(logits);
    free(val);
    free(idx);
    free(cnt);
    free(lse);
    return res;
}

static PyMethodDef METHODS[] = {
    {"available", hs_available, METH_NOARGS,
     "available(): whether qdot's integer kernels run here (what step and top call)."},
    {"step", hs_step, METH_VARARGS,
     "step(s, e, m, h, normw, eps, fc1, d, b1, sgn1, narrow1, fc2, b2, sgn2, narrow2, out, "
     "threads): out = s + fc2(silu(fc1([norm(s)*w0, norm(e)*w1]))) on integer panels."},
    {"top", hs_top, METH_VARARGS,
     "top(x, m, h, packed, vr, sgn, narrow, k, threads) -> (logps, ids): each row's k "
     "likeliest columns of x W^T as log-softmax values, descending."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "headstep",
                                    "A draft head's step and level choices in one call each.",
                                    -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_headstep(void) {
    PyObject *mod = PyModule_Create(&MODULE);
    if (mod == NULL) return NULL;
    /* qdot built without x86 kernels has no capsule: the module loads, available() is false */
    /* (PyCapsule_Import walks attributes past the first name: qdot must be imported first) */
    PyObject *qdot = PyImport_ImportModule("structspec._native.qdot");
    if (qdot != NULL)
        qd = (const QdotLinearAPI *)PyCapsule_Import("structspec._native.qdot._linear", 0);
    Py_XDECREF(qdot);
    if (qd == NULL) PyErr_Clear();
    return mod;
}
