// Elementwise fusion: the pass on hand-built graphs (golden text), its refusal to form cycles,
// and fused kernels against values worked out independently (by hand, or by a plain double
// evaluation of random graphs).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "compile/compile.h"
#include "compile/passes.h"
#include "backend/cpu/kernels/ops.h"
#include "support/graphs.h"
#include "util/half.h"

namespace lazyrt::compile {
using ir::Graph;
using ir::OpKind;
using ir::ValueRef;
using lazyrt::testing::f32;

namespace {

// These tests are about the cpu backend's fusion, whichever backend the process runs.
const backend::Backend& cpu() { return backend::get("cpu"); }

int count_ops(const Graph& g, OpKind op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.op == op;
  return n;
}

// Runs `g` compiled (optimized, fused) on f32 parameters; returns output k's values.
std::vector<std::vector<float>> run_f32(const Graph& g, std::vector<std::vector<float>> params) {
  auto exe = compile(g, {}, cpu());
  std::vector<const void*> in;
  for (auto& p : params) in.push_back(p.data());
  std::vector<std::vector<float>> outs;
  for (const auto& t : exe->output_types()) outs.emplace_back(static_cast<size_t>(t.numel()));
  std::vector<void*> out;
  for (auto& o : outs) out.push_back(o.data());
  exe->run(in.data(), out.data());
  for (size_t k = 0; k < outs.size(); ++k) {
    const auto& src = exe->outputs()[k];
    if (src.kind == runtime::OutputSource::Kind::Alias) outs[k] = outs[src.index];
    else if (src.kind == runtime::OutputSource::Kind::Param) outs[k] = params[src.index];
    else EXPECT_EQ(src.kind, runtime::OutputSource::Kind::Computed) << "output " << k;
  }
  return outs;
}

}  // namespace

TEST(FuseElementwise, AChainOfOneShapeBecomesOneNodeWithItsConstantsInside) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef b = g.add_parameter(f32({3}));
  ValueRef y = g.add(OpKind::Mul, {x, g.add_full(2, {}, DType::f32)});
  ValueRef z = g.add(OpKind::Add, {y, b});
  ValueRef s = g.add(OpKind::Sum, {z}, {std::vector<int64_t>{0}, false});
  g.outputs = {g.add(OpKind::Exp, {z}), s};
  EXPECT_EQ(ir::to_text(dead_code_elimination(fuse_elementwise(g, cpu().capabilities()))),
            "%0 = parameter {index=0} : f32[2, 3]\n"
            "%1 = parameter {index=1} : f32[3]\n"
            "%2 = fusion(%0, %1) {shape=[2, 3], dtypes=[0, 0], reduced=0, per_row=[0, 0]} : f32[2, 3], f32[2, 3] {\n"
            "  region 0:\n"
            "    %0 = parameter {index=0} : f32[2, 3]\n"
            "    %1 = full {value=2, shape=[], dtype=f32} : f32[]\n"
            "    %2 = mul(%0, %1) : f32[2, 3]\n"
            "    %3 = parameter {index=1} : f32[3]\n"
            "    %4 = add(%2, %3) : f32[2, 3]\n"
            "    %5 = exp(%4) : f32[2, 3]\n"
            "    return %4, %5\n"
            "}\n"
            "%3 = sum(%2) {dims=[0], keepdim=false} : f32[3]\n"
            "return %2.1, %3\n");
}

TEST(FuseElementwise, LoneOpsAndOtherShapesStayAsTheyAre) {
  Graph g;
  ValueRef x = g.add_parameter(f32({4, 3}));
  // A sum over dim 0 (not the trailing dims) is no row of a fused reduction.
  ValueRef s = g.add(OpKind::Sum, {g.add(OpKind::Exp, {x})}, {std::vector<int64_t>{0}, false});
  g.outputs = {g.add(OpKind::Neg, {s})};  // [3] from [4, 3]: not the exp's shape
  EXPECT_EQ(ir::to_text(fuse_elementwise(g, cpu().capabilities())), ir::to_text(g));
}

// A reduction over the trailing dims takes the elementwise ops that make its operand and those
// that use its result, per row ([2]) and over the whole shape ([2, 3], reading the result with
// the row's dims kept).
TEST(FuseElementwise, AReductionOverRowsTakesItsProducersAndConsumers) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef e = g.add(OpKind::Exp, {x});
  ValueRef m = g.add(OpKind::Sum, {e}, {std::vector<int64_t>{1}, true});
  ValueRef r = g.add(OpKind::Neg, {m});
  g.outputs = {g.add(OpKind::Div, {e, r}), g.add(OpKind::Sum, {e}, {std::vector<int64_t>{1}, false})};
  EXPECT_EQ(ir::to_text(dead_code_elimination(fuse_elementwise(g, cpu().capabilities()))),
            "%0 = parameter {index=0} : f32[2, 3]\n"
            "%1 = fusion(%0) {shape=[2, 3], dtypes=[0, 0], reduced=1, per_row=[0, 2]} : f32[2, 3], f32[2] {\n"
            "  region 0:\n"
            "    %0 = parameter {index=0} : f32[2, 3]\n"
            "    %1 = exp(%0) : f32[2, 3]\n"
            "    %2 = sum(%1) {dims=[1], keepdim=true} : f32[2, 1]\n"
            "    %3 = neg(%2) : f32[2, 1]\n"
            "    %4 = div(%1, %3) : f32[2, 3]\n"
            "    %5 = sum(%1) {dims=[1], keepdim=false} : f32[2]\n"
            "    return %4, %5\n"
            "}\n"
            "return %1, %1.1\n");
  const std::vector<float> xs = {0, 1, -1, 0.5f, 2, -2};
  const auto out = run_f32(g, {xs});
  for (int i = 0; i < 2; ++i) {
    double row = 0;
    for (int j = 0; j < 3; ++j) row += std::exp(static_cast<double>(xs[i * 3 + j]));
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(out[0][i * 3 + j], -std::exp(static_cast<double>(xs[i * 3 + j])) / row, 1e-6);
    EXPECT_NEAR(out[1][i], row, 1e-5);
  }
}

// exp(x) - max(exp(x)) over dim 0: the subtraction reads the exp directly and through the
// reduction (over a leading dim, so no fused reduction holds it), so putting it in the exp's
// group would make the group wait for itself.
TEST(FuseElementwise, NeverGroupsAcrossAPathThroughAnotherOp) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef e = g.add(OpKind::Exp, {x});
  ValueRef m = g.add(OpKind::Amax, {e}, {std::vector<int64_t>{0}, true});
  ValueRef d = g.add(OpKind::Sub, {e, m});
  g.outputs = {g.add(OpKind::Tanh, {d})};
  const Graph f = fuse_elementwise(g, cpu().capabilities());
  ASSERT_NO_THROW(ir::verify(f));
  EXPECT_EQ(count_ops(f, OpKind::Fusion), 1);  // sub and tanh
  EXPECT_EQ(count_ops(f, OpKind::Exp), 1);
  const auto out = run_f32(g, {{0, 1, 2, -1, 0, 1}})[0];
  const double ex[6] = {1, std::exp(1.0), std::exp(2.0), std::exp(-1.0), 1, std::exp(1.0)};
  for (int i = 0; i < 6; ++i) {
    const double column_max = std::max(ex[i % 3], ex[i % 3 + 3]);
    EXPECT_NEAR(out[i], std::tanh(ex[i] - column_max), 1e-6) << i;
  }
}

// Group A = {exp(x), exp(x) * expand(-y)} and group B = {-y, sum(exp(x)) + -y}: no node
// depends on itself, but A waits on B (through the expand of -y) and B on A (through the sum
// of exp(x) over dim 0). Such groups are undone, and the graph computes what it did.
TEST(FuseElementwise, GroupsThatWaitOnEachOtherAreUndone) {
  Graph g;
  ValueRef x = g.add_parameter(f32({3, 2}));
  ValueRef y = g.add_parameter(f32({2}));
  ValueRef a1 = g.add(OpKind::Exp, {x});
  ValueRef b2 = g.add(OpKind::Neg, {y});
  ValueRef n1 = g.add(OpKind::Sum, {a1}, {std::vector<int64_t>{0}, false});
  ValueRef b1 = g.add(OpKind::Add, {n1, b2});
  ValueRef r2 = g.add(OpKind::Reshape, {b2}, {std::vector<int64_t>{1, 2}});
  ValueRef n2 = g.add(OpKind::Expand, {r2}, {std::vector<int64_t>{3, 2}});
  ValueRef a2 = g.add(OpKind::Mul, {a1, n2});
  g.outputs = {a2, b1};
  const Graph f = fuse_elementwise(g, cpu().capabilities());
  ASSERT_NO_THROW(ir::verify(f));
  EXPECT_EQ(count_ops(f, OpKind::Fusion), 0);
  const std::vector<float> xs = {0, 1, -1, 0.5f, 2, -2}, ys = {3, -4};
  const auto out = run_f32(g, {xs, ys});
  for (int j = 0; j < 2; ++j) {
    double column = 0;
    for (int i = 0; i < 3; ++i) {
      column += std::exp(static_cast<double>(xs[i * 2 + j]));
      EXPECT_NEAR(out[0][i * 2 + j], std::exp(static_cast<double>(xs[i * 2 + j])) * -ys[j], 1e-5);
    }
    EXPECT_NEAR(out[1][j], column - ys[j], 1e-5);
  }
}

// A lone op reading a constant of its whole shape (a relu's gradient: where(mask, 0, g)) is
// a fusion of one, its constant a scalar in the region, so no buffer of zeros is filled and
// read on every run.
TEST(FuseElementwise, ALoneOpTakesItsFilledConstantIn) {
  Graph g;
  ValueRef m = g.add_parameter({DType::b8, {4, 300}});
  ValueRef x = g.add_parameter(f32({4, 300}));
  g.outputs = {g.add(OpKind::Where, {m, g.add_full(0, {4, 300}, DType::f32), x})};
  const Graph f = dead_code_elimination(fuse_elementwise(g, cpu().capabilities()));
  EXPECT_EQ(count_ops(f, OpKind::Fusion), 1);
  EXPECT_EQ(count_ops(f, OpKind::Full), 0);
  auto exe = compile(g, {}, cpu());
  std::vector<char> mask(1200);
  std::vector<float> xs(1200), out(1200);
  for (int i = 0; i < 1200; ++i) {
    mask[i] = i % 3 == 0;
    xs[i] = static_cast<float>(i) - 600.5f;
  }
  const void* in[] = {mask.data(), xs.data()};
  void* o[] = {out.data()};
  exe->run(in, o);
  for (int i = 0; i < 1200; ++i) EXPECT_EQ(out[i], i % 3 == 0 ? 0.0f : xs[i]) << i;
}

TEST(FuseElementwise, GroupsStayWithinTheKernelLimits) {
  Graph g;
  ValueRef x = g.add_parameter(f32({3}));
  ValueRef v = x;
  for (int i = 0; i < 3 * kernels::kMaxFusedOps; ++i) v = g.add(OpKind::Tanh, {v});
  g.outputs = {v};
  const Graph f = fuse_elementwise(g, cpu().capabilities());
  ASSERT_NO_THROW(ir::verify(f));
  EXPECT_EQ(count_ops(f, OpKind::Fusion), 3);
  const auto out = run_f32(g, {{-1, 0.5, 2}})[0];
  const float in[3] = {-1, 0.5, 2};
  for (int k = 0; k < 3; ++k) {
    float r = in[k];
    for (int i = 0; i < 3 * kernels::kMaxFusedOps; ++i) r = std::tanh(r);
    EXPECT_FLOAT_EQ(out[k], r);
  }
}

// A linear layer over tokens (a product over [batch * tokens, features], bias-add, reshape to
// the tokens) followed by an activation: the bias-add and the activation are one kernel, and
// the values are those of a plain evaluation.
TEST(FuseElementwise, ABiasAddAndTheActivationAfterAReshapeAreOneKernel) {
  const int64_t batch = 2, tokens = 3, in = 4, out = 5;
  Graph g;
  ValueRef x = g.add_parameter(f32({batch * tokens, in}));
  ValueRef w = g.add_parameter(f32({in, out}));
  ValueRef b = g.add_parameter(f32({out}));
  ValueRef h = g.add(OpKind::Add, {g.add(OpKind::Matmul, {x, w}), b});
  ValueRef act = g.add(OpKind::Gelu, {g.add(OpKind::Reshape, {h}, {Shape{batch, tokens, out}})}, {false});
  g.outputs = {g.add(OpKind::Sum, {act}, {std::vector<int64_t>{1}, false})};
  const Graph o = optimize(g, cpu().capabilities());
  EXPECT_EQ(count_ops(o, OpKind::Fusion), 1);
  EXPECT_EQ(count_ops(o, OpKind::Gelu), 0);
  EXPECT_EQ(count_ops(o, OpKind::Add), 0);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::vector<float>> params{std::vector<float>(batch * tokens * in), std::vector<float>(in * out),
                                         std::vector<float>(out)};
  for (auto& p : params)
    for (float& v : p) v = u(rng);
  const std::vector<float> got = run_f32(g, params)[0];
  ASSERT_EQ(got.size(), static_cast<size_t>(batch * out));
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t j = 0; j < out; ++j) {
      double want = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        double z = params[2][j];
        for (int64_t k = 0; k < in; ++k) z += double(params[0][(bi * tokens + t) * in + k]) * params[1][k * out + j];
        want += 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
      }
      EXPECT_NEAR(got[bi * out + j], want, 1e-5) << bi << ", " << j;
    }
}

// A layer norm's backward reads the forward's normalized values and reciprocal deviations (a
// group of their own) and the gradient, which depends on that group through a product. Each
// backward node reading a forward value and a backward one joins the backward group (merging
// with the forward group would make the groups wait on each other): the whole backward is one
// kernel, not two and three lone ops.
TEST(FuseElementwise, ANodeJoinsTheGroupsItCanWhenAllOfThemTogetherWouldWaitOnEachOther) {
  const Shape s{4, 8, 16};
  const std::vector<int64_t> rows{2};
  Graph g;
  ValueRef x = g.add_parameter(f32(s));
  ValueRef w = g.add_parameter(f32({16}));
  ValueRef proj = g.add_parameter(f32({16, 16}));
  ValueRef d = g.add(OpKind::Sub, {x, g.add(OpKind::Mean, {x}, {rows, true})});
  ValueRef var = g.add(OpKind::Mean, {g.add(OpKind::Mul, {d, d})}, {rows, true});
  ValueRef rstd = g.add(OpKind::Rsqrt, {g.add(OpKind::Add, {var, g.add_full(1e-5, {}, DType::f32)})});
  ValueRef xh = g.add(OpKind::Mul, {d, rstd});
  ValueRef y = g.add(OpKind::Mul, {xh, w});
  ValueRef h = g.add(OpKind::Matmul, {g.add(OpKind::Reshape, {y}, {Shape{32, 16}}), proj});
  ValueRef grad = g.add(OpKind::Reshape, {h}, {s});
  ValueRef a = g.add(OpKind::Mul, {w, grad});
  ValueRef centered = g.add(OpKind::Sub, {a, g.add(OpKind::Mean, {a}, {rows, true})});
  ValueRef m2 = g.add(OpKind::Mean, {g.add(OpKind::Mul, {xh, a})}, {rows, true});
  ValueRef dx = g.add(OpKind::Mul, {rstd, g.add(OpKind::Sub, {centered, g.add(OpKind::Mul, {xh, m2})})});
  g.outputs = {h, dx};
  const Graph o = dead_code_elimination(fuse_elementwise(g, cpu().capabilities()));
  EXPECT_EQ(count_ops(o, OpKind::Fusion), 2) << ir::to_text(o);
  for (OpKind op : {OpKind::Mul, OpKind::Sub, OpKind::Mean}) EXPECT_EQ(count_ops(o, op), 0) << ir::to_text(o);
  EXPECT_NO_THROW(ir::verify(o));
}

// The fused kernel over a broadcast operand, a result read outside, and more elements than
// one block: y = x * 2 + b, out = [y, exp(y)], checked element by element.
TEST(FusedKernel, BroadcastsOperandsAcrossBlocks) {
  Graph g;
  const int64_t rows = 300, cols = 3;  // 900 elements: several blocks
  ValueRef x = g.add_parameter(f32({rows, cols}));
  ValueRef b = g.add_parameter(f32({cols}));
  ValueRef y = g.add(OpKind::Add, {g.add(OpKind::Mul, {x, g.add_full(2, {}, DType::f32)}), b});
  g.outputs = {y, g.add(OpKind::Exp, {y})};
  std::vector<float> xs(rows * cols);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.1f * static_cast<float>(i));
  const std::vector<float> bs = {0.5f, -1.0f, 0.25f};
  ASSERT_EQ(count_ops(optimize(g, cpu().capabilities()), OpKind::Fusion), 1);
  const auto out = run_f32(g, {xs, bs});
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float want = xs[i] * 2.0f + bs[i % cols];
    EXPECT_EQ(out[0][i], want) << i;
    EXPECT_NEAR(out[1][i], std::exp(static_cast<double>(want)), 1e-6 * std::exp(want)) << i;
  }
}

// Per-channel operands ([C, 1, 1]) against [N, C, H, W] with planes shorter than a block: the
// runs are merged across channels and those operands repeated per plane. Values worked out
// directly; the largest case is one long run split across the kernel pool's threads.
TEST(FusedKernel, PerChannelOperandsOverSmallPlanes) {
  for (const Shape& xs : {Shape{2, 5, 3, 3}, Shape{1, 7, 2, 2}, Shape{3, 4, 1, 5}, Shape{2, 300, 1, 1},
                          Shape{1, 2048, 8, 8}, Shape{2, 3, 16, 16}}) {
    const int64_t n = xs[0], c = xs[1], plane = xs[2] * xs[3];
    Graph g;
    ValueRef x = g.add_parameter(f32(xs));
    ValueRef m = g.add_parameter(f32({c, 1, 1}));
    ValueRef s = g.add_parameter(f32({c, 1, 1}));
    ValueRef y = g.add(OpKind::Relu, {g.add(OpKind::Mul, {g.add(OpKind::Sub, {x, m}), s})});
    g.outputs = {y};
    ASSERT_EQ(count_ops(optimize(g, cpu().capabilities()), OpKind::Fusion), 1);
    std::vector<float> xv(static_cast<size_t>(n * c * plane)), mv(static_cast<size_t>(c)), sv(static_cast<size_t>(c));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i));
    for (int64_t k = 0; k < c; ++k) {
      mv[k] = 0.01f * static_cast<float>(k % 50) - 0.2f;
      sv[k] = 1.0f + 0.5f * static_cast<float>(k % 7);
    }
    const auto out = run_f32(g, {xv, mv, sv});
    for (int64_t i = 0; i < n * c * plane; ++i) {
      const int64_t k = i / plane % c;
      const float want = std::max((xv[i] - mv[k]) * sv[k], 0.0f);
      ASSERT_EQ(out[0][i], want) << "element " << i << " of " << ::testing::PrintToString(xs);
    }
  }
}

// bf16: each op rounds to bf16 before the next reads it, as if stored. 1 + 2^-8 is halfway
// between bf16 neighbours 1 and 1 + 2^-7 and rounds to even (1), so (1 + 2^-8) + 2^-8 is 1;
// without the rounding in between it would be 1 + 2^-7.
TEST(FusedKernel, SixteenBitResultsRoundAfterEveryOp) {
  Graph g;
  const ir::TensorType t{DType::bf16, {2}};
  ValueRef x = g.add_parameter(t);
  ValueRef c = g.add_full(std::ldexp(1.0, -8), {}, DType::bf16);
  g.outputs = {g.add(OpKind::Add, {g.add(OpKind::Add, {x, c}), c})};
  ASSERT_EQ(count_ops(optimize(g, cpu().capabilities()), OpKind::Fusion), 1);
  auto exe = compile(g, {}, cpu());
  const bf16 in[2] = {bf16(1.0f), bf16(2.0f)};
  bf16 out[2];
  const void* params[1] = {in};
  void* outs[1] = {out};
  exe->run(params, outs);
  EXPECT_EQ(static_cast<float>(out[0]), 1.0f);
  EXPECT_EQ(static_cast<float>(out[1]), 2.0f);
}

// Random graphs of elementwise ops over [4, 3], [3] and [], with reductions between shapes
// (which create the paths that fusion must not close into cycles), compiled with fusion and
// compared with the same graph evaluated in double by the test itself.
TEST(FusedKernel, RandomGraphsMatchAPlainEvaluation) {
  std::mt19937 rng(7);
  const std::vector<Shape> shapes = {{4, 3}, {3}, {}};
  int fusions = 0;
  for (int trial = 0; trial < 60; ++trial) {
    Graph g;
    std::vector<ValueRef> vals;
    std::vector<std::vector<double>> ref;  // values, broadcast-free: stored at their own shape
    std::vector<std::vector<float>> params;
    auto numel = [](const Shape& s) { return static_cast<size_t>(shape_numel(s)); };
    // Element of value v (of shape s) seen at position i of [4, 3].
    auto at = [&](size_t v, size_t i) {
      const Shape& s = g.type(vals[v]).shape;
      return s.size() == 2 ? ref[v][i] : s.size() == 1 ? ref[v][i % 3] : ref[v][0];
    };
    for (const Shape& s : shapes) {
      std::vector<float> p(numel(s));
      for (float& e : p) e = std::uniform_real_distribution<float>(-1, 1)(rng);
      params.push_back(p);
      vals.push_back(g.add_parameter(f32(s)));
      ref.emplace_back(p.begin(), p.end());
    }
    for (int step = 0; step < 30; ++step) {
      const size_t a = rng() % vals.size(), b = rng() % vals.size();
      const Shape sa = g.type(vals[a]).shape, sb = g.type(vals[b]).shape;
      const int kind = static_cast<int>(rng() % 6);
      std::vector<double> r;
      if (kind == 5 && sa.size() == 2) {  // a reduction to [3]
        vals.push_back(g.add(OpKind::Sum, {vals[a]}, {std::vector<int64_t>{0}, false}));
        r.assign(3, 0.0);
        for (size_t i = 0; i < 12; ++i) r[i % 3] += ref[a][i];
      } else if (kind >= 3) {  // unary
        const OpKind op = kind == 3 ? OpKind::Tanh : OpKind::Neg;
        vals.push_back(g.add(op, {vals[a]}));
        for (double v : ref[a]) r.push_back(op == OpKind::Tanh ? std::tanh(v) : -v);
      } else {  // binary, broadcast
        const OpKind op = kind == 0 ? OpKind::Add : kind == 1 ? OpKind::Mul : OpKind::Sub;
        vals.push_back(g.add(op, {vals[a], vals[b]}));
        const size_t n = std::max(sa.size(), sb.size()) == 2 ? 12 : std::max(sa.size(), sb.size()) == 1 ? 3 : 1;
        for (size_t i = 0; i < n; ++i) {
          const double x = at(a, i), y = at(b, i);
          r.push_back(op == OpKind::Add ? x + y : op == OpKind::Mul ? x * y : x - y);
        }
      }
      ref.push_back(r);
    }
    // Every third value is an output, and the last.
    std::vector<size_t> outs;
    for (size_t v = 3; v < vals.size(); v += 3) outs.push_back(v);
    outs.push_back(vals.size() - 1);
    for (size_t v : outs) g.outputs.push_back(vals[v]);
    const Graph opt = optimize(g, cpu().capabilities());
    ASSERT_NO_THROW(ir::verify(opt)) << "trial " << trial;
    fusions += count_ops(opt, OpKind::Fusion);
    const auto got = run_f32(g, params);
    for (size_t k = 0; k < outs.size(); ++k)
      for (size_t i = 0; i < ref[outs[k]].size(); ++i)
        EXPECT_NEAR(got[k][i], ref[outs[k]][i], 1e-4 * (1 + std::abs(ref[outs[k]][i])))
            << "trial " << trial << " output " << k << " element " << i;
  }
  EXPECT_GT(fusions, 60);  // the graphs did fuse
}

// Random graphs over two views of 24 elements, [6, 4] and [2, 3, 4], with reshapes between
// them, products (values no elementwise op makes), row means and broadcast operands of many
// shapes: optimized (the simplifier's reshape rules, fusion) and run, against the same graph
// evaluated in double by the test.
TEST(FusedKernel, RandomGraphsAcrossReshapesMatchAPlainEvaluation) {
  std::mt19937 rng(11);
  const Shape flat{6, 4}, tokens{2, 3, 4};
  const std::vector<Shape> param_shapes = {flat, tokens, {4}, {1, 4}, {1, 1, 4}, {3, 1}, {6, 1}, {}, {4, 4}};
  int fusions = 0;
  for (int trial = 0; trial < 80; ++trial) {
    Graph g;
    std::vector<ValueRef> vals;
    std::vector<std::vector<double>> ref;  // each value at its own shape, row-major
    std::vector<std::vector<float>> params;
    // Element of value v read at flat position i of a result of shape r (broadcast).
    auto at = [&](size_t v, int64_t i, const Shape& r) {
      const Shape& s = g.type(vals[v]).shape;
      int64_t idx = 0, stride = 1;
      for (size_t d = 0; d < s.size(); ++d) {
        const size_t rd = r.size() - 1 - d, sd = s.size() - 1 - d;
        int64_t inner = 1;
        for (size_t e = rd + 1; e < r.size(); ++e) inner *= r[e];
        const int64_t coord = (i / inner) % r[rd];
        if (s[sd] != 1) idx += coord * stride;
        stride *= s[sd];
      }
      return ref[v][static_cast<size_t>(idx)];
    };
    for (const Shape& s : param_shapes) {
      std::vector<float> p(static_cast<size_t>(shape_numel(s)));
      for (float& e : p) e = std::uniform_real_distribution<float>(-1, 1)(rng);
      params.push_back(p);
      vals.push_back(g.add_parameter(f32(s)));
      ref.emplace_back(p.begin(), p.end());
    }
    auto full = [&](size_t v) { const Shape& s = g.type(vals[v]).shape; return s == flat || s == tokens; };
    for (int step = 0; step < 30; ++step) {
      size_t a = rng() % vals.size();
      while (!full(a)) a = rng() % vals.size();
      const size_t b = rng() % vals.size();
      const Shape sa = g.type(vals[a]).shape;
      const int kind = static_cast<int>(rng() % 9);
      std::vector<double> r;
      if (kind == 8) {  // reshape to the other view
        vals.push_back(g.add(OpKind::Reshape, {vals[a]}, {sa == flat ? tokens : flat}));
        r = ref[a];
      } else if (kind == 7) {  // a product with the [4, 4] parameter
        vals.push_back(g.add(OpKind::Matmul, {vals[a], vals[8]}));
        r.assign(24, 0.0);
        for (size_t row = 0; row < 6; ++row)
          for (size_t j = 0; j < 4; ++j)
            for (size_t k = 0; k < 4; ++k) r[row * 4 + j] += ref[a][row * 4 + k] * ref[8][k * 4 + j];
      } else if (kind == 6) {  // a row mean, dims kept
        vals.push_back(g.add(OpKind::Mean, {vals[a]}, {std::vector<int64_t>{static_cast<int64_t>(sa.size()) - 1}, true}));
        r.assign(6, 0.0);
        for (size_t i = 0; i < 24; ++i) r[i / 4] += ref[a][i] / 4;
      } else if (kind >= 4) {  // unary
        const OpKind op = kind == 4 ? OpKind::Tanh : OpKind::Neg;
        vals.push_back(g.add(op, {vals[a]}));
        for (double v : ref[a]) r.push_back(op == OpKind::Tanh ? std::tanh(v) : -v);
      } else {  // binary, b broadcast against a's shape where the rules allow
        const OpKind op = kind == 0 ? OpKind::Add : kind == 1 ? OpKind::Mul : OpKind::Sub;
        ValueRef y;
        try {
          y = g.add(op, {vals[a], vals[b]});
        } catch (const Error&) {
          --step;
          continue;
        }
        if (g.type(y).shape != sa) {
          g.nodes.pop_back();
          --step;
          continue;
        }
        vals.push_back(y);
        for (int64_t i = 0; i < 24; ++i) {
          const double x = ref[a][static_cast<size_t>(i)], z = at(b, i, sa);
          r.push_back(op == OpKind::Add ? x + z : op == OpKind::Mul ? x * z : x - z);
        }
      }
      ref.push_back(r);
    }
    std::vector<size_t> outs;
    for (size_t v = param_shapes.size() + 2; v < vals.size(); v += 3) outs.push_back(v);
    outs.push_back(vals.size() - 1);
    for (size_t v : outs) g.outputs.push_back(vals[v]);
    const Graph opt = optimize(g, cpu().capabilities());
    ASSERT_NO_THROW(ir::verify(opt)) << "trial " << trial;
    fusions += count_ops(opt, OpKind::Fusion);
    const auto got = run_f32(g, params);
    for (size_t k = 0; k < outs.size(); ++k)
      for (size_t i = 0; i < ref[outs[k]].size(); ++i)
        EXPECT_NEAR(got[k][i], ref[outs[k]][i], 1e-4 * (1 + std::abs(ref[outs[k]][i])))
            << "trial " << trial << " output " << k << " element " << i << "\n" << ir::to_text(g);
  }
  EXPECT_GT(fusions, 80);  // the graphs did fuse
}

}  // namespace lazyrt::compile
