/*
 * The server's float32 optimizer loops, shared by phub/_fastkernels.c (phub._fastkernels: the
 * kernels the Python path calls) and phub/_fastpath.c (a core's C loop, which finishes rounds
 * itself): one copy of the loops, so both paths round alike. The rules of _fastkernels.c hold here:
 * built with -ffp-contract=off, the statement order is the specification.
 */
#ifndef PHUB_FASTKERNELS_H
#define PHUB_FASTKERNELS_H

#include <Python.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------------------------------------
 * Loops. Each is written once with compile-time flags (has_last, do_clip, ...) and always inlined
 * into a call with constant flags, so every variant is a separate branch-free loop gcc vectorizes.
 * The statement order is the specification: do not reorder or merge operations.
 * ------------------------------------------------------------------------------------------- */

/* The aggregated gradient for element i: acc[i] (+ last[i]) times rescale, then optionally clipped.
 * The clip is written as two compares so that NaN propagates exactly like numpy's
 * np.minimum(np.maximum(g, -clip), clip) (fminf/fmaxf would drop the NaN). */
ALWAYS_INLINE float
grad_at(const float *acc, const float *last, Py_ssize_t i, float rescale, float clip,
        const int has_last, const int do_clip)
{
    float g = has_last ? acc[i] + last[i] : acc[i];
    g = rescale * g;
    if (do_clip) {
        g = g < -clip ? -clip : g;
        g = g > clip ? clip : g;
    }
    return g;
}

ALWAYS_INLINE void
nag_loop(float *w, float *mom, const float *acc, const float *last, Py_ssize_t n, float lr,
         float mu, float wd, float rescale, float clip, const int has_last, const int do_clip)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const float wi = w[i];
        float g = grad_at(acc, last, i, rescale, clip, has_last, do_clip);
        g = g + wd * wi;
        const float m = mu * mom[i] + g;
        g = g + mu * m;
        mom[i] = m;
        w[i] = wi - lr * g;
    }
}

ALWAYS_INLINE void
sgd_loop(float *w, float *mom, const float *acc, const float *last, Py_ssize_t n, float lr,
         float mu, float wd, float rescale, float clip, const int has_last, const int do_clip,
         const int has_mom)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const float wi = w[i];
        const float g = grad_at(acc, last, i, rescale, clip, has_last, do_clip);
        const float step = lr * (g + wd * wi);
        if (has_mom) {
            const float m = mu * mom[i] - step;
            mom[i] = m;
            w[i] = wi + m;
        } else {
            w[i] = wi - step;
        }
    }
}

/* The passes with the loop variant their arguments ask for: `last` may be NULL, and for SGD
 * `mom` (then momentum must be 0, which the callers check). */
static inline void
nag_pass(float *w, float *m, const float *a, const float *l, Py_ssize_t n, float lr, float mu, float wd,
         float rescale, float clip)
{
    const int has_last = l != NULL, do_clip = clip > 0.0f;
    if (has_last && do_clip)  nag_loop(w, m, a, l, n, lr, mu, wd, rescale, clip, 1, 1);
    else if (has_last)        nag_loop(w, m, a, l, n, lr, mu, wd, rescale, clip, 1, 0);
    else if (do_clip)         nag_loop(w, m, a, l, n, lr, mu, wd, rescale, clip, 0, 1);
    else                      nag_loop(w, m, a, l, n, lr, mu, wd, rescale, clip, 0, 0);
}

/* Expands to the sgd_loop call for one (has_last, do_clip) pair, picking the momentum variant. */
#define SGD_CALL(HL, DC)                                                                       \
    do {                                                                                       \
        if (has_mom) sgd_loop(w, m, a, l, n, lr, mu, wd, rescale, clip, HL, DC, 1);            \
        else         sgd_loop(w, m, a, l, n, lr, mu, wd, rescale, clip, HL, DC, 0);            \
    } while (0)

static inline void
sgd_pass(float *w, float *m, const float *a, const float *l, Py_ssize_t n, float lr, float mu, float wd,
         float rescale, float clip)
{
    const int has_mom = m != NULL, has_last = l != NULL, do_clip = clip > 0.0f;
    if (has_last && do_clip)  SGD_CALL(1, 1);
    else if (has_last)        SGD_CALL(1, 0);
    else if (do_clip)         SGD_CALL(0, 1);
    else                      SGD_CALL(0, 0);
}

#undef SGD_CALL

#endif /* PHUB_FASTKERNELS_H */
