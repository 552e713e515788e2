#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include "support/alloc_counter.h"
#include "trace/lazy_tensor.h"

namespace lazyrt {
using ::testing::HasSubstr;

namespace {

// The seed scenario: Linear(5, 3) on a 10x5 input, sum, backward, AdamW, zero_grad.
struct Seed {
  std::shared_ptr<nn::Linear> model;
  std::unique_ptr<optim::AdamW> opt;
  explicit Seed(const nn::StateDict* init = nullptr) {
    manual_seed(1);
    model = std::make_shared<nn::Linear>(5, 3);
    if (init) model->load_state_dict(*init);
    opt = std::make_unique<optim::AdamW>(model->parameters());
    mark_step();
  }
  Tensor step(const Tensor& x, const Tensor& found_inf = Tensor()) {
    Tensor loss = model->forward(x).sum();
    loss.backward();
    opt->step(found_inf);
    opt->zero_grad();
    return loss;
  }
  std::vector<float> weights() { return model->weight.to_vector<float>(); }
};

Tensor batch(int i) {
  std::vector<float> v(50);
  for (int k = 0; k < 50; ++k) v[k] = static_cast<float>((k * 7 + i * 13) % 11) / 5.0f - 1.0f;
  return tensor(v, {10, 5});
}

nn::StateDict snapshot(nn::Module& m) {
  nn::StateDict sd;
  for (auto& [n, t] : m.state_dict()) sd.emplace_back(n, tensor(t.to_vector<float>(), t.shape()));
  return sd;
}

// Losses and final weights of n plain traced steps (mark_step each) from `init`.
std::pair<std::vector<float>, std::vector<float>> plain(const nn::StateDict& init, int n, bool vary) {
  Seed s(&init);
  std::vector<float> losses;
  for (int i = 0; i < n; ++i) {
    Tensor loss = s.step(batch(vary ? i : 0));
    mark_step();
    losses.push_back(static_cast<float>(loss.item()));
  }
  return {losses, s.weights()};
}

}  // namespace

TEST(Replay, LowLevelScenarioUpdatesStateOnEveryReplay) {
  Seed s;
  nn::StateDict init = snapshot(*s.model);
  Tensor x = batch(0);
  Tensor loss = s.step(x, zeros({1}));
  GraphHash h = graph_hash({loss});
  warm_up_cache({loss});
  EXPECT_TRUE(loss.is_pending()) << "warm-up executes nothing";
  GraphInputs in = graph_inputs({loss});
  ASSERT_EQ(in.tensor_ids.size(), in.values.size());
  EXPECT_NE(std::find(in.tensor_ids.begin(), in.tensor_ids.end(), tensor_id(s.model->weight)),
            in.tensor_ids.end()) << "the weight is an input, as the same tensor";
  EXPECT_EQ(s.weights(), [&] { return init[0].second.to_vector<float>(); }()) << "back to its value before the trace";
  metrics::reset();
  std::vector<float> losses;
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> outs = run_cached_graph(h, in.values);
    losses.push_back(static_cast<float>(outs[0].item()));
  }
  EXPECT_EQ(metrics::counter("ReplayGraph"), 3);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 0);
  EXPECT_NE(losses[0], losses[1]);
  EXPECT_NE(losses[1], losses[2]);
  auto [expect_losses, expect_weights] = plain(init, 3, false);
  EXPECT_EQ(losses, expect_losses);
  EXPECT_EQ(s.weights(), expect_weights);
}

TEST(Replay, UnknownHashIsAClearError) {
  try {
    run_cached_graph(GraphHash{1, 2}, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("warm_up_cache"));
  }
}

TEST(CompileStep, ReplaysMatchPlainSteps) {
  Seed s;
  nn::StateDict init = snapshot(*s.model);
  metrics::reset();
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{s.step(a[0])}; },
                                   {batch(0)});
  EXPECT_EQ(s.weights(), init[0].second.to_vector<float>()) << "tracing runs nothing";
  EXPECT_FALSE(s.model->weight.is_pending());
  EXPECT_EQ(s.opt->step_count().item(), 0);
  const int64_t traced = metrics::timing_count("TraceTime");
  std::vector<float> losses;
  for (int i = 0; i < 4; ++i) losses.push_back(static_cast<float>(step({batch(i)})[0].item()));
  EXPECT_EQ(metrics::counter("ReplayGraph"), 4);
  EXPECT_EQ(metrics::timing_count("TraceTime"), traced) << "replays trace nothing";
  EXPECT_EQ(metrics::counter("UncachedCompile") + metrics::counter("CachedCompile"), 1);
  auto [expect_losses, expect_weights] = plain(init, 4, true);
  EXPECT_EQ(losses, expect_losses);
  EXPECT_EQ(s.weights(), expect_weights);
  EXPECT_EQ(s.opt->step_count().item(), 4);
}

TEST(CompileStep, ReplayAllocatesNothing) {
  Seed s;
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{s.step(a[0])}; },
                                   {batch(0)});
  std::vector<Tensor> args{batch(1)};
  step.run(args);
  step.run(args);
  testing::CountAllocations count;
  for (int i = 0; i < 5; ++i) step.run(args);
  EXPECT_EQ(count.count(), 0);
}

TEST(CompileStep, ABatchShapeChangeRetracesInsteadOfRunningStale) {
  Seed s;
  nn::StateDict init = snapshot(*s.model);
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{s.step(a[0])}; },
                                   {batch(0)});
  float l0 = static_cast<float>(step({batch(0)})[0].item());
  Tensor wide = tensor(std::vector<float>(20 * 5, 0.5f), {20, 5});
  float l1 = static_cast<float>(step({wide})[0].item());
  EXPECT_EQ(step.traces(), 2);
  Seed ref(&init);
  Tensor r0 = ref.step(batch(0));
  mark_step();
  Tensor r1 = ref.step(wide);
  mark_step();
  EXPECT_EQ(l0, static_cast<float>(r0.item()));
  EXPECT_EQ(l1, static_cast<float>(r1.item()));
  EXPECT_EQ(s.weights(), ref.weights());
}

TEST(CompileStep, GuardFailureThrowsByPolicyAndChangesNothing) {
  Seed s;
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{s.step(a[0])}; },
                                   {batch(0)}, CompileStepOptions{false});
  step({batch(0)});
  std::vector<float> before = s.weights();
  try {
    step({tensor(std::vector<float>(15, 1.0f), {3, 5})});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("f32[3, 5]"));
  }
  EXPECT_THROW(step({batch(0), batch(1)}), Error);
  EXPECT_THROW(step({cast(batch(0), DType::f64)}), Error);
  EXPECT_EQ(s.weights(), before);
  EXPECT_EQ(s.opt->step_count().item(), 1);
}

TEST(CompileStep, LoadStateDictBetweenReplaysTakesEffect) {
  Seed s;
  nn::StateDict init = snapshot(*s.model);
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{s.step(a[0])}; },
                                   {batch(0)});
  step({batch(0)});
  step({batch(1)});
  s.model->load_state_dict(init);
  float after_load = static_cast<float>(step({batch(0)})[0].item());
  Seed ref(&init);
  EXPECT_EQ(after_load, static_cast<float>(ref.step(batch(0)).item()));
}

TEST(CompileStep, DropoutMasksDifferPerCallAndFollowTheSeed) {
  auto make_fn = [](Tensor& w) {
    return [&w](const std::vector<Tensor>& a) {
      NoGradGuard g;
      Tensor y = dropout(a[0], 0.5) + w;
      w.copy_(w + 1);
      return std::vector<Tensor>{y};
    };
  };
  Tensor x = ones({64});
  Tensor w = zeros({64});
  w.to_vector<float>();
  manual_seed(77);
  CompiledStep step = compile_step(make_fn(w), {x});
  std::vector<std::vector<float>> replayed;
  for (int i = 0; i < 3; ++i) replayed.push_back(step({x})[0].to_vector<float>());
  EXPECT_NE(replayed[0], replayed[1]);
  manual_seed(77);
  Tensor w2 = zeros({64});
  w2.to_vector<float>();
  auto fn = make_fn(w2);
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> y = fn({x});
    mark_step();
    EXPECT_EQ(y[0].to_vector<float>(), replayed[i]) << "call " << i;
  }
}

TEST(CompileStep, GradientsLeftByTheStepAreWrittenBack) {
  Tensor w = tensor({1, 2, 3}, {3}).requires_grad_();
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) {
    w.set_grad(Tensor());
    Tensor loss = sum(w * a[0]);
    loss.backward();
    return std::vector<Tensor>{loss};
  }, {tensor({1, 1, 1}, {3})});
  EXPECT_FALSE(w.grad().defined()) << "the trace left no gradient behind";
  step({tensor({4, 5, 6}, {3})});
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 5, 6}));
  step({tensor({7, 8, 9}, {3})});
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{7, 8, 9}));
}

TEST(CompileStep, ATraceThatThrowsLeavesEverythingAsItWas) {
  Seed s;
  std::vector<float> before = s.weights();
  EXPECT_THROW(compile_step([&](const std::vector<Tensor>& a) {
    Tensor loss = s.step(a[0]);
    loss.item();  // a sync inside the step
    return std::vector<Tensor>{loss};
  }, {batch(0)}), Error);
  EXPECT_FALSE(s.model->weight.is_pending());
  EXPECT_EQ(s.weights(), before);
  EXPECT_EQ(s.opt->step_count().item(), 0);
}

TEST(CompileStep, NeverWritesIntoAdoptedMemory) {
  std::vector<float> host{1, 2, 3};
  Tensor w = trace::tensor_of(trace::make_data({DType::f32, {3}}, runtime::adopt(host.data(), 12, [] {})));
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) {
    w.add_(a[0]);
    return std::vector<Tensor>{sum(w)};
  }, {ones({3})});
  Tensor one = tensor({1, 1, 1}, {3});
  EXPECT_EQ(step({one})[0].item(), 9);
  EXPECT_EQ(step({one})[0].item(), 12);
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(host, (std::vector<float>{1, 2, 3}));
}

}  // namespace lazyrt
