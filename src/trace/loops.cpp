// while_loop and fori_loop: trace cond and body once over placeholders into regions, capture
// what they use from outside, and record one while node.
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
// 0..carries-1, any value from outside the scope is a capture (parameter carries + j).
ir::Graph extract_region(const std::vector<LazyValue>& roots, int64_t scope,
                         const std::vector<ir::TensorType>& carry_types, Captures& captures) {
  const auto carries = static_cast<int64_t>(carry_types.size());
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
          index = carries + it->second;
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
  std::vector<ir::TensorType> types;
  for (size_t k = 0; k < init.size(); ++k) {
    LAZYRT_CHECK(init[k].defined(), op, ": init value ", k, " is undefined");
    LAZYRT_CHECK(!init[k].requires_grad() || !autograd::grad_enabled(), op, ": init value ", k,
                 " requires grad, and loops are not differentiable yet; detach it first, or run the "
                 "loop under no_grad");
    types.push_back({init[k].dtype(), init[k].shape()});
  }
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
    std::vector<LazyValue> body_roots;
    for (const Tensor& t : out) body_roots.push_back(t.impl()->value());
    cond_graph = std::make_shared<ir::Graph>(
        extract_region({pred.impl()->value()}, scope.id(), types, captures));
    body_graph = std::make_shared<ir::Graph>(extract_region(body_roots, scope.id(), types, captures));
  }
  std::vector<LazyValue> operands;
  for (const Tensor& t : init) operands.push_back(t.impl()->value());
  for (const LazyValue& v : captures.values) operands.push_back(v);
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

}  // namespace lazyrt
