// Replay is never stale: compile_step and the low-level calls against plain traced steps
// (step, mark_step) from the same seed, for state still pending when the step is traced and
// for what a user does between calls.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

namespace lazyrt {
using ::testing::HasSubstr;

namespace {

Tensor batch(int i) {
  std::vector<float> v(50);
  for (int k = 0; k < 50; ++k) v[k] = static_cast<float>((k * 7 + i * 13) % 11) / 5.0f - 1.0f;
  return tensor(v, {10, 5});
}

// Linear(5, 8), Dropout, Linear(8, 3); an optimizer; nothing synced after construction.
struct World {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<nn::Linear> l1, l2;
  std::unique_ptr<optim::Optimizer> opt;
  bool zero_grad_in_step = true;
  explicit World(bool sgd = false, double p = 0.0) {
    manual_seed(0);
    model = std::make_shared<nn::Sequential>();
    l1 = std::make_shared<nn::Linear>(5, 8);
    l2 = std::make_shared<nn::Linear>(8, 3);
    model->push_back(l1);
    model->push_back(std::make_shared<nn::Tanh>());
    if (p > 0) model->push_back(std::make_shared<nn::Dropout>(p));
    model->push_back(l2);
    if (sgd) opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{0.1, 0.9});
    else opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamOptions{0.1, 0.9, 0.999, 1e-8, 1e-2});
  }
  std::vector<Tensor> step(const std::vector<Tensor>& a) {
    Tensor loss = pow(model->forward(a[0]), 2.0).mean();
    loss.backward();
    opt->step();
    if (zero_grad_in_step) opt->zero_grad();
    return {loss};
  }
  std::vector<std::vector<float>> state() {
    std::vector<std::vector<float>> out;
    for (const Tensor& p : model->parameters()) {
      out.push_back(p.to_vector<float>());
      out.push_back(p.grad().defined() ? p.grad().to_vector<float>() : std::vector<float>{});
    }
    for (const Tensor& t : opt->state()) out.push_back(cast(t, DType::f32).to_vector<float>());
    return out;
  }
};

void expect_near(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << "tensor " << i;
    for (size_t k = 0; k < a[i].size(); ++k) EXPECT_NEAR(a[i][k], b[i][k], 1e-6f + 1e-6f * std::abs(b[i][k])) << i;
  }
}

// Runs program(world, call) with call replaying a compiled step, then with plain steps, and
// compares losses and every state tensor. Returns the compiled step's trace count.
template <class Program>
int run_both(Program program, bool sgd = false, double p = 0.0) {
  std::vector<float> losses[2];
  std::vector<std::vector<float>> states[2];
  int traces = 0;
  for (int replayed = 1; replayed >= 0; --replayed) {
    World w(sgd, p);
    std::optional<CompiledStep> compiled;
    auto call = [&](const Tensor& x) {
      if (!replayed) {
        Tensor loss = w.step({x})[0];
        mark_step();
        return static_cast<float>(loss.item());
      }
      if (!compiled) compiled = compile_step([&w](const std::vector<Tensor>& a) { return w.step(a); }, {x});
      return static_cast<float>((*compiled)({x})[0].item());
    };
    losses[replayed] = program(w, call);
    states[replayed] = w.state();
    if (replayed) traces = compiled->traces();
  }
  EXPECT_THAT(losses[1], ::testing::Pointwise(::testing::FloatNear(1e-6f), losses[0]));
  expect_near(states[1], states[0]);
  return traces;
}

}  // namespace

TEST(NeverStale, FreshModelNeverSynced) {
  const int traces = run_both([](World&, auto& call) {
    std::vector<float> l;
    for (int i = 0; i < 4; ++i) l.push_back(call(batch(0)));
    EXPECT_NE(l[0], l[1]);
    return l;
  });
  EXPECT_EQ(traces, 1);
}

TEST(NeverStale, LoadStateDictWithoutSyncBeforeAndBetweenCalls) {
  run_both([](World& w, auto& call) {
    nn::StateDict sd;
    int i = 0;
    for (auto& [n, t] : w.model->state_dict()) sd.emplace_back(n, full(t.shape(), 0.1 * ++i));
    w.model->load_state_dict(sd);
    std::vector<float> l{call(batch(0)), call(batch(1))};
    w.model->load_state_dict(sd);
    l.push_back(call(batch(2)));
    return l;
  });
}

TEST(NeverStale, InPlaceEditsOfParameters) {
  run_both([](World& w, auto& call) {
    {
      NoGradGuard ng;
      w.l1->weight.mul_(full({}, 0.5));
    }
    std::vector<float> l{call(batch(0))};
    {
      NoGradGuard ng;
      w.l2->bias.add_(full({}, 1.0));
    }
    l.push_back(call(batch(0)));
    l.push_back(call(batch(0)));
    return l;
  });
}

TEST(NeverStale, LearningRateChangeIsReadWithoutRetracing) {
  const int traces = run_both(
      [](World& w, auto& call) {
        std::vector<float> l{call(batch(0)), call(batch(0))};
        auto& sgd = static_cast<optim::SGD&>(*w.opt);
        sgd.set_lr(0.0);
        l.push_back(call(batch(0)));
        l.push_back(call(batch(0)));
        EXPECT_FLOAT_EQ(l[2], l[3]) << "rate 0 keeps the weights";
        sgd.set_lr(0.3);
        l.push_back(call(batch(0)));
        return l;
      },
      /*sgd=*/true);
  EXPECT_EQ(traces, 1);
}

TEST(NeverStale, OtherHyperparametersRetrace) {
  const int traces = run_both([](World& w, auto& call) {
    std::vector<float> l{call(batch(0)), call(batch(0))};
    auto& adam = static_cast<optim::Adam&>(*w.opt);
    optim::AdamOptions o = adam.options();
    o.weight_decay = 0.5;
    adam.set_options(o);
    l.push_back(call(batch(0)));
    l.push_back(call(batch(0)));
    return l;
  });
  EXPECT_EQ(traces, 2);
}

TEST(NeverStale, EvalTurnsDropoutOff) {
  const int traces = run_both(
      [](World& w, auto& call) {
        std::vector<float> l{call(batch(0)), call(batch(0))};
        w.model->eval();
        l.push_back(call(batch(0)));
        l.push_back(call(batch(0)));
        w.model->train();
        l.push_back(call(batch(0)));
        return l;
      },
      false, 0.5);
  EXPECT_EQ(traces, 3);
}

TEST(NeverStale, GradientsAccumulatedOverCallsWithZeroGradOutside) {
  for (bool set_to_none : {true, false}) {
    run_both([set_to_none](World& w, auto& call) {
      w.zero_grad_in_step = false;
      std::vector<float> l;
      for (int i = 0; i < 6; ++i) {
        l.push_back(call(batch(i)));
        if (i % 3 == 2) w.opt->zero_grad(set_to_none);
      }
      return l;
    });
  }
}

TEST(NeverStale, GradientSetBetweenCallsIsClearedByTheStep) {
  run_both([](World& w, auto& call) {
    std::vector<float> l{call(batch(0))};
    for (Tensor p : w.model->parameters()) p.set_grad(ones(p.shape()));
    l.push_back(call(batch(0)));
    return l;
  });
}

TEST(NeverStale, NonLeafArgumentGradientFlowsThroughIt) {
  // d/dx sum(tanh(W (2x) + b)) = 2 W^T (1 - tanh^2), accumulated over two calls (2x, 3x).
  manual_seed(0);
  nn::Linear lin(3, 2);
  auto step = compile_step(
      [&](const std::vector<Tensor>& a) {
        Tensor loss = tanh(lin.forward(a[0])).sum();
        loss.backward();
        return std::vector<Tensor>{loss};
      },
      {tensor({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_()});
  Tensor x = tensor({0.1f, -0.2f, 0.3f, 0.5f, 0.4f, -0.6f}, {2, 3}).requires_grad_();
  step({x * 2.0});
  step({x * 3.0});
  std::vector<float> got = x.grad().to_vector<float>();
  // The same gradient by plain tracing.
  Tensor x2 = tensor({0.1f, -0.2f, 0.3f, 0.5f, 0.4f, -0.6f}, {2, 3}).requires_grad_();
  {
    NoGradGuard ng;
    for (Tensor p : lin.parameters()) p.set_grad(Tensor());
  }
  tanh(lin.forward(x2 * 2.0)).sum().backward();
  tanh(lin.forward(x2 * 3.0)).sum().backward();
  EXPECT_THAT(got, ::testing::Pointwise(::testing::FloatNear(1e-6f), x2.grad().to_vector<float>()));
}

// A model and optimizer built without a mark_step() and the step traced on them: the low-level
// calls compute the making of that state once (it used to be refused; before that every replay
// recomputed the initial weights), so three replays equal three plain steps, state and all.
TEST(NeverStale, LowLevelCallsComputeStateMadeBeforeTheStepOnce) {
  std::vector<float> losses[2];
  std::vector<std::vector<float>> states[2];
  for (int replayed = 0; replayed < 2; ++replayed) {
    World w;
    if (replayed) {
      Tensor loss = w.step({batch(0)})[0];
      GraphHash h = graph_hash({loss});
      warm_up_cache({loss});
      std::vector<Tensor> in = graph_inputs({loss}).values;
      for (int k = 0; k < 3; ++k) losses[1].push_back(static_cast<float>(run_cached_graph(h, in)[0].item()));
    } else {
      for (int k = 0; k < 3; ++k) {
        Tensor loss = w.step({batch(0)})[0];
        mark_step();
        losses[0].push_back(static_cast<float>(loss.item()));
      }
    }
    states[replayed] = w.state();
  }
  EXPECT_NE(losses[0][0], losses[0][2]);
  EXPECT_THAT(losses[1], ::testing::Pointwise(::testing::FloatNear(1e-6f), losses[0]));
  expect_near(states[1], states[0]);
}

TEST(NeverStale, LowLevelCallsAfterMarkStepFollowLearningRateChanges) {
  std::vector<float> losses[2];
  std::vector<std::vector<float>> states[2];
  for (int replayed = 0; replayed < 2; ++replayed) {
    World w(/*sgd=*/true);
    mark_step();
    auto& sgd = static_cast<optim::SGD&>(*w.opt);
    if (replayed) {
      Tensor loss = w.step({batch(0)})[0];
      GraphHash h = graph_hash({loss});
      warm_up_cache({loss});
      std::vector<Tensor> in = graph_inputs({loss}).values;
      for (double rate : {0.1, 0.1, 0.4}) {
        sgd.set_lr(rate);
        losses[1].push_back(static_cast<float>(run_cached_graph(h, in)[0].item()));
      }
    } else {
      for (double rate : {0.1, 0.1, 0.4}) {
        sgd.set_lr(rate);
        Tensor loss = w.step({batch(0)})[0];
        mark_step();
        losses[0].push_back(static_cast<float>(loss.item()));
      }
    }
    states[replayed] = w.state();
  }
  EXPECT_THAT(losses[1], ::testing::Pointwise(::testing::FloatNear(1e-6f), losses[0]));
  expect_near(states[1], states[0]);
}

TEST(NeverStale, WhileLoopAcceptsTensorsThatRequireGradUnderNoGrad) {
  Tensor w = tensor({2.0f}, {1}).requires_grad_();
  auto body = [&](const std::vector<Tensor>& c) { return std::vector<Tensor>{c[0] + 1, c[1] * w}; };
  auto cond = [](const std::vector<Tensor>& c) { return c[0] < 3; };
  std::vector<Tensor> init{scalar_tensor(0, DType::i64), tensor({1.0f}, {1})};
  {  // recorded for autograd: 1 * w^3, d/dw = 3 w^2
    std::vector<Tensor> out = while_loop(cond, body, init);
    EXPECT_TRUE(out[1].requires_grad());
    out[1].sum().backward();
    EXPECT_FLOAT_EQ(w.grad().item(), 12.0);
  }
  NoGradGuard ng;
  std::vector<Tensor> out = while_loop(cond, body, init);
  EXPECT_FLOAT_EQ(out[1].item(), 8.0);
  EXPECT_FALSE(out[1].requires_grad());
  std::vector<Tensor> init_rg{scalar_tensor(0, DType::i64), tensor({1.0f}, {1}).requires_grad_()};
  EXPECT_FLOAT_EQ(fori_loop(0, 2, [&](const Tensor&, const std::vector<Tensor>& c) { return std::vector<Tensor>{c[0] * w}; },
                            {init_rg[1]})[0].item(),
                  4.0);
}

// Found by replay_fuzz_test.cpp: GradScaler reads its scale through scale_.detach(), a
// temporary on the same buffer. Replays must read the scale tensor itself on every call (the
// scale grows after `growth_interval` finite steps), not the buffer it had when traced.
TEST(NeverStale, GradScalerScaleGrowsAcrossReplays) {
  std::vector<double> scales[2];
  for (int replayed = 0; replayed < 2; ++replayed) {
    manual_seed(7);
    nn::Linear lin(6, 2);
    optim::SGD opt(lin.parameters(), {0.05, 0.9});
    amp::GradScaler scaler({1024.0, 2.0, 0.5, 2});
    auto fn = [&](const std::vector<Tensor>& a) {
      Tensor loss;
      {
        amp::AutocastGuard autocast(DType::bf16);
        loss = pow(lin.forward(a[0]), 2.0).mean();
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    Tensor x = ones({4, 6});
    std::optional<CompiledStep> step;
    for (int i = 0; i < 5; ++i) {
      if (replayed) {
        if (!step) step = compile_step(fn, {x});
        (*step)({x});
      } else {
        fn({x});
        mark_step();
      }
      scales[replayed].push_back(scaler.scale_tensor().item());
    }
  }
  EXPECT_EQ(scales[0], (std::vector<double>{1024, 2048, 2048, 4096, 4096}));
  EXPECT_EQ(scales[1], scales[0]);
}

}  // namespace lazyrt
