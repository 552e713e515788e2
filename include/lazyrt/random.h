// Random numbers from the default generator: Philox 4x32-10, counter based. Its state (an i64
// seed and an i64 offset) lives in two tensors that graphs read as inputs and update in place,
// so random ops never bake a value into a graph, a traced step keeps one graph, and the same
// seed gives the same numbers. Inside a loop body (while_loop, fori_loop, scan) the offset is a
// carry of the loop: each iteration draws new numbers, the same as the unrolled loop would, and
// the generator continues from where the loop ends. A while_loop's cond may not draw.
#pragma once

#include <utility>

#include "lazyrt/tensor.h"

namespace lazyrt {

/// Resets the default generator: seed `seed`, offset 0.
void manual_seed(uint64_t seed);
/// The generator's state tensors {seed, offset}; the same tensors for the whole process.
std::pair<Tensor, Tensor> random_state();

Tensor rand(Shape shape, DType dtype = DType::f32);   // uniform in [0, 1)
Tensor randn(Shape shape, DType dtype = DType::f32);  // standard normal
Tensor randint(int64_t low, int64_t high, Shape shape, DType dtype = DType::i64);  // [low, high)
/// 1 with probability p[i], else 0, in p's dtype.
Tensor bernoulli(const Tensor& p);
Tensor bernoulli(Shape shape, double p, DType dtype = DType::f32);
/// num_samples category indices (i64) per row of probs ([C] or [N, C], non-negative weights,
/// not necessarily normalized), drawn with or without replacement. Without replacement the
/// draw is the Gumbel top-k (the same distribution as drawing one by one); nothing is read
/// on the host, so a row with fewer non-zero weights than num_samples is not refused (torch
/// raises) and yields some zero-weight categories.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);
/// Dropout's mask: 0 with probability p, else 1 / (1 - p).
Tensor dropout_mask(Shape shape, double p, DType dtype = DType::f32);
/// x * dropout_mask(...) when training and p > 0; x itself otherwise.
Tensor dropout(const Tensor& x, double p, bool training = true);

}  // namespace lazyrt
