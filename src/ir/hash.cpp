#include "ir/hash.h"

#include "ir/graph.h"

namespace lazyrt::ir {
namespace {

void hash_attr(Hasher& h, const AttrValue& v) {
  h.add(v.index());
  switch (v.index()) {
    case 0: h.add(static_cast<uint64_t>(std::get<int64_t>(v))); break;
    case 1: h.add_double(std::get<double>(v)); break;
    case 2: h.add(std::get<bool>(v)); break;
    case 3: h.add(static_cast<uint64_t>(std::get<DType>(v))); break;
    case 4: {
      const auto& xs = std::get<std::vector<int64_t>>(v);
      h.add(xs.size());
      for (int64_t x : xs) h.add(static_cast<uint64_t>(x));
      break;
    }
  }
}

void hash_into(Hasher& h, const Graph& g) {
  h.add(g.nodes.size());
  h.add(static_cast<uint64_t>(g.num_params));
  for (const Node& n : g.nodes) {
    // Ops hash by name, so that the hash survives reordering of the op table.
    h.add_string(op_name(n.op));
    h.add(n.operands.size());
    for (ValueRef v : n.operands) {
      h.add(static_cast<uint64_t>(v.node));
      h.add(static_cast<uint64_t>(v.index));
    }
    h.add(n.attrs.values.size());
    for (const AttrValue& a : n.attrs.values) hash_attr(h, a);
    h.add(n.results.size());
    for (const TensorType& t : n.results) {
      h.add(static_cast<uint64_t>(t.dtype));
      h.add(t.shape.size());
      for (int64_t d : t.shape) h.add(static_cast<uint64_t>(d));
    }
    h.add(n.regions.size());
    for (const auto& r : n.regions) hash_into(h, *r);
  }
  h.add(g.outputs.size());
  for (ValueRef v : g.outputs) {
    h.add(static_cast<uint64_t>(v.node));
    h.add(static_cast<uint64_t>(v.index));
  }
}

}  // namespace

GraphHash hash_graph(const Graph& g) {
  Hasher h;
  h.add(kIrFormatVersion);
  hash_into(h, g);
  return h.finish();
}

}  // namespace lazyrt::ir
