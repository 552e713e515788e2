#include <gtest/gtest.h>

#include <vector>

#include "runtime/buffer.h"

namespace lazyrt::runtime {

TEST(Buffer, AllocatedMemoryIs64ByteAlignedAndOwned) {
  auto b = allocate(10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  EXPECT_FALSE(b->is_adopted());
}

TEST(Buffer, AdoptedMemoryIsSharedCountedAndReleasedOnce) {
  std::vector<float> host{1, 2, 3, 4};
  int released = 0;
  const int64_t before = memory_stats().live_bytes;
  {
    auto b = adopt(host.data(), host.size() * sizeof(float), [&] { ++released; });
    EXPECT_TRUE(b->is_adopted());
    EXPECT_EQ(b->data(), host.data()) << "no copy";
    EXPECT_EQ(b->bytes(), 16u);
    EXPECT_EQ(memory_stats().live_bytes, before + 16) << "adopted tensor data counts as live";
    EXPECT_GE(memory_stats().peak_bytes, before + 16);
    EXPECT_EQ(released, 0);
  }
  EXPECT_EQ(released, 1);
  EXPECT_EQ(memory_stats().live_bytes, before);
}

}  // namespace lazyrt::runtime
