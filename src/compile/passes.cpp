#include "compile/passes.h"

#include <algorithm>
#include <map>
#include <optional>
#include <queue>

#include "ir/gemm_view.h"
#include "ir/hash.h"
#include "scalar/elementwise_fns.h"
#include "util/dtype_dispatch.h"
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

Graph inline_calls(const Graph& g) {
  if (std::none_of(g.nodes.begin(), g.nodes.end(), [](const Node& n) { return n.op == OpKind::Call; })) return g;
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op != OpKind::Call) {
      rw.copy(static_cast<int32_t>(i));
      continue;
    }
    const Graph body = inline_calls(*n.regions.at(0));
    // Where each region node's results are now: a parameter is the call's operand; any other
    // node is appended, its results at their own index.
    std::vector<ValueRef> at(body.nodes.size());
    auto value = [&](ValueRef v) {
      const Node& src = body.nodes[static_cast<size_t>(v.node)];
      const ValueRef base = at[static_cast<size_t>(v.node)];
      return src.op == OpKind::Parameter ? base : ValueRef{base.node, v.index};
    };
    for (size_t j = 0; j < body.nodes.size(); ++j) {
      const Node& bn = body.nodes[j];
      if (bn.op == OpKind::Parameter) {
        at[j] = rw.map(n.operands.at(static_cast<size_t>(ir::NodeAttrs(bn.op, bn.attrs).i<"index">())));
        continue;
      }
      Node c = bn;
      for (ValueRef& v : c.operands) v = value(v);
      rw.graph().nodes.push_back(std::move(c));
      at[j] = {static_cast<int32_t>(rw.graph().nodes.size() - 1), 0};
    }
    for (size_t k = 0; k < body.outputs.size(); ++k) rw.set(static_cast<int32_t>(i), static_cast<int32_t>(k), value(body.outputs[k]));
  }
  return rw.finish();
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

namespace {

// A reduction whose only bool attribute is `keepdim`.
bool has_keepdim(OpKind op) {
  switch (op) {
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::Amax:
    case OpKind::Amin:
    case OpKind::Prod:
    case OpKind::Var:
    case OpKind::Std:
    case OpKind::Norm:
    case OpKind::ArgMax:
    case OpKind::ArgMin: return true;
    default: return false;
  }
}

// Whether a and b are one reduction of one operand, one keeping the reduced dims and the
// other dropping them: the same values in two shapes (PyTorch's batch-norm decomposition takes
// the variance both ways).
bool same_but_keepdim(const Node& a, const Node& b) {
  if (a.op != b.op || !has_keepdim(a.op) || a.operands != b.operands || a.attrs.values.size() != b.attrs.values.size())
    return false;
  int differ = 0;
  for (size_t k = 0; k < a.attrs.values.size(); ++k) {
    if (a.attrs.values[k] == b.attrs.values[k]) continue;
    if (!std::holds_alternative<bool>(a.attrs.values[k])) return false;
    ++differ;
  }
  return differ == 1;
}

}  // namespace

Graph common_subexpression_elimination(const Graph& g) {
  GraphRewriter rw(g);
  // Buckets by structural hash; equality is checked in full, so collisions cost only time.
  std::map<std::pair<uint64_t, uint64_t>, std::vector<int32_t>> seen;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    // A collective is a communication every rank takes part in, once per node: never merged
    // (two take different tokens anyway).
    if (n.op == OpKind::Parameter || !n.regions.empty() || ir::has_flag(n.op, ir::kCollective)) {
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
    // The same reduction with the reduced dims kept (or dropped): its values, reshaped.
    for (int32_t j : bucket)
      if (same_but_keepdim(rw.graph().nodes[j], c)) {
        rw.set(static_cast<int32_t>(i), 0, rw.graph().add(OpKind::Reshape, {{j, 0}}, {n.results[0].shape}));
        match = j;
        break;
      }
    if (match >= 0) continue;
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
double full_value(const Graph& g, ValueRef v) {
  const Node& n = g.node(v);
  return ir::NodeAttrs(n.op, n.attrs).f<"value">();
}
bool is_full_of(const Graph& g, ValueRef v, double x) {
  return is_full(g, v) && full_value(g, v) == x;
}

// Evaluates an elementwise op on scalar constants as every kernel does, with the ops' scalar
// functions (scalar/elementwise_fns.h): each operand stored in its dtype and read in the compute
// type, the function applied, the result stored in its dtype. So folding computes exactly what
// execution would (tests/cpp/compile/passes_test.cpp runs both on random values). None where a
// full node's value (a double) cannot hold the result exactly (an i64 past 2^53).
std::optional<double> eval_scalar(OpKind op, const ir::Attrs& attrs, const std::vector<ir::TensorType>& in_types,
                                  const std::vector<double>& values, ir::TensorType out_type) {
  std::optional<double> result;
  // r as a double, if that is exactly r.
  auto exactly = [](auto r) -> std::optional<double> {
    const double d = static_cast<double>(convert<double>(r));
    if constexpr (std::is_integral_v<decltype(r)>)
      if (!(d >= -0x1p63 && d < 0x1p63) || convert<decltype(r)>(d) != r) return std::nullopt;
    return d;
  };
  // The value an element of dtype `d` holds after `v` is stored in it, as R.
  auto stored = [](DType d, double v, auto to) {
    using R = decltype(to);
    R r{};
    visit_dtype(d, [&](auto tag) { r = convert<R>(convert<decltype(tag)>(v)); });
    return r;
  };
  if (op == OpKind::Cast || op == OpKind::Where) {
    // cast: the stored operand converted; where: the operand the condition picks, in the result's dtype
    const double picked = op == OpKind::Cast ? values[0] : stored(DType::b8, values[0], bool{}) ? values[1] : values[2];
    const DType from = op == OpKind::Cast ? in_types[0].dtype : out_type.dtype;
    visit_dtype(from, [&](auto in) {
      using T = decltype(in);
      const T x = convert<T>(picked);
      visit_dtype(out_type.dtype, [&](auto out) { result = exactly(convert<decltype(out)>(x)); });
    });
    return result;
  }
  scalar::visit_elementwise(op, attrs, [&](const auto& e) {
    using E = std::decay_t<decltype(e)>;
    visit_dtype(in_types[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (scalar::in_domain<E::domain, T>()) {
        using C = compute_t<T>;
        using R = std::conditional_t<E::to_bool, bool, T>;
        auto arg = [&](size_t k) { return stored(in_types[k].dtype, values[k], C{}); };
        R r{};
        if constexpr (E::arity == 1) r = convert<R>(e.f.template operator()<C>(arg(0)));
        else if constexpr (E::arity == 2) r = convert<R>(e.f.template operator()<C>(arg(0), arg(1)));
        else r = convert<R>(e.f.template operator()<C>(arg(0), arg(1), arg(2)));
        result = exactly(r);
      } else {
        LAZYRT_ASSERT(false, "folding ", ir::op_name(op), " of ", dtype_name(in_types[0].dtype),
                      ", which its type rule refuses");
      }
    });
  });
  return result;
}

// The sum (or mean) of `count` equal elements, when that is exactly what the kernel computes:
// it accumulates floats in double, so for a value of at most 24 significant bits (f32, bf16,
// f16) every partial sum j * e is exact while count < 2^29, and the sum is e * count (the mean
// is e). f64 and integer sums are left to the kernel.
std::optional<double> fold_sum_or_mean(OpKind op, const ir::TensorType& in, double value,
                                       const ir::TensorType& out) {
  if (in.dtype != DType::f32 && in.dtype != DType::bf16 && in.dtype != DType::f16) return std::nullopt;
  const int64_t count = in.numel() / out.numel();
  if (count >= (int64_t{1} << 29) || (op == OpKind::Mean && count == 0)) return std::nullopt;
  double element = 0;  // the value as stored in the input
  visit_dtype(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    element = static_cast<double>(convert<float>(convert<T>(value)));
  });
  return op == OpKind::Sum ? element * static_cast<double>(count) : element;
}

}  // namespace

Graph constant_folding(const Graph& g) {
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Graph& ng = rw.graph();
    // Empty results are constants whatever the operands hold: a node all of whose results
    // are empty need not run, nor its operands be computed (an index_put on an empty slice of
    // a wide tensor would compute positions along every dim; a scan over empty carries would
    // run all its trips). Not a node that may refuse its operands' values: its check runs.
    bool all_empty = n.op != OpKind::Parameter && n.op != OpKind::Full && !n.results.empty() && !ir::may_fail(n);
    for (const ir::TensorType& t : n.results) all_empty = all_empty && t.numel() == 0;
    if (all_empty) {
      for (size_t r = 0; r < n.results.size(); ++r)
        rw.set(static_cast<int32_t>(i), static_cast<int32_t>(r),
               rw.graph().add_full(0, n.results[r].shape, n.results[r].dtype));
      continue;
    }
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
    } else if ((n.op == OpKind::Sum || n.op == OpKind::Mean) && out.numel() > 0) {
      value = fold_sum_or_mean(n.op, ng.type(rw.map(n.operands[0])), full_value(ng, rw.map(n.operands[0])),
                               out);
    }
    if (value) {
      rw.set(static_cast<int32_t>(i), 0, rw.graph().add_full(*value, out.shape, out.dtype));
    } else {
      rw.copy(static_cast<int32_t>(i));
    }
  }
  return rw.finish();
}

namespace {

// The operands of elementwise node n (result shape s) for running it in shape `to` instead:
// those of shape s given by full(v), the others as they are, unless one would read other
// elements broadcast against `to` (after its leading 1s it must span only trailing dims s and
// `to` share; its leading 1s are dropped where it has more dims than `to`).
template <class Full>
std::optional<std::vector<ValueRef>> operands_in(Graph& ng, const std::vector<ValueRef>& ops, const Shape& s,
                                                 const Shape& to, Full&& full) {
  size_t shared = 0;  // trailing dims s and `to` have in common
  while (shared < s.size() && shared < to.size() && s[s.size() - 1 - shared] == to[to.size() - 1 - shared]) ++shared;
  auto leading_ones = [](const Shape& t) {
    size_t lead = 0;
    while (lead < t.size() && t[lead] == 1) ++lead;
    return lead;
  };
  for (ValueRef v : ops) {
    const Shape& t = ng.type(v).shape;
    if (t != s && t.size() - leading_ones(t) > shared) return std::nullopt;
  }
  std::vector<ValueRef> out;
  for (ValueRef v : ops) {
    const Shape t = ng.type(v).shape;  // ng grows below
    if (t == s) out.push_back(full(v));
    else if (t.size() <= to.size()) out.push_back(v);
    else out.push_back(ng.add(OpKind::Reshape, {v}, {Shape(t.begin() + static_cast<std::ptrdiff_t>(leading_ones(t)), t.end())}));
  }
  return out;
}

bool plain_elementwise(const Node& n) {
  return ir::has_flag(n.op, ir::kElementwise) && n.results.size() == 1 && n.regions.empty();
}

// Elementwise node n (operands `ops` in the new graph ng) read through reshapes: when every
// operand of n's result shape S is a reshape of a value of one other shape S' made by an
// elementwise node (with which n may then fuse; moving n away from other values of S would
// only split its group there), n can run in S' on the reshapes' operands, followed by one
// reshape to S. A linear layer over [batch, tokens, features] is a product over [batch *
// tokens, features], a bias-add there, and a reshape back: its activation then joins the
// bias-add's fusion group, and the reshape back to the product's shape cancels. Returns the
// operands in S', or nothing.
std::optional<std::vector<ValueRef>> operands_before_reshape(Graph& ng, const Node& n, const std::vector<ValueRef>& ops) {
  if (!plain_elementwise(n)) return std::nullopt;
  const Shape& s = n.results[0].shape;
  std::optional<Shape> from;
  for (ValueRef v : ops) {
    if (ng.type(v).shape != s) continue;
    const Node& def = ng.node(v);
    if (def.op != OpKind::Reshape || !ir::has_flag(ng.node(def.operands[0]).op, ir::kElementwise)) return std::nullopt;
    const Shape& src = ng.type(def.operands[0]).shape;
    if (from && *from != src) return std::nullopt;
    from = src;
  }
  if (!from || *from == s) return std::nullopt;
  return operands_in(ng, ops, s, *from, [&](ValueRef v) { return ng.node(v).operands[0]; });
}

// Elementwise node n whose only reader is a reshape to `to`, and none of whose operands of its
// own shape is made by an elementwise node (it has nothing to fuse with in its shape): n can
// run in `to` on reshapes of those operands, and the reshape goes. A bias-add after a product
// over [batch * tokens, features] then joins the ops over the tokens that read it (a residual
// add and the layer norm after it). Returns the operands in `to`, or nothing.
std::optional<std::vector<ValueRef>> operands_after_reshape(Graph& ng, const Node& n, const std::vector<ValueRef>& ops,
                                                            const Shape& to) {
  if (!plain_elementwise(n)) return std::nullopt;
  const Shape& s = n.results[0].shape;
  if (s == to) return std::nullopt;
  bool any = false;
  for (ValueRef v : ops) {
    if (ng.type(v).shape != s) continue;
    if (ir::has_flag(ng.node(v).op, ir::kElementwise)) return std::nullopt;
    any = true;
  }
  if (!any) return std::nullopt;
  return operands_in(ng, ops, s, to, [&](ValueRef v) {
    if (ng.node(v).op == OpKind::Full) {  // a constant of the shape: the same constant in `to`
      const ir::TensorType t = ng.type(v);
      return ng.add_full(ir::NodeAttrs(OpKind::Full, ng.node(v).attrs).f<"value">(), to, t.dtype);
    }
    const ValueRef src = ng.node(v).op == OpKind::Reshape ? ng.node(v).operands[0] : v;
    return ng.type(src).shape == to ? src : ng.add(OpKind::Reshape, {src}, {to});
  });
}

}  // namespace

Graph algebraic_simplification(const Graph& g) {
  std::vector<bool> is_output(g.nodes.size(), false);
  for (ValueRef v : g.outputs) is_output[v.node] = true;
  // Per node: the reshape that is its only reader, or -1.
  std::vector<int32_t> sole_reshape(g.nodes.size(), -1), reads(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueRef v : g.nodes[i].operands) {
      ++reads[v.node];
      sole_reshape[v.node] = g.nodes[i].op == OpKind::Reshape ? static_cast<int32_t>(i) : -1;
    }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (reads[i] != 1) sole_reshape[i] = -1;
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Graph& ng = rw.graph();
    std::vector<ValueRef> ops;
    for (ValueRef v : n.operands) ops.push_back(rw.map(v));
    // An output stays in its own shape: it is written straight into the output's buffer.
    if (!is_output[i]) {
      if (auto before = operands_before_reshape(rw.graph(), n, ops)) {
        const ValueRef computed = rw.graph().add(n.op, std::move(*before), n.attrs);
        rw.set(static_cast<int32_t>(i), 0, rw.graph().add(OpKind::Reshape, {computed}, {n.results[0].shape}));
        continue;
      }
      // Its only reader, the reshape, then finds a value of its own type and goes.
      if (const int32_t r = sole_reshape[i]; r >= 0)
        if (auto after = operands_after_reshape(rw.graph(), n, ops, g.nodes[static_cast<size_t>(r)].results[0].shape)) {
          rw.set(static_cast<int32_t>(i), 0, rw.graph().add(n.op, std::move(*after), n.attrs));
          continue;
        }
    }
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
      case OpKind::StopGradient:  // only autograd (loop gradients) reads it
        same = ops[0];
        break;
      case OpKind::Reshape:
      case OpKind::Expand:
      case OpKind::Cast:
        if (keeps_type(ops[0])) same = ops[0];
        else if (n.op == OpKind::Reshape && ng.node(ops[0]).op == OpKind::Reshape) {
          const ValueRef inner = ng.node(ops[0]).operands[0];
          if (keeps_type(inner)) same = inner;
          else {
            rw.set(static_cast<int32_t>(i), 0, rw.graph().add(OpKind::Reshape, {inner}, n.attrs));
            continue;
          }
        }
        break;
      case OpKind::Permute: {
        const auto& perm = ir::NodeAttrs(n.op, n.attrs).ints<"dims">();
        ValueRef src = ops[0];
        std::vector<int64_t> composed = perm;
        if (ng.node(src).op == OpKind::Permute) {
          const Node& inner_node = ng.node(src);
          const auto& inner = ir::NodeAttrs(inner_node.op, inner_node.attrs).ints<"dims">();
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

namespace {

// A permute that swaps the last two dims and keeps the others.
bool is_transpose(const Node& n) {
  if (n.op != OpKind::Permute) return false;
  const auto& dims = ir::NodeAttrs(n.op, n.attrs).ints<"dims">();
  const size_t r = dims.size();
  if (r < 2 || dims[r - 2] != static_cast<int64_t>(r - 1) || dims[r - 1] != static_cast<int64_t>(r - 2)) return false;
  for (size_t d = 0; d + 2 < r; ++d)
    if (dims[d] != static_cast<int64_t>(d)) return false;
  return true;
}

}  // namespace

Graph transposes_into_gemm(const Graph& g) {
  std::vector<int32_t> uses(g.nodes.size(), 0);
  for (const Node& n : g.nodes)
    for (ValueRef v : n.operands) ++uses[v.node];
  for (ValueRef v : g.outputs) ++uses[v.node];
  struct Product {
    ValueRef x, y;
    bool tx, ty;
  };
  // A matmul (batched or not) as x @ y with transposed operands looked through.
  auto product_of = [&](const Node& n) -> std::optional<Product> {
    if (n.op != OpKind::Matmul) return std::nullopt;
    Product p{n.operands[0], n.operands[1], false, false};
    if (is_transpose(g.node(p.x))) p = {g.node(p.x).operands[0], p.y, true, false};
    if (is_transpose(g.node(p.y))) p = {p.x, g.node(p.y).operands[0], p.tx, true};
    return p;
  };
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::optional<Product> p;
    if (is_transpose(n) && uses[n.operands[0].node] == 1) {
      // (x y)^T = y^T x^T
      if (auto q = product_of(g.node(n.operands[0]))) p = Product{q->y, q->x, !q->ty, !q->tx};
    } else if (auto q = product_of(n); q && (q->tx || q->ty)) {
      p = q;
    }
    if (!p) {
      rw.copy(static_cast<int32_t>(i));
      continue;
    }
    rw.set(static_cast<int32_t>(i), 0,
           rw.graph().add(OpKind::Gemm, {rw.map(p->x), rw.map(p->y)}, {p->tx, p->ty}));
  }
  return rw.finish();
}

namespace {

// The strides of a view of these sizes and strides reshaped to `to`, where the reshape keeps it
// a view (each run of the new dims splits or merges dims that are contiguous with one another
// in the view); nullopt where it needs a copy.
std::optional<std::vector<int64_t>> reshaped_strides(const std::vector<int64_t>& sizes,
                                                     const std::vector<int64_t>& strides, const Shape& to) {
  std::vector<int64_t> out(to.size(), 0);
  if (shape_numel(to) == 0 || sizes.empty()) {
    int64_t st = 1;
    for (size_t d = to.size(); d-- > 0;) {
      out[d] = st;
      st *= std::max<int64_t>(to[d], 1);
    }
    return out;
  }
  auto view_d = static_cast<int64_t>(to.size()) - 1;
  int64_t chunk_stride = strides.back(), tensor_numel = 1, view_numel = 1;
  for (auto d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[static_cast<size_t>(d)];
    // The chunk of dims ends where the next dim out is not laid out right after this one.
    if (d == 0 || (sizes[static_cast<size_t>(d - 1)] != 1 &&
                   strides[static_cast<size_t>(d - 1)] != tensor_numel * chunk_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to[static_cast<size_t>(view_d)] == 1)) {
        out[static_cast<size_t>(view_d)] = view_numel * chunk_stride;
        view_numel *= to[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_stride = strides[static_cast<size_t>(d - 1)];
        tensor_numel = view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

// A value as a strided view of the value its slices, permutes and reshapes start from (the
// value itself where it is made otherwise).
struct ViewOf {
  ValueRef src;
  ir::StridedView view;
};

ViewOf view_of(const Graph& g, ValueRef v) {
  const Node& n = g.node(v);
  const Shape& shape = n.results[static_cast<size_t>(v.index)].shape;
  if (n.results.size() == 1 && (n.op == OpKind::Permute || n.op == OpKind::Slice || n.op == OpKind::Reshape)) {
    ViewOf in = view_of(g, n.operands[0]);
    const ir::NodeAttrs at(n.op, n.attrs);
    ir::StridedView& w = in.view;
    if (n.op == OpKind::Permute) {
      const auto& dims = at.ints<"dims">();
      ir::StridedView p{w.offset, {}, {}};
      for (int64_t d : dims) {
        p.sizes.push_back(w.sizes[static_cast<size_t>(d)]);
        p.strides.push_back(w.strides[static_cast<size_t>(d)]);
      }
      return {in.src, std::move(p)};
    }
    if (n.op == OpKind::Slice) {
      const auto& starts = at.ints<"starts">();
      const auto& steps = at.ints<"steps">();
      for (size_t d = 0; d < w.sizes.size(); ++d) {
        w.offset += starts[d] * w.strides[d];
        w.strides[d] *= steps[d];
        w.sizes[d] = shape[d];
      }
      return in;
    }
    if (auto st = reshaped_strides(w.sizes, w.strides, shape)) return {in.src, {w.offset, shape, *st}};
  }
  return {v, ir::StridedView::whole(shape)};
}

// A product's operands as gemm_view reads them, over batch dims `batch` (the product's own, or
// a split of them that its operands' views keep apart: attention's heads and batch).
struct ProductViews {
  ViewOf x, y;
  Shape batch;
  bool viewed = false;  // an operand is read through a view (else the product stays as it was)
};

ProductViews product_views(const Graph& g, const Node& n) {
  const bool gemm = n.op == OpKind::Gemm;
  const ir::NodeAttrs at(n.op, n.attrs);
  bool t[2] = {gemm && at.b<"transpose_x">(), gemm && at.b<"transpose_y">()};
  // The operands, a transpose looked through as a gemm's flag (a bounded gemm_view's: a
  // matmul's were made gemms by transposes_into_gemm).
  ValueRef operand[2] = {n.operands[0], n.operands[1]};
  if (n.op == OpKind::GemmView)
    for (int k = 0; k < 2; ++k)
      if (is_transpose(g.node(operand[k]))) {
        operand[k] = g.node(operand[k]).operands[0];
        t[k] = true;
      }
  auto transposed = [](ir::StridedView v) {
    const size_t r = v.sizes.size();
    std::swap(v.sizes[r - 2], v.sizes[r - 1]);
    std::swap(v.strides[r - 2], v.strides[r - 1]);
    return v;
  };
  auto batch_of = [](const ir::StridedView& v) { return Shape(v.sizes.begin(), v.sizes.end() - 2); };
  // Each operand's view through slices, permutes and reshapes, and, where it is a reshape that
  // merges batch dims only, the view of the reshape's input (the dims unmerged).
  ViewOf deep[2], split[2];
  bool has_split[2] = {false, false};
  for (int k = 0; k < 2; ++k) {
    const ValueRef v = operand[k];
    deep[k] = view_of(g, v);
    if (t[k]) deep[k].view = transposed(std::move(deep[k].view));
    const Node& p = g.node(v);
    if (p.op == OpKind::Reshape) {
      const Shape& in = g.type(p.operands[0]).shape;
      const Shape& out = g.type(v).shape;
      if (in.size() > out.size() && out.size() >= 2 && std::equal(out.end() - 2, out.end(), in.end() - 2)) {
        split[k] = view_of(g, p.operands[0]);
        if (t[k]) split[k].view = transposed(std::move(split[k].view));
        has_split[k] = split[k].src != p.operands[0] && ir::blas_matrix(split[k].view).has_value();
      }
    }
  }
  const Shape product_batch = batch_of(ir::StridedView::whole(n.results[0].shape));
  auto whole_of = [&](int k) {
    const ValueRef v = operand[k];
    ir::StridedView w = ir::StridedView::whole(g.type(v).shape);
    return ViewOf{v, t[k] ? transposed(std::move(w)) : std::move(w)};
  };
  ProductViews out;
  out.batch = has_split[0] ? batch_of(split[0].view) : has_split[1] ? batch_of(split[1].view) : product_batch;
  // Each operand over those batch dims (its own where it broadcasts), read in place if it can be.
  for (int k = 0; k < 2; ++k) {
    const ValueRef v = operand[k];
    ViewOf chosen = whole_of(k);
    const bool regroup = out.batch != product_batch && batch_of(chosen.view) == product_batch;  // takes the split dims
    auto as_batch = [&](const ViewOf& c) -> std::optional<ViewOf> {
      if (!regroup) return c;
      if (batch_of(c.view) == out.batch) return c;
      Shape to = out.batch;
      to.push_back(c.view.sizes[c.view.sizes.size() - 2]);
      to.push_back(c.view.sizes.back());
      // Regrouping batch dims keeps the matrix dims' strides; reshape them as a whole.
      if (auto st = reshaped_strides(c.view.sizes, c.view.strides, to)) return ViewOf{c.src, {c.view.offset, to, *st}};
      return std::nullopt;
    };
    std::optional<ViewOf> pick;
    if (has_split[k] && (pick = as_batch(split[k]))) {
      chosen = *pick;
    } else if (deep[k].src != v && ir::blas_matrix(deep[k].view) && (pick = as_batch(deep[k]))) {
      chosen = *pick;
    } else if ((pick = as_batch(chosen))) {
      chosen = *pick;
    } else {  // cannot regroup: read whole, as the product does
      return ProductViews{whole_of(0), whole_of(1), product_batch, false};
    }
    out.viewed = out.viewed || chosen.src != n.operands[static_cast<size_t>(k)];
    (k == 0 ? out.x : out.y) = std::move(chosen);
  }
  return out;
}

}  // namespace

Graph views_into_gemm(const Graph& g) {
  std::vector<int32_t> uses(g.nodes.size(), 0);
  for (const Node& n : g.nodes)
    for (ValueRef v : n.operands) ++uses[v.node];
  for (ValueRef v : g.outputs) ++uses[v.node];
  // A product: matmul, gemm, or a gemm_view bounded by valid extents that reads its operands
  // whole (a bucket graph's, compile/polymorphic.h), which keeps its extents.
  auto is_product = [&g](const Node& n) {
    if (n.op == OpKind::Matmul || n.op == OpKind::Gemm) return true;
    if (n.op != OpKind::GemmView || n.operands.size() != 3) return false;
    const ir::NodeAttrs at(n.op, n.attrs);
    return at.ints<"out_perm">().empty() &&
           at.ints<"x_view">() == ir::StridedView::whole(g.type(n.operands[0]).shape).encode() &&
           at.ints<"y_view">() == ir::StridedView::whole(g.type(n.operands[1]).shape).encode();
  };
  auto emit = [](GraphRewriter& rw, const Node& product, const ProductViews& p, std::vector<int64_t> perm) {
    std::vector<ValueRef> operands{rw.map(p.x.src), rw.map(p.y.src)};
    if (product.operands.size() == 3) operands.push_back(rw.map(product.operands[2]));
    return rw.graph().add(OpKind::GemmView, std::move(operands), {p.x.view.encode(), p.y.view.encode(), std::move(perm)});
  };
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (is_product(n)) {
      const ProductViews p = product_views(g, n);
      if (p.viewed) {
        ValueRef r = emit(rw, n, p, {});
        if (rw.graph().type(r).shape != n.results[0].shape)
          r = rw.graph().add(OpKind::Reshape, {r}, {n.results[0].shape});
        rw.set(static_cast<int32_t>(i), 0, r);
        continue;
      }
    } else if (n.op == OpKind::Permute) {
      // A permute keeping the last dim last of a product it alone reads (or of the product's
      // batch dims split again by a reshape it alone reads): written by the product.
      const auto& dims = ir::NodeAttrs(n.op, n.attrs).ints<"dims">();
      const bool keeps_last = !dims.empty() && dims.back() == static_cast<int64_t>(dims.size()) - 1;
      ValueRef from = n.operands[0];
      bool single = uses[from.node] == 1;
      const Node* reshape = nullptr;
      if (g.node(from).op == OpKind::Reshape) {
        reshape = &g.node(from);
        from = reshape->operands[0];
        single = single && uses[from.node] == 1;
      }
      if (keeps_last && single && is_product(g.node(from))) {
        const ProductViews p = product_views(g, g.node(from));
        Shape logical = p.batch;
        const Shape& res = g.node(from).results[0].shape;
        logical.push_back(res[res.size() - 2]);
        logical.push_back(res.back());
        const Shape& permuted_from = reshape ? reshape->results[0].shape : res;
        if (permuted_from == logical) {
          rw.set(static_cast<int32_t>(i), 0, emit(rw, g.node(from), p, dims));
          continue;
        }
      }
    }
    rw.copy(static_cast<int32_t>(i));
  }
  return rw.finish();
}

Graph order_reads_before_updates(const Graph& g, const std::vector<int32_t>& donations) {
  const size_t n = g.nodes.size();
  std::vector<int32_t> param_node(static_cast<size_t>(g.num_params), -1);
  for (size_t i = 0; i < n; ++i)
    if (const Node& p = g.nodes[i]; p.op == OpKind::Parameter)
      param_node[ir::NodeAttrs(p.op, p.attrs).i<"index">()] = static_cast<int32_t>(i);
  // after[i]: nodes that must come before node i besides its operands.
  std::vector<std::vector<int32_t>> after(n);
  bool any = false;
  for (size_t k = 0; k < donations.size() && k < g.outputs.size(); ++k) {
    const int32_t p = donations[k];
    const int32_t producer = g.outputs[k].node;
    if (p < 0 || param_node[p] < 0 || g.nodes[producer].op == OpKind::Parameter) continue;
    for (size_t r = 0; r < n; ++r) {
      if (static_cast<int32_t>(r) == producer) continue;
      for (ValueRef v : g.nodes[r].operands)
        if (v.node == param_node[p]) {
          after[producer].push_back(static_cast<int32_t>(r));
          any = true;
          break;
        }
    }
  }
  if (!any) return g;
  // Kahn's algorithm, the earliest node of the old order first; a cycle (a reader that
  // depends on the update) keeps the old order.
  std::vector<std::vector<int32_t>> users(n);
  std::vector<int32_t> waiting(n, 0);
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> deps = after[i];
    for (ValueRef v : g.nodes[i].operands) deps.push_back(v.node);
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    for (int32_t d : deps) users[d].push_back(static_cast<int32_t>(i));
    waiting[i] = static_cast<int32_t>(deps.size());
  }
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<int32_t>> ready;
  for (size_t i = 0; i < n; ++i)
    if (waiting[i] == 0) ready.push(static_cast<int32_t>(i));
  GraphRewriter rw(g);
  size_t emitted = 0;
  while (!ready.empty()) {
    const int32_t i = ready.top();
    ready.pop();
    rw.copy(i);
    ++emitted;
    for (int32_t u : users[i])
      if (--waiting[u] == 0) ready.push(u);
  }
  return emitted == n ? rw.finish() : g;
}

namespace {

// Values of fewer bytes are left alone, and so are chains deeper than kRematDepth nodes.
constexpr size_t kRematMinBytes = size_t{64} << 10;
constexpr int kRematDepth = 6;
// An operand this many times smaller than the value made from it (a per-channel mean) may be
// read later than before.
constexpr size_t kRematSmallOperand = 8;

class Rematerializer {
 public:
  explicit Rematerializer(const Graph& g) : g_(g), last_read_(g.nodes.size(), -1), rw_(g) {
    const auto n = static_cast<int32_t>(g.nodes.size());
    for (int32_t i = 0; i < n; ++i)
      for (ValueRef v : g.nodes[i].operands) last_read_[v.node] = std::max(last_read_[v.node], i);
    for (ValueRef v : g.outputs) last_read_[v.node] = n;
  }

  Graph run() {
    const auto n = static_cast<int32_t>(g_.nodes.size());
    for (int32_t u = 0; u < n; ++u) {
      const Node& reader = g_.nodes[u];
      bool distant = false;
      for (ValueRef v : reader.operands) distant |= worth(v, u);
      if (!distant) {
        rw_.copy(u);
        continue;
      }
      clones_.clear();
      Node c = reader;
      for (ValueRef& v : c.operands) v = worth(v, u) ? clone(v.node, u) : rw_.map(v);
      rw_.graph().nodes.push_back(std::move(c));
      const auto idx = static_cast<int32_t>(rw_.graph().nodes.size() - 1);
      for (size_t k = 0; k < reader.results.size(); ++k) rw_.set(u, static_cast<int32_t>(k), {idx, static_cast<int32_t>(k)});
    }
    return rw_.finish();
  }

 private:
  static bool cheap(const Node& n) { return n.op == OpKind::Full || plain_elementwise(n); }

  // Whether reader u should compute operand v again instead of reading it: v is a large value
  // of a cheap node, not an output, made long before u, and computable at u from values live
  // there anyway.
  bool worth(ValueRef v, int32_t u) const {
    const Node& p = g_.nodes[v.node];
    return u - v.node >= kDistantReader && cheap(p) && p.results[0].bytes() >= kRematMinBytes &&
           last_read_[v.node] < static_cast<int32_t>(g_.nodes.size()) && computable(v.node, u, 0);
  }

  // Operand v of a node computed again at u can be read as it is: a parameter (held by the
  // caller), a value read at or after u anyway, or one much smaller than what is made from it.
  bool readable(ValueRef v, int32_t u, size_t made_bytes) const {
    return g_.nodes[v.node].op == OpKind::Parameter || last_read_[v.node] >= u ||
           g_.type(v).bytes() * kRematSmallOperand <= made_bytes;
  }

  // Whether node i can be computed again just before node u from values readable there.
  bool computable(int32_t i, int32_t u, int depth) const {
    const Node& n = g_.nodes[i];
    if (!cheap(n) || depth > kRematDepth) return false;
    for (ValueRef v : n.operands)
      if (!readable(v, u, n.results[0].bytes()) && !computable(v.node, u, depth + 1)) return false;
    return true;
  }

  // Node i computed again (with what it needs that is not readable) for reader u.
  ValueRef clone(int32_t i, int32_t u) {
    if (auto it = clones_.find(i); it != clones_.end()) return it->second;
    Node c = g_.nodes[i];
    for (ValueRef& v : c.operands) v = readable(v, u, c.results[0].bytes()) ? rw_.map(v) : clone(v.node, u);
    rw_.graph().nodes.push_back(std::move(c));
    const ValueRef r{static_cast<int32_t>(rw_.graph().nodes.size() - 1), 0};
    clones_.emplace(i, r);
    return r;
  }

  const Graph& g_;
  std::vector<int32_t> last_read_;  // per node: its last reader's index (outputs: past the end)
  GraphRewriter rw_;
  std::map<int32_t, ValueRef> clones_;  // for the reader being rewritten
};

}  // namespace

Graph rematerialize_for_distant_readers(const Graph& g) { return Rematerializer(g).run(); }

Graph hoist_small_reductions(const Graph& g) {
  const size_t n = g.nodes.size();
  std::vector<int32_t> last_read(n, -1);
  for (size_t i = 0; i < n; ++i)
    for (ValueRef v : g.nodes[i].operands) last_read[v.node] = static_cast<int32_t>(i);
  for (ValueRef v : g.outputs) last_read[v.node] = static_cast<int32_t>(n);
  auto hoisted = [&](size_t i) {
    const Node& r = g.nodes[i];
    switch (r.op) {
      case OpKind::Sum: case OpKind::Mean: case OpKind::Var: case OpKind::Std: case OpKind::Amax: case OpKind::Amin: break;
      default: return false;
    }
    const ValueRef x = r.operands[0];
    return last_read[x.node] == static_cast<int32_t>(i) && r.results[0].bytes() * kRematSmallOperand <= g.type(x).bytes();
  };
  // Each hoisted node goes right after the last of its operands' producers; the others keep
  // their order.
  std::vector<std::vector<int32_t>> waiting_on(n);  // producer -> hoisted nodes it holds back
  std::vector<int32_t> pending(n, 0);
  std::vector<bool> hoist(n, false), done(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (!(hoist[i] = hoisted(i))) continue;
    std::vector<int32_t> producers;
    for (ValueRef v : g.nodes[i].operands) producers.push_back(v.node);
    std::sort(producers.begin(), producers.end());
    producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
    for (int32_t p : producers) waiting_on[p].push_back(static_cast<int32_t>(i));
    pending[i] = static_cast<int32_t>(producers.size());
  }
  GraphRewriter rw(g);
  std::vector<int32_t> stack;
  auto emit = [&](int32_t i) {
    stack.push_back(i);
    while (!stack.empty()) {
      const int32_t x = stack.back();
      stack.pop_back();
      rw.copy(x);
      done[x] = true;
      for (int32_t h : waiting_on[x])
        if (--pending[h] == 0) stack.push_back(h);
    }
  };
  for (size_t i = 0; i < n; ++i)
    if (!hoist[i] || (pending[i] == 0 && !done[i])) emit(static_cast<int32_t>(i));
  return rw.finish();
}

Graph optimize(const Graph& g, const backend::Capabilities& caps) {
  Graph x = constant_folding(g);
  x = algebraic_simplification(x);
  x = common_subexpression_elimination(x);
  x = dead_code_elimination(x);
  if (caps.gemm) x = dead_code_elimination(views_into_gemm(dead_code_elimination(transposes_into_gemm(x))));
  if (caps.fuses()) x = dead_code_elimination(rematerialize_for_distant_readers(hoist_small_reductions(x)));
  return caps.fuses() ? dead_code_elimination(fuse_elementwise(x, caps)) : x;
}

}  // namespace lazyrt::compile
