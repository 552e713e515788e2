#include <algorithm>

#include "ir/graph.h"
#include "util/check.h"

namespace lazyrt::ir {
namespace {

using detail::str_cat;

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

}  // namespace

void verify(const Graph& g) {
  std::vector<bool> param_seen(static_cast<size_t>(std::max<int64_t>(g.num_params, 0)), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const OpInfo& info = op_info(n.op);
    if (static_cast<int>(n.operands.size()) != info.operands)
      fail(i, n, str_cat("has ", n.operands.size(), " operands, the op takes ", info.operands));
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
      int64_t idx = n.attrs.i(0);
      if (idx < 0 || idx >= g.num_params) fail(i, n, str_cat("index ", idx, " out of range"));
      if (param_seen[idx]) fail(i, n, str_cat("parameter ", idx, " appears twice"));
      param_seen[idx] = true;
      if (n.results.size() != 1) fail(i, n, "a parameter has exactly one result");
      continue;
    }
    std::vector<TensorType> expect;
    try {
      expect = infer_types(n.op, in, n.attrs);
    } catch (const Error& e) {
      fail(i, n, e.what());
    }
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
