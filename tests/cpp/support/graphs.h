// Small hand-built graphs shared by the IR and compile tests.
#pragma once

#include <memory>

#include "ir/graph.h"

namespace lazyrt::testing {

inline ir::TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

/// A loop counting an i64 scalar up to `limit`: while (x < limit) x = x + 1.
inline ir::ValueRef add_count_up_loop(ir::Graph& g, ir::ValueRef init, int64_t limit) {
  using ir::OpKind;
  const ir::TensorType i64_scalar{DType::i64, {}};
  auto cond = std::make_shared<ir::Graph>();
  cond->outputs = {cond->add(OpKind::Lt, {cond->add_parameter(i64_scalar),
                                          cond->add_full(static_cast<double>(limit), {}, DType::i64)})};
  auto body = std::make_shared<ir::Graph>();
  body->outputs = {body->add(OpKind::Add, {body->add_parameter(i64_scalar),
                                           body->add_full(1, {}, DType::i64)})};
  ir::ValueRef w = g.add(OpKind::While, {init}, {int64_t{1}});
  g.nodes[w.node].regions = {cond, body};
  return w;
}

/// One graph that uses every op of ops.def and every attribute kind; all values are outputs.
inline ir::Graph every_op_graph() {
  using ir::OpKind;
  ir::Graph g;
  const ir::ValueRef a = g.add_parameter(f32({2, 3}));
  const ir::ValueRef b = g.add_parameter(f32({2, 3}));
  const ir::ValueRef mask = g.add_parameter({DType::b8, {2, 3}});
  const ir::ValueRef m = g.add_parameter(f32({3, 4}));
  std::vector<ir::ValueRef> outs;
  outs.push_back(g.add_full(1.5, {2, 3}, DType::f32));
  for (OpKind op : {OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt,
                    OpKind::Relu, OpKind::Sigmoid, OpKind::Tanh, OpKind::IsNan})
    outs.push_back(g.add(op, {a}));
  outs.push_back(g.add(OpKind::LogicalNot, {mask}));
  outs.push_back(g.add(OpKind::Cast, {a}, {DType::i64}));
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow, OpKind::Maximum,
                    OpKind::Minimum, OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt,
                    OpKind::Ge})
    outs.push_back(g.add(op, {a, b}));
  outs.push_back(g.add(OpKind::LogicalAnd, {mask, mask}));
  outs.push_back(g.add(OpKind::LogicalOr, {mask, mask}));
  outs.push_back(g.add(OpKind::Where, {mask, a, b}));
  outs.push_back(g.add(OpKind::Sum, {a}, {std::vector<int64_t>{1}, false}));
  outs.push_back(g.add(OpKind::Mean, {a}, {std::vector<int64_t>{0, 1}, true}));
  outs.push_back(g.add(OpKind::Amax, {a}, {std::vector<int64_t>{0}, false}));
  outs.push_back(g.add(OpKind::Amin, {a}, {std::vector<int64_t>{}, false}));
  outs.push_back(g.add(OpKind::Matmul, {a, m}));
  outs.push_back(g.add(OpKind::Permute, {a}, {std::vector<int64_t>{1, 0}}));
  outs.push_back(g.add(OpKind::Reshape, {a}, {std::vector<int64_t>{3, 2}}));
  outs.push_back(g.add(OpKind::Expand, {a}, {std::vector<int64_t>{4, 2, 3}}));
  outs.push_back(add_count_up_loop(g, g.add_full(0, {}, DType::i64), 10));
  g.outputs = outs;
  return g;
}

}  // namespace lazyrt::testing
