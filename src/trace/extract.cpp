#include "trace/extract.h"

#include <algorithm>
#include <unordered_map>

#include "trace/lazy_tensor.h"

#include "util/check.h"

namespace lazyrt::trace {

Flattener::Flattener(std::function<bool(const LazyNode&)> expand,
                     std::function<ir::ValueRef(const LazyValue&, Flattener&)> leaf, Mode mode)
    : expand_(std::move(expand)), leaf_(std::move(leaf)), mode_(mode) {
  // Sized for as many nodes as the last flattening on this thread visited (at most 2^16, so
  // one huge graph does not make every later sync reserve as much): a step synced again
  // visits as many, and its vectors then grow without reallocating.
  const size_t n = std::min<size_t>(last_visited(), size_t{1} << 16);
  visited_.reserve(n);
  stack_.reserve(64);
  operand_pos_.reserve(64);
  pos_.reserve(n);
  node_of_.reserve(n);
  leaf0_.reserve(n);
}

Flattener::~Flattener() { last_visited() = visited_.size(); }

size_t& Flattener::last_visited() {
  thread_local size_t n = 0;
  return n;
}

ir::ValueRef Flattener::emit_parameter(int64_t index, const ir::TensorType& type) {
  if (mode_ == Mode::Build) {
    graph_.nodes.push_back({ir::OpKind::Parameter, {}, {index}, {type}, {}});
  } else {
    // The attributes in storage kept for the thread: hashing a parameter allocates nothing.
    thread_local ir::Attrs attrs{int64_t{0}};
    attrs.values[0] = index;
    ir::hash_node(hasher_, ir::OpKind::Parameter, {}, attrs, std::span<const ir::TensorType>(&type, 1), {});
  }
  return {emitted_++, 0};
}

GraphHash Flattener::graph_hash(const std::vector<ir::ValueRef>& outputs, int64_t num_params) const {
  LAZYRT_ASSERT(mode_ == Mode::HashOnly, "graph_hash of a built graph: use ir::hash_graph");
  return ir::finish_graph_hash(hasher_, static_cast<size_t>(emitted_), num_params, outputs);
}

ir::ValueRef Flattener::value_at(int32_t p, const LazyValue& v) {
  if (node_of_[p] >= 0) return {node_of_[p], v.index};
  // A leaf: one graph value per result used.
  ir::ValueRef& val = v.index == 0 ? leaf0_[p] : leaf_values_.try_emplace((int64_t{p} << 32) | v.index, ir::ValueRef{-1, 0}).first->second;
  if (val.node < 0) val = leaf_(v, *this);
  return val;
}

// Post order without recursion. Each frame notes the positions of its operands as they are
// found (already visited) or finished (the node finished last, just before its user's frame
// is on top again), so every edge costs one lookup.
ir::ValueRef Flattener::add_root(const LazyValue& root) {
  const LazyNode* r = root.node.get();
  int32_t root_pos;
  if (const int32_t* known = pos_.find(r)) {
    root_pos = *known;
  } else {
    auto& stack = stack_;
    stack.clear();
    operand_pos_.clear();
    stack.push_back({&root.node, 0, 0, expand_(*r)});
    for (;;) {
      Frame& f = stack.back();
      const LazyNode* n = f.ref->get();
      if (f.expanded && f.next < n->operands.size()) {
        const std::shared_ptr<LazyNode>& child = n->operands[f.next].node;
        if (const int32_t* q = pos_.find(child.get())) {
          operand_pos_.push_back(*q);
          f.next++;
        } else {
          stack.push_back({&child, 0, static_cast<uint32_t>(operand_pos_.size()), expand_(*child)});
        }
        continue;
      }
      const auto p = static_cast<int32_t>(visited_.size());
      pos_.emplace(n, p);
      visited_.push_back({f.ref, 0});
      node_of_.push_back(-1);
      leaf0_.push_back({-1, 0});
      if (f.expanded) {
        operands_.clear();
        for (size_t j = 0; j < n->operands.size(); ++j) {
          const int32_t q = operand_pos_[f.first + j];
          visited_[q].internal_refs++;
          operands_.push_back(value_at(q, n->operands[j]));
        }
        if (mode_ == Mode::Build) {
          ir::Node node;
          node.op = n->op;
          node.attrs = n->attrs;
          node.results = n->types;
          node.regions = n->regions;
          node.operands = operands_;
          graph_.nodes.push_back(std::move(node));
        } else {
          ir::hash_node(hasher_, n->op, operands_, n->attrs, n->types, n->regions);
        }
        node_of_[p] = emitted_++;
      }
      operand_pos_.resize(f.first);
      stack.pop_back();
      if (stack.empty()) {
        root_pos = p;
        break;
      }
      operand_pos_.push_back(p);
      stack.back().next++;
    }
  }
  visited_[root_pos].internal_refs++;
  return value_at(root_pos, root);
}

// Flattening for a sync: parameter leaves become graph parameters, one per buffer.
//
// Donation: a parameter buffer that nothing outside this sync can still reach (no live tensor
// holds it, and no pending value that survives the sync reads it) is offered to the output of
// the tensor it came from, so an in-place update (w.add_(g)) writes into w's own buffer.
Extracted extract_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors, bool hash_only) {
  Extracted ex;
  // Room for the parameters of a small step without growing every vector a few times.
  constexpr size_t kParams = 32;
  ex.params.reserve(kParams);
  ex.param_types.reserve(kParams);
  ex.param_nodes.reserve(kParams);
  ex.param_sources.reserve(kParams);
  ex.param_tensors.reserve(kParams);
  ex.param_dynamic.reserve(kParams);
  util::PtrMap<int32_t> param_of_buffer;
  std::vector<int64_t>& source = ex.param_sources;
  // Another tensor on a parameter's buffer (a detached copy of a state tensor, or the tensor
  // it was detached from): the oldest stands for the parameter (state outlives the
  // temporaries made from it), the others are noted.
  auto note_source = [&](int32_t p, std::weak_ptr<TensorImpl> other, int64_t other_id) {
    if (other_id == source[p]) return;
    for (const auto& [q, t] : ex.param_aliases)
      if (q == p && !t.owner_before(other) && !other.owner_before(t)) return;
    if (other_id < source[p]) {
      std::swap(other, ex.param_tensors[p]);
      std::swap(other_id, source[p]);
    }
    ex.param_aliases.emplace_back(p, std::move(other));
  };
  Flattener flat(
      [](const LazyNode& n) {
        LAZYRT_CHECK(n.scope == 0,
                     "a value traced inside a while_loop body is used outside of it; return it "
                     "from the body as part of the carry instead");
        return n.op != ir::OpKind::Parameter;
      },
      [&](const LazyValue& v, Flattener& f) {
        LAZYRT_ASSERT(v.node->data, "a loop placeholder reached a sync");
        // All leaves of one buffer are one parameter.
        auto [param, fresh] = param_of_buffer.emplace(v.node->data.get(), static_cast<int32_t>(ex.params.size()));
        const int32_t p = *param;
        if (fresh) {
          ex.param_nodes.push_back(f.emit_parameter(p, v.type()).node);
          ex.param_types.push_back(v.type());
          ex.params.push_back(v.node->data);
          source.push_back(v.node->source_tensor);
          ex.param_tensors.push_back(v.node->source);
          ex.param_dynamic.push_back(v.node->dynamic);
        } else {
          note_source(p, v.node->source, v.node->source_tensor);
          ex.param_dynamic[p] |= v.node->dynamic;  // a mark on any tensor of the buffer
        }
        if (v.node->also_tensor >= 0) note_source(p, v.node->also, v.node->also_tensor);
        return ir::ValueRef{ex.param_nodes[p], 0};
      },
      hash_only ? Flattener::Mode::HashOnly : Flattener::Mode::Build);
  std::vector<ir::ValueRef> outputs;
  for (const auto& t : tensors) outputs.push_back(flat.add_root(t->pending()));

  // A node survives the sync when something outside it holds a reference; so does everything
  // it reads. Post order puts users after operands, so walk backwards.
  const auto& visited = flat.visited();
  std::vector<bool> survives(visited.size(), false);
  for (size_t p = visited.size(); p-- > 0;) {
    const auto& sp = *visited[p].ref;
    if (sp.use_count() > visited[p].internal_refs) survives[p] = true;
    if (survives[p] && sp->op != ir::OpKind::Parameter)
      for (const LazyValue& v : sp->operands) survives[flat.position(v.node.get())] = true;
  }
  std::vector<bool> donatable(ex.params.size(), true);
  std::vector<int64_t> leaves(ex.params.size(), 0);
  for (size_t p = 0; p < visited.size(); ++p) {
    const LazyNode& n = **visited[p].ref;
    if (n.op != ir::OpKind::Parameter) continue;
    const int32_t param = *param_of_buffer.find(n.data.get());
    leaves[param]++;
    if (survives[p]) donatable[param] = false;
  }
  ex.donations.assign(tensors.size(), -1);
  for (size_t i = 0; i < ex.params.size(); ++i) {
    // The leaves hold the buffer, and so does ex.params; anything more is an outside owner.
    // Adopted memory (NumPy, DLPack) belongs to someone else and is never written.
    if (!donatable[i] || ex.params[i]->is_adopted() || ex.params[i].use_count() != leaves[i] + 1) continue;
    for (size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k]->id == source[i] && tensors[k]->type == ex.param_types[i] &&
          ex.donations[k] < 0) {
        ex.donations[k] = static_cast<int32_t>(i);
        break;
      }
  }
  if (hash_only) {
    ex.graph_hash = flat.graph_hash(outputs, static_cast<int64_t>(ex.params.size()));
  } else {
    ex.graph = std::move(flat.graph());
    ex.graph.outputs = std::move(outputs);
    ex.graph.num_params = static_cast<int64_t>(ex.params.size());
  }
  return ex;
}
}  // namespace lazyrt::trace
