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

namespace {

// Each op's name hashed once: ops hash by name, so that the hash survives reordering of the
// op table.
const uint64_t* op_name_hashes() {
  static const auto* table = [] {
    auto* t = new uint64_t[static_cast<size_t>(kNumOps)];
    for (size_t i = 0; i < static_cast<size_t>(kNumOps); ++i) {
      Hasher h;
      h.add_string(op_name(static_cast<OpKind>(i)));
      const GraphHash g = h.finish();
      t[i] = g.hi ^ g.lo;
    }
    return t;
  }();
  return table;
}

// Up to this many, a node's counts (operands, attributes, results, regions) share one word.
constexpr uint64_t kPacked = 0xFFFF;

}  // namespace

void hash_node(Hasher& h, OpKind op, std::span<const ValueRef> operands, const Attrs& attrs,
               std::span<const TensorType> results, std::span<const std::shared_ptr<const Graph>> regions) {
  h.add(op_name_hashes()[static_cast<size_t>(op)]);
  const uint64_t counts[4] = {operands.size(), attrs.values.size(), results.size(), regions.size()};
  if (counts[0] < kPacked && counts[1] < kPacked && counts[2] < kPacked && counts[3] < kPacked) {
    h.add(counts[0] | counts[1] << 16 | counts[2] << 32 | counts[3] << 48);
  } else {
    h.add(~uint64_t{0});  // no packed word is all ones
    for (uint64_t c : counts) h.add(c);
  }
  for (ValueRef v : operands)
    h.add(static_cast<uint64_t>(static_cast<uint32_t>(v.node)) << 32 | static_cast<uint32_t>(v.index));
  for (const AttrValue& a : attrs.values) hash_attr(h, a);
  for (const TensorType& t : results) {
    h.add(static_cast<uint64_t>(t.dtype) | static_cast<uint64_t>(t.shape.size()) << 8);
    for (int64_t d : t.shape) h.add(static_cast<uint64_t>(d));
  }
  for (const auto& r : regions) {
    const GraphHash rh = r->hash_memo.value ? *r->hash_memo.value : hash_graph(*r);
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

std::shared_ptr<const Graph> seal(Graph g) {
  const GraphHash h = hash_graph(g);
  auto sealed = std::make_shared<Graph>(std::move(g));
  sealed->hash_memo.value = h;
  return sealed;
}

}  // namespace lazyrt::ir
