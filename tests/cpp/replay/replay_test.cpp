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

// A host value the step function reads (a number outside the trace's tensors), guarded by the
// front end's HostGuard: a change retraces, and a value that comes back replays its variant.
TEST(CompileStep, AHostGuardRetracesWhenTheHostValueChangesAndReplaysAVariantWhenItComesBack) {
  struct SameScale final : HostGuard {
    const double* scale;
    double traced;
    SameScale(const double* s, double t) : scale(s), traced(t) {}
    bool holds() const override { return *scale == traced; }
  };
  double scale = 2.0;
  CompileStepOptions options;
  options.host_guard = [&]() -> std::shared_ptr<const HostGuard> { return std::make_shared<SameScale>(&scale, scale); };
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * scale}; },
                                   {batch(0)}, options);
  auto check = [&](int traces) {
    Tensor x = batch(traces + 7);
    EXPECT_EQ(step({x})[0].to_vector<float>(), (x * scale).to_vector<float>()) << "scale " << scale;
    EXPECT_EQ(step.traces(), traces) << "scale " << scale;
  };
  check(1);
  check(1);
  scale = 3.0;
  check(2);
  scale = 2.0;
  check(2);
  EXPECT_EQ(step.variants(), 2u);
  CompiledStep strict = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * scale}; },
                                     {batch(0)}, CompileStepOptions{false, kDefaultMaxVariants, kDefaultMaxVariantBytes,
                                                                    options.host_guard});
  strict({batch(1)});
  scale = 5.0;
  EXPECT_THROW(strict({batch(1)}), Error);
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

TEST(CompileStep, WritesUpdatesIntoLentMemoryWhereItLies) {
  // Memory lent for writing: a replay writes each update into it, whether the executable
  // computes the value there, the value is a constant (zeros), or it is another lent tensor's
  // old value passed through (a swap, which must read both old values first). A sync never
  // writes into it.
  std::vector<float> wh{1, 2, 3}, zh{7, 7}, ah{1, 2}, bh{-1, -2};
  auto lend = [](std::vector<float>& h) {
    return from_blob(h.data(), {static_cast<int64_t>(h.size())}, DType::f32, [] {}, /*writable=*/true);
  };
  Tensor w = lend(wh), z = lend(zh), a = lend(ah), b = lend(bh);
  CompiledStep step = compile_step([&](const std::vector<Tensor>& args) {
    w.add_(args[0]);
    z.zero_();
    Tensor a_new = b * 1.0, b_new = a * 1.0;
    a.copy_(a_new);
    b.copy_(b_new);
    return std::vector<Tensor>{sum(w)};
  }, {ones({3})});
  Tensor one = tensor({1, 1, 1}, {3});
  for (int call = 1; call <= 3; ++call) {
    zh = {7, 7};
    EXPECT_EQ(step({one})[0].item(), 6 + 3 * call);
    EXPECT_EQ(wh, (std::vector<float>{1.0f + call, 2.0f + call, 3.0f + call}));
    EXPECT_EQ(zh, (std::vector<float>{0, 0}));
    EXPECT_EQ(ah, (call % 2 ? std::vector<float>{-1, -2} : std::vector<float>{1, 2})) << "call " << call;
    EXPECT_EQ(bh, (call % 2 ? std::vector<float>{1, 2} : std::vector<float>{-1, -2})) << "call " << call;
    EXPECT_EQ(w.host_data().get(), static_cast<const void*>(wh.data()));
  }
  EXPECT_EQ(step.traces(), 1);
  w.add_(one);
  mark_step();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{5, 6, 7}));
  EXPECT_EQ(wh, (std::vector<float>{4, 5, 6}));
}

// ---- bounded variants ---------------------------------------------------------------------

namespace {

// Every 3-d shape of `numel` elements: many distinct argument signatures of one byte size.
std::vector<Shape> shapes_of(int64_t numel) {
  std::vector<Shape> out;
  for (int64_t a = 1; a <= numel; ++a)
    for (int64_t b = 1; a * b <= numel; ++b)
      if (numel % (a * b) == 0) out.push_back({a, b, numel / (a * b)});
  return out;
}

// Small integers, so that sums are exact in f32 and any wrong or stale value shows.
Tensor input(const Shape& shape, size_t i) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) v[k] = static_cast<float>((k + static_cast<int64_t>(i) * 5) % 7 - 3);
  return tensor(v, shape);
}

// A step with state: acc += x.sum(); returns x * 2 + acc.
struct Accumulator {
  Tensor acc = zeros({});
  Accumulator() { mark_step(); }
  std::vector<Tensor> operator()(const std::vector<Tensor>& a) {
    acc.add_(a[0].sum());
    return {a[0] * 2.0 + acc};
  }
};

// The same program traced plainly, call by call.
struct PlainAccumulator {
  Tensor acc = zeros({});
  std::vector<float> operator()(const Tensor& x) {
    acc.add_(x.sum());
    std::vector<float> y = (x * 2.0 + acc).to_vector<float>();
    mark_step();
    return y;
  }
};

// Restores the in-memory cache's caps at the end of a test.
struct MemoryCacheCaps {
  size_t capacity = cache::memory_capacity();
  uint64_t bytes = cache::memory_max_bytes();
  ~MemoryCacheCaps() {
    cache::set_memory_capacity(capacity);
    cache::set_memory_max_bytes(bytes);
  }
};

}  // namespace

TEST(CompileStep, ManyArgumentShapesStayWithinTheVariantCapWithFlatMemory) {
  MemoryCacheCaps restore;
  cache::set_memory_capacity(8);  // the executables themselves are the in-memory cache's to bound
  const std::vector<Shape> shapes = shapes_of(720);
  ASSERT_GT(shapes.size(), 200u);
  Accumulator acc;
  PlainAccumulator plain;
  CompileStepOptions options;
  options.max_variants = 8;
  CompiledStep step = compile_step(std::ref(acc), {input(shapes[0], 0)}, options);
  metrics::reset();
  std::vector<int64_t> live;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor x = input(shapes[i], i);
    std::vector<float> got = step({x})[0].to_vector<float>();
    ASSERT_EQ(got, plain(x)) << "shape " << shape_str(shapes[i]);
    ASSERT_LE(step.variants(), 8u);
    live.push_back(debug::live_memory_bytes());
  }
  EXPECT_EQ(step.variants(), 8u);
  EXPECT_EQ(metrics::counter("CompiledStepVariantEvictions"), static_cast<int64_t>(shapes.size()) - 8);
  EXPECT_EQ(step.traces(), static_cast<int>(shapes.size()));
  for (size_t i = 16; i < live.size(); ++i) ASSERT_EQ(live[i], live[16]) << "live bytes grew at call " << i;
  // An evicted shape is traced again, and its replays stay exact.
  for (int k = 0; k < 3; ++k) {
    Tensor x = input(shapes[0], 1000 + k);
    EXPECT_EQ(step({x})[0].to_vector<float>(), plain(x));
  }
  EXPECT_EQ(step.traces(), static_cast<int>(shapes.size()) + 1);
  EXPECT_EQ(acc.acc.item(), plain.acc.item());
}

TEST(CompileStep, TheMostRecentlyUsedVariantsStay) {
  Accumulator acc;
  PlainAccumulator plain;
  CompileStepOptions options;
  options.max_variants = 2;
  const Shape a{2, 3}, b{3, 2}, c{6};
  CompiledStep step = compile_step(std::ref(acc), {input(a, 0)}, options);
  auto call = [&](const Shape& s, size_t i) {
    Tensor x = input(s, i);
    EXPECT_EQ(step({x})[0].to_vector<float>(), plain(x)) << shape_str(s);
  };
  metrics::reset();
  call(a, 1);
  call(b, 2);  // traced: {b, a}
  call(a, 3);  // a is the most recent: {a, b}
  call(c, 4);  // traced, evicts b: {c, a}
  EXPECT_EQ(step.traces(), 3);
  call(a, 5);
  EXPECT_EQ(step.traces(), 3) << "a was kept";
  call(b, 6);
  EXPECT_EQ(step.traces(), 4) << "b was evicted, so it is traced again";
  EXPECT_EQ(metrics::counter("CompiledStepVariantEvictions"), 2);
  EXPECT_EQ(step.variants(), 2u);
}

TEST(CompileStep, TheVariantByteCapEvicts) {
  Accumulator acc;
  PlainAccumulator plain;
  CompiledStep step = compile_step(std::ref(acc), {input({4, 5}, 0)});
  EXPECT_EQ(step.max_variants(), kDefaultMaxVariants);
  EXPECT_EQ(step.max_variant_bytes(), kDefaultMaxVariantBytes);
  const uint64_t one = step.variant_bytes();
  EXPECT_GE(one, 20u * sizeof(float)) << "a variant holds at least its result buffer";
  Tensor x = input({5, 4}, 1);
  EXPECT_EQ(step({x})[0].to_vector<float>(), plain(x));
  EXPECT_EQ(step.variants(), 2u);
  metrics::reset();
  step.set_max_variant_bytes(one);  // room for one variant of this size: lowering evicts at once
  EXPECT_EQ(step.variants(), 1u);
  EXPECT_LE(step.variant_bytes(), one);
  EXPECT_EQ(metrics::counter("CompiledStepVariantEvictions"), 1);
  for (size_t i = 2; i < 6; ++i) {
    Tensor y = input(i % 2 ? Shape{4, 5} : Shape{5, 4}, i);
    EXPECT_EQ(step({y})[0].to_vector<float>(), plain(y));
    EXPECT_EQ(step.variants(), 1u);
  }
  EXPECT_EQ(metrics::counter("CompiledStepVariantEvictions"), 4) << "every change of shape evicted the other";
  step.set_max_variant_bytes(1);  // below any variant: the one in use stays
  EXPECT_EQ(step.variants(), 1u);
  step.set_max_variant_bytes(0);  // no byte cap
  Tensor z = input({5, 4}, 9);
  EXPECT_EQ(step({z})[0].to_vector<float>(), plain(z));
  EXPECT_EQ(step.variants(), 2u);
}

TEST(CompileStep, VariantSettingsAreCheckedAndShrinkingEvicts) {
  Accumulator acc;
  CompileStepOptions bad;
  bad.max_variants = 0;
  try {
    compile_step(std::ref(acc), {input({3}, 0)}, bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("max_variants"));
  }
  CompiledStep step = compile_step(std::ref(acc), {input({3}, 0)});
  for (int64_t n = 1; n <= 5; ++n) step({input({n}, 0)});
  EXPECT_EQ(step.variants(), 5u);
  try {
    step.set_max_variants(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("set_max_variants"));
  }
  EXPECT_EQ(step.max_variants(), kDefaultMaxVariants) << "a refused setting changes nothing";
  EXPECT_EQ(step.variants(), 5u);
  step.set_max_variants(2);
  EXPECT_EQ(step.max_variants(), 2u);
  EXPECT_EQ(step.variants(), 2u);
  const int traces = step.traces();
  step({input({5}, 1)});
  step({input({4}, 1)});
  EXPECT_EQ(step.traces(), traces) << "the two most recently used were kept";
}

TEST(CompileStep, AFailedRetraceLeavesTheStepAsItWas) {
  Tensor acc = zeros({});
  mark_step();
  auto fn = [&](const std::vector<Tensor>& a) {
    if (a[0].shape()[0] == 3) throw Error("the step refuses three rows");
    acc.add_(a[0].sum());
    return std::vector<Tensor>{a[0] + acc};
  };
  CompiledStep step = compile_step(fn, {ones({2})});
  EXPECT_EQ(step({ones({2})})[0].to_vector<float>(), (std::vector<float>{3, 3}));
  EXPECT_THROW(step({ones({3})}), Error);
  EXPECT_EQ(step.traces(), 1);
  EXPECT_EQ(step.variants(), 1u);
  EXPECT_EQ(step({ones({2})})[0].to_vector<float>(), (std::vector<float>{5, 5}));
  EXPECT_EQ(step.traces(), 1) << "the variant that was there still replays";
  // Every variant stale, and the retrace fails: still nothing lost, and the next call retraces.
  invalidate_compiled_steps();
  EXPECT_THROW(step({ones({3})}), Error);
  EXPECT_EQ(step.variants(), 1u);
  EXPECT_EQ(step.traces(), 1);
  EXPECT_EQ(acc.item(), 4);
  EXPECT_EQ(step({ones({2})})[0].to_vector<float>(), (std::vector<float>{7, 7}));
  EXPECT_EQ(step.traces(), 2);
  EXPECT_EQ(step.variants(), 1u) << "the stale variant went once the retrace succeeded";
  EXPECT_EQ(acc.item(), 6);
}

}  // namespace lazyrt
