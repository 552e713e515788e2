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
 * - layer_norm, softmax, row_mse: the fused reductions' arithmetic, row by row, as lazyrt
 *   defines it: each row's sums in double, sixteen interleaved partial sums added in order at
 *   the end (a row's mean, then its squared deviations from it), the elementwise work in f32,
 *   exp from the same polynomial as lazyrt's (vmath.h). Not a byte limit but an arithmetic
 *   one: what these exact sums and that exp cost one thread of this machine.
 *
 * - counter_loop: bench/peers.py's counter loop (c = 0, x = 0.0f; while c < n: c + 1, x + 1),
 *   whose x is a chain of n dependent f32 adds: the latency of one add an iteration bounds it.
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

/* The row's sum (squares: of its squared deviations from mean) in double: sixteen interleaved
 * partial sums, added in order at the end, then the rest of the row in order. */
static double row_sum(const float* restrict x, size_t n, double mean, int squares) {
  double part[16] = {0};
  size_t i = 0;
  if (squares) {
    for (; i + 16 <= n; i += 16)
      for (int k = 0; k < 16; ++k) {
        const double d = (double)x[i + k] - mean;
        part[k] += d * d;
      }
  } else {
    for (; i + 16 <= n; i += 16)
      for (int k = 0; k < 16; ++k) part[k] += (double)x[i + k];
  }
  double sum = 0;
  for (int k = 0; k < 16; ++k) sum += part[k];
  for (; i < n; ++i) {
    const double v = (double)x[i];
    sum += squares ? (v - mean) * (v - mean) : v;
  }
  return sum;
}

/* layer_norm over the last dim of x[rows, n] with weight w and bias b (torch's F.layer_norm). */
void lazyrt_limits_layer_norm(const float* restrict x, const float* restrict w, const float* restrict b,
                              float* restrict y, size_t rows, size_t n, float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const double mean_d = row_sum(xr, n, 0, 0) / (double)n;
    const float var = (float)(row_sum(xr, n, mean_d, 1) / (double)n);
    const float mean = (float)mean_d, rstd = 1.0f / sqrtf(var + eps);
    float* yr = y + r * n;
    for (size_t i = 0; i < n; ++i) yr[i] = ((xr[i] - mean) * rstd) * w[i] + b[i];
  }
}

static inline float bits_to_float(int32_t i) {
  union { int32_t i; float f; } u = {.i = i};
  return u.f;
}
static inline int32_t float_to_bits(float f) {
  union { float f; int32_t i; } u = {.f = f};
  return u.i;
}

/* lazyrt's exp for f32 (scalar/vmath.h: exp_f32), the same operations. */
static inline float exp_f32(float x) {
  const float xc = x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x);
  const float round = 12582912.0f;
  const float t = fmaf(xc, 1.44269504088896341f, round);
  const float n = t - round;
  const float r = fmaf(n, 2.12194440e-4f, fmaf(-n, 0.693359375f, xc));
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r) + 1.0f;
  const int32_t e = float_to_bits(t) - float_to_bits(round), a = e >> 1;
  return (p * bits_to_float((a + 127) << 23)) * bits_to_float((e - a + 127) << 23);
}

/* softmax over the last dim of x[rows, n], written out: e = exp(x - max), e / sum(e). */
void lazyrt_limits_softmax(const float* restrict x, float* restrict y, size_t rows, size_t n) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float m = xr[0];
    for (size_t i = 1; i < n; ++i) m = xr[i] > m ? xr[i] : m;
    for (size_t i = 0; i < n; ++i) yr[i] = exp_f32(xr[i] - m);
    const float s = (float)row_sum(yr, n, 0, 0);
    for (size_t i = 0; i < n; ++i) yr[i] = yr[i] / s;
  }
}

/* ((x - t) * (x - t)).mean(-1) over x, t [rows, n]: the squares in f32, their sum in double. */
void lazyrt_limits_row_mse(const float* restrict x, const float* restrict t, float* restrict out, size_t rows,
                           size_t n) {
  float sq[4096];
  for (size_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (size_t at = 0; at < n; at += 4096) {
      const size_t m = n - at < 4096 ? n - at : 4096;
      for (size_t i = 0; i < m; ++i) {
        const float d = x[r * n + at + i] - t[r * n + at + i];
        sq[i] = d * d;
      }
      sum += row_sum(sq, m, 0, 0);
    }
    out[r] = (float)(sum / (double)n);
  }
}

/* The counter loop; n is read through a pointer so that the compiler cannot assume it. */
void lazyrt_limits_counter_loop(const int64_t* n, int64_t* c, float* x) {
  int64_t cc = 0;
  float xx = 0.0f;
  while (cc < *n) {
    cc += 1;
    xx += 1.0f;
  }
  *c = cc;
  *x = xx;
}
