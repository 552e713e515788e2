// An MLP trained for 20 steps with each optimizer, against the same training in torch
// (fixtures from tests/fixtures/gen_train_fixtures.py): every step's loss and the final
// weights, and one compiled graph per distinct step.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <map>

#include "ops/op_fixture.h"

namespace lazyrt {
namespace {

using fixtures::OpCase;

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, std::vector<Tensor> p) {
  if (name == "adamw") return std::make_unique<optim::AdamW>(p, optim::AdamOptions{1e-2, 0.9, 0.999, 1e-8, 1e-2});
  if (name == "adamw_wd") return std::make_unique<optim::AdamW>(p, optim::AdamOptions{5e-3, 0.8, 0.99, 1e-6, 0.1});
  if (name == "adam") return std::make_unique<optim::Adam>(p, optim::AdamOptions{1e-2});
  if (name == "adam_l2") return std::make_unique<optim::Adam>(p, optim::AdamOptions{1e-2, 0.9, 0.999, 1e-8, 0.05});
  if (name == "sgd") return std::make_unique<optim::SGD>(p, optim::SGDOptions{0.05});
  if (name == "sgd_momentum")
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{0.05, 0.9, 0.1, 0.01, false});
  if (name == "sgd_nesterov") return std::make_unique<optim::SGD>(p, optim::SGDOptions{0.05, 0.9, 0, 0, true});
  throw std::runtime_error("unknown optimizer " + name);
}

Tensor make(const fixtures::FixtureTensor& t) {
  std::vector<float> v(t.reals.begin(), t.reals.end());
  return tensor(v, t.shape);
}

struct Trained {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
  int64_t uncached_after_step2 = 0;
  int64_t uncached = 0;
};

// Trains once per optimizer (cached across the cases of that optimizer).
const Trained& train(const OpCase& c) {
  static std::map<std::string, Trained> done;
  auto it = done.find(c.op);
  if (it != done.end()) return it->second;
  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4)});
  model->load_state_dict({{"0.weight", make(c.inputs[0])}, {"0.bias", make(c.inputs[1])},
                          {"2.weight", make(c.inputs[2])}, {"2.bias", make(c.inputs[3])}});
  auto opt = make_optimizer(c.op, model->parameters());
  const auto& xs = c.inputs[4];
  const auto& ys = c.inputs[5];
  const int64_t steps = xs.shape[0], batch = xs.shape[1];
  Trained r;
  cache::clear_memory();
  metrics::reset();
  std::vector<Tensor> losses;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<float> x(xs.reals.begin() + s * batch * 8, xs.reals.begin() + (s + 1) * batch * 8);
    std::vector<float> y(ys.reals.begin() + s * batch * 4, ys.reals.begin() + (s + 1) * batch * 4);
    Tensor loss = nn::mse_loss(model->forward(tensor(x, {batch, 8})), tensor(y, {batch, 4}));
    loss.backward();
    opt->step();
    opt->zero_grad();
    mark_step();
    losses.push_back(loss);
    if (s == 1) r.uncached_after_step2 = -metrics::counter("UncachedCompile");
  }
  r.uncached = metrics::counter("UncachedCompile");
  r.uncached_after_step2 += r.uncached;
  for (const Tensor& l : losses) r.losses.push_back(l.to_vector<float>()[0]);
  for (const auto& [name, p] : model->named_parameters()) {
    std::string key = name;
    for (char& ch : key) ch = ch == '.' ? '_' : ch;
    r.params[key] = p.to_vector<float>();
  }
  return done.emplace(c.op, std::move(r)).first->second;
}

class Training : public ::testing::TestWithParam<OpCase> {};

TEST_P(Training, MatchesTorchStepByStep) {
  const OpCase& c = GetParam();
  const Trained& r = train(c);
  EXPECT_LE(r.uncached, 2) << "at most two compiles for the whole run";
  EXPECT_EQ(r.uncached_after_step2, 0) << "no compile after step 2";
  const std::string result = c.attrs.at("result").at(0);
  const std::vector<float>& got = result == "losses" ? r.losses : r.params.at(result);
  ASSERT_EQ(got.size(), c.expected.reals.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], c.expected.reals[i], 1e-5 * std::abs(c.expected.reals[i]) + 1e-6) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Torch, Training, ::testing::ValuesIn(fixtures::load_op_cases(LAZYRT_TRAIN_FIXTURES)),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace lazyrt
