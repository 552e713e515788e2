// while_loop, fori_loop and scan: trace the regions once over placeholders, capture what they
// use from outside, and record one while (or scan) node.
//
// Bodies are traced without recording for autograd (autograd::BodyTrace): a body is a function
// of its placeholders and captures, and what it computes is differentiated, if at all, as a
// whole; detach() and no_grad inside it leave stop_gradient nodes in its graph. A scan whose inputs (init,
// xs, or tensors the body reads from outside) require grad records one autograd node for all
// its results; its backward is a scan too, over the rows in the other order, whose body is the
// vector-Jacobian product of the forward body, made by running the forward body's graph again
// through the ops with gradients on (apply_graph) and differentiating it (autograd::grad). The
// forward scan stacks the carries each row starts from as extra outputs, so every row's
// product starts from its own inputs (memory: one carry per row), or with `snapshots` a
// scan_vjp node rebuilds them by binomial checkpointing. A differentiated while_loop or
// fori_loop stays a while node: the backward is a scan_vjp whose length is counted when it
// runs (a counter carry of the while, or upper - lower from the bounds, which are inputs), so
// one executable serves every trip count; it rebuilds the carries from the initial ones, every
// one with snapshots 0 (one more forward pass than a scan that stacks them as it goes, whose
// stacked rows would fix the count in the graph).
//
// A call (loops/call.h) is traced the same way: a function over placeholders in a scope of its
// own, its region extracted once per list of operand types and shared by every call node.
#include "lazyrt/loops.h"

#include <algorithm>
#include <map>

#include "autograd/autograd.h"
#include "ops/op_helpers.h"
#include "ops/random_state.h"
#include "ops/views.h"
#include "loops/call.h"
#include "trace/extract.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"

namespace lazyrt {
namespace {

using trace::LazyNode;
using trace::LazyValue;
using Regions = std::vector<std::shared_ptr<const ir::Graph>>;

// The values a loop's regions read from outside, shared by cond and body: a tensor used by
// both is captured once.
struct Captures {
  std::vector<LazyValue> values;
  std::map<std::pair<const LazyNode*, int32_t>, int32_t> index;
};

// Flattens one region of the loop traced in `scope`: its placeholders are parameters
// 0..placeholders-1, any value from outside the scope is a capture (parameter placeholders + j).
ir::Graph extract_region(const std::vector<LazyValue>& roots, int64_t scope, int64_t placeholders,
                         Captures& captures) {
  // The flattener asks once per distinct leaf value, so each parameter is made once.
  trace::Flattener flat(
      [scope](const LazyNode& n) {
        LAZYRT_CHECK(trace::scope_is_active(n.scope),
                     "a value traced inside another while_loop body is used outside of it");
        return n.scope == scope && n.op != ir::OpKind::Parameter;
      },
      [&](const LazyValue& v, trace::Flattener& f) -> ir::ValueRef {
        const LazyNode& n = *v.node;
        int64_t index;
        if (n.scope == scope && n.placeholder >= 0) {
          index = n.placeholder;
        } else {
          auto [it, fresh] = captures.index.emplace(std::make_pair(&n, v.index),
                                                    static_cast<int32_t>(captures.values.size()));
          if (fresh) captures.values.push_back(v);
          index = placeholders + it->second;
        }
        return f.emit_parameter(index, v.type());
      });
  std::vector<ir::ValueRef> outs;
  for (const LazyValue& r : roots) outs.push_back(flat.add_root(r));
  ir::Graph g = std::move(flat.graph());
  g.outputs = std::move(outs);
  return g;
}

// The types of a loop's inputs, which must be defined.
std::vector<ir::TensorType> input_types(const char* op, const char* what, const Carry& values) {
  std::vector<ir::TensorType> types;
  for (size_t k = 0; k < values.size(); ++k) {
    LAZYRT_CHECK(values[k].defined(), op, ": ", what, " ", k, " is undefined");
    types.push_back({values[k].dtype(), values[k].shape()});
  }
  return types;
}

// Through detail::value_of: a tensor that requires grad, read inside an enclosing loop's
// body, becomes one of that loop's differentiable inputs.
std::vector<LazyValue> values_of(const Carry& ts) {
  std::vector<LazyValue> v;
  for (const Tensor& t : ts) v.push_back(detail::value_of(t));
  return v;
}

bool needs_grad(const Carry& inputs) {
  if (!autograd::recording()) return false;
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const Tensor& t) { return t.requires_grad() && is_floating(t.dtype()); });
}

// The tensors standing for a loop's captured values, in parameter order: the tensor itself
// where it requires grad (so that autograd reaches it), else the data tensor of a leaf, else a
// handle on the pending value.
Carry capture_tensors(const Captures& captures, const std::vector<std::shared_ptr<trace::TensorImpl>>& grad_caps) {
  Carry out;
  for (const LazyValue& v : captures.values) {
    std::shared_ptr<trace::TensorImpl> t;
    for (const auto& g : grad_caps) {
      const LazyValue gv = g->value();
      if (gv.node == v.node && gv.index == v.index) t = g;
    }
    if (!t && v.node->op == ir::OpKind::Parameter) t = v.node->source.lock();
    out.push_back(t ? trace::tensor_of(t) : trace::tensor_of(trace::make_pending(v)));
  }
  return out;
}

void check_carry(const char* op, const Carry& init, const Carry& out, size_t offset) {
  LAZYRT_CHECK(out.size() == init.size(), op, ": the body returned ", out.size() - offset,
               " values, but init has ", init.size() - offset);
  for (size_t k = offset; k < out.size(); ++k) {
    LAZYRT_CHECK(out[k].defined(), op, ": body result ", k - offset, " is undefined");
    LAZYRT_CHECK(out[k].shape() == init[k].shape() && out[k].dtype() == init[k].dtype(), op,
                 ": body result ", k - offset, " is ", dtype_name(out[k].dtype()),
                 shape_str(out[k].shape()), ", expected ", dtype_name(init[k].dtype()),
                 shape_str(init[k].shape()), " as in init");
  }
}

// Records a region op over these operands; the regions take all of them as parameters (unless
// `as_given`: their parameters are the op's own layout).
Carry record_region_op(ir::OpKind op, const Carry& operands, ir::Attrs attrs, const Regions& regions,
                       bool as_given = false) {
  LazyValue w = trace::record(op, values_of(operands), std::move(attrs));
  for (const auto& r : regions) {
    if (as_given || r->num_params == static_cast<int64_t>(operands.size())) {
      w.node->regions.push_back(r);
    } else {
      auto g = std::make_shared<ir::Graph>(*r);
      g->num_params = static_cast<int64_t>(operands.size());
      w.node->regions.push_back(std::move(g));
    }
  }
  Carry out;
  for (size_t k = 0; k < w.node->types.size(); ++k)
    out.push_back(trace::tensor_of(trace::make_pending({w.node, static_cast<int32_t>(k)})));
  return out;
}

// ---- scan: attributes, recording, gradient -------------------------------------------------

struct ScanShape {
  int64_t carries = 0, xs = 0, length = 0;
  bool reverse = false;
  std::vector<ir::TensorType> y_rows;

  ir::Attrs attrs() const {
    std::vector<int64_t> dtypes, shapes;
    for (const ir::TensorType& t : y_rows) {
      dtypes.push_back(static_cast<int64_t>(t.dtype));
      shapes.push_back(static_cast<int64_t>(t.shape.size()));
      shapes.insert(shapes.end(), t.shape.begin(), t.shape.end());
    }
    return {carries, xs, length, reverse, std::move(dtypes), std::move(shapes)};
  }
  static ScanShape of(const ir::Node& n) {
    const ir::NodeAttrs at(n.op, n.attrs);
    ScanShape s{at.i<"carries">(), at.i<"xs">(), at.i<"length">(), at.b<"reverse">(), {}};
    for (size_t m = static_cast<size_t>(s.carries); m < n.results.size(); ++m)
      s.y_rows.push_back({n.results[m].dtype, Shape(n.results[m].shape.begin() + 1, n.results[m].shape.end())});
    return s;
  }
};

ir::TensorType type_of(const Tensor& t) { return {t.dtype(), t.shape()}; }
ir::TensorType row_of(const Tensor& t) { return {t.dtype(), Shape(t.shape().begin() + 1, t.shape().end())}; }
Shape stacked(int64_t length, const Shape& row) {
  Shape s{length};
  s.insert(s.end(), row.begin(), row.end());
  return s;
}

Carry record_scan(const Carry& operands, const ScanShape& shape, std::shared_ptr<const ir::Graph> body,
                  int64_t snapshots = 0);
Carry record_while(const Carry& operands, ir::Attrs attrs, const Regions& regions, int64_t snapshots);

// Runs `g` again through the ops (recording autograd where its inputs require grad), over
// `params`: what the graph computed, as tensors. Loops inside are recorded as loops.
Carry apply_graph(const ir::Graph& g, const Carry& params) {
  std::vector<Carry> vals(g.nodes.size());
  auto value = [&](ir::ValueRef v) { return vals[static_cast<size_t>(v.node)][static_cast<size_t>(v.index)]; };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    const ir::NodeAttrs at(n.op, n.attrs);
    if (n.op == ir::OpKind::Parameter) {
      vals[i] = {params[static_cast<size_t>(at.i<"index">())]};
      continue;
    }
    if (n.op == ir::OpKind::Full) {
      vals[i] = {detail::constant_tensor(at.f<"value">(), at.dtype<"dtype">(), at.ints<"shape">())};
      continue;
    }
    Carry ops;
    for (ir::ValueRef v : n.operands) ops.push_back(value(v));
    if (n.op == ir::OpKind::Scan) {
      vals[i] = record_scan(ops, ScanShape::of(n), n.regions[0]);
    } else if (n.op == ir::OpKind::While) {
      vals[i] = record_while(ops, n.attrs, n.regions, 0);
    } else if (n.op == ir::OpKind::Call) {
      vals[i] = apply_graph(*n.regions[0], ops);  // inlined, so that what it computes is differentiated
    } else {
      LAZYRT_ASSERT(n.regions.empty() && n.results.size() == 1, "apply_graph: cannot run ", ir::op_name(n.op));
      vals[i] = {detail::apply(n.op, ops, n.attrs)};
    }
  }
  Carry out;
  for (ir::ValueRef v : g.outputs) out.push_back(value(v));
  return out;
}

// Everything the backward of one scan needs, saved when the forward is recorded.
struct ScanGrad {
  ScanShape shape;
  std::shared_ptr<const ir::Graph> body;  // the forward body
  Carry operands;                         // init, xs, captures (snapshots)
  Carry saved;                            // the carries each row starts from, stacked, or
  int64_t snapshots = 0;                  // how many states binomial checkpointing keeps
  Tensor trips;  // where defined, the rows (i64 scalar) counted when the graph runs: a
                 // while loop's, with nothing stacked; the backward is then a scan_vjp whose
                 // snapshots 0 keeps every state

  std::vector<Tensor> backward(const std::vector<Tensor>& grads, const std::vector<bool>& needs) const;
};

// The gradients of a scan's inputs: a scan over the rows in the other order, carrying the
// gradient of the carries and of the captures, whose stacked output is the gradient of xs.
// Its rows begin with the forward carries at that row: the saved ones, or (with snapshots)
// a scan_vjp node rebuilds them from a few stored states as it goes.
std::vector<Tensor> ScanGrad::backward(const std::vector<Tensor>& grads, const std::vector<bool>& needs) const {
  const auto C = static_cast<size_t>(shape.carries), X = static_cast<size_t>(shape.xs);
  const size_t P = operands.size() - C - X, Y = shape.y_rows.size();
  const int64_t n = shape.length;
  auto floating = [&](size_t i) { return is_floating(operands[i].dtype()) && needs[i]; };
  // The inputs differentiated: float carries, xs and captures that want a gradient.
  std::vector<size_t> dc, dx, dp;
  for (size_t k = 0; k < C; ++k)
    if (is_floating(operands[k].dtype())) dc.push_back(k);  // carried through every row
  for (size_t j = 0; j < X; ++j)
    if (floating(C + j)) dx.push_back(j);
  for (size_t p = 0; p < P; ++p)
    if (floating(C + X + p)) dp.push_back(p);
  std::vector<size_t> dy;
  for (size_t m = 0; m < Y; ++m)
    if (is_floating(shape.y_rows[m].dtype)) dy.push_back(m);

  // Backward carries: the carries' gradients, then the captures' accumulated gradients.
  Carry init;
  for (size_t k : dc) init.push_back(grads[k].defined() ? grads[k] : zeros(operands[k].shape(), operands[k].dtype()));
  for (size_t p : dp) init.push_back(zeros(operands[C + X + p].shape(), operands[C + X + p].dtype()));
  // Rows: the forward carries (saved, or rebuilt), the forward's rows, the ys' gradients.
  Carry xs(operands.begin() + static_cast<int64_t>(C), operands.begin() + static_cast<int64_t>(C + X));
  for (size_t m : dy) {
    const ir::TensorType& row = shape.y_rows[m];
    xs.push_back(grads[C + m].defined() ? grads[C + m] : zeros(stacked(n, row.shape), row.dtype));
  }
  std::vector<ir::TensorType> row_types;
  for (size_t k = 0; k < C; ++k) row_types.push_back(type_of(operands[k]));
  for (const Tensor& x : xs) row_types.push_back(row_of(x));
  const Carry captures(operands.begin() + static_cast<int64_t>(C + X), operands.end());
  const size_t B = init.size(), BX = row_types.size();

  std::shared_ptr<ir::Graph> region;
  Captures extra;
  std::vector<ir::TensorType> y_rows;
  {
    trace::TraceScope scope;
    auto placeholder = [](const ir::TensorType& t, size_t index) {
      return trace::tensor_of(trace::make_placeholder(t, static_cast<int32_t>(index)));
    };
    Carry g_carry, rows, caps;
    for (size_t b = 0; b < B; ++b) g_carry.push_back(placeholder(type_of(init[b]), b));
    for (size_t r = 0; r < BX; ++r) rows.push_back(placeholder(row_types[r], B + r));
    for (size_t p = 0; p < P; ++p) caps.push_back(placeholder(type_of(captures[p]), B + BX + p));
    // The forward body again, over leaves standing for this row's inputs, differentiated.
    Carry in(rows.begin(), rows.begin() + static_cast<int64_t>(C + X));
    in.insert(in.end(), caps.begin(), caps.end());
    Carry wrt;
    for (size_t k : dc) wrt.push_back(in[k]);
    for (size_t j : dx) wrt.push_back(in[C + j]);
    for (size_t p : dp) wrt.push_back(in[C + X + p]);
    for (Tensor& t : wrt) trace::impl_of(t)->requires_grad = true;
    Carry vjp;
    {
      const bool was = autograd::grad_enabled();
      autograd::set_grad_enabled(true);
      try {
        Carry out = apply_graph(*body, in);
        Carry cot(out.size());
        for (size_t i = 0; i < dc.size(); ++i) cot[dc[i]] = g_carry[i];
        for (size_t i = 0; i < dy.size(); ++i) cot[C + dy[i]] = rows[C + X + i];
        autograd::set_grad_enabled(false);
        vjp = autograd::grad(out, cot, wrt);
      } catch (...) {
        autograd::set_grad_enabled(was);
        throw;
      }
      autograd::set_grad_enabled(was);
    }
    auto or_zeros = [](const Tensor& g, const Tensor& like) { return g.defined() ? g : zeros_like(like); };
    std::vector<LazyValue> roots;
    for (size_t i = 0; i < dc.size(); ++i) roots.push_back(trace::impl_of(or_zeros(vjp[i], wrt[i]))->value());
    for (size_t i = 0; i < dp.size(); ++i) {
      const Tensor& g = vjp[dc.size() + dx.size() + i];
      roots.push_back(trace::impl_of(g.defined() ? g_carry[dc.size() + i] + g : g_carry[dc.size() + i])->value());
    }
    for (size_t i = 0; i < dx.size(); ++i) {
      Tensor g = or_zeros(vjp[dc.size() + i], wrt[dc.size() + i]);
      y_rows.push_back(type_of(g));
      roots.push_back(trace::impl_of(g)->value());
    }
    region = std::make_shared<ir::Graph>(
        extract_region(roots, scope.id(), static_cast<int64_t>(B + BX + P), extra));
  }
  Carry r;
  if (snapshots == 0 && !trips.defined()) {
    Carry bw_operands = init;
    bw_operands.insert(bw_operands.end(), saved.begin(), saved.end());
    bw_operands.insert(bw_operands.end(), xs.begin(), xs.end());
    bw_operands.insert(bw_operands.end(), captures.begin(), captures.end());
    for (const LazyValue& v : extra.values) bw_operands.push_back(trace::tensor_of(trace::make_pending(v)));
    ScanShape bw{static_cast<int64_t>(B), static_cast<int64_t>(BX), n, !shape.reverse, y_rows};
    r = record_scan(bw_operands, bw, std::move(region));
  } else {
    // scan_vjp: the same body; its first C rows are the forward carries it rebuilds, so the
    // stacked operands are the rest, and the forward's initial carries come last.
    Carry ops = init;
    ops.insert(ops.end(), xs.begin(), xs.end());
    ops.insert(ops.end(), captures.begin(), captures.end());
    for (const LazyValue& v : extra.values) ops.push_back(trace::tensor_of(trace::make_pending(v)));
    ops.insert(ops.end(), operands.begin(), operands.begin() + static_cast<int64_t>(C));
    ScanShape bw{static_cast<int64_t>(B), static_cast<int64_t>(BX - C), trips.defined() ? -1 : n, shape.reverse,
                 y_rows};
    ir::Attrs attrs = bw.attrs();
    for (int64_t v : {static_cast<int64_t>(C), static_cast<int64_t>(X), static_cast<int64_t>(P), snapshots})
      attrs.values.emplace_back(v);
    region->num_params = static_cast<int64_t>(ops.size());  // the same count, in its own order
    if (trips.defined()) ops.push_back(trips);                // then the count of rows
    r = record_region_op(ir::OpKind::ScanVjp, ops, std::move(attrs), {std::move(region), body}, true);
  }

  std::vector<Tensor> out(operands.size());
  for (size_t i = 0; i < dc.size(); ++i)
    if (needs[dc[i]]) out[dc[i]] = r[i];
  for (size_t i = 0; i < dp.size(); ++i) out[C + X + dp[i]] = r[dc.size() + i];
  for (size_t i = 0; i < dx.size(); ++i) out[C + dx[i]] = r[B + i];
  return out;
}

Carry record_scan(const Carry& operands, const ScanShape& shape, std::shared_ptr<const ir::Graph> body,
                  int64_t snapshots) {
  if (!needs_grad(operands)) return record_region_op(ir::OpKind::Scan, operands, shape.attrs(), {body});
  if (body->num_params != static_cast<int64_t>(operands.size())) {  // the layout the backward reads
    auto g = std::make_shared<ir::Graph>(*body);
    g->num_params = static_cast<int64_t>(operands.size());
    body = std::move(g);
  }
  if (snapshots > 0) {  // nothing stacked: the backward rebuilds the carries it needs
    Carry out = record_region_op(ir::OpKind::Scan, operands, shape.attrs(), {body});
    auto grad = std::make_shared<ScanGrad>();
    grad->shape = shape;
    grad->body = std::move(body);
    for (const Tensor& t : operands) grad->operands.push_back(detail::detached_value(t));
    grad->snapshots = snapshots;
    autograd::record_multi(out, ir::OpKind::Scan, operands,
                           [grad](const std::vector<Tensor>& g, const std::vector<bool>& needs) {
                             return grad->backward(g, needs);
                           });
    return out;
  }
  // The body also returns its carry parameters: stacked, the carries each row starts from.
  const auto C = static_cast<size_t>(shape.carries);
  auto with_saved = std::make_shared<ir::Graph>(*body);
  std::vector<ir::ValueRef> param_of(C, {-1, 0});
  for (size_t i = 0; i < with_saved->nodes.size(); ++i) {
    const ir::Node& n = with_saved->nodes[i];
    if (n.op != ir::OpKind::Parameter) continue;
    const auto index = static_cast<size_t>(ir::NodeAttrs(n.op, n.attrs).i<"index">());
    if (index < C) param_of[index] = {static_cast<int32_t>(i), 0};
  }
  ScanShape fwd = shape;
  for (size_t k = 0; k < C; ++k) {
    if (param_of[k].node < 0) {  // a carry the body never reads
      with_saved->nodes.push_back({ir::OpKind::Parameter, {}, {static_cast<int64_t>(k)}, {type_of(operands[k])}, {}});
      param_of[k] = {static_cast<int32_t>(with_saved->nodes.size() - 1), 0};
    }
    with_saved->outputs.push_back(param_of[k]);
    fwd.y_rows.push_back(type_of(operands[k]));
  }
  Carry all = record_region_op(ir::OpKind::Scan, operands, fwd.attrs(), {with_saved});
  const size_t visible = C + shape.y_rows.size();
  Carry out(all.begin(), all.begin() + static_cast<int64_t>(visible));
  auto grad = std::make_shared<ScanGrad>();
  grad->shape = shape;
  grad->body = std::move(body);
  for (const Tensor& t : operands) grad->operands.push_back(detail::detached_value(t));
  for (size_t k = visible; k < all.size(); ++k) grad->saved.push_back(detail::detached_value(all[k]));
  autograd::record_multi(out, ir::OpKind::Scan, operands,
                         [grad](const std::vector<Tensor>& g, const std::vector<bool>& needs) {
                           return grad->backward(g, needs);
                         });
  return out;
}

// Records the autograd node of a while loop (carries, then captures) that ran `trips` times:
// its backward rebuilds the carries from the initial ones with the body, by binomial
// checkpointing with `snapshots` stored states (0: every state).
void record_while_grad(const Carry& out, const Carry& operands, size_t carries, std::shared_ptr<const ir::Graph> body,
                       const Tensor& trips, int64_t snapshots) {
  if (body->num_params != static_cast<int64_t>(operands.size())) {
    auto g = std::make_shared<ir::Graph>(*body);
    g->num_params = static_cast<int64_t>(operands.size());
    body = std::move(g);
  }
  auto grad = std::make_shared<ScanGrad>();
  grad->shape = ScanShape{static_cast<int64_t>(carries), 0, -1, false, {}};
  grad->body = std::move(body);
  for (const Tensor& t : operands) grad->operands.push_back(detail::detached_value(t));
  grad->snapshots = snapshots;
  grad->trips = detail::detached_value(trips);
  autograd::record_multi(out, ir::OpKind::While, operands,
                         [grad](const std::vector<Tensor>& g, const std::vector<bool>& needs) {
                           return grad->backward(g, needs);
                         });
}

// Renumbers the parameters of `g` from `index` on one up, freeing `index`.
void insert_param(ir::Graph& g, int64_t index) {
  for (ir::Node& n : g.nodes) {
    if (n.op != ir::OpKind::Parameter) continue;
    const int64_t i = ir::NodeAttrs(n.op, n.attrs).i<"index">();
    if (i >= index) n.attrs = {i + 1};
  }
  ++g.num_params;
}

// A while loop's regions with one more carry after the given ones, an i64 scalar the body
// increments: the trip count, when the loop starts it at 0.
Regions with_counter(const Regions& regions, int64_t carries) {
  auto cond = std::make_shared<ir::Graph>(*regions[0]);
  auto body = std::make_shared<ir::Graph>(*regions[1]);
  insert_param(*cond, carries);
  insert_param(*body, carries);
  const ir::TensorType count{DType::i64, {}};
  body->nodes.push_back({ir::OpKind::Parameter, {}, {carries}, {count}, {}});
  const ir::ValueRef c{static_cast<int32_t>(body->nodes.size() - 1), 0};
  body->nodes.push_back({ir::OpKind::Full, {}, {1.0, Shape{}, DType::i64}, {count}, {}});
  const ir::ValueRef one{static_cast<int32_t>(body->nodes.size() - 1), 0};
  body->nodes.push_back({ir::OpKind::Add, {c, one}, {}, {count}, {}});
  body->outputs.insert(body->outputs.begin() + carries, {static_cast<int32_t>(body->nodes.size() - 1), 0});
  return {std::move(cond), std::move(body)};
}

Carry record_while(const Carry& operands, ir::Attrs attrs, const Regions& regions, int64_t snapshots) {
  if (!needs_grad(operands)) return record_region_op(ir::OpKind::While, operands, std::move(attrs), regions);
  // Differentiated: the loop also counts its trips, which its backward runs over.
  const int64_t carries = ir::NodeAttrs(ir::OpKind::While, attrs).i<"carries">();
  Carry counted(operands.begin(), operands.begin() + carries);
  counted.push_back(tensor(std::vector<int64_t>{0}, {}));
  counted.insert(counted.end(), operands.begin() + carries, operands.end());
  Carry all = record_region_op(ir::OpKind::While, counted, {carries + 1}, with_counter(regions, carries));
  Carry out(all.begin(), all.begin() + carries);
  record_while_grad(out, operands, static_cast<size_t>(carries), regions[1], all[static_cast<size_t>(carries)],
                    snapshots);
  return out;
}

// ---- tracing ---------------------------------------------------------------------------------

// While a body is traced, the generator's offset is the placeholder of carry `index`, so that
// draws in the body advance it as a carry: each iteration draws new numbers, the same as the
// unrolled loop's. If the body drew nothing, the carry is dropped (drop_param).
class RandomCarry {
 public:
  explicit RandomCarry(int32_t index)
      : placeholder_(trace::tensor_of(trace::make_placeholder({DType::i64, {}}, index))), start_(trace::impl_of(placeholder_)->value()),
        outer_(detail::exchange_random_offset(placeholder_)) {}
  ~RandomCarry() {
    if (!done_) detail::exchange_random_offset(outer_);
  }
  RandomCarry(const RandomCarry&) = delete;
  RandomCarry& operator=(const RandomCarry&) = delete;

  bool drawn() const {
    const LazyValue now = trace::impl_of(placeholder_)->value();
    return now.node != start_.node || now.index != start_.index;
  }
  /// Puts the generator's offset back; the offset the body leaves, or undefined if it drew
  /// nothing.
  Tensor finish() {
    detail::exchange_random_offset(outer_);
    done_ = true;
    return drawn() ? placeholder_ : Tensor();
  }
  /// The generator's offset outside the body: the loop's initial value of the carry, and the
  /// tensor that takes its final value.
  const Tensor& outer() const { return outer_; }

 private:
  Tensor placeholder_;
  LazyValue start_;
  Tensor outer_;
  bool done_ = false;
};

// Renumbers the parameters of `g` above `index` (which `g` does not read) one down.
void drop_param(ir::Graph& g, int64_t index) {
  for (ir::Node& n : g.nodes) {
    if (n.op != ir::OpKind::Parameter) continue;
    const int64_t i = ir::NodeAttrs(n.op, n.attrs).i<"index">();
    LAZYRT_ASSERT(i != index, "drop_param: the region reads parameter ", index);
    if (i > index) n.attrs = {i - 1};
  }
}

// A while loop's traced regions and the tensors for its captured values. `random`: the body
// draws random numbers, and carries the generator's offset after the given carries.
struct TracedLoop {
  std::shared_ptr<const ir::Graph> cond, body;
  Carry captures;
  bool random = false;
  Tensor outer_offset;
};

// What a traced region read from outside: its captured values, and the tensors among them that
// require grad.
struct Outside {
  Captures captures;
  std::vector<std::shared_ptr<trace::TensorImpl>> grad_captures;
  Carry tensors() const { return capture_tensors(captures, grad_captures); }
};

TracedLoop trace_loop(const char* op, const std::function<Tensor(const Carry&)>& cond_fn,
                      const std::function<Carry(const Carry&)>& body_fn, const Carry& init, size_t offset) {
  std::vector<ir::TensorType> types = input_types(op, "init value", init);
  TracedLoop loop;
  Outside outside;
  {
    autograd::BodyTrace body_trace;
    trace::TraceScope scope;
    Carry ph;
    for (size_t k = 0; k < types.size(); ++k)
      ph.push_back(trace::tensor_of(trace::make_placeholder(types[k], static_cast<int32_t>(k))));
    RandomCarry rng(static_cast<int32_t>(types.size()));
    Tensor c = cond_fn(ph);
    LAZYRT_CHECK(c.defined() && c.numel() == 1, op, ": cond must return a one-element tensor, got ",
                 c.defined() ? dtype_name(c.dtype()) + shape_str(c.shape()) : std::string("undefined"));
    LAZYRT_CHECK(!rng.drawn(), op, ": cond draws random numbers; draw them in the body");
    Tensor pred = reshape(c.dtype() == DType::b8 ? c : c != 0, {});
    Carry out = body_fn(ph);
    check_carry(op, init, out, offset);
    Tensor drawn = rng.finish();
    loop.random = drawn.defined();
    loop.outer_offset = rng.outer();
    if (loop.random) out.push_back(drawn);
    const auto placeholders = static_cast<int64_t>(types.size()) + 1;  // the carries, the offset
    auto cond = std::make_shared<ir::Graph>(
        extract_region({trace::impl_of(pred)->value()}, scope.id(), placeholders, outside.captures));
    auto body = std::make_shared<ir::Graph>(
        extract_region(values_of(out), scope.id(), placeholders, outside.captures));
    if (!loop.random) {
      drop_param(*cond, static_cast<int64_t>(types.size()));
      drop_param(*body, static_cast<int64_t>(types.size()));
    }
    loop.cond = std::move(cond);
    loop.body = std::move(body);
    outside.grad_captures = scope.grad_captures();
  }
  loop.captures = outside.tensors();
  return loop;
}

// The loop's results without the generator's offset, which becomes the generator's.
Carry settle_random(const TracedLoop& loop, Carry out) {
  if (!loop.random) return out;
  Tensor offset = loop.outer_offset;
  offset.copy_(out.back());
  out.pop_back();
  return out;
}

Carry concat(Carry a, const Carry& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

Carry while_loop(std::function<Tensor(const Carry&)> cond_fn,
                 std::function<Carry(const Carry&)> body_fn, Carry init, int64_t snapshots) {
  LAZYRT_CHECK(cond_fn && body_fn, "while_loop: cond_fn and body_fn must be callables (got an empty std::function)");
  LAZYRT_CHECK(snapshots >= 0, "while_loop: snapshots must be 0 (keep every carry) or at least 1, got ", snapshots);
  TracedLoop loop = trace_loop("while_loop", cond_fn, body_fn, init, 0);
  if (loop.random) init.push_back(loop.outer_offset);
  return settle_random(loop, record_while(concat(init, loop.captures), {static_cast<int64_t>(init.size())},
                                          {loop.cond, loop.body}, snapshots));
}

Carry fori_loop(int64_t lower, int64_t upper,
                std::function<Carry(const Tensor& i, const Carry&)> body_fn, Carry init, int64_t snapshots) {
  LAZYRT_CHECK(body_fn, "fori_loop: body_fn must be a callable (got an empty std::function)");
  LAZYRT_CHECK(snapshots >= 0, "fori_loop: snapshots must be 0 (keep every carry) or at least 1, got ", snapshots);
  // The bounds exactly (through a double, INT64_MAX would become INT64_MIN).
  Tensor hi = tensor(std::vector<int64_t>{upper}, {});
  Carry carry{tensor(std::vector<int64_t>{lower}, {})};
  carry.insert(carry.end(), init.begin(), init.end());
  TracedLoop loop = trace_loop(
      "fori_loop", [&](const Carry& c) { return c[0] < hi; },
      [&](const Carry& c) {
        Carry rest(c.begin() + 1, c.end());
        Carry r = body_fn(c[0], rest);
        Carry next{c[0] + 1};
        next.insert(next.end(), r.begin(), r.end());
        return next;
      },
      carry, 1);
  if (loop.random) carry.push_back(loop.outer_offset);
  Carry operands = concat(carry, loop.captures);
  Carry out = record_region_op(ir::OpKind::While, operands, {static_cast<int64_t>(carry.size())},
                               {loop.cond, loop.body});
  if (needs_grad(operands)) {
    // The backward counts upper - lower rows from the bounds, which are inputs of the graph,
    // so one executable serves every trip count; it rebuilds the carries from the initial
    // ones (every one with snapshots 0, by binomial checkpointing otherwise). (A count beyond
    // INT64_MAX would wrap, but such a loop never ends.)
    Tensor trips = maximum(hi - carry[0], zeros({}, DType::i64));
    record_while_grad(out, operands, carry.size(), loop.body, trips, snapshots);
  }
  out = settle_random(loop, std::move(out));
  return Carry(out.begin() + 1, out.end());
}

std::pair<Carry, Carry> scan(const ScanFn& fn, Carry init, Carry xs, bool reverse, int64_t length,
                             int64_t snapshots) {
  const char* op = "scan";
  LAZYRT_CHECK(fn, op, ": fn must be a callable (got an empty std::function)");
  LAZYRT_CHECK(snapshots >= 0, op, ": snapshots must be 0 (keep every carry) or at least 1, got ", snapshots);
  std::vector<ir::TensorType> carry_types = input_types(op, "init value", init);
  std::vector<ir::TensorType> x_types = input_types(op, "xs value", xs);
  LAZYRT_CHECK(!xs.empty() || length >= 0, op, ": without stacked inputs (xs) the length must be given");
  for (size_t j = 0; j < x_types.size(); ++j) {
    LAZYRT_CHECK(!x_types[j].shape.empty(), op, ": xs value ", j, " is a 0-dim tensor; stacked "
                 "inputs have their rows along dim 0");
    if (length < 0) length = x_types[j].shape[0];
    LAZYRT_CHECK(x_types[j].shape[0] == length, op, ": xs value ", j, " has ", x_types[j].shape[0],
                 " rows, expected ", length, j ? " as xs value 0" : " (the length given)");
  }
  const auto carries = static_cast<int64_t>(init.size());
  ScanShape shape{carries, static_cast<int64_t>(xs.size()), length, reverse, {}};
  std::shared_ptr<ir::Graph> body;
  Outside outside;
  TracedLoop rng_state;  // only its random fields
  {
    autograd::BodyTrace body_trace;
    trace::TraceScope scope;
    // Placeholders: the carries, the generator's offset (dropped if the body draws nothing),
    // one row of each stacked input.
    Carry ph_carry, ph_x;
    for (size_t k = 0; k < init.size(); ++k)
      ph_carry.push_back(trace::tensor_of(trace::make_placeholder(carry_types[k], static_cast<int32_t>(k))));
    RandomCarry rng(static_cast<int32_t>(carries));
    for (size_t j = 0; j < xs.size(); ++j) {
      ir::TensorType row{x_types[j].dtype, Shape(x_types[j].shape.begin() + 1, x_types[j].shape.end())};
      ph_x.push_back(trace::tensor_of(trace::make_placeholder(row, static_cast<int32_t>(carries + 1 + static_cast<int64_t>(j)))));
    }
    auto [next, ys] = fn(ph_carry, ph_x);
    check_carry(op, init, next, 0);
    for (size_t m = 0; m < ys.size(); ++m) {
      LAZYRT_CHECK(ys[m].defined(), op, ": fn's stacked output ", m, " is undefined");
      shape.y_rows.push_back(type_of(ys[m]));
    }
    Tensor drawn = rng.finish();
    rng_state.random = drawn.defined();
    rng_state.outer_offset = rng.outer();
    if (rng_state.random) next.push_back(drawn);
    body = std::make_shared<ir::Graph>(
        extract_region(values_of(concat(next, ys)), scope.id(), carries + 1 + shape.xs, outside.captures));
    if (!rng_state.random) drop_param(*body, carries);
    outside.grad_captures = scope.grad_captures();
  }
  if (rng_state.random) {
    init.push_back(rng_state.outer_offset);
    ++shape.carries;
  }
  Carry out = record_scan(concat(concat(init, xs), outside.tensors()), shape, std::move(body), snapshots);
  const auto kept = static_cast<int64_t>(shape.carries);
  Carry carry = settle_random(rng_state, Carry(out.begin(), out.begin() + kept));
  return {std::move(carry), Carry(out.begin() + kept, out.end())};
}

// ---- call: a function traced once per operand types ----------------------------------------

namespace detail {

TracedFunction::TracedFunction(std::string name, Fn fn)
    : name_(std::move(name)),
      in_place_error_(name_ + ": the function updates a tensor from outside it in place (a random draw advances "
                              "the generator's offset); a call computes from its operands and constants only"),
      fn_(std::move(fn)) {}

const TracedFunction::Traced& TracedFunction::trace(const Carry& operands) {
  Traced t;
  t.types = input_types(name_.c_str(), "operand", operands);
  Captures captures;
  ir::Graph region;
  {
    trace::TraceScope scope(in_place_error_.c_str());
    Carry ph;
    for (size_t k = 0; k < t.types.size(); ++k)
      ph.push_back(trace::tensor_of(trace::make_placeholder(t.types[k], static_cast<int32_t>(k))));
    const Carry out = fn_(ph);
    for (size_t k = 0; k < out.size(); ++k)
      LAZYRT_CHECK(out[k].defined(), name_, ": result ", k, " is undefined");
    region = extract_region(values_of(out), scope.id(), static_cast<int64_t>(t.types.size()), captures);
    region.num_params = static_cast<int64_t>(t.types.size());
  }
  LAZYRT_CHECK(captures.values.empty(), name_, ": the function reads ", captures.values.size(),
               " tensor(s) it was not given; a call computes from its operands and constants only");
  for (ir::ValueRef v : region.outputs) t.results.push_back(region.type(v));
  t.region = ir::seal(std::move(region));
  traced_.push_back(std::move(t));
  return traced_.back();
}

void TracedFunction::apply(const Carry& operands, Carry& results) {
  const bool grads = autograd::in_recorded_body() ||
                     (autograd::recording() &&
                      std::any_of(operands.begin(), operands.end(), [](const Tensor& t) { return t.requires_grad(); }));
  if (grads) {
    results = fn_(operands);
    return;
  }
  const Traced* t = nullptr;
  for (const Traced& e : traced_) {
    bool same = e.types.size() == operands.size();
    for (size_t k = 0; same && k < operands.size(); ++k)
      same = operands[k].defined() && operands[k].dtype() == e.types[k].dtype && operands[k].shape() == e.types[k].shape;
    if (same) {
      t = &e;
      break;
    }
  }
  if (!t) t = &trace(operands);
  // Recorded as trace::record would, with the types the region gives (no rule infers them),
  // in vectors that kept their capacity (VectorStash): a step records a call per parameter.
  auto n = util::make_pooled<LazyNode>();
  n->op = ir::OpKind::Call;
  n->operands = util::VectorStash<std::vector<LazyValue>>::take();
  for (const Tensor& x : operands) n->operands.push_back(value_of(x));
  n->types = util::VectorStash<std::vector<ir::TensorType>>::take();
  n->types.resize(t->results.size());
  for (size_t k = 0; k < t->results.size(); ++k) {
    n->types[k].dtype = t->results[k].dtype;
    n->types[k].shape = ir::stashed_shape(t->results[k].shape);
  }
  n->regions.push_back(t->region);
  n->scope = trace::current_scope();
  results.clear();
  for (size_t k = 0; k < t->results.size(); ++k)
    results.push_back(trace::tensor_of(trace::make_pending({n, static_cast<int32_t>(k)})));
}

Carry TracedFunction::operator()(const Carry& operands) {
  Carry results;
  apply(operands, results);
  return results;
}

}  // namespace detail
}  // namespace lazyrt
