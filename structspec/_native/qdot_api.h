/* qdot's integer linear layer as other native modules call it: the capsule
 * "structspec._native.qdot._linear" holds a QdotLinearAPI (see qdot.c's linear_run). Include
 * after <Python.h>. */
#ifndef STRUCTSPEC_NATIVE_QDOT_API_H
#define STRUCTSPEC_NATIVE_QDOT_API_H

#include <stdint.h>

typedef struct {
    /* 1 where linear runs on this CPU (AVX2 and FMA) */
    int (*ok)(void);
    /* y[m, n] = x[m, k] W^T + b on packed integer panels (qdot.pack / pack_signed); 0, or -1
     * when scratch memory ran out. Touches no Python object. */
    int (*linear)(const float *x, Py_ssize_t m, Py_ssize_t k, const uint8_t *w, Py_ssize_t n,
                  const float *b, float *o, int threads, int sgn, int narrow);
} QdotLinearAPI;

#endif
