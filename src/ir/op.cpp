#include "ir/op.h"

#include <array>
#include <string>

#include "ir/graph.h"
#include "ir/rules.h"
#include "util/check.h"

namespace lazyrt::ir {
namespace {

std::vector<AttrSpec> parse_attr_specs(std::string_view spec) {
  std::vector<AttrSpec> out;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(' ', pos);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    size_t colon = item.find(':');
    LAZYRT_ASSERT(colon != std::string_view::npos, "bad attribute spec ", std::string(item));
    std::string_view kind = item.substr(colon + 1);
    AttrKind k;
    if (kind == "int") k = AttrKind::Int;
    else if (kind == "float") k = AttrKind::Float;
    else if (kind == "bool") k = AttrKind::Bool;
    else if (kind == "dtype") k = AttrKind::DType;
    else if (kind == "ints") k = AttrKind::Ints;
    else LAZYRT_ASSERT(false, "bad attribute kind ", std::string(kind));
    out.push_back({item.substr(0, colon), k});
  }
  return out;
}

const std::array<OpInfo, kNumOps>& table() {
  static const std::array<OpInfo, kNumOps> t = {{
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) \
  OpInfo{#name, operands, &rules::rule, static_cast<uint32_t>(flags), parse_attr_specs(attrs), aten, Api::api},
#include "lazyrt/ops.def"
#undef OP
  }};
  return t;
}

}  // namespace

const OpInfo& op_info(OpKind op) {
  auto i = static_cast<size_t>(op);
  LAZYRT_ASSERT(i < kNumOps, "op kind ", i, " out of range");
  return table()[i];
}

std::string_view check_message(int64_t what) {
  switch (static_cast<CheckKind>(what)) {
    case CheckKind::BernoulliProbability: return "bernoulli: every probability must be in [0, 1]";
    case CheckKind::IndexInBounds:
      return "indexing: an index is out of bounds for the dimension it indexes (valid: -size .. size - 1)";
    case CheckKind::kCount: break;
  }
  throw Error(detail::str_cat("check: unknown check kind ", what));
}

std::string_view reduce_op_name(int64_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::kCount: break;
  }
  throw Error(detail::str_cat("collective: unknown reduction ", op, " (expected sum, mean, max or min)"));
}

bool may_fail(const Node& n) {
  if (has_flag(n.op, kChecked)) return true;
  for (const auto& region : n.regions)
    for (const Node& m : region->nodes)
      if (may_fail(m)) return true;
  return false;
}

size_t NodeAttrs::index(std::string_view name, AttrKind kind) const {
  const std::vector<AttrSpec>& specs = op_info(op_).attrs;
  for (size_t k = 0; k < specs.size(); ++k)
    if (specs[k].name == name) {
      LAZYRT_ASSERT(specs[k].kind == kind, op_name(op_), ": attribute ", std::string(name), " read as another kind");
      return k;
    }
  LAZYRT_ASSERT(false, op_name(op_), " has no attribute ", std::string(name));
  return 0;
}

bool op_from_name(std::string_view name, OpKind* op) {
  for (int i = 0; i < kNumOps; ++i) {
    if (table()[i].name == name) {
      *op = static_cast<OpKind>(i);
      return true;
    }
  }
  return false;
}

}  // namespace lazyrt::ir
