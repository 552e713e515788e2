#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include "trace/lazy_tensor.h"

namespace lazyrt {
using ::testing::HasSubstr;

TEST(Autograd, ScalarLossBackwardGivesLeafGradients) {
  Tensor w = tensor({1, 2, 3}, {3}).requires_grad_();
  Tensor x = tensor({4, 5, 6}, {3});
  Tensor loss = sum(w * x);
  EXPECT_TRUE(loss.requires_grad());
  EXPECT_FALSE(loss.is_leaf());
  loss.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_FALSE(x.grad().defined()) << "x does not require grad";
}

TEST(Autograd, IntegerAndBoolResultsDoNotRequireGrad) {
  // As in torch: a cast to an integer dtype, or a comparison, ends the history.
  Tensor x = tensor({1.5, -1}, {2});
  x.requires_grad_();
  EXPECT_FALSE(cast(x, DType::i64).requires_grad());
  EXPECT_FALSE((x > 0).requires_grad());
  EXPECT_TRUE(cast(x, DType::f64).requires_grad());
}

TEST(Autograd, BackwardIsLazyAndJoinsThePendingGraph) {
  metrics::reset();
  Tensor w = tensor({1, 2}, {2}).requires_grad_();
  Tensor loss = sum(exp(w));
  loss.backward();
  EXPECT_TRUE(w.grad().is_pending());
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 0);
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 1) << "forward and backward in one graph";
  EXPECT_NEAR(w.grad().to_vector<float>()[1], std::exp(2.0), 1e-5);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor w = tensor({1, 2}, {2}).requires_grad_();
  sum(w * 3).backward();
  Tensor g = w.grad();
  sum(w * w).backward();
  EXPECT_EQ(trace::impl_of(w.grad()), trace::impl_of(g)) << "accumulation keeps the grad tensor's identity";
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 7}));
  w.set_grad(Tensor());
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, BackwardWithAGradientForNonScalarOutputs) {
  Tensor w = tensor({1, 2, 3}, {3}).requires_grad_();
  Tensor y = w * w;
  EXPECT_THROW(y.backward(), Error);
  y.backward(tensor({1, 0, 2}, {3}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 0, 12}));
}

TEST(Autograd, SharedSubexpressionsSumTheirGradients) {
  Tensor a = tensor({2}, {1}).requires_grad_();
  Tensor b = a * 3;
  Tensor loss = sum(b * b + b);  // 9a^2 + 3a -> 18a + 3
  loss.backward();
  EXPECT_EQ(a.grad().item(), 39);
}

TEST(Autograd, NoGradGuardAndDetachRecordNothing) {
  Tensor w = tensor({1, 2}, {2}).requires_grad_();
  {
    NoGradGuard guard;
    Tensor y = w * 2;
    EXPECT_FALSE(y.requires_grad());
  }
  Tensor d = w.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_FALSE((d * 2).requires_grad());
  EXPECT_TRUE((w * 2).requires_grad());
}

TEST(Autograd, InPlaceOnALeafNeedsNoGrad) {
  Tensor w = tensor({1, 2}, {2}).requires_grad_();
  try {
    w.add_(ones({2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("leaf tensor that requires grad"));
  }
  {
    NoGradGuard guard;
    w.add_(ones({2}), -0.5);
  }
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.5, 1.5}));
}

TEST(Autograd, SavedValuesAreSnapshotsOfTheirTime) {
  // y = w * w saves w; changing w afterwards must not change dy/dw.
  Tensor w = tensor({3}, {1}).requires_grad_();
  Tensor y = sum(w * w);
  {
    NoGradGuard guard;
    w.add_(ones({1}), 10);
  }
  y.backward();
  EXPECT_EQ(w.grad().item(), 6);
}

TEST(Autograd, SecondBackwardThroughAFreedGraphThrows) {
  Tensor w = tensor({1}, {1}).requires_grad_();
  Tensor y = sum(exp(w));
  y.backward();
  try {
    y.backward();
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("second time"));
  }
}

TEST(Autograd, IntegerPathsAndMixedDtypesFlowBackToTheLeafDtype) {
  Tensor w = tensor({1.5, -2}, {2}, DType::f64).requires_grad_();
  Tensor idx = tensor(std::vector<int64_t>{2, 3}, {2});
  Tensor y = sum(cast(w, DType::f32) * idx);  // f32 compute, f64 leaf
  y.backward();
  EXPECT_EQ(w.grad().dtype(), DType::f64);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{2, 3}));
}

}  // namespace lazyrt
