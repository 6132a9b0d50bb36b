/* Small-M float32 linear layers (y = x W^T + b) for passes of a few rows, AVX2 + FMA.
 *
 * Why by hand: a verification pass of a draft tree is a GEMM of 1-32 rows against every
 * weight matrix of the model. oneDNN and MKL tune for large M: on AVX2 machines a 4-row
 * pass costs ~1.3x a 1-row pass in the linears although both are bound by reading the
 * weights once, and that cost curve decides how much speculation pays on a CPU.
 *
 * Layout: the weight (N x K, torch's out x in) is packed once into panels of 16 output
 * columns, each panel K rows of 16 floats (k-major), zero-padded past N. A pass streams
 * each panel once from memory and keeps it in L2 while up to 6 rows of x are multiplied
 * against it (6 x 2 ymm accumulators).
 *
 * Row independence: every output element is acc = fma(x[m,k], w[k,n], acc) for k = 0..K-1
 * in order, then acc + bias[n], whatever M is and whichever row block computes it, so a
 * row's result is bitwise the same in a pass of 1 row and a pass of 32: speculative and
 * plain decoding see the same numbers from these layers.
 *
 * Threads: OpenMP over panels, with the count the caller passes (torch.get_num_threads()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SG_X86 1
#include <immintrin.h>
#else
#define SG_X86 0
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 16
#define ROWS 6

static Py_ssize_t panels_of(Py_ssize_t n) { return (n + PANEL - 1) / PANEL; }

/* Pack W (n x k, row-major) into panels: dst[p][kk][j] = W[p*16 + j][kk] (0 past n). */
static void pack_weight(float *dst, const float *w, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t np = panels_of(n);
    for (Py_ssize_t p = 0; p < np; p++) {
        float *panel = dst + p * k * PANEL;
        for (Py_ssize_t kk = 0; kk < k; kk++) {
            for (Py_ssize_t j = 0; j < PANEL; j++) {
                Py_ssize_t col = p * PANEL + j;
                panel[kk * PANEL + j] = col < n ? w[col * k + kk] : 0.0f;
            }
        }
    }
}

#if SG_X86
/* One row block (R rows) against one panel, for R = 1..6. Accumulators are named
 * variables (arrays of __m256 get spilled to the stack on every iteration by GCC);
 * the NR > i tests fold away at compile time. */
#define SG_FMA(i)                                                                          \
    if (NR > i) {                                                                          \
        __m256 xv = _mm256_broadcast_ss(x + i * k + kk);                                  \
        lo##i = _mm256_fmadd_ps(xv, w0, lo##i);                                           \
        hi##i = _mm256_fmadd_ps(xv, w1, hi##i);                                           \
    }
#define SG_STORE(i)                                                                        \
    if (NR > i) store_row(out + i * ldo, _mm256_add_ps(lo##i, b0), _mm256_add_ps(hi##i, b1), cols);
#define SG_KERNEL(R)                                                                      \
    __attribute__((target("avx2,fma"))) static void kernel_##R(                           \
        const float *x, Py_ssize_t k, const float *panel, const float *bias16,            \
        float *out, Py_ssize_t ldo, Py_ssize_t cols) {                                    \
        enum { NR = R };                                                                  \
        __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0,     \
               hi2 = lo0, lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0; \
        for (Py_ssize_t kk = 0; kk < k; kk++) {                                           \
            __m256 w0 = _mm256_loadu_ps(panel + kk * PANEL);                              \
            __m256 w1 = _mm256_loadu_ps(panel + kk * PANEL + 8);                          \
            SG_FMA(0) SG_FMA(1) SG_FMA(2) SG_FMA(3) SG_FMA(4) SG_FMA(5)                   \
        }                                                                                 \
        __m256 b0 = _mm256_loadu_ps(bias16), b1 = _mm256_loadu_ps(bias16 + 8);            \
        SG_STORE(0) SG_STORE(1) SG_STORE(2) SG_STORE(3) SG_STORE(4) SG_STORE(5)           \
    }

__attribute__((target("avx2,fma"))) static inline void store_row(float *dst, __m256 y0,
                                                                 __m256 y1, Py_ssize_t cols) {
    if (cols == PANEL) {
        _mm256_storeu_ps(dst, y0);
        _mm256_storeu_ps(dst + 8, y1);
    } else {
        float tmp[PANEL];
        _mm256_storeu_ps(tmp, y0);
        _mm256_storeu_ps(tmp + 8, y1);
        memcpy(dst, tmp, (size_t)cols * sizeof(float));
    }
}

SG_KERNEL(1)
SG_KERNEL(2)
SG_KERNEL(3)
SG_KERNEL(4)
SG_KERNEL(5)
SG_KERNEL(6)

typedef void (*kernel_fn)(const float *, Py_ssize_t, const float *, const float *, float *,
                          Py_ssize_t, Py_ssize_t);
static const kernel_fn KERNELS[ROWS + 1] = {NULL,     kernel_1, kernel_2, kernel_3,
                                            kernel_4, kernel_5, kernel_6};

static void run_linear(const float *x, Py_ssize_t m, Py_ssize_t k, const float *packed,
                       Py_ssize_t n, const float *bias, float *out, int threads) {
    Py_ssize_t np = panels_of(n);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && np > 1)
    for (Py_ssize_t p = 0; p < np; p++) {
        float bias16[PANEL];
        Py_ssize_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        for (Py_ssize_t j = 0; j < PANEL; j++)
            bias16[j] = (bias != NULL && j < cols) ? bias[p * PANEL + j] : 0.0f;
        const float *panel = packed + p * k * PANEL;
        for (Py_ssize_t m0 = 0; m0 < m; m0 += ROWS) {
            Py_ssize_t rows = m - m0 < ROWS ? m - m0 : ROWS;
            KERNELS[rows](x + m0 * k, k, panel, bias16, out + m0 * n + p * PANEL, n, cols);
        }
    }
}
#endif

static int cpu_ok(void) {
#if SG_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static PyObject *sg_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_ok());
}

static PyObject *sg_packed_size(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "nn", &n, &k)) return NULL;
    return PyLong_FromSsize_t(panels_of(n) * k * PANEL);
}

/* pack(dst_ptr, w_ptr, n, k): dst must hold packed_size(n, k) floats. */
static PyObject *sg_pack(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst, w;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "KKnn", &dst, &w, &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "pack: n and k must be positive");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pack_weight((float *)(uintptr_t)dst, (const float *)(uintptr_t)w, n, k);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* linear(x_ptr, m, k, packed_ptr, n, bias_ptr or 0, out_ptr, threads). */
static PyObject *sg_linear(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, packed, bias, out;
    Py_ssize_t m, k, n;
    int threads;
    if (!PyArg_ParseTuple(args, "KnnKnKKi", &x, &m, &k, &packed, &n, &bias, &out, &threads))
        return NULL;
    if (m < 0 || k <= 0 || n <= 0) {
        PyErr_SetString(PyExc_ValueError, "linear: bad shape");
        return NULL;
    }
#if SG_X86
    if (!cpu_ok()) {
        PyErr_SetString(PyExc_RuntimeError, "smallgemm needs a CPU with AVX2 and FMA");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    run_linear((const float *)(uintptr_t)x, m, k, (const float *)(uintptr_t)packed, n,
               bias ? (const float *)(uintptr_t)bias : NULL, (float *)(uintptr_t)out,
               threads < 1 ? 1 : threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    (void)x; (void)packed; (void)bias; (void)out; (void)threads;
    PyErr_SetString(PyExc_RuntimeError, "smallgemm is built for x86-64 only");
    return NULL;
#endif
}

static PyMethodDef METHODS[] = {
    {"available", sg_available, METH_NOARGS, "Whether this CPU runs the kernel (AVX2 + FMA)."},
    {"packed_size", sg_packed_size, METH_VARARGS, "Floats needed to pack an n x k weight."},
    {"pack", sg_pack, METH_VARARGS, "pack(dst_ptr, w_ptr, n, k): pack a weight into panels."},
    {"linear", sg_linear, METH_VARARGS,
     "linear(x_ptr, m, k, packed_ptr, n, bias_ptr, out_ptr, threads): out = x W^T + b."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "smallgemm",
                                    "Small-M float32 linear layers (AVX2 + FMA).", -1, METHODS};

PyMODINIT_FUNC PyInit_smallgemm(void) { return PyModule_Create(&MODULE); }
