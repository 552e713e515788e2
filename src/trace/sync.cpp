// Sync: flatten the pending DAG of some tensors into an ir::Graph, hash it, find or compile
// its executable, run it, and bind the results to the tensors.
//
// Donation: a parameter buffer that nothing outside this sync can still reach (no live tensor
// holds it, and no pending value that survives the sync reads it) is offered to the output of
// the tensor it came from, so an in-place update (w.add_(g)) writes into w's own buffer.
#include <algorithm>
#include <unordered_map>

#include "cache/memory_cache.h"
#include "compile/compile.h"
#include "ir/hash.h"
#include "lazyrt/metrics.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"
#include "util/timer.h"

namespace lazyrt::trace {
namespace {

struct Extracted {
  ir::Graph graph;
  std::vector<int32_t> donations;                          // per output
  std::vector<std::shared_ptr<runtime::Buffer>> params;    // per parameter
};

Extracted extract(const std::vector<std::shared_ptr<TensorImpl>>& tensors) {
  Extracted ex;
  ir::Graph& g = ex.graph;
  // Distinct DAG nodes in post order, each with one owning reference to read its use count.
  std::vector<const std::shared_ptr<LazyNode>*> order;
  std::unordered_map<const LazyNode*, int32_t> pos;       // node -> position in `order`
  std::vector<int32_t> graph_node;                         // position -> graph node index
  std::vector<int64_t> internal_refs;                      // position -> refs from this sync
  std::unordered_map<const runtime::Buffer*, int32_t> param_of_buffer;
  std::vector<int32_t> param_of_pos;                       // position -> parameter or -1
  std::vector<int32_t> param_node;                         // parameter -> graph node index

  std::vector<std::pair<const std::shared_ptr<LazyNode>*, size_t>> stack;
  auto visit_root = [&](const std::shared_ptr<LazyNode>& root) {
    if (pos.count(root.get())) return;
    stack.push_back({&root, 0});
    while (!stack.empty()) {
      auto [ref, k] = stack.back();
      const LazyNode* n = ref->get();
      if (k < n->operands.size()) {
        stack.back().second++;
        const auto& child = n->operands[k].node;
        if (!pos.count(child.get())) stack.push_back({&child, 0});
        continue;
      }
      stack.pop_back();
      if (pos.count(n)) continue;
      const auto p = static_cast<int32_t>(order.size());
      pos[n] = p;
      order.push_back(ref);
      internal_refs.push_back(0);
      param_of_pos.push_back(-1);
      if (n->op == ir::OpKind::Parameter) {
        // All leaves of one buffer are one parameter.
        auto [it, fresh] = param_of_buffer.emplace(n->data.get(), static_cast<int32_t>(ex.params.size()));
        if (fresh) {
          param_node.push_back(g.add_parameter(n->types[0]).node);
          ex.params.push_back(n->data);
        }
        param_of_pos[p] = it->second;
        graph_node.push_back(param_node[it->second]);
        continue;
      }
      ir::Node node;
      node.op = n->op;
      node.attrs = n->attrs;
      node.results = n->types;
      for (const LazyValue& v : n->operands) {
        int32_t q = pos.at(v.node.get());
        internal_refs[q]++;
        node.operands.push_back({graph_node[q], v.index});
      }
      g.nodes.push_back(std::move(node));
      graph_node.push_back(static_cast<int32_t>(g.nodes.size() - 1));
    }
  };
  for (const auto& t : tensors) visit_root(t->pending().node);
  for (const auto& t : tensors) {
    int32_t q = pos.at(t->pending().node.get());
    internal_refs[q]++;
    g.outputs.push_back({graph_node[q], t->pending().index});
  }

  // A node survives the sync when something outside it holds a reference; so does everything
  // it reads. Post order puts users after operands, so walk backwards.
  std::vector<bool> survives(order.size(), false);
  for (size_t p = order.size(); p-- > 0;) {
    const auto& sp = *order[p];
    if (sp.use_count() > internal_refs[p]) survives[p] = true;
    if (survives[p])
      for (const LazyValue& v : sp->operands) survives[pos.at(v.node.get())] = true;
  }
  std::vector<bool> donatable(ex.params.size(), true);
  std::vector<int64_t> leaves(ex.params.size(), 0);
  std::vector<int64_t> source(ex.params.size(), -1);
  for (size_t p = 0; p < order.size(); ++p) {
    int32_t param = param_of_pos[p];
    if (param < 0) continue;
    leaves[param]++;
    source[param] = (*order[p])->source_tensor;
    if (survives[p]) donatable[param] = false;
  }
  ex.donations.assign(tensors.size(), -1);
  for (size_t i = 0; i < ex.params.size(); ++i) {
    // The leaves hold the buffer, and so does ex.params.
    if (!donatable[i] || ex.params[i].use_count() != leaves[i] + 1) continue;
    for (size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k]->id == source[i] && tensors[k]->type == g.nodes[param_node[i]].results[0] &&
          ex.donations[k] < 0) {
        ex.donations[k] = static_cast<int32_t>(i);
        break;
      }
  }
  return ex;
}

// The pending tensors among `requested`, each once, in order.
std::vector<std::shared_ptr<TensorImpl>> pending_only(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors;
  for (const auto& t : requested)
    if (t && t->is_pending() && std::find(tensors.begin(), tensors.end(), t) == tensors.end())
      tensors.push_back(t);
  return tensors;
}

// The cache key: the graph's structure plus the donations, which change the executable.
GraphHash cache_key(const Extracted& ex) {
  ir::Hasher h;
  GraphHash gh = ir::hash_graph(ex.graph);
  h.add(gh.hi);
  h.add(gh.lo);
  for (int32_t d : ex.donations) h.add(static_cast<uint64_t>(static_cast<int64_t>(d)));
  return h.finish();
}

}  // namespace

GraphHash pending_graph_hash(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors = pending_only(requested);
  if (tensors.empty()) return {};
  return cache_key(extract(tensors));
}

void sync_tensors(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors = pending_only(requested);
  if (tensors.empty()) return;

  Extracted ex;
  GraphHash key;
  {
    detail::ScopedTimer timer("TraceTime");
    ex = extract(tensors);
    key = cache_key(ex);
  }

  std::shared_ptr<runtime::Executable> exe = cache::memory_cache().get(key);
  if (exe) {
    metrics::increment("CachedCompile");
  } else {
    detail::ScopedTimer timer("CompileTime");
    exe = compile::compile(ex.graph, ex.donations);
    metrics::increment("UncachedCompile");
    cache::memory_cache().put(key, exe);
  }

  const size_t n = tensors.size();
  std::vector<const void*> param_ptrs;
  param_ptrs.reserve(ex.params.size());
  for (const auto& b : ex.params) param_ptrs.push_back(b->data());
  std::vector<std::shared_ptr<runtime::Buffer>> out_bufs(n);
  std::vector<void*> out_ptrs(n, nullptr);
  for (size_t k = 0; k < n; ++k) {
    if (exe->outputs()[k].kind != runtime::OutputSource::Kind::Computed) continue;
    if (ex.donations[k] >= 0 && exe->donation_accepted(k))
      out_bufs[k] = ex.params[ex.donations[k]];
    else
      out_bufs[k] = runtime::allocate(exe->output_types()[k].bytes());
    out_ptrs[k] = out_bufs[k]->data();
  }
  {
    detail::ScopedTimer timer("ExecuteTime");
    exe->run(param_ptrs.data(), out_ptrs.data());
  }
  metrics::increment("ExecuteGraph");
  for (size_t k = 0; k < n; ++k) {
    const runtime::OutputSource& src = exe->outputs()[k];
    switch (src.kind) {
      case runtime::OutputSource::Kind::Computed: break;
      case runtime::OutputSource::Kind::Param: out_bufs[k] = ex.params[src.index]; break;
      case runtime::OutputSource::Kind::Const: out_bufs[k] = exe->constant_output(src.index); break;
      case runtime::OutputSource::Kind::Alias: out_bufs[k] = out_bufs[src.index]; break;
    }
  }
  for (size_t k = 0; k < n; ++k) tensors[k]->set_data(std::move(out_bufs[k]));
}

}  // namespace lazyrt::trace
