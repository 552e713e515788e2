// Transposes and views folded into gemm: the passes on hand-built graphs (golden text), and the
// gemm kernel for every pair of transpose flags, small (a loop) and large (BLAS), batched or not,
// against products the test computes itself in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "compile/compile.h"
#include "compile/passes.h"
#include "ir/gemm_view.h"
#include "support/graphs.h"

namespace lazyrt::compile {
using ir::Graph;
using ir::OpKind;
using ir::ValueRef;
using lazyrt::testing::f32;

namespace {

ValueRef transpose(Graph& g, ValueRef v) { return g.add(OpKind::Permute, {v}, {std::vector<int64_t>{1, 0}}); }

}  // namespace

TEST(TransposesIntoGemm, AMatmulOfTransposesReadsTheOriginals) {
  Graph g;
  ValueRef a = g.add_parameter(f32({3, 2}));
  ValueRef b = g.add_parameter(f32({4, 3}));
  g.outputs = {g.add(OpKind::Matmul, {transpose(g, a), transpose(g, b)})};
  EXPECT_EQ(ir::to_text(dead_code_elimination(transposes_into_gemm(g))),
            "%0 = parameter {index=0} : f32[3, 2]\n"
            "%1 = parameter {index=1} : f32[4, 3]\n"
            "%2 = gemm(%0, %1) {transpose_x=true, transpose_y=true} : f32[2, 4]\n"
            "return %2\n");
}

// (x y)^T = y^T x^T: the transpose of a product becomes the product of the swapped operands.
TEST(TransposesIntoGemm, ATransposedProductSwapsItsOperands) {
  Graph g;
  ValueRef x = g.add_parameter(f32({10, 5}));
  ValueRef ones = g.add_full(1, {10, 3}, DType::f32);
  g.outputs = {transpose(g, g.add(OpKind::Matmul, {transpose(g, x), ones}))};
  EXPECT_EQ(ir::to_text(dead_code_elimination(transposes_into_gemm(g))),
            "%0 = parameter {index=0} : f32[10, 5]\n"
            "%1 = full {value=1, shape=[10, 3], dtype=f32} : f32[10, 3]\n"
            "%2 = gemm(%1, %0) {transpose_x=true, transpose_y=false} : f32[3, 5]\n"
            "return %2\n");
}

// Batched: a transpose of the last two dims is read by the gemm; a permute that moves batch
// dims is not a transpose of the matrices and stays.
TEST(TransposesIntoGemm, BatchedProductsReadTransposedMatrices) {
  Graph g;
  ValueRef q = g.add_parameter(f32({2, 4, 3, 5}));
  ValueRef k = g.add_parameter(f32({2, 4, 6, 5}));
  ValueRef w = g.add_parameter(f32({4, 5}));
  ValueRef kt = g.add(OpKind::Permute, {k}, {std::vector<int64_t>{0, 1, 3, 2}});
  ValueRef scores = g.add(OpKind::Matmul, {q, kt});  // [2, 4, 3, 6]
  ValueRef moved = g.add(OpKind::Permute, {q}, {std::vector<int64_t>{1, 0, 2, 3}});
  ValueRef other = g.add(OpKind::Matmul, {moved, g.add(OpKind::Permute, {w}, {std::vector<int64_t>{1, 0}})});
  g.outputs = {scores, other};
  EXPECT_EQ(ir::to_text(dead_code_elimination(transposes_into_gemm(g))),
            "%0 = parameter {index=0} : f32[2, 4, 3, 5]\n"
            "%1 = parameter {index=1} : f32[2, 4, 6, 5]\n"
            "%2 = parameter {index=2} : f32[4, 5]\n"
            "%3 = gemm(%0, %1) {transpose_x=false, transpose_y=true} : f32[2, 4, 3, 6]\n"
            "%4 = permute(%0) {dims=[1, 0, 2, 3]} : f32[4, 2, 3, 5]\n"
            "%5 = gemm(%4, %2) {transpose_x=false, transpose_y=true} : f32[4, 2, 3, 4]\n"
            "return %3, %5\n");
}

// Attention's heads: q and k sliced from one qkv value, split into heads, the heads moved in
// front of the tokens and merged with the batch for a batched product; the weights' product
// with v, whose result is moved back behind the tokens. Every product reads qkv where it lies,
// over batch and heads kept apart, and the last one writes its result in the moved order.
TEST(ViewsIntoGemm, AttentionReadsItsHeadsInPlace) {
  Graph g;
  ValueRef qkv = g.add_parameter(f32({2, 5, 24}));  // batch 2, 5 tokens, 3 x (2 heads x 4)
  auto head = [&](int64_t part, std::vector<int64_t> order) {
    ValueRef s = g.add(OpKind::Slice, {qkv}, {std::vector<int64_t>{0, 0, 8 * part}, std::vector<int64_t>{2, 5, 8 * part + 8},
                                            std::vector<int64_t>{1, 1, 1}});
    ValueRef h = g.add(OpKind::Permute, {g.add(OpKind::Reshape, {s}, {Shape{2, 5, 2, 4}})}, {std::move(order)});
    const Shape& hs = g.type(h).shape;
    return g.add(OpKind::Reshape, {h}, {Shape{4, hs[2], hs[3]}});
  };
  ValueRef scores = g.add(OpKind::Matmul, {head(0, {0, 2, 1, 3}), head(1, {0, 2, 3, 1})});  // [4, 5, 5]
  ValueRef w = g.add_parameter(f32({4, 5, 5}));
  ValueRef y = g.add(OpKind::Matmul, {w, head(2, {0, 2, 1, 3})});                          // [4, 5, 4]
  ValueRef back = g.add(OpKind::Permute, {g.add(OpKind::Reshape, {y}, {Shape{2, 2, 5, 4}})},
                        {std::vector<int64_t>{0, 2, 1, 3}});
  g.outputs = {scores, back};
  EXPECT_EQ(ir::to_text(dead_code_elimination(views_into_gemm(g))),
            "%0 = parameter {index=0} : f32[2, 5, 24]\n"
            "%1 = gemm_view(%0, %0) {x_view=[0, 2, 120, 2, 4, 5, 24, 4, 1], y_view=[8, 2, 120, 2, 4, 4, 1, 5, 24], "
            "out_perm=[]} : f32[2, 2, 5, 5]\n"
            "%2 = reshape(%1) {shape=[4, 5, 5]} : f32[4, 5, 5]\n"
            "%3 = parameter {index=1} : f32[4, 5, 5]\n"
            "%4 = gemm_view(%3, %0) {x_view=[0, 2, 50, 2, 25, 5, 5, 5, 1], y_view=[16, 2, 120, 2, 4, 5, 24, 4, 1], "
            "out_perm=[0, 2, 1, 3]} : f32[2, 5, 2, 4]\n"
            "return %2, %4\n");
}

// Views a GEMM cannot read (neither dim of the matrices adjacent: a slice with step 2 of the
// last dim) stay copies, and a product read elsewhere too is not written permuted.
TEST(ViewsIntoGemm, LeavesWhatAGemmCannotReadAlone) {
  Graph g;
  ValueRef x = g.add_parameter(f32({3, 8}));
  ValueRef strided = g.add(OpKind::Slice, {x}, {std::vector<int64_t>{0, 0}, std::vector<int64_t>{3, 8},
                                                std::vector<int64_t>{1, 2}});  // [3, 4], columns 2 apart
  ValueRef y = g.add_parameter(f32({2, 4, 4}));
  ValueRef p = g.add(OpKind::Matmul, {y, y});
  g.outputs = {g.add(OpKind::Matmul, {strided, g.add_parameter(f32({4, 2}))}), p,
               g.add(OpKind::Permute, {p}, {std::vector<int64_t>{1, 0, 2}})};
  EXPECT_EQ(ir::to_text(views_into_gemm(g)), ir::to_text(g));
}

TEST(ViewsIntoGemm, TheShapeRuleRefusesViewsOutsideTheOperandOrUnreadable) {
  Graph g;
  ValueRef x = g.add_parameter(f32({4, 4}));
  EXPECT_THROW(g.add(OpKind::GemmView, {x, x}, {std::vector<int64_t>{1, 4, 4, 4, 1}, std::vector<int64_t>{0, 4, 4, 4, 1},
                                               std::vector<int64_t>{}}),
               Error);  // reaches element 16 of 16
  EXPECT_THROW(g.add(OpKind::GemmView, {x, x}, {std::vector<int64_t>{0, 2, 2, 2, 2}, std::vector<int64_t>{0, 2, 4, 2, 1},
                                               std::vector<int64_t>{}}),
               Error);  // neither rows nor columns adjacent
  EXPECT_THROW(g.add(OpKind::GemmView, {x, x}, {std::vector<int64_t>{0, 4, 4, 4, 1}, std::vector<int64_t>{0, 4, 4, 4, 1},
                                               std::vector<int64_t>{1, 0}}),
               Error);  // out_perm moves the last dim
  EXPECT_EQ(g.type(g.add(OpKind::GemmView, {x, x}, {std::vector<int64_t>{0, 2, 1, 4, 4}, std::vector<int64_t>{0, 4, 4, 4, 1},
                                                   std::vector<int64_t>{}})).shape,
            (Shape{2, 4}));  // x read transposed: rows adjacent
}

TEST(TransposesIntoGemm, LeavesProductsUsedElsewhereAndPlainOnesAlone) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef y = g.add_parameter(f32({3, 2}));
  ValueRef p = g.add(OpKind::Matmul, {x, y});
  ValueRef bx = g.add_parameter(f32({4, 2, 3}));
  ValueRef batched = g.add(OpKind::Matmul, {bx, y});
  g.outputs = {p, transpose(g, p), batched};
  EXPECT_EQ(ir::to_text(transposes_into_gemm(g)), ir::to_text(g));
}

class GemmKernel : public ::testing::TestWithParam<std::tuple<bool, bool, int64_t>> {};

TEST_P(GemmKernel, MatchesAPlainProduct) {
  const auto [tx, ty, size] = GetParam();
  const int64_t n = size, k = size + 3, m = size + 1;
  Graph g;
  ValueRef x = g.add_parameter(tx ? f32({k, n}) : f32({n, k}));
  ValueRef y = g.add_parameter(ty ? f32({m, k}) : f32({k, m}));
  g.outputs = {g.add(OpKind::Gemm, {x, y}, {tx, ty})};
  std::vector<float> xs(static_cast<size_t>(n * k)), ys(static_cast<size_t>(k * m));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = std::cos(0.3f * static_cast<float>(i));
  std::vector<float> out(static_cast<size_t>(n * m));
  const void* in[2] = {xs.data(), ys.data()};
  void* outs[1] = {out.data()};
  compile(g)->run(in, outs);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double want = 0;
      for (int64_t p = 0; p < k; ++p)
        want += static_cast<double>(xs[tx ? p * n + i : i * k + p]) * ys[ty ? j * k + p : p * m + j];
      EXPECT_NEAR(out[i * m + j], want, 1e-4 * (1 + std::abs(want))) << i << ", " << j;
    }
}

// Size 3: 3 x 6 x 4 products (a loop); size 40: 40 x 43 x 41 (BLAS).
INSTANTIATE_TEST_SUITE_P(Flags, GemmKernel,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(3, 40)));

// Batched, with broadcast batch dims: x [2, 1, .., ..] and y [3, .., ..] give [2, 3, n, m].
class BatchedGemmKernel : public ::testing::TestWithParam<std::tuple<bool, bool, int64_t>> {};

TEST_P(BatchedGemmKernel, MatchesPlainProductsPerBatch) {
  const auto [tx, ty, size] = GetParam();
  const int64_t n = size, k = size + 3, m = size + 1;
  Graph g;
  ValueRef x = g.add_parameter(tx ? f32({2, 1, k, n}) : f32({2, 1, n, k}));
  ValueRef y = g.add_parameter(ty ? f32({3, m, k}) : f32({3, k, m}));
  g.outputs = {g.add(OpKind::Gemm, {x, y}, {tx, ty})};
  ASSERT_EQ(g.type(g.outputs[0]).shape, (Shape{2, 3, n, m}));
  std::vector<float> xs(static_cast<size_t>(2 * n * k)), ys(static_cast<size_t>(3 * k * m));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = std::cos(0.3f * static_cast<float>(i));
  std::vector<float> out(static_cast<size_t>(6 * n * m));
  const void* in[2] = {xs.data(), ys.data()};
  void* outs[1] = {out.data()};
  compile(g)->run(in, outs);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          const float* xm = xs.data() + a * n * k;
          const float* ym = ys.data() + b * k * m;
          double want = 0;
          for (int64_t p = 0; p < k; ++p)
            want += static_cast<double>(xm[tx ? p * n + i : i * k + p]) * ym[ty ? j * k + p : p * m + j];
          EXPECT_NEAR(out[((a * 3 + b) * n + i) * m + j], want, 1e-4 * (1 + std::abs(want)))
              << a << ", " << b << ", " << i << ", " << j;
        }
}

INSTANTIATE_TEST_SUITE_P(Flags, BatchedGemmKernel,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(3, 40)));

}  // namespace lazyrt::compile

namespace lazyrt::compile {

// gemm_view bounded by valid extents (its third operand, read at run time: per axis, batches,
// rows, columns, contracted elements, a valid count and a block): only the valid elements are
// computed (index i valid where i % block < count), from the valid contracted elements alone,
// and every other element of the result is 0. x's batches are read consecutively (a GEMM
// folding the batches, where it may) or transposed (one per batch).
class BoundedGemmView : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

TEST_P(BoundedGemmView, ComputesTheValidBlocksAndZerosTheRest) {
  const auto [tx, size] = GetParam();
  const int64_t b = 3, n = size, k = size + 3, m = size + 1;
  Graph g;
  ValueRef x = g.add_parameter(tx ? f32({b, k, n}) : f32({b, n, k}));
  ValueRef y = g.add_parameter(f32({k, m}));
  ValueRef e = g.add_parameter({DType::i64, {8}});
  const std::vector<int64_t> xv = tx ? std::vector<int64_t>{0, b, k * n, n, 1, k, n}
                                     : ir::StridedView::whole({b, n, k}).encode();
  g.outputs = {g.add(OpKind::GemmView, {x, y, e}, {xv, ir::StridedView::whole({k, m}).encode(), std::vector<int64_t>{}})};
  ASSERT_EQ(g.type(g.outputs[0]).shape, (Shape{b, n, m}));
  auto exe = compile(g);
  std::vector<float> xs(static_cast<size_t>(b * n * k)), ys(static_cast<size_t>(k * m));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = std::cos(0.3f * static_cast<float>(i));
  std::vector<std::vector<int64_t>> cases = {
      {-1, -1, -1, -1, -1, -1, -1, -1},          // all
      {2, -1, n - 1, -1, m - 2, -1, k - 3, -1},  // prefixes
      {3, 0, n, 0, m, 0, 0, 0},                  // nothing contracted
      {1, -1, n, -1, m, -1, k, -1},              // one batch: folded
      {0, -1, n, -1, m, -1, k, -1},              // no batch
      {5, -1, 1, -1, 99, -1, -1, -1},            // counts past the sizes
      {1, 2, 2, 3, -1, -1, 2, 4},                // blocks of batches, rows, contracted
      {-1, -1, 1, 2, 1, 2, 3, 5},                // blocks of rows, columns, contracted
      {-1, 2, -1, 2, 2, -1, -1, 3},              // whole blocks (all valid) beside a bound column
  };
  // And seeded random ones: per axis a count from -1 to past the size, a block likewise.
  std::mt19937 rng(static_cast<unsigned>(size) * 2 + (tx ? 1 : 0));
  for (int r = 0; r < 40; ++r) {
    std::vector<int64_t> ext;
    for (int64_t extent : {b, n, m, k})
      for (int j = 0; j < 2; ++j) ext.push_back(static_cast<int64_t>(rng() % static_cast<unsigned>(extent + 3)) - 1);
    cases.push_back(ext);
  }
  for (const std::vector<int64_t>& ext : cases) {
    SCOPED_TRACE(::testing::PrintToString(ext));
    auto valid = [&](int64_t i, int64_t axis, int64_t size_of) {
      const int64_t count = ext[2 * axis], block = ext[2 * axis + 1] > 0 ? ext[2 * axis + 1] : size_of;
      return count < 0 || i % block < count;
    };
    std::vector<float> out(static_cast<size_t>(b * n * m), NAN);
    const void* in[3] = {xs.data(), ys.data(), ext.data()};
    void* outs[1] = {out.data()};
    exe->run(in, outs);
    for (int64_t a = 0; a < b; ++a)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          double want = 0;
          if (valid(a, 0, b) && valid(i, 1, n) && valid(j, 2, m))
            for (int64_t p = 0; p < k; ++p)
              if (valid(p, 3, k))
                want += static_cast<double>(xs[static_cast<size_t>(a * n * k + (tx ? p * n + i : i * k + p))]) *
                        ys[static_cast<size_t>(p * m + j)];
          EXPECT_NEAR(out[static_cast<size_t>((a * n + i) * m + j)], want, 1e-4 * (1 + std::abs(want)))
              << a << ", " << i << ", " << j;
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, BoundedGemmView, ::testing::Combine(::testing::Bool(), ::testing::Values(3, 40)));

// A bucket graph's bounded gemm_view reading its operands whole: views_into_gemm reads through
// a transpose of a reshape merging batch dims (attention's heads) as it does for a matmul,
// and keeps the extents.
TEST(BoundedGemmView, ViewsIntoGemmReadsItsOperandsInPlaceAndKeepsTheExtents) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 4, 3, 5}));  // [batch, rows, heads, cols]
  ValueRef y = g.add_parameter(f32({6, 4, 7}));
  ValueRef e = g.add_parameter({DType::i64, {8}});
  ValueRef heads = g.add(OpKind::Permute, {x}, {std::vector<int64_t>{0, 2, 1, 3}});  // [2, 3, 4, 5]
  ValueRef xt = g.add(OpKind::Permute, {g.add(OpKind::Reshape, {heads}, {Shape{6, 4, 5}})}, {std::vector<int64_t>{0, 2, 1}});
  g.outputs = {g.add(OpKind::GemmView, {xt, y, e},
                     {ir::StridedView::whole({6, 5, 4}).encode(), ir::StridedView::whole({6, 4, 7}).encode(),
                      std::vector<int64_t>{}})};
  const Graph out = dead_code_elimination(views_into_gemm(g));
  const ir::Node* views = nullptr;
  for (const ir::Node& n : out.nodes)
    if (n.op == OpKind::GemmView) views = &n;
  ASSERT_TRUE(views) << ir::to_text(out);
  const ir::Node& p = *views;
  ASSERT_EQ(p.op, OpKind::GemmView) << ir::to_text(out);
  ASSERT_EQ(p.operands.size(), 3u);
  EXPECT_EQ(out.node(p.operands[0]).op, OpKind::Parameter) << ir::to_text(out);  // x itself, transposed in place
  EXPECT_EQ(out.node(p.operands[2]).op, OpKind::Parameter);
  EXPECT_EQ(out.type(out.outputs[0]).shape, (Shape{6, 5, 7}));
  for (const ir::Node& n : out.nodes) EXPECT_NE(n.op, OpKind::Permute) << ir::to_text(out);
}

TEST(BoundedGemmView, TheShapeRuleTakesOnlyI64ExtentsOfEight) {
  Graph g;
  ValueRef x = g.add_parameter(f32({4, 4}));
  const std::vector<int64_t> v = ir::StridedView::whole({4, 4}).encode();
  const ir::Attrs attrs{v, v, std::vector<int64_t>{}};
  EXPECT_THROW(g.add(OpKind::GemmView, {x, x, g.add_parameter({DType::i64, {4}})}, attrs), Error);
  EXPECT_THROW(g.add(OpKind::GemmView, {x, x, g.add_parameter({DType::i32, {8}})}, attrs), Error);
  EXPECT_THROW(g.add(OpKind::GemmView, {x}, attrs), Error);
  EXPECT_EQ(g.type(g.add(OpKind::GemmView, {x, x, g.add_parameter({DType::i64, {8}})}, attrs)).shape, (Shape{4, 4}));
}

}  // namespace lazyrt::compile
