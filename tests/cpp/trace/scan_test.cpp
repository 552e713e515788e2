// lazyrt::scan: values against plain C++ loops over the same numbers, the compiled form (one
// scan node, one compile, rows read and written in place), and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include "support/error_of.h"

namespace lazyrt {
namespace {

using ::testing::HasSubstr;
using testing_support::error_of;

std::vector<float> iota_values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i) - 1.5f;
  return v;
}

// ys[r] = carry after row r, carry = carry * 0.5 + x[r], over [rows, width] inputs.
std::vector<float> decayed_sums(const std::vector<float>& xs, const std::vector<float>& init,
                                size_t rows, bool reverse) {
  const size_t width = init.size();
  std::vector<float> ys(rows * width), c = init;
  for (size_t t = 0; t < rows; ++t) {
    const size_t r = reverse ? rows - 1 - t : t;
    for (size_t j = 0; j < width; ++j) {
      c[j] = c[j] * 0.5f + xs[r * width + j];
      ys[r * width + j] = c[j];
    }
  }
  ys.insert(ys.end(), c.begin(), c.end());  // the final carry last
  return ys;
}

std::pair<Carry, Carry> decayed_scan(const Tensor& init, const Tensor& xs, bool reverse) {
  return scan(
      [](const Carry& c, const Carry& x) {
        Tensor next = c[0] * 0.5 + x[0];
        return std::make_pair(Carry{next}, Carry{next});
      },
      {init}, {xs}, reverse);
}

}  // namespace

TEST(Scan, ForwardAndReverseMatchPlainLoops) {
  const std::vector<float> xv = iota_values(7 * 3, 0.25f), iv = {1, -2, 0.5f};
  for (bool reverse : {false, true}) {
    auto [carry, ys] = decayed_scan(tensor(iv, {3}), tensor(xv, {7, 3}), reverse);
    ASSERT_EQ(carry.size(), 1u);
    ASSERT_EQ(ys.size(), 1u);
    EXPECT_EQ(ys[0].shape(), (Shape{7, 3}));
    std::vector<float> want = decayed_sums(xv, iv, 7, reverse);
    std::vector<float> got = ys[0].to_vector<float>();
    std::vector<float> c = carry[0].to_vector<float>();
    got.insert(got.end(), c.begin(), c.end());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "reverse " << reverse << " at " << i;
  }
}

TEST(Scan, SeveralCarriesInputsAndOutputsOfMixedDtypes) {
  // carry: (count i64, sum f32[2]); xs: (a f32[4, 2], b i64[4]); ys: (a * count, b + count).
  Tensor a = tensor(iota_values(8, 1.0f), {4, 2});
  Tensor b = tensor(std::vector<int64_t>{10, 20, 30, 40}, {4});
  auto [carry, ys] = scan(
      [](const Carry& c, const Carry& x) {
        Tensor count = c[0] + 1;
        return std::make_pair(Carry{count, c[1] + x[0]},
                              Carry{x[0] * cast(count, DType::f32), x[1] + count});
      },
      {scalar_tensor(0, DType::i64), zeros({2})}, {a, b});
  EXPECT_EQ(carry[0].item(), 4);
  std::vector<float> av = iota_values(8, 1.0f);
  EXPECT_EQ(carry[1].to_vector<float>(),
            (std::vector<float>{av[0] + av[2] + av[4] + av[6], av[1] + av[3] + av[5] + av[7]}));
  std::vector<float> y0 = ys[0].to_vector<float>();
  for (size_t r = 0; r < 4; ++r)
    for (size_t j = 0; j < 2; ++j) EXPECT_FLOAT_EQ(y0[r * 2 + j], av[r * 2 + j] * static_cast<float>(r + 1));
  EXPECT_EQ(ys[1].dtype(), DType::i64);
  EXPECT_EQ(ys[1].to_vector<int64_t>(), (std::vector<int64_t>{11, 22, 33, 44}));
}

TEST(Scan, OutputsTheBodyDoesNotCompute) {
  // y0 is the row itself, y1 the incoming carry, y2 a constant, y3 the new carry twice over;
  // carry 1 is returned unchanged and carry 2 is a captured tensor.
  Tensor xs = tensor(iota_values(5 * 2, 1.0f), {5, 2});
  Tensor captured = tensor({7, 8}, {2});
  auto [carry, ys] = scan(
      [&](const Carry& c, const Carry& x) {
        Tensor next = c[0] + x[0];
        return std::make_pair(Carry{next, c[1], captured},
                              Carry{x[0], c[0], full({2}, 3.0), next, next});
      },
      {zeros({2}), tensor({-1}, {1}), zeros({2})}, {xs});
  std::vector<float> xv = iota_values(10, 1.0f);
  EXPECT_EQ(ys[0].to_vector<float>(), xv);
  std::vector<float> running = {0, 0}, before, after;
  for (size_t r = 0; r < 5; ++r) {
    before.insert(before.end(), running.begin(), running.end());
    for (size_t j = 0; j < 2; ++j) running[j] += xv[r * 2 + j];
    after.insert(after.end(), running.begin(), running.end());
  }
  EXPECT_EQ(ys[1].to_vector<float>(), before);
  EXPECT_EQ(ys[2].to_vector<float>(), std::vector<float>(10, 3.0f));
  EXPECT_EQ(ys[3].to_vector<float>(), after);
  EXPECT_EQ(ys[4].to_vector<float>(), after);
  EXPECT_EQ(carry[0].to_vector<float>(), running);
  EXPECT_EQ(carry[1].to_vector<float>(), (std::vector<float>{-1}));
  EXPECT_EQ(carry[2].to_vector<float>(), (std::vector<float>{7, 8}));
}

TEST(Scan, LengthWithoutInputsAndEmptyScans) {
  auto [carry, ys] = scan(
      [](const Carry& c, const Carry& x) {
        EXPECT_TRUE(x.empty());
        return std::make_pair(Carry{c[0] * 2}, Carry{c[0]});
      },
      {scalar_tensor(1, DType::i64)}, {}, false, 6);
  EXPECT_EQ(carry[0].item(), 64);
  EXPECT_EQ(ys[0].to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));

  auto [c0, y0] = decayed_scan(tensor({1, 2, 3}, {3}), zeros({0, 3}), false);
  EXPECT_EQ(c0[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(y0[0].shape(), (Shape{0, 3}));
  EXPECT_TRUE(y0[0].to_vector<float>().empty());
}

// No carries, or only empty ones: the scan's workspace is empty, and still where the kernel
// looks for it (it read past the end of the step's outputs; found by fuzzing, seen with ASan).
TEST(Scan, WithoutCarriesOrWithEmptyOnes) {
  Tensor xs = tensor({1, 2, 3, 4, 5, 6}, {3, 2});
  auto [c0, y0] = scan([](const Carry&, const Carry& x) { return std::make_pair(Carry{}, Carry{x[0] * 2}); },
                       {}, {xs});
  EXPECT_TRUE(c0.empty());
  EXPECT_EQ(y0[0].to_vector<float>(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  auto [c1, y1] = scan(
      [](const Carry& c, const Carry& x) { return std::make_pair(Carry{c[0]}, Carry{x[0].sum()}); },
      {zeros({0})}, {xs});
  EXPECT_EQ(c1[0].shape(), (Shape{0}));
  EXPECT_EQ(y1[0].to_vector<float>(), (std::vector<float>{3, 7, 11}));
}

TEST(Scan, OneNodeAndOneCompileWhateverTheValuesAndFlatInTheLength) {
  cache::clear_memory();
  metrics::reset();
  // Data, not constants: the values are inputs of the graph.
  auto [c1, y1] = decayed_scan(tensor(std::vector<float>(4, 0.0f), {4}), tensor(std::vector<float>(40, 1.0f), {10, 4}), false);
  y1[0].to_vector<float>();
  auto [c2, y2] = decayed_scan(tensor(std::vector<float>(4, 1.0f), {4}), tensor(std::vector<float>(40, 2.0f), {10, 4}), false);
  EXPECT_FLOAT_EQ(y2[0].to_vector<float>()[0], 2.5f);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  auto nodes = [](int64_t n) {
    auto [c, y] = decayed_scan(zeros({4}), ones({n, 4}), false);
    return debug::graph_node_count({c[0], y[0]});
  };
  EXPECT_EQ(nodes(10), nodes(5000));
  EXPECT_LT(nodes(10), 12);
}

TEST(Scan, NestedInsideLoopsAndLoopsInsideScan) {
  // Inside a fori_loop body: the scan sums the rows, the loop adds that sum three times.
  Tensor xs = tensor({1, 2, 3, 4}, {4});
  Carry out = fori_loop(0, 3, [&](const Tensor&, const Carry& c) {
    auto [carry, ys] = scan([](const Carry& s, const Carry& x) {
      return std::make_pair(Carry{s[0] + x[0]}, Carry{});
    }, {c[0]}, {xs});
    return carry;
  }, {scalar_tensor(0)});
  EXPECT_EQ(out[0].item(), 30);
  // A while_loop inside a scan body: each row doubled while it is at most 10.
  auto [carry, ys] = scan([](const Carry& c, const Carry& x) {
    Carry w = while_loop([](const Carry& v) { return v[0] <= 10; },
                         [](const Carry& v) { return Carry{v[0] * 2}; }, {x[0]});
    return std::make_pair(Carry{c[0] + w[0]}, Carry{w[0]});
  }, {scalar_tensor(0)}, {tensor({1, 3, 11, 0.5f}, {4})});
  EXPECT_EQ(ys[0].to_vector<float>(), (std::vector<float>{16, 12, 11, 16}));
  EXPECT_EQ(carry[0].item(), 55);
}

TEST(Scan, PeakMemoryDoesNotGrowBeyondTheStackedOutputs) {
  // Per row: the body's temporaries are reused, so peak memory grows with the ys only. The
  // counts below are the cpu backend's (fusion keeps the body's temporaries few).
  const std::string backend_before = current_backend();
  set_backend("cpu");
  struct Restore {
    std::string name;
    ~Restore() { set_backend(name); }
  } restore{backend_before};
  auto peak = [](int64_t n) {
    Tensor xs = ones({n, 256});
    xs.to_vector<float>();
    debug::reset_peak_memory();
    const int64_t before = debug::live_memory_bytes();
    auto [c, y] = scan([](const Carry& s, const Carry& x) {
      Tensor h = tanh(s[0] * 0.9 + x[0]);
      return std::make_pair(Carry{h}, Carry{h.sum()});
    }, {zeros({256})}, {xs});
    y[0].to_vector<float>();
    return debug::peak_memory_bytes() - before;
  };
  peak(16);
  const int64_t small = peak(16);
  const int64_t large = peak(16000);
  EXPECT_LE(large - small, (16000 - 16) * 4 + 4096) << "grows by the ys (4 bytes a row), not by the rows of work";
}

// Gradients of init, xs and a captured weight through a scan, against the unrolled host loop
// and against the chain rule written out: c_{r+1} = c_r * w + x_r * x_r, y_r = c_{r+1}, loss =
// sum(c_N) + sum over r of 0.5 * y_r.
TEST(Scan, GradientsOfInitRowsAndCapturesMatchTheUnrolledLoop) {
  const std::vector<float> wv = {0.5f, -1.5f}, iv = {1, 2};
  const std::vector<float> xv = iota_values(5 * 2, 0.3f);
  for (bool reverse : {false, true}) {
    auto grads = [&](bool loop) {
      Tensor w = tensor(wv, {2}), c0 = tensor(iv, {2}), xs = tensor(xv, {5, 2});
      for (Tensor* t : {&w, &c0, &xs}) t->requires_grad_();
      Tensor c, ys;
      if (loop) {
        auto [carry, y] = scan([&](const Carry& cc, const Carry& x) {
          Tensor next = cc[0] * w + x[0] * x[0];
          return std::make_pair(Carry{next}, Carry{next});
        }, {c0}, {xs}, reverse);
        c = carry[0];
        ys = y[0];
      } else {
        c = c0;
        std::vector<Tensor> rows(5);
        for (int t = 0; t < 5; ++t) {
          const int r = reverse ? 4 - t : t;
          Tensor x = xs.index({static_cast<int64_t>(r)});
          c = c * w + x * x;
          rows[r] = c;
        }
        ys = stack(rows, 0);
      }
      (c.sum() + ys.sum() * 0.5).backward();
      return std::vector<std::vector<float>>{w.grad().to_vector<float>(), c0.grad().to_vector<float>(),
                                             xs.grad().to_vector<float>()};
    };
    auto lg = grads(true), ug = grads(false);
    for (size_t a = 0; a < 3; ++a)
      for (size_t i = 0; i < lg[a].size(); ++i)
        EXPECT_NEAR(lg[a][i], ug[a][i], 1e-4 * (1 + std::abs(ug[a][i]))) << "reverse " << reverse << " grad " << a << " at " << i;
    // By hand, per column j: dloss/dc_{t} accumulates 1 (final) + 0.5 per later row output.
    for (size_t j = 0; j < 2; ++j) {
      std::vector<double> cs{iv[j]};
      for (int t = 0; t < 5; ++t) {
        const int r = reverse ? 4 - t : t;
        const double x = xv[r * 2 + j];
        cs.push_back(cs.back() * wv[j] + x * x);
      }
      double g = 1, dw = 0;
      std::vector<double> dx(5);
      for (int t = 4; t >= 0; --t) {
        const int r = reverse ? 4 - t : t;
        g += 0.5;  // y_r = c_{t+1}
        dw += g * cs[t];
        dx[r] = g * 2 * xv[r * 2 + j];
        g *= wv[j];
      }
      EXPECT_NEAR(lg[0][j], dw, 1e-4 * (1 + std::abs(dw))) << "reverse " << reverse;
      EXPECT_NEAR(lg[1][j], g, 1e-4 * (1 + std::abs(g))) << "reverse " << reverse;
      for (int r = 0; r < 5; ++r) EXPECT_NEAR(lg[2][r * 2 + j], dx[r], 1e-4 * (1 + std::abs(dx[r])));
    }
  }
}

TEST(Scan, IntegerCarriesAndUnusedOutputsHaveNoGradient) {
  // An i64 counter carried along, a y nobody uses, and a loss from the carry only.
  Tensor w = tensor({2, 3}, {2});
  w.requires_grad_();
  auto [carry, ys] = scan([&](const Carry& c, const Carry& x) {
    return std::make_pair(Carry{c[0] + 1, c[1] * w}, Carry{c[1].sum(), c[0]});
  }, {scalar_tensor(0, DType::i64), tensor({1, 1}, {2})}, {}, false, 3);
  EXPECT_FALSE(carry[0].requires_grad());
  EXPECT_TRUE(carry[1].requires_grad());
  carry[1].sum().backward();
  EXPECT_EQ(carry[0].item(), 3);
  // d/dw sum(w^3) = 3 w^2.
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{12, 27}));
}

// torch: d/dx of (c * detach(x)) is 0; clone() keeps the gradient. c = x0 * x1 when it flows.
TEST(Scan, DetachAndNoGradInsideTheBodyStopGradientsAndCloneKeepsThem) {
  auto grad_of = [](int how) {
    Tensor xs = tensor({2, 3}, {2, 1});
    xs.requires_grad_();
    auto [c, ys] = scan([&](const Carry& carry, const Carry& x) {
      Tensor scale;
      if (how == 0) {
        scale = x[0].detach();
      } else if (how == 1) {
        NoGradGuard no_grad;
        scale = x[0] * 1.0;
      } else {
        scale = x[0].clone();
      }
      return std::make_pair(Carry{carry[0] * scale}, Carry{x[0] * 1.0});
    }, {tensor({1}, {1})}, {xs});
    (c[0].sum() + ys[0].sum()).backward();
    return xs.grad().to_vector<float>();
  };
  EXPECT_EQ(grad_of(0), (std::vector<float>{1, 1}));
  EXPECT_EQ(grad_of(1), (std::vector<float>{1, 1}));
  EXPECT_EQ(grad_of(2), (std::vector<float>{4, 3}));
}

// Binomial checkpointing: the same gradients as keeping every carry, exactly the revolve
// number of extra forward steps (r*N - C(s+r, s+1), r the least with C(s+r, s) >= N), and
// memory that does not grow with N.
TEST(Scan, CheckpointedGradientsCountAndMemory) {
  auto binom = [](int64_t n, int64_t k) {
    double b = 1;
    for (int64_t i = 1; i <= k; ++i) b = b * static_cast<double>(n - k + i) / static_cast<double>(i);
    return static_cast<int64_t>(b + 0.5);
  };
  auto revolve_steps = [&](int64_t n, int64_t s) {
    int64_t r = 0;
    while (binom(s + r, s) < n) ++r;
    return r * n - binom(s + r, s + 1);
  };
  auto run = [](int64_t n, int64_t snapshots) {
    Tensor w = tensor({0.9f, -0.6f, 0.3f}, {3});
    w.requires_grad_();
    std::vector<float> xv(static_cast<size_t>(n) * 3);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
    Tensor xs = tensor(xv, {n, 3});
    xs.requires_grad_();
    auto [c, ys] = scan([&](const Carry& cc, const Carry& x) {
      Tensor next = tanh(cc[0] * w + x[0]);
      return std::make_pair(Carry{next}, Carry{next.sum()});
    }, {tensor({0.5f, -0.5f, 1}, {3})}, {xs}, false, -1, snapshots);
    (c[0].sum() + ys[0].sum()).backward();
    std::vector<float> g = w.grad().to_vector<float>();
    std::vector<float> gx = xs.grad().to_vector<float>();
    g.insert(g.end(), gx.begin(), gx.end());
    return g;
  };
  for (int64_t n : {1, 2, 7, 50}) {
    const std::vector<float> keep = run(n, 0);
    for (int64_t s : {1, 2, 3, 6, 60}) {
      metrics::reset();
      const std::vector<float> ck = run(n, s);
      ASSERT_EQ(ck.size(), keep.size());
      for (size_t i = 0; i < keep.size(); ++i) EXPECT_NEAR(ck[i], keep[i], 1e-5) << "n " << n << " s " << s;
      EXPECT_EQ(metrics::counter("CheckpointForwardSteps"), revolve_steps(n, std::min(s, n))) << "n " << n << " s " << s;
    }
  }
  auto peak = [](int64_t n, int64_t snapshots) {
    Tensor w = tensor(std::vector<float>(256, 0.5f), {256});
    w.requires_grad_();
    cache::clear_memory();
    debug::reset_peak_memory();
    const int64_t before = debug::live_memory_bytes();
    Carry out = fori_loop(0, n, [&](const Tensor&, const Carry& c) { return Carry{tanh(c[0] * w)}; },
                          {tensor(std::vector<float>(256, 1.0f), {256})}, snapshots);
    out[0].sum().backward();
    w.grad().to_vector<float>();
    return debug::peak_memory_bytes() - before;
  };
  EXPECT_EQ(peak(100, 4), peak(2000, 4)) << "checkpointed: memory does not depend on the trip count";
  EXPECT_GT(peak(2000, 0), peak(100, 0) + 1900 * 1024) << "keeping every carry: 1 KiB a row";
}

// Random numbers in bodies: every iteration draws new numbers, the same as the unrolled loop
// under the same seed, the generator continues where the loop ends, and gradients through a
// dropout in the body (kept carries or checkpointed) equal the unrolled loop's.
TEST(Scan, RandomNumbersInBodiesMatchTheUnrolledLoop) {
  enum Form { kUnrolled, kFori, kForiCheckpointed, kWhile, kWhileCheckpointed, kScan, kScanCheckpointed };
  auto run = [](Form form) {
    manual_seed(11);
    Tensor w = tensor({0.8f, -0.5f, 1.2f}, {3});
    w.requires_grad_();
    auto body = [&](const Tensor& c) { return tanh(dropout(c * w, 0.4, true) + randn({3})); };
    Tensor c = tensor({0.1f, 0.2f, 0.3f}, {3});
    if (form == kUnrolled) {
      for (int i = 0; i < 6; ++i) c = body(c);
    } else if (form == kFori || form == kForiCheckpointed) {
      c = fori_loop(0, 6, [&](const Tensor&, const Carry& cc) { return Carry{body(cc[0])}; }, {c},
                    form == kForiCheckpointed ? 3 : 0)[0];
    } else if (form == kWhile || form == kWhileCheckpointed) {
      c = while_loop([](const Carry& cc) { return cc[0] < 6; },
                     [&](const Carry& cc) { return Carry{cc[0] + 1, body(cc[1])}; },
                     {scalar_tensor(0, DType::i64), c}, form == kWhileCheckpointed ? 2 : 0)[1];
    } else {
      c = scan([&](const Carry& cc, const Carry&) { return std::make_pair(Carry{body(cc[0])}, Carry{}); },
               {c}, {}, false, 6, form == kScanCheckpointed ? 2 : 0).first[0];
    }
    std::vector<float> out = c.to_vector<float>();
    {
      c.sum().backward();
      std::vector<float> g = w.grad().to_vector<float>();
      out.insert(out.end(), g.begin(), g.end());
    }
    std::vector<float> next = rand({2}).to_vector<float>();  // the generator after the loop
    out.insert(out.end(), next.begin(), next.end());
    return out;
  };
  const std::vector<float> want = run(kUnrolled);
  for (Form f : {kFori, kForiCheckpointed, kWhile, kWhileCheckpointed, kScan, kScanCheckpointed})
    EXPECT_EQ(run(f), want) << "form " << f;
  // Two draws of one row differ: the offset advances every iteration.
  EXPECT_NE(want[0], want[1]);
}

TEST(ScanErrors, InputsAndResultsAreChecked) {
  mark_step();  // what earlier tests left pending (the generator's state)
  EXPECT_THAT(error_of([] {
                scan([](const Carry& c, const Carry& x) { return std::make_pair(Carry{x[0]}, Carry{}); },
                     {zeros({3})}, {zeros({4, 2})});
              }),
              HasSubstr("scan: body result 0 is f32[2], expected f32[3] as in init"));
  EXPECT_THAT(error_of([] {
                scan([](const Carry& c, const Carry&) { return std::make_pair(c, Carry{}); },
                     {zeros({2})}, {zeros({4, 2}), zeros({5, 2})});
              }),
              HasSubstr("scan: xs value 1 has 5 rows, expected 4 as xs value 0"));
  EXPECT_THAT(error_of([] {
                scan([](const Carry& c, const Carry&) { return std::make_pair(c, Carry{}); },
                     {zeros({2})}, {scalar_tensor(1)});
              }),
              HasSubstr("scan: xs value 0 is a 0-dim tensor"));
  EXPECT_THAT(error_of([] {
                scan([](const Carry& c, const Carry&) { return std::make_pair(c, Carry{}); },
                     {zeros({2})}, {});
              }),
              HasSubstr("without stacked inputs (xs) the length must be given"));
  EXPECT_THAT(error_of([] {
                scan([](const Carry& c, const Carry&) { return std::make_pair(c, Carry{}); },
                     {zeros({2})}, {zeros({4, 2})}, false, 3);
              }),
              HasSubstr("scan: xs value 0 has 4 rows, expected 3 (the length given)"));
  EXPECT_THAT(error_of([] {
                scan([](const Carry& c, const Carry&) { return std::make_pair(c, Carry{}); },
                     {zeros({2})}, {zeros({4, 2})}, false, -1, -2);
              }),
              HasSubstr("scan: snapshots must be 0 (keep every carry) or at least 1, got -2"));
  metrics::reset();
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 0) << "nothing from the failed traces is pending";
}

}  // namespace lazyrt
