/* Attention whose result for a query row does not depend on the pass it is in.
 *
 * Why by hand: speculative decoding is lossless only if a draft tree's pass gives a row the
 * numbers a 1-row pass gives it. The linear layers do (smallgemm.c); torch's SDPA does not:
 * it sums over keys in vector lanes chosen by each key's position, and a tree pass places a
 * row's ancestors at other positions (between masked siblings) than the sequential cache
 * does, so tree and sequential logits differ by ~4e-5 on the default model. Here every
 * step that mixes keys runs in key order, and a masked key adds exactly nothing, so a row
 * sees the same operations on the same numbers in any pass:
 *
 *   s_j  = dot(q, k_j) * scale (+ the mask's value where it is finite): one FMA chain over
 *          the head dimension in order, in one vector lane (8 keys per vector, one lane
 *          each: a key's score does not depend on its lane);
 *   m    = max over visible s_j (exact in any order);
 *   p_j  = exp(s_j - m) (one vectorised exp, lane-independent), 0 where masked;
 *   l    = sum of p_j in key order; o = sum of p_j * v_j in key order (vectorised over the
 *          head dimension only); out = o / l.
 *
 * Masked keys (p_j = 0) add +0 to l and nothing to o (skipped): the same result as a pass
 * where they are absent. Layout (batch 1): q [Hq, Lq, D], k and v [Hkv, Lk, D], all
 * contiguous; out [Lq, Hq, D] (what transformers expects back); query head h reads key head
 * h / (Hq / Hkv). Masks: none (all keys visible, or causal: key j visible to row i when
 * j <= i + Lk - Lq), additive float [Lq, Lk] (a key is masked where its value is below
 * -1e30, as transformers' and structspec's masks write finfo.min or -inf), or bool [Lq, Lk].
 * Threads: OpenMP over (head, row) pairs; each pair is computed whole by one thread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AT_X86 1
#include <immintrin.h>
#else
#define AT_X86 0
#endif

#define KB 8         /* keys per vector */
#define MAX_D 256    /* largest head dimension (a multiple of 8) */
#define MASKED (-1e30f)

enum { MASK_NONE = 0, MASK_CAUSAL = 1, MASK_FLOAT = 2, MASK_BOOL = 3 };

#if AT_X86
/* exp(x) for 8 floats, the same polynomial in every lane (Cephes' expf: range reduction by
 * ln 2 in two parts, degree-5 polynomial; ~1 ulp). x <= 0 here (scores minus their max). */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447505f);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx),
                                                   _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* Scores of one query row against key blocks [b0, b1) of kt (8-key blocks, d-major: block b
 * holds kt[b][t][0..7]), into s[b*8 ...]. One FMA chain over t per key, in order; 8 blocks at
 * a time keep 8 chains in flight. */
__attribute__((target("avx2,fma"))) static void scores8(const float *q, const float *kt,
                                                        Py_ssize_t b0, Py_ssize_t b1,
                                                        Py_ssize_t d, float scale, float *s) {
    Py_ssize_t b = b0;
    const __m256 sc = _mm256_set1_ps(scale);
    for (; b + 8 <= b1; b += 8) {
        const float *k0 = kt + b * d * KB;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
               a6 = a0, a7 = a0;
        for (Py_ssize_t t = 0; t < d; t++) {
            __m256 qv = _mm256_broadcast_ss(q + t);
            const float *kk = k0 + t * KB;
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk + 1 * d * KB), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk + 2 * d * KB), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk + 3 * d * KB), a3);
            a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk + 4 * d * KB), a4);
            a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk + 5 * d * KB), a5);
            a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk + 6 * d * KB), a6);
            a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kk + 7 * d * KB), a7);
        }
        float *o = s + b * KB;
        _mm256_storeu_ps(o, _mm256_mul_ps(a0, sc));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(a1, sc));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(a2, sc));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(a3, sc));
        _mm256_storeu_ps(o + 32, _mm256_mul_ps(a4, sc));
        _mm256_storeu_ps(o + 40, _mm256_mul_ps(a5, sc));
        _mm256_storeu_ps(o + 48, _mm256_mul_ps(a6, sc));
        _mm256_storeu_ps(o + 56, _mm256_mul_ps(a7, sc));
    }
    for (; b < b1; b++) {
        const float *k0 = kt + b * d * KB;
        __m256 a0 = _mm256_setzero_ps();
        for (Py_ssize_t t = 0; t < d; t++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + t), _mm256_loadu_ps(k0 + t * KB), a0);
        _mm256_storeu_ps(s + b * KB, _mm256_mul_ps(a0, sc));
    }
}

/* Scores s (nb*8 floats) of one row to probabilities: masked (and padding past lk) to
 * -inf first, then exp(s - max), 0 where masked. */
__attribute__((target("avx2,fma"))) static void softmax_row(float *s, Py_ssize_t lk,
                                                            Py_ssize_t nb, int kind,
                                                            const void *mask_row,
                                                            Py_ssize_t visible_to) {
    const float ninf = -INFINITY;
    for (Py_ssize_t j = lk; j < nb * KB; j++) s[j] = ninf;
    if (kind == MASK_CAUSAL) {
        for (Py_ssize_t j = visible_to + 1; j < lk; j++) s[j] = ninf;
    } else if (kind == MASK_FLOAT) {
        const float *mr = (const float *)mask_row;
        for (Py_ssize_t j = 0; j < lk; j++) s[j] = mr[j] < MASKED ? ninf : s[j] + mr[j];
    } else if (kind == MASK_BOOL) {
        const uint8_t *mr = (const uint8_t *)mask_row;
        for (Py_ssize_t j = 0; j < lk; j++)
            if (!mr[j]) s[j] = ninf;
    }
    __m256 mv = _mm256_set1_ps(ninf);
    for (Py_ssize_t j = 0; j < nb * KB; j += KB) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
    float lanes[KB];
    _mm256_storeu_ps(lanes, mv);
    float m = lanes[0];
    for (int i = 1; i < KB; i++) m = lanes[i] > m ? lanes[i] : m;
    const __m256 mm = _mm256_set1_ps(m), zero = _mm256_setzero_ps();
    for (Py_ssize_t j = 0; j < nb * KB; j += KB) {
        __m256 x = _mm256_loadu_ps(s + j);
        __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(ninf), _CMP_NEQ_OQ);
        _mm256_storeu_ps(s + j, _mm256_blendv_ps(zero, exp8(_mm256_sub_ps(x, mm)), keep));
    }
}

/* o (d floats) += p_j * v_j and *l += p_j for keys [j0, j1) in order, skipping p_j = 0
 * (exactly nothing to add). */
__attribute__((target("avx2,fma"))) static void weighted_sum(const float *p, const float *v,
                                                             Py_ssize_t j0, Py_ssize_t j1,
                                                             Py_ssize_t d, float *o,
                                                             float *l) {
    float sum = *l;
    if (d == 64) { /* the common head size: the 8 accumulators stay in registers */
        __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8),
               o2 = _mm256_loadu_ps(o + 16), o3 = _mm256_loadu_ps(o + 24),
               o4 = _mm256_loadu_ps(o + 32), o5 = _mm256_loadu_ps(o + 40),
               o6 = _mm256_loadu_ps(o + 48), o7 = _mm256_loadu_ps(o + 56);
        for (Py_ssize_t j = j0; j < j1; j++) {
            float pj = p[j];
            if (pj == 0.0f) continue;
            sum += pj;
            __m256 pv = _mm256_set1_ps(pj);
            const float *vj = v + j * 64;
            o0 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj), o0);
            o1 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + 8), o1);
            o2 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + 16), o2);
            o3 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + 24), o3);
            o4 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + 32), o4);
            o5 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + 40), o5);
            o6 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + 48), o6);
            o7 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + 56), o7);
        }
        _mm256_storeu_ps(o, o0);
        _mm256_storeu_ps(o + 8, o1);
        _mm256_storeu_ps(o + 16, o2);
        _mm256_storeu_ps(o + 24, o3);
        _mm256_storeu_ps(o + 32, o4);
        _mm256_storeu_ps(o + 40, o5);
        _mm256_storeu_ps(o + 48, o6);
        _mm256_storeu_ps(o + 56, o7);
    } else {
        for (Py_ssize_t j = j0; j < j1; j++) {
            float pj = p[j];
            if (pj == 0.0f) continue;
            sum += pj;
            __m256 pv = _mm256_set1_ps(pj);
            const float *vj = v + j * d;
            for (Py_ssize_t t = 0; t < d; t += 8)
                _mm256_storeu_ps(o + t, _mm256_fmadd_ps(pv, _mm256_loadu_ps(vj + t),
                                                        _mm256_loadu_ps(o + t)));
        }
    }
    *l = sum;
}

/* A tile of up to TILE (head, row) pairs sharing key head kh: scores chunk by chunk of
 * CHUNK keys (a chunk of keys stays in L1 while every pair of the tile reads it), the
 * softmax per pair, then the weighted sums chunk by chunk the same way. Every pair's sums
 * still run over its keys in order. */
#define TILE 16
#define CHUNK_BLOCKS 8 /* 64 keys */
__attribute__((target("avx2,fma"))) static void attend_tile(
    const float *q, const float *kt, const float *v, const Py_ssize_t *heads,
    const Py_ssize_t *rows, int n, Py_ssize_t lq, Py_ssize_t lk, Py_ssize_t hq, Py_ssize_t d,
    float scale, int kind, const void *mask, float *s, float *acc, float *out) {
    Py_ssize_t width = ((lk + KB - 1) / KB) * KB, span = lk;
    if (kind == MASK_CAUSAL) { /* keys past the tile's last visible one are masked: skip them */
        Py_ssize_t last = 0;
        for (int r = 0; r < n; r++) last = rows[r] > last ? rows[r] : last;
        span = last + lk - lq + 1;
    }
    Py_ssize_t nb = (span + KB - 1) / KB;
    for (Py_ssize_t c = 0; c < nb; c += CHUNK_BLOCKS) {
        Py_ssize_t c1 = c + CHUNK_BLOCKS < nb ? c + CHUNK_BLOCKS : nb;
        for (int r = 0; r < n; r++)
            scores8(q + (heads[r] * lq + rows[r]) * d, kt, c, c1, d, scale, s + r * width);
    }
    for (int r = 0; r < n; r++) {
        const void *mrow = NULL;
        if (kind == MASK_FLOAT) mrow = (const float *)mask + rows[r] * lk;
        else if (kind == MASK_BOOL) mrow = (const uint8_t *)mask + rows[r] * lk;
        softmax_row(s + r * width, span, nb, kind, mrow, rows[r] + lk - lq);
    }
    float l[TILE];
    memset(acc, 0, (size_t)(n * d) * sizeof(float));
    for (int r = 0; r < n; r++) l[r] = 0.0f;
    for (Py_ssize_t j = 0; j < span; j += CHUNK_BLOCKS * KB) {
        Py_ssize_t j1 = j + CHUNK_BLOCKS * KB < span ? j + CHUNK_BLOCKS * KB : span;
        for (int r = 0; r < n; r++) weighted_sum(s + r * width, v, j, j1, d, acc + r * d, &l[r]);
    }
    for (int r = 0; r < n; r++) {
        float *o = out + (rows[r] * hq + heads[r]) * d;
        __m256 lv = _mm256_set1_ps(l[r]);
        for (Py_ssize_t t = 0; t < d; t += 8)
            _mm256_storeu_ps(o + t, _mm256_div_ps(_mm256_loadu_ps(acc + r * d + t), lv));
    }
}
#endif

static int cpu_ok(void) {
#if AT_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static PyObject *at_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_ok());
}

/* attend(q, k, v, hq, hkv, lq, lk, d, mask_ptr, kind, scale, out, threads) */
static PyObject *at_attend(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long qp, kp, vp, maskp, outp;
    Py_ssize_t hq, hkv, lq, lk, d;
    int kind, threads;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKnnnnnKifKi", &qp, &kp, &vp, &hq, &hkv, &lq, &lk, &d,
                          &maskp, &kind, &scale, &outp, &threads))
        return NULL;
    if (hq <= 0 || hkv <= 0 || hq % hkv != 0 || lq < 0 || lk <= 0 || d <= 0 || d % 8 != 0 ||
        d > MAX_D || kind < MASK_NONE || kind > MASK_BOOL ||
        ((kind == MASK_FLOAT || kind == MASK_BOOL) && maskp == 0) ||
        (kind == MASK_CAUSAL && lq > lk)) {
        PyErr_SetString(PyExc_ValueError, "attend: bad shape or mask");
        return NULL;
    }
#if AT_X86
    if (!cpu_ok()) {
        PyErr_SetString(PyExc_RuntimeError, "attend needs a CPU with AVX2 and FMA");
        return NULL;
    }
    if (lq == 0) Py_RETURN_NONE;
    const float *q = (const float *)(uintptr_t)qp, *k = (const float *)(uintptr_t)kp;
    const float *v = (const float *)(uintptr_t)vp;
    float *out = (float *)(uintptr_t)outp;
    Py_ssize_t nb = (lk + KB - 1) / KB, group = hq / hkv;
    /* keys in 8-key blocks, d-major (zeros past lk): kt[h][b][t][0..7] = k[h][b*8 + i][t] */
    float *kt = malloc((size_t)(hkv * nb * d * KB) * sizeof(float));
    if (kt == NULL) return PyErr_NoMemory();
    threads = threads < 1 ? 1 : threads;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t h = 0; h < hkv; h++)
        for (Py_ssize_t b = 0; b < nb; b++)
            for (Py_ssize_t i = 0; i < KB; i++) {
                Py_ssize_t j = b * KB + i;
                float *dst = kt + ((h * nb + b) * d) * KB + i;
                const float *src = k + (h * lk + j) * d;
                for (Py_ssize_t t = 0; t < d; t++) dst[t * KB] = j < lk ? src[t] : 0.0f;
            }
    /* tiles: the (head, row) pairs of one key head, TILE at a time */
    Py_ssize_t per_kh = group * lq, tiles_per = (per_kh + TILE - 1) / TILE;
    Py_ssize_t tiles = hkv * tiles_per;
#pragma omp parallel num_threads(threads) if (threads > 1 && tiles > 1)
    {
        float *s = malloc((size_t)(TILE * nb * KB + TILE * d) * sizeof(float));
        if (s == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (Py_ssize_t ti = 0; ti < tiles; ti++) {
            if (s == NULL) continue;
            Py_ssize_t kh = ti / tiles_per, first = (ti % tiles_per) * TILE;
            int n = (int)(per_kh - first < TILE ? per_kh - first : TILE);
            Py_ssize_t heads[TILE], rows[TILE];
            for (int r = 0; r < n; r++) { /* pair index: head-major within the key head */
                Py_ssize_t pi = first + r;
                heads[r] = kh * group + pi / lq;
                rows[r] = pi % lq;
            }
            attend_tile(q, kt + kh * nb * d * KB, v + kh * lk * d, heads, rows, n, lq, lk, hq,
                        d, scale, kind, (const void *)(uintptr_t)maskp, s,
                        s + TILE * nb * KB, out);
        }
        free(s);
    }
    Py_END_ALLOW_THREADS
    free(kt);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
#else
    (void)qp; (void)kp; (void)vp; (void)maskp; (void)outp; (void)threads; (void)scale;
    PyErr_SetString(PyExc_RuntimeError, "attend is built for x86-64 only");
    return NULL;
#endif
}

static PyMethodDef METHODS[] = {
    {"available", at_available, METH_NOARGS,
     "available(): whether this CPU runs the kernel (AVX2 + FMA)."},
    {"attend", at_attend, METH_VARARGS,
     "attend(q, k, v, hq, hkv, lq, lk, d, mask_ptr or 0, kind, scale, out, threads): "
     "attention for batch 1; kind 0 none, 1 causal, 2 additive float mask, 3 bool mask."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "attend",
                                    "Attention whose rows do not depend on the pass (AVX2).",
                                    -1, METHODS};

PyMODINIT_FUNC PyInit_attend(void) { return PyModule_Create(&MODULE); }
