// Backends: the reference backend (one op at a time, no fusion, no gemm rewriting) is the oracle
// the cpu backend is compared with, on seeded random programs of elementwise chains, broadcasts,
// reductions, softmax and products of transposes. Also: the backend is part of every cache key,
// and choosing one by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "compile/compile.h"
#include "compile/passes.h"
#include "support/error_of.h"

namespace lazyrt::compile {
namespace {

using ir::Graph;
using ir::OpKind;
using ir::ValueRef;

int count_ops(const Graph& g, OpKind op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.op == op;
  return n;
}

// Runs an executable on double inputs converted to `dtype` (f32, f64, or i64: rounded); outputs
// as doubles.
std::vector<std::vector<double>> run(runtime::Executable& exe, const std::vector<std::vector<double>>& params,
                                     DType dtype) {
  std::vector<std::vector<char>> in_bytes;
  for (const auto& p : params) {
    in_bytes.emplace_back(p.size() * dtype_size(dtype));
    for (size_t i = 0; i < p.size(); ++i) {
      if (dtype == DType::f32) reinterpret_cast<float*>(in_bytes.back().data())[i] = static_cast<float>(p[i]);
      else if (dtype == DType::i64) reinterpret_cast<int64_t*>(in_bytes.back().data())[i] = std::llround(p[i]);
      else reinterpret_cast<double*>(in_bytes.back().data())[i] = p[i];
    }
  }
  std::vector<const void*> in;
  for (auto& b : in_bytes) in.push_back(b.data());
  std::vector<std::vector<char>> out_bytes;
  for (const auto& t : exe.output_types()) out_bytes.emplace_back(t.bytes());
  std::vector<void*> out;
  for (auto& b : out_bytes) out.push_back(b.data());
  exe.run(in.data(), out.data());
  std::vector<std::vector<double>> result;
  for (size_t k = 0; k < out_bytes.size(); ++k) {
    const auto& src = exe.outputs()[k];
    const std::vector<char>& bytes = src.kind == runtime::OutputSource::Kind::Alias ? out_bytes[src.index]
                                     : src.kind == runtime::OutputSource::Kind::Param ? in_bytes[src.index]
                                                                                      : out_bytes[k];
    EXPECT_NE(src.kind, runtime::OutputSource::Kind::Const) << "output " << k;
    std::vector<double> v(static_cast<size_t>(exe.output_types()[k].numel()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = dtype == DType::f32   ? reinterpret_cast<const float*>(bytes.data())[i]
             : dtype == DType::i64 ? static_cast<double>(reinterpret_cast<const int64_t*>(bytes.data())[i])
                                   : reinterpret_cast<const double*>(bytes.data())[i];
    result.push_back(v);
  }
  return result;
}

// A random program over parameters of shapes [4, 3], [3] and []: unary and binary elementwise
// ops (broadcasting), selects, reductions to [3], softmax, and products of a transpose.
Graph random_program(std::mt19937& rng, DType dtype) {
  Graph g;
  std::vector<ValueRef> vals;
  for (const Shape& s : {Shape{4, 3}, Shape{3}, Shape{}}) vals.push_back(g.add_parameter({dtype, s}));
  const OpKind unary[] = {OpKind::Neg, OpKind::Abs, OpKind::Tanh, OpKind::Sigmoid, OpKind::Sin, OpKind::Cos,
                          OpKind::Relu, OpKind::Silu, OpKind::Floor, OpKind::Sign, OpKind::Erf, OpKind::Expm1};
  const OpKind binary[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum, OpKind::Minimum};
  auto pick = [&] { return vals[rng() % vals.size()]; };
  auto shape = [&](ValueRef v) { return g.type(v).shape; };
  for (int step = 0; step < 24; ++step) {
    const int kind = static_cast<int>(rng() % 10);
    const ValueRef a = pick(), b = pick();
    if (kind <= 3) {
      vals.push_back(g.add(unary[rng() % std::size(unary)], {a}));
    } else if (kind <= 6) {
      vals.push_back(g.add(binary[rng() % std::size(binary)], {a, b}));
    } else if (kind == 7) {
      const ValueRef c = pick();
      vals.push_back(g.add(OpKind::Where, {g.add(OpKind::Gt, {a, b}), a, c}));
    } else if (kind == 8 && shape(a).size() == 2) {
      vals.push_back(rng() % 2 ? g.add(OpKind::Sum, {a}, {std::vector<int64_t>{0}, false})
                               : g.add(OpKind::Softmax, {a}, {int64_t{1}}));
    } else if (kind == 9 && shape(a).size() == 2 && shape(b).size() == 2) {
      // [3, 4] x [4, 3] from a transpose: a gemm on the cpu backend, a matmul on the reference.
      const ValueRef t = g.add(OpKind::Permute, {a}, {std::vector<int64_t>{1, 0}});
      const ValueRef p = g.add(OpKind::Matmul, {t, b});
      vals.push_back(g.add(OpKind::Sum, {p}, {std::vector<int64_t>{1}, false}));
    }
  }
  for (size_t v = 3; v < vals.size(); v += 4) g.outputs.push_back(vals[v]);
  g.outputs.push_back(vals.back());
  return g;
}

TEST(Backends, CpuMatchesTheReferenceOnRandomPrograms) {
  const backend::Backend& cpu = backend::get("cpu");
  const backend::Backend& ref = backend::get("reference");
  std::mt19937 rng(2024);
  int fusions = 0, gemms = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const DType dtype = trial % 2 ? DType::f64 : DType::f32;
    const Graph g = random_program(rng, dtype);
    std::vector<std::vector<double>> params;
    for (int p = 0; p < 3; ++p) {
      params.emplace_back(static_cast<size_t>(shape_numel(g.nodes[static_cast<size_t>(p)].results[0].shape)));
      for (double& v : params.back()) v = std::uniform_real_distribution<double>(-2, 2)(rng);
    }
    auto fast = compile(g, {}, cpu);
    auto oracle = compile(g, {}, ref);
    ASSERT_EQ(count_ops(oracle->graph(), OpKind::Fusion) + count_ops(oracle->graph(), OpKind::Gemm), 0)
        << "the reference backend runs every op on its own";
    fusions += count_ops(fast->graph(), OpKind::Fusion);
    gemms += count_ops(fast->graph(), OpKind::Gemm);
    const auto got = run(*fast, params, dtype), want = run(*oracle, params, dtype);
    const double rtol = dtype == DType::f32 ? 1e-5 : 1e-12;
    for (size_t k = 0; k < want.size(); ++k)
      for (size_t i = 0; i < want[k].size(); ++i) {
        const double w = want[k][i], x = got[k][i];
        if (std::isnan(w) || std::isinf(w)) {  // nan where nan, the same infinity
          EXPECT_TRUE(std::isnan(w) ? std::isnan(x) : x == w) << "trial " << trial << " output " << k << " element "
                                                              << i << ": " << x << " vs " << w;
          continue;
        }
        EXPECT_NEAR(x, w, rtol * (1 + std::abs(w))) << "trial " << trial << " output " << k << " element " << i;
      }
  }
  EXPECT_GT(fusions, 100);  // the cpu backend did fuse and rewrite: the comparison means something
  EXPECT_GT(gemms, 20);
}

// The cpu backend's convolutions (oneDNN) against the reference backend's im2col + GEMM, on
// seeded random geometries: groups, strides, padding, dilation, kernels wider than the padded
// input is not (those are refused), rows the stride drops. Forward and both backward ops.
// A reshape of a computed value that is not an output reads that value's memory: no step, no
// buffer of its own, and the value is kept while the reshape is read. Readers of the value
// itself and of its reshape, before and after each other, a reshape of the reshape, and a
// reshape that is an output (a copy into the output's buffer) all see the right elements, on
// both backends.
TEST(Backends, AReshapeReadsItsOperandsMemory) {
  Graph g;
  const ValueRef x = g.add_parameter({DType::f32, {8, 8}});
  const ValueRef e = g.add(OpKind::Exp, {x});
  const ValueRef r = g.add(OpKind::Reshape, {e}, {Shape{2, 32}});
  const ValueRef a = g.add(OpKind::Neg, {r});              // through the reshape
  const ValueRef b = g.add(OpKind::Mul, {e, e});           // the value itself, after
  const ValueRef rr = g.add(OpKind::Reshape, {r}, {Shape{64}});
  const ValueRef c = g.add(OpKind::Abs, {rr});             // a reshape of the reshape
  const ValueRef d = g.add(OpKind::Sub, {r, a});           // the reshape again, last
  const ValueRef out = g.add(OpKind::Reshape, {b}, {Shape{4, 16}});  // an output: copied
  g.outputs = {a, c, d, out};
  std::vector<double> xs(64);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.3 * static_cast<double>(i));
  for (const char* name : {"cpu", "reference"}) {
    auto exe = compile(g, {}, backend::get(name));
    const std::string text = exe->to_text();
    // The one reshape step left copies into output 3.
    EXPECT_EQ(text.find("reshape("), text.rfind("reshape(")) << name << "\n" << text;
    EXPECT_NE(text.find("reshape(arena+", 0), std::string::npos) << name << "\n" << text;
    EXPECT_NE(text.find("-> out 3", text.find("reshape(")), std::string::npos) << name << "\n" << text;
    const auto got = run(*exe, {xs}, DType::f32);
    // exp within 2 ulp of the correctly rounded value; the rest exact on it.
    for (size_t i = 0; i < 64; ++i) {
      const double ex = got[1][i];
      EXPECT_NEAR(ex, std::exp(static_cast<double>(static_cast<float>(xs[i]))), 3e-7 * ex) << name << " " << i;
      EXPECT_EQ(got[0][i], -ex) << name << " " << i;
      EXPECT_EQ(got[2][i], static_cast<double>(static_cast<float>(ex + ex))) << name << " " << i;
      EXPECT_EQ(got[3][i], static_cast<double>(static_cast<float>(ex * ex))) << name << " " << i;
    }
  }
}

// Long random programs over f32[128, 128] (64 KiB, large enough to be rematerialized) whose
// ops read early values far later, as a backward reads a forward's activations, with reshapes
// in between: the cpu backend (values computed again for distant readers, small reductions
// hoisted, reshapes read in place, fusion) against the reference backend, which does none of
// that.
TEST(Backends, CpuMatchesTheReferenceOnLongProgramsWithDistantReaders) {
  const backend::Backend& cpu = backend::get("cpu");
  const backend::Backend& ref = backend::get("reference");
  std::mt19937 rng(77);
  int rematerialized = 0;
  for (int trial = 0; trial < 12; ++trial) {
    Graph g;
    std::vector<ValueRef> big;
    const ValueRef x = g.add_parameter({DType::f32, {128, 128}});
    const ValueRef w = g.add_parameter({DType::f32, {128}});
    big.push_back(x);
    const OpKind unary[] = {OpKind::Neg, OpKind::Tanh, OpKind::Sigmoid, OpKind::Relu, OpKind::Sin};
    const OpKind binary[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Maximum};
    std::vector<ValueRef> outs;
    for (int step = 0; step < 160; ++step) {
      // Mostly recent values, sometimes one of the first ten: a distant reader.
      auto pick = [&] {
        const size_t n = big.size();
        return rng() % 5 == 0 ? big[rng() % std::min<size_t>(n, 10)] : big[n - 1 - rng() % std::min<size_t>(n, 4)];
      };
      const int kind = static_cast<int>(rng() % 8);
      if (kind <= 2) big.push_back(g.add(unary[rng() % std::size(unary)], {pick()}));
      else if (kind <= 4) big.push_back(g.add(binary[rng() % std::size(binary)], {pick(), pick()}));
      else if (kind == 5) big.push_back(g.add(OpKind::Mul, {pick(), w}));
      else if (kind == 6) {
        const ValueRef r = g.add(OpKind::Reshape, {pick()}, {Shape{256, 64}});
        const ValueRef t = g.add(OpKind::Tanh, {r});
        big.push_back(g.add(OpKind::Reshape, {g.add(OpKind::Add, {t, r})}, {Shape{128, 128}}));
      } else {
        outs.push_back(g.add(OpKind::Sum, {pick()}, {std::vector<int64_t>{0}, false}));
      }
    }
    outs.push_back(big.back());
    g.outputs = outs;
    rematerialized += rematerialize_for_distant_readers(g).nodes.size() > g.nodes.size();
    std::vector<std::vector<double>> params(2);
    params[0].resize(128 * 128);
    params[1].resize(128);
    for (auto& p : params)
      for (double& v : p) v = std::uniform_real_distribution<double>(-1.5, 1.5)(rng);
    const auto got = run(*compile(g, {}, cpu), params, DType::f32);
    const auto want = run(*compile(g, {}, ref), params, DType::f32);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      for (size_t i = 0; i < want[k].size(); ++i)
        ASSERT_NEAR(got[k][i], want[k][i], 1e-5 * (1 + std::abs(want[k][i])))
            << "trial " << trial << " output " << k << " element " << i;
  }
  EXPECT_GE(rematerialized, 6) << "the programs must give the pass something to do";
}

TEST(Backends, LibraryConvolutionsMatchTheReferenceOnRandomGeometries) {
  const backend::Backend& cpu = backend::get("cpu");
  const backend::Backend& ref = backend::get("reference");
  std::mt19937 rng(7);
  auto draw = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t library_before = metrics::counter("LibraryKernels");
  int trials = 0;
  while (trials < 60) {
    const int64_t groups = draw(1, 3), N = draw(1, 3), C = groups * draw(1, 4), O = groups * draw(1, 4);
    const int64_t H = draw(1, 12), W = draw(1, 12), kh = draw(1, 4), kw = draw(1, 4);
    const std::vector<int64_t> stride{draw(1, 3), draw(1, 3)}, padding{draw(0, 2), draw(0, 2)};
    const std::vector<int64_t> dilation{draw(1, 2), draw(1, 2)};
    const int64_t OH = (H + 2 * padding[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1;
    const int64_t OW = (W + 2 * padding[1] - dilation[1] * (kw - 1) - 1) / stride[1] + 1;
    if (H + 2 * padding[0] < dilation[0] * (kh - 1) + 1 || W + 2 * padding[1] < dilation[1] * (kw - 1) + 1) continue;
    ++trials;
    const Shape xs{N, C, H, W}, ws{O, C / groups, kh, kw}, ys{N, O, OH, OW};
    Graph g;
    const ValueRef x = g.add_parameter({DType::f32, xs});
    const ValueRef w = g.add_parameter({DType::f32, ws});
    const ValueRef gy = g.add_parameter({DType::f32, ys});
    const ValueRef y = g.add(OpKind::Conv2d, {x, w}, {stride, padding, dilation, groups});
    const ValueRef dx = g.add(OpKind::Conv2dBackwardInput, {gy, w}, {xs, stride, padding, dilation, groups});
    const ValueRef dw = g.add(OpKind::Conv2dBackwardWeight, {gy, x}, {ws, stride, padding, dilation, groups});
    g.outputs = {y, dx, dw};
    std::vector<std::vector<double>> params;
    for (const Shape& s : {xs, ws, ys}) {
      params.emplace_back(static_cast<size_t>(shape_numel(s)));
      for (double& v : params.back()) v = std::uniform_real_distribution<double>(-1, 1)(rng);
    }
    const auto got = run(*compile(g, {}, cpu), params, DType::f32);
    const auto want = run(*compile(g, {}, ref), params, DType::f32);
    // Each output element sums at most this many products of values in [-1, 1]: f32 rounding
    // in either summation order stays within a few ulps of that length.
    const double length[] = {static_cast<double>(C / groups * kh * kw), static_cast<double>(O / groups * kh * kw),
                             static_cast<double>(N * OH * OW)};
    for (size_t k = 0; k < 3; ++k)
      for (size_t i = 0; i < want[k].size(); ++i)
        ASSERT_NEAR(got[k][i], want[k][i], 4e-7 * length[k] + 1e-6)
            << "output " << k << " element " << i << " of N,C,H,W " << N << "," << C << "," << H << "," << W
            << " O " << O << " k " << kh << "x" << kw << " stride " << stride[0] << "," << stride[1] << " padding "
            << padding[0] << "," << padding[1] << " dilation " << dilation[0] << "," << dilation[1] << " groups "
            << groups;
  }
  EXPECT_GE(metrics::counter("LibraryKernels") - library_before, 3 * 60) << "every conv went through oneDNN";
}

// Products of slices, permutes and reshapes (gemm_view on the cpu backend: the operands read
// where they lie, the result written permuted) against the reference backend, which copies
// every view and multiplies the copies: random operands (f32, f64, i64) of rank 2 to 4, each
// cut from a larger parameter (a slice with steps, its dims in a random order), batch dims
// merged or broadcast, the result permuted or not.
TEST(Backends, CpuProductsOfViewsMatchTheReference) {
  const backend::Backend& cpu = backend::get("cpu");
  const backend::Backend& ref = backend::get("reference");
  std::mt19937 rng(77);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int views = 0, permuted = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const DType dtype = trial % 4 == 3 ? DType::i64 : trial % 2 ? DType::f32 : DType::f64;
    Graph g;
    // An operand of logical shape `want`: a parameter holding it in another order, padded and
    // strided, sliced and permuted back (reshaped from a flat parameter half the time).
    auto operand = [&](const Shape& want) {
      const size_t r = want.size();
      std::vector<int64_t> order(r);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      Shape src(r);
      std::vector<int64_t> starts(r), ends(r), steps(r);
      for (size_t d = 0; d < r; ++d) {
        const auto s = static_cast<size_t>(order[d]);
        steps[s] = uniform(1, 2);
        starts[s] = uniform(0, 2);
        ends[s] = starts[s] + (want[d] - 1) * steps[s] + 1;
        src[s] = ends[s] + uniform(0, 2);
      }
      ValueRef p = uniform(0, 1) ? g.add(OpKind::Reshape, {g.add_parameter({dtype, {shape_numel(src)}})}, {src})
                                 : g.add_parameter({dtype, src});
      ValueRef v = g.add(OpKind::Slice, {p}, {starts, ends, steps});
      std::vector<int64_t> back(r);  // dim d of the result is the slice's dim order[d]
      for (size_t d = 0; d < r; ++d) back[d] = order[d];
      return g.add(OpKind::Permute, {v}, {back});
    };
    const int64_t n = uniform(1, 9), k = uniform(1, 9), m = uniform(1, 9), b1 = uniform(1, 3), b2 = uniform(1, 3);
    const int64_t rank = uniform(2, 4);
    Shape bx = rank == 2 ? Shape{} : rank == 3 ? Shape{b1} : Shape{b1, b2};
    auto with = [](Shape b, int64_t r, int64_t c) {
      b.push_back(r);
      b.push_back(c);
      return b;
    };
    ValueRef x = operand(with(bx, n, k));
    ValueRef y = operand(with(uniform(0, 2) == 0 ? Shape{} : bx, k, m));  // broadcast half the time
    const bool merge = rank == 4 && uniform(0, 1);
    if (merge) {
      x = g.add(OpKind::Reshape, {x}, {Shape{b1 * b2, n, k}});
      if (g.type(y).shape.size() == 4) y = g.add(OpKind::Reshape, {y}, {Shape{b1 * b2, k, m}});
    }
    ValueRef p = g.add(OpKind::Matmul, {x, y});
    if (merge) p = g.add(OpKind::Reshape, {p}, {with(bx, n, m)});
    if (rank >= 3 && uniform(0, 1)) {
      std::vector<int64_t> perm(static_cast<size_t>(rank));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end() - 1, rng);  // the last dim stays last
      p = g.add(OpKind::Permute, {p}, {perm});
    }
    g.outputs = {p};
    std::vector<std::vector<double>> params;
    for (const ir::Node& node : g.nodes)
      if (node.op == OpKind::Parameter) {
        params.emplace_back(static_cast<size_t>(shape_numel(node.results[0].shape)));
        for (double& v : params.back())
          v = dtype == DType::i64 ? static_cast<double>(uniform(-5, 5)) : std::uniform_real_distribution<double>(-1, 1)(rng);
      }
    auto fast = compile(g, {}, cpu);
    views += count_ops(fast->graph(), OpKind::GemmView);
    for (const ir::Node& node : fast->graph().nodes)
      if (node.op == OpKind::GemmView && !ir::NodeAttrs(node.op, node.attrs).ints<"out_perm">().empty()) ++permuted;
    const auto got = run(*fast, params, dtype), want = run(*compile(g, {}, ref), params, dtype);
    const double tol = dtype == DType::f32 ? 1e-5 : dtype == DType::i64 ? 0 : 1e-12;
    ASSERT_EQ(got[0].size(), want[0].size());
    for (size_t i = 0; i < want[0].size(); ++i)
      ASSERT_NEAR(got[0][i], want[0][i], tol * (1 + std::abs(want[0][i]))) << "trial " << trial << " element " << i
                                                                          << "\n" << ir::to_text(g);
  }
  EXPECT_GT(views, 150);    // the products did read views: the comparison means something
  EXPECT_GT(permuted, 40);  // and wrote permuted results
}

// Every f32 product of the cpu backend goes through oneDNN, weight gradients over a long inner
// dim included (a transposed left operand, k = 2048, n * m >= 400000), and matches OpenBLAS's
// (the reference backend's) within f32 rounding of its length.
TEST(Backends, EveryF32ProductGoesThroughTheLibraryAndMatchesTheReference) {
  const backend::Backend& cpu = backend::get("cpu");
  const backend::Backend& ref = backend::get("reference");
  std::mt19937 rng(11);
  struct Case {
    int64_t n, k, m;
    bool tx, ty;
  };
  const Case cases[] = {{1152, 2048, 384, true, false}, {384, 2048, 1536, true, false}, {64, 300, 96, false, false},
                        {96, 1100, 72, true, true},      {33, 17, 45, false, true},        {256, 784, 1024, false, true}};
  for (const Case& c : cases) {
    Graph g;
    const ValueRef x = g.add_parameter({DType::f32, c.tx ? Shape{c.k, c.n} : Shape{c.n, c.k}});
    const ValueRef y = g.add_parameter({DType::f32, c.ty ? Shape{c.m, c.k} : Shape{c.k, c.m}});
    g.outputs = {g.add(OpKind::Gemm, {x, y}, {c.tx, c.ty})};
    std::vector<std::vector<double>> params(2);
    params[0].resize(static_cast<size_t>(c.n * c.k));
    params[1].resize(static_cast<size_t>(c.k * c.m));
    for (auto& p : params)
      for (double& v : p) v = std::uniform_real_distribution<double>(-1, 1)(rng);
    const int64_t library_before = metrics::counter("LibraryKernels");
    auto exe = compile(g, {}, cpu);
    EXPECT_EQ(metrics::counter("LibraryKernels") - library_before, 1)
        << c.n << "x" << c.k << "x" << c.m << " tx " << c.tx << " ty " << c.ty << " is not a oneDNN product";
    const auto got = run(*exe, params, DType::f32);
    const auto want = run(*compile(g, {}, ref), params, DType::f32);
    ASSERT_EQ(got[0].size(), want[0].size());
    for (size_t i = 0; i < want[0].size(); ++i)
      ASSERT_NEAR(got[0][i], want[0][i], 4e-7 * static_cast<double>(c.k) + 1e-6)
          << "element " << i << " of " << c.n << "x" << c.k << "x" << c.m << " tx " << c.tx << " ty " << c.ty;
  }
}

TEST(Backends, TheBackendIsPartOfEveryCacheKey) {
  const std::string before = current_backend();
  Tensor a = tensor({1.0f, 2.0f, 3.0f}, {3});
  auto value = [&] { return (tanh(a) * 2.0 + 1.0).to_vector<float>(); };
  set_backend("cpu");
  const auto on_cpu = value();
  const int64_t compiles = metrics::counter("UncachedCompile");
  set_backend("reference");
  EXPECT_EQ(current_backend(), "reference");
  const auto on_ref = value();
  EXPECT_EQ(metrics::counter("UncachedCompile"), compiles + 1) << "compiled again for the other backend";
  set_backend("cpu");
  value();
  EXPECT_EQ(metrics::counter("UncachedCompile"), compiles + 1) << "the cpu executable is still cached";
  EXPECT_EQ(on_cpu, on_ref);
  set_backend(before);
}

TEST(Backends, ChoosingAnUnknownBackendNamesTheKnownOnes) {
  EXPECT_EQ(available_backends(), (std::vector<std::string>{"cpu", "reference"}));
  const std::string before = current_backend();
  EXPECT_THAT(testing_support::error_of([] { set_backend("gpu"); }),
              ::testing::AllOf(::testing::HasSubstr("unknown backend 'gpu'"), ::testing::HasSubstr("cpu, reference")));
  EXPECT_EQ(current_backend(), before) << "a refused choice changes nothing";
}

// A backend that runs everything the reference backend does except matmul of f64 operands.
class NoF64Matmul final : public backend::Backend {
 public:
  const std::string& name() const override { return name_; }
  uint64_t fingerprint() const override { return 7; }
  const backend::Capabilities& capabilities() const override { return ref_.capabilities(); }
  bool supports(OpKind op, const std::vector<DType>& dtypes) const override {
    return !(op == OpKind::Matmul && dtypes.at(0) == DType::f64);
  }
  std::shared_ptr<runtime::Executable> lower(const Graph& g, const std::vector<int32_t>& d,
                                             const backend::RegionExecutables& regions) const override {
    return ref_.lower(g, d, regions);
  }

 private:
  std::string name_ = "no-f64-matmul";
  const backend::Backend& ref_ = backend::get("reference");
};

TEST(Backends, CompileRefusesANodeTheBackendDoesNotRun) {
  NoF64Matmul b;
  for (DType dtype : {DType::f32, DType::f64}) {
    Graph g;
    ValueRef x = g.add_parameter({dtype, {2, 2}});
    g.outputs = {g.add(OpKind::Tanh, {g.add(OpKind::Matmul, {x, x})})};
    if (dtype == DType::f32) {
      EXPECT_NE(compile(g, {}, b), nullptr);
    } else {
      EXPECT_THAT(testing_support::error_of([&] { compile(g, {}, b); }),
                  ::testing::HasSubstr("the no-f64-matmul backend does not run matmul on (f64, f64) (node 1)"));
    }
  }
}

}  // namespace
}  // namespace lazyrt::compile
