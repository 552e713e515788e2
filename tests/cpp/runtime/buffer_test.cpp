#include <gtest/gtest.h>

#include <vector>

#include <lazyrt/lazyrt.h>

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

namespace lazyrt {

// The public form: from_blob with a release adopts memory for a tensor.
TEST(Buffer, FromBlobAdoptsMemoryReadsItAndNeverWritesIt) {
  std::vector<float> host{1, 2, 3, 4};
  int released = 0;
  {
    Tensor x = from_blob(host.data(), {2, 2}, DType::f32, [&] { ++released; });
    Tensor y = x * 2.0f;
    EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 4, 6, 8})) << "read where it lies";
    host[0] = 10;  // the memory is the tensor's data: no copy was taken
    EXPECT_EQ((x * 1.0f).to_vector<float>()[0], 10.0f);
    x.add_(ones({2, 2}));
    mark_step();
    EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{11, 3, 4, 5}));
    EXPECT_EQ(host, (std::vector<float>{10, 2, 3, 4})) << "an in-place update never writes adopted memory";
    EXPECT_EQ(released, 1) << "x now holds a buffer of its own; nothing holds the adopted one";
  }
  EXPECT_EQ(released, 1);
  int empty_released = 0;
  Tensor e = from_blob(nullptr, {0, 3}, DType::f32, [&] { ++empty_released; });
  EXPECT_EQ(empty_released, 1) << "nothing to hold: released at once";
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
  alignas(8) char bytes[16] = {};
  EXPECT_THROW(from_blob(bytes + 1, {2}, DType::f32, nullptr), Error);
}

}  // namespace lazyrt
