// Sync: flatten the pending DAG of some tensors into an ir::Graph, hash it, find or compile
// its executable, run it, and bind the results to the tensors.
//
// Finding the executable: the in-memory cache, then the persistent cache on disk (if one is
// configured), then compilation, whose result goes into both.
//
// Donation: a parameter buffer that nothing outside this sync can still reach (no live tensor
// holds it, and no pending value that survives the sync reads it) is offered to the output of
// the tensor it came from, so an in-place update (w.add_(g)) writes into w's own buffer.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "cache/memory_cache.h"
#include "cache/persistent_cache.h"
#include "compile/compile.h"
#include "ir/hash.h"
#include "lazyrt/metrics.h"
#include "trace/extract.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"
#include "util/metrics_cells.h"
#include "util/timer.h"

namespace lazyrt::trace {

Extracted extract_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors) {
  Extracted ex;
  std::unordered_map<const runtime::Buffer*, int32_t> param_of_buffer;
  std::vector<int64_t>& source = ex.param_sources;
  Flattener flat(
      [](const LazyNode& n) {
        LAZYRT_CHECK(n.scope == 0,
                     "a value traced inside a while_loop body is used outside of it; return it "
                     "from the body as part of the carry instead");
        return n.op != ir::OpKind::Parameter;
      },
      [&](const LazyValue& v, ir::Graph& g) {
        LAZYRT_ASSERT(v.node->data, "a loop placeholder reached a sync");
        // All leaves of one buffer are one parameter.
        auto [it, fresh] = param_of_buffer.emplace(v.node->data.get(), static_cast<int32_t>(ex.params.size()));
        if (fresh) {
          ex.param_nodes.push_back(g.add_parameter(v.type()).node);
          ex.params.push_back(v.node->data);
          source.push_back(v.node->source_tensor);
          ex.param_tensors.push_back(v.node->source);
        } else if (v.node->source_tensor != source[it->second]) {
          // Another tensor on the same buffer: the oldest stands for the parameter (state
          // outlives the temporaries made from it), the others are noted.
          const int32_t p = it->second;
          std::weak_ptr<TensorImpl> other = v.node->source;
          int64_t other_id = v.node->source_tensor;
          if (other_id < source[p]) {
            std::swap(other, ex.param_tensors[p]);
            std::swap(other_id, source[p]);
          }
          ex.param_aliases.emplace_back(p, std::move(other));
        }
        return ir::ValueRef{ex.param_nodes[it->second], 0};
      });
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
    const int32_t param = param_of_buffer.at(n.data.get());
    leaves[param]++;
    if (survives[p]) donatable[param] = false;
  }
  ex.donations.assign(tensors.size(), -1);
  for (size_t i = 0; i < ex.params.size(); ++i) {
    // The leaves hold the buffer, and so does ex.params; anything more is an outside owner.
    // Adopted memory (NumPy, DLPack) belongs to someone else and is never written.
    if (!donatable[i] || ex.params[i]->is_adopted() || ex.params[i].use_count() != leaves[i] + 1) continue;
    for (size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k]->id == source[i] && tensors[k]->type == flat.graph().nodes[ex.param_nodes[i]].results[0] &&
          ex.donations[k] < 0) {
        ex.donations[k] = static_cast<int32_t>(i);
        break;
      }
  }
  ex.graph = std::move(flat.graph());
  ex.graph.outputs = std::move(outputs);
  return ex;
}
namespace {

// The pending tensors among `requested`, each once, in order.
std::vector<std::shared_ptr<TensorImpl>> pending_only(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors;
  for (const auto& t : requested)
    if (t && t->is_pending() && std::find(tensors.begin(), tensors.end(), t) == tensors.end())
      tensors.push_back(t);
  return tensors;
}

thread_local const char* sync_forbidden = nullptr;

}  // namespace

GraphHash cache_key(const ir::Graph& graph, const std::vector<int32_t>& donations) {
  ir::Hasher h;
  GraphHash gh = ir::hash_graph(graph);
  h.add(gh.hi);
  h.add(gh.lo);
  for (int32_t d : donations) h.add(static_cast<uint64_t>(static_cast<int64_t>(d)));
  return h.finish();
}

namespace {

// From disk: the stored optimized graph, lowered. Counts the lookup's outcome; null unless
// it was a hit.
std::shared_ptr<runtime::Executable> load_from_disk(const cache::PersistentCache& disk, const ir::Graph& graph,
                                                    const std::vector<int32_t>& donations, const GraphHash& key) {
  cache::PersistentCache::Lookup found = disk.load(key, graph, donations);
  std::shared_ptr<runtime::Executable> exe;
  if (found.status == cache::PersistentCache::Status::Hit) {
    try {
      exe = compile::lower(found.entry.graph, donations);
    } catch (const std::exception& e) {  // a verified graph no kernel takes: refuse the entry
      found.status = cache::PersistentCache::Status::Bad;
      found.error = std::string("lowering its graph failed: ") + e.what();
    }
  }
  switch (found.status) {
    case cache::PersistentCache::Status::Hit: metrics::increment("PersistentCacheHit"); break;
    case cache::PersistentCache::Status::Miss: metrics::increment("PersistentCacheMiss"); break;
    case cache::PersistentCache::Status::Bad:
      metrics::increment("PersistentCacheDeserializeFailure");
      disk.warn_bad_entry(key, found.error);
      break;
  }
  return exe;
}

}  // namespace

std::shared_ptr<runtime::Executable> executable_for(const GraphHash& key, const ir::Graph& graph,
                                                    const std::vector<int32_t>& donations) {
  if (std::shared_ptr<runtime::Executable> exe = cache::memory_cache().get(key)) {
    static auto& cached_compile = metrics::detail::counter_cell("CachedCompile");
    cached_compile.add(1);
    return exe;
  }
  static auto& compile_time = metrics::detail::timing_cell("CompileTime");
  detail::ScopedTimer timer(compile_time);
  const std::shared_ptr<const cache::PersistentCache> disk = cache::persistent_cache();
  std::shared_ptr<runtime::Executable> exe = disk ? load_from_disk(*disk, graph, donations, key) : nullptr;
  if (!exe) {
    exe = compile::compile(graph, donations);
    static auto& uncached_compile = metrics::detail::counter_cell("UncachedCompile");
    uncached_compile.add(1);
    // A bad entry is replaced here too: store writes over whatever is at the path.
    if (disk) disk->store({key, donations, exe->graph()});
  }
  cache::memory_cache().put(key, exe);
  return exe;
}

SyncForbidden::SyncForbidden(const char* reason) : previous_(sync_forbidden) { sync_forbidden = reason; }
SyncForbidden::~SyncForbidden() { sync_forbidden = previous_; }

ir::Graph pending_graph(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors = pending_only(requested);
  if (tensors.empty()) return {};
  return extract_graph(tensors).graph;
}


void sync_tensors(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  LAZYRT_CHECK(current_scope() == 0,
               "cannot read a value or sync while a while_loop body or cond is being traced: "
               "values there are symbolic (use tensor ops, or return the value from the loop)");
  LAZYRT_CHECK(sync_forbidden == nullptr, sync_forbidden);
  std::vector<std::shared_ptr<TensorImpl>> tensors = pending_only(requested);
  if (tensors.empty()) return;

  Extracted ex;
  GraphHash key;
  {
    static auto& trace_time = metrics::detail::timing_cell("TraceTime");
    detail::ScopedTimer timer(trace_time);
    ex = extract_graph(tensors);
    key = cache_key(ex.graph, ex.donations);
  }
  std::shared_ptr<runtime::Executable> exe = executable_for(key, ex.graph, ex.donations);

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
    static auto& execute_time = metrics::detail::timing_cell("ExecuteTime");
    detail::ScopedTimer timer(execute_time);
    exe->run(param_ptrs.data(), out_ptrs.data());
  }
  static auto& execute_graph = metrics::detail::counter_cell("ExecuteGraph");
  execute_graph.add(1);
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

namespace lazyrt::trace {

void sync_for_read(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors = pending_only(requested);
  if (tensors.empty()) return;
  // The computed (non-leaf) nodes the requested graph holds.
  std::unordered_set<const LazyNode*> in_graph;
  auto walk = [](const LazyNode* root, std::unordered_set<const LazyNode*>& seen, auto&& on_node) {
    std::vector<const LazyNode*> stack{root};
    while (!stack.empty()) {
      const LazyNode* n = stack.back();
      stack.pop_back();
      if (n->op == ir::OpKind::Parameter || !seen.insert(n).second) continue;
      if (on_node(n)) return true;
      for (const LazyValue& v : n->operands) stack.push_back(v.node.get());
    }
    return false;
  };
  for (const auto& t : tensors) walk(t->pending().node.get(), in_graph, [](const LazyNode*) { return false; });
  // Every other live pending tensor (autograd's saved values aside) that reaches one of them
  // joins, and so does its graph, until nothing more joins.
  std::vector<std::shared_ptr<TensorImpl>> others;
  for (auto& t : live_pending_tensors())
    if (!t->saved_for_backward && std::find(tensors.begin(), tensors.end(), t) == tensors.end())
      others.push_back(std::move(t));
  for (bool joined = true; joined;) {
    joined = false;
    for (auto& t : others) {
      if (!t) continue;
      std::unordered_set<const LazyNode*> seen;
      const bool overlaps =
          walk(t->pending().node.get(), seen, [&](const LazyNode* n) { return in_graph.count(n) > 0; });
      if (!overlaps) continue;
      walk(t->pending().node.get(), in_graph, [](const LazyNode*) { return false; });
      tensors.push_back(std::move(t));
      t = nullptr;
      joined = true;
    }
  }
  sync_tensors(tensors);
}

}  // namespace lazyrt::trace
