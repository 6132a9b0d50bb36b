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

#include "vexp.h"

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
#define AT_Z512 "avx2,fma,avx512f,avx512vl,avx512dq"
EXP_FN(exp8, "avx2,fma", __m256, __m256i, _mm256, _mm256_round_ps, _mm256_castsi256_ps)
EXP_FN(exp16, AT_Z512, __m512, __m512i, _mm512, _mm512_roundscale_ps, _mm512_castsi512_ps)

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

/* Scores s (n floats, n = nb*8 >= lk) of one row with its masked keys and the padding past
 * lk set to -inf. */
__attribute__((target("avx2,fma"))) static void mask_scores(float *s, Py_ssize_t lk,
                                                            Py_ssize_t n, int kind,
                                                            const void *mask_row,
                                                            Py_ssize_t visible_to) {
    const float ninf = -INFINITY;
    for (Py_ssize_t j = lk; j < n; j++) s[j] = ninf;
    if (kind == MASK_CAUSAL) {
        for (Py_ssize_t j = visible_to + 1; j < lk; j++) s[j] = ninf;
    } else if (kind == MASK_FLOAT) { /* vectorised: each lane's s[j] + mr[j] is the same */
        const float *mr = (const float *)mask_row;
        const __m256 lim = _mm256_set1_ps(MASKED), minf = _mm256_set1_ps(ninf);
        Py_ssize_t j = 0;
        for (; j + KB <= lk; j += KB) {
            __m256 m = _mm256_loadu_ps(mr + j);
            __m256 x = _mm256_add_ps(_mm256_loadu_ps(s + j), m);
            _mm256_storeu_ps(s + j, _mm256_blendv_ps(x, minf, _mm256_cmp_ps(m, lim, _CMP_LT_OQ)));
        }
        for (; j < lk; j++) s[j] = mr[j] < MASKED ? ninf : s[j] + mr[j];
    } else if (kind == MASK_BOOL) {
        const uint8_t *mr = (const uint8_t *)mask_row;
        for (Py_ssize_t j = 0; j < lk; j++)
            if (!mr[j]) s[j] = ninf;
    }
}

/* Eight masked scores s[0..8) to exp(s - m), 0 where -inf. */
__attribute__((target("avx2,fma"))) static inline void probs8(float *s, __m256 mm) {
    __m256 x = _mm256_loadu_ps(s);
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    _mm256_storeu_ps(s, _mm256_blendv_ps(_mm256_setzero_ps(), exp8(_mm256_sub_ps(x, mm)), keep));
}

/* Scores s (nb*8 floats) of one row to probabilities: masked (and padding past lk) to
 * -inf first, then exp(s - max), 0 where masked. */
__attribute__((target("avx2,fma"))) static void softmax_row(float *s, Py_ssize_t lk,
                                                            Py_ssize_t nb, int kind,
                                                            const void *mask_row,
                                                            Py_ssize_t visible_to) {
    mask_scores(s, lk, nb * KB, kind, mask_row, visible_to);
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (Py_ssize_t j = 0; j < nb * KB; j += KB) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
    float lanes[KB];
    _mm256_storeu_ps(lanes, mv);
    float m = lanes[0];
    for (int i = 1; i < KB; i++) m = lanes[i] > m ? lanes[i] : m;
    const __m256 mm = _mm256_set1_ps(m);
    for (Py_ssize_t j = 0; j < nb * KB; j += KB) probs8(s + j, mm);
}

/* softmax_row with the max and the exponentials on 16 keys per vector (an 8-key tail as
 * there): the same result bit for bit (the max is exact in any order; every other step is
 * per lane). */
__attribute__((target(AT_Z512))) static void softmax_row16(float *s, Py_ssize_t lk,
                                                          Py_ssize_t nb, int kind,
                                                          const void *mask_row,
                                                          Py_ssize_t visible_to) {
    const Py_ssize_t n = nb * KB, n16 = n & ~(Py_ssize_t)15;
    const __m512 minf = _mm512_set1_ps(-INFINITY);
    Py_ssize_t j = 0;
    if (kind == MASK_FLOAT) { /* as mask_scores, 16 keys a step (a tree pass's every row) */
        const float *mr = (const float *)mask_row;
        const __m512 lim = _mm512_set1_ps(MASKED);
        for (; j + 16 <= lk; j += 16) {
            __m512 mk = _mm512_loadu_ps(mr + j);
            __m512 x = _mm512_add_ps(_mm512_loadu_ps(s + j), mk);
            __mmask16 masked = _mm512_cmp_ps_mask(mk, lim, _CMP_LT_OQ);
            _mm512_storeu_ps(s + j, _mm512_mask_blend_ps(masked, x, minf));
        }
    }
    /* the rest of a float mask (from j), or the other kinds, and the padding past lk */
    mask_scores(s + j, lk - j, n - j, kind, kind == MASK_FLOAT ? (const float *)mask_row + j
                                                               : mask_row, visible_to);
    __m512 mv = minf;
    for (j = 0; j < n16; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
    float m = _mm512_reduce_max_ps(mv);
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    const __m512 mm = _mm512_set1_ps(m), zero = _mm512_setzero_ps();
    for (j = 0; j < n16; j += 16) {
        __m512 x = _mm512_loadu_ps(s + j);
        __mmask16 keep = _mm512_cmp_ps_mask(x, minf, _CMP_NEQ_OQ);
        _mm512_storeu_ps(s + j, _mm512_mask_blend_ps(keep, zero, exp16(_mm512_sub_ps(x, mm))));
    }
    if (j < n) probs8(s + j, _mm256_set1_ps(m));
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

/* kt[h][b][t][0..7] = k[h][b*8 + i][t] (zeros past lk), 8 keys x 8 dims at a time through
 * registers (a pass's fixed cost: the scalar version was half of a 1-row call). Head h's
 * keys start at k + h * skh (rows of d floats). */
__attribute__((target("avx2,fma"))) static void transpose_keys(const float *k, Py_ssize_t hkv,
                                                               Py_ssize_t lk, Py_ssize_t nb,
                                                               Py_ssize_t d, Py_ssize_t skh,
                                                               float *kt) {
    const __m256 zero = _mm256_setzero_ps();
    for (Py_ssize_t h = 0; h < hkv; h++)
        for (Py_ssize_t b = 0; b < nb; b++) {
            const float *src = k + h * skh + b * KB * d;
            float *dst = kt + (h * nb + b) * d * KB;
            Py_ssize_t have = lk - b * KB < KB ? lk - b * KB : KB;
            for (Py_ssize_t t = 0; t < d; t += 8) {
                __m256 r0 = _mm256_loadu_ps(src + t);
                __m256 r1 = have > 1 ? _mm256_loadu_ps(src + d + t) : zero;
                __m256 r2 = have > 2 ? _mm256_loadu_ps(src + 2 * d + t) : zero;
                __m256 r3 = have > 3 ? _mm256_loadu_ps(src + 3 * d + t) : zero;
                __m256 r4 = have > 4 ? _mm256_loadu_ps(src + 4 * d + t) : zero;
                __m256 r5 = have > 5 ? _mm256_loadu_ps(src + 5 * d + t) : zero;
                __m256 r6 = have > 6 ? _mm256_loadu_ps(src + 6 * d + t) : zero;
                __m256 r7 = have > 7 ? _mm256_loadu_ps(src + 7 * d + t) : zero;
                __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
                __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
                __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
                __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
                __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                float *o = dst + t * KB;
                _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_storeu_ps(o + 16, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_storeu_ps(o + 24, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_storeu_ps(o + 32, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_storeu_ps(o + 40, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_storeu_ps(o + 48, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_storeu_ps(o + 56, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
        }
}

/* Register tiles. The loops above keep one pair's accumulators in registers and reload the
 * keys (values) for every pair (with the scalar key transpose and mask loops of session 22:
 * 20 GMAC/s on the default model's shapes — 9 query heads over 3 key heads, 64 dims, ~460
 * keys — about a third of the FMA units' rate). The tiles below load each key (value)
 * vector once for NR pairs and keep NR x 4 accumulators in registers. Every element still
 * sees the same operations in the same order as in the loops above, so the results are
 * bitwise theirs:
 *   scores: acc = fma(q[t], k_j[t], acc) for t = 0..d-1 from 0, then acc * scale;
 *   sums:   o[t] = fma(p_j, v_j[t], o[t]) for the keys a pair sees, in order. A key masked
 *           for some pairs of the tile (p_j = 0 exactly where masked: a visible key's exp
 *           is at least FLT_MIN) is skipped for those pairs, as the one-pair loops skip it
 *           (adding fma(0, v, o) instead would turn an o of -0, from an underflow, into +0);
 *           the keys every pair sees (the cache, the bulk) take the branch-free path.
 * NR up to SC_MAXR: 6 where AVX-512VL gives 32 vector registers (24 accumulators + 4 keys +
 * a broadcast), 3 with AVX2's 16. With AVX-512 (mode 2) the scores, the softmax and (head
 * size a multiple of 64) the weighted sums run on 512-bit vectors (scz_, softmax_row16,
 * wsz_ below): on the Zen 4 these tiles were written for, 512-bit FMAs ran no more lanes per
 * cycle, but on the Xeon of sessions 33-42 a 16-row tree over 460 keys took 0.65 of the
 * 256-bit tiles' time, a 110-row prompt 0.60 (benchmarks/attention_kernel.py,
 * docs/performance.md, session 42). */
#define SC_MAXR 6
#define SC_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define SC_DECL(r) __m256 a##r##0 = _mm256_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0, \
                          a##r##3 = a##r##0;
/* A##r##0..3 += *SRC * V0..V3 (one broadcast, four FMAs): a score tile's row against
 * four key blocks, a weighted-sum tile's row against 32 dims of a value. */
#define BCAST_FMA4(A, r, SRC, V)                                                           \
    {                                                                                      \
        __m256 s_ = _mm256_broadcast_ss(SRC);                                              \
        A##r##0 = _mm256_fmadd_ps(s_, V##0, A##r##0);                                      \
        A##r##1 = _mm256_fmadd_ps(s_, V##1, A##r##1);                                      \
        A##r##2 = _mm256_fmadd_ps(s_, V##2, A##r##2);                                      \
        A##r##3 = _mm256_fmadd_ps(s_, V##3, A##r##3);                                      \
    }
#define SC_FMA4(r) if (NR > r) BCAST_FMA4(a, r, qr[r] + t, k)
#define SC_STORE4(r)                                                                       \
    if (NR > r) {                                                                          \
        float *o = sr[r] + b * KB;                                                         \
        _mm256_storeu_ps(o, _mm256_mul_ps(a##r##0, sc));                                   \
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(a##r##1, sc));                               \
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(a##r##2, sc));                              \
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(a##r##3, sc));                              \
    }
#define SC_DECL1(r) __m256 a##r##0 = _mm256_setzero_ps();
#define SC_FMA1(r)                                                                         \
    if (NR > r) a##r##0 = _mm256_fmadd_ps(_mm256_broadcast_ss(qr[r] + t), k0, a##r##0);
#define SC_STORE1(r)                                                                       \
    if (NR > r) _mm256_storeu_ps(sr[r] + b * KB, _mm256_mul_ps(a##r##0, sc));
/* Scores of NR query rows qr[r] against key blocks [b0, b1) of kt, into sr[r][b*8 ...]. */
#define SC_KERNEL(NAME, TGT, R)                                                            \
    __attribute__((target(TGT))) static void NAME##R(                                      \
        const float *const *qr, const float *kt, Py_ssize_t b0, Py_ssize_t b1,            \
        Py_ssize_t d, float scale, float *const *sr) {                                    \
        enum { NR = R };                                                                  \
        const __m256 sc = _mm256_set1_ps(scale);                                          \
        Py_ssize_t b = b0;                                                                \
        for (; b + 4 <= b1; b += 4) {                                                     \
            const float *kb = kt + b * d * KB;                                            \
            SC_ROWS(SC_DECL)                                                              \
            for (Py_ssize_t t = 0; t < d; t++) {                                          \
                const float *kk = kb + t * KB;                                            \
                __m256 k0 = _mm256_loadu_ps(kk), k1 = _mm256_loadu_ps(kk + d * KB);       \
                __m256 k2 = _mm256_loadu_ps(kk + 2 * d * KB);                             \
                __m256 k3 = _mm256_loadu_ps(kk + 3 * d * KB);                             \
                SC_ROWS(SC_FMA4)                                                          \
            }                                                                             \
            SC_ROWS(SC_STORE4)                                                            \
        }                                                                                 \
        for (; b < b1; b++) {                                                             \
            const float *kb = kt + b * d * KB;                                            \
            SC_ROWS(SC_DECL1)                                                             \
            for (Py_ssize_t t = 0; t < d; t++) {                                          \
                __m256 k0 = _mm256_loadu_ps(kb + t * KB);                                 \
                SC_ROWS(SC_FMA1)                                                          \
            }                                                                             \
            SC_ROWS(SC_STORE1)                                                            \
        }                                                                                 \
    }

#define WS_DECL(r) __m256 o##r##0, o##r##1, o##r##2, o##r##3;
#define WS_LOAD(r)                                                                         \
    if (NR > r) {                                                                          \
        const float *a = acc[r] + t0;                                                      \
        o##r##0 = _mm256_loadu_ps(a), o##r##1 = _mm256_loadu_ps(a + 8);                   \
        o##r##2 = _mm256_loadu_ps(a + 16), o##r##3 = _mm256_loadu_ps(a + 24);             \
    }
#define WS_BIT(r) | (NR > r && pr[r][j] != 0.0f ? 1u << (r) : 0u)
#define WS_FMA_IF(r) if (NR > r && (seen >> (r) & 1u)) BCAST_FMA4(o, r, pr[r] + j, v)
#define WS_FMA(r) if (NR > r) BCAST_FMA4(o, r, pr[r] + j, v)
#define WS_STORE(r)                                                                        \
    if (NR > r) {                                                                          \
        float *a = acc[r] + t0;                                                            \
        _mm256_storeu_ps(a, o##r##0), _mm256_storeu_ps(a + 8, o##r##1);                   \
        _mm256_storeu_ps(a + 16, o##r##2), _mm256_storeu_ps(a + 24, o##r##3);             \
    }
/* Key j's 32 value dims from t0, as four vectors v0..v3. */
#define WS_VLOAD                                                                           \
    const float *vj = v + j * d + t0;                                                      \
    __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);                         \
    __m256 v2 = _mm256_loadu_ps(vj + 16), v3 = _mm256_loadu_ps(vj + 24);
/* acc[r][0..d) += p_r[j] * v_j for the keys [j0, j1) pair r sees, in order (d a multiple of
 * STEP), STEP dims at a time (the macros P##_DECL ... P##_STORE: WS_ for 256-bit vectors,
 * WZ_ for 512-bit ones, below). Keys below jb are seen by every pair (the cache under a tree
 * mask): their p_r[j] are all > 0, so they need no test (the same FMAs as the tested path
 * takes where every pair sees the key). */
#define WSUM_KERNEL(NAME, TGT, R, P, STEP)                                                  \
    __attribute__((target(TGT))) static void NAME##R(                                       \
        const float *const *pr, const float *v, Py_ssize_t j0, Py_ssize_t j1,               \
        Py_ssize_t d, float *const *acc, Py_ssize_t jb) {                                   \
        enum { NR = R };                                                                    \
        Py_ssize_t jm = jb < j0 ? j0 : jb > j1 ? j1 : jb;                                   \
        for (Py_ssize_t t0 = 0; t0 < d; t0 += STEP) {                                       \
            SC_ROWS(P##_DECL)                                                               \
            SC_ROWS(P##_LOAD)                                                               \
            for (Py_ssize_t j = j0; j < jm; j++) {                                          \
                P##_VLOAD                                                                   \
                SC_ROWS(P##_FMA)                                                            \
            }                                                                               \
            for (Py_ssize_t j = jm; j < j1; j++) {                                          \
                unsigned seen = 0u SC_ROWS(WS_BIT);                                         \
                if (!seen) continue;                                                        \
                P##_VLOAD                                                                   \
                if (seen == (1u << NR) - 1u) {                                              \
                    SC_ROWS(P##_FMA)                                                        \
                } else {                                                                    \
                    SC_ROWS(P##_FMA_IF)                                                     \
                }                                                                           \
            }                                                                               \
            SC_ROWS(P##_STORE)                                                              \
        }                                                                                   \
    }
#define WS_KERNEL(NAME, TGT, R) WSUM_KERNEL(NAME, TGT, R, WS, 32)

#define AT_WIDE "avx2,fma,avx512f,avx512vl"
#define AT_NARROW "avx2,fma"
SC_KERNEL(scw_, AT_WIDE, 1) SC_KERNEL(scw_, AT_WIDE, 2) SC_KERNEL(scw_, AT_WIDE, 3)
SC_KERNEL(scw_, AT_WIDE, 4) SC_KERNEL(scw_, AT_WIDE, 5) SC_KERNEL(scw_, AT_WIDE, 6)

/* The weighted sums with 512-bit vectors where the head dimension is a multiple of 64: a
 * pair's 64 dims in four registers, so a key costs half the FMAs of the 256-bit tiles. Each
 * element still sees o[t] = fma(p_j, v_j[t], o[t]) for the same keys in the same order, so
 * the results are bitwise theirs. */
#define WZ_DECL(r) __m512 z##r##0, z##r##1, z##r##2, z##r##3;
#define WZ_LOAD(r)                                                                         \
    if (NR > r) {                                                                          \
        const float *a = acc[r] + t0;                                                      \
        z##r##0 = _mm512_loadu_ps(a), z##r##1 = _mm512_loadu_ps(a + 16);                  \
        z##r##2 = _mm512_loadu_ps(a + 32), z##r##3 = _mm512_loadu_ps(a + 48);             \
    }
#define WZ_BFMA(r)                                                                         \
    {                                                                                      \
        __m512 s_ = _mm512_set1_ps(pr[r][j]);                                              \
        z##r##0 = _mm512_fmadd_ps(s_, w0, z##r##0);                                        \
        z##r##1 = _mm512_fmadd_ps(s_, w1, z##r##1);                                        \
        z##r##2 = _mm512_fmadd_ps(s_, w2, z##r##2);                                        \
        z##r##3 = _mm512_fmadd_ps(s_, w3, z##r##3);                                        \
    }
#define WZ_FMA(r) if (NR > r) WZ_BFMA(r)
#define WZ_FMA_IF(r) if (NR > r && (seen >> (r) & 1u)) WZ_BFMA(r)
#define WZ_STORE(r)                                                                        \
    if (NR > r) {                                                                          \
        float *a = acc[r] + t0;                                                            \
        _mm512_storeu_ps(a, z##r##0), _mm512_storeu_ps(a + 16, z##r##1);                  \
        _mm512_storeu_ps(a + 32, z##r##2), _mm512_storeu_ps(a + 48, z##r##3);             \
    }
#define WZ_VLOAD                                                                           \
    const float *vj = v + j * d + t0;                                                      \
    __m512 w0 = _mm512_loadu_ps(vj), w1 = _mm512_loadu_ps(vj + 16);                        \
    __m512 w2 = _mm512_loadu_ps(vj + 32), w3 = _mm512_loadu_ps(vj + 48);
#define WZ_KERNEL(NAME, R) WSUM_KERNEL(NAME, AT_Z512, R, WZ, 64)
WZ_KERNEL(wsz_, 1) WZ_KERNEL(wsz_, 2) WZ_KERNEL(wsz_, 3)
WZ_KERNEL(wsz_, 4) WZ_KERNEL(wsz_, 5) WZ_KERNEL(wsz_, 6)

/* The scores with 512-bit vectors: two 8-key blocks joined in one register (the keys'
 * layout unchanged), eight blocks per step, so a key costs half the FMAs. A key's score
 * is still acc = fma(q[t], k[t], acc) over t in order in one lane, then acc * scale. */
#define SZ_DECL(r) __m512 y##r##0 = _mm512_setzero_ps(), y##r##1 = y##r##0, y##r##2 = y##r##0, \
                          y##r##3 = y##r##0;
#define SZ_FMA(r)                                                                          \
    if (NR > r) {                                                                          \
        __m512 s_ = _mm512_set1_ps(qr[r][t]);                                              \
        y##r##0 = _mm512_fmadd_ps(s_, k0, y##r##0);                                        \
        y##r##1 = _mm512_fmadd_ps(s_, k1, y##r##1);                                        \
        y##r##2 = _mm512_fmadd_ps(s_, k2, y##r##2);                                        \
        y##r##3 = _mm512_fmadd_ps(s_, k3, y##r##3);                                        \
    }
#define SZ_STORE(r)                                                                        \
    if (NR > r) {                                                                          \
        float *o = sr[r] + b * KB;                                                         \
        _mm512_storeu_ps(o, _mm512_mul_ps(y##r##0, sc));                                   \
        _mm512_storeu_ps(o + 16, _mm512_mul_ps(y##r##1, sc));                              \
        _mm512_storeu_ps(o + 32, _mm512_mul_ps(y##r##2, sc));                              \
        _mm512_storeu_ps(o + 48, _mm512_mul_ps(y##r##3, sc));                              \
    }
#define SZ_JOIN(P) _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(P)),          \
                                      _mm256_loadu_ps((P) + d * KB), 1)
#define SZ_KERNEL(NAME, R)                                                                 \
    __attribute__((target(AT_Z512))) static void NAME##R(                                  \
        const float *const *qr, const float *kt, Py_ssize_t b0, Py_ssize_t b1,            \
        Py_ssize_t d, float scale, float *const *sr) {                                    \
        enum { NR = R };                                                                  \
        const __m512 sc = _mm512_set1_ps(scale);                                          \
        Py_ssize_t b = b0;                                                                \
        for (; b + 8 <= b1; b += 8) {                                                     \
            const float *kb = kt + b * d * KB;                                            \
            SC_ROWS(SZ_DECL)                                                              \
            for (Py_ssize_t t = 0; t < d; t++) {                                          \
                const float *kk = kb + t * KB;                                            \
                __m512 k0 = SZ_JOIN(kk), k1 = SZ_JOIN(kk + 2 * d * KB);                   \
                __m512 k2 = SZ_JOIN(kk + 4 * d * KB), k3 = SZ_JOIN(kk + 6 * d * KB);      \
                SC_ROWS(SZ_FMA)                                                           \
            }                                                                             \
            SC_ROWS(SZ_STORE)                                                             \
        }                                                                                 \
        if (b < b1) scw_##R(qr, kt, b, b1, d, scale, sr);                                 \
    }
SZ_KERNEL(scz_, 1) SZ_KERNEL(scz_, 2) SZ_KERNEL(scz_, 3)
SZ_KERNEL(scz_, 4) SZ_KERNEL(scz_, 5) SZ_KERNEL(scz_, 6)
SC_KERNEL(scn_, AT_NARROW, 1) SC_KERNEL(scn_, AT_NARROW, 2) SC_KERNEL(scn_, AT_NARROW, 3)
WS_KERNEL(wsw_, AT_WIDE, 1) WS_KERNEL(wsw_, AT_WIDE, 2) WS_KERNEL(wsw_, AT_WIDE, 3)
WS_KERNEL(wsw_, AT_WIDE, 4) WS_KERNEL(wsw_, AT_WIDE, 5) WS_KERNEL(wsw_, AT_WIDE, 6)
WS_KERNEL(wsn_, AT_NARROW, 1) WS_KERNEL(wsn_, AT_NARROW, 2) WS_KERNEL(wsn_, AT_NARROW, 3)

typedef void (*scores_fn)(const float *const *, const float *, Py_ssize_t, Py_ssize_t,
                          Py_ssize_t, float, float *const *);
typedef void (*wsum_fn)(const float *const *, const float *, Py_ssize_t, Py_ssize_t,
                        Py_ssize_t, float *const *, Py_ssize_t);
static const scores_fn SC_NARROW[SC_MAXR + 1] = {NULL, scn_1, scn_2, scn_3, NULL, NULL, NULL};
static const wsum_fn WS_WIDE[SC_MAXR + 1] = {NULL, wsw_1, wsw_2, wsw_3, wsw_4, wsw_5, wsw_6};
static const wsum_fn WS_NARROW[SC_MAXR + 1] = {NULL, wsn_1, wsn_2, wsn_3, NULL, NULL, NULL};
static const wsum_fn WS_ZMM[SC_MAXR + 1] = {NULL, wsz_1, wsz_2, wsz_3, wsz_4, wsz_5, wsz_6};
static const scores_fn SC_ZMM[SC_MAXR + 1] = {NULL, scz_1, scz_2, scz_3, scz_4, scz_5, scz_6};

/* A tile of up to TILE (head, row) pairs sharing key head kh: scores chunk by chunk of
 * CHUNK keys (a chunk of keys stays in L1 while every pair of the tile reads it), the
 * softmax per pair, then the weighted sums chunk by chunk the same way. Every pair's sums
 * still run over its keys in order. */
#define TILE 24
#define CHUNK_BLOCKS 8 /* 64 keys */
__attribute__((target("avx2,fma"))) static void attend_tile(
    const float *q, const float *kt, const float *v, const Py_ssize_t *heads,
    const Py_ssize_t *rows, int n, Py_ssize_t lq, Py_ssize_t lk, Py_ssize_t hq, Py_ssize_t d,
    float scale, int kind, const void *mask, Py_ssize_t ldm, Py_ssize_t sqh, Py_ssize_t sqr,
    const Py_ssize_t *visible, const Py_ssize_t *seen_to, float *s, float *acc, float *out,
    int mode) {
    Py_ssize_t width = ((lk + KB - 1) / KB) * KB, span = lk, bulk = lk;
    if (kind == MASK_CAUSAL) { /* keys past the tile's last visible one are masked: skip them */
        Py_ssize_t last = 0, least = lq;
        for (int r = 0; r < n; r++) {
            last = rows[r] > last ? rows[r] : last;
            least = rows[r] < least ? rows[r] : least;
        }
        span = last + lk - lq + 1;
        bulk = least + lk - lq + 1;
    } else if (visible != NULL) { /* the same with a mask: its rows' last visible keys */
        span = 1;
        for (int r = 0; r < n; r++) {
            span = visible[rows[r]] > span ? visible[rows[r]] : span;
            bulk = seen_to[rows[r]] < bulk ? seen_to[rows[r]] : bulk;
        }
    }
    Py_ssize_t nb = (span + KB - 1) / KB;
    const float *qr[TILE];
    float *sr[TILE], *ar[TILE];
    for (int r = 0; r < n; r++) {
        qr[r] = q + heads[r] * sqh + rows[r] * sqr;
        sr[r] = s + r * width;
        ar[r] = acc + r * d;
    }
    int maxr = mode == 2 ? SC_MAXR : 3;
    const scores_fn *sc = mode == 2 ? SC_ZMM : SC_NARROW;
    const wsum_fn *ws = mode != 2 ? WS_NARROW : d % 64 ? WS_WIDE : WS_ZMM;
    for (Py_ssize_t c = 0; c < nb; c += CHUNK_BLOCKS) {
        Py_ssize_t c1 = c + CHUNK_BLOCKS < nb ? c + CHUNK_BLOCKS : nb;
        if (mode == 0) {
            for (int r = 0; r < n; r++) scores8(qr[r], kt, c, c1, d, scale, sr[r]);
        } else {
            for (int r = 0; r < n; r += maxr) {
                int nr = n - r < maxr ? n - r : maxr;
                sc[nr](qr + r, kt, c, c1, d, scale, sr + r);
            }
        }
    }
    for (int r = 0; r < n; r++) {
        const void *mrow = NULL;
        if (kind == MASK_FLOAT) mrow = (const float *)mask + rows[r] * ldm;
        else if (kind == MASK_BOOL) mrow = (const uint8_t *)mask + rows[r] * ldm;
        if (mode == 2)
            softmax_row16(sr[r], span, nb, kind, mrow, rows[r] + lk - lq);
        else
            softmax_row(sr[r], span, nb, kind, mrow, rows[r] + lk - lq);
    }
    float l[TILE];
    memset(acc, 0, (size_t)(n * d) * sizeof(float));
    for (int r = 0; r < n; r++) l[r] = 0.0f;
    int tiled = mode != 0 && d % 32 == 0;
    for (Py_ssize_t j = 0; j < span; j += CHUNK_BLOCKS * KB) {
        Py_ssize_t j1 = j + CHUNK_BLOCKS * KB < span ? j + CHUNK_BLOCKS * KB : span;
        if (!tiled) {
            for (int r = 0; r < n; r++) weighted_sum(sr[r], v, j, j1, d, ar[r], &l[r]);
        } else {
            for (int r = 0; r < n; r += maxr) {
                int nr = n - r < maxr ? n - r : maxr;
                ws[nr]((const float *const *)(sr + r), v, j, j1, d, ar + r, bulk);
            }
        }
    }
    if (tiled) /* the sums of the weights, each in key order: zeros (+0) add nothing to a
                * sum >= +0, so no branch; eight pairs' chains interleaved (an add's latency) */
        for (int r = 0; r < n; r += 8) {
            const float *p[8];
            for (int i = 0; i < 8; i++) p[i] = sr[r + i < n ? r + i : r];
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f,
                  s6 = 0.0f, s7 = 0.0f;
            for (Py_ssize_t j = 0; j < span; j++) {
                s0 += p[0][j];
                s1 += p[1][j];
                s2 += p[2][j];
                s3 += p[3][j];
                s4 += p[4][j];
                s5 += p[5][j];
                s6 += p[6][j];
                s7 += p[7][j];
            }
            const float sums[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
            for (int i = 0; i < 8 && r + i < n; i++) l[r + i] = sums[i];
        }
    for (int r = 0; r < n; r++) {
        float *o = out + (rows[r] * hq + heads[r]) * d;
        __m256 lv = _mm256_set1_ps(l[r]);
        for (Py_ssize_t t = 0; t < d; t += 8)
            _mm256_storeu_ps(o + t, _mm256_div_ps(_mm256_loadu_ps(ar[r] + t), lv));
    }
}

/* The first of mr[0..n) below MASKED (n if none), eight at a time: a tree pass's rows see
 * the whole cache, so the scan runs over it for every row and layer. */
__attribute__((target("avx2,fma"))) static Py_ssize_t first_masked(const float *mr,
                                                                  Py_ssize_t n) {
    const __m256 lim = _mm256_set1_ps(MASKED);
    Py_ssize_t f = 0;
    for (; f + 8 <= n; f += 8) {
        int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(mr + f), lim, _CMP_LT_OQ));
        if (bits) return f + __builtin_ctz((unsigned)bits);
    }
    while (f < n && !(mr[f] < MASKED)) f++;
    return f;
}

#endif

/* Which loops run: 2 = the register tiles with AVX-512's registers and 512-bit vectors,
 * 1 = with AVX2's, 0 = the one-pair loops (scores8 / weighted_sum). All give bitwise the
 * same results (tests/test_attention_exact.py); set_tiles() switches, for those tests and
 * A/B runs. */
static int tiles_mode = -1;

static int cpu_wide(void) {
#if AT_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

static int tiles(void) {
    if (tiles_mode < 0) tiles_mode = cpu_wide() ? 2 : 1;
    return tiles_mode;
}

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

/* set_tiles(mode) -> previous mode: 0 the one-pair loops, 1 AVX2 tiles, 2 AVX-512VL tiles
 * (refused where the CPU lacks it). */
static PyObject *at_set_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int mode;
    if (!PyArg_ParseTuple(args, "i", &mode)) return NULL;
    if (mode < 0 || mode > 2 || (mode == 2 && !cpu_wide())) {
        PyErr_SetString(PyExc_ValueError, "set_tiles: 0, 1, or 2 where the CPU has AVX-512F/VL/DQ");
        return NULL;
    }
    int before = tiles();
    tiles_mode = mode;
    return PyLong_FromLong(before);
}

static PyObject *at_max_tiles(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(cpu_wide() ? 2 : 1);
}

static PyObject *at_tiles(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(tiles());
}

/* attend(q, k, v, hq, hkv, lq, lk, d, mask_ptr, kind, scale, out, threads, ldm=lk,
 *        sqh=lq*d, sqr=d, skh=lk*d, svh=lk*d):
 * ldm, the mask's row stride in elements (>= lk: a mask wider than the keys is read in
 * place, without copying its first lk columns out); sqh and sqr, the query's head and row
 * strides (a query laid out [lq, hq, d], as transformers' projections leave it before their
 * transpose, is read in place); skh and svh, the keys' and values' head strides (>= lk*d:
 * a cache with room to grow, its heads apart, is read in place; rows of d floats) */
static PyObject *at_attend(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long qp, kp, vp, maskp, outp;
    Py_ssize_t hq, hkv, lq, lk, d, ldm = -1, sqh = -1, sqr = -1, skh = -1, svh = -1;
    int kind, threads;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKnnnnnKifKi|nnnnn", &qp, &kp, &vp, &hq, &hkv, &lq, &lk, &d,
                          &maskp, &kind, &scale, &outp, &threads, &ldm, &sqh, &sqr, &skh,
                          &svh))
        return NULL;
    if (ldm < 0) ldm = lk;
    if (sqh < 0) sqh = lq * d;
    if (sqr < 0) sqr = d;
    if (skh < 0) skh = lk * d;
    if (svh < 0) svh = lk * d;
    if (hq <= 0 || hkv <= 0 || hq % hkv != 0 || lq < 0 || lk <= 0 || d <= 0 || d % 8 != 0 ||
        ldm < lk || (sqh < d && sqr < d) || (hkv > 1 && (skh < lk * d || svh < lk * d)) ||
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
    int failed = 0, mode = tiles();
    /* Under a mask, each row's keys end at its last visible one: a pass that prefills the
     * prompt with the first tree has a causal prompt under its tree mask, and the keys past
     * a row's last visible one would only add exact zeros (as MASK_CAUSAL skips them). */
    Py_ssize_t *visible = NULL, *seen_to = NULL;
    if (kind == MASK_FLOAT || kind == MASK_BOOL) {
        visible = malloc((size_t)(2 * lq) * sizeof(Py_ssize_t));
        seen_to = visible + lq;
        if (visible == NULL) {
            free(kt);
            return PyErr_NoMemory();
        }
    }
    Py_BEGIN_ALLOW_THREADS
    if (visible != NULL)
        for (Py_ssize_t i = 0; i < lq; i++) {
            Py_ssize_t j = lk;
            if (kind == MASK_FLOAT) {
                const float *mr = (const float *)(uintptr_t)maskp + i * ldm;
                while (j > 0 && mr[j - 1] < MASKED) j--;
            } else {
                const uint8_t *mr = (const uint8_t *)(uintptr_t)maskp + i * ldm;
                while (j > 0 && !mr[j - 1]) j--;
            }
            visible[i] = j;
            /* the first masked key: every key before it is visible to row i */
            Py_ssize_t f = 0;
            if (kind == MASK_FLOAT) {
                f = first_masked((const float *)(uintptr_t)maskp + i * ldm, j);
            } else {
                const uint8_t *mr = (const uint8_t *)(uintptr_t)maskp + i * ldm;
                while (f < j && mr[f]) f++;
            }
            seen_to[i] = f;
        }
    transpose_keys(k, hkv, lk, nb, d, skh, kt);
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
            attend_tile(q, kt + kh * nb * d * KB, v + kh * svh, heads, rows, n, lq, lk, hq,
                        d, scale, kind, (const void *)(uintptr_t)maskp, ldm, sqh, sqr, visible,
                        seen_to, s, s + TILE * nb * KB, out, mode);
        }
        free(s);
    }
    Py_END_ALLOW_THREADS
    free(kt);
    free(visible);
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
    {"max_tiles", at_max_tiles, METH_NOARGS,
     "max_tiles(): the widest loops this CPU runs (2 with AVX-512F/VL/DQ, else 1)."},
    {"tiles", at_tiles, METH_NOARGS,
     "tiles(): which loops run: 0 one pair at a time, 1 AVX2 register tiles, 2 AVX-512."},
    {"set_tiles", at_set_tiles, METH_VARARGS,
     "set_tiles(mode): switch the loops (bitwise the same results); returns the old mode."},
    {"attend", at_attend, METH_VARARGS,
     "attend(q, k, v, hq, hkv, lq, lk, d, mask_ptr or 0, kind, scale, out, threads): "
     "attention for batch 1; kind 0 none, 1 causal, 2 additive float mask, 3 bool mask."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "attend",
                                    "Attention whose rows do not depend on the pass (AVX2).",
                                    -1, METHODS};

PyMODINIT_FUNC PyInit_attend(void) { return PyModule_Create(&MODULE); }
