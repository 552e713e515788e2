// What tracing costs in heap allocations: the seed training step (Linear(5, 3), sum,
// backward, AdamW, zero_grad, mark_step), traced again every step and served by the compile
// cache. A ceiling, so that bookkeeping that allocates per op does not creep back in.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>

#include "support/alloc_counter.h"

namespace lazyrt {

TEST(TracingCost, TheSeedStepStaysUnderItsAllocationCeiling) {
  manual_seed(0);
  auto model = std::make_shared<nn::Linear>(5, 3);
  optim::AdamW opt(model->parameters());
  std::vector<float> xs(50);
  for (int i = 0; i < 50; ++i) xs[i] = std::sin(0.37f * static_cast<float>(i));
  const Tensor x = tensor(xs, {10, 5});
  auto step = [&] {
    Tensor loss = model->forward(x).sum();
    loss.backward();
    opt.step();
    opt.zero_grad();
    mark_step();
  };
  for (int i = 0; i < 20; ++i) step();  // compiled, cached, state made
  const int steps = 50;
  int64_t count = 0;
  {
    testing::CountAllocations allocations;
    for (int i = 0; i < steps; ++i) step();
    count = allocations.count();
  }
  const double per_step = static_cast<double>(count) / steps;
  // 198 now: 257 before result shapes came from the shapes of dropped nodes (ir::stashed_shape)
  // and hashing a parameter stopped copying its type; 497 before the vectors of dropped nodes
  // and tensors were kept for the next ops (VectorStash); 829 before an optimizer's scalar constants stopped getting tensors of their own
  // and extraction sized its tables and parameter lists up front; 1,239 before a sync hashed
  // pending IR without building the graph; about 1,500 before the pending registry and
  // extraction stopped allocating per node.
  EXPECT_LE(per_step, 215.0) << "allocations per traced seed step";
  EXPECT_GT(per_step, 100.0) << "the counter sees the step's allocations";
}

}  // namespace lazyrt
