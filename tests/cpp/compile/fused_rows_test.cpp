// Fused reductions (fusion nodes with reduced dims, fused_rows.cpp) against the reference
// backend, which runs every op on its own kernel: seeded random programs of elementwise ops,
// reductions over the trailing dims (sum, mean, amax, amin, var, std) and ops on their
// results per row, in f32, f64, bf16 and f16, on rows shorter and longer than the kernel's
// chunk, with operands broadcast within the row and per row. Every result must be the
// reference's bits (nan payloads aside), interpreted and with generated loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "compile/compile.h"
#include "backend/cpu/jit/jit.h"
#include "lazyrt/metrics.h"
#include "support/run_graph.h"
#include "util/dtype_dispatch.h"

namespace lazyrt::compile {
namespace {

using ir::Graph;
using ir::OpKind;
using ir::ValueRef;
using testing::mismatches;

using ModeScope = testing::JitMode;

struct Space {
  Shape shape;
  int64_t reduced;
};

// A random program over x, y of `shape`, w of the last dim's size (broadcast within rows),
// p of one value per row (dims kept) and a scalar c.
Graph random_program(std::mt19937& rng, const Space& sp, DType dtype) {
  Graph g;
  const Shape& s = sp.shape;
  const size_t lead = s.size() - static_cast<size_t>(sp.reduced);
  Shape keep(s), drop(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(lead));
  for (size_t d = lead; d < s.size(); ++d) keep[d] = 1;
  std::vector<ValueRef> full, per_keep, per_drop, others;
  full.push_back(g.add_parameter({dtype, s}));
  full.push_back(g.add_parameter({dtype, s}));
  others.push_back(g.add_parameter({dtype, {s.back()}}));
  per_keep.push_back(g.add_parameter({dtype, keep}));
  others.push_back(g.add_parameter({dtype, {}}));
  const OpKind unary[] = {OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Tanh, OpKind::Sigmoid,
                          OpKind::Sqrt, OpKind::Relu, OpKind::Sin};
  const OpKind binary[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum, OpKind::Minimum};
  const OpKind reductions[] = {OpKind::Sum, OpKind::Mean, OpKind::Amax, OpKind::Amin, OpKind::Var, OpKind::Std};
  auto pick = [&](const std::vector<ValueRef>& v) { return v[rng() % v.size()]; };
  std::vector<int64_t> dims;
  for (size_t d = lead; d < s.size(); ++d) dims.push_back(static_cast<int64_t>(d));
  for (int step = 0; step < 18; ++step) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind <= 2) {
      full.push_back(g.add(unary[rng() % std::size(unary)], {pick(full)}));
    } else if (kind <= 5) {
      const int with = static_cast<int>(rng() % 4);
      const ValueRef b = with == 0 ? pick(full) : with == 1 ? pick(others) : pick(per_keep);
      ValueRef a = pick(full), o = b;
      if (rng() % 2) std::swap(a, o);
      full.push_back(g.add(binary[rng() % std::size(binary)], {a, o}));
    } else if (kind <= 7) {
      const OpKind op = reductions[rng() % std::size(reductions)];
      const bool keepdim = rng() % 2;
      ir::Attrs attrs = op == OpKind::Var || op == OpKind::Std
                            ? ir::Attrs{dims, keepdim, static_cast<double>(rng() % 2)}
                            : ir::Attrs{dims, keepdim};
      (keepdim ? per_keep : per_drop).push_back(g.add(op, {pick(full)}, std::move(attrs)));
    } else {
      std::vector<ValueRef>& rows = per_drop.empty() || rng() % 2 ? per_keep : per_drop;
      if (rng() % 2) rows.push_back(g.add(unary[rng() % std::size(unary)], {pick(rows)}));
      else rows.push_back(g.add(binary[rng() % std::size(binary)], {pick(rows), rng() % 2 ? pick(rows) : others[1]}));
    }
  }
  // The last three values of each kind (parameters aside) are outputs.
  for (const auto* list : {&full, &per_keep, &per_drop})
    for (size_t k = list->size() > 3 ? list->size() - 3 : 0; k < list->size(); ++k)
      if (g.nodes[(*list)[k].node].op != OpKind::Parameter) g.outputs.push_back((*list)[k]);
  if (g.outputs.empty()) g.outputs.push_back(g.add(OpKind::Neg, {full[0]}));
  return g;
}

int fused_reductions(const Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes)
    n += node.op == OpKind::Fusion && ir::NodeAttrs(node.op, node.attrs).i<"reduced">() > 0;
  return n;
}

void compare_on_random_programs(jit::Mode mode, int trials, uint32_t seed) {
  ModeScope scope(mode);
  const backend::Backend& cpu = backend::get("cpu");
  const backend::Backend& ref = backend::get("reference");
  const Space spaces[] = {{{4, 40}, 1}, {{3, 5, 33}, 1}, {{2, 17, 40}, 2}, {{3, 700}, 1}, {{64}, 1}, {{2, 3, 300}, 2}};
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  std::mt19937 rng(seed);
  int fused = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const Space& sp = spaces[trial % std::size(spaces)];
    const DType dtype = dtypes[(trial / std::size(spaces)) % std::size(dtypes)];
    const Graph g = random_program(rng, sp, dtype);
    auto fast = compile(g, {}, cpu);
    auto oracle = compile(g, {}, ref);
    fused += fused_reductions(fast->graph());
    const auto in = testing::random_inputs(g, rng);
    const auto got = testing::run_graph(*fast, in), want = testing::run_graph(*oracle, in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      EXPECT_EQ(mismatches(fast->output_types()[k].dtype, got[k], want[k]), 0)
          << "trial " << trial << " output " << k << " of\n" << ir::to_text(fast->graph());
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(fused, trials);  // most programs hold fused reductions: the comparison means something
}

TEST(FusedRows, MatchTheReferenceBitForBitInterpreted) { compare_on_random_programs(jit::Mode::Off, 240, 7); }

TEST(FusedRows, MatchTheReferenceBitForBitGenerated) {
  {
    ModeScope on(jit::Mode::Sync);  // whatever LAZYRT_JIT says
    ASSERT_NE(jit::generator(), nullptr) << "lazyrt-jitc cannot be run";
  }
  const int64_t kernels = metrics::counter("JitKernels"), failures = metrics::counter("JitFailures");
  compare_on_random_programs(jit::Mode::Sync, 48, 11);
  EXPECT_EQ(metrics::counter("JitFailures"), failures);
  EXPECT_GT(metrics::counter("JitKernels") - kernels, 48) << "the passes were generated";
}

// A layer norm over [rows, 384] (mean, variance, normalization, weight and bias) is one kernel.
TEST(FusedRows, LayerNormIsOneKernel) {
  Graph g;
  const ir::TensorType x{DType::f32, {16, 384}}, w{DType::f32, {384}};
  ValueRef xv = g.add_parameter(x), wv = g.add_parameter(w), bv = g.add_parameter(w);
  const std::vector<int64_t> dims{1};
  ValueRef mu = g.add(OpKind::Mean, {xv}, {dims, true});
  ValueRef var = g.add(OpKind::Var, {xv}, {dims, true, 0.0});
  ValueRef scale = g.add(OpKind::Rsqrt, {g.add(OpKind::Add, {var, g.add_full(1e-5, {}, DType::f32)})});
  ValueRef y = g.add(OpKind::Sub, {g.add(OpKind::Mul, {xv, scale}), g.add(OpKind::Mul, {mu, scale})});
  g.outputs = {g.add(OpKind::Add, {g.add(OpKind::Mul, {y, wv}), bv})};
  auto exe = compile(g, {}, backend::get("cpu"));
  int steps = 0;
  for (const auto& n : exe->graph().nodes) steps += n.op != OpKind::Parameter && n.op != OpKind::Full;
  EXPECT_EQ(steps, 1) << ir::to_text(exe->graph());
  EXPECT_EQ(fused_reductions(exe->graph()), 1);
}

}  // namespace
}  // namespace lazyrt::compile
