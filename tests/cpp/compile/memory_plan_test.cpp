#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/lower.h"
#include "compile/compile.h"
#include "backend/memory_plan.h"
#include "support/graphs.h"

namespace lazyrt::compile {
using backend::BufferRequest;
using backend::MemoryPlan;
using backend::plan_memory;
using ir::Graph;
using ir::OpKind;
using ir::ValueRef;
using lazyrt::testing::f32;

namespace {
void expect_no_overlap(const std::vector<BufferRequest>& reqs, const MemoryPlan& plan) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_LE(plan.offsets[i] + reqs[i].bytes, plan.arena_bytes);
    for (size_t j = i + 1; j < reqs.size(); ++j) {
      const bool live_together = reqs[i].first <= reqs[j].last && reqs[j].first <= reqs[i].last;
      const bool handed_over = (reqs[j].inplace_of == static_cast<int32_t>(i) ||
                                reqs[i].inplace_of == static_cast<int32_t>(j)) &&
                               plan.offsets[i] == plan.offsets[j];
      if (!live_together || handed_over) continue;
      const bool disjoint = plan.offsets[i] + reqs[i].bytes <= plan.offsets[j] ||
                            plan.offsets[j] + reqs[j].bytes <= plan.offsets[i];
      EXPECT_TRUE(disjoint) << "requests " << i << " and " << j << " overlap while both live";
    }
  }
}
}  // namespace

TEST(MemoryPlan, LiveBuffersNeverOverlap) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<BufferRequest> reqs;
    const int steps = 40;
    for (int s = 0; s < steps; ++s) {
      int n = static_cast<int>(rng() % 3);
      for (int k = 0; k < n; ++k) {
        BufferRequest r;
        r.bytes = 1 + rng() % 5000;
        r.first = s;
        r.last = s + static_cast<int32_t>(rng() % 10);
        if (rng() % 3 == 0 && !reqs.empty()) r.inplace_of = static_cast<int32_t>(rng() % reqs.size());
        reqs.push_back(r);
      }
    }
    MemoryPlan plan = plan_memory(reqs);
    expect_no_overlap(reqs, plan);
  }
}

TEST(MemoryPlan, BuffersWithDisjointLifetimesShareMemory) {
  std::vector<BufferRequest> reqs = {{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}, {1000, 3, 4}};
  MemoryPlan plan = plan_memory(reqs);
  expect_no_overlap(reqs, plan);
  EXPECT_EQ(plan.offsets[0], plan.offsets[2]);
  EXPECT_EQ(plan.offsets[1], plan.offsets[3]);
  EXPECT_EQ(plan.arena_bytes, 2 * 1024u);
}

TEST(MemoryPlan, ALargeLateBufferFitsBesideTheOnesLiveWithIt) {
  // x and y are made together; x dies first, then z, twice their size, is made while y lives.
  // Placed in step order, z cannot use x's freed memory below y and the arena grows to x + y
  // + z; the plan needs only what is live at once, y + z.
  std::vector<BufferRequest> reqs = {{128, 0, 1}, {128, 0, 3}, {256, 2, 3}};
  MemoryPlan plan = plan_memory(reqs);
  expect_no_overlap(reqs, plan);
  EXPECT_EQ(plan.arena_bytes, 384u);
}

TEST(MemoryPlan, TheArenaStaysNearTheLiveBytesOnRandomLifetimes) {
  // Many buffers of mixed sizes and lifetimes: the arena holds at least the bytes live at the
  // busiest step, and packs them within a quarter more (measured: 1-16% more).
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<BufferRequest> reqs;
    const int steps = 200;
    for (int s = 0; s < steps; ++s)
      for (int k = 0; k < 3; ++k)
        reqs.push_back({64 * (1 + rng() % 64), s, s + static_cast<int32_t>(rng() % 30)});
    MemoryPlan plan = plan_memory(reqs);
    expect_no_overlap(reqs, plan);
    size_t busiest = 0;
    for (int s = 0; s < steps + 30; ++s) {
      size_t live = 0;
      for (const auto& r : reqs) live += (r.first <= s && s <= r.last) ? r.bytes : 0;
      busiest = std::max(busiest, live);
    }
    EXPECT_GE(plan.arena_bytes, busiest);
    EXPECT_LE(plan.arena_bytes, busiest * 5 / 4) << "trial " << trial;
  }
}

TEST(MemoryPlan, InPlaceTakesOverADyingOperand) {
  std::vector<BufferRequest> reqs = {{4000, 0, 1}, {4000, 1, 2, 0}, {4000, 2, 3, 1}};
  MemoryPlan plan = plan_memory(reqs);
  EXPECT_EQ(plan.offsets[0], plan.offsets[1]);
  EXPECT_EQ(plan.offsets[1], plan.offsets[2]);
  EXPECT_EQ(plan.arena_bytes, 4032u);
}

TEST(MemoryPlan, InPlaceIsRefusedWhileTheOperandLivesOn) {
  std::vector<BufferRequest> reqs = {{4000, 0, 2}, {4000, 1, 2, 0}};
  MemoryPlan plan = plan_memory(reqs);
  EXPECT_NE(plan.offsets[0], plan.offsets[1]);
}

TEST(MemoryPlan, ChainOfHundredElementwiseOpsNeedsConstantBuffers) {
  auto chain = [](int n) {
    Graph g;
    ValueRef v = g.add_parameter(f32({1000}));
    for (int i = 0; i < n; ++i) v = g.add(i % 2 ? OpKind::Exp : OpKind::Tanh, {v});
    g.outputs = {g.add(OpKind::Sum, {v}, {std::vector<int64_t>{0}, false})};
    return backend::cpu::lower(g, {}, {}, backend::get("cpu"));
  };
  auto ten = chain(10)->stats();
  auto hundred = chain(100)->stats();
  EXPECT_EQ(hundred.steps, 101u);
  EXPECT_LE(hundred.arena_blocks, 2u);
  EXPECT_EQ(hundred.arena_bytes, ten.arena_bytes);
  EXPECT_LE(hundred.arena_bytes, 2 * 4032u);
}

}  // namespace lazyrt::compile
