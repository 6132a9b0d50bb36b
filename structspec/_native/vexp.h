/* exp of a vector of floats, shared by the kernels that need one (attend.c, headstep.c):
 * EXP_FN defines it for a vector width; expand it on x86-64 only, after <immintrin.h>. */
#ifndef STRUCTSPEC_NATIVE_VEXP_H
#define STRUCTSPEC_NATIVE_VEXP_H

/* exp(x) for a vector of floats, the same polynomial in every lane (Cephes' expf: range
 * reduction by ln 2 in two parts, degree-5 polynomial; ~1 ulp), x clamped to [-87.34, 88.38]
 * (attend.c: scores minus their max, x <= 0). One body for both widths (exp8, exp16): a row's softmax must see the same
 * operations whichever width its keys were in. */
#define EXP_FN(NAME, TGT, VT, VIT, P, ROUND, CASTI)                                        \
    __attribute__((target(TGT))) static inline VT NAME(VT x) {                             \
        const VT hi = P##_set1_ps(88.3762626647949f), lo = P##_set1_ps(-87.3365447505f);   \
        x = P##_min_ps(P##_max_ps(x, lo), hi);                                             \
        VT fx = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)),                    \
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                      \
        x = P##_fnmadd_ps(fx, P##_set1_ps(0.693359375f), x);                               \
        x = P##_fnmadd_ps(fx, P##_set1_ps(-2.12194440e-4f), x);                            \
        VT y = P##_set1_ps(1.9875691500e-4f);                                              \
        y = P##_fmadd_ps(y, x, P##_set1_ps(1.3981999507e-3f));                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(8.3334519073e-3f));                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(4.1665795894e-2f));                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(1.6666665459e-1f));                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(5.0000001201e-1f));                             \
        y = P##_fmadd_ps(y, P##_mul_ps(x, x), P##_add_ps(x, P##_set1_ps(1.0f)));           \
        VIT e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(fx), P##_set1_epi32(127)), 23); \
        return P##_mul_ps(y, CASTI(e));                                                    \
    }

#endif
