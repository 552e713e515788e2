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

}  // namespace

void hash_node(Hasher& h, OpKind op, std::span<const ValueRef> operands, const Attrs& attrs,
               std::span<const TensorType> results, std::span<const std::shared_ptr<const Graph>> regions) {
  // Ops hash by name, so that the hash survives reordering of the op table.
  h.add_string(op_name(op));
  h.add(operands.size());
  for (ValueRef v : operands) {
    h.add(static_cast<uint64_t>(v.node));
    h.add(static_cast<uint64_t>(v.index));
  }
  h.add(attrs.values.size());
  for (const AttrValue& a : attrs.values) hash_attr(h, a);
  h.add(results.size());
  for (const TensorType& t : results) {
    h.add(static_cast<uint64_t>(t.dtype));
    h.add(t.shape.size());
    for (int64_t d : t.shape) h.add(static_cast<uint64_t>(d));
  }
  h.add(regions.size());
  for (const auto& r : regions) {
    const GraphHash rh = hash_graph(*r);
    h.add(rh.hi);
    h.add(rh.lo);
  }
}

GraphHash finish_graph_hash(const Hasher& nodes, size_t num_nodes, int64_t num_params,
                            const std::vector<ValueRef>& outputs) {
  Hasher h;
  h.add(kIrFormatVersion);
  h.add(num_nodes);
  h.add(static_cast<uint64_t>(num_params));
  const GraphHash body = nodes.finish();
  h.add(body.hi);
  h.add(body.lo);
  h.add(outputs.size());
  for (ValueRef v : outputs) {
    h.add(static_cast<uint64_t>(v.node));
    h.add(static_cast<uint64_t>(v.index));
  }
  return h.finish();
}

GraphHash hash_graph(const Graph& g) {
  Hasher nodes;
  for (const Node& n : g.nodes) hash_node(nodes, n.op, n.operands, n.attrs, n.results, n.regions);
  return finish_graph_hash(nodes, g.nodes.size(), g.num_params, g.outputs);
}

}  // namespace lazyrt::ir
