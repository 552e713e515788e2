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
// An executable that holds at least n floats: its second output is a constant.
std::shared_ptr<runtime::Executable> executable_holding(int64_t n) {
  ir::Graph g;
  g.outputs = {g.add(ir::OpKind::Exp, {g.add_parameter(lazyrt::testing::f32({2}))}),
               g.add_full(1.5, {n}, DType::f32)};
  return compile::compile(g);
}
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

TEST(MemoryCache, TheByteCapEvictsTheLeastRecentlyUsed) {
  auto e = executable_holding(1000);
  const uint64_t w = e->held_bytes();
  ASSERT_GE(w, 4000u) << "an executable weighs at least its constant outputs";
  MemoryCache c(100, 2 * w);
  metrics::reset();
  c.put(key(1), e);
  c.put(key(2), executable_holding(1000));
  EXPECT_EQ(c.bytes(), 2 * w);
  EXPECT_NE(c.get(key(1)), nullptr);  // 1 is now more recent than 2
  c.put(key(3), executable_holding(1000));
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c.bytes(), 2 * w);
  EXPECT_EQ(c.get(key(2)), nullptr);
  EXPECT_NE(c.get(key(1)), nullptr);
  EXPECT_NE(c.get(key(3)), nullptr);
  EXPECT_EQ(metrics::counter("MemoryCacheEvictions"), 1);
  // One entry larger than the cap on its own is kept (alone), so it is not compiled again.
  c.put(key(4), executable_holding(3000));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_NE(c.get(key(4)), nullptr);
  EXPECT_EQ(metrics::counter("MemoryCacheEvictions"), 3);
  // Replacing an entry reweighs it; lowering the cap evicts at once; 0 lifts it.
  c.put(key(4), e);
  EXPECT_EQ(c.bytes(), w);
  c.put(key(5), e);
  EXPECT_EQ(c.size(), 2u);
  c.set_max_bytes(w);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_NE(c.get(key(5)), nullptr);
  EXPECT_EQ(c.max_bytes(), w);
  c.set_max_bytes(0);
  for (uint64_t i = 10; i < 20; ++i) c.put(key(i), e);
  EXPECT_EQ(c.size(), 11u);
  EXPECT_EQ(c.bytes(), 11 * w);
  EXPECT_EQ(metrics::counter("MemoryCacheEvictions"), 4);
  c.clear();
  EXPECT_EQ(c.bytes(), 0u);
}

TEST(MemoryCache, TheCountCapCountsEvictionsToo) {
  MemoryCache c(2);
  auto e = some_executable();
  metrics::reset();
  for (uint64_t i = 0; i < 5; ++i) c.put(key(i), e);
  EXPECT_EQ(metrics::counter("MemoryCacheEvictions"), 3);
  c.set_capacity(1);
  EXPECT_EQ(metrics::counter("MemoryCacheEvictions"), 4);
}

TEST(MemoryCache, TheProcessCacheByteCapBoundsSyncs) {
  const size_t old_capacity = memory_capacity();
  const uint64_t old_bytes = memory_max_bytes();
  EXPECT_EQ(old_bytes, kDefaultMemoryMaxBytes);
  set_memory_capacity(1024);
  clear_memory();
  // Graphs of distinct sizes whose executables hold memory (an intermediate in the arena).
  auto run = [](int64_t n) {
    Tensor a = reshape(arange(n * n, DType::f32), {n, n}) * 0.001;
    matmul(matmul(a, a), a).to_vector<float>();
  };
  for (int64_t n = 30; n < 34; ++n) run(n);
  EXPECT_EQ(memory_size(), 4u);
  const uint64_t four = memory_bytes();
  ASSERT_GT(four, 0u);
  metrics::reset();
  const uint64_t cap = four / 2;
  set_memory_max_bytes(cap);
  EXPECT_EQ(memory_max_bytes(), cap);
  auto within = [&] { return memory_bytes() <= cap || memory_size() == 1; };
  EXPECT_TRUE(within());
  EXPECT_LT(memory_size(), 4u);
  EXPECT_GE(metrics::counter("MemoryCacheEvictions"), 1);
  for (int64_t n = 40; n < 50; ++n) {
    run(n);
    EXPECT_TRUE(within()) << memory_bytes() << " bytes in " << memory_size() << " entries";
  }
  EXPECT_GE(metrics::counter("MemoryCacheEvictions"), 10);
  set_memory_max_bytes(old_bytes);
  set_memory_capacity(old_capacity);
  EXPECT_EQ(memory_max_bytes(), old_bytes);
}

}  // namespace lazyrt::cache
