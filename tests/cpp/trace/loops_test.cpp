#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <limits>
#include <utility>

#include "support/error_of.h"

namespace lazyrt {
using ::testing::HasSubstr;

namespace {
Tensor i64(int64_t v) { return scalar_tensor(static_cast<double>(v), DType::i64); }

// x <- tanh(x @ w + b), the body used by several tests.
Tensor layer(const Tensor& x, const Tensor& w, const Tensor& b) { return tanh(matmul(x, w) + b); }

using testing_support::error_of;
}  // namespace

TEST(WhileLoop, CountdownScenario) {
  Carry out = while_loop([](const Carry& c) { return c[0] > 0; },
                         [](const Carry& c) { return Carry{c[0] - 1, c[1] + 1}; },
                         {i64(10), i64(3)});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].dtype(), DType::i64);
  EXPECT_EQ(out[0].item(), 0);
  EXPECT_EQ(out[1].item(), 13);
}

TEST(WhileLoop, HostLoopGrowsTheGraphWhileTheLoopStaysFlat) {
  Tensor x = scalar_tensor(1);
  for (int i = 0; i < 50; ++i) x = x + 1;
  EXPECT_GE(debug::graph_node_count({x}), 50);
  EXPECT_LE(debug::graph_node_count({x}), 102);
  EXPECT_EQ(x.item(), 51);

  auto loop_graph_size = [](int64_t n) {
    Carry out = fori_loop(0, n, [](const Tensor&, const Carry& c) { return Carry{c[0] + 1}; },
                          {scalar_tensor(1)});
    int64_t size = debug::graph_node_count(out);
    EXPECT_EQ(out[0].item(), 1 + n);
    return size;
  };
  const int64_t small = loop_graph_size(50);
  EXPECT_EQ(loop_graph_size(5000), small);
  EXPECT_LT(small, 20);
}

TEST(WhileLoop, BodyCompiledOnceForAnyTripCount) {
  cache::clear_memory();
  metrics::reset();
  auto run = [](int64_t n) {
    Carry out = fori_loop(0, n, [](const Tensor& i, const Carry& c) {
      return Carry{c[0] + cast(i, DType::f64)};
    }, {scalar_tensor(0, DType::f64)});
    return out[0].item();
  };
  EXPECT_EQ(run(10), 45);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(run(100000), 100000.0 * 99999 / 2);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), 1);
}

TEST(WhileLoop, ZeroTripLoopsReturnInit) {
  Carry w = while_loop([](const Carry& c) { return c[0] > 100; },
                       [](const Carry& c) { return Carry{c[0] * 2, c[1] - 5}; },
                       {i64(3), tensor({1, 2}, {2})});
  EXPECT_EQ(w[0].item(), 3);
  EXPECT_EQ(w[1].to_vector<float>(), (std::vector<float>{1, 2}));
  Carry f = fori_loop(5, 5, [](const Tensor&, const Carry& c) { return Carry{c[0] + 1}; },
                      {scalar_tensor(7)});
  EXPECT_EQ(f[0].item(), 7);
  Carry g = fori_loop(9, 2, [](const Tensor&, const Carry& c) { return Carry{c[0] + 1}; },
                      {scalar_tensor(7)});
  EXPECT_EQ(g[0].item(), 7);
}

TEST(ForiLoop, BoundsBeyondTwoToTheFiftyThreeAreExact) {
  // The bounds and the counter are i64 exactly: through a double, 2^53 + 3 became 2^53 + 4
  // (one trip too many), and INT64_MAX became INT64_MIN (a loop from it ran 2^63 trips).
  const auto trips_and_last = [](int64_t lo, int64_t hi) {
    Carry out = fori_loop(lo, hi, [](const Tensor& i, const Carry& c) { return Carry{c[0] + 1, i}; },
                          {tensor(std::vector<int64_t>{0}, {}), tensor(std::vector<int64_t>{-1}, {})});
    return std::make_pair(out[0].to_vector<int64_t>()[0], out[1].to_vector<int64_t>()[0]);
  };
  const int64_t p53 = int64_t{1} << 53, max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(trips_and_last(p53, p53 + 3), std::make_pair(int64_t{3}, p53 + 2));
  EXPECT_EQ(trips_and_last(max - 2, max), std::make_pair(int64_t{2}, max - 1));
  EXPECT_EQ(trips_and_last(max, -4), std::make_pair(int64_t{0}, int64_t{-1}));
}

TEST(WhileLoop, LinearAppliedNTimesMatchesTheHostLoop) {
  Tensor w = tensor({0.5, -0.3, 0.8, 0.1, 0.2, -0.7, 0.4, 0.9, -0.2}, {3, 3});
  Tensor b = tensor({0.1, -0.1, 0.05}, {3});
  Tensor x0 = tensor({1, 2, 3, -1, 0, 1}, {2, 3});
  const int n = 7;
  Tensor host = x0;
  for (int i = 0; i < n; ++i) host = layer(host, w, b);
  Carry out = fori_loop(0, n, [&](const Tensor&, const Carry& c) { return Carry{layer(c[0], w, b)}; },
                        {x0});
  std::vector<float> expect = host.to_vector<float>(), got = out[0].to_vector<float>();
  ASSERT_EQ(got.size(), expect.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], expect[i]);
}

TEST(WhileLoop, CapturesPendingOuterValuesAndValuesUsedByBothRegions) {
  Tensor limit = tensor({4}, {1}) * 2.0;  // pending: 8, captured by cond
  Tensor step = tensor({0.5}, {1}) + 0.5;  // pending: 1, captured by cond and body
  ASSERT_TRUE(limit.is_pending());
  Carry out = while_loop([&](const Carry& c) { return c[0] + step < limit + 1; },
                         [&](const Carry& c) { return Carry{c[0] + step, c[1]}; },
                         {tensor({0}, {1}), tensor({42}, {1})});
  EXPECT_TRUE(limit.is_pending()) << "capturing does not sync the outer value";
  EXPECT_EQ(out[0].item(), 8);
  EXPECT_EQ(out[1].item(), 42) << "a carry passed through unchanged";
  EXPECT_FALSE(limit.is_pending()) << "reading the result computes what its graph shares";
}

TEST(WhileLoop, UnusedCarriesAndCarriesReturnedInAnotherOrder) {
  Carry out = while_loop([](const Carry& c) { return c[0] < 3; },
                         [](const Carry& c) { return Carry{c[0] + 1, c[2], c[1], c[3]}; },
                         {i64(0), tensor({1}, {1}), tensor({2}, {1}), tensor({9, 9}, {2})});
  EXPECT_EQ(out[0].item(), 3);
  EXPECT_EQ(out[1].item(), 2) << "three swaps leave the pair swapped";
  EXPECT_EQ(out[2].item(), 1);
  EXPECT_EQ(out[3].to_vector<float>(), (std::vector<float>{9, 9}));
}

TEST(WhileLoop, NestedLoops) {
  // sum over i < 4 of sum over j < i + 1 of (i * 10 + j)
  Carry out = fori_loop(0, 4, [](const Tensor& i, const Carry& c) {
    Tensor upper = i + 1;
    Carry inner = while_loop([&](const Carry& d) { return d[0] < upper; },
                             [&](const Carry& d) { return Carry{d[0] + 1, d[1] + i * 10 + d[0]}; },
                             {zeros({}, DType::i64), c[0]});
    return Carry{inner[1]};
  }, {zeros({}, DType::i64)});
  int64_t expect = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < i + 1; ++j) expect += i * 10 + j;
  EXPECT_EQ(out[0].item(), expect);
}

TEST(WhileLoop, InsideATracedTrainingStep) {
  Tensor w = tensor({1, 2}, {2});
  for (int step = 0; step < 3; ++step) {
    // The update runs a loop: w <- w * 0.5 applied twice, then + 1.
    Carry halved = fori_loop(0, 2, [](const Tensor&, const Carry& c) { return Carry{c[0] * 0.5}; }, {w});
    w.copy_(halved[0] + 1);
    mark_step();
  }
  // w: [1,2] -> [1.25,1.5] -> [1.3125,1.375] -> [1.328125,1.34375]
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1.328125f, 1.34375f}));
}

TEST(WhileLoop, MemoryDoesNotDependOnTheTripCount) {
  Tensor x0 = zeros({1000});
  x0.to_vector<float>();
  auto peak = [&](int64_t n) {
    debug::reset_peak_memory();
    const int64_t before = debug::live_memory_bytes();
    Carry out = fori_loop(0, n, [](const Tensor&, const Carry& c) { return Carry{c[0] + 1}; }, {x0});
    EXPECT_EQ(out[0].to_vector<float>()[999], static_cast<float>(n));
    return debug::peak_memory_bytes() - before;
  };
  peak(10);  // warm: compiled and cached
  const int64_t small = peak(10);
  EXPECT_EQ(peak(20000), small);
}

TEST(WhileLoopErrors, BodyReturnsTheWrongNumberOfValues) {
  std::string e = error_of([] {
    while_loop([](const Carry& c) { return c[0] < 3; },
               [](const Carry& c) { return Carry{c[0] + 1}; }, {i64(0), i64(1)});
  });
  EXPECT_THAT(e, HasSubstr("while_loop"));
  EXPECT_THAT(e, HasSubstr("returned 1 values, but init has 2"));
}

TEST(WhileLoopErrors, BodyChangesAShapeOrDtypeNamesThePosition) {
  std::string shape = error_of([] {
    while_loop([](const Carry& c) { return c[0] < 3; },
               [](const Carry& c) { return Carry{c[0] + 1, reshape(c[1], {2, 1})}; },
               {i64(0), tensor({1, 2}, {2})});
  });
  EXPECT_THAT(shape, HasSubstr("body result 1 is f32[2, 1], expected f32[2]"));
  std::string dtype = error_of([] {
    fori_loop(0, 3, [](const Tensor&, const Carry& c) { return Carry{c[0] * 0.5}; }, {i64(4)});
  });
  EXPECT_THAT(dtype, HasSubstr("fori_loop: body result 0 is f32[], expected i64[]"));
}

TEST(WhileLoopErrors, CondMustReturnOneElement) {
  std::string e = error_of([] {
    while_loop([](const Carry& c) { return c[0] > 0; },
               [](const Carry& c) { return Carry{c[0] - 1}; }, {tensor({1, 2}, {2})});
  });
  EXPECT_THAT(e, HasSubstr("cond must return a one-element tensor, got b8[2]"));
}

TEST(WhileLoopErrors, BodyMayNotMutateOuterTensorsOrReadValues) {
  Tensor outer = tensor({1}, {1});
  std::string mutate = error_of([&] {
    while_loop([](const Carry& c) { return c[0] < 3; },
               [&](const Carry& c) {
                 outer.add_(c[0]);
                 return Carry{c[0] + 1};
               },
               {tensor({0}, {1})});
  });
  EXPECT_THAT(mutate, HasSubstr("modifies a tensor from outside the loop in place"));
  EXPECT_FALSE(outer.is_pending());
  EXPECT_EQ(outer.item(), 1);
  std::string read = error_of([] {
    while_loop([](const Carry& c) { return c[0] < 3; },
               [](const Carry& c) { return Carry{c[0] + c[0].item()}; }, {tensor({0}, {1})});
  });
  EXPECT_THAT(read, HasSubstr("symbolic"));
}

// c <- c * w + 1 while c < 10, from c0 = 1 and w = 2: 1, 3, 7, 15 (three trips), so
// c = w^3 c0 + w^2 + w + 1, dc/dw = 3 w^2 c0 + 2 w + 1 = 17 and dc/dc0 = w^3 = 8, whatever
// the memory policy; with a captured w or with w as a carry.
TEST(WhileLoop, GradientsThroughADataDependentTripCount) {
  auto cond = [](const Carry& c) { return c[0].sum() < 10; };
  for (int64_t snapshots : {0, 1, 2, 5}) {
    Tensor w = tensor({2}, {1}).requires_grad_();
    Tensor c0 = tensor({1}, {1}).requires_grad_();
    Carry out = while_loop(cond, [&](const Carry& c) { return Carry{c[0] * w + 1}; }, {c0}, snapshots);
    EXPECT_EQ(out[0].item(), 15);
    out[0].sum().backward();
    EXPECT_EQ(w.grad().item(), 17) << "snapshots " << snapshots;
    EXPECT_EQ(c0.grad().item(), 8) << "snapshots " << snapshots;
    // w as a carry the body returns unchanged.
    Tensor w2 = tensor({2}, {1}).requires_grad_();
    Carry both = while_loop(cond, [](const Carry& c) { return Carry{c[0] * c[1] + 1, c[1]}; },
                            {tensor({1}, {1}), w2}, snapshots);
    (both[0] + both[1]).sum().backward();
    EXPECT_EQ(w2.grad().item(), 18) << "snapshots " << snapshots;
  }
  // Zero trips: the carries come back unchanged, and so does the gradient.
  Tensor w = tensor({2}, {1}).requires_grad_();
  Tensor big = tensor({20}, {1}).requires_grad_();
  Carry none = while_loop(cond, [&](const Carry& c) { return Carry{c[0] * w + 1}; }, {big});
  (none[0] * 3).sum().backward();
  EXPECT_EQ(big.grad().item(), 3);
  EXPECT_EQ(w.grad().item(), 0);
  NoGradGuard no_grad;
  Carry plain = while_loop(cond, [&](const Carry& c) { return Carry{c[0] * w + 1}; }, {tensor({1}, {1})});
  EXPECT_EQ(plain[0].item(), 15);
  EXPECT_FALSE(plain[0].requires_grad());
}

// fori_loop with gradients against the unrolled host loop (two paths that must agree) and
// against the derivative written out: x_{i+1} = tanh(x_i * w + i), loss = sum(x_N).
TEST(WhileLoop, ForiLoopGradientsMatchTheUnrolledLoop) {
  const std::vector<float> wv = {0.7f, -0.4f, 1.1f}, xv = {0.2f, -1.0f, 0.5f};
  auto run = [&](bool loop) {
    Tensor w = tensor(wv, {3}), x = tensor(xv, {3});
    w.requires_grad_();
    x.requires_grad_();
    Tensor out;
    if (loop) {
      out = fori_loop(0, 4, [&](const Tensor& i, const Carry& c) {
        return Carry{tanh(c[0] * w + cast(i, DType::f32))};
      }, {x})[0];
    } else {
      out = x;
      for (int i = 0; i < 4; ++i) out = tanh(out * w + static_cast<double>(i));
    }
    out.sum().backward();
    return std::make_pair(w.grad().to_vector<float>(), x.grad().to_vector<float>());
  };
  auto [wl, xl] = run(true);
  auto [wu, xu] = run(false);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(wl[k], wu[k], 1e-6);
    EXPECT_NEAR(xl[k], xu[k], 1e-6);
    // The chain rule by hand, per element (the recurrence is elementwise).
    double x = xv[k], dw = 0, dx = 1;
    std::vector<double> xs{x};
    for (int i = 0; i < 4; ++i) xs.push_back(x = std::tanh(x * wv[k] + i));
    double g = 1;
    for (int i = 3; i >= 0; --i) {
      const double d = 1 - xs[i + 1] * xs[i + 1];
      dw += g * d * xs[i];
      g *= d * wv[k];
    }
    dx = g;
    EXPECT_NEAR(wl[k], dw, 1e-5);
    EXPECT_NEAR(xl[k], dx, 1e-5);
  }
}

TEST(WhileLoopErrors, NothingIsLeftHalfTraced) {
  metrics::reset();
  Tensor a = tensor({1, 2}, {2});
  EXPECT_THROW(while_loop([](const Carry& c) { return c[0] < 3; },
                          [](const Carry& c) { return Carry{c[0] + 1, c[0]}; }, {i64(0)}),
               Error);
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 0) << "nothing from the failed trace is pending";
  EXPECT_EQ((a + 1).to_vector<float>(), (std::vector<float>{2, 3})) << "tracing works again";
}

}  // namespace lazyrt
