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

/// A scan over the rows of xs f32[n, 3]: carry c f32[3] becomes c + x; each row's output is
/// c * 2 (f32[3]), stacked to f32[n, 3]. Results: the final carry, then the stacked outputs.
inline ir::ValueRef add_running_sum_scan(ir::Graph& g, ir::ValueRef init, ir::ValueRef xs) {
  using ir::OpKind;
  const int64_t n = g.type(xs).shape[0];
  auto body = std::make_shared<ir::Graph>();
  const ir::ValueRef c = body->add_parameter(f32({3}));
  const ir::ValueRef x = body->add_parameter(f32({3}));
  body->outputs = {body->add(OpKind::Add, {c, x}), body->add(OpKind::Mul, {c, body->add_full(2, {}, DType::f32)})};
  ir::ValueRef s = g.add(OpKind::Scan, {init, xs},
                         {int64_t{1}, int64_t{1}, n, false, std::vector<int64_t>{static_cast<int64_t>(DType::f32)},
                          std::vector<int64_t>{1, 3}});
  g.nodes[s.node].regions = {body};
  return s;
}

/// A scan_vjp over the rows of xs f32[n, 3], with the forward c + x from init c0 f32[3]
/// rebuilt from 2 stored states; the backward carry g f32[3] becomes g * 2 and each row's
/// output is g + c (the forward carry at that row). Results: the final g, the stacked outputs.
inline ir::ValueRef add_scan_vjp(ir::Graph& g, ir::ValueRef g0, ir::ValueRef xs, ir::ValueRef c0) {
  using ir::OpKind;
  const int64_t n = g.type(xs).shape[0];
  auto vjp = std::make_shared<ir::Graph>();
  const ir::ValueRef gp = vjp->add_parameter(f32({3}));
  const ir::ValueRef cp = vjp->add_parameter(f32({3}));
  vjp->add_parameter(f32({3}));  // the row of xs, unused
  vjp->outputs = {vjp->add(OpKind::Mul, {gp, vjp->add_full(2, {}, DType::f32)}), vjp->add(OpKind::Add, {gp, cp})};
  auto fwd = std::make_shared<ir::Graph>();
  const ir::ValueRef c = fwd->add_parameter(f32({3}));
  fwd->outputs = {fwd->add(OpKind::Add, {c, fwd->add_parameter(f32({3}))})};
  const auto f32_code = static_cast<int64_t>(DType::f32);
  ir::ValueRef s = g.add(OpKind::ScanVjp, {g0, xs, c0},
                         {int64_t{1}, int64_t{1}, n, false, std::vector<int64_t>{f32_code}, std::vector<int64_t>{1, 3},
                          int64_t{1}, int64_t{1}, int64_t{0}, int64_t{2}});
  g.nodes[s.node].regions = {vjp, fwd};
  return s;
}

/// The attributes of an elementwise fusion (no reduced dims) with these results.
inline ir::Attrs plain_fusion(const std::vector<ir::TensorType>& results) {
  std::vector<int64_t> dtypes;
  for (const auto& t : results) dtypes.push_back(static_cast<int64_t>(t.dtype));
  const std::vector<int64_t> per_row(results.size(), 0);
  return {results.at(0).shape, std::move(dtypes), int64_t{0}, per_row};
}

/// A fusion node over [2, 3]: p = x * 2 and s = p + b with b f32[3] broadcast; results p, s.
inline ir::ValueRef add_scale_shift_fusion(ir::Graph& g, ir::ValueRef x, ir::ValueRef b) {
  using ir::OpKind;
  auto region = std::make_shared<ir::Graph>();
  const ir::ValueRef rx = region->add_parameter(f32({2, 3}));
  const ir::ValueRef rb = region->add_parameter(f32({3}));
  const ir::ValueRef p = region->add(OpKind::Mul, {rx, region->add_full(2, {}, DType::f32)});
  region->outputs = {p, region->add(OpKind::Add, {p, rb})};
  ir::ValueRef f = g.add(OpKind::Fusion, {x, b}, plain_fusion({f32({2, 3}), f32({2, 3})}));
  g.nodes[f.node].regions = {region};
  return f;
}

/// The region of a call over x f32[2, 3] and b f32[3]: results x * 2 + b and x - b.
inline ir::Graph scale_shift_region() {
  using ir::OpKind;
  ir::Graph r;
  const ir::ValueRef x = r.add_parameter(f32({2, 3}));
  const ir::ValueRef b = r.add_parameter(f32({3}));
  r.outputs = {r.add(OpKind::Add, {r.add(OpKind::Mul, {x, r.add_full(2, {}, DType::f32)}), b}),
               r.add(OpKind::Sub, {x, b})};
  return r;
}

/// A call of `region` over x and b; its results are the region's outputs.
inline ir::ValueRef add_call(ir::Graph& g, std::shared_ptr<const ir::Graph> region, ir::ValueRef x, ir::ValueRef b) {
  ir::Node n;
  n.op = ir::OpKind::Call;
  n.operands = {x, b};
  for (ir::ValueRef v : region->outputs) n.results.push_back(region->type(v));
  n.regions = {std::move(region)};
  g.nodes.push_back(std::move(n));
  return {static_cast<int32_t>(g.nodes.size() - 1), 0};
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
  // The plain elementwise rows of the op table (lazyrt/ops.def's api column), by row.
#define LAZYRT_ROW_Public(Enum, operands)
#define LAZYRT_ROW_Internal(Enum, operands)
#define LAZYRT_ROW_Unary(Enum, operands) \
  outs.push_back(operands == 1 ? g.add(OpKind::Enum, {a}) : g.add(OpKind::Enum, {a, b}));
#define LAZYRT_ROW_UnaryFloat LAZYRT_ROW_Unary
#define LAZYRT_ROW_Arith LAZYRT_ROW_Unary
#define LAZYRT_ROW_ArithFloat LAZYRT_ROW_Unary
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_ROW_##api(Enum, operands)
#include "lazyrt/ops.def"
#undef OP
#undef LAZYRT_ROW_Public
#undef LAZYRT_ROW_Internal
#undef LAZYRT_ROW_Unary
#undef LAZYRT_ROW_UnaryFloat
#undef LAZYRT_ROW_Arith
#undef LAZYRT_ROW_ArithFloat
  outs.push_back(g.add(OpKind::LogicalNot, {mask}));
  outs.push_back(g.add(OpKind::Cast, {a}, {DType::i64}));
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Pow})
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
  outs.push_back(g.add(OpKind::StopGradient, {a}));
  outs.push_back(add_count_up_loop(g, g.add_full(0, {}, DType::i64), 10));
  const ir::ValueRef scanned = add_running_sum_scan(g, g.add(OpKind::Sum, {a}, {std::vector<int64_t>{0}, false}), a);
  outs.push_back(scanned);
  outs.push_back({scanned.node, 1});
  const ir::ValueRef row_sum = g.add(OpKind::Sum, {a}, {std::vector<int64_t>{0}, false});
  const ir::ValueRef vjp = add_scan_vjp(g, row_sum, a, row_sum);
  outs.push_back(vjp);
  outs.push_back({vjp.node, 1});
  // Math, reductions and normalizations.
  outs.push_back(g.add(OpKind::Silu, {a}));
  outs.push_back(g.add(OpKind::Gelu, {a}, {true}));
  outs.push_back(g.add(OpKind::Softplus, {a}, {1.0, 20.0}));
  outs.push_back(g.add(OpKind::Clamp, {a, b, b}, {true, false}));
  using Ints = std::vector<int64_t>;
  outs.push_back(g.add(OpKind::Prod, {a}, {Ints{1}, false}));
  outs.push_back(g.add(OpKind::Var, {a}, {Ints{1}, false, 1.0}));
  outs.push_back(g.add(OpKind::Std, {a}, {Ints{0, 1}, true, 0.0}));
  outs.push_back(g.add(OpKind::Norm, {a}, {Ints{1}, false, 2.0}));
  outs.push_back(g.add(OpKind::ArgMax, {a}, {int64_t{1}, false}));
  outs.push_back(g.add(OpKind::ArgMin, {a}, {int64_t{0}, true}));
  outs.push_back(g.add(OpKind::Softmax, {a}, {int64_t{1}}));
  outs.push_back(g.add(OpKind::LogSoftmax, {a}, {int64_t{0}}));
  outs.push_back(g.add(OpKind::Cumsum, {a}, {int64_t{1}, true}));
  outs.push_back(g.add(OpKind::Cumprod, {a}, {int64_t{0}}));
  outs.push_back(g.add(OpKind::CumprodBackward, {a, a}, {int64_t{1}}));
  outs.push_back(g.add(OpKind::Sort, {a}, {int64_t{1}, true, int64_t{2}}));
  // Data movement and indexing.
  const ir::ValueRef idx1 = g.add_parameter({DType::i64, {2}});
  const ir::ValueRef idx2 = g.add_parameter({DType::i64, {2, 3}});
  outs.push_back(g.add(OpKind::Slice, {a}, {Ints{0, 0}, Ints{2, 3}, Ints{1, 2}}));
  outs.push_back(g.add(OpKind::Pad, {a}, {Ints{0, 1}, Ints{1, 0}, Ints{0, 1}, 0.5}));
  outs.push_back(g.add(OpKind::Flip, {a}, {Ints{1}}));
  outs.push_back(g.add(OpKind::Concat, {a, b}, {int64_t{0}}));
  outs.push_back(g.add(OpKind::IndexSelect, {a, idx1}, {int64_t{1}}));
  outs.push_back(g.add(OpKind::Gather, {a, idx2}, {int64_t{1}}));
  outs.push_back(g.add(OpKind::Scatter, {a, idx2, b}, {int64_t{1}}));
  outs.push_back(g.add(OpKind::ScatterAdd, {a, idx2, b}, {int64_t{1}}));
  outs.push_back(g.add(OpKind::IndexAdd, {a, idx1, g.add_parameter(f32({2, 2}))}, {int64_t{1}}));
  outs.push_back(g.add(OpKind::Check, {a, g.add_parameter({DType::b8, {2}})},
                       {static_cast<int64_t>(ir::CheckKind::BernoulliProbability)}));
  // Convolution and pooling, with their backward ops.
  const ir::ValueRef x = g.add_parameter(f32({1, 2, 4, 4}));
  const ir::ValueRef w = g.add_parameter(f32({3, 2, 3, 3}));
  const Ints one{1, 1}, two{2, 2}, zero{0, 0};
  const ir::ValueRef y = g.add(OpKind::Conv2d, {x, w}, {one, one, one, int64_t{1}});
  outs.push_back(y);
  outs.push_back(g.add(OpKind::Conv2dBackwardInput, {y, w}, {Ints{1, 2, 4, 4}, one, one, one, int64_t{1}}));
  outs.push_back(g.add(OpKind::Conv2dBackwardWeight, {y, x}, {Ints{3, 2, 3, 3}, one, one, one, int64_t{1}}));
  const ir::ValueRef p = g.add(OpKind::MaxPool2d, {x}, {two, two, zero, one, false});
  outs.push_back(p);
  outs.push_back(g.add(OpKind::MaxPool2dBackward, {p, x}, {two, two, zero, one, false}));
  outs.push_back(g.add(OpKind::MaxPool2dIndices, {x}, {two, two, zero, one, false}));
  const ir::ValueRef q = g.add(OpKind::AvgPool2d, {x}, {two, two, zero, false, true, int64_t{0}});
  outs.push_back(q);
  outs.push_back(g.add(OpKind::AvgPool2dBackward, {q}, {Ints{1, 2, 4, 4}, two, two, zero, false, true, int64_t{0}}));
  // Random numbers from a seed and an offset.
  const ir::ValueRef seed = g.add_parameter({DType::i64, {}});
  outs.push_back(g.add(OpKind::Random, {seed, g.add_parameter({DType::i64, {}})}, {int64_t{1}, Ints{2, 2}, DType::f32}));
  // 0..4 as f32 (arange).
  outs.push_back(g.add(OpKind::Iota, {}, {Ints{5}, DType::f32}));
  // A product with both operands read transposed: [3, 2]^T x [2, 3]^T.
  outs.push_back(g.add(OpKind::Gemm, {g.add_parameter(f32({3, 2})), g.add_parameter(f32({2, 3}))},
                       {true, true}));
  // Products of views: [2, 3] rows 4 apart (from offset 1) x a [3, 2] transposed view, written
  // with the batch dims swapped.
  const ir::ValueRef src = g.add_parameter(f32({2, 2, 12}));
  outs.push_back(g.add(OpKind::GemmView, {src, src},
                       {Ints{1, 2, 24, 2, 4, 3, 1}, Ints{0, 3, 1, 2, 3}, Ints{}}));
  outs.push_back(g.add(OpKind::GemmView, {src, src},
                       {Ints{0, 2, 24, 2, 12, 2, 4, 3, 1}, Ints{0, 3, 1, 2, 3}, Ints{1, 0, 2, 3}}));
  // A fusion of two elementwise ops.
  const ir::ValueRef f = add_scale_shift_fusion(g, a, g.add_parameter(f32({3})));
  outs.push_back(f);
  outs.push_back({f.node, 1});
  // A call of a function of two results.
  const ir::ValueRef call = add_call(g, ir::seal(scale_shift_region()), a, g.add_parameter(f32({3})));
  outs.push_back(call);
  outs.push_back({call.node, 1});
  // Collectives over a group of 2, chained by their tokens.
  const ir::ValueRef token = g.add_full(0, {}, DType::b8);
  const ir::ValueRef reduced = g.add(OpKind::AllReduce, {a, token}, {int64_t{1}, int64_t{2}, int64_t{0}});
  const ir::ValueRef gathered = g.add(OpKind::AllGather, {reduced, {reduced.node, 1}}, {int64_t{2}, int64_t{0}});
  const ir::ValueRef scattered =
      g.add(OpKind::ReduceScatter, {gathered, {gathered.node, 1}}, {int64_t{2}, int64_t{2}, int64_t{0}});
  const ir::ValueRef broadcast = g.add(OpKind::Broadcast, {scattered, {scattered.node, 1}}, {int64_t{1}, int64_t{2}, int64_t{0}});
  for (ir::ValueRef v : {reduced, gathered, scattered, broadcast}) outs.push_back(v);
  outs.push_back({broadcast.node, 1});
  g.outputs = outs;
  return g;
}

}  // namespace lazyrt::testing
