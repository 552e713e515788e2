#include <algorithm>

#include "ir/graph.h"
#include "util/check.h"

namespace lazyrt::ir {
namespace {

using lazyrt::detail::str_cat;

bool attr_has_kind(const AttrValue& v, AttrKind k) {
  switch (k) {
    case AttrKind::Int: return std::holds_alternative<int64_t>(v);
    case AttrKind::Float: return std::holds_alternative<double>(v);
    case AttrKind::Bool: return std::holds_alternative<bool>(v);
    case AttrKind::DType: return std::holds_alternative<DType>(v);
    case AttrKind::Ints: return std::holds_alternative<std::vector<int64_t>>(v);
  }
  return false;
}

[[noreturn]] void fail(size_t node, const Node& n, const std::string& what) {
  throw Error(str_cat("verify: node %", node, " (", op_name(n.op), "): ", what));
}

void verify_region_params(size_t i, const Node& n, const Graph& r, const char* which,
                          const std::vector<TensorType>& operands) {
  if (r.num_params != static_cast<int64_t>(operands.size()))
    fail(i, n, str_cat(which, " region has ", r.num_params, " parameters for ", operands.size(),
                       " operands"));
  for (const Node& rn : r.nodes) {
    if (rn.op != OpKind::Parameter) continue;
    const int64_t index = NodeAttrs(rn.op, rn.attrs).i<"index">();
    if (rn.results[0] != operands[index])
      fail(i, n, str_cat(which, " parameter ", index, " is ", type_str(rn.results[0]),
                         ", its operand ", type_str(operands[index])));
  }
}

void verify_while(size_t i, const Node& n, const std::vector<TensorType>& operands) {
  if (n.regions.size() != 2) fail(i, n, "a while needs a cond and a body region");
  const Graph& cond = *n.regions[0];
  const Graph& body = *n.regions[1];
  verify(cond);
  verify(body);
  verify_region_params(i, n, cond, "cond", operands);
  verify_region_params(i, n, body, "body", operands);
  if (cond.outputs.size() != 1 || cond.type(cond.outputs[0]).dtype != DType::b8 ||
      cond.type(cond.outputs[0]).numel() != 1)
    fail(i, n, "cond must return one b8 element");
  const auto carries = static_cast<size_t>(NodeAttrs(n.op, n.attrs).i<"carries">());
  if (body.outputs.size() != carries)
    fail(i, n, str_cat("body returns ", body.outputs.size(), " values for ", carries, " carries"));
  for (size_t k = 0; k < carries; ++k)
    if (body.type(body.outputs[k]) != operands[k])
      fail(i, n, str_cat("body result ", k, " is ", type_str(body.type(body.outputs[k])),
                         ", the carry is ", type_str(operands[k])));
}

// A row of a stacked type: its type without dim 0.
TensorType row_of(const TensorType& t) {
  return {t.dtype, Shape(t.shape.begin() + 1, t.shape.end())};
}

// The body sees the carries, one row of each stacked input and the captures; it returns the
// new carries and one row of each stacked output (the result types, from the rule).
void verify_scan(size_t i, const Node& n, const std::vector<TensorType>& operands,
                 const std::vector<TensorType>& results) {
  if (n.regions.size() != 1) fail(i, n, "a scan needs one body region");
  const Graph& body = *n.regions[0];
  verify(body);
  const NodeAttrs at(n.op, n.attrs);
  const auto carries = static_cast<size_t>(at.i<"carries">());
  const auto xs = static_cast<size_t>(at.i<"xs">());
  std::vector<TensorType> params = operands;
  for (size_t k = carries; k < carries + xs; ++k) params[k] = row_of(operands[k]);
  verify_region_params(i, n, body, "body", params);
  if (body.outputs.size() != results.size())
    fail(i, n, str_cat("body returns ", body.outputs.size(), " values for ", results.size(),
                       " results"));
  for (size_t k = 0; k < results.size(); ++k) {
    const TensorType want = k < carries ? results[k] : row_of(results[k]);
    if (body.type(body.outputs[k]) != want)
      fail(i, n, str_cat("body result ", k, " is ", type_str(body.type(body.outputs[k])),
                         ", expected ", type_str(want)));
  }
}

// Region 0 (the vector-Jacobian body) takes the backward carries, the forward carries, one row
// of each stacked input and the captures, and returns the new backward carries and one row of
// each stacked output; region 1 (the forward body) takes the forward carries, rows of the
// first state_xs stacked inputs and the first state_captures captures, and returns (at least)
// the new forward carries.
void verify_scan_vjp(size_t i, const Node& n, const std::vector<TensorType>& operands,
                     const std::vector<TensorType>& results) {
  if (n.regions.size() != 2) fail(i, n, "a scan_vjp needs a vjp and a forward region");
  const NodeAttrs at(n.op, n.attrs);
  // Each a count of operands before they are added up (a negative one read from a file would
  // wrap around as a size and pass the sum's check).
  for (int64_t count : {at.i<"carries">(), at.i<"xs">(), at.i<"states">(), at.i<"state_xs">(), at.i<"state_captures">()})
    if (count < 0 || count > static_cast<int64_t>(operands.size()))
      fail(i, n, str_cat("carries, stacked inputs, states and captures must count its ", operands.size(),
                         " operands, got ", count));
  const auto B = static_cast<size_t>(at.i<"carries">()), XS = static_cast<size_t>(at.i<"xs">());
  const auto C = static_cast<size_t>(at.i<"states">()), FX = static_cast<size_t>(at.i<"state_xs">());
  const auto P = static_cast<size_t>(at.i<"state_captures">());
  // A length counted when it runs: the count is the last operand, and snapshots 0 keeps
  // every state (held for the run, not planned).
  const size_t counted = at.i<"length">() == -1 ? 1 : 0;
  if (B + XS + C + counted > operands.size() || FX > XS || P > operands.size() - B - XS - C - counted ||
      at.i<"snapshots">() < (counted ? 0 : 1))
    fail(i, n, "carries, stacked inputs, states and snapshots do not fit the operands");
  const size_t K = operands.size() - B - XS - C - counted;
  auto state = [&](size_t k) { return operands[B + XS + K + k]; };
  std::vector<TensorType> vjp(operands.begin(), operands.begin() + static_cast<int64_t>(B));
  for (size_t k = 0; k < C; ++k) vjp.push_back(state(k));
  for (size_t j = 0; j < XS; ++j) vjp.push_back(row_of(operands[B + j]));
  for (size_t q = 0; q < K; ++q) vjp.push_back(operands[B + XS + q]);
  std::vector<TensorType> fwd;
  for (size_t k = 0; k < C; ++k) fwd.push_back(state(k));
  for (size_t j = 0; j < FX; ++j) fwd.push_back(row_of(operands[B + j]));
  for (size_t q = 0; q < P; ++q) fwd.push_back(operands[B + XS + q]);
  const Graph& body = *n.regions[0];
  const Graph& forward = *n.regions[1];
  verify(body);
  verify(forward);
  verify_region_params(i, n, body, "vjp", vjp);
  verify_region_params(i, n, forward, "forward", fwd);
  if (body.outputs.size() != results.size())
    fail(i, n, str_cat("vjp returns ", body.outputs.size(), " values for ", results.size(), " results"));
  for (size_t k = 0; k < results.size(); ++k) {
    const TensorType want = k < B ? results[k] : row_of(results[k]);
    if (body.type(body.outputs[k]) != want)
      fail(i, n, str_cat("vjp result ", k, " is ", type_str(body.type(body.outputs[k])), ", expected ", type_str(want)));
  }
  if (forward.outputs.size() < C) fail(i, n, "the forward region returns fewer values than its carries");
  for (size_t k = 0; k < C; ++k)
    if (forward.type(forward.outputs[k]) != state(k))
      fail(i, n, str_cat("forward result ", k, " is ", type_str(forward.type(forward.outputs[k])), ", the carry is ",
                         type_str(state(k))));
}

// The region is a graph of the operands' types whose outputs have the result types.
void verify_call(size_t i, const Node& n, const std::vector<TensorType>& operands) {
  if (n.regions.size() != 1) fail(i, n, "a call needs one region");
  const Graph& r = *n.regions[0];
  verify(r);
  verify_region_params(i, n, r, "call", operands);
  if (r.outputs.size() != n.results.size())
    fail(i, n, str_cat("region returns ", r.outputs.size(), " values for ", n.results.size(), " results"));
  for (size_t k = 0; k < r.outputs.size(); ++k)
    if (r.type(r.outputs[k]) != n.results[k])
      fail(i, n, str_cat("region output ", k, " is ", type_str(r.type(r.outputs[k])), ", result ", k, " is ",
                         type_str(n.results[k])));
}

// The region computes the results over `shape` (ops.def): parameters (the operands),
// constants, elementwise nodes of `shape` or (with reduced dims) of a per-row shape, and
// reductions over the row.
void verify_fusion(size_t i, const Node& n, const std::vector<TensorType>& operands) {
  if (n.regions.size() != 1) fail(i, n, "a fusion needs one region");
  const Graph& r = *n.regions[0];
  verify(r);
  verify_region_params(i, n, r, "fusion", operands);
  const NodeAttrs a(n.op, n.attrs);
  const Shape& shape = a.ints<"shape">();
  const int64_t reduced = a.i<"reduced">();
  const FusionRows rows = fusion_rows(shape, reduced);
  auto per_row = [&](const Shape& s) { return reduced > 0 && (s == rows.keep || s == rows.drop); };
  for (const Node& rn : r.nodes) {
    if (rn.op == OpKind::Parameter || rn.op == OpKind::Full) continue;
    const Shape& s = rn.results.size() == 1 ? rn.results[0].shape : shape;
    if (reduced > 0 && row_reduction_dims(r, rn) == reduced && r.type(rn.operands[0]).shape == shape) continue;
    if (!has_flag(rn.op, kElementwise) || rn.results.size() != 1 || (s != shape && !per_row(s)))
      fail(i, n, str_cat("region node ", op_name(rn.op), " : ", types_str(rn.results), " is not elementwise over ",
                         shape_str(shape), reduced > 0 ? " or one value per row" : "",
                         reduced > 0 ? ", nor a reduction over its row" : ""));
    // A value per row reaches the elements of its row with the row's dims kept as 1.
    if (s == shape && reduced > 0)
      for (ValueRef v : rn.operands) {
        const Node& src = r.node(v);
        if (src.op != OpKind::Parameter && src.op != OpKind::Full && r.type(v).shape == rows.drop)
          fail(i, n, str_cat("region node ", op_name(rn.op), " reads a value per row of ", shape_str(rows.drop),
                             " without the row's dims"));
      }
  }
  if (r.outputs.size() != n.results.size())
    fail(i, n, str_cat("region returns ", r.outputs.size(), " values for ", n.results.size(), " results"));
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    const Node& src = r.node(r.outputs[k]);
    if (src.op == OpKind::Parameter || src.op == OpKind::Full || r.type(r.outputs[k]) != n.results[k])
      fail(i, n, str_cat("region output ", k, " is not a computed ", type_str(n.results[k])));
  }
}

}  // namespace

void verify(const Graph& g) {
  std::vector<bool> param_seen(static_cast<size_t>(std::max<int64_t>(g.num_params, 0)), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const OpInfo& info = op_info(n.op);
    if (info.operands >= 0 && static_cast<int>(n.operands.size()) != info.operands)
      fail(i, n, str_cat("has ", n.operands.size(), " operands, the op takes ", info.operands));
    if (n.op != OpKind::While && n.op != OpKind::Scan && n.op != OpKind::ScanVjp && n.op != OpKind::Fusion &&
        n.op != OpKind::Call && !n.regions.empty())
      fail(i, n, str_cat("has ", n.regions.size(), " regions, only while, scan, scan_vjp, fusion and call own regions"));
    if (n.attrs.values.size() != info.attrs.size())
      fail(i, n, str_cat("has ", n.attrs.values.size(), " attributes, the op takes ",
                         info.attrs.size()));
    for (size_t k = 0; k < info.attrs.size(); ++k)
      if (!attr_has_kind(n.attrs.values[k], info.attrs[k].kind))
        fail(i, n, str_cat("attribute ", info.attrs[k].name, " has the wrong kind"));
    std::vector<TensorType> in;
    for (ValueRef v : n.operands) {
      if (v.node < 0 || static_cast<size_t>(v.node) >= i)
        fail(i, n, str_cat("operand %", v.node, " does not come before it"));
      const Node& def = g.nodes[v.node];
      if (v.index < 0 || static_cast<size_t>(v.index) >= def.results.size())
        fail(i, n, str_cat("operand %", v.node, ".", v.index, " names no result"));
      in.push_back(def.results[v.index]);
    }
    if (n.op == OpKind::Parameter) {
      int64_t idx = NodeAttrs(n.op, n.attrs).i<"index">();
      if (idx < 0 || idx >= g.num_params) fail(i, n, str_cat("index ", idx, " out of range"));
      if (param_seen[idx]) fail(i, n, str_cat("parameter ", idx, " appears twice"));
      param_seen[idx] = true;
      if (n.results.size() != 1) fail(i, n, "a parameter has exactly one result");
      continue;
    }
    if (n.op == OpKind::Call) {  // no rule: its results are its region's
      verify_call(i, n, in);
      continue;
    }
    std::vector<TensorType> expect;
    try {
      expect = infer_types(n.op, in, n.attrs);
    } catch (const Error& e) {
      fail(i, n, e.what());
    }
    if (n.op == OpKind::While) verify_while(i, n, in);
    if (n.op == OpKind::Scan) verify_scan(i, n, in, expect);
    if (n.op == OpKind::ScanVjp) verify_scan_vjp(i, n, in, expect);
    if (n.op == OpKind::Fusion) verify_fusion(i, n, in);
    if (expect != n.results) {
      std::string got, want;
      for (const auto& t : n.results) got += type_str(t) + " ";
      for (const auto& t : expect) want += type_str(t) + " ";
      fail(i, n, str_cat("result types ", got, "differ from the rule's ", want));
    }
  }
  for (ValueRef v : g.outputs) {
    if (v.node < 0 || static_cast<size_t>(v.node) >= g.nodes.size() || v.index < 0 ||
        static_cast<size_t>(v.index) >= g.nodes[v.node].results.size())
      throw Error(str_cat("verify: output %", v.node, ".", v.index, " names no result"));
  }
}

}  // namespace lazyrt::ir
