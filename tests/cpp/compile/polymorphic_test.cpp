// Bucket graphs (compile/polymorphic.h) against the graphs they are made from: each program is
// built at several sizes n, compiled as traced and as its bucket graph, and run on the same
// random inputs (NaNs and infinities among them) padded into the bucket's shape; the valid
// elements of every result must be the traced graph's, and sizes of one bucket must give one
// bucket graph (one hash).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "compile/compile.h"
#include "compile/polymorphic.h"
#include "exec/executor.h"
#include "ir/hash.h"
#include "scalar/elementwise_fns.h"
#include "support/run_graph.h"

namespace lazyrt {
namespace {

using ir::Graph;
using ir::OpKind;
using ir::ValueRef;

struct Program {
  const char* name;
  // Builds the graph for size n; marks its dynamic dims.
  std::function<Graph(int64_t n, std::vector<compile::DynamicDim>& marks)> build;
};

ir::TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

ValueRef sum(Graph& g, ValueRef x, std::vector<int64_t> dims, bool keep = false) {
  return g.add(OpKind::Sum, {x}, {std::move(dims), keep});
}

std::vector<Program> programs() {
  return {
      {"mean, var, std, max and argmax over the dynamic dim, NaNs included",
       [](int64_t n, auto& m) {
         Graph g;
         ValueRef x = g.add_parameter(f32({n, 4}));
         m.push_back({0, 0});
         g.outputs = {g.add(OpKind::Mean, {x}, {std::vector<int64_t>{0}, false}),
                      g.add(OpKind::Var, {x}, {std::vector<int64_t>{0}, true, 1.0}),
                      g.add(OpKind::Std, {x}, {std::vector<int64_t>{0, 1}, false, 0.0}),
                      g.add(OpKind::Amax, {x}, {std::vector<int64_t>{0}, false}),
                      g.add(OpKind::ArgMin, {x}, {int64_t{0}, false}),
                      g.add(OpKind::Norm, {x}, {std::vector<int64_t>{0}, false, 2.0})};
         g.num_params = 1;
         return g;
       }},
      {"softmax and reverse cumsum along the dynamic dim, a product contracting it",
       [](int64_t n, auto& m) {
         Graph g;
         ValueRef x = g.add_parameter(f32({3, n}));
         ValueRef y = g.add_parameter(f32({n, 2}));
         m.push_back({0, 1});
         m.push_back({1, 0});
         ValueRef s = g.add(OpKind::Softmax, {x}, {int64_t{1}});
         g.outputs = {s, g.add(OpKind::Matmul, {x, y}), g.add(OpKind::Cumsum, {x}, {int64_t{1}, true}),
                      g.add(OpKind::LogSoftmax, {x}, {int64_t{1}})};
         return g;
       }},
      {"the dynamic dim merged inside static ones by reshapes, reduced whole",
       [](int64_t n, auto& m) {
         Graph g;
         ValueRef x = g.add_parameter(f32({2, n, 3}));
         m.push_back({0, 1});
         ValueRef flat = g.add(OpKind::Reshape, {x}, {Shape{2 * n * 3}});
         ValueRef rows = g.add(OpKind::Reshape, {x}, {Shape{2 * n, 3}});
         ValueRef e = g.add(OpKind::Exp, {rows});
         ValueRef back = g.add(OpKind::Reshape, {e}, {Shape{2, n, 3}});
         ValueRef w = g.add_parameter(f32({3, 4}));
         ValueRef et = g.add(OpKind::Permute, {e}, {std::vector<int64_t>{1, 0}});
         // Products over the merged dim: its valid rows in two blocks, read and contracted.
         g.outputs = {g.add(OpKind::Amin, {flat}, {std::vector<int64_t>{0}, false}), sum(g, rows, {0}),
                      g.add(OpKind::Softmax, {rows}, {int64_t{0}}), back,
                      g.add(OpKind::Mean, {flat}, {std::vector<int64_t>{0}, false}),
                      g.add(OpKind::Matmul, {e, w}), g.add(OpKind::Matmul, {et, e}),
                      sum(g, g.add(OpKind::Matmul, {e, w}), {0})};
         return g;
       }},
      {"indices read along a dynamic dim: index_select, gather, scatter_add, index_add",
       [](int64_t n, auto& m) {
         Graph g;
         ValueRef table = g.add_parameter(f32({5, 3}));
         ValueRef idx = g.add_parameter({DType::i64, {n}});
         ValueRef src = g.add_parameter(f32({n, 3}));
         m.push_back({1, 0});
         m.push_back({2, 0});
         ValueRef rows = g.add(OpKind::IndexSelect, {table, idx}, {int64_t{0}});
         ValueRef idx2 = g.add(OpKind::Reshape, {idx}, {Shape{n, 1}});
         ValueRef idx3 = g.add(OpKind::Expand, {idx2}, {Shape{n, 3}});
         g.outputs = {rows, g.add(OpKind::IndexAdd, {table, idx, src}, {int64_t{0}}),
                      g.add(OpKind::ScatterAdd, {table, idx3, src}, {int64_t{0}}),
                      g.add(OpKind::Gather, {src, g.add(OpKind::Full, {}, {0.0, Shape{n, 1}, DType::i64})}, {int64_t{1}})};
         return g;
       }},
      {"sums and products reading zero padding unmasked, and values whose padding is not zero",
       [](int64_t n, auto& m) {
         // Inputs are padded with zeros; x * inf, x / 0, where(x > 0, x, 1), x plus the first n
         // rows of a static buffer and exp(x) do not keep them.
         Graph g;
         ValueRef x = g.add_parameter(f32({n, 3}));
         ValueRef buf = g.add_parameter(f32({16, 3}));
         m.push_back({0, 0});
         ValueRef a = g.add(OpKind::Abs, {x});
         ValueRef first_n = g.add(OpKind::Slice, {buf}, {std::vector<int64_t>{0, 0}, std::vector<int64_t>{n, 3},
                                                         std::vector<int64_t>{1, 1}});
         ValueRef t = g.add(OpKind::Permute, {g.add(OpKind::Tanh, {x})}, {std::vector<int64_t>{1, 0}});
         g.outputs = {
             sum(g, g.add(OpKind::Mul, {a, g.add_full(INFINITY, {}, DType::f32)}), {0}),
             sum(g, g.add(OpKind::Div, {a, g.add_full(0.0, {}, DType::f32)}), {0}),
             sum(g, g.add(OpKind::Where, {g.add(OpKind::Gt, {x, g.add_full(0.0, {}, DType::f32)}), x,
                                          g.add_full(1.0, {}, DType::f32)}), {0}),
             sum(g, g.add(OpKind::Add, {x, first_n}), {0}),
             g.add(OpKind::Matmul, {t, g.add(OpKind::Exp, {x})}),
             sum(g, g.add(OpKind::Exp, {x}), {0}),
             g.add(OpKind::Matmul, {t, g.add(OpKind::Mul, {g.add(OpKind::Neg, {x}), g.add_full(0.5, {}, DType::f32)})}),
         };
         return g;
       }},
      {"a count of n: the mean's gradient divides by it",
       [](int64_t n, auto& m) {
         Graph g;
         ValueRef x = g.add_parameter(f32({n, 2}));
         m.push_back({0, 0});
         ValueRef c = g.add_full(static_cast<double>(2 * n), {}, DType::f32);
         ValueRef e = g.add(OpKind::Expand, {g.add_full(1.0, {1, 1}, DType::f32)}, {Shape{n, 2}});
         g.outputs = {g.add(OpKind::Div, {g.add(OpKind::Mul, {e, x}), c})};
         return g;
       }},
  };
}

std::vector<std::vector<char>> padded_inputs(const compile::PolymorphicGraph& pg, const Graph& traced,
                                             const std::vector<std::vector<char>>& in) {
  std::vector<std::vector<char>> out;
  size_t p = 0;
  for (const ir::Node& node : traced.nodes) {
    if (node.op != OpKind::Parameter) continue;
    const ir::TensorType& t = node.results[0];
    if (pg.params[p].empty()) {
      out.push_back(in[p]);
    } else {
      const compile::Box& box = pg.param_boxes[p];
      ir::TensorType padded = t;
      for (const compile::PaddedDim& d : pg.params[p]) padded.shape[d.dim] = d.outer * pg.buckets[d.sym] * d.inner;
      out.emplace_back(padded.bytes(), 0);
      exec::copy_box(in[p].data(), box.traced, out.back().data(), box.padded, box.traced, dtype_size(t.dtype));
    }
    ++p;
  }
  for (int64_t n : pg.sizes) {
    out.emplace_back(sizeof(int64_t));
    std::memcpy(out.back().data(), &n, sizeof(int64_t));
  }
  return out;
}

TEST(Polymorphic, BucketGraphsComputeTheTracedGraphsValuesAndShareOneHashPerBucket) {
  for (const Program& prog : programs()) {
    std::vector<GraphHash> hashes;
    for (int64_t n : {5, 6, 8, 3}) {
      SCOPED_TRACE(std::string(prog.name) + ", n = " + std::to_string(n));
      std::vector<compile::DynamicDim> marks;
      const Graph g = prog.build(n, marks);
      Graph traced = g;
      traced.num_params = 0;
      for (const ir::Node& node : traced.nodes) traced.num_params += node.op == OpKind::Parameter;
      ir::verify(traced);
      std::string why;
      const std::optional<compile::PolymorphicGraph> pg = compile::make_polymorphic(traced, marks, &why);
      ASSERT_TRUE(pg) << why;
      ir::verify(pg->graph);
      EXPECT_EQ(pg->buckets, std::vector<int64_t>{n <= 4 ? 4 : 8});
      hashes.push_back(ir::hash_graph(pg->graph));
      std::mt19937 rng(static_cast<unsigned>(n));
      const auto in = testing::random_inputs(traced, rng);
      // Indices in range: the index parameters are rewritten to valid rows.
      std::vector<std::vector<char>> inputs = in;
      size_t p = 0;
      for (const ir::Node& node : traced.nodes) {
        if (node.op != OpKind::Parameter) continue;
        if (node.results[0].dtype == DType::i64) {
          auto* v = reinterpret_cast<int64_t*>(inputs[p].data());
          for (int64_t i = 0; i < node.results[0].numel(); ++i) v[i] = ((v[i] % 5) + 5) % 5;
        }
        ++p;
      }
      auto want_exe = compile::compile(traced, {});
      auto got_exe = compile::compile(pg->graph, {});
      const auto want = testing::run_graph(*want_exe, inputs);
      const auto padded = testing::run_graph(*got_exe, padded_inputs(*pg, traced, inputs));
      ASSERT_EQ(want.size(), padded.size());
      for (size_t k = 0; k < want.size(); ++k) {
        const ir::TensorType& t = traced.type(traced.outputs[k]);
        std::vector<char> got = padded[k];
        if (!pg->outputs[k].empty()) {
          got.assign(t.bytes(), 0);
          exec::copy_box(padded[k].data(), pg->output_boxes[k].padded, got.data(), pg->output_boxes[k].traced,
                         pg->output_boxes[k].traced, dtype_size(t.dtype));
        }
        ASSERT_EQ(got.size(), want[k].size()) << "output " << k;
        // Mean, var and std are a sum over a count in the bucket graph: within rounding.
        visit_dtype(t.dtype, [&](auto tag) {
          using T = decltype(tag);
          for (int64_t i = 0; i < t.numel(); ++i) {
            T a, b;
            std::memcpy(&a, got.data() + i * sizeof(T), sizeof(T));
            std::memcpy(&b, want[k].data() + i * sizeof(T), sizeof(T));
            const double x = convert<double>(a), y = convert<double>(b);
            if (x != x && y != y) continue;
            if (x == y) continue;
            EXPECT_NEAR(x, y, 1e-5 * std::max(1.0, std::abs(y))) << "output " << k << " element " << i;
          }
        });
      }
    }
    // 5, 6 and 8 share bucket 8: one graph.
    EXPECT_EQ(hashes[0], hashes[1]) << prog.name;
    EXPECT_EQ(hashes[0], hashes[2]) << prog.name;
    EXPECT_NE(hashes[0], hashes[3]) << prog.name;
  }
}

// Which elementwise ops keep zero padding zero is read off their scalar functions at 0 and -0:
// the facts of the functions, for ops with and without attributes.
TEST(Polymorphic, ZeroKeepingOpsAreReadOffTheirScalarFunctions) {
  using ir::OpKind;
  for (OpKind op : {OpKind::Neg, OpKind::Abs, OpKind::Sqrt, OpKind::Relu, OpKind::Sin, OpKind::Tanh, OpKind::Gelu,
                    OpKind::Silu, OpKind::Asinh, OpKind::Floor, OpKind::Round, OpKind::Sign, OpKind::Add,
                    OpKind::Mul, OpKind::Maximum, OpKind::Ne, OpKind::Lt, OpKind::IsNan, OpKind::LogicalAnd,
                    OpKind::Clamp})
    EXPECT_TRUE(scalar::maps_zero_to_zero(op)) << ir::op_name(op);
  // exp(0) = 1, 0/0 and rsqrt(0) are not 0, pow(0, 0) = 1, atan2(0, -0) = pi, softplus(0) =
  // log(2) / beta, sigmoid(0) = 0.5, 0 == 0, !0.
  for (OpKind op : {OpKind::Exp, OpKind::Div, OpKind::Rsqrt, OpKind::Log, OpKind::Pow, OpKind::Atan2,
                    OpKind::Softplus, OpKind::Sigmoid, OpKind::Eq, OpKind::Le, OpKind::LogicalNot})
    EXPECT_FALSE(scalar::maps_zero_to_zero(op)) << ir::op_name(op);
}

TEST(Polymorphic, OpsThatCannotTakePaddingRefuseAndSayWhich) {
  Graph g;
  ValueRef x = g.add_parameter(f32({5, 2}));
  g.outputs = {g.add(OpKind::Flip, {x}, {std::vector<int64_t>{0}})};
  std::vector<compile::DynamicDim> marks{{0, 0}};
  std::string why;
  EXPECT_FALSE(compile::make_polymorphic(g, marks, &why));
  EXPECT_EQ(why, "flip: flips a dynamic dim");
  // A soft mark gives way instead: the dim stays static, and with none left no bucket graph.
  std::vector<compile::DynamicDim> soft{{0, 0, true}};
  EXPECT_FALSE(compile::make_polymorphic(g, soft, &why));
  // A size of 1 broadcasts: never padded.
  Graph one;
  ValueRef y = one.add_parameter(f32({1, 2}));
  one.outputs = {one.add(OpKind::Exp, {y})};
  EXPECT_FALSE(compile::make_polymorphic(one, marks, &why));
  EXPECT_EQ(why, "no dynamic dim is of size 2 or more");
}

TEST(Polymorphic, BoxesSplitAPaddedDimAroundItsFactor) {
  const compile::Box b = compile::box_of({6, 10, 4}, {{1, 0, 2, 1}}, {8}, {5});
  EXPECT_EQ(b.traced, (Shape{6, 2, 5, 1, 4}));
  EXPECT_EQ(b.padded, (Shape{6, 2, 8, 1, 4}));
  EXPECT_EQ(compile::bucket_of(5), 8);
  EXPECT_EQ(compile::bucket_of(8), 8);
  EXPECT_EQ(compile::bucket_of(2), 2);
}

}  // namespace
}  // namespace lazyrt
