// An unrolled host loop makes a chain of traced ops as long as the loop (and, with gradients,
// a chain of autograd nodes as long). Dropping such a chain, or syncing it, must not recurse
// once per node: at a few hundred thousand nodes that overflows the thread's stack (SIGSEGV).
// The chains here are far longer than the stack could take recursively (8 MiB on Linux; a
// node's destruction takes several frames).
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

namespace lazyrt {
namespace {

constexpr int kSteps = 250000;

TEST(DeepGraphs, AnUnrolledChainIsDroppedWithoutRecursion) {
  Tensor x = tensor(std::vector<float>{1.0f}, {1});
  for (int i = 0; i < kSteps; ++i) x = x + 1.0;
  EXPECT_EQ(x.shape(), (Shape{1}));
  x = Tensor();  // the whole chain, unsynced, goes here
  // The thread still works.
  EXPECT_EQ((tensor(std::vector<float>{2.0f}, {1}) * 3.0).item(), 6.0);
}

TEST(DeepGraphs, AChainWithItsAutogradNodesIsDroppedWithoutRecursion) {
  Tensor w = tensor(std::vector<float>{0.5f}, {1}).requires_grad_(true);
  Tensor h = tensor(std::vector<float>{1.0f}, {1});
  for (int i = 0; i < kSteps; ++i) h = h * 0.5 + w;
  EXPECT_TRUE(h.requires_grad());
  h = Tensor();  // every traced op and every autograd node of the loop
  EXPECT_EQ((w * 4.0).item(), 2.0);
}

}  // namespace
}  // namespace lazyrt
