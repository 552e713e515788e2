// Sync: flatten the pending DAG of some tensors into an ir::Graph (extract.cpp), and have the
// executor (src/exec) key, find or compile and run it; the results are bound to the tensors.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "backend/backend.h"
#include "compile/polymorphic.h"
#include "exec/executor.h"
#include "ir/hash.h"
#include "lazyrt/metrics.h"
#include "trace/extract.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"
#include "util/metrics_cells.h"
#include "util/timer.h"

namespace lazyrt::trace {

std::vector<std::shared_ptr<TensorImpl>> pending_only(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors;
  for (const auto& t : requested)
    if (t && t->is_pending() && std::find(tensors.begin(), tensors.end(), t) == tensors.end())
      tensors.push_back(t);
  return tensors;
}

namespace {

thread_local const char* sync_forbidden = nullptr;

// The executable's results bound to the synced tensors. A tensor gets a buffer of its own, not
// one of the executable's constants or another output's: tensors that merely have equal values
// (gradients zeroed together, say) stay distinct inputs of later graphs, and replays can tell
// them apart.
void bind_results(const std::vector<std::shared_ptr<TensorImpl>>& tensors, const runtime::Executable& exe,
                  exec::Frame& frame) {
  for (size_t k = 0; k < tensors.size(); ++k) {
    const runtime::OutputSource::Kind kind = exe.outputs()[k].kind;
    if (kind == runtime::OutputSource::Kind::Const || kind == runtime::OutputSource::Kind::Alias) {
      const exec::BufferPtr& src = frame.outs[k];
      frame.outs[k] = backend::current().copy(*src);
    }
    tensors[k]->set_data(std::move(frame.outs[k]));
  }
}

std::mutex refusal_mu;
std::string last_refusal;  // last_polymorphic_refusal's, under refusal_mu

}  // namespace

void note_polymorphic_refusal(const std::string& why) {
  metrics::increment("PolymorphicRefused");
  std::lock_guard<std::mutex> lock(refusal_mu);
  last_refusal = why;
}

std::string last_polymorphic_refusal() {
  std::lock_guard<std::mutex> lock(refusal_mu);
  return last_refusal;
}

std::optional<compile::PolymorphicGraph> polymorphic_graph(const Extracted& ex, std::string* why) {
  std::vector<compile::DynamicDim> marks;
  for (size_t p = 0; p < ex.param_dynamic.size(); ++p)
    for (size_t d = 0; d < ex.param_types[p].shape.size(); ++d) {
      const trace::DynamicMarks& m = ex.param_dynamic[p];
      if (((m.hard | m.soft) >> d) & 1)
        marks.push_back({static_cast<int64_t>(p), static_cast<int64_t>(d), !((m.hard >> d) & 1)});
    }
  if (marks.empty()) {
    if (why) *why = "it reads no dim marked dynamic";
    return std::nullopt;
  }
  return compile::make_polymorphic(ex.graph, marks, why);
}

namespace {

// What running a traced graph on its bucket graph takes, without the graph: kept per traced
// graph (its key and marks), so a sync that repeats builds and rewrites nothing.
struct PolymorphicPlan {
  GraphHash key;                   // the bucket graph's cache key
  std::vector<int32_t> donations;  // offers, less the padded outputs'
  compile::PolymorphicGraph pg;    // its padded dims, boxes and sizes (the graph itself dropped)
};

class PlanMemo {
 public:
  static GraphHash key(const Extracted& ex, const GraphHash& traced_key) {
    ir::Hasher h;
    h.add(traced_key.hi);
    h.add(traced_key.lo);
    for (const DynamicMarks& m : ex.param_dynamic) {
      h.add(m.hard);
      h.add(m.soft);
    }
    return h.finish();
  }
  // What is known of the traced graph of this key: nothing (false), or its plan (null where it
  // has none; `refused`: why, unless for want of a marked size of 2 or more).
  bool find(const GraphHash& k, std::shared_ptr<const PolymorphicPlan>& plan, std::string& refused) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(k);
    if (it == plans_.end()) return false;
    plan = it->second.first;
    refused = it->second.second;
    return true;
  }
  void put(const GraphHash& k, std::shared_ptr<const PolymorphicPlan> plan, std::string refused) {
    std::lock_guard<std::mutex> lock(mu_);
    if (plans_.size() >= kMax) plans_.clear();  // the plans of a program's graphs: few, cheap to remake
    plans_[k] = {std::move(plan), std::move(refused)};
  }

 private:
  static constexpr size_t kMax = 4096;
  std::mutex mu_;
  struct KeyHash {
    size_t operator()(const GraphHash& h) const { return static_cast<size_t>(h.hi ^ (h.lo * 0x9e3779b97f4a7c15ULL)); }
  };
  std::unordered_map<GraphHash, std::pair<std::shared_ptr<const PolymorphicPlan>, std::string>, KeyHash> plans_;
};
PlanMemo& plan_memo() {
  static PlanMemo* m = new PlanMemo();
  return *m;
}

// The plan of a built graph, its bucket graph compiled (or found); null where there is none
// (`refused`: why, unless for want of a marked size of 2 or more).
std::shared_ptr<const PolymorphicPlan> make_plan(const Extracted& ex, std::shared_ptr<runtime::Executable>& exe,
                                                 std::string& refused) {
  std::string why;
  std::optional<compile::PolymorphicGraph> pg = polymorphic_graph(ex, &why);
  refused = !pg && why != compile::kNothingToPad ? why : std::string();
  if (!pg) return nullptr;
  auto plan = std::make_shared<PolymorphicPlan>();
  // An output that is padded is written fresh and cropped; one computed from a padded
  // parameter's buffer is never offered it.
  plan->donations = ex.donations;
  for (size_t k = 0; k < plan->donations.size(); ++k)
    if (!pg->outputs[k].empty() || (plan->donations[k] >= 0 && !pg->params[plan->donations[k]].empty()))
      plan->donations[k] = -1;
  plan->key = exec::cache_key(pg->graph, plan->donations);
  exe = exec::executable_for(plan->key, pg->graph, plan->donations);
  pg->graph = {};
  plan->pg = std::move(*pg);
  return plan;
}

// A sync run by its bucket graph's executable (compile/polymorphic.h): the marked parameters
// padded into buffers of the bucket's size, the sizes passed in, the outputs cropped to their
// traced shapes and marked where their dims derive from a marked one.
void run_polymorphic(const std::vector<std::shared_ptr<TensorImpl>>& tensors, const Extracted& ex,
                     const PolymorphicPlan& plan, runtime::Executable& exe) {
  const backend::Backend& be = backend::current();
  const size_t np = ex.params.size();
  std::vector<exec::BufferPtr> params(np + plan.pg.sizes.size());
  for (size_t p = 0; p < np; ++p)
    params[p] = plan.pg.params[p].empty() ? ex.params[p]
                                       : exec::padded_copy(*ex.params[p], ex.param_types[p], plan.pg.param_boxes[p]);
  for (size_t s = 0; s < plan.pg.sizes.size(); ++s) {
    params[np + s] = be.allocate(sizeof(int64_t));
    std::memcpy(params[np + s]->data(), &plan.pg.sizes[s], sizeof(int64_t));
  }
  exec::Frame frame;
  frame.size_for(exe);
  for (size_t i = 0; i < params.size(); ++i) frame.params[i] = params[i]->data();
  static const exec::BufferPtr none;
  auto offer = [&](size_t k) -> const exec::BufferPtr& {
    return plan.donations[k] >= 0 && exe.donation_accepted(k) ? params[plan.donations[k]] : none;
  };
  auto param = [&](int32_t i) -> const exec::BufferPtr& { return params[i]; };
  static auto& execute_graph = metrics::detail::counter_cell("ExecuteGraph");
  exec::run(exe, frame, offer, param, execute_graph);
  static auto& polymorphic = metrics::detail::counter_cell("PolymorphicGraph");
  polymorphic.add(1);
  for (size_t k = 0; k < tensors.size(); ++k) {
    uint64_t bits = 0;
    for (const compile::PaddedDim& d : plan.pg.outputs[k]) bits |= uint64_t{1} << d.dim;
    tensors[k]->dynamic.soft |= bits;
    if (plan.pg.outputs[k].empty()) continue;
    frame.outs[k] = exec::cropped_copy(*frame.outs[k], plan.pg.output_boxes[k], tensors[k]->type);
  }
  bind_results(tensors, exe, frame);
}

}  // namespace

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
  // The generator's state, which other threads' draws change: read and bound under its lock.
  std::unique_lock<std::recursive_mutex> shared = lock_shared_state(requested);
  std::vector<std::shared_ptr<TensorImpl>> tensors = pending_only(requested);
  if (tensors.empty()) return;

  // Hashed first, without building the graph; built only where no executable is cached. A
  // graph reading dims marked dynamic runs on its bucket graph (its plan kept by the traced
  // graph's key), unless it has none.
  Extracted ex;
  GraphHash key, memo_key;
  std::shared_ptr<runtime::Executable> exe;
  std::shared_ptr<const PolymorphicPlan> plan;
  std::string refused;
  bool make = false;
  {
    static auto& trace_time = metrics::detail::timing_cell("TraceTime");
    detail::ScopedTimer timer(trace_time);
    ex = extract_graph(tensors, /*hash_only=*/true);
    key = exec::cache_key(ex.graph_hash, ex.donations);
    if (std::any_of(ex.param_dynamic.begin(), ex.param_dynamic.end(), [](const DynamicMarks& d) { return d.any(); })) {
      memo_key = PlanMemo::key(ex, key);
      const bool planned = plan_memo().find(memo_key, plan, refused);
      if (plan) exe = exec::cached_executable(plan->key);
      make = !planned || (plan && !exe);  // the bucket graph is made from the built graph
    }
    if (!make && !plan) exe = exec::cached_executable(key);
    if (make || !exe) {
      ex = {};  // its buffer references first: donation counts who else holds a buffer
      ex = extract_graph(tensors);
    }
  }
  if (make) {
    plan = make_plan(ex, exe, refused);
    plan_memo().put(memo_key, plan, refused);
  }
  if (plan) {
    run_polymorphic(tensors, ex, *plan, *exe);
    return;
  }
  if (!refused.empty()) note_polymorphic_refusal(refused);
  if (!exe) exe = exec::executable_for(key, ex.graph, ex.donations);
  exec::Frame frame;
  frame.size_for(*exe);
  for (size_t i = 0; i < ex.params.size(); ++i) frame.params[i] = ex.params[i]->data();
  static const exec::BufferPtr none;
  // A donated parameter's buffer was checked by extraction: nothing outside holds it.
  auto offer = [&](size_t k) -> const exec::BufferPtr& {
    return ex.donations[k] >= 0 && exe->donation_accepted(k) ? ex.params[ex.donations[k]] : none;
  };
  auto param = [&](int32_t i) -> const exec::BufferPtr& { return ex.params[i]; };
  static auto& execute_graph = metrics::detail::counter_cell("ExecuteGraph");
  exec::run(*exe, frame, offer, param, execute_graph);
  bind_results(tensors, *exe, frame);
}

}  // namespace lazyrt::trace

namespace lazyrt::trace {

void sync_for_read(const std::vector<std::shared_ptr<TensorImpl>>& requested) {
  std::vector<std::shared_ptr<TensorImpl>> tensors = pending_only(requested);
  if (tensors.empty()) return;
  // The computed (non-leaf) nodes the requested graph holds; cached scalar constants are
  // shared by unrelated graphs and do not count.
  std::unordered_set<const LazyNode*> in_graph;
  auto walk = [](const LazyNode* root, std::unordered_set<const LazyNode*>& seen, auto&& on_node) {
    std::vector<const LazyNode*> stack{root};
    while (!stack.empty()) {
      const LazyNode* n = stack.back();
      stack.pop_back();
      if (n->op == ir::OpKind::Parameter || n->shared || !seen.insert(n).second) continue;
      if (on_node(n)) return true;
      for (const LazyValue& v : n->operands) stack.push_back(v.node.get());
    }
    return false;
  };
  for (const auto& t : tensors) walk(t->pending().node.get(), in_graph, [](const LazyNode*) { return false; });
  // Every other live pending tensor of this thread (autograd's saved values aside) that
  // reaches one of them joins, and so does its graph, until nothing more joins. Another
  // thread's pending tensors never join, even where their graph reads ours: binding them here
  // would rebind tensors that thread may be recording into. They are looked at under the
  // registry's lock, and neither they nor their graphs are held beyond it.
  std::vector<std::shared_ptr<TensorImpl>> joined;
  with_live_pending([&](const std::vector<TensorImpl*>& live) {
    std::vector<TensorImpl*> others;
    for (TensorImpl* t : live)
      if (!t->saved_for_backward &&
          std::none_of(tensors.begin(), tensors.end(), [t](const auto& r) { return r.get() == t; }))
        others.push_back(t);
    for (bool any = true; any;) {
      any = false;
      for (TensorImpl*& t : others) {
        if (!t) continue;
        std::unordered_set<const LazyNode*> seen;
        const bool overlaps =
            walk(t->pending().node.get(), seen, [&](const LazyNode* n) { return in_graph.count(n) > 0; });
        if (!overlaps) continue;
        std::shared_ptr<TensorImpl> kept = t->weak_from_this().lock();
        t = nullptr;
        if (!kept) continue;  // being destroyed
        walk(kept->pending().node.get(), in_graph, [](const LazyNode*) { return false; });
        joined.push_back(std::move(kept));
        any = true;
      }
    }
  });
  tensors.insert(tensors.end(), std::make_move_iterator(joined.begin()), std::make_move_iterator(joined.end()));
  sync_tensors(tensors);
}

}  // namespace lazyrt::trace
