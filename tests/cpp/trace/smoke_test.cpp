#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

using namespace lazyrt;

TEST(Smoke, AddTwoTensors) {
  Tensor a = tensor({1.f, 2.f, 3.f}, {3});
  Tensor b = tensor({10.f, 20.f, 30.f}, {3});
  Tensor c = a + b * 2.0;
  EXPECT_TRUE(c.is_pending());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{21, 42, 63}));
  EXPECT_FALSE(c.is_pending());
}
