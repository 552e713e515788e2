/* The machine's limits for elementwise and optimizer work, written once in plain C and
 * compiled -O3 -march=native (bench/CMakeLists.txt): what a single thread of this machine can
 * do when nothing but the access pattern stands in the way. bench/limits.py loads this library
 * (ctypes) and times its functions in turn with the benchmarks' steps.
 *
 * - copy:  a[i] = b[i]                 STREAM's copy,  8 bytes per element (read b, write a);
 *          also timed copy by copy (copy_timed_ns), as lazyrt's step timings time each step
 * - triad: a[i] = b[i] + s * c[i]      STREAM's triad, 12 bytes per element
 * - adamw: torch.optim.AdamW's update (torch 1.13's _single_tensor_adamw, amsgrad off, f32) over
 *   a list of tensors, reading param, grad, exp_avg, exp_avg_sq and writing param, exp_avg,
 *   exp_avg_sq: 28 bytes per parameter.
 *
 * As STREAM, the bytes counted are the ones the pattern must move; the read-for-ownership of
 * written lines is not counted. Loops are kept loops (no memcpy: -fno-tree-loop-distribute-
 * patterns), stores are ordinary stores, and each f32 operation rounds once (-ffp-contract=off),
 * in torch's order.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

void lazyrt_limits_copy(float* restrict a, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i];
}

/* The mean time of `reps` copies of n floats (after one not counted), each timed on its own
 * with the monotonic clock, as lazyrt times each step of an executable with kernel timings on:
 * the limit of a step that moves 8 n bytes, with the same clock reads in it. */
double lazyrt_limits_copy_timed_ns(float* restrict a, const float* restrict b, size_t n, size_t reps) {
  lazyrt_limits_copy(a, b, n);
  double total = 0;
  for (size_t r = 0; r < reps; ++r) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    lazyrt_limits_copy(a, b, n);
    __asm__ volatile("" ::: "memory");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    total += (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
  }
  return total / (double)reps;
}

void lazyrt_limits_triad(float* restrict a, const float* restrict b, const float* restrict c, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

static void adamw_one(float* restrict p, const float* restrict g, float* restrict m, float* restrict v, size_t n,
                      float decay, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                      float bias_correction2_sqrt, float eps, float neg_step_size) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    /* param.mul_(1 - lr * weight_decay) */
    const float pi = p[i] * decay;
    /* exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1) */
    const float mi = m[i] * beta1 + one_minus_beta1 * gi;
    /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2) */
    const float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
    /* denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) */
    const float denom = sqrtf(vi) / bias_correction2_sqrt + eps;
    /* param.addcdiv_(exp_avg, denom, value=-step_size) */
    p[i] = pi + neg_step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

/* One AdamW step (the step-th, counting from 1) over `tensors` tensors of numels[k] elements.
 * The scalars are computed in double, as torch computes them in Python, and used as f32, as
 * torch's f32 kernels use them. */
void lazyrt_limits_adamw(size_t tensors, float* const* params, const float* const* grads, float* const* exp_avgs,
                         float* const* exp_avg_sqs, const size_t* numels, double lr, double beta1, double beta2,
                         double eps, double weight_decay, int64_t step) {
  const double bias_correction1 = 1.0 - pow(beta1, (double)step);
  const double bias_correction2 = 1.0 - pow(beta2, (double)step);
  const float decay = (float)(1.0 - lr * weight_decay);
  const float neg_step_size = (float)(-(lr / bias_correction1));
  const float bc2_sqrt = (float)sqrt(bias_correction2);
  for (size_t k = 0; k < tensors; ++k)
    adamw_one(params[k], grads[k], exp_avgs[k], exp_avg_sqs[k], numels[k], decay, (float)beta1, (float)(1.0 - beta1),
              (float)beta2, (float)(1.0 - beta2), bc2_sqrt, (float)eps, neg_step_size);
}
