#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include "trace/lazy_tensor.h"

#include "support/error_of.h"

#include <cmath>

namespace lazyrt {
using ::testing::HasSubstr;

namespace {
std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(4, 2)});
}
}  // namespace

TEST(Module, NamedParametersAndStateDictUseDottedNames) {
  auto m = mlp();
  std::vector<std::string> names;
  for (const auto& [n, t] : m->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(m->parameters().size(), 4u);
  EXPECT_EQ(m->state_dict().size(), 4u);
  for (const Tensor& p : m->parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
}

TEST(Module, LinearInitIsUniformInTheFanInBoundAndSeeded) {
  manual_seed(123);
  nn::Linear a(50, 40);
  manual_seed(123);
  nn::Linear b(50, 40);
  std::vector<float> wa = a.weight.to_vector<float>();
  EXPECT_EQ(wa, b.weight.to_vector<float>());
  const float bound = 1.0f / std::sqrt(50.0f);
  float lo = 1, hi = -1;
  for (float x : wa) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LT(hi, bound);
  EXPECT_LT(lo, -0.9 * bound);
  EXPECT_GT(hi, 0.9 * bound);
  EXPECT_EQ(a.weight.shape(), (Shape{40, 50}));
  EXPECT_EQ(a.bias.shape(), (Shape{40}));
}

TEST(Module, LoadStateDictCopiesInPlaceAndKeepsIdentity) {
  auto m = mlp();
  auto* w_impl = trace::impl_of(m->parameters()[0]).get();
  nn::StateDict sd = m->state_dict();
  sd[0].second = full({4, 3}, 0.5);
  m->load_state_dict(sd);
  EXPECT_EQ(trace::impl_of(m->parameters()[0]).get(), w_impl);
  EXPECT_EQ(m->parameters()[0].to_vector<float>(), std::vector<float>(12, 0.5f));
  EXPECT_TRUE(m->parameters()[0].requires_grad());
}

TEST(Module, LoadStateDictChecksEverythingBeforeChangingAnything) {
  auto m = mlp();
  std::vector<float> before = m->parameters()[0].to_vector<float>();
  nn::StateDict sd = m->state_dict();
  sd[0].second = zeros({4, 3});
  sd[3].second = zeros({5});  // wrong shape, after a valid entry
  try {
    m->load_state_dict(sd);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'2.bias' has shape [5]"));
  }
  EXPECT_EQ(m->parameters()[0].to_vector<float>(), before);
  nn::StateDict missing(sd.begin(), sd.begin() + 2);
  EXPECT_THROW(m->load_state_dict(missing), Error);
  nn::StateDict extra = m->state_dict();
  extra.emplace_back("9.weight", zeros({1}));
  EXPECT_THROW(m->load_state_dict(extra), Error);
  EXPECT_NO_THROW(m->load_state_dict(extra, false));
}

TEST(Module, TrainAndEvalReachChildrenAndSwitchDropout) {
  auto m = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Dropout>(0.5)});
  Tensor x = ones({1000});
  EXPECT_TRUE(m->is_training());
  std::vector<float> y = m->forward(x).to_vector<float>();
  EXPECT_NE(std::count(y.begin(), y.end(), 0.0f), 0);
  m->eval();
  EXPECT_FALSE(m->children()[0].second->is_training());
  EXPECT_EQ(m->forward(x).to_vector<float>(), std::vector<float>(1000, 1.0f));
}

TEST(Losses, MseAndBceWithLogitsKnownValues) {
  Tensor a = tensor({1, 2, 3}, {3});
  Tensor b = tensor({1, 0, 5}, {3});
  EXPECT_FLOAT_EQ(nn::mse_loss(a, b).item(), (0 + 4 + 4) / 3.0);
  EXPECT_FLOAT_EQ(nn::mse_loss(a, b, "sum").item(), 8);
  Tensor x = tensor({-100, 0, 100, 2}, {4});
  Tensor t = tensor({0, 1, 1, 0}, {4});
  std::vector<float> l = nn::binary_cross_entropy_with_logits(x, t, "none").to_vector<float>();
  EXPECT_NEAR(l[0], 0, 1e-6);
  EXPECT_NEAR(l[1], std::log(2.0), 1e-6);
  EXPECT_NEAR(l[2], 0, 1e-6);
  EXPECT_NEAR(l[3], 2 + std::log1p(std::exp(-2.0)), 1e-6);
  EXPECT_THROW(nn::mse_loss(a, b, "avg"), Error);
}

TEST(Optimizer, FoundInfSkipsTheWholeUpdateWithoutSync) {
  Tensor w = tensor({1, 2}, {2}).requires_grad_();
  optim::AdamW opt({w});
  sum(w * w).backward();
  metrics::reset();
  opt.step(tensor({1}, {1}));  // inf found: skip
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 0) << "the skip is decided in the graph";
  mark_step();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(opt.step_count().item(), 0);
  opt.step(tensor({0}, {1}));
  mark_step();
  EXPECT_NE(w.to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(opt.step_count().item(), 1);
}

TEST(Optimizer, ZeroGradToNoneOrToZeros) {
  Tensor w = tensor({1, 2}, {2}).requires_grad_();
  optim::SGD opt({w}, {0.1});
  sum(w * 3).backward();
  opt.zero_grad(false);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{0, 0}));
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(Optimizer, RefusesNonLeafParameters) {
  Tensor w = tensor({1}, {1}).requires_grad_();
  EXPECT_THROW(optim::SGD({w * 2}, {0.1}), Error);
  EXPECT_THROW(optim::SGD({tensor({1}, {1})}, {0.1}), Error);
}

}  // namespace lazyrt

namespace lazyrt {

TEST(Layers, ConvPoolNormEmbeddingAndGeluModules) {
  manual_seed(3);
  nn::Conv2d conv(4, 6, {3, 2}, {1}, {1}, {1}, 2);
  EXPECT_EQ(conv.weight.shape(), (Shape{6, 2, 3, 2}));
  const double bound = 1.0 / std::sqrt(2.0 * 3 * 2);
  for (float w : conv.weight.to_vector<float>()) EXPECT_LT(std::abs(w), bound);
  Tensor x = rand({2, 4, 5, 5});
  EXPECT_EQ(conv.forward(x).to_vector<float>(),
            conv2d(x, conv.weight, conv.bias, {1}, {1}, {1}, 2).to_vector<float>());
  nn::MaxPool2d pool({2});
  EXPECT_EQ(pool.forward(x).shape(), (Shape{2, 4, 2, 2}));
  EXPECT_EQ(pool.forward(x).to_vector<float>(), max_pool2d(x, {2}).to_vector<float>());
  nn::LayerNorm ln({5});
  EXPECT_EQ(ln.weight.to_vector<float>(), std::vector<float>(5, 1.0f));
  EXPECT_EQ(ln.bias.to_vector<float>(), std::vector<float>(5, 0.0f));
  std::vector<float> y = ln.forward(tensor({1, 2, 3, 4, 5}, {1, 5})).to_vector<float>();
  EXPECT_NEAR(y[0], -2 / std::sqrt(2.0 + 1e-5), 1e-5);
  EXPECT_NEAR(y[2], 0, 1e-6);
  nn::Embedding emb(4, 3, 1);
  std::vector<float> row = emb.forward(tensor(std::vector<int64_t>{1}, {1})).to_vector<float>();
  EXPECT_EQ(row, std::vector<float>(3, 0.0f)) << "the padding row starts at zero";
  EXPECT_EQ(emb.forward(tensor(std::vector<int64_t>{2, 0}, {2})).shape(), (Shape{2, 3}));
  nn::GELU gelu_tanh("tanh");
  EXPECT_EQ(gelu_tanh.forward(x).to_vector<float>(), gelu(x, "tanh").to_vector<float>());
  EXPECT_EQ(conv.named_parameters().size(), 2u);
  EXPECT_THROW(nn::Conv2d(3, 4, {3}, {1}, {0}, {1}, 2), Error);
}

// x = [[1, 2], [3, 4]] ([N = 2, C = 2]): batch means [2, 3], biased variances [1, 1], unbiased
// [2, 2]; values worked out from PyTorch's formulas.
TEST(Module, BatchNormTrainsWithTheBatchAndUpdatesItsRunningStatistics) {
  nn::BatchNorm1d bn(2);
  EXPECT_EQ(bn.named_buffers().size(), 3u);
  Tensor x = tensor({1, 2, 3, 4}, {2, 2});
  const float s = 1.0f / std::sqrt(1.0f + 1e-5f);
  std::vector<float> y = bn(x).to_vector<float>();
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(y[i], (i < 2 ? -1 : 1) * s, 1e-6) << i;
  EXPECT_THAT(bn.running_mean.to_vector<float>(), ::testing::Pointwise(::testing::FloatNear(1e-6), {0.2f, 0.3f}));
  EXPECT_THAT(bn.running_var.to_vector<float>(), ::testing::Pointwise(::testing::FloatNear(1e-6), {1.1f, 1.1f}));
  EXPECT_EQ(bn.num_batches_tracked.item(), 1);
  bn.eval();
  // eval: (x - running_mean) / sqrt(running_var + eps)
  std::vector<float> e = bn(x).to_vector<float>();
  EXPECT_NEAR(e[0], (1 - 0.2) / std::sqrt(1.1 + 1e-5), 1e-6);
  EXPECT_NEAR(e[3], (4 - 0.3) / std::sqrt(1.1 + 1e-5), 1e-6);
  EXPECT_EQ(bn.num_batches_tracked.item(), 1) << "eval tracks nothing";
}

TEST(Module, BatchNormWithoutMomentumKeepsACumulativeAverage) {
  nn::BatchNorm2d bn(1, 1e-5, std::nullopt);
  // Two batches of [2, 1, 1, 2]: means 2.5 and 6.5, unbiased variances 5/3 and 5/3.
  bn(tensor({1, 2, 3, 4}, {2, 1, 1, 2}));
  bn(tensor({5, 6, 7, 8}, {2, 1, 1, 2}));
  EXPECT_NEAR(bn.running_mean.item(), (2.5 + 6.5) / 2, 1e-6);
  EXPECT_NEAR(bn.running_var.item(), 5.0 / 3.0, 1e-6);
  EXPECT_EQ(bn.num_batches_tracked.item(), 2);
  EXPECT_THAT(testing_support::error_of([&] { bn(tensor({1, 2}, {1, 2})); }), HasSubstr("BatchNorm2d: expected an input of 4 dims"));
}

TEST(Module, GroupNormAndAdaptiveAvgPool2dAreTheirFunctionalForms) {
  nn::GroupNorm gn(2, 4);
  EXPECT_EQ(gn.named_parameters().size(), 2u);
  Tensor x = reshape(arange(16, DType::f32), {1, 4, 2, 2}) * 0.5;
  EXPECT_EQ(gn(x).to_vector<float>(), nn::group_norm(x, 2, gn.weight, gn.bias).to_vector<float>());
  nn::AdaptiveAvgPool2d pool({1, 1});
  // One bin per channel: the means of [0, 1, 2, 3] * 0.5 + 2 * channel.
  EXPECT_THAT(pool(x).to_vector<float>(), ::testing::ElementsAre(0.75f, 2.75f, 4.75f, 6.75f));
  EXPECT_THAT(testing_support::error_of([] { nn::GroupNorm(3, 4); }), HasSubstr("divisible"));
}

}  // namespace lazyrt
