// Each pass alone on a hand-built graph, checked as text before and after.
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "compile/compile.h"
#include "compile/passes.h"
#include "support/elementwise_ops.h"
#include "support/graphs.h"
#include "support/run_graph.h"

namespace lazyrt::compile {
using ir::Graph;
using ir::OpKind;
using ir::ValueRef;
using lazyrt::testing::f32;

TEST(InlineCalls, ACallBecomesItsRegionOverItsOperandsAndNestedCallsToo) {
  // The outer region calls the inner one and negates its first result.
  auto inner = ir::seal(lazyrt::testing::scale_shift_region());
  Graph outer;
  {
    ValueRef x = outer.add_parameter(f32({2, 3}));
    ValueRef b = outer.add_parameter(f32({3}));
    ValueRef c = lazyrt::testing::add_call(outer, inner, x, b);
    outer.outputs = {outer.add(OpKind::Neg, {c}), {c.node, 1}};
  }
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef b = g.add_parameter(f32({3}));
  ValueRef twice = lazyrt::testing::add_call(g, ir::seal(outer), g.add(OpKind::Exp, {x}), b);
  g.outputs = {{twice.node, 1}, lazyrt::testing::add_call(g, inner, x, b)};
  ir::verify(g);
  const Graph inlined = inline_calls(g);
  ir::verify(inlined);
  EXPECT_EQ(ir::to_text(inlined),
            "%0 = parameter {index=0} : f32[2, 3]\n"
            "%1 = parameter {index=1} : f32[3]\n"
            "%2 = exp(%0) : f32[2, 3]\n"
            "%3 = full {value=2, shape=[], dtype=f32} : f32[]\n"
            "%4 = mul(%2, %3) : f32[2, 3]\n"
            "%5 = add(%4, %1) : f32[2, 3]\n"
            "%6 = sub(%2, %1) : f32[2, 3]\n"
            "%7 = neg(%5) : f32[2, 3]\n"
            "%8 = full {value=2, shape=[], dtype=f32} : f32[]\n"
            "%9 = mul(%0, %8) : f32[2, 3]\n"
            "%10 = add(%9, %1) : f32[2, 3]\n"
            "%11 = sub(%0, %1) : f32[2, 3]\n"
            "return %6, %10\n");
}

TEST(DeadCodeElimination, DropsNodesNoOutputReads) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2}));
  ValueRef dead = g.add(OpKind::Exp, {x});
  g.add(OpKind::Neg, {dead});
  ValueRef live = g.add(OpKind::Abs, {x});
  g.outputs = {live};
  EXPECT_EQ(ir::to_text(g),
            "%0 = parameter {index=0} : f32[2]\n"
            "%1 = exp(%0) : f32[2]\n"
            "%2 = neg(%1) : f32[2]\n"
            "%3 = abs(%0) : f32[2]\n"
            "return %3\n");
  EXPECT_EQ(ir::to_text(dead_code_elimination(g)),
            "%0 = parameter {index=0} : f32[2]\n"
            "%1 = abs(%0) : f32[2]\n"
            "return %1\n");
}

TEST(CommonSubexpressionElimination, MergesEqualNodesAndCommutedOperands) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2}));
  ValueRef y = g.add_parameter(f32({2}));
  ValueRef a = g.add(OpKind::Add, {x, y});
  ValueRef b = g.add(OpKind::Add, {y, x});
  ValueRef c = g.add(OpKind::Sub, {x, y});
  ValueRef d = g.add(OpKind::Sub, {y, x});
  ValueRef one = g.add_full(1, {}, DType::f32);
  ValueRef one2 = g.add_full(1, {}, DType::f32);
  g.outputs = {g.add(OpKind::Mul, {a, one}), g.add(OpKind::Mul, {b, one2}), c, d};
  EXPECT_EQ(ir::to_text(common_subexpression_elimination(g)),
            "%0 = parameter {index=0} : f32[2]\n"
            "%1 = parameter {index=1} : f32[2]\n"
            "%2 = add(%0, %1) : f32[2]\n"
            "%3 = sub(%0, %1) : f32[2]\n"
            "%4 = sub(%1, %0) : f32[2]\n"
            "%5 = full {value=1, shape=[], dtype=f32} : f32[]\n"
            "%6 = mul(%2, %5) : f32[2]\n"
            "return %6, %6, %3, %4\n");
}

TEST(CommonSubexpressionElimination, AReductionWithTheDimsKeptAndDroppedIsComputedOnce) {
  // PyTorch's batch-norm decomposition takes a batch's variance both ways; a different
  // correction, other dims or another op are other values.
  Graph g;
  ValueRef x = g.add_parameter(f32({4, 3, 2}));
  auto var = [&](std::vector<int64_t> dims, bool keep, double correction) {
    return g.add(OpKind::Var, {x}, {std::move(dims), keep, correction});
  };
  ValueRef kept = var({0, 2}, true, 0);
  ValueRef dropped = var({0, 2}, false, 0);
  ValueRef unbiased = var({0, 2}, false, 1);
  ValueRef other_dims = var({0}, false, 0);
  ValueRef sum_kept = g.add(OpKind::Sum, {x}, {std::vector<int64_t>{2}, true});
  ValueRef sum_dropped = g.add(OpKind::Sum, {x}, {std::vector<int64_t>{2}, false});
  ValueRef mean_dropped = g.add(OpKind::Mean, {x}, {std::vector<int64_t>{2}, false});
  g.outputs = {kept, dropped, unbiased, other_dims, sum_dropped, sum_kept, mean_dropped};
  EXPECT_EQ(ir::to_text(common_subexpression_elimination(g)),
            "%0 = parameter {index=0} : f32[4, 3, 2]\n"
            "%1 = var(%0) {dims=[0, 2], keepdim=true, correction=0} : f32[1, 3, 1]\n"
            "%2 = reshape(%1) {shape=[3]} : f32[3]\n"
            "%3 = var(%0) {dims=[0, 2], keepdim=false, correction=1} : f32[3]\n"
            "%4 = var(%0) {dims=[0], keepdim=false, correction=0} : f32[3, 2]\n"
            "%5 = sum(%0) {dims=[2], keepdim=true} : f32[4, 3, 1]\n"
            "%6 = reshape(%5) {shape=[4, 3]} : f32[4, 3]\n"
            "%7 = mean(%0) {dims=[2], keepdim=false} : f32[4, 3]\n"
            "return %1, %2, %3, %4, %6, %5, %7\n");
}

TEST(CommonSubexpressionElimination, NeverMergesParameters) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2}));
  ValueRef y = g.add_parameter(f32({2}));
  g.outputs = {g.add(OpKind::Exp, {x}), g.add(OpKind::Exp, {y})};
  EXPECT_EQ(ir::to_text(common_subexpression_elimination(g)), ir::to_text(g));
}

TEST(ConstantFolding, EvaluatesElementwiseOpsOnConstants) {
  Graph g;
  ValueRef x = g.add_parameter(f32({3}));
  ValueRef two = g.add_full(2, {}, DType::f32);
  ValueRef three = g.add_full(3, {3}, DType::f32);
  ValueRef six = g.add(OpKind::Mul, {two, three});
  ValueRef e = g.add(OpKind::Cast, {g.add(OpKind::Sqrt, {g.add_full(16, {}, DType::f64)})}, {DType::i32});
  g.outputs = {g.add(OpKind::Add, {x, six}), e};
  EXPECT_EQ(ir::to_text(dead_code_elimination(constant_folding(g))),
            "%0 = parameter {index=0} : f32[3]\n"
            "%1 = full {value=6, shape=[3], dtype=f32} : f32[3]\n"
            "%2 = full {value=4, shape=[], dtype=i32} : i32[]\n"
            "%3 = add(%0, %1) : f32[3]\n"
            "return %3, %2\n");
}

TEST(ConstantFolding, AnEmptyResultIsAConstantButAFailingOpStillRuns) {
  // [2^31] positions broadcast to an empty [0, 2^31]: nothing of 2^31 elements is computed.
  Graph g;
  ValueRef x = g.add_parameter(f32({0, 1}));
  ValueRef pos = g.add(OpKind::Iota, {}, {std::vector<int64_t>{int64_t{1} << 31}, DType::i64});
  ValueRef wide = g.add(OpKind::Expand, {g.add(OpKind::Reshape, {pos}, {std::vector<int64_t>{1, int64_t{1} << 31}})},
                        {std::vector<int64_t>{0, int64_t{1} << 31}});
  // An index_select of an empty tensor with an index that must still be checked (torch refuses
  // an index out of range even when the result is empty).
  ValueRef idx = g.add_parameter({DType::i64, {1}});
  ValueRef sel = g.add(OpKind::IndexSelect, {x, idx}, {int64_t{1}});
  g.outputs = {wide, sel};
  EXPECT_EQ(ir::to_text(dead_code_elimination(constant_folding(g))),
            "%0 = parameter {index=0} : f32[0, 1]\n"
            "%1 = full {value=0, shape=[0, 2147483648], dtype=i64} : i64[0, 2147483648]\n"
            "%2 = parameter {index=1} : i64[1]\n"
            "%3 = index_select(%0, %2) {dim=1} : f32[0, 1]\n"
            "return %1, %3\n");
}

TEST(ConstantFolding, LeavesOpsOnParametersAlone) {
  Graph g;
  ValueRef x = g.add_parameter(f32({3}));
  g.outputs = {g.add(OpKind::Mul, {x, g.add_full(2, {}, DType::f32)})};
  EXPECT_EQ(ir::to_text(constant_folding(g)), ir::to_text(g));
}

TEST(AlgebraicSimplification, RemovesMultiplyByOneAndAddZero) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef one = g.add_full(1, {}, DType::f32);
  ValueRef zero = g.add_full(0, {}, DType::f32);
  ValueRef a = g.add(OpKind::Mul, {x, one});
  ValueRef b = g.add(OpKind::Add, {zero, a});
  ValueRef c = g.add(OpKind::Sub, {b, zero});
  g.outputs = {g.add(OpKind::Div, {c, one})};
  EXPECT_EQ(ir::to_text(dead_code_elimination(algebraic_simplification(g))),
            "%0 = parameter {index=0} : f32[2, 3]\n"
            "return %0\n");
}

TEST(AlgebraicSimplification, KeepsIdentitiesThatWouldChangeTheType) {
  Graph g;
  ValueRef x = g.add_parameter(f32({3}));
  ValueRef ones = g.add_full(1, {2, 3}, DType::f32);  // broadcasting x to [2, 3]
  g.outputs = {g.add(OpKind::Mul, {x, ones})};
  EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
}

TEST(AlgebraicSimplification, FoldsADoubleTransposeAway) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3, 4}));
  ValueRef t = g.add(OpKind::Permute, {x}, {std::vector<int64_t>{1, 0, 2}});
  ValueRef back = g.add(OpKind::Permute, {t}, {std::vector<int64_t>{1, 0, 2}});
  ValueRef rot = g.add(OpKind::Permute, {g.add(OpKind::Permute, {x}, {std::vector<int64_t>{2, 0, 1}})},
                       {std::vector<int64_t>{0, 2, 1}});
  g.outputs = {g.add(OpKind::Exp, {back}), rot};
  EXPECT_EQ(ir::to_text(dead_code_elimination(algebraic_simplification(g))),
            "%0 = parameter {index=0} : f32[2, 3, 4]\n"
            "%1 = permute(%0) {dims=[2, 1, 0]} : f32[4, 3, 2]\n"
            "%2 = exp(%0) : f32[2, 3, 4]\n"
            "return %2, %1\n");
}

TEST(AlgebraicSimplification, CollapsesReshapeChainsAndNegNeg) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 6}));
  ValueRef r = g.add(OpKind::Reshape, {g.add(OpKind::Reshape, {x}, {Shape{3, 4}})}, {Shape{12}});
  ValueRef n = g.add(OpKind::Neg, {g.add(OpKind::Neg, {x})});
  ValueRef c = g.add(OpKind::Cast, {x}, {DType::f32});
  g.outputs = {r, n, c};
  EXPECT_EQ(ir::to_text(dead_code_elimination(algebraic_simplification(g))),
            "%0 = parameter {index=0} : f32[2, 6]\n"
            "%1 = reshape(%0) {shape=[12]} : f32[12]\n"
            "return %1, %0, %0\n");
}

TEST(AlgebraicSimplification, ElementwiseOpsReadThroughAReshapeRunInItsSourceShape) {
  // Elementwise ops over [batch * tokens, features] (an exp, a bias-add), a reshape to the
  // tokens, an activation, and a reshape back for the next product. The activation moves to
  // the bias-add's shape (a [1, 1, 4] operand loses its leading 1s) and the reshapes cancel.
  Graph g;
  ValueRef x = g.add_parameter(f32({6, 4}));
  ValueRef b = g.add_parameter(f32({4}));
  ValueRef scale = g.add_parameter(f32({1, 1, 4}));
  ValueRef h = g.add(OpKind::Add, {g.add(OpKind::Exp, {x}), b});
  ValueRef act = g.add(OpKind::Gelu, {g.add(OpKind::Reshape, {h}, {Shape{2, 3, 4}})}, {false});
  ValueRef scaled = g.add(OpKind::Mul, {act, scale});
  ValueRef back = g.add(OpKind::Reshape, {scaled}, {Shape{6, 4}});
  g.outputs = {g.add(OpKind::Matmul, {back, g.add_parameter(f32({4, 2}))})};
  EXPECT_EQ(ir::to_text(dead_code_elimination(algebraic_simplification(g))),
            "%0 = parameter {index=0} : f32[6, 4]\n"
            "%1 = parameter {index=1} : f32[4]\n"
            "%2 = parameter {index=2} : f32[1, 1, 4]\n"
            "%3 = exp(%0) : f32[6, 4]\n"
            "%4 = add(%3, %1) : f32[6, 4]\n"
            "%5 = gelu(%4) {tanh=false} : f32[6, 4]\n"
            "%6 = reshape(%2) {shape=[4]} : f32[4]\n"
            "%7 = mul(%5, %6) : f32[6, 4]\n"
            "%8 = parameter {index=3} : f32[4, 2]\n"
            "%9 = matmul(%7, %8) : f32[6, 2]\n"
            "return %9\n");
}

TEST(AlgebraicSimplification, AnElementwiseOpReadOnlyThroughAReshapeRunsInTheReshapedShape) {
  // A bias-add after a product over [batch * tokens, features], reshaped back to the tokens
  // for a residual add: the bias-add moves to the tokens' shape (on a reshape of the product),
  // where it can fuse with the residual add.
  Graph g;
  ValueRef x = g.add_parameter(f32({6, 4}));
  ValueRef w = g.add_parameter(f32({4, 4}));
  ValueRef b = g.add_parameter(f32({4}));
  ValueRef res = g.add_parameter(f32({2, 3, 4}));
  ValueRef h = g.add(OpKind::Add, {g.add(OpKind::Matmul, {x, w}), b});
  g.outputs = {g.add(OpKind::Add, {res, g.add(OpKind::Reshape, {h}, {Shape{2, 3, 4}})})};
  EXPECT_EQ(ir::to_text(dead_code_elimination(algebraic_simplification(g))),
            "%0 = parameter {index=0} : f32[6, 4]\n"
            "%1 = parameter {index=1} : f32[4, 4]\n"
            "%2 = parameter {index=2} : f32[4]\n"
            "%3 = parameter {index=3} : f32[2, 3, 4]\n"
            "%4 = matmul(%0, %1) : f32[6, 4]\n"
            "%5 = reshape(%4) {shape=[2, 3, 4]} : f32[2, 3, 4]\n"
            "%6 = add(%5, %2) : f32[2, 3, 4]\n"
            "%7 = add(%3, %6) : f32[2, 3, 4]\n"
            "return %7\n");
  // A constant of the node's shape becomes the same constant in the reshaped shape.
  Graph c;
  ValueRef p = c.add(OpKind::Matmul, {c.add_parameter(f32({6, 4})), c.add_parameter(f32({4, 4}))});
  ValueRef sum = c.add(OpKind::Add, {p, c.add_full(2, {6, 4}, DType::f32)});
  c.outputs = {c.add(OpKind::Exp, {c.add(OpKind::Reshape, {sum}, {Shape{2, 3, 4}})})};
  EXPECT_EQ(ir::to_text(dead_code_elimination(algebraic_simplification(c))),
            "%0 = parameter {index=0} : f32[6, 4]\n"
            "%1 = parameter {index=1} : f32[4, 4]\n"
            "%2 = matmul(%0, %1) : f32[6, 4]\n"
            "%3 = reshape(%2) {shape=[2, 3, 4]} : f32[2, 3, 4]\n"
            "%4 = full {value=2, shape=[2, 3, 4], dtype=f32} : f32[2, 3, 4]\n"
            "%5 = add(%3, %4) : f32[2, 3, 4]\n"
            "%6 = exp(%5) : f32[2, 3, 4]\n"
            "return %6\n");
}

TEST(AlgebraicSimplification, KeepsElementwiseOpsOnReshapesItCannotMove) {
  const Shape tokens{2, 3, 4};
  auto to_tokens = [&](ValueRef source, Graph& g) { return g.add(OpKind::Reshape, {source}, {tokens}); };
  // A value made by an elementwise node from another (so it stays in its shape itself).
  auto made = [&](Graph& g, Shape s) { return g.add(OpKind::Neg, {g.add(OpKind::Exp, {g.add_parameter(f32(s))})}); };
  {  // the reshaped value is not made by an elementwise op: nothing to fuse with there
    Graph g;
    ValueRef r = to_tokens(g.add_parameter(f32({6, 4})), g);
    g.outputs = {g.add(OpKind::Abs, {g.add(OpKind::Exp, {r})})};
    EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
  }
  {  // an operand of the result's shape that is no reshape
    Graph g;
    ValueRef r = to_tokens(made(g, {6, 4}), g);
    g.outputs = {g.add(OpKind::Abs, {g.add(OpKind::Add, {r, g.add_parameter(f32(tokens))})})};
    EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
  }
  {  // reshapes of two different shapes
    Graph g;
    ValueRef r = to_tokens(made(g, {6, 4}), g);
    ValueRef q = to_tokens(made(g, {2, 12}), g);
    g.outputs = {g.add(OpKind::Abs, {g.add(OpKind::Add, {r, q})})};
    EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
  }
  {  // a broadcast operand over a dim the shapes do not share ([3, 1] reads along the tokens)
    Graph g;
    ValueRef r = to_tokens(made(g, {6, 4}), g);
    g.outputs = {g.add(OpKind::Abs, {g.add(OpKind::Mul, {r, g.add_parameter(f32({3, 1}))})})};
    EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
  }
  {  // an output keeps its shape: it is written straight into the output's buffer
    Graph g;
    ValueRef r = to_tokens(made(g, {6, 4}), g);
    g.outputs = {g.add(OpKind::Neg, {r})};
    EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
  }
  {  // read only through a reshape, but made from an elementwise node it can fuse with here
    Graph g;
    ValueRef e = g.add(OpKind::Neg, {g.add(OpKind::Exp, {g.add_parameter(f32({6, 4}))})});
    g.outputs = {g.add(OpKind::Matmul, {to_tokens(e, g), g.add_parameter(f32({4, 2}))})};
    EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
  }
  {  // read through a reshape and by another node
    Graph g;
    ValueRef e = g.add(OpKind::Exp, {g.add_parameter(f32({6, 4}))});
    g.outputs = {g.add(OpKind::Abs, {to_tokens(e, g)}), g.add(OpKind::Sum, {e}, {std::vector<int64_t>{0}, false})};
    EXPECT_EQ(ir::to_text(algebraic_simplification(g)), ir::to_text(g));
  }
}

// A chain of kDistantReader small nodes on their own parameter, so that what follows it is a
// distant reader of what came before.
ValueRef distance(Graph& g) {
  ValueRef c = g.add_parameter(f32({2}));
  for (int i = 0; i < kDistantReader; ++i) c = g.add(OpKind::Neg, {c});
  return c;
}

// The index of the only node of op `op` after node `after`, or -1.
int32_t only_after(const Graph& g, OpKind op, int32_t after) {
  int32_t found = -1;
  for (size_t i = static_cast<size_t>(after) + 1; i < g.nodes.size(); ++i)
    if (g.nodes[i].op == op) {
      if (found >= 0) return -1;
      found = static_cast<int32_t>(i);
    }
  return found;
}

TEST(Rematerialize, ADistantReaderComputesAnElementwiseChainAgainFromValuesLiveThere) {
  Graph g;
  ValueRef x = g.add_parameter(f32({128, 128}));  // 64 KiB
  ValueRef w = g.add_parameter(f32({128}));
  ValueRef t = g.add(OpKind::Exp, {x});  // read only by e: computed again too
  ValueRef e = g.add(OpKind::Mul, {t, w});
  ValueRef near = g.add(OpKind::Neg, {e});
  ValueRef chain = distance(g);
  ValueRef far = g.add(OpKind::Add, {e, x});
  g.outputs = {near, far, chain};
  const Graph r = dead_code_elimination(rematerialize_for_distant_readers(g));
  ASSERT_EQ(r.nodes.size(), g.nodes.size() + 2);
  const ir::Node& add = r.node(r.outputs[1]);
  ASSERT_EQ(add.op, OpKind::Add);
  // The add reads a mul of an exp, both made after the chain, right before it.
  const int32_t chain_end = r.outputs[2].node;
  const int32_t mul = only_after(r, OpKind::Mul, chain_end), exp = only_after(r, OpKind::Exp, chain_end);
  ASSERT_GE(mul, 0);
  ASSERT_GE(exp, 0);
  EXPECT_EQ(add.operands[0].node, mul);
  EXPECT_EQ(r.nodes[mul].operands[0].node, exp);
  EXPECT_EQ(r.nodes[exp].operands[0].node, 0);  // the parameters
  EXPECT_EQ(r.nodes[mul].operands[1].node, 1);
  // The near reader still reads the first mul.
  EXPECT_LT(r.node(r.outputs[0]).operands[0].node, chain_end);
}

TEST(Rematerialize, LeavesValuesAloneThatCannotBeMadeFromLiveValuesOrAreSmallOrNear) {
  for (int kind = 0; kind < 3; ++kind) {
    Graph g;
    ValueRef x = g.add_parameter(f32({128, 128}));
    ValueRef small = g.add_parameter(f32({8, 8}));
    ValueRef m = g.add(OpKind::Matmul, {x, x});  // not elementwise, read only by e
    ValueRef e = kind == 0 ? g.add(OpKind::Exp, {m}) : g.add(OpKind::Exp, {kind == 1 ? small : x});
    ValueRef chain = kind == 2 ? g.add(OpKind::Neg, {g.add_parameter(f32({2}))}) : distance(g);
    g.outputs = {g.add(OpKind::Neg, {e}), g.add(OpKind::Add, {e, e}), chain};
    // kind 0: e's operand is neither live at the add nor elementwise; 1: e is small; 2: the
    // add is near.
    EXPECT_EQ(ir::to_text(dead_code_elimination(rematerialize_for_distant_readers(g))),
              ir::to_text(dead_code_elimination(g)))
        << kind;
  }
}

TEST(HoistSmallReductions, AReductionThatIsItsOperandsLastReaderRunsRightAfterIt) {
  Graph g;
  ValueRef x = g.add_parameter(f32({64, 64}));
  ValueRef a = g.add(OpKind::Exp, {x});
  ValueRef b = g.add(OpKind::Neg, {a});
  ValueRef chain = distance(g);
  ValueRef s = g.add(OpKind::Sum, {a}, {std::vector<int64_t>{0}, false});  // a's last reader
  ValueRef keep = g.add(OpKind::Sum, {b}, {std::vector<int64_t>{0}, false});
  ValueRef late = g.add(OpKind::Abs, {b});  // b is read after its sum: that sum stays
  g.outputs = {s, keep, late, chain};
  const Graph h = hoist_small_reductions(g);
  ASSERT_EQ(h.nodes.size(), g.nodes.size());
  EXPECT_EQ(h.outputs[0].node, 2);  // parameter, exp, then the sum of exp
  EXPECT_EQ(h.node(h.outputs[0]).op, OpKind::Sum);
  EXPECT_EQ(h.outputs[1].node, keep.node);
  EXPECT_EQ(h.outputs[2].node, late.node);
  // Nothing else moved: the chain keeps its order behind the hoisted sum.
  EXPECT_EQ(h.outputs[3].node, chain.node + 1);
}

TEST(Optimize, KeepsParameterCountAndOutputOrder) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2}));
  g.add_parameter(f32({5}));  // unused
  g.outputs = {g.add(OpKind::Mul, {x, g.add_full(1, {}, DType::f32)}), g.add(OpKind::Exp, {x})};
  Graph o = optimize(g);
  EXPECT_EQ(o.num_params, 2);
  ASSERT_EQ(o.outputs.size(), 2u);
  EXPECT_EQ(o.node(o.outputs[0]).op, OpKind::Parameter);
  EXPECT_EQ(o.node(o.outputs[1]).op, OpKind::Exp);
  EXPECT_NO_THROW(ir::verify(o));
}

// Folding evaluates with the ops' scalar functions, not a kernel: on random values (zeros,
// infinities and NaNs among them) of every dtype each op takes, the folded constant of every
// elementwise op (each attribute variant, cast to every dtype, where) has the bits of the
// reference backend's one-op kernel on the same values.
TEST(ConstantFolding, FoldsEveryElementwiseOpToTheKernelsBitsOnRandomValues) {
  const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i64, DType::i32, DType::b8};
  struct Case {
    OpKind op;
    ir::Attrs attrs;
    int arity;
  };
  std::vector<Case> cases;
  for (OpKind op : lazyrt::testing::table_ops())
    for (const ir::Attrs& a : lazyrt::testing::attr_variants(op)) cases.push_back({op, a, ir::op_info(op).operands});
  for (DType to : dtypes) cases.push_back({OpKind::Cast, {to}, 1});
  cases.push_back({OpKind::Where, {}, 3});
  std::mt19937 rng(20261207);
  const backend::Backend& reference = backend::get("reference");
  constexpr int64_t kValues = 48;
  int compared = 0, unfolded = 0;
  for (const Case& c : cases)
    for (DType dt : dtypes) {
      std::vector<ir::TensorType> in_types;
      for (int k = 0; k < c.arity; ++k) in_types.push_back({c.op == OpKind::Where && k == 0 ? DType::b8 : dt, {kValues}});
      Graph run;
      std::vector<ValueRef> params;
      for (const ir::TensorType& t : in_types) params.push_back(run.add_parameter(t));
      try {
        run.outputs = {run.add(c.op, params, c.attrs)};
      } catch (const Error&) {
        continue;  // the op's type rule refuses this dtype
      }
      const ir::TensorType out = run.type(run.outputs[0]);
      const auto inputs = lazyrt::testing::random_inputs(run, rng);
      const auto ran = lazyrt::testing::run_graph(*compile::compile(run, {}, reference), inputs);
      std::vector<char> folded(out.bytes());
      for (int64_t i = 0; i < kValues; ++i) {
        Graph g;
        std::vector<ValueRef> consts;
        for (size_t k = 0; k < in_types.size(); ++k)
          visit_dtype(in_types[k].dtype, [&](auto tag) {
            using T = decltype(tag);
            consts.push_back(g.add_full(static_cast<double>(convert<double>(reinterpret_cast<const T*>(inputs[k].data())[i])),
                                        {}, in_types[k].dtype));
          });
        g.outputs = {g.add(c.op, consts, c.attrs)};
        const Graph f = constant_folding(g);
        const ir::Node& n = f.node(f.outputs[0]);
        visit_dtype(out.dtype, [&](auto tag) {
          using T = decltype(tag);
          const T kernel = reinterpret_cast<const T*>(ran[0].data())[i];
          if (n.op == OpKind::Full) {
            reinterpret_cast<T*>(folded.data())[i] = convert<T>(ir::NodeAttrs(n.op, n.attrs).f<"value">());
          } else {
            // Left unfolded only where a full node's double cannot hold the result (an i64
            // power past 2^53): the op then runs.
            const double d = static_cast<double>(convert<double>(kernel));
            bool inexact = false;
            if constexpr (std::is_integral_v<T>) inexact = d >= 0x1p63 || convert<T>(d) != kernel;
            EXPECT_TRUE(out.dtype == DType::i64 && inexact)
                << ir::op_name(c.op) << " of " << dtype_name(dt) << " was not folded";
            reinterpret_cast<T*>(folded.data())[i] = kernel;
            ++unfolded;
          }
        });
      }
      EXPECT_EQ(lazyrt::testing::mismatches(out.dtype, folded, ran[0]), 0)
          << ir::op_name(c.op) << " of " << dtype_name(dt) << ": folded constants differ from the kernel's results";
      ++compared;
    }
  EXPECT_GT(compared, 150);  // every op with every dtype it takes
  // The branch above, taken for sure: 3^39 (odd, past 2^53: no double holds it) is left to run.
  Graph g;
  g.outputs = {g.add(OpKind::Pow, {g.add_full(3, {}, DType::i64), g.add_full(39, {}, DType::i64)})};
  const Graph f = constant_folding(g);
  EXPECT_EQ(f.node(f.outputs[0]).op, OpKind::Pow);
  (void)unfolded;  // how many random i64 powers came past 2^53 depends on the draws
}

}  // namespace lazyrt::compile
