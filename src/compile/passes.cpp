#include "compile/passes.h"

#include <algorithm>
#include <map>
#include <optional>

#include "ir/hash.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops.h"
#include "runtime/buffer.h"
#include "util/check.h"

namespace lazyrt::compile {

using ir::Graph;
using ir::Node;
using ir::OpKind;
using ir::ValueRef;

GraphRewriter::GraphRewriter(const Graph& source) : src_(source) {
  out_.num_params = source.num_params;
  map_.resize(source.nodes.size());
}

ValueRef GraphRewriter::map(ValueRef old) const {
  const auto& m = map_.at(old.node);
  LAZYRT_ASSERT(static_cast<size_t>(old.index) < m.size(), "value %", old.node, " not mapped yet");
  return m[old.index];
}

void GraphRewriter::set(int32_t node, int32_t index, ValueRef v) {
  auto& m = map_.at(node);
  if (m.size() <= static_cast<size_t>(index)) m.resize(index + 1);
  m[index] = v;
}

ValueRef GraphRewriter::copy(int32_t i) {
  const Node& n = src_.nodes[i];
  Node c = n;
  for (auto& v : c.operands) v = map(v);
  out_.nodes.push_back(std::move(c));
  const auto idx = static_cast<int32_t>(out_.nodes.size() - 1);
  for (size_t k = 0; k < n.results.size(); ++k) set(i, static_cast<int32_t>(k), {idx, static_cast<int32_t>(k)});
  return {idx, 0};
}

Graph GraphRewriter::finish() {
  for (ValueRef v : src_.outputs) out_.outputs.push_back(map(v));
  return std::move(out_);
}

Graph dead_code_elimination(const Graph& g) {
  std::vector<bool> live(g.nodes.size(), false);
  for (ValueRef v : g.outputs) live[v.node] = true;
  for (size_t i = g.nodes.size(); i-- > 0;)
    if (live[i])
      for (ValueRef v : g.nodes[i].operands) live[v.node] = true;
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (live[i]) rw.copy(static_cast<int32_t>(i));
  return rw.finish();
}

Graph common_subexpression_elimination(const Graph& g) {
  GraphRewriter rw(g);
  // Buckets by structural hash; equality is checked in full, so collisions cost only time.
  std::map<std::pair<uint64_t, uint64_t>, std::vector<int32_t>> seen;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == OpKind::Parameter || !n.regions.empty()) {
      rw.copy(static_cast<int32_t>(i));
      continue;
    }
    Node c = n;
    for (auto& v : c.operands) v = rw.map(v);
    if (ir::has_flag(n.op, ir::kCommutative) && c.operands.size() == 2 && c.operands[1] < c.operands[0])
      std::swap(c.operands[0], c.operands[1]);
    ir::Hasher h;
    h.add(static_cast<uint64_t>(c.op));
    for (ValueRef v : c.operands) h.add((static_cast<uint64_t>(v.node) << 16) ^ v.index);
    GraphHash key = h.finish();
    auto& bucket = seen[{key.hi, key.lo}];
    int32_t match = -1;
    for (int32_t j : bucket) {
      const Node& o = rw.graph().nodes[j];
      if (o.op == c.op && o.operands == c.operands && o.attrs == c.attrs && o.results == c.results) {
        match = j;
        break;
      }
    }
    if (match >= 0) {
      for (size_t k = 0; k < n.results.size(); ++k)
        rw.set(static_cast<int32_t>(i), static_cast<int32_t>(k), {match, static_cast<int32_t>(k)});
      continue;
    }
    rw.graph().nodes.push_back(std::move(c));
    const auto idx = static_cast<int32_t>(rw.graph().nodes.size() - 1);
    for (size_t k = 0; k < n.results.size(); ++k)
      rw.set(static_cast<int32_t>(i), static_cast<int32_t>(k), {idx, static_cast<int32_t>(k)});
    bucket.push_back(idx);
  }
  return rw.finish();
}

namespace {

bool is_full(const Graph& g, ValueRef v) { return g.node(v).op == OpKind::Full; }
double full_value(const Graph& g, ValueRef v) { return g.node(v).attrs.f(0); }
bool is_full_of(const Graph& g, ValueRef v, double x) {
  return is_full(g, v) && full_value(g, v) == x;
}

// Evaluates an elementwise op on scalar constants with the op's own kernel, so folding
// computes exactly what execution would.
double eval_scalar(OpKind op, const ir::Attrs& attrs, const std::vector<ir::TensorType>& in_types,
                   const std::vector<double>& values, ir::TensorType out_type) {
  std::vector<ir::TensorType> scalar_in;
  std::vector<std::shared_ptr<runtime::Buffer>> bufs;
  std::vector<const void*> in;
  for (size_t k = 0; k < in_types.size(); ++k) {
    scalar_in.push_back({in_types[k].dtype, {}});
    bufs.push_back(runtime::allocate(8));
    kernels::fill(bufs.back()->data(), in_types[k].dtype, values[k], 1);
    in.push_back(bufs.back()->data());
  }
  ir::TensorType scalar_out{out_type.dtype, {}};
  kernels::Kernel k = kernels::make_kernel({op, attrs, scalar_in, {scalar_out}});
  auto out = runtime::allocate(8 + k.workspace_bytes);
  std::vector<void*> outs{out->data()};
  std::shared_ptr<runtime::Buffer> ws;
  if (k.workspace_bytes) {
    ws = runtime::allocate(k.workspace_bytes);
    outs.push_back(ws->data());
  }
  k.run(in.data(), outs.data());
  double result = 0;
  kernels::visit_dtype(out_type.dtype, [&](auto tag) {
    using T = decltype(tag);
    result = static_cast<double>(kernels::convert<double>(*static_cast<const T*>(out->data())));
  });
  return result;
}

}  // namespace

Graph constant_folding(const Graph& g) {
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Graph& ng = rw.graph();
    bool all_const = !n.operands.empty() && n.regions.empty() && n.results.size() == 1;
    for (ValueRef v : n.operands) all_const = all_const && is_full(ng, rw.map(v));
    if (!all_const) {
      rw.copy(static_cast<int32_t>(i));
      continue;
    }
    const ir::TensorType& out = n.results[0];
    std::optional<double> value;
    if (ir::has_flag(n.op, ir::kElementwise)) {
      std::vector<ir::TensorType> in_types;
      std::vector<double> values;
      for (ValueRef v : n.operands) {
        in_types.push_back(ng.type(rw.map(v)));
        values.push_back(full_value(ng, rw.map(v)));
      }
      value = eval_scalar(n.op, n.attrs, in_types, values, out);
    } else if (n.op == OpKind::Reshape || n.op == OpKind::Expand || n.op == OpKind::Permute ||
               ((n.op == OpKind::Amax || n.op == OpKind::Amin) && out.numel() > 0)) {
      value = full_value(ng, rw.map(n.operands[0]));
    }
    if (value) {
      rw.set(static_cast<int32_t>(i), 0, rw.graph().add_full(*value, out.shape, out.dtype));
    } else {
      rw.copy(static_cast<int32_t>(i));
    }
  }
  return rw.finish();
}

Graph algebraic_simplification(const Graph& g) {
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Graph& ng = rw.graph();
    std::vector<ValueRef> ops;
    for (ValueRef v : n.operands) ops.push_back(rw.map(v));
    const ir::TensorType* out = n.results.size() == 1 ? &n.results[0] : nullptr;
    auto keeps_type = [&](ValueRef v) { return out && ng.type(v) == *out; };
    std::optional<ValueRef> same;  // the op is the identity on this operand
    switch (n.op) {
      case OpKind::Mul:
        if (is_full_of(ng, ops[1], 1) && keeps_type(ops[0])) same = ops[0];
        else if (is_full_of(ng, ops[0], 1) && keeps_type(ops[1])) same = ops[1];
        break;
      case OpKind::Add:
        if (is_full_of(ng, ops[1], 0) && keeps_type(ops[0])) same = ops[0];
        else if (is_full_of(ng, ops[0], 0) && keeps_type(ops[1])) same = ops[1];
        break;
      case OpKind::Sub:
        if (is_full_of(ng, ops[1], 0) && keeps_type(ops[0])) same = ops[0];
        break;
      case OpKind::Div:
      case OpKind::Pow:
        if (is_full_of(ng, ops[1], 1) && keeps_type(ops[0])) same = ops[0];
        break;
      case OpKind::Neg:
        if (ng.node(ops[0]).op == OpKind::Neg) same = ng.node(ops[0]).operands[0];
        break;
      case OpKind::Reshape:
      case OpKind::Expand:
      case OpKind::Cast:
        if (keeps_type(ops[0])) same = ops[0];
        else if (n.op == OpKind::Reshape && ng.node(ops[0]).op == OpKind::Reshape) {
          rw.set(static_cast<int32_t>(i), 0,
                 rw.graph().add(OpKind::Reshape, {ng.node(ops[0]).operands[0]}, n.attrs));
          continue;
        }
        break;
      case OpKind::Permute: {
        const auto& perm = n.attrs.ints(0);
        ValueRef src = ops[0];
        std::vector<int64_t> composed = perm;
        if (ng.node(src).op == OpKind::Permute) {
          const auto& inner = ng.node(src).attrs.ints(0);
          for (size_t d = 0; d < perm.size(); ++d) composed[d] = inner[perm[d]];
          src = ng.node(src).operands[0];
        }
        bool identity = true;
        for (size_t d = 0; d < composed.size(); ++d) identity = identity && composed[d] == static_cast<int64_t>(d);
        if (identity) {
          same = src;
        } else if (src != ops[0]) {
          rw.set(static_cast<int32_t>(i), 0, rw.graph().add(OpKind::Permute, {src}, {composed}));
          continue;
        }
        break;
      }
      default:
        break;
    }
    if (same) rw.set(static_cast<int32_t>(i), 0, *same);
    else rw.copy(static_cast<int32_t>(i));
  }
  return rw.finish();
}

Graph optimize(const Graph& g) {
  Graph x = constant_folding(g);
  x = algebraic_simplification(x);
  x = common_subexpression_elimination(x);
  x = dead_code_elimination(x);
  return dead_code_elimination(fuse_elementwise(x));
}

}  // namespace lazyrt::compile
