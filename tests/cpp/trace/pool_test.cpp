// util::BlockPool and make_pooled, the free lists behind tracing's tensors and nodes: a block
// freed on a thread is the next one that thread takes, objects live and die as with
// make_shared (destructors run, weak pointers expire, shared_from_this works), blocks cross
// threads, and tracing reuses its blocks from one step to the next.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "lazyrt/lazyrt.h"
#include "util/pool.h"

namespace lazyrt {
namespace {

struct Counted : std::enable_shared_from_this<Counted> {
  static inline std::atomic<int> live{0};
  int64_t payload[5];
  explicit Counted(int64_t v) : payload{v, v + 1, v + 2, v + 3, v + 4} { ++live; }
  ~Counted() { --live; }
};

TEST(BlockPool, AFreedBlockIsTheNextOneTaken) {
  using Pool = util::BlockPool<48, 16>;
  void* a = Pool::get();
  void* b = Pool::get();
  ASSERT_NE(a, b);
  Pool::put(a);
  EXPECT_EQ(Pool::get(), a);
  Pool::put(b);
  Pool::put(a);
  EXPECT_EQ(Pool::get(), a);  // last in, first out
  EXPECT_EQ(Pool::get(), b);
  Pool::put(a);
  Pool::put(b);
}

TEST(BlockPool, PooledObjectsLiveAndDieAsWithMakeShared) {
  std::weak_ptr<Counted> w;
  {
    auto p = util::make_pooled<Counted>(7);
    EXPECT_EQ(Counted::live.load(), 1);
    EXPECT_EQ(p->payload[4], 11);
    EXPECT_EQ(p->shared_from_this(), p);
    w = p;
    auto q = p;
    p.reset();
    EXPECT_FALSE(w.expired());
  }
  EXPECT_EQ(Counted::live.load(), 0);
  EXPECT_TRUE(w.expired());  // the block stays until the weak pointer goes; then it is reused
  w.reset();
  // Many at once, freed in another order than made: every object distinct and intact.
  std::vector<std::shared_ptr<Counted>> many;
  for (int i = 0; i < 1000; ++i) many.push_back(util::make_pooled<Counted>(i));
  std::set<const Counted*> distinct;
  for (int i = 0; i < 1000; ++i) {
    distinct.insert(many[i].get());
    ASSERT_EQ(many[i]->payload[0], i);
    ASSERT_EQ(many[i]->payload[4], i + 4);
  }
  EXPECT_EQ(distinct.size(), 1000u);
  for (int i = 0; i < 1000; i += 2) many[i].reset();
  for (int i = 0; i < 1000; i += 2) many[i] = util::make_pooled<Counted>(-i);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(many[i]->payload[0], i % 2 ? i : -i);
  many.clear();
  EXPECT_EQ(Counted::live.load(), 0);
}

TEST(BlockPool, ObjectsCrossThreads) {
  // Made on one thread, freed on others (which then reuse the blocks), and threads that exit
  // with blocks on their lists.
  std::vector<std::shared_ptr<Counted>> made;
  for (int i = 0; i < 4000; ++i) made.push_back(util::make_pooled<Counted>(i));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&made, t] {
      for (int i = t; i < 4000; i += 4) made[i].reset();
      std::vector<std::shared_ptr<Counted>> own;
      for (int i = 0; i < 500; ++i) own.push_back(util::make_pooled<Counted>(i));
      for (int i = 0; i < 500; ++i) EXPECT_EQ(own[i]->payload[3], i + 3);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(Counted::live.load(), 0);
}

TEST(BlockPool, TracingTheSameStepAgainGivesTheSameValues) {
  // Tensors and nodes of each step come from the blocks the previous step freed: values are
  // unaffected (a stale field in a reused block would show here).
  Tensor w = tensor(std::vector<float>{0.5f, -1.25f, 2.0f, 0.75f}, {2, 2});
  w.requires_grad_();
  std::vector<float> first;
  for (int step = 0; step < 20; ++step) {
    Tensor x = tensor(std::vector<float>{1, 2, 3, 4}, {2, 2});
    Tensor loss = ((matmul(x, w) + 1.5) * (x - 0.5)).sum();
    loss.backward();
    std::vector<float> got = w.grad().to_vector<float>();
    got.push_back(static_cast<float>(loss.item()));
    if (step == 0) first = got;
    else ASSERT_EQ(got, first) << "step " << step;
    w.set_grad(Tensor());
  }
  // x @ w + 1.5 times (x - 0.5), summed: d/dw = x^T (x - 0.5).
  EXPECT_FLOAT_EQ(first[0], 1 * 0.5f + 3 * 2.5f);
  EXPECT_FLOAT_EQ(first[1], 1 * 1.5f + 3 * 3.5f);
  EXPECT_FLOAT_EQ(first[2], 2 * 0.5f + 4 * 2.5f);
  EXPECT_FLOAT_EQ(first[3], 2 * 1.5f + 4 * 3.5f);
}

}  // namespace
}  // namespace lazyrt
