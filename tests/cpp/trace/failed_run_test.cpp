// A run that throws when it meets a bad value (an index out of range, a failed value check)
// changes nothing: every tensor keeps the value it had before the call, on every path that
// runs a graph (sync, mark_step, compiled steps, run_cached_graph, loops), whether the bad
// index is a graph input (checked ahead of every step) or computed inside the graph (outputs
// computed before it are held aside until the run has passed it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <lazyrt/lazyrt.h>

#include "support/error_of.h"

namespace lazyrt {
namespace {

using ::testing::HasSubstr;
using testing_support::error_of;

using Floats = std::vector<float>;

Tensor f32(Floats v) {
  const auto n = static_cast<int64_t>(v.size());
  return tensor(std::move(v), {n});
}

// A 0-d constant, for in-place ops with a number.
Tensor num(double v) { return full({}, v, DType::f32); }

// A tensor holding data (not pending), as state is between steps.
Tensor state(Floats v) {
  Tensor t = f32(std::move(v));
  sync({t});
  return t;
}

// An index that is a graph input, or one the graph computes (|v|), so its check cannot run first.
Tensor index_of(int64_t v, bool computed) {
  Tensor t = tensor(std::vector<int64_t>{computed ? -v : v}, {1});
  return computed ? abs(t) : t;
}

TEST(FailedRun, SyncLeavesAPendingInPlaceUpdateUnapplied) {
  for (bool computed : {false, true})
    for (bool update_first : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "computed index " << computed << ", update first " << update_first);
      Tensor w = state({1, 2, 3});
      w.add_(num(1));
      Tensor t = index_select(state({10, 20}), 0, index_of(5, computed));
      EXPECT_THAT(error_of([&] { sync(update_first ? std::vector<Tensor>{w, t} : std::vector<Tensor>{t, w}); }),
                  HasSubstr("index_select: index 5 is out of bounds"));
      EXPECT_TRUE(w.is_pending());
      EXPECT_EQ(w.to_vector<float>(), (Floats{2, 3, 4}));
      EXPECT_EQ(w.to_vector<float>(), (Floats{2, 3, 4})) << "the update is applied once";
    }
}

TEST(FailedRun, EveryIndexingOpChecksBeforeAnyWrite) {
  for (bool computed : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "computed index " << computed);
    Tensor w = state({1, 2, 3});
    Tensor idx2 = tensor(std::vector<int64_t>{0, computed ? -9 : 9}, {2});
    if (computed) idx2 = abs(idx2);
    // The updated tensor is the operand of the indexing op: its update may be written in place.
    std::vector<std::function<Tensor()>> bad = {
        [&] { return gather(w, 0, idx2); },
        [&] { return scatter(w, 0, idx2, f32({7, 8})); },
        [&] { return scatter_add(w, 0, idx2, f32({7, 8})); },
        [&] { return index_add(w, 0, idx2, f32({7, 8})); },
        [&] { return index_select(w, 0, idx2); },
    };
    for (auto& make : bad) {
      w.mul_(num(2));
      Tensor r = make();
      EXPECT_THAT(error_of([&] { sync({r, w}); }), HasSubstr("index 9 is out of bounds"));
      r = Tensor();
      EXPECT_EQ(w.to_vector<float>(), (Floats{2, 4, 6}));
      w.mul_(num(0.5));
      sync({w});
    }
  }
}

TEST(FailedRun, MarkStepChangesNothing) {
  Tensor w = state({1, 2, 3});
  Tensor m = state({0, 0, 0});
  w.add_(num(-0.5));
  m.add_(w);
  Tensor bad = gather(state({1, 2}), 0, index_of(3, true));
  EXPECT_THAT(error_of([] { mark_step(); }), HasSubstr("gather"));
  bad = Tensor();
  mark_step();
  EXPECT_EQ(w.to_vector<float>(), (Floats{0.5, 1.5, 2.5}));
  EXPECT_EQ(m.to_vector<float>(), (Floats{0.5, 1.5, 2.5}));
}

TEST(FailedRun, ValueChecksAreTransactionalToo) {
  Tensor w = state({1, 2, 3});
  w.add_(num(1));
  Tensor draw = bernoulli(f32({0.5, 1.5}));
  EXPECT_THAT(error_of([&] { sync({w, draw}); }), HasSubstr("bernoulli: every probability must be in [0, 1]"));
  EXPECT_EQ(w.to_vector<float>(), (Floats{2, 3, 4}));
  EXPECT_THAT(error_of([&] { bernoulli(f32({NAN})).to_vector<float>(); }), HasSubstr("bernoulli"));
  EXPECT_THAT(error_of([&] { bernoulli(f32({-0.1f})).to_vector<float>(); }), HasSubstr("bernoulli"));
  Tensor ok = bernoulli(f32({0, 1, 1, 0}));
  EXPECT_EQ(ok.to_vector<float>(), (Floats{0, 1, 1, 0}));
}

TEST(FailedRun, CompiledStepReplayChangesNothing) {
  for (bool computed : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "computed index " << computed);
    Tensor s = state({1, 2, 3});
    Tensor m = state({0, 0, 0});
    CompiledStep step = compile_step(
        [&](const std::vector<Tensor>& a) {
          s.add_(num(1));
          m.mul_(num(0.5));
          m.add_(s);
          return std::vector<Tensor>{index_select(s, 0, computed ? abs(a[0]) : a[0])};
        },
        {tensor(std::vector<int64_t>{0}, {1})});
    EXPECT_EQ(step({tensor(std::vector<int64_t>{0}, {1})})[0].to_vector<float>(), (Floats{2}));
    EXPECT_THAT(error_of([&] { step({tensor(std::vector<int64_t>{computed ? -7 : 7}, {1})}); }),
                HasSubstr("index 7 is out of bounds"));
    EXPECT_EQ(s.to_vector<float>(), (Floats{2, 3, 4}));
    EXPECT_EQ(m.to_vector<float>(), (Floats{2, 3, 4}));
    EXPECT_EQ(step({tensor(std::vector<int64_t>{2}, {1})})[0].to_vector<float>(), (Floats{5}));
    EXPECT_EQ(m.to_vector<float>(), (Floats{4, 5.5, 7}));
    EXPECT_EQ(step.traces(), 1);
  }
}

TEST(FailedRun, RunCachedGraphChangesNothing) {
  Tensor s = state({1, 2, 3});
  Tensor idx = tensor(std::vector<int64_t>{1}, {1});
  mark_step();
  s.add_(num(1));
  Tensor out = index_select(s, 0, abs(idx));
  const GraphHash h = graph_hash({out});
  warm_up_cache({out});
  GraphInputs in = graph_inputs({out});
  size_t at = in.tensor_ids.size();
  for (size_t i = 0; i < in.tensor_ids.size(); ++i)
    if (in.tensor_ids[i] == tensor_id(idx)) at = i;
  ASSERT_LT(at, in.values.size());
  EXPECT_EQ(run_cached_graph(h, in.values)[0].to_vector<float>(), (Floats{3}));
  std::vector<Tensor> bad = in.values;
  bad[at] = tensor(std::vector<int64_t>{4}, {1});
  EXPECT_THAT(error_of([&] { run_cached_graph(h, bad); }), HasSubstr("index 4 is out of bounds"));
  EXPECT_EQ(s.to_vector<float>(), (Floats{2, 3, 4}));
  EXPECT_EQ(run_cached_graph(h, in.values)[0].to_vector<float>(), (Floats{4}));
  EXPECT_EQ(s.to_vector<float>(), (Floats{3, 4, 5}));
}

TEST(FailedRun, LoopThatFailsInALaterIterationChangesNothing) {
  Tensor w = state({1, 2, 3});
  Tensor src = state({10, 20});
  w.add_(num(1));
  // Iteration i reads src[i]: the third iteration is out of range.
  Carry out = fori_loop(
      0, 3, [&](const Tensor& i, const Carry& c) { return Carry{c[0] + index_select(src, 0, reshape(i, {1}))}; },
      {zeros({1})});
  EXPECT_THAT(error_of([&] { sync({w, out[0]}); }), HasSubstr("index 2 is out of bounds"));
  EXPECT_EQ(w.to_vector<float>(), (Floats{2, 3, 4}));
  Carry fine = fori_loop(
      0, 2, [&](const Tensor& i, const Carry& c) { return Carry{c[0] + index_select(src, 0, reshape(i, {1}))}; },
      {zeros({1})});
  EXPECT_EQ(fine[0].to_vector<float>(), (Floats{30}));
}

}  // namespace
}  // namespace lazyrt
