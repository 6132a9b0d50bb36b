/* Linear layers as integer dot products: block-quantized weights x 8-bit activations.
 *
 * Why by hand: the default model's body weights are GGUF Q4_1 (w = d*q + m per block of 32
 * input features, q in 0..15). The float32 kernels (smallgemm.c) widen q to float and spend
 * one FMA per weight per row, which bounds every pass of more than a few rows (a draft
 * tree's verification, a prompt's prefill) by the FMA units. llama.cpp runs such weights
 * against activations quantized to 8 bits per block of 32 (its Q8_1) with integer dot
 * products; this file does the same arithmetic, with the x86 instructions that multiply
 * 4 byte pairs per 32-bit lane (AVX512-VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd) —
 * a quarter of the instructions per weight per row, and no widening of the weights.
 *
 * Numbers: per row and block b of 32 features, x is quantized as xq = round(x * 127/amax)
 * (amax = max |x| over the block), dx = amax/127, sx = dx * sum(xq). Then
 *     y[n] = sum over b, in order, of: acc = fma(isum[n,b], d[n,b]*dx[b], acc);
 *                                     acc = fma(m[n,b], sx[b], acc)
 *     out[n] = acc + bias[n]
 * with isum = sum q*xq, exact in integers (|isum| <= 32*127*127 < 2^24, so exact as a float
 * too). This is not the float32 model's arithmetic (activations lose ~0.4% per block, as in
 * llama.cpp): structspec/spec/fastlinear.py's "panel_int8", which a Generator uses unless
 * told not to (int8_activations=False).
 *
 * Row independence: a row's quantization reads that row only, integer sums do not depend on
 * their order, and the float steps above run in the same order for every row in every
 * kernel (AVX-512 and AVX2 alike), so a row's result is bitwise the same in a pass of 1 row
 * and in a tree pass of 32: speculative and plain decoding see identical numbers. This
 * needs the layer's input to be bitwise the same too: a difference of one ulp that crosses a
 * rounding boundary moves xq by one step. attend.c's row-exact attention provides that.
 *
 * Layout: the weight (N x K, q as unsigned bytes 0..127) in panels of 16 output columns;
 * per panel and block of 32 k: 8 groups of 4 k, each 16 columns x 4 bytes (column-major
 * within the group: what one 512-bit vpdpbusd takes), then the 16 scales d and 16 offsets m
 * as floats: 640 bytes per 32 k, the same 1.25 bytes per weight as smallgemm's quantized
 * panels. Threads: OpenMP over pairs of panels (AVX-512) or panels (AVX2).
 *
 * AMX (Intel's tile matrix units, int8): a pass of several rows can leave the dot products to
 * the tiles. A panel's 32-k block is exactly a B tile (8 rows of 16 columns x 4 bytes) and up
 * to 16 rows of a block's activations an A tile, so one tile instruction gives a block's
 * 16 x 16 integer sums; the float epilogue above then reads them back from memory, in the
 * same order: bitwise the VNNI kernels' outputs. See run_amx for where it pays.
 *
 * Signed weights (w = d*q, q any int8, no offset: GGUF Q8_0, the default model's tied output
 * layer) have kernels of their own ("signed" below): the same layout, q as signed bytes, and
 * in the offsets' place 128 * sum(q) per column and block. Their numbers: acc = fma(isum,
 * d*dx, acc) per block, in order — the same row independence.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "qdot_api.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QD_X86 1
#include <immintrin.h>
#else
#define QD_X86 0
#endif

#define PANEL 16
#define QK 32
#define QBYTES (QK * PANEL + 2 * PANEL * (int)sizeof(float)) /* 640 bytes per 32 k */

static Py_ssize_t panels_of(Py_ssize_t n) { return (n + PANEL - 1) / PANEL; }

/* Pack q (n x k signed bytes), d and m (n x k/32 floats) into the panels above (0 past n).
 * With m, each q must be 0..127 (returns 0 where one is not); without m (NULL: signed
 * weights w = d*q, q any int8: GGUF Q8_0 and Q4_0) the offsets' place holds 128 * (the
 * block's sum of q) per column as int32 (see the signed kernels). */
static int pack_weight(uint8_t *dst, const int8_t *q, const float *d, const float *m,
                       Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t np = panels_of(n), nb = k / QK;
    int negative = 0;
    /* Panels are independent: over the cores (start-up time, not a pass's). A column's 32
     * bytes of a block go 4 at a time into the 8 groups. */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(| : negative) if (np > 64)
#endif
    for (Py_ssize_t p = 0; p < np; p++) {
        for (Py_ssize_t b = 0; b < nb; b++) {
            uint8_t *blk = dst + ((size_t)p * nb + b) * QBYTES;
            float *sc = (float *)(void *)(blk + QK * PANEL);
            int32_t *corr = (int32_t *)(void *)(sc + PANEL);
            for (Py_ssize_t j = 0; j < PANEL; j++) {
                Py_ssize_t col = p * PANEL + j;
                int32_t sum = 0;
                if (col < n) {
                    const int8_t *src = q + col * k + b * QK;
                    for (int g = 0; g < QK / 4; g++)
                        memcpy(blk + g * (4 * PANEL) + j * 4, src + g * 4, 4);
                    for (int i = 0; i < QK; i++) {
                        sum += src[i];
                        negative |= src[i] < 0;
                    }
                } else {
                    for (int g = 0; g < QK / 4; g++) memset(blk + g * (4 * PANEL) + j * 4, 0, 4);
                }
                sc[j] = col < n ? d[col * nb + b] : 0.0f;
                if (m != NULL) sc[PANEL + j] = col < n ? m[col * nb + b] : 0.0f;
                else corr[j] = 128 * sum;
            }
        }
    }
    /* With m, each q must be 0..127 (int8 cannot exceed 127): the panels are not used then */
    return m == NULL || !negative;
}

/* 1: passes prefetch the next group's panels (prefetch_share; set_prefetch_next, for A/B
 * timing: results do not depend on it). */
static int prefetch_next = 1;

/* VNNI passes of one_panel_min to one_panel_max rows run the one-panel kernels (run_vnni_one;
 * max 0: none). From 20 rows two panels against blocks of 6 rows ran as fast or faster (0-4%:
 * prefills are bound by the arithmetic, which two panels feed with fewer loads).
 * set_one_panel: for tests and A/B timing, results do not depend on it. */
static int one_panel_min = 1, one_panel_max = 19;

/* 1: AVX2 passes run the half-panel kernels where they apply (narrow panels:
 * linear(..., narrow=True), every q <= NARROW_Q; signed panels up to 7 rows) from the sizes
 * below on; set_halves, for tests and A/B timing: results do not depend on it. */
static int halves_on = 1;
/* The smallest passes that run them: 2 rows. A one-block half-panel pass prefetches the next
 * panel as it computes, which the 3-row kernels' one-block passes do not. On the AVX2 EPYC
 * of sessions 26-28, a whole pass of the default model over 150 cached tokens (paired, 25
 * rounds interleaved) took 0.96 / 0.92 of its time at 2 / 3 nodes on 1 thread, 0.98 / 0.98
 * on 2; a 1-row pass measured the same either way (0.99-1.00) and keeps its unrolled
 * kernels. set_halves_from, for A/B timing (4, 4: before session 28). */
static int halves_from_narrow = 2, halves_from_signed = 2;

/* 1: quantize_rows runs quantize_block_avx2 (set_vector_quantize; tests compare both). */
static int vector_quantize = 1;

#if QD_X86

/* quantize_rows with vectors: the same numbers bit for bit (the maximum of |x| does not
 * depend on its order; x*scale and its rounding to nearest-even are the scalar steps, one
 * lane each), ~10x faster. It matters: a prompt's prefill quantizes every layer input, and
 * the plain loop was ~60% of a layer's time there (down_proj, 150 rows). max(|x|, acc)
 * keeps acc where x is NaN, as fmaxf does. */
__attribute__((target("avx2,fma"))) static void quantize_block_avx2(const float *v, int8_t *o,
                                                                    float *dxo, float *sxo) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], acc = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        x[j] = _mm256_loadu_ps(v + 8 * j);
        acc = _mm256_max_ps(_mm256_andnot_ps(sign, x[j]), acc);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float amax = _mm_cvtss_f32(h);
    float scale = amax > 0.0f && isfinite(amax) ? 127.0f / amax : 0.0f;
    const __m256 sv = _mm256_set1_ps(scale);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i sum = _mm256_setzero_si256(), t[4];
    for (int j = 0; j < 4; j++) {
        t[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x[j], sv));
        t[j] = _mm256_min_epi32(_mm256_max_epi32(t[j], lo), hi);
        sum = _mm256_add_epi32(sum, t[j]);
    }
    /* 32-bit lanes -> bytes, in order */
    __m256i p16a = _mm256_packs_epi32(t[0], t[1]), p16b = _mm256_packs_epi32(t[2], t[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)o, p8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    float d = scale > 0.0f ? amax / 127.0f : 0.0f;
    *dxo = d;
    *sxo = d * (float)_mm_cvtsi128_si32(s4);
}
#endif

/* Copy the columns ids[0..count) of packed panels (n x k, either kind) into new panels of
 * count columns, in that order: a column's numbers do not depend on its place in a panel,
 * so the new panels give those outputs bit for bit (sparse output layers). */
static void gather_columns(uint8_t *dst, const uint8_t *src, const int64_t *ids,
                           Py_ssize_t count, Py_ssize_t k) {
    Py_ssize_t nb = k / QK;
    memset(dst, 0, (size_t)panels_of(count) * nb * QBYTES);
    for (Py_ssize_t c = 0; c < count; c++) {
        Py_ssize_t sp = ids[c] / PANEL, sj = ids[c] % PANEL, dp = c / PANEL, dj = c % PANEL;
        for (Py_ssize_t b = 0; b < nb; b++) {
            const uint8_t *sb = src + ((size_t)sp * nb + b) * QBYTES;
            uint8_t *db = dst + ((size_t)dp * nb + b) * QBYTES;
            for (int g = 0; g < QK / 4; g++)
                memcpy(db + g * 4 * PANEL + dj * 4, sb + g * 4 * PANEL + sj * 4, 4);
            const float *ss = (const float *)(const void *)(sb + QK * PANEL);
            float *ds = (float *)(void *)(db + QK * PANEL);
            memcpy(ds + dj, ss + sj, sizeof(float));
            memcpy(ds + PANEL + dj, ss + PANEL + sj, sizeof(float));
        }
    }
}

/* The signed VNNI kernels read 8-bit activations as xq + 128 (bytes 0..255): n of them
 * offset in place. */
static void offset_for_signed(int8_t *xq, size_t n) {
    for (size_t i = 0; i < n; i++) xq[i] = (int8_t)((uint8_t)xq[i] ^ 0x80u);
}

/* Quantize m rows of x (k floats each, k a multiple of 32): xq (m x k bytes), dx and sx
 * (m x k/32 floats), as described at the top. The plain loop is the reference the vector
 * one must match bit for bit (and what runs without x86). */
static void quantize_rows(const float *x, Py_ssize_t m, Py_ssize_t k, int8_t *xq, float *dx,
                          float *sx) {
    Py_ssize_t nb = k / QK;
#if QD_X86
    if (vector_quantize) {
        for (Py_ssize_t r = 0; r < m; r++)
            for (Py_ssize_t b = 0; b < nb; b++)
                quantize_block_avx2(x + r * k + b * QK, xq + r * k + b * QK, dx + r * nb + b,
                                    sx + r * nb + b);
        return;
    }
#endif
    for (Py_ssize_t r = 0; r < m; r++) {
        for (Py_ssize_t b = 0; b < nb; b++) {
            const float *v = x + r * k + b * QK;
            int8_t *o = xq + r * k + b * QK;
            float amax = 0.0f;
            for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(v[i]));
            float scale = amax > 0.0f && isfinite(amax) ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int i = 0; i < QK; i++) {
                long t = lrintf(v[i] * scale);
                t = t > 127 ? 127 : (t < -127 ? -127 : t);
                o[i] = (int8_t)t;
                sum += (int)t;
            }
            float d = scale > 0.0f ? amax / 127.0f : 0.0f;
            dx[r * nb + b] = d;
            sx[r * nb + b] = d * (float)sum;
        }
    }
}

static inline int32_t load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#if QD_X86
/* AVX-512 (VNNI): R rows (1..6) against two panels q0, q1 (the same panel twice for a
 * group's odd last one, its outputs masked off). Accumulators are named variables, not
 * arrays (GCC spills arrays of vectors). SG: the signed kernels (w = d*q, q any int8):
 * vpdpbusd wants its unsigned operand first, so the activations go in as xq + 128 (bytes
 * 0..255) and each block's sum is corrected by 128 * sum(q) (packed per column in the
 * offsets' place), which gives sum q*xq exactly; their epilogue has no offset term. */
#define VN_ROWS6(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define VN_DECL(r) __m512 f##r##0 = _mm512_setzero_ps(), f##r##1 = f##r##0;
#define VN_IZERO(r) __m512i i##r##0 = _mm512_setzero_si512(), i##r##1 = i##r##0;
#define VN_DOT(r)                                                                          \
    if (NR > r) {                                                                          \
        __m512i xb = _mm512_set1_epi32(load4(xq + (r) * k + b * QK + g * 4));              \
        i##r##0 = SG ? _mm512_dpbusd_epi32(i##r##0, xb, w0)                                \
                     : _mm512_dpbusd_epi32(i##r##0, w0, xb);                               \
        i##r##1 = SG ? _mm512_dpbusd_epi32(i##r##1, xb, w1)                                \
                     : _mm512_dpbusd_epi32(i##r##1, w1, xb);                               \
    }
#define VN_SCALE(r)                                                                        \
    if (NR > r) {                                                                          \
        __m512 dxv = _mm512_set1_ps(dx[(r) * nb + b]);                                     \
        if (SG) {                                                                          \
            i##r##0 = _mm512_sub_epi32(i##r##0, c0);                                       \
            i##r##1 = _mm512_sub_epi32(i##r##1, c1);                                       \
        }                                                                                  \
        f##r##0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##r##0), _mm512_mul_ps(d0, dxv), f##r##0); \
        f##r##1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##r##1), _mm512_mul_ps(d1, dxv), f##r##1); \
        if (!SG) {                                                                         \
            __m512 sxv = _mm512_set1_ps(sx[(r) * nb + b]);                                 \
            f##r##0 = _mm512_fmadd_ps(m0, sxv, f##r##0);                                   \
            f##r##1 = _mm512_fmadd_ps(m1, sxv, f##r##1);                                   \
        }                                                                                  \
    }
#define VN_MASK(j)                                                                         \
    (cols >= ((j) + 1) * PANEL ? (__mmask16)0xFFFF                                         \
                               : (__mmask16)((1u << (cols - (j) * PANEL)) - 1))
#define VN_STORE(r)                                                                        \
    if (NR > r) {                                                                          \
        float *o = out + (r) * ldo;                                                        \
        _mm512_mask_storeu_ps(o, VN_MASK(0), _mm512_add_ps(f##r##0, b0));                  \
        if (cols > PANEL)                                                                  \
            _mm512_mask_storeu_ps(o + PANEL, VN_MASK(1), _mm512_add_ps(f##r##1, b1));      \
    }
#define VN_KERNEL(NAME, R, SIGNED)                                                         \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void NAME##R(  \
        const int8_t *xq, const float *dx, const float *sx, Py_ssize_t k,                 \
        const uint8_t *p0, const uint8_t *p1, const float *bias32, float *out,            \
        Py_ssize_t ldo, Py_ssize_t cols, const char *pf, Py_ssize_t pf_step) {            \
        enum { NR = R, SG = SIGNED };                                                     \
        Py_ssize_t nb = k / QK;                                                           \
        VN_ROWS6(VN_DECL)                                                                 \
        for (Py_ssize_t b = 0; b < nb; b++) {                                             \
            const uint8_t *q0 = p0 + b * QBYTES, *q1 = p1 + b * QBYTES;                   \
            _mm_prefetch((const char *)(q0 + 2 * QBYTES), _MM_HINT_T0);                   \
            _mm_prefetch((const char *)(q1 + 2 * QBYTES), _MM_HINT_T0);                   \
            for (Py_ssize_t o = 0; o < pf_step; o += 64)                                  \
                _mm_prefetch(pf + b * pf_step + o, _MM_HINT_T1);                          \
            VN_ROWS6(VN_IZERO)                                                            \
            for (int g = 0; g < QK / 4; g++) {                                            \
                __m512i w0 = _mm512_loadu_si512((const void *)(q0 + g * 4 * PANEL));      \
                __m512i w1 = _mm512_loadu_si512((const void *)(q1 + g * 4 * PANEL));      \
                VN_ROWS6(VN_DOT)                                                          \
            }                                                                             \
            const float *s0 = (const float *)(const void *)(q0 + QK * PANEL);             \
            const float *s1 = (const float *)(const void *)(q1 + QK * PANEL);             \
            __m512 d0 = _mm512_loadu_ps(s0), m0 = _mm512_loadu_ps(s0 + PANEL);            \
            __m512 d1 = _mm512_loadu_ps(s1), m1 = _mm512_loadu_ps(s1 + PANEL);            \
            __m512i c0 = _mm512_castps_si512(m0), c1 = _mm512_castps_si512(m1);           \
            (void)c0, (void)c1, (void)sx;                                                 \
            VN_ROWS6(VN_SCALE)                                                            \
        }                                                                                 \
        __m512 b0 = _mm512_loadu_ps(bias32), b1 = _mm512_loadu_ps(bias32 + PANEL);        \
        VN_ROWS6(VN_STORE)                                                                \
    }
VN_KERNEL(kv_, 1, 0) VN_KERNEL(kv_, 2, 0) VN_KERNEL(kv_, 3, 0)
VN_KERNEL(kv_, 4, 0) VN_KERNEL(kv_, 5, 0) VN_KERNEL(kv_, 6, 0)
VN_KERNEL(ks_, 1, 1) VN_KERNEL(ks_, 2, 1) VN_KERNEL(ks_, 3, 1)
VN_KERNEL(ks_, 4, 1) VN_KERNEL(ks_, 5, 1) VN_KERNEL(ks_, 6, 1)
#define VN_MAXR 6

/* One panel against 1-12 rows (AVX-512 VNNI). The two-panel kernels above hold 6 rows, so a
 * pass of 7-12 rows read every panel twice: the first block waited on memory, the second
 * computed from cache, and the two barely overlapped. One panel holds 12 rows' accumulators
 * (12 integer, 12 float: 24 of the 32 registers), so such a pass reads each panel once and
 * its arithmetic runs under the weight stream. Default model's 210 body linears, Zen 4, 1
 * thread, interleaved medians, against the two-panel blocks: 1-4 rows 0.85-0.88x the time
 * (V1_FETCH_FROM), 7 rows 0.72x, 8 rows 0.76x, 10 rows 0.93x, 12 rows 0.99x (bound by the
 * arithmetic), 5-6 rows ~0.97x, 13-19 rows ~0.98x (two sweeps of one panel against three of
 * two). A row's numbers are the two-panel kernels' exactly: the same integer sums, then the
 * same float steps in the same order. */
#define V1_ROWS12(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#define V1_DECL(r) __m512 f##r = _mm512_setzero_ps();
#define V1_IZERO(r) __m512i i##r = _mm512_setzero_si512();
#define V1_DOT(r)                                                                          \
    if (NR > r) {                                                                          \
        __m512i xb = _mm512_set1_epi32(load4(V1_XAT(r)));                                 \
        i##r = SG ? _mm512_dpbusd_epi32(i##r, xb, w0) : _mm512_dpbusd_epi32(i##r, w0, xb); \
    }
#define V1_SCALE(r)                                                                        \
    if (NR > r) {                                                                          \
        __m512 dxv = _mm512_set1_ps(dx[V1_SAT(r)]);                                        \
        if (SG) i##r = _mm512_sub_epi32(i##r, c0);                                         \
        f##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##r), _mm512_mul_ps(d0, dxv), f##r);    \
        if (!SG) f##r = _mm512_fmadd_ps(m0, _mm512_set1_ps(sx[V1_SAT(r)]), f##r);          \
    }
/* Passes of fewer rows prefetch nothing: one panel is one sequential stream, which the
 * hardware prefetcher follows faster alone (Zen 4, the 210 body linears: 1 row 0.80-0.85x
 * the time of the two-panel kernel with its prefetches, 0.91x with this kernel's; 3-4 rows
 * 0.89-0.93x), while from 5 rows the arithmetic leaves it behind (5-6 rows 1.02-1.06x
 * without, 12 rows 1.07-1.12x). */
#define V1_FETCH_FROM 5
/* The kernels read the rows' bytes and scales in the order they use them (run_vnni_one
 * copies them so): per 4-byte group all rows' bytes side by side, per block all rows'
 * scales, at fixed offsets from one pointer. Read in place (row-major), 12 rows took 12
 * base registers and GCC kept some on the stack (63 stack accesses in kw_12, none now);
 * 8-12 rows 0.96-0.99x the time. */
#define V1_XAT(r) (xq + ((b * (QK / 4) + g) * NR + (r)) * 4)
#define V1_SAT(r) (b * NR + (r))
#define V1_STORE(r)                                                                        \
    if (NR > r) _mm512_mask_storeu_ps(out + (r) * ldo, VN_MASK(0), _mm512_add_ps(f##r, b0));
#define V1_KERNEL(NAME, R, SIGNED)                                                         \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void NAME##R(  \
        const int8_t *xq, const float *dx, const float *sx, Py_ssize_t k,                 \
        const uint8_t *p0, const float *bias16, float *out, Py_ssize_t ldo,               \
        Py_ssize_t cols, const char *pf, Py_ssize_t pf_step) {                            \
        enum { NR = R, SG = SIGNED };                                                     \
        Py_ssize_t nb = k / QK;                                                           \
        V1_ROWS12(V1_DECL)                                                                \
        for (Py_ssize_t b = 0; b < nb; b++) {                                             \
            const uint8_t *q0 = p0 + b * QBYTES;                                          \
            if (NR >= V1_FETCH_FROM)                                                      \
                _mm_prefetch((const char *)(q0 + 2 * QBYTES), _MM_HINT_T0);               \
            for (Py_ssize_t o = 0; o < pf_step; o += 64)                                  \
                _mm_prefetch(pf + b * pf_step + o, _MM_HINT_T1);                          \
            V1_ROWS12(V1_IZERO)                                                           \
            _Pragma("GCC unroll 8")                                                       \
            for (int g = 0; g < QK / 4; g++) {                                            \
                __m512i w0 = _mm512_loadu_si512((const void *)(q0 + g * 4 * PANEL));      \
                V1_ROWS12(V1_DOT)                                                         \
            }                                                                             \
            const float *s0 = (const float *)(const void *)(q0 + QK * PANEL);             \
            __m512 d0 = _mm512_loadu_ps(s0), m0 = _mm512_loadu_ps(s0 + PANEL);            \
            __m512i c0 = _mm512_castps_si512(m0);                                         \
            (void)c0, (void)sx;                                                           \
            V1_ROWS12(V1_SCALE)                                                           \
        }                                                                                 \
        __m512 b0 = _mm512_loadu_ps(bias16);                                              \
        V1_ROWS12(V1_STORE)                                                               \
    }
V1_KERNEL(kw_, 1, 0) V1_KERNEL(kw_, 2, 0) V1_KERNEL(kw_, 3, 0)
V1_KERNEL(kw_, 4, 0) V1_KERNEL(kw_, 5, 0) V1_KERNEL(kw_, 6, 0)
V1_KERNEL(kw_, 7, 0) V1_KERNEL(kw_, 8, 0) V1_KERNEL(kw_, 9, 0)
V1_KERNEL(kw_, 10, 0) V1_KERNEL(kw_, 11, 0) V1_KERNEL(kw_, 12, 0)
V1_KERNEL(kz_, 1, 1) V1_KERNEL(kz_, 2, 1) V1_KERNEL(kz_, 3, 1)
V1_KERNEL(kz_, 4, 1) V1_KERNEL(kz_, 5, 1) V1_KERNEL(kz_, 6, 1)
V1_KERNEL(kz_, 7, 1) V1_KERNEL(kz_, 8, 1) V1_KERNEL(kz_, 9, 1)
V1_KERNEL(kz_, 10, 1) V1_KERNEL(kz_, 11, 1) V1_KERNEL(kz_, 12, 1)
#define V1_MAXR 12

/* AMX availability at compile time: GCC 11+ or clang 12+ know the tile intrinsics. */
#if QD_X86 && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define QD_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define QD_AMX 0
#endif

#if QD_AMX
/* AMX: up to 16 rows (NR) against one panel. Tiles (configured once per call and thread by
 * amx_config): 0 and 1 the integer sums of alternate 32-k blocks (16 rows x 16 int32), 2 and
 * 3 their activations (16 rows x 32 bytes, rows k apart; the rows past NR read zeros that
 * run_amx pads in), 4 and 5 their weights (the panel's block as it lies: 8 rows of 64 bytes).
 * The next block's tile product is issued before this block's epilogue, so the tile unit and
 * the vector units overlap. The epilogue is VN_SCALE's float steps for one panel, in the same
 * order, with the same zero-or-bias addition at the end: the same bits. SG: signed weights
 * (tdpbssd, activations as they are: no +128 and no correction). dx and sx: the row block's
 * scales and offset sums by block, then row ([block][16], as run_amx lays them out). */
#define AX_MAXR 16
#define AX_ROWS16(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) \
    F(13) F(14) F(15)
#define AX_DECL(r) __m512 f##r = _mm512_setzero_ps();
#define AX_EPI(r)                                                                          \
    if (NR > r) {                                                                          \
        __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)cb[r]));          \
        f##r = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(dxb[r])), f##r);    \
        if (!SG) f##r = _mm512_fmadd_ps(mo, _mm512_set1_ps(sxb[r]), f##r);                 \
    }
#define AX_EPILOGUE(BUF, BB)                                                               \
    {                                                                                      \
        const float *s = (const float *)(const void *)(pp + (BB) * QBYTES + QK * PANEL);   \
        __m512 d = _mm512_loadu_ps(s), mo = _mm512_loadu_ps(s + PANEL);                   \
        const float *dxb = dx + (BB) * AX_MAXR, *sxb = sx + (BB) * AX_MAXR;                \
        int32_t(*cb)[PANEL] = buf[BUF];                                                    \
        (void)mo, (void)sxb;                                                               \
        AX_ROWS16(AX_EPI)                                                                  \
    }
#define AX_TILE(C, A, B, BB)                                                               \
    {                                                                                      \
        _tile_zero(C);                                                                     \
        _tile_loadd(A, xq + (BB) * QK, k);                                                 \
        _tile_loadd(B, pp + (BB) * QBYTES, 4 * PANEL);                                     \
        if (SG) _tile_dpbssd(C, A, B); else _tile_dpbsud(C, A, B);                         \
    }
#define AX_STORE(r)                                                                        \
    if (NR > r) _mm512_mask_storeu_ps(out + (r) * ldo, msk, _mm512_add_ps(f##r, bv));
#define AX_PREFETCH(BB)                                                                    \
    if (pf != NULL)                                                                        \
        for (int o_ = 0; o_ < QBYTES; o_ += 64) _mm_prefetch(pf + (BB) * QBYTES + o_, _MM_HINT_T1);
/* Per block b: the tile product of block b + 1 is issued, block b's sums stored, and the
 * epilogue runs on block b - 1's, stored one step earlier. Blocks alternate between tiles
 * 0/2/4 and 1/3/5, buffers 0 and 1. (Measured on the Xeon of session 40: the tile work and the
 * epilogue still add up rather than overlap; reading the sums at once, two blocks late, or
 * with four sum tiles two products ahead took the same time.) */
#define AX_KERNEL(NAME, R, SIGNED)                                                         \
    __attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-int8"))) static void    \
    NAME##R(const int8_t *xq, const float *dx, const float *sx, Py_ssize_t k,              \
            const uint8_t *pp, const float *bias16, float *out, Py_ssize_t ldo,            \
            Py_ssize_t cols, const char *pf) {                                             \
        enum { NR = R, SG = SIGNED };                                                      \
        Py_ssize_t nb = k / QK;                                                            \
        int32_t buf[2][16][PANEL] __attribute__((aligned(64)));                            \
        AX_ROWS16(AX_DECL)                                                                 \
        AX_TILE(0, 2, 4, 0)                                                                \
        for (Py_ssize_t b = 0; b < nb; b += 2) {                                           \
            AX_PREFETCH(b)                                                                 \
            if (b + 1 < nb) AX_TILE(1, 3, 5, b + 1)                                        \
            _tile_stored(0, buf[0], 4 * PANEL);                                            \
            if (b > 0) AX_EPILOGUE(1, b - 1)                                               \
            if (b + 1 >= nb) {                                                             \
                AX_EPILOGUE(0, b)                                                          \
                break;                                                                     \
            }                                                                              \
            AX_PREFETCH(b + 1)                                                             \
            if (b + 2 < nb) AX_TILE(0, 2, 4, b + 2)                                        \
            _tile_stored(1, buf[1], 4 * PANEL);                                            \
            AX_EPILOGUE(0, b)                                                              \
            if (b + 2 >= nb) AX_EPILOGUE(1, b + 1)                                         \
        }                                                                                  \
        __mmask16 msk = cols >= PANEL ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1); \
        __m512 bv = _mm512_loadu_ps(bias16);                                               \
        AX_ROWS16(AX_STORE)                                                                \
    }
AX_KERNEL(kx_, 1, 0) AX_KERNEL(kx_, 2, 0) AX_KERNEL(kx_, 3, 0) AX_KERNEL(kx_, 4, 0)
AX_KERNEL(kx_, 5, 0) AX_KERNEL(kx_, 6, 0) AX_KERNEL(kx_, 7, 0) AX_KERNEL(kx_, 8, 0)
AX_KERNEL(kx_, 9, 0) AX_KERNEL(kx_, 10, 0) AX_KERNEL(kx_, 11, 0) AX_KERNEL(kx_, 12, 0)
AX_KERNEL(kx_, 13, 0) AX_KERNEL(kx_, 14, 0) AX_KERNEL(kx_, 15, 0) AX_KERNEL(kx_, 16, 0)
AX_KERNEL(kxs_, 1, 1) AX_KERNEL(kxs_, 2, 1) AX_KERNEL(kxs_, 3, 1) AX_KERNEL(kxs_, 4, 1)
AX_KERNEL(kxs_, 5, 1) AX_KERNEL(kxs_, 6, 1) AX_KERNEL(kxs_, 7, 1) AX_KERNEL(kxs_, 8, 1)
AX_KERNEL(kxs_, 9, 1) AX_KERNEL(kxs_, 10, 1) AX_KERNEL(kxs_, 11, 1) AX_KERNEL(kxs_, 12, 1)
AX_KERNEL(kxs_, 13, 1) AX_KERNEL(kxs_, 14, 1) AX_KERNEL(kxs_, 15, 1) AX_KERNEL(kxs_, 16, 1)

/* The tile configuration every AMX kernel runs under (palette 1; see AX_KERNEL). */
struct amx_tiles {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

__attribute__((target("amx-tile"))) static void amx_config(int rows) {
    struct amx_tiles cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 2; t++) {
        cfg.rows[t] = (uint8_t)rows, cfg.colsb[t] = 4 * PANEL; /* sums: rows x 16 int32 */
        cfg.rows[2 + t] = (uint8_t)rows, cfg.colsb[2 + t] = QK; /* activations: rows x 32 */
        cfg.rows[4 + t] = QK / 4, cfg.colsb[4 + t] = 4 * PANEL; /* weights: 8 x 64 */
    }
    /* not _tile_loadconfig: GCC's takes the address as an 8-byte memory operand, so the
     * stores of the rest of the configuration may be dropped as dead (the load then faults) */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

__attribute__((target("amx-tile"))) static void amx_release(void) { _tile_release(); }
#endif /* QD_AMX */

/* AVX2: R rows (1..3) against one panel, as two halves of 8 columns. vpmaddubsw adds two
 * u8*s8 products into int16 without saturating here (2*127*127 < 32767), vpmaddwd the two
 * pairs into int32: the same integer sums as vpdpbusd. SG (signed weights): vpmaddubsw takes
 * |q| as its unsigned operand and xq with q's sign (vpsignb), |q| <= 128 and |xq| <= 127
 * keeping the int16 pairs exact: the same integer sums as the VNNI kernels', the same
 * epilogue. */
#define AV_ROWS3(F) F(0) F(1) F(2)
#define AV_DECL(r) __m256 f##r##0 = _mm256_setzero_ps(), f##r##1 = f##r##0;
#define AV_IZERO(r) __m256i i##r##0 = _mm256_setzero_si256(), i##r##1 = i##r##0;
#define AV_DOT(r)                                                                          \
    if (NR > r) {                                                                          \
        __m256i xb = _mm256_set1_epi32(load4(xq + (r) * k + b * QK + g * 4));              \
        __m256i x0 = SG ? _mm256_sign_epi8(xb, w0) : xb;                                   \
        __m256i x1 = SG ? _mm256_sign_epi8(xb, w1) : xb;                                   \
        i##r##0 = _mm256_add_epi32(                                                        \
            i##r##0, _mm256_madd_epi16(_mm256_maddubs_epi16(a0, x0), ones));               \
        i##r##1 = _mm256_add_epi32(                                                        \
            i##r##1, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, x1), ones));               \
    }
#define AV_SCALE(r)                                                                        \
    if (NR > r) {                                                                          \
        __m256 dxv = _mm256_set1_ps(dx[(r) * nb + b]);                                     \
        f##r##0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i##r##0), _mm256_mul_ps(d0, dxv), f##r##0); \
        f##r##1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i##r##1), _mm256_mul_ps(d1, dxv), f##r##1); \
        if (!SG) {                                                                         \
            __m256 sxv = _mm256_set1_ps(sx[(r) * nb + b]);                                 \
            f##r##0 = _mm256_fmadd_ps(m0, sxv, f##r##0);                                   \
            f##r##1 = _mm256_fmadd_ps(m1, sxv, f##r##1);                                   \
        }                                                                                  \
    }
#define AV_STORE(r)                                                                        \
    if (NR > r) {                                                                          \
        float tmp[PANEL];                                                                  \
        _mm256_storeu_ps(tmp, _mm256_add_ps(f##r##0, _mm256_loadu_ps(bias16)));            \
        _mm256_storeu_ps(tmp + 8, _mm256_add_ps(f##r##1, _mm256_loadu_ps(bias16 + 8)));    \
        memcpy(out + (r) * ldo, tmp, (size_t)cols * sizeof(float));                        \
    }
#define AV_KERNEL(NAME, R, SIGNED)                                                         \
    __attribute__((target("avx2,fma"))) static void NAME##R(                               \
        const int8_t *xq, const float *dx, const float *sx, Py_ssize_t k,                 \
        const uint8_t *p0, const float *bias16, float *out, Py_ssize_t ldo,               \
        Py_ssize_t cols, const char *pf, Py_ssize_t pf_step) {                            \
        enum { NR = R, SG = SIGNED };                                                     \
        Py_ssize_t nb = k / QK;                                                           \
        const __m256i ones = _mm256_set1_epi16(1);                                        \
        AV_ROWS3(AV_DECL)                                                                 \
        for (Py_ssize_t b = 0; b < nb; b++) {                                             \
            const uint8_t *q0 = p0 + b * QBYTES;                                          \
            for (Py_ssize_t o = 0; o < pf_step; o += 64)                                  \
                _mm_prefetch(pf + b * pf_step + o, _MM_HINT_T1);                          \
            AV_ROWS3(AV_IZERO)                                                            \
            for (int g = 0; g < QK / 4; g++) {                                            \
                /* columns 0-7 and 8-15 of the group, 4 bytes each */                     \
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)(q0 + g * 4 * PANEL)); \
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(q0 + g * 4 * PANEL + 32)); \
                __m256i a0 = SG ? _mm256_abs_epi8(w0) : w0, a1 = SG ? _mm256_abs_epi8(w1) : w1; \
                AV_ROWS3(AV_DOT)                                                          \
            }                                                                             \
            const float *s0 = (const float *)(const void *)(q0 + QK * PANEL);             \
            __m256 d0 = _mm256_loadu_ps(s0), d1 = _mm256_loadu_ps(s0 + 8);                \
            __m256 m0 = _mm256_loadu_ps(s0 + PANEL), m1 = _mm256_loadu_ps(s0 + PANEL + 8); \
            (void)m0, (void)m1, (void)sx;                                                 \
            AV_ROWS3(AV_SCALE)                                                            \
        }                                                                                 \
        AV_ROWS3(AV_STORE)                                                                \
    }
AV_KERNEL(ka_, 1, 0) AV_KERNEL(ka_, 2, 0) AV_KERNEL(ka_, 3, 0)
AV_KERNEL(kas_, 1, 1) AV_KERNEL(kas_, 2, 1) AV_KERNEL(kas_, 3, 1)
#define AV_MAXR 3

/* AVX2, passes of more than 3 rows: R rows (1..12 with narrow weights, 1..7 signed) against
 * one panel, one half of 8 columns at a time, one register per row holding a half's integer
 * sums (the float accumulators live in a small array), so one read of a panel serves up to
 * 12 rows instead of 3. The activations come block by block, a block's rows one after the
 * other (xt[b][r][0..31], run_avx2 lays them out): one pointer and constant offsets serve
 * every row. Narrow weights (unsigned q <= 16: the default model's 4-bit body): a block's 8
 * groups of vpmaddubsw pairs add up in int16 without overflow (16 products of at most
 * 16 * 127 each: 32512 < 32767), so vpmaddwd runs once per block instead of once per group.
 * Signed weights (SG, its output layer): as the kernels above, vpmaddwd per group into
 * int32. The integer sums are the same integers, the epilogue the same float steps in the
 * same order: bit for bit the kernels above. */
#define AN_ROWSN(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
/* acc += vpmaddubsw(w, broadcast of the 4 bytes at p), int16 lanes. In assembly so that the
 * sums stay in registers: with 12 rows GCC kept a third of them on the stack (each step a
 * load and a store) however the C was written. */
#define AN_NARROW_DOT(acc, w, p)                                                           \
    {                                                                                      \
        __m256i t_;                                                                        \
        __asm__("vpbroadcastd %[xm], %[t]\n\t"                                            \
                "vpmaddubsw %[t], %[wv], %[t]\n\t"                                        \
                "vpaddw %[t], %[a], %[a]"                                                  \
                : [a] "+x"(acc), [t] "=&x"(t_)                                             \
                : [wv] "x"(w), [xm] "m"(*(const int32_t *)(const void *)(p)));             \
    }
#define AN_IZERO(r) __m256i i##r = _mm256_setzero_si256();
#define AN_DOT(r)                                                                          \
    if (NR > r) {                                                                          \
        if (SG) {                                                                          \
            __m256i xb = _mm256_set1_epi32(load4(x + (r) * QK + g * 4));                   \
            i##r = _mm256_add_epi32(                                                       \
                i##r, _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(xb, w)), ones)); \
        } else                                                                             \
            AN_NARROW_DOT(i##r, w, x + (r) * QK + g * 4)                                   \
    }
#define AN_SCALE(r)                                                                        \
    if (NR > r) {                                                                          \
        float *f = acc + (r) * PANEL + h * 8;                                              \
        __m256 dxv = _mm256_set1_ps(dx[(r) * nb + b]);                                     \
        __m256i isum = SG ? i##r : _mm256_madd_epi16(i##r, ones);                          \
        __m256 fv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dxv),        \
                                    _mm256_load_ps(f));                                    \
        if (!SG) fv = _mm256_fmadd_ps(m, _mm256_set1_ps(sx[(r) * nb + b]), fv);            \
        _mm256_store_ps(f, fv);                                                            \
    }
#define AN_KERNEL(NAME, R, SIGNED)                                                         \
    __attribute__((target("avx2,fma"))) static void NAME##R(                               \
        const int8_t *xq, const float *dx, const float *sx, Py_ssize_t k, Py_ssize_t xbs, \
        const uint8_t *p0, const float *bias16, float *out, Py_ssize_t ldo,               \
        Py_ssize_t cols, const char *pf, Py_ssize_t pf_step) {                            \
        enum { NR = R, SG = SIGNED };                                                     \
        Py_ssize_t nb = k / QK;                                                           \
        const __m256i ones = _mm256_set1_epi16(1);                                        \
        float acc[NR * PANEL] __attribute__((aligned(32)));                               \
        memset(acc, 0, sizeof acc);                                                       \
        (void)sx;                                                                         \
        for (Py_ssize_t b = 0; b < nb; b++) {                                             \
            const uint8_t *q0 = p0 + b * QBYTES;                                          \
            const int8_t *x = xq + b * xbs;                                               \
            const float *s0 = (const float *)(const void *)(q0 + QK * PANEL);             \
            for (Py_ssize_t o = 0; o < pf_step; o += 64)                                  \
                _mm_prefetch(pf + b * pf_step + o, _MM_HINT_T1);                          \
            _Pragma("GCC unroll 1") for (int h = 0; h < 2; h++) {                         \
                AN_ROWSN(AN_IZERO)                                                        \
                _Pragma("GCC unroll 1") for (int g = 0; g < QK / 4; g++) {                \
                    __m256i w = _mm256_loadu_si256(                                       \
                        (const __m256i *)(const void *)(q0 + g * 4 * PANEL + h * 32));    \
                    __m256i a = SG ? _mm256_abs_epi8(w) : w;                              \
                    (void)a;                                                              \
                    AN_ROWSN(AN_DOT)                                                      \
                }                                                                         \
                __m256 d = _mm256_loadu_ps(s0 + h * 8), m = _mm256_loadu_ps(s0 + PANEL + h * 8); \
                (void)m;                                                                  \
                AN_ROWSN(AN_SCALE)                                                        \
            }                                                                             \
        }                                                                                 \
        for (int r = 0; r < NR; r++) {                                                    \
            float tmp[PANEL];                                                             \
            for (int j = 0; j < PANEL; j++) tmp[j] = acc[r * PANEL + j] + bias16[j];      \
            memcpy(out + r * ldo, tmp, (size_t)cols * sizeof(float));                     \
        }                                                                                 \
    }
AN_KERNEL(kn_, 1, 0) AN_KERNEL(kn_, 2, 0) AN_KERNEL(kn_, 3, 0) AN_KERNEL(kn_, 4, 0) AN_KERNEL(kn_, 5, 0) AN_KERNEL(kn_, 6, 0) AN_KERNEL(kn_, 7, 0) AN_KERNEL(kn_, 8, 0) AN_KERNEL(kn_, 9, 0) AN_KERNEL(kn_, 10, 0) AN_KERNEL(kn_, 11, 0) AN_KERNEL(kn_, 12, 0)
AN_KERNEL(kns_, 1, 1) AN_KERNEL(kns_, 2, 1) AN_KERNEL(kns_, 3, 1) AN_KERNEL(kns_, 4, 1)
AN_KERNEL(kns_, 5, 1) AN_KERNEL(kns_, 6, 1) AN_KERNEL(kns_, 7, 1)
#define AN_MAXR 12
#define AS_MAXR 7 /* signed */
#define NARROW_Q 16 /* the largest q the narrow kernels take */

static void group_bias(float *dst, const float *bias, Py_ssize_t c0, Py_ssize_t cols,
                       Py_ssize_t width) {
    for (Py_ssize_t j = 0; j < width; j++)
        dst[j] = (bias != NULL && j < cols) ? bias[c0 + j] : 0.0f;
}

/* Which part of the next panels (next, next_len bytes; NULL: none) row block blk of blocks
 * prefetches into L2, and how many bytes per block of 32 k (*step, a multiple of 64; 0:
 * none). A pass of several row blocks: the first waits on memory for this group's weights,
 * the others compute on weights already near — they fetch the next group's, so memory and
 * arithmetic overlap. With the AVX-512 kernels (`single`), a pass of one row block fetches
 * the next pair of panels as it reads this one's: more requests in flight. Whole passes of
 * the default model, 1 thread: 6-16 rows 0.8x the time, 1 row 0.9x (AVX-512); 4-32 rows
 * 0.8-0.9x (AVX2, whose one-panel passes read the panels in memory order, which the
 * hardware prefetcher follows: fetching ahead in 1-block passes made 1-2 rows 1.1x slower). */
static const char *prefetch_share(const char *next, Py_ssize_t next_len, Py_ssize_t blk,
                                  Py_ssize_t blocks, Py_ssize_t nb, int single,
                                  Py_ssize_t *step) {
    Py_ssize_t first = blocks == 1 && single ? 0 : 1;
    *step = 0;
    if (!prefetch_next || next == NULL || blk < first) return NULL;
    Py_ssize_t share = (next_len + blocks - first - 1) / (blocks - first);
    Py_ssize_t start = (blk - first) * share;
    if (start >= next_len) return NULL;
    Py_ssize_t len = next_len - start < share ? next_len - start : share;
    *step = ((len + nb - 1) / nb + 63) & ~(Py_ssize_t)63;
    return next + start;
}

/* Copy the scales dx and offset sums sx (row-major, nb blocks a row) of rows r0..r0+rows into
 * dxt, sxt by block, then row: row r0+r's value of block b at r0 * nb + b * width + r
 * (width >= rows: the kernels' row stride), so an epilogue finds a block's rows at fixed
 * offsets from one pointer. The values are the same. */
static void scales_by_block(const float *dx, const float *sx, Py_ssize_t nb, Py_ssize_t r0,
                            Py_ssize_t rows, Py_ssize_t width, float *dxt, float *sxt) {
    for (Py_ssize_t r = 0; r < rows; r++)
        for (Py_ssize_t b = 0; b < nb; b++) {
            Py_ssize_t at = r0 * nb + b * width + r;
            dxt[at] = dx[(r0 + r) * nb + b], sxt[at] = sx[(r0 + r) * nb + b];
        }
}

static void run_vnni_one(const int8_t *xq, const float *dx, const float *sx, int8_t *xt,
                         Py_ssize_t m, Py_ssize_t k, const uint8_t *packed, Py_ssize_t n,
                         const float *bias, float *out, int threads, int sgn) {
    typedef void (*f1)(const int8_t *, const float *, const float *, Py_ssize_t,
                       const uint8_t *, const float *, float *, Py_ssize_t, Py_ssize_t,
                       const char *, Py_ssize_t);
    static const f1 plain[V1_MAXR + 1] = {NULL, kw_1, kw_2, kw_3, kw_4, kw_5, kw_6,
                                          kw_7, kw_8, kw_9, kw_10, kw_11, kw_12};
    static const f1 signd[V1_MAXR + 1] = {NULL, kz_1, kz_2, kz_3, kz_4, kz_5, kz_6,
                                          kz_7, kz_8, kz_9, kz_10, kz_11, kz_12};
    const f1 *table = sgn ? signd : plain;
    Py_ssize_t np = panels_of(n), nb = k / QK, pstride = nb * QBYTES;
    Py_ssize_t blocks = (m + V1_MAXR - 1) / V1_MAXR;
    /* xt: m * k bytes, then 2 * m * nb floats (qd_linear's scratch) */
    float *dxt = (float *)(void *)(xt + m * k), *sxt = dxt + m * nb;
    for (Py_ssize_t blk = 0, r0 = 0; blk < blocks; blk++) {
        Py_ssize_t rows = (m - r0) / (blocks - blk);
        int8_t *xb = xt + r0 * k;
        for (Py_ssize_t r = 0; r < rows; r++)
            for (Py_ssize_t q = 0; q < k / 4; q++)
                memcpy(xb + (q * rows + r) * 4, xq + (r0 + r) * k + q * 4, 4);
        scales_by_block(dx, sx, nb, r0, rows, rows, dxt, sxt);
        r0 += rows;
    }
    xq = xt, dx = dxt, sx = sxt;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && np > 1)
    for (Py_ssize_t pi = 0; pi < np; pi++) {
        Py_ssize_t c0 = pi * PANEL, cols = n - c0 < PANEL ? n - c0 : PANEL;
        float bias16[PANEL];
        group_bias(bias16, bias, c0, cols, PANEL);
        const uint8_t *p0 = packed + pi * pstride;
        /* the next panel, into L2 as this one is read (without: 7-16 rows 1.1-1.5x the time;
         * two panels ahead, or blocks 4 ahead into L1 instead of 2: no gain) */
        const char *next = pi + 1 < np && m >= V1_FETCH_FROM ? (const char *)(p0 + pstride) : NULL;
        Py_ssize_t r0 = 0;
        for (Py_ssize_t blk = 0; blk < blocks; blk++) {
            Py_ssize_t rows = (m - r0) / (blocks - blk), step = 0;
            const char *pf = prefetch_share(next, pstride, blk, blocks, nb, 1, &step);
            table[rows](xq + r0 * k, dx + r0 * nb, sx + r0 * nb, k, p0, bias16,
                        out + r0 * n + c0, n, cols, pf, step);
            r0 += rows;
        }
    }
}

static void run_vnni(const int8_t *xq, const float *dx, const float *sx, int8_t *xt,
                     Py_ssize_t m, Py_ssize_t k, const uint8_t *packed, Py_ssize_t n,
                     const float *bias, float *out, int threads, int sgn) {
    typedef void (*fv)(const int8_t *, const float *, const float *, Py_ssize_t,
                       const uint8_t *, const uint8_t *, const float *, float *, Py_ssize_t,
                       Py_ssize_t, const char *, Py_ssize_t);
    static const fv plain[VN_MAXR + 1] = {NULL, kv_1, kv_2, kv_3, kv_4, kv_5, kv_6};
    static const fv signd[VN_MAXR + 1] = {NULL, ks_1, ks_2, ks_3, ks_4, ks_5, ks_6};
    const fv *table = sgn ? signd : plain;
    Py_ssize_t np = panels_of(n), pairs = (np + 1) / 2, nb = k / QK;
    if (xt != NULL) { /* the one-panel kernels: qd_linear chose them (one_panel_min..max) */
        run_vnni_one(xq, dx, sx, xt, m, k, packed, n, bias, out, threads, sgn);
        return;
    }
    Py_ssize_t blocks = (m + VN_MAXR - 1) / VN_MAXR, pstride = nb * QBYTES;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && pairs > 1)
    for (Py_ssize_t pi = 0; pi < pairs; pi++) {
        Py_ssize_t c0 = pi * 2 * PANEL, cols = n - c0 < 2 * PANEL ? n - c0 : 2 * PANEL;
        float bias32[2 * PANEL];
        group_bias(bias32, bias, c0, cols, 2 * PANEL);
        const uint8_t *p0 = packed + 2 * pi * pstride;
        const uint8_t *p1 = cols > PANEL ? p0 + pstride : p0;
        const char *next = pi + 1 < pairs ? (const char *)(p0 + 2 * pstride) : NULL;
        Py_ssize_t next_len = next == NULL ? 0 : (n - c0 - 2 * PANEL > PANEL ? 2 : 1) * pstride;
        Py_ssize_t r0 = 0;
        for (Py_ssize_t blk = 0; blk < blocks; blk++) {
            Py_ssize_t rows = (m - r0) / (blocks - blk), step = 0;
            const char *pf = prefetch_share(next, next_len, blk, blocks, nb, 1, &step);
            table[rows](xq + r0 * k, dx + r0 * nb, sx + r0 * nb, k, p0, p1, bias32,
                        out + r0 * n + c0, n, cols, pf, step);
            r0 += rows;
        }
    }
}

static void run_avx2(const int8_t *xq, const float *dx, const float *sx, Py_ssize_t m,
                     Py_ssize_t k, const uint8_t *packed, Py_ssize_t n, const float *bias,
                     float *out, int threads, int sgn, int narrow) {
    typedef void (*fa)(const int8_t *, const float *, const float *, Py_ssize_t,
                       const uint8_t *, const float *, float *, Py_ssize_t, Py_ssize_t,
                       const char *, Py_ssize_t);
    static const fa plain[AV_MAXR + 1] = {NULL, ka_1, ka_2, ka_3};
    static const fa signd[AV_MAXR + 1] = {NULL, kas_1, kas_2, kas_3};
    typedef void (*fh)(const int8_t *, const float *, const float *, Py_ssize_t, Py_ssize_t,
                       const uint8_t *, const float *, float *, Py_ssize_t, Py_ssize_t,
                       const char *, Py_ssize_t);
    static const fh narrw[AN_MAXR + 1] = {NULL, kn_1, kn_2, kn_3, kn_4, kn_5, kn_6, kn_7, kn_8, kn_9, kn_10, kn_11, kn_12};
    static const fh hsignd[AS_MAXR + 1] = {NULL, kns_1, kns_2, kns_3, kns_4, kns_5, kns_6,
                                           kns_7};
    /* 1-row passes keep the kernels above (see halves_from_narrow); so do signed
     * passes of more than 7 rows (two blocks or more: their arithmetic is the same, and the
     * halves' second read of the activations made them slower) */
    int halves = halves_on && ((narrow && m >= halves_from_narrow) ||
                               (sgn && m >= halves_from_signed && m <= AS_MAXR));
    const fa *table = sgn ? signd : plain;
    const fh *htable = sgn ? hsignd : narrw;
    Py_ssize_t maxr = halves ? (sgn ? AS_MAXR : AN_MAXR) : AV_MAXR;
    Py_ssize_t np = panels_of(n), nb = k / QK, pstride = nb * QBYTES;
    Py_ssize_t blocks = (m + maxr - 1) / maxr;
    int single = halves; /* a one-block pass of these computes enough to prefetch */
    /* the half-panel kernels read the activations block by block, a block's rows one after
     * the other (xt[b][r][0..31]): one pointer and constant offsets for all of them */
    int8_t *xt = NULL;
    if (halves) {
        xt = malloc((size_t)(m * k));
        if (xt == NULL) halves = 0, maxr = AV_MAXR, blocks = (m + maxr - 1) / maxr, single = 0;
        else
            for (Py_ssize_t b = 0; b < nb; b++)
                for (Py_ssize_t r = 0; r < m; r++)
                    memcpy(xt + (b * m + r) * QK, xq + r * k + b * QK, QK);
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && np > 1)
    for (Py_ssize_t p = 0; p < np; p++) {
        Py_ssize_t c0 = p * PANEL, cols = n - c0 < PANEL ? n - c0 : PANEL;
        float bias16[PANEL];
        group_bias(bias16, bias, c0, cols, PANEL);
        const char *next = p + 1 < np ? (const char *)(packed + (p + 1) * pstride) : NULL;
        Py_ssize_t r0 = 0;
        for (Py_ssize_t blk = 0; blk < blocks; blk++) {
            Py_ssize_t rows = (m - r0) / (blocks - blk), step = 0;
            const char *pf = prefetch_share(next, pstride, blk, blocks, nb, single, &step);
            if (halves)
                htable[rows](xt + r0 * QK, dx + r0 * nb, sx + r0 * nb, k, m * QK,
                             packed + p * pstride, bias16, out + r0 * n + c0, n, cols, pf,
                             step);
            else
                table[rows](xq + r0 * k, dx + r0 * nb, sx + r0 * nb, k, packed + p * pstride,
                            bias16, out + r0 * n + c0, n, cols, pf, step);
            r0 += rows;
        }
    }
    free(xt);
}

#if QD_AMX
/* AMX passes: per panel, the rows in blocks of 16 (the last one what is left), so the
 * panel's weights come from memory for the first block and from L1 for the others; the first
 * block prefetches the next panel into L2 as it computes. xq must hold a multiple of 16 rows
 * (zeros past m): a last block of fewer rows still reads 16. Where it pays: a tile block
 * costs about the same whatever its rows (the tile product, its loads and the store of its
 * sums: ~6 + 4 ns per block and panel on the Xeon of session 40) and the epilogue stays per
 * row, so one row costs more than with VNNI and 8-16 rows much less — see AMX_FROM.
 * dxt: room for 2 * (m rounded up to 16) * (k / 32) floats, the scales in the tiles' order. */
static void run_amx(int8_t *xq, const float *dx, const float *sx, float *dxt, Py_ssize_t m,
                    Py_ssize_t k, const uint8_t *packed, Py_ssize_t n, const float *bias,
                    float *out, int threads, int sgn, Py_ssize_t rest_max) {
    typedef void (*fx)(const int8_t *, const float *, const float *, Py_ssize_t,
                       const uint8_t *, const float *, float *, Py_ssize_t, Py_ssize_t,
                       const char *);
    static const fx plain[AX_MAXR + 1] = {NULL, kx_1, kx_2, kx_3, kx_4, kx_5, kx_6, kx_7, kx_8,
                                          kx_9, kx_10, kx_11, kx_12, kx_13, kx_14, kx_15,
                                          kx_16};
    static const fx signd[AX_MAXR + 1] = {NULL, kxs_1, kxs_2, kxs_3, kxs_4, kxs_5, kxs_6,
                                          kxs_7, kxs_8, kxs_9, kxs_10, kxs_11, kxs_12, kxs_13,
                                          kxs_14, kxs_15, kxs_16};
    typedef void (*fv)(const int8_t *, const float *, const float *, Py_ssize_t,
                       const uint8_t *, const uint8_t *, const float *, float *, Py_ssize_t,
                       Py_ssize_t, const char *, Py_ssize_t);
    static const fv vplain[VN_MAXR + 1] = {NULL, kv_1, kv_2, kv_3, kv_4, kv_5, kv_6};
    static const fv vsignd[VN_MAXR + 1] = {NULL, ks_1, ks_2, ks_3, ks_4, ks_5, ks_6};
    const fx *table = sgn ? signd : plain;
    Py_ssize_t np = panels_of(n), nb = k / QK, pstride = nb * QBYTES, pairs = (np + 1) / 2;
    /* A last row block of at most rest_max rows (after full blocks of 16) runs on the VNNI
     * kernels, per pair of panels while they are in L1: a tile block costs the same for 1 row
     * as for 16, so 16 + 1 rows would cost two (signed panels: those rows as xq + 128, as
     * the VNNI kernels read them, rewritten in place: the tiles do not read them). */
    Py_ssize_t full = m / AX_MAXR * AX_MAXR, rest = m - full;
    int vrest = m > AX_MAXR && rest > 0 && rest <= rest_max && rest <= VN_MAXR;
    int8_t *xr = xq + full * k;
    if (vrest && sgn)
        offset_for_signed(xr, (size_t)(rest * k));
    Py_ssize_t tiled = vrest ? full : m;
    /* The tile blocks' dx and sx by block, then row ([row block][b][16]): the epilogue finds
     * a block's 16 scales at fixed offsets from one pointer (row-major, each row's address
     * took a register of its own, and 32 of them spilled; the values are the same). */
    float *sxt = dxt + (tiled + AX_MAXR - 1) / AX_MAXR * AX_MAXR * nb;
    for (Py_ssize_t r0 = 0; r0 < tiled; r0 += AX_MAXR)
        scales_by_block(dx, sx, nb, r0, tiled - r0 < AX_MAXR ? tiled - r0 : AX_MAXR, AX_MAXR,
                        dxt, sxt);
#pragma omp parallel num_threads(threads) if (threads > 1 && pairs > 1)
    {
        /* per thread: the tile configuration is thread state */
        amx_config(m < AX_MAXR ? (int)m : AX_MAXR);
#pragma omp for schedule(static)
        for (Py_ssize_t pi = 0; pi < pairs; pi++) {
            for (Py_ssize_t p = 2 * pi; p < 2 * pi + 2 && p < np; p++) {
                Py_ssize_t c0 = p * PANEL, cols = n - c0 < PANEL ? n - c0 : PANEL;
                float bias16[PANEL];
                group_bias(bias16, bias, c0, cols, PANEL);
                const char *next = prefetch_next && p + 1 < np
                                       ? (const char *)(packed + (p + 1) * pstride)
                                       : NULL;
                for (Py_ssize_t r0 = 0; r0 < tiled; r0 += AX_MAXR) {
                    Py_ssize_t rows = tiled - r0 < AX_MAXR ? tiled - r0 : AX_MAXR;
                    table[rows](xq + r0 * k, dxt + r0 * nb, sxt + r0 * nb, k,
                                packed + p * pstride, bias16, out + r0 * n + c0, n, cols,
                                r0 == 0 ? next : NULL);
                }
            }
            if (vrest) {
                Py_ssize_t c0 = pi * 2 * PANEL, cols = n - c0 < 2 * PANEL ? n - c0 : 2 * PANEL;
                float bias32[2 * PANEL];
                group_bias(bias32, bias, c0, cols, 2 * PANEL);
                const uint8_t *p0 = packed + 2 * pi * pstride;
                const uint8_t *p1 = cols > PANEL ? p0 + pstride : p0;
                (sgn ? vsignd : vplain)[rest](xr, dx + full * nb, sx + full * nb, k, p0, p1,
                                             bias32, out + full * n + c0, n, cols, NULL, 0);
            }
        }
        amx_release();
    }
}
#endif /* QD_AMX */
#endif /* QD_X86 */

static int cpu_avx2(void) {
#if QD_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int cpu_vnni(void) {
#if QD_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

/* Whether the AVX-512 VNNI kernels run (-1: not yet asked). */
static int vnni_on = -1;
static int use_vnni(void) {
    if (vnni_on < 0) vnni_on = cpu_vnni();
    return vnni_on;
}

/* Whether this CPU and OS run the AMX kernels: AMX-TILE and AMX-INT8 (CPUID 7.0 EDX bits 24,
 * 25), the tile state enabled by the OS (XCR0 bits 17, 18), the VNNI kernels' AVX-512 for the
 * epilogue, and Linux's permission for this process to use the tiles (asked once; a kernel
 * that refuses it leaves the VNNI kernels). */
static int cpu_amx(void) {
#if QD_AMX
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (((d >> 24) & 3u) != 3u || !cpu_vnni()) return 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!((c >> 27) & 1u)) return 0; /* OSXSAVE: xgetbv may run */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3u) != 3u) return 0;
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18) */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

/* Whether the AMX kernels run (-1: not yet asked), and from how many rows (AMX_FROM). */
static int amx_on = -1, amx_has = -1;
/* The smallest passes that run on the tiles. Whole passes of the default model over 150
 * cached tokens, 1 thread (medians of interleaved rounds, AMX / VNNI): 2-5 nodes 1.005-1.015,
 * 6 nodes 0.95-0.97, 8 nodes 0.91-0.93, 12 nodes 0.87-0.90, 16 nodes 0.91-0.93 (session 40). */
#define AMX_FROM 6
static int amx_from = AMX_FROM;
static int has_amx(void) {
    if (amx_has < 0) amx_has = cpu_amx();
    return amx_has;
}
static int use_amx(void) {
    if (amx_on < 0) amx_on = has_amx();
    return amx_on && use_vnni();
}

static int shape_ok(const char *fn, Py_ssize_t n, Py_ssize_t k) {
    if (n > 0 && k > 0 && k % QK == 0) return 1;
    PyErr_Format(PyExc_ValueError, "%s: n must be positive and k a positive multiple of %d",
                 fn, QK);
    return 0;
}

static PyObject *qd_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_avx2());
}

static PyObject *qd_vnni(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(use_vnni());
}

static PyObject *qd_amx(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(use_amx());
}

static PyObject *qd_set_amx(PyObject *self, PyObject *args) {
    (void)self;
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int before = use_amx();
    amx_on = on && has_amx();
    return PyBool_FromLong(before);
}

static PyObject *qd_amx_from(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(amx_from);
}

static PyObject *qd_set_amx_from(PyObject *self, PyObject *args) {
    (void)self;
    int rows;
    if (!PyArg_ParseTuple(args, "i", &rows)) return NULL;
    if (rows < 1) {
        PyErr_SetString(PyExc_ValueError, "set_amx_from: rows must be >= 1");
        return NULL;
    }
    int before = amx_from;
    amx_from = rows;
    return PyLong_FromLong(before);
}

static PyObject *qd_set_vnni(PyObject *self, PyObject *args) {
    (void)self;
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int before = use_vnni();
    vnni_on = on && cpu_vnni();
    return PyBool_FromLong(before);
}

/* Set a switch that changes speed only (on or off) from args "(on)"; returns its previous
 * state (False where the x86 kernels, which read it, are not built). */
static PyObject *set_switch(PyObject *args, int *flag) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int before = *flag;
    *flag = on;
    return PyBool_FromLong(QD_X86 && before);
}

static PyObject *qd_set_vector_quantize(PyObject *self, PyObject *args) {
    (void)self;
    return set_switch(args, &vector_quantize);
}

static PyObject *qd_set_prefetch_next(PyObject *self, PyObject *args) {
    (void)self;
    return set_switch(args, &prefetch_next);
}

static PyObject *qd_set_halves(PyObject *self, PyObject *args) {
    (void)self;
    return set_switch(args, &halves_on);
}

/* Set a pair of row bounds from args "(a, b)" where a >= min_a and b >= min_b (else
 * ValueError with message); returns the previous pair. */
static PyObject *set_pair(PyObject *args, int *a, int *b, int min_a, int min_b,
                          const char *message) {
    int va, vb;
    if (!PyArg_ParseTuple(args, "ii", &va, &vb)) return NULL;
    if (va < min_a || vb < min_b) {
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    PyObject *before = Py_BuildValue("(ii)", *a, *b);
    *a = va;
    *b = vb;
    return before;
}

static PyObject *qd_set_halves_from(PyObject *self, PyObject *args) {
    (void)self;
    return set_pair(args, &halves_from_narrow, &halves_from_signed, 1, 1,
                    "set_halves_from: row counts must be >= 1");
}

static PyObject *qd_one_panel(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return Py_BuildValue("(ii)", one_panel_min, one_panel_max);
}

static PyObject *qd_set_one_panel(PyObject *self, PyObject *args) {
    (void)self;
    return set_pair(args, &one_panel_min, &one_panel_max, 1, 0,
                    "set_one_panel: rows_from must be >= 1, rows_to >= 0");
}

static PyObject *qd_halves(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(QD_X86 && halves_on);
}

static PyObject *qd_narrow_max(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(NARROW_Q);
}

static PyObject *qd_packed_bytes(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "nn", &n, &k)) return NULL;
    if (!shape_ok("packed_bytes", n, k)) return NULL;
    return PyLong_FromSsize_t(panels_of(n) * (k / QK) * QBYTES);
}

static PyObject *qd_pack(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst, q, d, m;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "KKKKnn", &dst, &q, &d, &m, &n, &k)) return NULL;
    if (!shape_ok("pack", n, k)) return NULL;
    if (m == 0) { /* a null m packs signed weights: pack_signed's job */
        PyErr_SetString(PyExc_ValueError, "pack: m_ptr must not be 0 (signed: pack_signed)");
        return NULL;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = pack_weight((uint8_t *)(uintptr_t)dst, (const int8_t *)(uintptr_t)q,
                     (const float *)(uintptr_t)d, (const float *)(uintptr_t)m, n, k);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

static PyObject *qd_pack_signed(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst, q, d;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "KKKnn", &dst, &q, &d, &n, &k)) return NULL;
    if (!shape_ok("pack_signed", n, k)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pack_weight((uint8_t *)(uintptr_t)dst, (const int8_t *)(uintptr_t)q,
                (const float *)(uintptr_t)d, NULL, n, k);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *qd_gather(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst, src, ids;
    Py_ssize_t count, n, k;
    if (!PyArg_ParseTuple(args, "KKKnnn", &dst, &src, &ids, &count, &n, &k)) return NULL;
    if (count < 1 || !shape_ok("gather", n, k)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "gather: count must be >= 1");
        return NULL;
    }
    const int64_t *idv = (const int64_t *)(uintptr_t)ids;
    for (Py_ssize_t c = 0; c < count; c++)
        if (idv[c] < 0 || idv[c] >= n) {
            PyErr_Format(PyExc_IndexError, "gather: id %lld out of range for %zd columns",
                         (long long)idv[c], n);
            return NULL;
        }
    Py_BEGIN_ALLOW_THREADS
    gather_columns((uint8_t *)(uintptr_t)dst, (const uint8_t *)(uintptr_t)src, idv, count, k);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

#if QD_X86
/* y = x W^T + b on the integer panels (m rows of k floats into n floats each), as described
 * at the top; scratch memory of its own. Touches no Python object, so callers may hold or
 * release the GIL. Needs cpu_avx2(). Returns 0, or -1 when its scratch memory ran out. Other
 * native modules reach it through the capsule "structspec._native.qdot._linear" (see
 * headstep.c): a fused drafting step calls it twice without a Python call between. */
static int linear_run(const float *x, Py_ssize_t m, Py_ssize_t k, const uint8_t *w,
                      Py_ssize_t n, const float *b, float *o, int threads, int sgn, int narrow) {
    if (m <= 0) return 0;
    Py_ssize_t nb = k / QK;
    int amx = 0;
#if QD_AMX
    amx = m >= amx_from && use_amx();
#endif
    /* xq, then dx and sx: one allocation per call (m*k bytes, small next to the weights;
     * for the tiles, rows up to a multiple of 16, zeros past m) */
    Py_ssize_t mpad = amx ? (m + 15) / 16 * 16 : m;
    size_t xbytes = ((size_t)(mpad * k) + 63) & ~(size_t)63;
    /* (AMX: and dx, sx again in the tiles' order, see run_amx) */
    int one = !amx && m >= one_panel_min && m <= one_panel_max && use_vnni();
    size_t floats = 2 * (size_t)(m * nb) + (amx ? 2 * (size_t)(mpad * nb) : 0);
    /* (one panel: xq, dx, sx again in its kernels' order, see run_vnni_one) */
    size_t obytes = one ? xbytes + 2 * (size_t)(m * nb) * sizeof(float) : 0;
    char *scratch = malloc(xbytes + floats * sizeof(float) + obytes);
    if (scratch == NULL) return -1;
    if (mpad > m) memset(scratch + m * k, 0, (size_t)((mpad - m) * k));
    int8_t *xq = (int8_t *)scratch;
    float *dx = (float *)(void *)(scratch + xbytes), *sx = dx + m * nb;
    threads = threads < 1 ? 1 : threads;
    quantize_rows(x, m, k, xq, dx, sx);
    int vnni = use_vnni();
    if (sgn && vnni && !amx) /* the signed VNNI kernels read xq + 128 */
        offset_for_signed(xq, (size_t)(m * k));
#if QD_AMX
    if (amx) run_amx(xq, dx, sx, sx + m * nb, m, k, w, n, b, o, threads, sgn, amx_from - 1);
    else
#endif
    if (vnni) run_vnni(xq, dx, sx, one ? (int8_t *)(scratch + xbytes + floats * sizeof(float)) : NULL,
                       m, k, w, n, b, o, threads, sgn);
    else run_avx2(xq, dx, sx, m, k, w, n, b, o, threads, sgn, narrow);
    free(scratch);
    return 0;
}
#endif

static PyObject *qd_linear(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, packed, bias, out;
    Py_ssize_t m, k, n;
    int threads, sgn = 0, narrow = 0;
    if (!PyArg_ParseTuple(args, "KnnKnKKi|pp", &x, &m, &k, &packed, &n, &bias, &out, &threads,
                          &sgn, &narrow))
        return NULL;
    if (m < 0 || !shape_ok("linear", n, k)) return NULL;
#if QD_X86
    if (!cpu_avx2()) {
        PyErr_SetString(PyExc_RuntimeError, "qdot needs a CPU with AVX2 and FMA");
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = linear_run((const float *)(uintptr_t)x, m, k, (const uint8_t *)(uintptr_t)packed, n,
                    bias ? (const float *)(uintptr_t)bias : NULL, (float *)(uintptr_t)out,
                    threads, sgn, narrow);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
#else
    (void)x; (void)packed; (void)bias; (void)out; (void)threads; (void)sgn; (void)narrow;
    PyErr_SetString(PyExc_RuntimeError, "qdot is built for x86-64 only");
    return NULL;
#endif
}

static PyMethodDef METHODS[] = {
    {"available", qd_available, METH_NOARGS,
     "available(): whether this CPU runs the kernels (AVX2 + FMA)."},
    {"vnni", qd_vnni, METH_NOARGS, "vnni(): whether the AVX-512 VNNI kernels run."},
    {"set_vnni", qd_set_vnni, METH_VARARGS,
     "set_vnni(on): run the AVX-512 VNNI kernels (where the CPU has them) or the AVX2 ones "
     "(same results); returns the previous state."},
    {"amx", qd_amx, METH_NOARGS,
     "amx(): whether passes of amx_from rows or more run on AMX tiles (the CPU and OS allow "
     "it, set_amx has not turned it off, and the VNNI kernels run)."},
    {"set_amx", qd_set_amx, METH_VARARGS,
     "set_amx(on): run passes of several rows on AMX tiles (where the CPU and OS allow it) or "
     "on the VNNI kernels (same results); returns the previous state."},
    {"amx_from", qd_amx_from, METH_NOARGS,
     "amx_from(): the smallest passes that run on AMX tiles where amx() is true."},
    {"set_amx_from", qd_set_amx_from, METH_VARARGS,
     "set_amx_from(rows) -> rows: the smallest passes that run on AMX tiles (same results, "
     "for tests and timing); returns the previous value."},
    {"set_vector_quantize", qd_set_vector_quantize, METH_VARARGS,
     "set_vector_quantize(on): round activations with the vector loop (default) or the "
     "plain one (same results); returns the previous state."},
    {"set_prefetch_next", qd_set_prefetch_next, METH_VARARGS,
     "set_prefetch_next(on): whether passes prefetch the next group's panels "
     "(default on; same results, for timing); returns the previous state."},
    {"set_halves", qd_set_halves, METH_VARARGS,
     "set_halves(on): whether AVX2 passes run the half-panel kernels (narrow panels from 2 "
     "rows; signed ones from 2 to 7 rows) or the 3-row ones (default on; same results, "
     "for tests and timing); returns the previous state."},
    {"set_halves_from", qd_set_halves_from, METH_VARARGS,
     "set_halves_from(narrow_rows, signed_rows) -> (narrow_rows, signed_rows): the smallest "
     "passes that run the half-panel kernels (default 2, 2; 4, 4 before session 28; same "
     "results, for timing); returns the previous pair."},
    {"one_panel", qd_one_panel, METH_NOARGS,
     "one_panel() -> (rows_from, rows_to): the VNNI passes that run one panel against all "
     "their rows (see set_one_panel)."},
    {"set_one_panel", qd_set_one_panel, METH_VARARGS,
     "set_one_panel(rows_from, rows_to) -> (rows_from, rows_to): VNNI passes of rows_from to "
     "rows_to rows run one panel against all their rows, in blocks of at most 12 (default 1, "
     "19; rows_to 0: never; same results, for timing); returns the previous pair."},
    {"halves", qd_halves, METH_NOARGS,
     "halves(): whether the AVX2 half-panel kernels run (see set_halves)."},
    {"narrow_max", qd_narrow_max, METH_NOARGS,
     "narrow_max(): the largest q of panels that linear(..., narrow=True) may run."},
    {"packed_bytes", qd_packed_bytes, METH_VARARGS,
     "Bytes needed to pack an n x k block-quantized weight (k a multiple of 32)."},
    {"pack", qd_pack, METH_VARARGS,
     "pack(dst_ptr, q_ptr, d_ptr, m_ptr, n, k) -> bool: pack w = d*q + m (q int8 in 0..127, "
     "per-32 d, m); False where some q is negative."},
    {"pack_signed", qd_pack_signed, METH_VARARGS,
     "pack_signed(dst_ptr, q_ptr, d_ptr, n, k): pack w = d*q (q any int8, per-32 d; no "
     "offset) for linear(..., signed=True)."},
    {"gather", qd_gather, METH_VARARGS,
     "gather(dst_ptr, src_ptr, ids_ptr, count, n, k): panels of the columns ids (int64) of "
     "packed panels (n x k, either kind); dst holds packed_bytes(count, k) bytes."},
    {"linear", qd_linear, METH_VARARGS,
     "linear(x_ptr, m, k, packed_ptr, n, bias_ptr or 0, out_ptr, threads, signed=False, "
     "narrow=False): out = x W^T + b with x quantized to 8 bits per block of 32 (signed: "
     "panels from pack_signed; narrow: panels from pack whose every q is at most "
     "narrow_max(), which the AVX2 kernels then run 12 rows at a time)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "qdot",
                                    "Block-quantized weights x 8-bit activations, as integer "
                                    "dot products (AVX2, AVX-512 VNNI).",
                                    -1, METHODS};

/* The capsule other native modules call linear_run through (x86-64 builds only). */
static int linear_ok(void) {
#if QD_X86
    return cpu_avx2();
#else
    return 0;
#endif
}

PyMODINIT_FUNC PyInit_qdot(void) {
    PyObject *mod = PyModule_Create(&MODULE);
    if (mod == NULL) return NULL;
#if QD_X86
    static const QdotLinearAPI api = {linear_ok, linear_run};
    PyObject *cap = PyCapsule_New((void *)&api, "structspec._native.qdot._linear", NULL);
    if (cap == NULL || PyModule_AddObject(mod, "_linear", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(mod);
        return NULL;
    }
#else
    (void)linear_ok;
#endif
    return mod;
}
