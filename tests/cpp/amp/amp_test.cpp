#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>

#include "ops/op_fixture.h"

namespace lazyrt {
namespace {

using fixtures::OpCase;

Tensor make(const fixtures::FixtureTensor& t) {
  return tensor(std::vector<float>(t.reals.begin(), t.reals.end()), t.shape);
}

class Autocast : public ::testing::TestWithParam<OpCase> {};

// bf16 keeps 8 bits of mantissa: results agree with torch to about 1%.
TEST_P(Autocast, MlpStepMatchesTorchAutocastBf16) {
  const OpCase& c = GetParam();
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4)});
  model->load_state_dict({{"0.weight", make(c.inputs[0])}, {"0.bias", make(c.inputs[1])},
                          {"2.weight", make(c.inputs[2])}, {"2.bias", make(c.inputs[3])}});
  Tensor out, loss;
  {
    amp::AutocastGuard autocast;
    out = model->forward(make(c.inputs[4]));
    loss = nn::mse_loss(cast(out, DType::f32), make(c.inputs[5]));
  }
  EXPECT_EQ(out.dtype(), DType::bf16);
  loss.backward();
  const std::string r = c.attrs.at("result").at(0);
  Tensor got = r == "out" ? cast(out, DType::f32) : r == "loss" ? loss : model->parameters().at(std::stoul(r.substr(4))).grad();
  ASSERT_TRUE(got.defined());
  EXPECT_EQ(got.dtype(), DType::f32);
  std::vector<float> v = got.to_vector<float>();
  double scale = 0;
  for (double e : c.expected.reals) scale = std::max(scale, std::abs(e));
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_NEAR(v[i], c.expected.reals[i], 1e-2 * std::abs(c.expected.reals[i]) + 4e-3 * scale) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Torch, Autocast, ::testing::ValuesIn(fixtures::load_op_cases(LAZYRT_AMP_FIXTURES)),
                         [](const auto& info) { return info.param.name; });

TEST(Autocast, PolicyLowersMatmulAndKeepsReductionsInF32) {
  Tensor a = ones({2, 3}), b = ones({3, 4});
  amp::AutocastGuard autocast;
  EXPECT_EQ(matmul(a, b).dtype(), DType::bf16);
  EXPECT_EQ(sum(cast(a, DType::bf16)).dtype(), DType::f32);
  EXPECT_EQ(log_softmax(cast(a, DType::bf16), 1).dtype(), DType::f32);
  EXPECT_EQ((cast(a, DType::bf16) + a).dtype(), DType::f32) << "elementwise ops promote";
  {
    amp::AutocastGuard off(DType::bf16, false);
    EXPECT_EQ(matmul(a, b).dtype(), DType::f32);
  }
  EXPECT_THROW(amp::AutocastGuard(DType::f64), Error);
}

TEST(GradScaler, SkipsNonFiniteStepsAndAdjustsTheScaleWithoutSync) {
  Tensor w = tensor({1, 2}, {2}).requires_grad_();
  optim::SGD opt({w}, {0.5});
  amp::GradScaler scaler({8.0, 2.0, 0.5, 2});
  auto step = [&](double factor) {
    Tensor loss = sum(w * factor);
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
    metrics::reset();
    mark_step();
    EXPECT_EQ(metrics::counter("ExecuteGraph"), 1) << "the whole step is one graph";
  };
  step(1);  // finite: w -= 0.5 * 1
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.5, 1.5}));
  EXPECT_EQ(scaler.scale_tensor().item(), 8);
  step(1);  // second finite step in a row: the scale grows
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(scaler.scale_tensor().item(), 16);
  step(std::numeric_limits<double>::infinity());  // skipped, scale backs off
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(scaler.found_inf().item(), 1);
  EXPECT_EQ(scaler.scale_tensor().item(), 8);
  step(1);
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{-0.5, 0.5}));
}

TEST(GradScaler, AMixedPrecisionStepReplays) {
  auto build = [](nn::StateDict* init) {
    manual_seed(4);
    auto m = std::make_shared<nn::Linear>(5, 3);
    if (init) m->load_state_dict(*init);
    return m;
  };
  auto model = build(nullptr);
  nn::StateDict init;
  for (auto& [n, t] : model->state_dict()) init.emplace_back(n, tensor(t.to_vector<float>(), t.shape()));
  optim::AdamW opt(model->parameters());
  amp::GradScaler scaler;
  auto fn = [](nn::Linear& m, optim::AdamW& o, amp::GradScaler& s, const Tensor& x) {
    Tensor loss;
    {
      amp::AutocastGuard autocast;
      loss = cast(m.forward(x), DType::f32).sum();
    }
    s.scale(loss).backward();
    s.step(o);
    s.update();
    o.zero_grad();
    return loss;
  };
  Tensor x = tensor(std::vector<float>(50, 0.25f), {10, 5});
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{fn(*model, opt, scaler, a[0])};
  }, {x});
  std::vector<double> replayed;
  for (int i = 0; i < 3; ++i) replayed.push_back(step({x})[0].item());
  auto ref = build(&init);
  optim::AdamW ref_opt(ref->parameters());
  amp::GradScaler ref_scaler;
  for (int i = 0; i < 3; ++i) {
    Tensor l = fn(*ref, ref_opt, ref_scaler, x);
    mark_step();
    EXPECT_EQ(l.item(), replayed[i]) << "step " << i;
  }
  EXPECT_NE(replayed[0], replayed[2]);
  EXPECT_EQ(model->weight.to_vector<float>(), ref->weight.to_vector<float>());
}

}  // namespace
}  // namespace lazyrt
