/* A prompt's rows through the body's linear layers, on integer blocks of 64 (AVX-512 VNNI).
 *
 * Why by hand: a request's prompt (~100-160 tokens for a function call or a code prefix) is
 * one pass that both decoding modes pay before their first token, a third of a speculative
 * JSON request on this project's CPU. Its linears run qdot's integer kernels, whose numbers
 * must be a row's whatever the pass (speculation's tree rows ride on the same kernels), and
 * whose blocks of 32 are the weights' own (GGUF Q4_1: a scale and an offset per 32 inputs).
 * Each such block ends in a float epilogue per row and 16 outputs (convert, scale, two FMAs)
 * beside 8 dot-product instructions: on a Zen 4, a third of a prompt's linear time. A prompt's
 * rows need no such kinship with other passes' rows — plain and speculative decoding both
 * send every prompt row, and only prompt rows, through this path — so here the weights are
 * rounded once more, to int8 per 64 inputs and output (symmetric: no offset), and the
 * activations per 64 as well: one epilogue per 64 inputs. Measured in a stand-alone kernel
 * (6 rows x 32 outputs, k = 576, Zen 4, one thread): 169 G multiply-adds/s on the blocks of
 * 32 with offsets, 206 on these. The default model's answers, session 63: BFCL dev calls
 * right 110/250 with this path, 111/250 without.
 *
 * Numbers: per row and 64-block of inputs, a = round(x * 127 / max|x|) in -127..127 (ties to
 * even), fed as a + 128 (bytes 0..255: vpdpbusd wants its unsigned operand first); per output
 * and 64-block, w = round(w * 127 / max|w|). Each block's integer sum, less 128 * (the block's
 * sum of weights), times (scale_w * scale_x) is added to the output in block order, then the
 * bias: a row's numbers depend on that row alone, whatever the pass.
 *
 *     packed_bytes(n, k) -> bytes for an n x k weight (k a multiple of 64)
 *     pack(dst, w, n, k[, vector]): round the float32 weight w (n x k, row-major) into dst
 *     linear(x, m, k, packed, n, bias, out, threads): out (m x n) = x (m x k) W^T + bias
 *
 * Pointers are integers (tensor data_ptr()); shapes are checked, the memory is the caller's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PD_X86 1
#include <immintrin.h>
#else
#define PD_X86 0
#endif

#define PANEL 16
#define PB 64                                                 /* inputs per block */
#define PBYTES (PB * PANEL + 2 * PANEL * (int)sizeof(float)) /* 1,152 bytes per block */
#define MAXR 6

static Py_ssize_t panels_of(Py_ssize_t n) { return (n + PANEL - 1) / PANEL; }

static Py_ssize_t packed_bytes(Py_ssize_t n, Py_ssize_t k) {
    return panels_of(n) * (k / PB) * PBYTES;
}

#if PD_X86

static int cpu_vnni(void) { /* as qdot.c asks (libgcc checks that the OS saves the state) */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

/* A block of 64 floats (a row's inputs, or an output's weights) rounded: t = round(v * 127 /
 * max|v|) in -127..127 (to nearest, ties even: the plain loop's lrintf), and the scale
 * max|v| / 127 (0 for a block of zeros, or one with an infinity or NaN). */
__attribute__((target("avx512f,avx512bw"))) static inline float round_block(const float *v,
                                                                             __m512i *t) {
    __m512 x[PB / 16], acc = _mm512_setzero_ps();
    for (int j = 0; j < PB / 16; j++) {
        x[j] = _mm512_loadu_ps(v + 16 * j);
        acc = _mm512_max_ps(_mm512_abs_ps(x[j]), acc); /* a NaN lane keeps acc */
    }
    float amax = _mm512_reduce_max_ps(acc);
    float inv = amax > 0.0f && isfinite(amax) ? 127.0f / amax : 0.0f;
    const __m512 sv = _mm512_set1_ps(inv);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int j = 0; j < PB / 16; j++)
        t[j] = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x[j], sv)),
                                                 lo), hi);
    return inv > 0.0f ? amax / 127.0f : 0.0f;
}

/* One row's block of 64: the bytes a + 128 and the scale (a block round_block gives scale 0
 * has bytes 128: its sum adds nothing). */
__attribute__((target("avx512f,avx512bw"))) static void quantize_block(const float *v,
                                                                       uint8_t *o, float *dx) {
    __m512i t[PB / 16];
    *dx = round_block(v, t);
    const __m512i off = _mm512_set1_epi32(128);
    for (int j = 0; j < PB / 16; j++)
        _mm_storeu_si128((__m128i *)(void *)(o + 16 * j),
                         _mm512_cvtepi32_epi8(_mm512_add_epi32(t[j], off)));
}

/* R rows (1..6) against two panels; accumulators as named variables (GCC spills arrays of
 * vectors). */
#define ROWS6(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define DECL(r) __m512 f##r##0 = _mm512_setzero_ps(), f##r##1 = f##r##0;
#define IZERO(r) __m512i i##r##0 = _mm512_setzero_si512(), i##r##1 = i##r##0;
#define DOT(r)                                                                             \
    if (NR > r) {                                                                          \
        int32_t v;                                                                         \
        memcpy(&v, xq + (r) * k + b * PB + g * 4, sizeof v);                               \
        __m512i xb = _mm512_set1_epi32(v);                                                 \
        i##r##0 = _mm512_dpbusd_epi32(i##r##0, xb, w0);                                    \
        i##r##1 = _mm512_dpbusd_epi32(i##r##1, xb, w1);                                    \
    }
#define SCALE(r)                                                                           \
    if (NR > r) {                                                                          \
        __m512 dxv = _mm512_set1_ps(dx[(r) * nb + b]);                                     \
        f##r##0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(i##r##0, c0)),       \
                                  _mm512_mul_ps(s0, dxv), f##r##0);                        \
        f##r##1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(i##r##1, c1)),       \
                                  _mm512_mul_ps(s1, dxv), f##r##1);                        \
    }
#define MASK(j)                                                                            \
    (cols >= ((j) + 1) * PANEL ? (__mmask16)0xFFFF                                         \
                               : (__mmask16)((1u << (cols - (j) * PANEL)) - 1))
#define STORE(r)                                                                           \
    if (NR > r) {                                                                          \
        float *o = out + (r) * ldo;                                                        \
        _mm512_mask_storeu_ps(o, MASK(0), _mm512_add_ps(f##r##0, b0));                     \
        if (cols > PANEL)                                                                  \
            _mm512_mask_storeu_ps(o + PANEL, MASK(1), _mm512_add_ps(f##r##1, b1));         \
    }
#define KERNEL(R)                                                                          \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void kp_##R(   \
        const uint8_t *xq, const float *dx, Py_ssize_t k, const uint8_t *p0,              \
        const uint8_t *p1, const float *bias32, float *out, Py_ssize_t ldo,               \
        Py_ssize_t cols) {                                                                \
        enum { NR = R };                                                                  \
        Py_ssize_t nb = k / PB;                                                           \
        ROWS6(DECL)                                                                       \
        for (Py_ssize_t b = 0; b < nb; b++) {                                             \
            const uint8_t *q0 = p0 + b * PBYTES, *q1 = p1 + b * PBYTES;                   \
            ROWS6(IZERO)                                                                  \
            for (int g = 0; g < PB / 4; g++) {                                            \
                __m512i w0 = _mm512_loadu_si512((const void *)(q0 + g * 4 * PANEL));      \
                __m512i w1 = _mm512_loadu_si512((const void *)(q1 + g * 4 * PANEL));      \
                ROWS6(DOT)                                                                \
            }                                                                             \
            const float *sc0 = (const float *)(const void *)(q0 + PB * PANEL);            \
            const float *sc1 = (const float *)(const void *)(q1 + PB * PANEL);            \
            __m512 s0 = _mm512_loadu_ps(sc0), s1 = _mm512_loadu_ps(sc1);                  \
            __m512i c0 = _mm512_loadu_si512((const void *)(sc0 + PANEL));                 \
            __m512i c1 = _mm512_loadu_si512((const void *)(sc1 + PANEL));                 \
            ROWS6(SCALE)                                                                  \
        }                                                                                 \
        __m512 b0 = _mm512_loadu_ps(bias32), b1 = _mm512_loadu_ps(bias32 + PANEL);        \
        ROWS6(STORE)                                                                      \
    }
KERNEL(1) KERNEL(2) KERNEL(3) KERNEL(4) KERNEL(5) KERNEL(6)

typedef void (*kernel_fn)(const uint8_t *, const float *, Py_ssize_t, const uint8_t *,
                          const uint8_t *, const float *, float *, Py_ssize_t, Py_ssize_t);
static const kernel_fn KERNELS[MAXR + 1] = {NULL, kp_1, kp_2, kp_3, kp_4, kp_5, kp_6};

/* out = x W^T + bias over m rows: the rows rounded (xq, dx: scratch the caller gives), then
 * panel pairs split over threads, each against every block of <= 6 rows. */
static void run(const float *x, Py_ssize_t m, Py_ssize_t k, const uint8_t *packed,
                Py_ssize_t n, const float *bias, float *out, int threads, uint8_t *xq,
                float *dx) {
    Py_ssize_t nb = k / PB, np = panels_of(n), pairs = (np + 1) / 2, pstride = nb * PBYTES;
    for (Py_ssize_t r = 0; r < m; r++)
        for (Py_ssize_t b = 0; b < nb; b++)
            quantize_block(x + r * k + b * PB, xq + r * k + b * PB, dx + r * nb + b);
    Py_ssize_t blocks = (m + MAXR - 1) / MAXR;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && pairs > 1)
    for (Py_ssize_t pi = 0; pi < pairs; pi++) {
        Py_ssize_t c0 = pi * 2 * PANEL, cols = n - c0 < 2 * PANEL ? n - c0 : 2 * PANEL;
        float bias32[2 * PANEL];
        for (Py_ssize_t j = 0; j < 2 * PANEL; j++)
            bias32[j] = bias != NULL && j < cols ? bias[c0 + j] : 0.0f;
        const uint8_t *p0 = packed + 2 * pi * pstride;
        const uint8_t *p1 = cols > PANEL ? p0 + pstride : p0;
        Py_ssize_t r0 = 0;
        for (Py_ssize_t blk = 0; blk < blocks; blk++) {
            Py_ssize_t rows = (m - r0) / (blocks - blk);
            KERNELS[rows](xq + r0 * k, dx + r0 * nb, k, p0, p1, bias32, out + r0 * n + c0, n,
                          cols);
            r0 += rows;
        }
    }
}

/* One output's block of pack with vectors: the same bytes, scale and sum as its plain loop
 * (the maximum of |w| does not depend on its order; w * inv and its rounding to nearest-even
 * are the scalar steps, one lane each): it runs over every weight at load (0.09 s
 * for the default model's 106 M, 0.47 s with the plain loop). */
__attribute__((target("avx512f,avx512bw"))) static void pack_block_avx512(
    const float *v, uint8_t *blk, Py_ssize_t j, float *scale, int32_t *corr) {
    __m512i t[PB / 16], sum = _mm512_setzero_si512();
    *scale = round_block(v, t);
    /* 4 inputs of this output per dword, dwords PANEL * 4 bytes apart */
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                            11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(4 * PANEL));
    uint8_t bytes[PB];
    for (int i = 0; i < PB / 16; i++) {
        sum = _mm512_add_epi32(sum, t[i]);
        _mm_storeu_si128((__m128i *)(void *)(bytes + 16 * i), _mm512_cvtepi32_epi8(t[i]));
    }
    _mm512_i32scatter_epi32(blk + j * 4, at, _mm512_loadu_si512((const void *)bytes), 1);
    *corr = 128 * _mm512_reduce_add_epi32(sum);
}

#endif /* PD_X86 */

static int vnni_state = -1; /* unknown, no, yes */

static int runs_here(void) {
#if PD_X86
    if (vnni_state < 0) vnni_state = cpu_vnni();
    return vnni_state;
#else
    return 0;
#endif
}

/* Per panel of 16 outputs and block of 64 inputs: the bytes in groups of 4 inputs x 16
 * outputs (what one vpdpbusd takes), then the 16 scales, then 128 * each output's sum of
 * bytes (int32). Outputs past n are zero. vector: the AVX-512 loop (the same bytes). */
static void pack(uint8_t *dst, const float *w, Py_ssize_t n, Py_ssize_t k, int vector) {
    Py_ssize_t np = panels_of(n), nb = k / PB;
    for (Py_ssize_t p = 0; p < np; p++)
        for (Py_ssize_t b = 0; b < nb; b++) {
            uint8_t *blk = dst + ((size_t)p * nb + b) * PBYTES;
            float *sc = (float *)(void *)(blk + PB * PANEL);
            int32_t *corr = (int32_t *)(void *)(sc + PANEL);
            for (Py_ssize_t j = 0; j < PANEL; j++) {
                Py_ssize_t col = p * PANEL + j;
                const float *v = col < n ? w + col * k + b * PB : NULL;
#if PD_X86
                if (v != NULL && vector) {
                    pack_block_avx512(v, blk, j, sc + j, corr + j);
                    continue;
                }
#endif
                float amax = 0.0f;
                for (int i = 0; v != NULL && i < PB; i++) amax = fmaxf(amax, fabsf(v[i]));
                float inv = amax > 0.0f && isfinite(amax) ? 127.0f / amax : 0.0f;
                int32_t sum = 0;
                for (int i = 0; i < PB; i++) {
                    long t = v == NULL ? 0 : lrintf(v[i] * inv);
                    t = t > 127 ? 127 : (t < -127 ? -127 : t);
                    blk[(i / 4) * (4 * PANEL) + j * 4 + (i % 4)] = (uint8_t)(int8_t)t;
                    sum += (int32_t)t;
                }
                sc[j] = inv > 0.0f ? amax / 127.0f : 0.0f;
                corr[j] = 128 * sum;
            }
        }
}

static int shape_ok(Py_ssize_t n, Py_ssize_t k) {
    if (n <= 0 || k <= 0 || k % PB != 0) {
        PyErr_Format(PyExc_ValueError,
                     "promptdot: need n > 0 and k a positive multiple of %d (n=%zd, k=%zd)",
                     PB, n, k);
        return 0;
    }
    return 1;
}

static PyObject *pd_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(runs_here());
}

static PyObject *pd_block(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(PB);
}

static PyObject *pd_packed_bytes(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "nn", &n, &k) || !shape_ok(n, k)) return NULL;
    return PyLong_FromSsize_t(packed_bytes(n, k));
}

static PyObject *pd_pack(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst, w;
    Py_ssize_t n, k;
    int vector = 1;
    if (!PyArg_ParseTuple(args, "KKnn|p", &dst, &w, &n, &k, &vector) || !shape_ok(n, k))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pack((uint8_t *)(uintptr_t)dst, (const float *)(uintptr_t)w, n, k, vector && runs_here());
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *pd_linear(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, packed, bias, out;
    Py_ssize_t m, k, n;
    int threads;
    if (!PyArg_ParseTuple(args, "KnnKnKKi", &x, &m, &k, &packed, &n, &bias, &out, &threads))
        return NULL;
    if (m < 0 || !shape_ok(n, k)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "promptdot: m < 0");
        return NULL;
    }
    if (!runs_here()) {
        PyErr_SetString(PyExc_RuntimeError, "promptdot needs a CPU with AVX-512 VNNI");
        return NULL;
    }
#if PD_X86
    if (m == 0) Py_RETURN_NONE;
    uint8_t *xq = malloc((size_t)m * k);
    float *dx = malloc((size_t)m * (k / PB) * sizeof(float));
    if (xq == NULL || dx == NULL) {
        free(xq);
        free(dx);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    run((const float *)(uintptr_t)x, m, k, (const uint8_t *)(uintptr_t)packed, n,
        bias ? (const float *)(uintptr_t)bias : NULL, (float *)(uintptr_t)out,
        threads < 1 ? 1 : threads, xq, dx);
    Py_END_ALLOW_THREADS
    free(xq);
    free(dx);
    Py_RETURN_NONE;
#else
    (void)x; (void)packed; (void)bias; (void)out; (void)threads;
    Py_RETURN_NONE; /* unreachable: runs_here() is 0 */
#endif
}

static PyMethodDef METHODS[] = {
    {"available", pd_available, METH_NOARGS,
     "available(): whether this CPU runs the kernels (AVX-512 VNNI)."},
    {"block", pd_block, METH_NOARGS, "block(): inputs per block (64)."},
    {"packed_bytes", pd_packed_bytes, METH_VARARGS,
     "packed_bytes(n, k): bytes pack needs for an n x k weight (k a multiple of block())."},
    {"pack", pd_pack, METH_VARARGS,
     "pack(dst, w, n, k, vector=True): round the float32 weight w (n x k) to int8 per output "
     "and block (vector=False: the plain loop, the same bytes; for tests)."},
    {"linear", pd_linear, METH_VARARGS,
     "linear(x, m, k, packed, n, bias, out, threads): out = x W^T + bias, the rows of x "
     "rounded to int8 per block."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "promptdot",
                                    "A prompt's rows through integer linears, 64-blocks.",
                                    -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_promptdot(void) { return PyModule_Create(&MODULE); }
