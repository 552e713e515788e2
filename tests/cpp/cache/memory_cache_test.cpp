#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <thread>

#include "cache/memory_cache.h"
#include "compile/compile.h"
#include "support/graphs.h"

namespace lazyrt::cache {

namespace {
std::shared_ptr<runtime::Executable> some_executable() {
  ir::Graph g;
  g.outputs = {g.add(ir::OpKind::Exp, {g.add_parameter(lazyrt::testing::f32({2}))})};
  return compile::compile(g);
}
GraphHash key(uint64_t i) { return {i * 7919, i}; }
}  // namespace

TEST(MemoryCache, EvictsTheLeastRecentlyUsed) {
  MemoryCache c(2);
  auto e = some_executable();
  c.put(key(1), e);
  c.put(key(2), e);
  EXPECT_NE(c.get(key(1)), nullptr);  // 1 is now more recent than 2
  c.put(key(3), e);
  EXPECT_NE(c.get(key(1)), nullptr);
  EXPECT_EQ(c.get(key(2)), nullptr);
  EXPECT_NE(c.get(key(3)), nullptr);
  EXPECT_EQ(c.size(), 2u);
}

TEST(MemoryCache, CapacityZeroDisablesIt) {
  MemoryCache c(0);
  c.put(key(1), some_executable());
  EXPECT_EQ(c.get(key(1)), nullptr);
  EXPECT_EQ(c.size(), 0u);
}

TEST(MemoryCache, ShrinkingEvicts) {
  MemoryCache c(3);
  auto e = some_executable();
  for (uint64_t i = 0; i < 3; ++i) c.put(key(i), e);
  c.set_capacity(1);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_NE(c.get(key(2)), nullptr);
}

TEST(MemoryCache, ConcurrentUseKeepsItConsistent) {
  MemoryCache c(16);
  auto e = some_executable();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        c.put(key((i * 4 + t) % 40), e);
        auto got = c.get(key(i % 40));
        if (got) EXPECT_EQ(got, e);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(c.size(), 16u);
}

TEST(MemoryCache, SyncWithCacheDisabledCompilesEveryTime) {
  set_memory_capacity(0);
  metrics::reset();
  Tensor a = tensor({1, 2}, {2});
  for (int i = 0; i < 3; ++i) (exp(a) + 1.0).to_vector<float>();
  EXPECT_EQ(metrics::counter("UncachedCompile"), 3);
  EXPECT_EQ(metrics::counter("CachedCompile"), 0);
  set_memory_capacity(1024);
  for (int i = 0; i < 3; ++i) (exp(a) + 1.0).to_vector<float>();
  EXPECT_EQ(metrics::counter("UncachedCompile"), 4);
  EXPECT_EQ(metrics::counter("CachedCompile"), 2);
}

}  // namespace lazyrt::cache
