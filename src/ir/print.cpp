#include <cmath>
#include <cstdio>
#include <sstream>

#include "ir/graph.h"

namespace lazyrt::ir {
namespace {

std::string value_str(ValueRef v) {
  std::ostringstream os;
  os << '%' << v.node;
  if (v.index != 0) os << '.' << v.index;
  return os.str();
}

std::string attr_str(const AttrValue& v) {
  struct Visitor {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", x);
      return buf;
    }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(DType x) const { return dtype_name(x); }
    std::string operator()(const std::vector<int64_t>& x) const { return shape_str(x); }
  };
  return std::visit(Visitor{}, v);
}

std::string node_line(size_t i, const Node& n) {
  std::ostringstream os;
  const OpInfo& info = op_info(n.op);
  os << '%' << i << " = " << info.name;
  if (!n.operands.empty()) {
    os << '(';
    for (size_t k = 0; k < n.operands.size(); ++k) os << (k ? ", " : "") << value_str(n.operands[k]);
    os << ')';
  }
  if (!n.attrs.values.empty()) {
    os << " {";
    for (size_t k = 0; k < n.attrs.values.size(); ++k)
      os << (k ? ", " : "") << info.attrs[k].name << '=' << attr_str(n.attrs.values[k]);
    os << '}';
  }
  os << " :";
  for (size_t k = 0; k < n.results.size(); ++k) os << (k ? ", " : " ") << type_str(n.results[k]);
  return os.str();
}

void print_graph(std::ostream& os, const Graph& g, const std::string& indent) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    os << indent << node_line(i, n) << (n.regions.empty() ? "\n" : " {\n");
    for (size_t r = 0; r < n.regions.size(); ++r) {
      os << indent << "  region " << r << ":\n";
      print_graph(os, *n.regions[r], indent + "    ");
    }
    if (!n.regions.empty()) os << indent << "}\n";
  }
  os << indent << "return";
  for (size_t k = 0; k < g.outputs.size(); ++k) os << (k ? ", " : " ") << value_str(g.outputs[k]);
  os << '\n';
}

}  // namespace

std::string to_text(const Graph& g) {
  std::ostringstream os;
  print_graph(os, g, "");
  return os.str();
}


std::string to_dot(const Graph& g) {
  std::ostringstream os;
  os << "digraph lazyrt {\n  node [shape=box, fontname=monospace];\n";
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    std::string label = node_line(i, g.nodes[i]);
    std::string escaped;
    for (char c : label) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    os << "  n" << i << " [label=\"" << escaped << "\"];\n";
    for (ValueRef v : g.nodes[i].operands) os << "  n" << v.node << " -> n" << i << ";\n";
  }
  for (size_t k = 0; k < g.outputs.size(); ++k)
    os << "  out" << k << " [shape=oval, label=\"output " << k << "\"];\n  n" << g.outputs[k].node
       << " -> out" << k << ";\n";
  os << "}\n";
  return os.str();
}

}  // namespace lazyrt::ir
