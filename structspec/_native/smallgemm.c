/* Small-M float32 linear layers (y = x W^T + b) for passes of a few rows, AVX2 + FMA.
 *
 * Why by hand: a verification pass of a draft tree is a GEMM of 1-32 rows against every
 * weight matrix of the model. oneDNN and MKL tune for large M: on AVX2 machines a 4-row
 * pass costs ~1.3x a 1-row pass in the linears although both are bound by reading the
 * weights once, and that cost curve decides how much speculation pays on a CPU.
 *
 * Layout: the weight (N x K, torch's out x in) is packed once into panels of 16 output
 * columns, each panel K rows of 16 floats (k-major), zero-padded past N. A pass streams
 * each panel once from memory and keeps it in L2 while blocks of up to 6 rows of x (7 in
 * one case, see plan_blocks) are multiplied against it (6 x 2 ymm accumulators); where
 * packed x has two or more blocks, they take the panel in chunks of KC k, and the second
 * block prefetches the next chunk while it computes (SG_RUN).
 *
 * Row independence: every output element is acc = fma(x[m,k], w[k,n], acc) for k = 0..K-1
 * in order (across chunks too: the accumulators are saved and resumed exactly), then
 * acc + bias[n], whatever M is and whichever row block computes it, so a row's result is
 * bitwise the same in a pass of 1 row and a pass of 32: speculative and plain decoding see
 * the same numbers from these layers.
 *
 * Passes of 6 to 64 rows first copy x into row blocks laid out k-major (x[kk][0..R-1]), so
 * a block's broadcasts read one sequential stream instead of R rows far apart: 3-12%
 * faster at 6-20 rows on an AVX2 EPYC (session 13, 11 alternating sweeps of the default
 * model's 210 body linears, medians), the same FMAs in the same order, so the same bits.
 *
 * Threads: OpenMP over panels, with the count the caller passes (torch.get_num_threads()).
 *
 * Half precision (opt-in, for drafters only: their numbers never reach the output): the
 * same panels stored as IEEE halves (F16C), widened to float32 as they are loaded, so a
 * pass reads half the bytes; the arithmetic is float32 as above.
 *
 * Exact block-quantized panels: where every weight is d*q + m with d, m halves per block of
 * 32 input features and q a small integer (GGUF Q4_1 and Q8_0, dequantized to float32: the
 * default model; recover_q finds d, m, q and refuses any weight they do not give back bit
 * for bit), the panels hold q as bytes and d, m per block (1.25 bytes per weight), widened
 * to exactly the float32 weights in registers (SG_DQ): the same chains, the same bits as
 * float32 panels, from a third of the bytes. It pays where a pass waits on memory: one row
 * takes four panels at once (kq1_4), two or three rows two panels (kq2p_R); the caller
 * keeps float32 panels for longer passes (structspec/spec/fastlinear.py, QUANT_MAX_ROWS).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

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

/* The bias of a group of `width` output columns starting at c0, of which the first `cols`
 * exist: dst[j] = bias[c0 + j], 0 past cols or without a bias. */
static inline void group_bias(float *dst, const float *bias, Py_ssize_t c0, Py_ssize_t cols,
                              Py_ssize_t width) {
    for (Py_ssize_t j = 0; j < width; j++)
        dst[j] = (bias != NULL && j < cols) ? bias[c0 + j] : 0.0f;
}

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

/* Block-quantized panels (see "Exact block-quantized panels" at the top): per 32 k, 32 rows
 * of 16 signed bytes q, then the panel's 16 scales d and 16 offsets m as floats. */
#define SG_QK 32
#define SG_QBYTES (SG_QK * PANEL + 2 * PANEL * (int)sizeof(float)) /* 640 bytes per 32 k */
#define SG_QSPK (SG_QBYTES / SG_QK)                                /* 20 bytes per k */

/* Pack a block-quantized weight, w[c][kk] = d[c][kk/32] * q[c][kk] + m[c][kk/32] (q: n x k
 * signed bytes, d and m: n x k/32 floats; k a multiple of 32) into those panels; 0 past n. */
static void pack_weight_q(int8_t *dst, const int8_t *q, const float *d, const float *m,
                          Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t np = panels_of(n), nb = k / SG_QK;
    for (Py_ssize_t p = 0; p < np; p++) {
        for (Py_ssize_t b = 0; b < nb; b++) {
            int8_t *blk = dst + ((size_t)p * nb + b) * SG_QBYTES;
            float *sc = (float *)(void *)(blk + SG_QK * PANEL);
            for (Py_ssize_t j = 0; j < PANEL; j++) {
                Py_ssize_t col = p * PANEL + j;
                for (Py_ssize_t i = 0; i < SG_QK; i++)
                    blk[i * PANEL + j] = col < n ? q[col * k + b * SG_QK + i] : 0;
                sc[j] = col < n ? d[col * nb + b] : 0.0f;
                sc[PANEL + j] = col < n ? m[col * nb + b] : 0.0f;
            }
        }
    }
}

#if SG_X86
/* One row block (R rows) against one panel, for R = 1..6. Accumulators are named
 * variables (arrays of __m256 get spilled to the stack on every iteration by GCC);
 * the NR > i tests fold away at compile time. Where row i's element kk sits: rows of k
 * floats as the caller has them (XROW), or a block of NR rows packed k-major by pack_rows
 * (XPACKED). */
#define XROW(i) (x + i * ldx + kk)
#define XPACKED(i) (x + kk * NR + i)
#define SG_FMA(i, XA)                                                                      \
    if (NR > i) {                                                                          \
        __m256 xv = _mm256_broadcast_ss(XA(i));                                            \
        lo##i = _mm256_fmadd_ps(xv, w0, lo##i);                                           \
        hi##i = _mm256_fmadd_ps(xv, w1, hi##i);                                           \
    }
#define SG_STORE(i)                                                                        \
    if (NR > i) store_row(out + i * ldo, _mm256_add_ps(lo##i, b0), _mm256_add_ps(hi##i, b1), cols);
/* A chunk of k (see SG_RUN): accumulators resume from acc (phase & 1) and, unless this is
 * the last chunk (phase & 2: add the bias, store the outputs), are saved back to it. */
#define SG_LOADACC(i)                                                                      \
    if (NR > i) {                                                                          \
        lo##i = _mm256_loadu_ps(acc + i * PANEL);                                          \
        hi##i = _mm256_loadu_ps(acc + i * PANEL + 8);                                      \
    }
#define SG_SAVEACC(i)                                                                      \
    if (NR > i) {                                                                          \
        _mm256_storeu_ps(acc + i * PANEL, lo##i);                                          \
        _mm256_storeu_ps(acc + i * PANEL + 8, hi##i);                                      \
    }
#define SG_ROWS6(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define SG_ROWS7(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6)
#define SG_FINISH(ROWS_OF)                                                                 \
    if (phase & 2) {                                                                       \
        __m256 b0 = _mm256_loadu_ps(bias16), b1 = _mm256_loadu_ps(bias16 + 8);            \
        ROWS_OF(SG_STORE)                                                                  \
    } else {                                                                               \
        ROWS_OF(SG_SAVEACC)                                                                \
    }
/* Weight loads: 16 floats, or 16 halves widened to floats (F16C). */
#define SG_LOADW_F32(p, kk)                                                                \
    __m256 w0 = _mm256_loadu_ps((p) + (kk) * PANEL);                                       \
    __m256 w1 = _mm256_loadu_ps((p) + (kk) * PANEL + 8);
#define SG_LOADW_F16(p, kk)                                                                \
    __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + (kk) * PANEL)));   \
    __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + (kk) * PANEL + 8)));
/* 8 weights from 8 bytes q and their scales d and offsets m: q*d + m in one FMA, which is
 * d*q + m rounded once, as the dequantizer computed it (d*q itself is exact in float32). */
#define SG_DQ(q8, d, m)                                                                    \
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(                               \
                        _mm_loadl_epi64((const __m128i *)(const void *)(q8)))),            \
                    d, m)
#define SG_LOADW_Q(p, kk)                                                                  \
    const int8_t *qb_ = (p) + ((kk) / SG_QK) * SG_QBYTES;                                  \
    const float *sc_ = (const float *)(const void *)(qb_ + SG_QK * PANEL);                 \
    __m256 w0 = SG_DQ(qb_ + ((kk) % SG_QK) * PANEL, _mm256_loadu_ps(sc_),                 \
                      _mm256_loadu_ps(sc_ + 16));                                          \
    __m256 w1 = SG_DQ(qb_ + ((kk) % SG_QK) * PANEL + 8, _mm256_loadu_ps(sc_ + 8),         \
                      _mm256_loadu_ps(sc_ + 24));
/* Each kernel comes twice: NAME_R(x, k, panel, bias16, out, ldo, cols) for a whole pass over
 * the panel, and NAME##c_R for a chunk of k (SG_RUN), which also takes ldx (the distance
 * between x's rows as the caller has them), acc and phase (SG_FINISH) and pfn: the next
 * chunk of the panel, one 64-byte line of it prefetched per k, or NULL. Both inline one body,
 * so whole passes run the code they ran before chunks (with the chunk loop and arguments
 * in every pass, 1-row passes were ~4% slower: session 17, 101 paired rounds). */
#define SG_CHUNK_ARGS(WT)                                                                  \
    const float *x, Py_ssize_t ldx, Py_ssize_t k, const WT *panel, const float *bias16,   \
        float *out, Py_ssize_t ldo, Py_ssize_t cols, float *acc, int phase, const WT *pfn
#define SG_WRAPPERS(NAME, R, WT, TGT)                                                      \
    __attribute__((target(TGT))) static void NAME##_##R(const float *x, Py_ssize_t k,      \
                                                        const WT *panel,                  \
                                                        const float *bias16, float *out,  \
                                                        Py_ssize_t ldo, Py_ssize_t cols) { \
        NAME##_body_##R(x, k, k, panel, bias16, out, ldo, cols, NULL, 2, NULL);           \
    }                                                                                     \
    __attribute__((target(TGT), unused)) static void NAME##c_##R(SG_CHUNK_ARGS(WT)) {     \
        NAME##_body_##R(x, ldx, k, panel, bias16, out, ldo, cols, acc, phase, pfn);       \
    }
#define SG_KERNEL(NAME, R, WT, LOADW, TGT, PF, XA, SPK)                                    \
    __attribute__((target(TGT), always_inline)) static inline void NAME##_body_##R(       \
        SG_CHUNK_ARGS(WT)) {                                                              \
        enum { NR = R };                                                                  \
        (void)ldx;                                                                        \
        __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0,     \
               hi2 = lo0, lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0; \
        if (phase & 1) { SG_ROWS6(SG_LOADACC) }                                           \
        for (Py_ssize_t kk = 0; kk < k; kk++) {                                           \
            if (pfn != NULL)                                                              \
                _mm_prefetch((const char *)(pfn + kk * (SPK)), _MM_HINT_T0);              \
            else if (PF)                                                                  \
                _mm_prefetch((const char *)(panel + (kk + PF) * (SPK)), _MM_HINT_T0);     \
            LOADW(panel, kk)                                                              \
            SG_FMA(0, XA) SG_FMA(1, XA) SG_FMA(2, XA) SG_FMA(3, XA) SG_FMA(4, XA)         \
            SG_FMA(5, XA)                                                                 \
        }                                                                                 \
        SG_FINISH(SG_ROWS6)                                                               \
    }                                                                                     \
    SG_WRAPPERS(NAME, R, WT, TGT)

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

#define SG_KERNELS(NAME, WT, LOADW, TGT, PF, XA, SPK)                                      \
    SG_KERNEL(NAME, 1, WT, LOADW, TGT, PF, XA, SPK)                                        \
    SG_KERNEL(NAME, 2, WT, LOADW, TGT, PF, XA, SPK)                                        \
    SG_KERNEL(NAME, 3, WT, LOADW, TGT, PF, XA, SPK)                                        \
    SG_KERNEL(NAME, 4, WT, LOADW, TGT, PF, XA, SPK)                                        \
    SG_KERNEL(NAME, 5, WT, LOADW, TGT, PF, XA, SPK)                                        \
    SG_KERNEL(NAME, 6, WT, LOADW, TGT, PF, XA, SPK)

/* Two families: one row streams its weights at memory speed and the hardware prefetcher
 * alone does best there; from two rows on, the FMAs per weight line slow the stream unless
 * lines are requested ahead — software prefetch 16 lines (one 16-column panel row each)
 * ahead made whole passes of the default model over 4-16 rows 6-9% cheaper, and a 1-row
 * pass 5% dearer (session 11: 30 alternating passes each at a 400-token prefix, one AVX2
 * core; medians). The arithmetic is the same in both, so are the results. */
SG_KERNELS(kf32, float, SG_LOADW_F32, "avx2,fma", 0, XROW, PANEL)
SG_KERNELS(kf16, uint16_t, SG_LOADW_F16, "avx2,fma,f16c", 0, XROW, PANEL)
SG_KERNELS(kf32p, float, SG_LOADW_F32, "avx2,fma", 16, XROW, PANEL)
SG_KERNELS(kf16p, uint16_t, SG_LOADW_F16, "avx2,fma,f16c", 16, XROW, PANEL)
/* Packed x (see the top of the file), for passes of PACK_ROWS to PACK_MAX_ROWS rows: tree
 * passes. Longer ones (prompts) read x as it is: there the gain was within noise (0.95-1.05
 * at 110 and 256 rows), and the per-thread copy would grow with the prompt. */
SG_KERNELS(kf32x, float, SG_LOADW_F32, "avx2,fma", 16, XPACKED, PANEL)
SG_KERNELS(kf16x, uint16_t, SG_LOADW_F16, "avx2,fma,f16c", 16, XPACKED, PANEL)
SG_KERNELS(kq, int8_t, SG_LOADW_Q, "avx2,fma", 0, XROW, SG_QSPK)
SG_KERNELS(kqp, int8_t, SG_LOADW_Q, "avx2,fma", 16, XROW, SG_QSPK)
SG_KERNELS(kqx, int8_t, SG_LOADW_Q, "avx2,fma", 16, XPACKED, SG_QSPK)
#define PACK_ROWS 6
#define PACK_MAX_ROWS 64

/* A 7-row block (float32 panels, packed x): 14 accumulators, the panel's first 8 columns
 * in a register and the other 8 read by each FMA from L1 as its memory operand (inline asm,
 * or the compiler keeps both halves in registers and spills an accumulator): 16 ymm
 * registers in all. Per k: 14 FMAs and 15 loads, about 7.5 cycles where a 6-row block
 * takes 6 (see plan_blocks for where it is used). Same chains, same bits. */
#define SG_FMA7(i)                                                                         \
    {                                                                                      \
        __m256 xv = _mm256_broadcast_ss(x + kk * 7 + i);                                   \
        lo##i = _mm256_fmadd_ps(xv, w0, lo##i);                                            \
        __asm__("vfmadd231ps %[w], %[x], %[acc]"                                           \
                : [acc] "+x"(hi##i) : [x] "x"(xv), [w] "m"(*(const __m256 *)(wp + 8)));    \
    }
__attribute__((target("avx2,fma"), always_inline)) static inline void kf32x_body_7(
    SG_CHUNK_ARGS(float)) {
    enum { NR = 7 };
    (void)ldx;
    __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0,
           lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0, lo6 = lo0,
           hi6 = lo0;
    if (phase & 1) { SG_ROWS7(SG_LOADACC) }
    for (Py_ssize_t kk = 0; kk < k; kk++) {
        if (pfn != NULL)
            _mm_prefetch((const char *)(pfn + kk * PANEL), _MM_HINT_T0);
        else
            _mm_prefetch((const char *)(panel + (kk + 16) * PANEL), _MM_HINT_T0);
        const float *wp = panel + kk * PANEL;
        __m256 w0 = _mm256_loadu_ps(wp);
        SG_FMA7(0) SG_FMA7(1) SG_FMA7(2) SG_FMA7(3) SG_FMA7(4) SG_FMA7(5) SG_FMA7(6)
    }
    SG_FINISH(SG_ROWS7)
}
SG_WRAPPERS(kf32x, 7, float, "avx2,fma")

/* How a pass of m rows splits into row blocks: 6-row blocks, then a tail of one or two
 * blocks.
 *
 * Why a tail: a block of R rows keeps 2R dependent FMA chains in flight, and with an FMA
 * latency of 4-5 cycles and two FMA pipes, 1-3 rows (2-6 chains) wait on latency, and each
 * block sweeps its weight panel once more from L2: a 7-row pass cost a whole 6-row block
 * more than a 6-row pass (session 15). So the last 6-row block and the rows left over are
 * cut differently: 6+1 -> one 7-row block where there is a 7-row kernel (packed float32
 * x), 6+6+2 -> 6+4+4. Measured (session 16, the default model's 210 body linears and its
 * output layer, 1 thread, 30 rounds of back-to-back sweeps, median of the rounds' new/old
 * ratios): 7 rows 0.82, 13 and 14 rows 0.92, 19 and 20 rows 0.95, 1-12 and 18 rows
 * otherwise 0.99-1.01; whole passes (150 cached tokens, medians of 30): 7 rows 0.86,
 * 13 rows 0.97, 14 rows 0.94. Not used: 6+2 -> 4+4 at 8 rows (1.04-1.11 of 6+2 in whole
 * passes), 6+3 -> 5+4 (1.08 at 9 rows), sweeping 2-3 panels at once for the leftover rows
 * (each panel once more from L2: no better than the above), and prefetching the next
 * panel into L2 during the blocks of a pass of two or more (0.98-1.13 by the same rule).
 * Passes under 6 rows are bound by reading the weights from memory and stay one block. */
typedef struct {
    Py_ssize_t sixes; /* 6-row blocks first */
    int tail[2];      /* then these blocks (0: none) */
} plan_t;

static plan_t plan_blocks(Py_ssize_t m, int have7) {
    plan_t plan = {m / ROWS, {(int)(m % ROWS), 0}};
    if ((plan.sixes > 0 && plan.tail[0] == 1 && have7) || (plan.sixes > 1 && plan.tail[0] == 2)) {
        plan.sixes -= 1;
        plan.tail[1] = plan.tail[0] == 1 ? 0 : 4;
        plan.tail[0] = plan.tail[0] == 1 ? 7 : 4;
    }
    return plan;
}

/* Rows of block j of a plan (0 past its end). */
static inline int block_rows(const plan_t *plan, Py_ssize_t j) {
    if (j < plan->sixes) return ROWS;
    j -= plan->sixes;
    return j < 2 ? plan->tail[j] : 0;
}

/* x (m rows of k) into the plan's row blocks, each k-major: a block of R rows starting at
 * row s is dst[s * k + kk * R + i]. The buffer is per calling thread and grows as needed;
 * NULL when it cannot be allocated (the caller then reads x as it is). */
static float *pack_rows(const float *x, Py_ssize_t m, Py_ssize_t k, const plan_t *plan) {
    static __thread float *buf = NULL;
    static __thread size_t cap = 0;
    size_t need = (size_t)m * (size_t)k;
    if (need > cap) {
        float *grown = malloc(need * sizeof(float));
        if (grown == NULL) return NULL;
        free(buf);
        buf = grown;
        cap = need;
    }
    Py_ssize_t s0 = 0;
    for (Py_ssize_t j = 0; s0 < m; j++) {
        int rows = block_rows(plan, j);
        float *block = buf + (size_t)s0 * k;
        /* A constant stride per block width: with `rows` unknown to the compiler this copy
         * took ~5% of a 6-row pass (session 16). */
#define SG_PACK_BLOCK(R)                                                                   \
    for (int i = 0; i < (R); i++) {                                                        \
        const float *src = x + (s0 + i) * k;                                               \
        for (Py_ssize_t kk = 0; kk < k; kk++) block[kk * (R) + i] = src[kk];               \
    }
        switch (rows) {
        case 7: SG_PACK_BLOCK(7) break;
        case 6: SG_PACK_BLOCK(6) break;
        case 5: SG_PACK_BLOCK(5) break;
        case 4: SG_PACK_BLOCK(4) break;
        default: SG_PACK_BLOCK(rows) break;
        }
#undef SG_PACK_BLOCK
        s0 += rows;
    }
    return buf;
}

/* A pass: OpenMP over panels; in each panel, the plan's row blocks.
 *
 * Chunks of k, where packed x has two or more blocks: each block runs over the first KC
 * k of the panel, then each over the next KC, and so on, the accumulators saved between
 * chunks (exactly: the chains stay in order, so do the bits). Why: the first block of a
 * panel waits on memory for the weights and the others compute from cache; one after the
 * other, a 6+2-row pass cost the 6-row pass plus the 2-row block's arithmetic. In chunks,
 * the second block prefetches the next chunk (one line per k, into L1) while it computes
 * on this one, so the stream and the arithmetic overlap. Session 17 (the default model's
 * 210 body linears and lm_head, 1 thread, 41 rounds of back-to-back sweeps, median of the
 * rounds' new/old ratios): 8 rows 0.96, 12 rows 0.87, 16 rows 0.97, 24 rows 0.94 (fastest
 * of the rounds: 0.87, 0.78, 0.86, 0.86); 1-7 rows 1.01-1.02, within noise (the same code).
 * Not kept: chunking without the prefetch (no change), chunks of 32 or 128-256 k (no better
 * than 64), 6+2 as 4+4 and 6+3 as 5+4 in chunks (1.02 and 1.11). */
#define KC 64

#define SG_RUN(NAME, SEVEN, SEVENC, WT, PACKEDX, SPK)                                         \
    static void run_##NAME(const float *x, Py_ssize_t m, Py_ssize_t k, const WT *packed,  \
                           Py_ssize_t n, const float *bias, float *out, int threads,      \
                           const plan_t *plan) {                                          \
        typedef void (*fn)(const float *, Py_ssize_t, const WT *, const float *, float *, \
                           Py_ssize_t, Py_ssize_t);                                       \
        typedef void (*fnc)(SG_CHUNK_ARGS(WT));                                           \
        static const fn table[ROWS + 2] = {NULL,     NAME##_1, NAME##_2, NAME##_3,        \
                                           NAME##_4, NAME##_5, NAME##_6, SEVEN};          \
        static const fnc ctable[ROWS + 2] = {NULL,      NAME##c_1, NAME##c_2, NAME##c_3,  \
                                             NAME##c_4, NAME##c_5, NAME##c_6, SEVENC};    \
        Py_ssize_t np = panels_of(n);                                                     \
        int chunked = PACKEDX && m <= PACK_MAX_ROWS && block_rows(plan, 1) > 0;           \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1 && np > 1)") \
        for (Py_ssize_t p = 0; p < np; p++) {                                             \
            float bias16[PANEL];                                                          \
            Py_ssize_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;              \
            group_bias(bias16, bias, p * PANEL, cols, PANEL);                             \
            const WT *panel = packed + p * k * (SPK);                                     \
            if (!chunked) {                                                               \
                Py_ssize_t m0 = 0;                                                        \
                for (Py_ssize_t j = 0; m0 < m; j++) {                                     \
                    int rows = block_rows(plan, j);                                       \
                    table[rows](x + m0 * k, k, panel, bias16, out + m0 * n + p * PANEL,     \
                                n, cols);                                                 \
                    m0 += rows;                                                           \
                }                                                                         \
                continue;                                                                 \
            }                                                                             \
            float acc[PACK_MAX_ROWS * PANEL];                                             \
            for (Py_ssize_t k0 = 0; k0 < k; k0 += KC) {                                   \
                Py_ssize_t kl = k - k0 < KC ? k - k0 : KC;                                \
                int phase = (k0 > 0 ? 1 : 0) | (k0 + kl >= k ? 2 : 0);                    \
                const WT *next = k0 + kl < k ? panel + (k0 + kl) * (SPK) : NULL;          \
                Py_ssize_t m0 = 0;                                                        \
                for (Py_ssize_t j = 0; m0 < m; j++) {                                     \
                    int rows = block_rows(plan, j);                                       \
                    /* packed x: a block's rows interleave, k0 * rows floats per chunk */ \
                    ctable[rows](x + m0 * k + k0 * rows, k, kl, panel + k0 * (SPK),       \
                                 bias16, out + m0 * n + p * PANEL, n, cols,               \
                                 acc + m0 * PANEL, phase, j == 1 ? next : NULL);          \
                    m0 += rows;                                                           \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }

SG_RUN(kf32, NULL, NULL, float, 0, PANEL)
SG_RUN(kf16, NULL, NULL, uint16_t, 0, PANEL)
SG_RUN(kf32p, NULL, NULL, float, 0, PANEL)
SG_RUN(kf16p, NULL, NULL, uint16_t, 0, PANEL)
SG_RUN(kf32x, kf32x_7, kf32xc_7, float, 1, PANEL)
SG_RUN(kf16x, NULL, NULL, uint16_t, 1, PANEL)
SG_RUN(kq, NULL, NULL, int8_t, 0, SG_QSPK)
SG_RUN(kqp, NULL, NULL, int8_t, 0, SG_QSPK)
SG_RUN(kqx, NULL, NULL, int8_t, 1, SG_QSPK)

/* One row against four quantized panels at once: a 1-row pass is bound by widening the
 * weights (SG_DQ) and by the FMA latency of its two chains per panel; eight chains from
 * four panels keep both FMA pipes busy. Each output is still the one in-order chain.
 * Each k prefetches the next 32-k block of each panel (kq2p_R too): four streams far apart
 * left the loop waiting on memory with the hardware prefetcher alone (session 19, a Zen 4
 * EPYC with its AVX-512 kernels off, paired sweeps of the default model's linears: 1 row
 * 0.71, 2 rows 0.66, 3 rows 0.81 of the same kernels without it). */
#define QP 4
__attribute__((target("avx2,fma"))) static void kq1_4(const float *x, Py_ssize_t k,
                                                      const int8_t *panel0, Py_ssize_t stride,
                                                      const float *bias, float *out,
                                                      Py_ssize_t cols) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (Py_ssize_t b = 0; b < k / SG_QK; b++) {
        const int8_t *q0 = panel0 + b * SG_QBYTES, *q1 = q0 + stride, *q2 = q1 + stride,
                     *q3 = q2 + stride;
        const float *s0 = (const float *)(const void *)(q0 + SG_QK * PANEL);
        const float *s1 = (const float *)(const void *)(q1 + SG_QK * PANEL);
        const float *s2 = (const float *)(const void *)(q2 + SG_QK * PANEL);
        const float *s3 = (const float *)(const void *)(q3 + SG_QK * PANEL);
        const float *xb = x + b * SG_QK;
        for (int i = 0; i < SG_QK; i++) {
            _mm_prefetch((const char *)(q0 + SG_QBYTES + i * SG_QSPK), _MM_HINT_T0);
            _mm_prefetch((const char *)(q1 + SG_QBYTES + i * SG_QSPK), _MM_HINT_T0);
            _mm_prefetch((const char *)(q2 + SG_QBYTES + i * SG_QSPK), _MM_HINT_T0);
            _mm_prefetch((const char *)(q3 + SG_QBYTES + i * SG_QSPK), _MM_HINT_T0);
            __m256 xv = _mm256_broadcast_ss(xb + i);
#define SG_Q1(q, s, A, B)                                                                  \
    A = _mm256_fmadd_ps(                                                                   \
        xv, SG_DQ((q) + i * PANEL, _mm256_loadu_ps(s), _mm256_loadu_ps((s) + 16)), A);     \
    B = _mm256_fmadd_ps(xv,                                                                \
                        SG_DQ((q) + i * PANEL + 8, _mm256_loadu_ps((s) + 8),               \
                              _mm256_loadu_ps((s) + 24)),                                  \
                        B);
            SG_Q1(q0, s0, a0, a1)
            SG_Q1(q1, s1, a2, a3)
            SG_Q1(q2, s2, a4, a5)
            SG_Q1(q3, s3, a6, a7)
#undef SG_Q1
        }
    }
#define SG_Q1STORE(j, A, B)                                                                \
    if (cols > (j) * PANEL)                                                                \
        store_row(out + (j) * PANEL, _mm256_add_ps(A, _mm256_loadu_ps(bias + (j) * PANEL)), \
                  _mm256_add_ps(B, _mm256_loadu_ps(bias + (j) * PANEL + 8)),               \
                  cols - (j) * PANEL < PANEL ? cols - (j) * PANEL : PANEL);
    SG_Q1STORE(0, a0, a1) SG_Q1STORE(1, a2, a3) SG_Q1STORE(2, a4, a5) SG_Q1STORE(3, a6, a7)
#undef SG_Q1STORE
}

/* Two or three rows against two quantized panels at once: 8 or 12 chains, where one panel
 * would give 4 or 6 and leave the FMA pipes waiting on their latency. The same chains. */
#define SG_Q2P(NR)                                                                         \
    __attribute__((target("avx2,fma"))) static void kq2p_##NR(                            \
        const float *x, Py_ssize_t k, const int8_t *panel0, Py_ssize_t stride,            \
        const float *bias32, float *out, Py_ssize_t ldo, Py_ssize_t cols) {               \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00,     \
               a11 = a00, a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00; \
        for (Py_ssize_t b = 0; b < k / SG_QK; b++) {                                      \
            const int8_t *q0 = panel0 + b * SG_QBYTES, *q1 = q0 + stride;                 \
            const float *s0 = (const float *)(const void *)(q0 + SG_QK * PANEL);          \
            const float *s1 = (const float *)(const void *)(q1 + SG_QK * PANEL);          \
            for (int i = 0; i < SG_QK; i++) {                                             \
                Py_ssize_t kk = b * SG_QK + i;                                            \
                _mm_prefetch((const char *)(q0 + SG_QBYTES + i * SG_QSPK), _MM_HINT_T0);  \
                _mm_prefetch((const char *)(q1 + SG_QBYTES + i * SG_QSPK), _MM_HINT_T0);  \
                __m256 w0 = SG_DQ(q0 + i * PANEL, _mm256_loadu_ps(s0),                    \
                                  _mm256_loadu_ps(s0 + 16));                              \
                __m256 w1 = SG_DQ(q0 + i * PANEL + 8, _mm256_loadu_ps(s0 + 8),            \
                                  _mm256_loadu_ps(s0 + 24));                              \
                __m256 w2 = SG_DQ(q1 + i * PANEL, _mm256_loadu_ps(s1),                    \
                                  _mm256_loadu_ps(s1 + 16));                              \
                __m256 w3 = SG_DQ(q1 + i * PANEL + 8, _mm256_loadu_ps(s1 + 8),            \
                                  _mm256_loadu_ps(s1 + 24));                              \
                SG_Q2ROW(0) SG_Q2ROW(1) if (NR > 2) { SG_Q2ROW(2) }                       \
            }                                                                             \
        }                                                                                 \
        SG_Q2STORE(0) SG_Q2STORE(1) if (NR > 2) { SG_Q2STORE(2) }                         \
    }
#define SG_Q2ROW(r)                                                                        \
    {                                                                                      \
        __m256 xv = _mm256_broadcast_ss(x + (r) * k + kk);                                 \
        a##r##0 = _mm256_fmadd_ps(xv, w0, a##r##0);                                        \
        a##r##1 = _mm256_fmadd_ps(xv, w1, a##r##1);                                        \
        a##r##2 = _mm256_fmadd_ps(xv, w2, a##r##2);                                        \
        a##r##3 = _mm256_fmadd_ps(xv, w3, a##r##3);                                        \
    }
#define SG_Q2STORE(r)                                                                      \
    {                                                                                      \
        float *o = out + (r) * ldo;                                                        \
        store_row(o, _mm256_add_ps(a##r##0, _mm256_loadu_ps(bias32)),                      \
                  _mm256_add_ps(a##r##1, _mm256_loadu_ps(bias32 + 8)),                     \
                  cols < PANEL ? cols : PANEL);                                            \
        if (cols > PANEL)                                                                  \
            store_row(o + PANEL, _mm256_add_ps(a##r##2, _mm256_loadu_ps(bias32 + 16)),     \
                      _mm256_add_ps(a##r##3, _mm256_loadu_ps(bias32 + 24)), cols - PANEL); \
    }
SG_Q2P(2)
SG_Q2P(3)

/* A pass of 2 or 3 rows over quantized panels: pairs of panels (kq2p_R), OpenMP over pairs,
 * then the panel left over, if any. */
static void run_kq2p(const float *x, Py_ssize_t m, Py_ssize_t k, const int8_t *packed,
                     Py_ssize_t n, const float *bias, float *out, int threads,
                     const plan_t *plan) {
    Py_ssize_t np = panels_of(n), pairs = np / 2, stride = k * SG_QSPK;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && pairs > 1)
    for (Py_ssize_t pi = 0; pi < pairs; pi++) {
        Py_ssize_t c0 = pi * 2 * PANEL, cols = n - c0 < 2 * PANEL ? n - c0 : 2 * PANEL;
        float bias32[2 * PANEL];
        group_bias(bias32, bias, c0, cols, 2 * PANEL);
        (m == 2 ? kq2p_2 : kq2p_3)(x, k, packed + pi * 2 * stride, stride, bias32, out + c0,
                                   n, cols);
    }
    Py_ssize_t c0 = pairs * 2 * PANEL;
    if (c0 < n) { /* the last panel: its own columns of every row */
        float tmp[3 * PANEL];
        run_kqp(x, m, k, packed + pairs * 2 * stride, n - c0, bias != NULL ? bias + c0 : NULL,
                tmp, 1, plan);
        for (Py_ssize_t r = 0; r < m; r++)
            memcpy(out + r * n + c0, tmp + r * (n - c0), (size_t)(n - c0) * sizeof(float));
    }
}

/* A 1-row pass over quantized panels: groups of four (kq1_4), OpenMP over groups, then the
 * panels left over one by one. */
static void run_kq1(const float *x, Py_ssize_t k, const int8_t *packed, Py_ssize_t n,
                    const float *bias, float *out, int threads, const plan_t *plan) {
    Py_ssize_t np = panels_of(n), groups = np / QP, stride = k * SG_QSPK;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && groups > 1)
    for (Py_ssize_t gi = 0; gi < groups; gi++) {
        Py_ssize_t c0 = gi * QP * PANEL, cols = n - c0 < QP * PANEL ? n - c0 : QP * PANEL;
        float bias64[QP * PANEL];
        group_bias(bias64, bias, c0, cols, QP * PANEL);
        kq1_4(x, k, packed + gi * QP * stride, stride, bias64, out + c0, cols);
    }
    Py_ssize_t c0 = groups * QP * PANEL;
    if (c0 < n)
        run_kq(x, 1, k, packed + groups * QP * stride, n - c0, bias != NULL ? bias + c0 : NULL,
               out + c0, 1, plan);
}


/* AVX-512 kernels, where the CPU has AVX-512F (sessions 9-18 ran on an AVX2-only EPYC;
 * session 19's AMD EPYC, Zen 4, has it). A zmm register holds a whole 16-column panel row,
 * and 32 of them hold a block of several rows against several panels at once. Every output
 * is still the one in-order chain acc = fma(x[m,k], w[k,n], acc), then + bias, so the
 * results are bitwise those of the AVX2 kernels (tests/test_block_quant.py compares both
 * paths on every pass size where both run).
 *
 * Quantized panels (kzq_R_P: R rows against P panels): each 32-k block's scales and offsets
 * for the P panels sit in registers, the q bytes of a panel row are widened with one
 * sign extension, one conversion and one FMA, and each k prefetches the next block of every
 * panel (the P streams are far apart; the hardware prefetcher alone left the loop waiting
 * on memory). Measured on the default model's 210 body linears and lm_head (1 thread,
 * paired sweeps against the AVX2 kernels as they were before they got the same prefetch,
 * medians): 1 row 0.58, 2 rows 0.49, 3 rows 0.48, 4 rows 0.61, 5 rows 0.63; and 6-8 rows on
 * quantized panels cost 0.71-0.78 of the AVX2 float32 panels (fastest sweeps), so passes of
 * up to SZ_QMAX rows read them here.
 *
 * Float32 panels (kz_R: R rows against two panels, blocks of at most SZ_ROWS rows split
 * near-evenly): 0.82-0.93 of the AVX2 kernels at 8-24 rows, 0.97-1.03 at 6-7. Not kept:
 * one panel against up to 24 rows (1.06-1.18 of this at 12-100 rows), chunks of 64 k with
 * the next chunk prefetched (0.92 at 13 rows, 1.0-1.1 at 16-48), blocks of up to 14 rows
 * (0.89 at 13-14 rows, 1.05 at 100). */
#define SZ_QMAX 8
#define SZ_ROWS 12
#define SZ_PF 16 /* float32 panels: k rows ahead */
#if SG_X86
#define SZ_FMA(r)                                                                          \
    if (NR > r) {                                                                          \
        __m512 xv = _mm512_set1_ps(x[(r) * k + kk]);                                       \
        a##r##0 = _mm512_fmadd_ps(xv, w0, a##r##0);                                        \
        a##r##1 = _mm512_fmadd_ps(xv, w1, a##r##1);                                        \
    }
#define SZ_DECL(r) __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = _mm512_setzero_ps();
/* The store mask of panel j of a group whose first `cols` columns exist. */
#define SZ_MASK(j)                                                                         \
    (cols >= ((j) + 1) * PANEL ? (__mmask16)0xFFFF                                         \
                               : (__mmask16)((1u << (cols - (j) * PANEL)) - 1))
#define SZ_STORE(r)                                                                        \
    if (NR > r) {                                                                          \
        float *o = out + (r) * ldo;                                                        \
        _mm512_mask_storeu_ps(o, SZ_MASK(0), _mm512_add_ps(a##r##0, b0));                  \
        if (cols > PANEL)                                                                  \
            _mm512_mask_storeu_ps(o + PANEL, SZ_MASK(1), _mm512_add_ps(a##r##1, b1));      \
    }
#define SZ_ROWS12(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#define SZ_KERNEL(R)                                                                       \
    __attribute__((target("avx512f"))) static void kz_##R(                                 \
        const float *x, Py_ssize_t k, const float *p0, const float *p1,                   \
        const float *bias32, float *out, Py_ssize_t ldo, Py_ssize_t cols) {               \
        enum { NR = R };                                                                  \
        SZ_ROWS12(SZ_DECL)                                                                \
        for (Py_ssize_t kk = 0; kk < k; kk++) {                                           \
            _mm_prefetch((const char *)(p0 + (kk + SZ_PF) * PANEL), _MM_HINT_T0);         \
            _mm_prefetch((const char *)(p1 + (kk + SZ_PF) * PANEL), _MM_HINT_T0);         \
            __m512 w0 = _mm512_loadu_ps(p0 + kk * PANEL);                                 \
            __m512 w1 = _mm512_loadu_ps(p1 + kk * PANEL);                                 \
            SZ_ROWS12(SZ_FMA)                                                             \
        }                                                                                 \
        __m512 b0 = _mm512_loadu_ps(bias32), b1 = _mm512_loadu_ps(bias32 + PANEL);        \
        SZ_ROWS12(SZ_STORE)                                                               \
    }
SZ_KERNEL(1) SZ_KERNEL(2) SZ_KERNEL(3) SZ_KERNEL(4) SZ_KERNEL(5) SZ_KERNEL(6)
SZ_KERNEL(7) SZ_KERNEL(8) SZ_KERNEL(9) SZ_KERNEL(10) SZ_KERNEL(11) SZ_KERNEL(12)

/* A float32 pass: OpenMP over pairs of panels (the last, odd one paired with itself, its
 * second half masked off), in each the rows in near-even blocks of at most SZ_ROWS. */
static void run_kz(const float *x, Py_ssize_t m, Py_ssize_t k, const float *packed,
                   Py_ssize_t n, const float *bias, float *out, int threads) {
    typedef void (*fz)(const float *, Py_ssize_t, const float *, const float *,
                       const float *, float *, Py_ssize_t, Py_ssize_t);
    static const fz table[SZ_ROWS + 1] = {NULL, kz_1, kz_2, kz_3, kz_4,  kz_5,  kz_6,
                                          kz_7, kz_8, kz_9, kz_10, kz_11, kz_12};
    Py_ssize_t np = panels_of(n), pairs = (np + 1) / 2, blocks = (m + SZ_ROWS - 1) / SZ_ROWS;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && pairs > 1)
    for (Py_ssize_t pi = 0; pi < pairs; pi++) {
        Py_ssize_t c0 = pi * 2 * PANEL, cols = n - c0 < 2 * PANEL ? n - c0 : 2 * PANEL;
        float bias32[2 * PANEL];
        group_bias(bias32, bias, c0, cols, 2 * PANEL);
        const float *p0 = packed + 2 * pi * k * PANEL;
        const float *p1 = cols > PANEL ? p0 + k * PANEL : p0;
        Py_ssize_t r0 = 0;
        for (Py_ssize_t b = 0; b < blocks; b++) {
            Py_ssize_t rows = (m - r0) / (blocks - b);
            table[rows](x + r0 * k, k, p0, p1, bias32, out + r0 * n + c0, n, cols);
            r0 += rows;
        }
    }
}

#define SZQ_W(j)                                                                           \
    __m512 w##j = NP > j ? _mm512_fmadd_ps(                                                \
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(                                           \
            _mm_loadu_si128((const __m128i *)(const void *)(q##j + i * PANEL)))),          \
        d##j, m##j) : w0;
#define SZQ_FMA(r)                                                                         \
    if (NR > r) {                                                                          \
        __m512 xv = _mm512_set1_ps(x[(r) * k + b * SG_QK + i]);                            \
        a##r##0 = _mm512_fmadd_ps(xv, w0, a##r##0);                                        \
        if (NP > 1) a##r##1 = _mm512_fmadd_ps(xv, w1, a##r##1);                            \
        if (NP > 2) a##r##2 = _mm512_fmadd_ps(xv, w2, a##r##2);                            \
        if (NP > 3) a##r##3 = _mm512_fmadd_ps(xv, w3, a##r##3);                            \
    }
#define SZQ_DECL(r)                                                                        \
    __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0,            \
           a##r##3 = a##r##0;
#define SZQ_ST1(r, j)                                                                      \
    if (NP > j && cols > (j) * PANEL)                                                      \
        _mm512_mask_storeu_ps(out + (r) * ldo + (j) * PANEL, SZ_MASK(j),                   \
                              _mm512_add_ps(a##r##j, _mm512_loadu_ps(bias + (j) * PANEL)));
#define SZQ_STORE(r)                                                                       \
    if (NR > r) { SZQ_ST1(r, 0) SZQ_ST1(r, 1) SZQ_ST1(r, 2) SZQ_ST1(r, 3) }
#define SZQ_ROWS8(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define SZQ_SCALES(j)                                                                      \
    const float *s##j = (const float *)(const void *)(q##j + SG_QK * PANEL);               \
    __m512 d##j = NP > j ? _mm512_loadu_ps(s##j) : d0,                                     \
           m##j = NP > j ? _mm512_loadu_ps(s##j + PANEL) : m0;
#define SZQ_PREFETCH(j)                                                                    \
    if (NP > j)                                                                            \
        _mm_prefetch((const char *)(q##j + SG_QBYTES + i * SG_QSPK), _MM_HINT_T0);
#define SZQ_KERNEL(R, P)                                                                   \
    __attribute__((target("avx512f"))) static void kzq_##R##_##P(                          \
        const float *x, Py_ssize_t k, const int8_t *panel0, Py_ssize_t stride,            \
        const float *bias, float *out, Py_ssize_t ldo, Py_ssize_t cols) {                 \
        enum { NR = R, NP = P };                                                          \
        SZQ_ROWS8(SZQ_DECL)                                                               \
        for (Py_ssize_t b = 0; b < k / SG_QK; b++) {                                      \
            const int8_t *q0 = panel0 + b * SG_QBYTES, *q1 = q0 + stride,                 \
                         *q2 = q1 + stride, *q3 = q2 + stride;                            \
            const float *s0 = (const float *)(const void *)(q0 + SG_QK * PANEL);          \
            __m512 d0 = _mm512_loadu_ps(s0), m0 = _mm512_loadu_ps(s0 + PANEL);            \
            SZQ_SCALES(1) SZQ_SCALES(2) SZQ_SCALES(3)                                     \
            for (int i = 0; i < SG_QK; i++) {                                             \
                SZQ_PREFETCH(0) SZQ_PREFETCH(1) SZQ_PREFETCH(2) SZQ_PREFETCH(3)           \
                SZQ_W(0) SZQ_W(1) SZQ_W(2) SZQ_W(3)                                       \
                SZQ_ROWS8(SZQ_FMA)                                                        \
            }                                                                             \
        }                                                                                 \
        SZQ_ROWS8(SZQ_STORE)                                                              \
    }
/* Panels per kernel by rows: 4 panels up to 4 rows (16 accumulators), 3 for 5 rows, 2 for
 * 6-8; and one panel for a group's last few. */
SZQ_KERNEL(1, 4) SZQ_KERNEL(2, 4) SZQ_KERNEL(3, 4) SZQ_KERNEL(4, 4) SZQ_KERNEL(5, 3)
SZQ_KERNEL(6, 2) SZQ_KERNEL(7, 2) SZQ_KERNEL(8, 2)
SZQ_KERNEL(1, 1) SZQ_KERNEL(2, 1) SZQ_KERNEL(3, 1) SZQ_KERNEL(4, 1) SZQ_KERNEL(5, 1)
SZQ_KERNEL(6, 1) SZQ_KERNEL(7, 1) SZQ_KERNEL(8, 1)

/* A pass of up to SZ_QMAX rows over quantized panels: OpenMP over groups of P panels, the
 * panels past the last whole group one at a time. */
static void run_kzq(const float *x, Py_ssize_t m, Py_ssize_t k, const int8_t *packed,
                    Py_ssize_t n, const float *bias, float *out, int threads) {
    typedef void (*fz)(const float *, Py_ssize_t, const int8_t *, Py_ssize_t, const float *,
                       float *, Py_ssize_t, Py_ssize_t);
    static const fz multi[SZ_QMAX + 1] = {NULL,      kzq_1_4, kzq_2_4, kzq_3_4, kzq_4_4,
                                          kzq_5_3,   kzq_6_2, kzq_7_2, kzq_8_2};
    static const fz single[SZ_QMAX + 1] = {NULL,    kzq_1_1, kzq_2_1, kzq_3_1, kzq_4_1,
                                           kzq_5_1, kzq_6_1, kzq_7_1, kzq_8_1};
    static const int per[SZ_QMAX + 1] = {0, 4, 4, 4, 4, 3, 2, 2, 2};
    Py_ssize_t P = per[m], np = panels_of(n), groups = np / P, stride = k * SG_QSPK;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && np > 1)
    for (Py_ssize_t g = 0; g < groups + (np - groups * P); g++) {
        Py_ssize_t first = g < groups ? g * P : groups * P + (g - groups);
        Py_ssize_t span = g < groups ? P : 1;
        Py_ssize_t c0 = first * PANEL, cols = n - c0 < span * PANEL ? n - c0 : span * PANEL;
        float b64[4 * PANEL];
        group_bias(b64, bias, c0, cols, 4 * PANEL);
        (span == P ? multi : single)[m](x, k, packed + first * stride, stride, b64, out + c0,
                                        n, cols);
    }
}
#endif /* SG_X86 */

/* Round packed float32 panels to half precision (round to nearest even). */
__attribute__((target("avx2,f16c"))) static void to_half(uint16_t *dst, const float *src,
                                                         Py_ssize_t count) {
    Py_ssize_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < count; i++) dst[i] = (uint16_t)_cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}
#endif

/* Whether the AVX-512 kernels run: the CPU has AVX-512F and set_avx512 has not turned them
 * off (-1: not yet asked). */
static int sz_on = -1;
static int avx512_cpu(void) {
#if SG_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
#else
    return 0;
#endif
}
static int avx512_on(void) {
    if (sz_on < 0) sz_on = avx512_cpu();
    return sz_on;
}

static int cpu_ok(int half) {
#if SG_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           (!half || __builtin_cpu_supports("f16c"));
#else
    (void)half;
    return 0;
#endif
}

static PyObject *sg_available(PyObject *self, PyObject *args) {
    (void)self;
    int half = 0;
    if (!PyArg_ParseTuple(args, "|p", &half)) return NULL;
    return PyBool_FromLong(cpu_ok(half));
}

static PyObject *sg_packed_size(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "nn", &n, &k)) return NULL;
    return PyLong_FromSsize_t(panels_of(n) * k * PANEL);
}

/* pack(dst_ptr, w_ptr, n, k, half=False): dst must hold packed_size(n, k) floats (halves
 * when half). */
static PyObject *sg_pack(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst, w;
    Py_ssize_t n, k;
    int half = 0;
    if (!PyArg_ParseTuple(args, "KKnn|p", &dst, &w, &n, &k, &half)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "pack: n and k must be positive");
        return NULL;
    }
    if (half) {
#if SG_X86
        if (!cpu_ok(1)) {
            PyErr_SetString(PyExc_RuntimeError, "half-precision panels need AVX2, FMA and F16C");
            return NULL;
        }
        Py_ssize_t count = panels_of(n) * k * PANEL;
        float *tmp = malloc((size_t)count * sizeof(float));
        if (tmp == NULL) return PyErr_NoMemory();
        Py_BEGIN_ALLOW_THREADS
        pack_weight(tmp, (const float *)(uintptr_t)w, n, k);
        to_half((uint16_t *)(uintptr_t)dst, tmp, count);
        Py_END_ALLOW_THREADS
        free(tmp);
        Py_RETURN_NONE;
#else
        PyErr_SetString(PyExc_RuntimeError, "smallgemm is built for x86-64 only");
        return NULL;
#endif
    }
    Py_BEGIN_ALLOW_THREADS
    pack_weight((float *)(uintptr_t)dst, (const float *)(uintptr_t)w, n, k);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

#if SG_X86
/* Recovery of a block quantization (the twin of structspec.spec.block_quant._recover_blocks,
 * which documents it; identical results, ~30x faster). Returns 1 when every block of w
 * (n x k, k a multiple of 32) is reproduced bit for bit, filling q, d and m. */
__attribute__((target("f16c"))) static float to_half_near(float v, int step) {
    int bits = (int)_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT) + step;
    bits = bits < 0 ? 0 : (bits > 0x7BFF ? 0x7BFF : bits);
    return _cvtsh_ss((unsigned short)bits);
}

__attribute__((target("f16c"))) static int is_half(float v) {
    return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)) == v;
}

/* Whether scale d and offset m give back every weight of a block, q clamped to lo..hi: the
 * scalar reference's steps (q = roundeven((w - m) / d), clamped; back = d*q + m, where d*q
 * is exact, so fused or not it is one rounding, as numpy's) on 8 lanes at a time, the same
 * IEEE operations in each lane, so the same bits; q is written only where all 32 match. */
__attribute__((target("avx2,fma,f16c"))) static int try_block(const float *w, float d,
                                                                 float m, int lo, int hi,
                                                                 int8_t *q) {
    if (!(d > 0.0f)) return 0;
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const __m256 vlo = _mm256_set1_ps((float)lo), vhi = _mm256_set1_ps((float)hi);
    __m256i diff = _mm256_setzero_si256();
    int32_t t[SG_QK];
    for (int c = 0; c < SG_QK; c += 8) {
        __m256 wv = _mm256_loadu_ps(w + c);
        __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(wv, vm), vd),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm256_min_ps(_mm256_max_ps(v, vlo), vhi); /* (w, d, m finite: never NaN) */
        __m256i ti = _mm256_cvtps_epi32(v);            /* integral already: exact */
        __m256 back = _mm256_add_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(ti)), vm);
        diff = _mm256_or_si256(diff, _mm256_xor_si256(_mm256_castps_si256(back),
                                                      _mm256_castps_si256(wv)));
        _mm256_storeu_si256((__m256i *)(void *)(t + c), ti);
    }
    if (!_mm256_testz_si256(diff, diff)) return 0;
    for (int i = 0; i < SG_QK; i++) q[i] = (int8_t)t[i];
    return 1;
}

__attribute__((target("avx2,fma,f16c"))) static int recover_block(const float *w, int8_t *q,
                                                                     float *d, float *m) {
    float lo = w[0], hi = w[0], amax = 0.0f;
    for (int i = 0; i < SG_QK; i++) {
        if (!isfinite(w[i])) return 0;
        lo = w[i] < lo ? w[i] : lo;
        hi = w[i] > hi ? w[i] : hi;
        amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
    }
    static const int steps[5] = {0, -1, 1, -2, 2};
    float q4 = (float)(((double)hi - (double)lo) / 15.0), q8 = (float)((double)amax / 127.0);
    int lo_half = is_half(lo);
    for (int a = 0; a < 10; a++) { /* the nearest scale of each kind first */
        int q4kind = a == 0 || (a >= 2 && a < 6);
        int step = a < 2 ? 0 : steps[(a - 2) % 4 + 1];
        if (q4kind && !lo_half) continue;
        float dd = to_half_near(q4kind ? q4 : q8, step), mm = q4kind ? lo : -0.0f;
        if (try_block(w, dd, mm, q4kind ? 0 : -127, q4kind ? 15 : 127, q)) {
            *d = dd;
            *m = mm;
            return 1;
        }
    }
    return 0;
}
#endif

/* Whether an n x k weight can be block-quantized; else a ValueError naming fn. */
static int q_shape_ok(const char *fn, Py_ssize_t n, Py_ssize_t k) {
    if (n > 0 && k > 0 && k % SG_QK == 0) return 1;
    PyErr_Format(PyExc_ValueError, "%s: n must be positive and k a positive multiple of %d",
                 fn, SG_QK);
    return 0;
}

/* recover_q(w_ptr, n, k, q_ptr, d_ptr, m_ptr) -> bool (see recover_block). */
static PyObject *sg_recover_q(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long w, q, d, m;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "KnnKKK", &w, &n, &k, &q, &d, &m)) return NULL;
    if (!q_shape_ok("recover_q", n, k)) return NULL;
#if SG_X86
    if (!cpu_ok(1)) {
        PyErr_SetString(PyExc_RuntimeError, "recover_q needs F16C");
        return NULL;
    }
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    const float *ws = (const float *)(uintptr_t)w;
    int8_t *qs = (int8_t *)(uintptr_t)q;
    float *ds = (float *)(uintptr_t)d, *ms = (float *)(uintptr_t)m;
    Py_ssize_t nb = n * (k / SG_QK);
    /* Blocks are independent: split over the cores in chunks, each chunk skipped once any
     * block has failed (a weight that is not block-quantized usually fails at its first). */
    const Py_ssize_t chunk = 4096;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (nb > 4 * chunk)
#endif
    for (Py_ssize_t c0 = 0; c0 < nb; c0 += chunk) {
        int mine;
#ifdef _OPENMP
#pragma omp atomic read
#endif
        mine = ok;
        Py_ssize_t c1 = c0 + chunk < nb ? c0 + chunk : nb;
        for (Py_ssize_t b = c0; b < c1 && mine; b++)
            mine = recover_block(ws + b * SG_QK, qs + b * SG_QK, ds + b, ms + b);
        if (!mine) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            ok = 0;
        }
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
#else
    (void)w; (void)q; (void)d; (void)m;
    PyErr_SetString(PyExc_RuntimeError, "smallgemm is built for x86-64 only");
    return NULL;
#endif
}

static PyObject *sg_packed_bytes_q(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "nn", &n, &k)) return NULL;
    if (!q_shape_ok("packed_bytes_q", n, k)) return NULL;
    return PyLong_FromSsize_t(panels_of(n) * (k / SG_QK) * SG_QBYTES);
}

/* pack_q(dst_ptr, q_ptr, d_ptr, m_ptr, n, k): dst must hold packed_bytes_q(n, k) bytes. */
static PyObject *sg_pack_q(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst, q, d, m;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "KKKKnn", &dst, &q, &d, &m, &n, &k)) return NULL;
    if (!q_shape_ok("pack_q", n, k)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pack_weight_q((int8_t *)(uintptr_t)dst, (const int8_t *)(uintptr_t)q,
                  (const float *)(uintptr_t)d, (const float *)(uintptr_t)m, n, k);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* linear(x_ptr, m, k, packed_ptr, n, bias_ptr or 0, out_ptr, threads, kind=0): kind 0
 * float32 panels, 1 (or True) half panels, 2 block-quantized panels (k a multiple of 32). */
static PyObject *sg_linear(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, packed, bias, out;
    Py_ssize_t m, k, n;
    int threads, kind = 0;
    if (!PyArg_ParseTuple(args, "KnnKnKKi|i", &x, &m, &k, &packed, &n, &bias, &out, &threads,
                          &kind))
        return NULL;
    int half = kind == 1;
    if (m < 0 || k <= 0 || n <= 0 || kind < 0 || kind > 2 || (kind == 2 && k % SG_QK != 0)) {
        PyErr_SetString(PyExc_ValueError, "linear: bad shape");
        return NULL;
    }
#if SG_X86
    if (!cpu_ok(half)) {
        PyErr_SetString(PyExc_RuntimeError,
                        half ? "half-precision panels need AVX2, FMA and F16C"
                             : "smallgemm needs a CPU with AVX2 and FMA");
        return NULL;
    }
    const float *b = bias ? (const float *)(uintptr_t)bias : NULL;
    threads = threads < 1 ? 1 : threads;
    Py_BEGIN_ALLOW_THREADS
    const float *xs = (const float *)(uintptr_t)x;
    int z = avx512_on();
    /* rows the AVX-512 kernels take read x as it is */
    int packs = m >= PACK_ROWS && m <= PACK_MAX_ROWS && !(z && (kind == 0 || m <= SZ_QMAX));
    /* The 7-row kernel reads packed float32 x only. */
    plan_t plan = plan_blocks(m, packs && kind == 0); /* 7-row kernel: float32 panels only */
    const float *xp = packs ? pack_rows(xs, m, k, &plan) : NULL;
    if (packs && xp == NULL) plan = plan_blocks(m, 0);
    float *o = (float *)(uintptr_t)out;
    if (kind == 2) {
        const int8_t *w = (const int8_t *)(uintptr_t)packed;
        if (z && m <= SZ_QMAX) run_kzq(xs, m, k, w, n, b, o, threads);
        else if (xp) run_kqx(xp, m, k, w, n, b, o, threads, &plan);
        else if (m == 1) run_kq1(xs, k, w, n, b, o, threads, &plan);
        else if (m <= 3) run_kq2p(xs, m, k, w, n, b, o, threads, &plan);
        else run_kqp(xs, m, k, w, n, b, o, threads, &plan);
    } else if (half) {
        const uint16_t *w = (const uint16_t *)(uintptr_t)packed;
        if (xp) run_kf16x(xp, m, k, w, n, b, o, threads, &plan);
        else (m > 1 ? run_kf16p : run_kf16)(xs, m, k, w, n, b, o, threads, &plan);
    } else {
        const float *w = (const float *)(uintptr_t)packed;
        if (z && m >= 2) run_kz(xs, m, k, w, n, b, o, threads);
        else if (xp) run_kf32x(xp, m, k, w, n, b, o, threads, &plan);
        else (m > 1 ? run_kf32p : run_kf32)(xs, m, k, w, n, b, o, threads, &plan);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    (void)x; (void)packed; (void)bias; (void)out; (void)threads;
    PyErr_SetString(PyExc_RuntimeError, "smallgemm is built for x86-64 only");
    return NULL;
#endif
}


/* avx512() -> whether the AVX-512 kernels run (see "AVX-512 kernels" above). */
static PyObject *sg_avx512(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(avx512_on());
}

/* set_avx512(on) -> the previous state: turn the AVX-512 kernels off (the AVX2 ones run
 * instead, with the same results: for tests and A/B runs) or back on where the CPU has
 * them. */
static PyObject *sg_set_avx512(PyObject *self, PyObject *args) {
    (void)self;
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int before = avx512_on();
    sz_on = on && avx512_cpu();
    return PyBool_FromLong(before);
}

static PyMethodDef METHODS[] = {
    {"available", sg_available, METH_VARARGS,
     "available(half=False): whether this CPU runs the kernel (AVX2 + FMA, + F16C for half)."},
    {"packed_size", sg_packed_size, METH_VARARGS,
     "Elements (floats, or halves) needed to pack an n x k weight."},
    {"pack", sg_pack, METH_VARARGS,
     "pack(dst_ptr, w_ptr, n, k, half=False): pack a float32 weight into panels."},
    {"packed_bytes_q", sg_packed_bytes_q, METH_VARARGS,
     "Bytes needed to pack an n x k block-quantized weight (k a multiple of 32)."},
    {"recover_q", sg_recover_q, METH_VARARGS,
     "recover_q(w_ptr, n, k, q_ptr, d_ptr, m_ptr): find int8 q and per-32 d, m with "
     "w == d*q + m bit for bit; False when there are none."},
    {"pack_q", sg_pack_q, METH_VARARGS,
     "pack_q(dst_ptr, q_ptr, d_ptr, m_ptr, n, k): pack w = d*q + m (int8 q, per-32 d, m)."},
    {"linear", sg_linear, METH_VARARGS,
     "linear(x_ptr, m, k, packed_ptr, n, bias_ptr, out_ptr, threads, half=False): "
     "out = x W^T + b."},
    {"avx512", sg_avx512, METH_NOARGS, "avx512(): whether the AVX-512 kernels run."},
    {"set_avx512", sg_set_avx512, METH_VARARGS,
     "set_avx512(on): run the AVX-512 kernels (where the CPU has them) or the AVX2 ones "
     "(same results); returns the previous state."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "smallgemm",
                                    "Small-M float32 linear layers (AVX2 + FMA, AVX-512 where present).", -1, METHODS};

PyMODINIT_FUNC PyInit_smallgemm(void) { return PyModule_Create(&MODULE); }
