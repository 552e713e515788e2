// while_loop, fori_loop and scan: trace the regions once over placeholders, capture what they
// use from outside, and record one while (or scan) node.
#include "lazyrt/loops.h"

#include <map>

#include "autograd/autograd.h"
#include "trace/extract.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"

namespace lazyrt {
namespace {

using trace::LazyNode;
using trace::LazyValue;

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
      [&](const LazyValue& v, ir::Graph& g) -> ir::ValueRef {
        const LazyNode& n = *v.node;
        int64_t index;
        ir::TensorType type = v.type();
        if (n.scope == scope && n.placeholder >= 0) {
          index = n.placeholder;
        } else {
          auto [it, fresh] = captures.index.emplace(std::make_pair(&n, v.index),
                                                    static_cast<int32_t>(captures.values.size()));
          if (fresh) captures.values.push_back(v);
          index = placeholders + it->second;
        }
        g.nodes.push_back({ir::OpKind::Parameter, {}, {index}, {std::move(type)}, {}});
        return {static_cast<int32_t>(g.nodes.size() - 1), 0};
      });
  std::vector<ir::ValueRef> outs;
  for (const LazyValue& r : roots) outs.push_back(flat.add_root(r));
  ir::Graph g = std::move(flat.graph());
  g.outputs = std::move(outs);
  return g;
}

// The types of a loop's inputs, which must be defined and, while gradients are recorded, not
// require them.
std::vector<ir::TensorType> input_types(const char* op, const char* what, const Carry& values) {
  std::vector<ir::TensorType> types;
  for (size_t k = 0; k < values.size(); ++k) {
    LAZYRT_CHECK(values[k].defined(), op, ": ", what, " ", k, " is undefined");
    LAZYRT_CHECK(!values[k].requires_grad() || !autograd::grad_enabled(), op, ": ", what, " ", k,
                 " requires grad, and loops are not differentiable yet; detach it first, or run the "
                 "loop under no_grad");
    types.push_back({values[k].dtype(), values[k].shape()});
  }
  return types;
}

std::vector<LazyValue> values_of(const Carry& ts) {
  std::vector<LazyValue> v;
  for (const Tensor& t : ts) v.push_back(t.impl()->value());
  return v;
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

Carry while_loop_impl(const char* op, const std::function<Tensor(const Carry&)>& cond_fn,
                      const std::function<Carry(const Carry&)>& body_fn, const Carry& init,
                      size_t offset) {
  std::vector<ir::TensorType> types = input_types(op, "init value", init);
  std::shared_ptr<const ir::Graph> cond_graph, body_graph;
  Captures captures;
  {
    trace::TraceScope scope;
    Carry ph;
    for (size_t k = 0; k < types.size(); ++k)
      ph.push_back(Tensor(trace::make_placeholder(types[k], static_cast<int32_t>(k))));
    Tensor c = cond_fn(ph);
    LAZYRT_CHECK(c.defined() && c.numel() == 1, op, ": cond must return a one-element tensor, got ",
                 c.defined() ? dtype_name(c.dtype()) + shape_str(c.shape()) : std::string("undefined"));
    Tensor pred = reshape(c.dtype() == DType::b8 ? c : c != 0, {});
    Carry out = body_fn(ph);
    check_carry(op, init, out, offset);
    std::vector<LazyValue> body_roots = values_of(out);
    cond_graph = std::make_shared<ir::Graph>(
        extract_region({pred.impl()->value()}, scope.id(), static_cast<int64_t>(types.size()), captures));
    body_graph = std::make_shared<ir::Graph>(
        extract_region(body_roots, scope.id(), static_cast<int64_t>(types.size()), captures));
  }
  std::vector<LazyValue> operands = values_of(init);
  operands.insert(operands.end(), captures.values.begin(), captures.values.end());
  const int64_t num_params = static_cast<int64_t>(operands.size());
  // Both regions see every carry and every capture, in one layout.
  auto with_params = [&](const std::shared_ptr<const ir::Graph>& g) {
    auto r = std::make_shared<ir::Graph>(*g);
    r->num_params = num_params;
    return r;
  };
  LazyValue w = trace::record(ir::OpKind::While, std::move(operands), {static_cast<int64_t>(init.size())});
  w.node->regions = {with_params(cond_graph), with_params(body_graph)};
  Carry result;
  for (size_t k = 0; k < init.size(); ++k)
    result.push_back(Tensor(trace::make_pending({w.node, static_cast<int32_t>(k)})));
  return result;
}

}  // namespace

Carry while_loop(std::function<Tensor(const Carry&)> cond_fn,
                 std::function<Carry(const Carry&)> body_fn, Carry init) {
  return while_loop_impl("while_loop", cond_fn, body_fn, init, 0);
}

Carry fori_loop(int64_t lower, int64_t upper,
                std::function<Carry(const Tensor& i, const Carry&)> body_fn, Carry init) {
  Tensor hi = scalar_tensor(static_cast<double>(upper), DType::i64);
  Carry carry{scalar_tensor(static_cast<double>(lower), DType::i64)};
  carry.insert(carry.end(), init.begin(), init.end());
  Carry out = while_loop_impl(
      "fori_loop", [&](const Carry& c) { return c[0] < hi; },
      [&](const Carry& c) {
        Carry rest(c.begin() + 1, c.end());
        Carry r = body_fn(c[0], rest);
        Carry next{c[0] + 1};
        next.insert(next.end(), r.begin(), r.end());
        return next;
      },
      carry, 1);
  return Carry(out.begin() + 1, out.end());
}


std::pair<Carry, Carry> scan(const ScanFn& fn, Carry init, Carry xs, bool reverse, int64_t length) {
  const char* op = "scan";
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
  const auto placeholders = carries + static_cast<int64_t>(xs.size());
  std::shared_ptr<ir::Graph> body;
  Captures captures;
  Carry ys_rows;
  {
    trace::TraceScope scope;
    Carry ph_carry, ph_x;
    for (size_t k = 0; k < init.size(); ++k)
      ph_carry.push_back(Tensor(trace::make_placeholder(carry_types[k], static_cast<int32_t>(k))));
    for (size_t j = 0; j < xs.size(); ++j) {
      ir::TensorType row{x_types[j].dtype, Shape(x_types[j].shape.begin() + 1, x_types[j].shape.end())};
      ph_x.push_back(Tensor(trace::make_placeholder(row, static_cast<int32_t>(carries) + static_cast<int32_t>(j))));
    }
    auto [next, ys] = fn(ph_carry, ph_x);
    check_carry(op, init, next, 0);
    for (size_t m = 0; m < ys.size(); ++m)
      LAZYRT_CHECK(ys[m].defined(), op, ": fn's stacked output ", m, " is undefined");
    std::vector<LazyValue> roots = values_of(next);
    for (const Tensor& y : ys) roots.push_back(y.impl()->value());
    body = std::make_shared<ir::Graph>(extract_region(roots, scope.id(), placeholders, captures));
    ys_rows = std::move(ys);
  }
  std::vector<LazyValue> operands = values_of(init);
  for (const Tensor& x : xs) operands.push_back(x.impl()->value());
  operands.insert(operands.end(), captures.values.begin(), captures.values.end());
  body->num_params = static_cast<int64_t>(operands.size());
  std::vector<int64_t> ys_dtypes, ys_shapes;
  for (const Tensor& y : ys_rows) {
    ys_dtypes.push_back(static_cast<int64_t>(y.dtype()));
    ys_shapes.push_back(y.dim());
    ys_shapes.insert(ys_shapes.end(), y.shape().begin(), y.shape().end());
  }
  LazyValue s = trace::record(ir::OpKind::Scan, std::move(operands),
                              {carries, static_cast<int64_t>(xs.size()), length, reverse,
                               std::move(ys_dtypes), std::move(ys_shapes)});
  s.node->regions = {std::move(body)};
  std::pair<Carry, Carry> result;
  for (size_t k = 0; k < init.size() + ys_rows.size(); ++k)
    (k < init.size() ? result.first : result.second)
        .push_back(Tensor(trace::make_pending({s.node, static_cast<int32_t>(k)})));
  return result;
}

}  // namespace lazyrt
