// Tiers: a graph's fused kernels run interpreted until the graph is hot (two runs and enough
// interpreted work), then its module is compiled in the background and the generated loops
// take over; the values never change (expected values worked out in plain C++ arithmetic,
// independently of lazyrt). With generation off nothing is compiled; a graph that runs once,
// or that has done too little work, is never compiled.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>

#include "backend/cpu/jit/jit.h"
#include "support/run_graph.h"

namespace lazyrt {
namespace {

// Generated code is the cpu backend's: each test runs on it (whatever LAZYRT_BACKEND says) in
// the given mode, and the process's backend and mode come back when the test ends.
struct ModeScope {
  std::string saved_backend = current_backend();
  testing::JitMode mode;
  explicit ModeScope(jit::Mode m) : mode(m) { set_backend("cpu"); }
  ~ModeScope() { set_backend(saved_backend); }
};

constexpr int64_t kN = 5000;

std::vector<float> input(float scale) {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[i] = scale * static_cast<float>(i % 97 - 48) / 16.0f;
  return v;
}

// A fused chain with a broadcast operand; x * 0.5 + sigmoid-free arithmetic so that the
// expected value is exact in float.
std::vector<float> program(const Tensor& x, const Tensor& row) { return ((x * 0.5 + row) * x - 1.0).to_vector<float>(); }

std::vector<float> expected(const std::vector<float>& x, float r) {
  std::vector<float> e(kN);
  for (int64_t i = 0; i < kN; ++i) e[i] = (x[i] * 0.5f + r) * x[i] - 1.0f;
  return e;
}

TEST(Tiers, AGraphSwitchesToGeneratedCodeAfterItsSecondRunWithTheSameValues) {
  ModeScope on(jit::Mode::Tiered);
  // The program fuses 3 ops (mul, add, mul; the final sub too: 4) over kN elements a run.
  const int64_t saved_threshold = jit::compile_threshold();
  jit::set_compile_threshold(kN * 5);
  jit::wait_idle();
  const int64_t modules = metrics::counter("JitModules");
  // A shape no other test uses: a graph of its own.
  const std::vector<float> xs = input(1.0f);
  Tensor x = tensor(xs, {kN});
  Tensor row = tensor({0.25f}, {1});
  EXPECT_EQ(program(x, row), expected(xs, 0.25f));
  jit::wait_idle();
  EXPECT_EQ(metrics::counter("JitModules"), modules) << "one run compiles nothing";
  EXPECT_EQ(program(x, row), expected(xs, 0.25f));
  jit::wait_idle();
  EXPECT_EQ(metrics::counter("JitModules"), modules + 1) << "the second run hands the module to the compiler";
  for (int r = 0; r < 3; ++r) {
    const std::vector<float> ys = input(1.0f + static_cast<float>(r));
    EXPECT_EQ(program(tensor(ys, {kN}), tensor({-0.75f}, {1})), expected(ys, -0.75f)) << "generated run " << r;
  }
  EXPECT_EQ(metrics::counter("JitModules"), modules + 1) << "compiled once";
  EXPECT_EQ(metrics::counter("JitFailures"), 0);
  jit::set_compile_threshold(saved_threshold);
}

TEST(Tiers, AGraphThatDidLittleWorkIsNotCompiled) {
  ModeScope on(jit::Mode::Tiered);
  jit::wait_idle();
  const int64_t modules = metrics::counter("JitModules");
  const std::vector<float> xs = input(0.5f);
  Tensor x = tensor(xs, {kN / 2, 2});
  Tensor row = tensor({0.375f}, {1, 1});
  // 4 runs of ~20k element-ops, far below the default threshold.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(((x * 0.5 + row) * x - 1.0).to_vector<float>(), expected(xs, 0.375f));
  jit::wait_idle();
  EXPECT_EQ(metrics::counter("JitModules"), modules);
}

TEST(Tiers, WithGenerationOffNothingIsCompiled) {
  ModeScope off(jit::Mode::Off);
  jit::wait_idle();
  const int64_t modules = metrics::counter("JitModules");
  const std::vector<float> xs = input(2.0f);
  Tensor x = tensor(xs, {kN, 1});
  Tensor row = tensor({0.5f}, {1, 1});
  for (int r = 0; r < 4; ++r) {
    std::vector<float> got = ((x * 0.5 + row) * x - 1.0).to_vector<float>();
    EXPECT_EQ(got, expected(xs, 0.5f));
  }
  jit::wait_idle();
  EXPECT_EQ(metrics::counter("JitModules"), modules);
}

TEST(Tiers, SyncModeCompilesWhenTheGraphIsLowered) {
  ModeScope sync(jit::Mode::Sync);
  const int64_t modules = metrics::counter("JitModules");
  const std::vector<float> xs = input(3.0f);
  Tensor x = tensor(xs, {kN / 5, 5});
  Tensor row = tensor({0.125f}, {1, 1});
  EXPECT_EQ(((x * 0.5 + row) * x - 1.0).to_vector<float>(), expected(xs, 0.125f));
  EXPECT_EQ(metrics::counter("JitModules"), modules + 1);
}

TEST(Tiers, KernelsOfEqualRegionsShareOneLoop) {
  // Three chains in one graph: two alike on different f32 tensors (the layers of a model, the
  // iterations of an unrolled loop), one on f64. The f32 kernels share one generated loop.
  ModeScope sync_mode(jit::Mode::Sync);
  const int64_t kernels = metrics::counter("JitKernels");
  const std::vector<float> as = input(0.5f), bs = input(-1.5f);
  std::vector<double> cs(kN);
  for (int64_t i = 0; i < kN; ++i) cs[i] = 0.25 * static_cast<double>(i % 13);
  Tensor a = tensor(as, {kN / 10, 10}), b = tensor(bs, {kN / 10, 10});
  Tensor c = tensor(cs, {kN / 10, 10});
  Tensor ya = (a * 0.5 + tensor({0.375f}, {1})) * a - 1.0;
  Tensor yb = (b * 0.5 + tensor({-0.625f}, {1})) * b - 1.0;
  Tensor yc = (c * 0.5 + tensor(std::vector<double>{0.125}, {1})) * c - 1.0;
  sync({ya, yb, yc});
  EXPECT_EQ(metrics::counter("JitKernels"), kernels + 2) << "one loop for the f32 chains, one for the f64 chain";
  EXPECT_EQ(ya.to_vector<float>(), expected(as, 0.375f));
  EXPECT_EQ(yb.to_vector<float>(), expected(bs, -0.625f));
  const std::vector<double> got = yc.to_vector<double>();
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(got[i], (cs[i] * 0.5 + 0.125) * cs[i] - 1.0) << i;
}

}  // namespace
}  // namespace lazyrt
