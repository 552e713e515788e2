// util::SpinLock, the lock of the registry of pending tensors: sections it guards never overlap,
// and every waiter gets in, with more threads than cores.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>
#include <vector>

#include "util/spin_lock.h"

namespace lazyrt {
namespace {

TEST(SpinLock, SectionsNeverOverlapAndEveryWaiterGetsIn) {
  util::SpinLock lock;
  int64_t counter = 0;  // plain: only the lock keeps the increments apart
  int inside = 0;
  bool overlapped = false;
  const int threads = 6, rounds = 50000;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard<util::SpinLock> guard(lock);
        if (++inside != 1) overlapped = true;
        ++counter;
        --inside;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_FALSE(overlapped);
  EXPECT_EQ(counter, int64_t{threads} * rounds);
}

}  // namespace
}  // namespace lazyrt
