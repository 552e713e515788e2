// Cached-graph replay: the low-level calls (graph_hash, warm_up_cache, graph_inputs,
// run_cached_graph) and compile_step.
//
// What a replay must write back is decided at trace time, from the graph itself: a tensor
// whose old value the graph reads as a parameter and which now holds a pending new value was
// updated in place, so its new value is an output and is written back into it on every run.
// compile_step also journals every tensor the step changes (values and gradients), which
// covers updates that never read the old value (zero_, copy_) and lets the trace be undone.
#include "lazyrt/replay.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/autograd.h"
#include "backend/backend.h"
#include "exec/executor.h"
#include "lazyrt/amp.h"
#include "lazyrt/metrics.h"
#include "ops/views.h"
#include "runtime/buffer.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"
#include "util/metrics_cells.h"
#include "util/timer.h"

namespace lazyrt {

using runtime::Buffer;
using runtime::Executable;
using runtime::OutputSource;
using trace::TensorImpl;
using ImplPtr = std::shared_ptr<TensorImpl>;

namespace {

// Bumped by invalidate_compiled_steps(): module and optimizer changes a trace cannot see.
std::atomic<uint64_t> step_epoch{0};

std::vector<ImplPtr> pending_impls(const std::vector<Tensor>& ts, const char* op) {
  std::vector<ImplPtr> impls;
  for (const Tensor& t : ts) {
    LAZYRT_CHECK(t.defined(), op, ": an output tensor is undefined");
    impls.push_back(trace::impl_of(t));
  }
  return trace::pending_only(impls);
}

// Whether a tensor is state the step updated in place: it held data at the last mark_step()
// (or its making was computed once, below) and holds a pending value now.
bool updated_state(const TensorImpl& t) {
  return t.is_pending() && t.pending_from_data() && !t.saved_for_backward && t.scope == 0 && !t.view_of;
}

// The nodes reachable from some (parameter leaves included).
std::unordered_set<const trace::LazyNode*> reachable(std::vector<const trace::LazyNode*> stack) {
  std::unordered_set<const trace::LazyNode*> seen;
  while (!stack.empty()) {
    const trace::LazyNode* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    for (const trace::LazyValue& v : n->operands) stack.push_back(v.node.get());
  }
  return seen;
}

// The state the step updates in place, the random generator's aside.
std::unordered_set<const TensorImpl*> updated_states(const std::vector<ImplPtr>& live) {
  std::unordered_set<const TensorImpl*> updated;
  for (const ImplPtr& t : live)
    if (updated_state(*t) && !t->shared_state) updated.insert(t.get());
  return updated;
}

// Whether a value reads state the step updates: then the step made it (a gradient, an
// activation), and a replay computes it again, exactly.
bool reads_updated_state(const trace::LazyNode* value, const std::unordered_set<const TensorImpl*>& updated) {
  for (const trace::LazyNode* n : reachable({value})) {
    if (n->op != ir::OpKind::Parameter) continue;
    ImplPtr src = n->source.lock();
    if (src && updated.count(src.get())) return true;
  }
  return false;
}

// Whether a value reads no data but the random generator's state: draws and constants (data
// no live tensor holds, such as the counts a draw advances the generator by).
bool made_of_draws(const trace::LazyNode* value) {
  for (const trace::LazyNode* n : reachable({value})) {
    if (n->op != ir::OpKind::Parameter) continue;
    ImplPtr src = n->source.lock();
    if (n->placeholder >= 0 || (src && !src->shared_state)) return false;
  }
  return true;
}

// The gradients of the pending tensors and of the tensors a graph reads: the step's (its
// backward's) whatever they read.
std::unordered_set<const TensorImpl*> gradients(const std::vector<ImplPtr>& live,
                                                const std::unordered_set<const trace::LazyNode*>& graph) {
  std::unordered_set<const TensorImpl*> grads;
  for (const ImplPtr& t : live)
    if (t->grad) grads.insert(t->grad.get());
  for (const trace::LazyNode* n : graph)
    if (n->op == ir::OpKind::Parameter)
      if (ImplPtr src = n->source.lock(); src && src->grad) grads.insert(src->grad.get());
  return grads;
}

// State made since the last mark_step() and before the step — a module built or loaded, an
// optimizer's state made, an input drawn, without a mark_step() in between — whose making the
// step's graph reads is computed once, now: the value that ended its making becomes data, so
// every replay reads the tensor's current value instead of making it again (and writes the
// update back). That value is the earliest of the tensor's making() the graph reads (its first
// pending value, or one that replaced it whole: an initialisation, a load). A tensor counts as
// such state when that value reads none of the state the step updates (the random generator's
// aside: it is then no gradient or activation of the step, which read the parameters), and the
// tensor was updated in place since, is a parameter (a leaf that requires grad) or, not being
// an output, is made of draws and constants alone (an input drawn before the step, which the
// replays then take as an input).
void compute_pre_step_state(const std::vector<ImplPtr>& roots) {
  std::vector<ImplPtr> live = trace::live_pending_tensors();
  const std::unordered_set<const TensorImpl*> updated = updated_states(live);
  std::vector<const trace::LazyNode*> from;
  for (const ImplPtr& r : roots) from.push_back(r->pending().node.get());
  for (const TensorImpl* t : updated) from.push_back(t->pending().node.get());
  const std::unordered_set<const trace::LazyNode*> graph = reachable(std::move(from));
  const std::unordered_set<const TensorImpl*> grads = gradients(live, graph);
  // Per tensor, the value that ends its making: the earliest of them the step reads.
  struct Candidate {
    ImplPtr t;
    std::shared_ptr<trace::LazyNode> made;
    bool parameter;
  };
  std::vector<Candidate> candidates;
  for (const ImplPtr& t : live) {
    if (t->pending_from_data() || t->saved_for_backward || t->scope != 0 || t->view_of || t->shared_state ||
        grads.count(t.get()))
      continue;
    std::shared_ptr<trace::LazyNode> made;
    for (std::shared_ptr<trace::LazyNode>& v : t->making())
      if (graph.count(v.get())) {
        made = std::move(v);
        break;
      }
    if (!made || made->op == ir::OpKind::Parameter || made->shared || made->types.size() != 1) continue;
    if (reads_updated_state(made.get(), updated)) continue;
    candidates.push_back({t, std::move(made), t->requires_grad && !t->grad_fn});
  }
  // Parameters are state; a value that reads a parameter's making is the step's (a gradient
  // of weights made without a mark_step(), say), however it was updated since.
  std::unordered_set<const trace::LazyNode*> parameters;
  for (const Candidate& c : candidates)
    if (c.parameter) parameters.insert(c.made.get());
  std::vector<std::pair<ImplPtr, std::shared_ptr<trace::LazyNode>>> todo;
  for (Candidate& c : candidates) {
    if (!c.parameter) {
      const auto read = reachable({c.made.get()});
      if (std::any_of(read.begin(), read.end(), [&](const trace::LazyNode* n) { return parameters.count(n) > 0; }))
        continue;
      // Never updated since: state only where made of draws and constants alone and not an
      // output (an input drawn before the step); a value computed from data is the step's.
      if (c.made == c.t->pending().node &&
          (std::find(roots.begin(), roots.end(), c.t) != roots.end() || !made_of_draws(c.made.get())))
        continue;
    }
    todo.emplace_back(std::move(c.t), std::move(c.made));
  }
  if (todo.empty()) return;
  std::vector<ImplPtr> made;
  for (const auto& [t, value] : todo) made.push_back(trace::make_pending({value, 0}));
  trace::sync_tensors(made);
  for (size_t k = 0; k < todo.size(); ++k) todo[k].first->take_computed(todo[k].second, made[k]->data());
}

// The outputs plus every tensor updated in place since the last mark_step() (after the state
// made before the step is computed), and, repeatedly, every pending tensor whose old value the
// graph reads: the in-place updates a replay must perform and write back.
trace::Extracted extract_with_updates(std::vector<ImplPtr>& roots) {
  compute_pre_step_state(roots);
  roots = trace::pending_only(roots);  // a parameter made before the step and never updated is data now
  for (ImplPtr& t : trace::live_pending_tensors())
    if (updated_state(*t) && std::find(roots.begin(), roots.end(), t) == roots.end()) roots.push_back(std::move(t));
  while (true) {
    trace::Extracted ex = trace::extract_graph(roots);
    bool added = false;
    auto add = [&](const std::weak_ptr<TensorImpl>& weak) {
      ImplPtr t = weak.lock();
      if (t && t->is_pending() && t->scope == 0 && std::find(roots.begin(), roots.end(), t) == roots.end()) {
        roots.push_back(std::move(t));
        added = true;
      }
    };
    for (const auto& weak : ex.param_tensors) add(weak);
    for (const auto& [p, weak] : ex.param_aliases) add(weak);
    if (!added) return ex;
  }
}

// The low-level calls take what was recorded since the last mark_step() as the step: the
// graph of the outputs, every tensor updated in place since then, and the in-place updates the
// graph reaches, all performed and written back by a replay (state made before the step
// without a mark_step() computed once first, above). They refuse, naming the tensor, every step
// they could not replay exactly:
// - a live tensor updated in place while pending whose earlier value the graph computes and
//   which could not be computed apart from the step: every replay would compute that earlier
//   value again instead of reading the tensor, and never write the update back;
// - a live tensor updated in place that the graph does not reach (a view whose base the step
//   does not update): a replay would not update it;
// - a tensor the graph reads whose gradient the step replaced, cleared or created: the
//   low-level calls do not replay gradients (compile_step does).
void check_replayable(const std::vector<ImplPtr>& roots, const trace::Extracted& ex, const char* op) {
  std::unordered_set<const trace::LazyNode*> nodes;
  std::vector<const trace::LazyNode*> stack;
  for (const ImplPtr& r : roots) stack.push_back(r->pending().node.get());
  while (!stack.empty()) {
    const trace::LazyNode* n = stack.back();
    stack.pop_back();
    if (!nodes.insert(n).second) continue;
    for (const trace::LazyValue& v : n->operands) stack.push_back(v.node.get());
  }
  const std::vector<ImplPtr> live = trace::live_pending_tensors();
  const std::unordered_set<const TensorImpl*> updated = updated_states(live);
  const std::unordered_set<const TensorImpl*> grads = gradients(live, nodes);
  for (const ImplPtr& t : live) {
    if (t->saved_for_backward || std::find(roots.begin(), roots.end(), t) != roots.end()) continue;
    const ImplPtr view_base = t->view_of ? t->view_of->root() : nullptr;
    const std::string what = detail::str_cat("a tensor (id ", t->id, ", ", ir::type_str(t->type),
                                             view_base ? detail::str_cat(", a view of tensor ", view_base->id) : "", ")");
    std::shared_ptr<trace::LazyNode> origin = t->origin();
    if (origin && origin != t->pending().node && nodes.count(origin.get()) && !grads.count(t.get()) &&
        !reads_updated_state(origin.get(), updated))
      throw Error(detail::str_cat(op, ": the graph reads an earlier value of ", what,
                                  " that was updated in place while still pending, and that value cannot be "
                                  "computed apart from the step (one of several results of an op): every "
                                  "replay would compute it again and never write the update back. Call "
                                  "mark_step() before tracing the step, so that its state is device data"));
    // A view of a tensor the graph writes is re-derived whenever that tensor is written back.
    if (view_base && std::find(roots.begin(), roots.end(), view_base) != roots.end()) continue;
    if (t->pending_from_data())
      throw Error(detail::str_cat(op, ": ", what, " was updated in place since the last mark_step(), but the "
                                  "graph of these outputs does not reach it, so a replay would not update it. "
                                  "Pass it among the outputs, call mark_step() right before tracing the step, "
                                  "or use compile_step"));
  }
  auto check_grad = [&](const std::weak_ptr<TensorImpl>& weak) {
    ImplPtr t = weak.lock();
    if (t && t->grad_changed_since_mark_step())
      throw Error(detail::str_cat(op, ": the step replaced, cleared or created the gradient of a tensor the "
                                  "graph reads (id ", t->id, ", ", ir::type_str(t->type), "), and the "
                                  "low-level calls do not replay gradients; use compile_step, or leave "
                                  "gradients as they were before the step (zero_grad at its end)"));
  };
  for (const auto& w : ex.param_tensors) check_grad(w);
  for (const auto& [p, w] : ex.param_aliases) {
    check_grad(w);
    // run_cached_graph writes updates back into its inputs: one per buffer.
    ImplPtr t = w.lock();
    if (t && std::find(roots.begin(), roots.end(), t) != roots.end())
      throw Error(detail::str_cat(op, ": the step updates a tensor (id ", t->id, ", ", ir::type_str(t->type),
                                  ") that shares its buffer with another tensor the graph reads (a detached "
                                  "copy, say), and a replay writes back one tensor per buffer; use compile_step"));
  }
}

// Per output, the parameter holding the same tensor's old value (-1 if none): the in-place
// updates, whose parameter buffer the executable may write into.
std::vector<int32_t> update_offers(const std::vector<ImplPtr>& roots, const trace::Extracted& ex) {
  std::vector<int32_t> offers(roots.size(), -1);
  for (size_t k = 0; k < roots.size(); ++k)
    for (size_t p = 0; p < ex.param_tensors.size(); ++p)
      if (ex.param_tensors[p].lock() == roots[k]) offers[k] = static_cast<int32_t>(p);
  return offers;
}

const std::shared_ptr<Buffer> kNoBuffer;

// ---- low level ----------------------------------------------------------------------------

// A tensor the graph reads and the gradient it had when the graph was warmed up: a step's
// backward accumulates into that gradient, so a replay is exact only while it is the same.
struct GradAtWarmUp {
  std::weak_ptr<TensorImpl> tensor;
  std::weak_ptr<TensorImpl> grad;
  bool had_grad = false;
};

struct WarmGraph {
  std::shared_ptr<Executable> exe;
  std::vector<int32_t> updates;  // per output, the parameter it updates in place, or -1
  // Per output, the state it is written back into where the graph does not read that
  // state's old value (a value set by zero_ or copy_), else empty.
  std::vector<std::weak_ptr<TensorImpl>> writes;
  // Per tensor given to warm_up_cache, the output that gives its new value, or -1 for one the
  // step does not compute (data, returned as it is: held in `given`). Results come in that
  // order, then the other outputs (the in-place updates the step performs).
  std::vector<int32_t> layout;
  std::vector<ImplPtr> given;
  uint64_t epoch = 0;            // step_epoch when warmed up
  std::vector<GradAtWarmUp> grads;
};

struct GraphHashKey {
  size_t operator()(const GraphHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ULL)); }
};

// Keyed by the whole 128-bit hash: two graphs whose hashes share 64 bits stay apart.
struct WarmTable {
  std::mutex mu;
  // Shared, never changed once in: a replay holds its entry without copying it.
  std::unordered_map<GraphHash, std::shared_ptr<const WarmGraph>, GraphHashKey> entries;
};
WarmTable& warm_table() {
  static WarmTable* t = new WarmTable();
  return *t;
}

}  // namespace

int64_t tensor_id(const Tensor& t) {
  LAZYRT_CHECK(t.defined(), "tensor_id: the tensor is undefined");
  return trace::impl_of(t)->id;
}

GraphHash graph_hash(const std::vector<Tensor>& outputs) {
  std::vector<ImplPtr> roots = pending_impls(outputs, "graph_hash");
  if (roots.empty()) return {};
  trace::Extracted ex = extract_with_updates(roots);
  check_replayable(roots, ex, "graph_hash");
  return exec::cache_key(ex.graph, update_offers(roots, ex));
}

void warm_up_cache(const std::vector<Tensor>& outputs) {
  std::vector<ImplPtr> roots = pending_impls(outputs, "warm_up_cache");
  LAZYRT_CHECK(!roots.empty(), "warm_up_cache: none of the tensors is pending; trace a step first");
  trace::Extracted ex = extract_with_updates(roots);
  check_replayable(roots, ex, "warm_up_cache");
  std::vector<int32_t> offers = update_offers(roots, ex);
  GraphHash key = exec::cache_key(ex.graph, offers);
  std::vector<std::weak_ptr<TensorImpl>> writes(roots.size());
  for (size_t k = 0; k < roots.size(); ++k)
    if (offers[k] < 0 && updated_state(*roots[k])) writes[k] = roots[k];
  std::vector<int32_t> layout;
  std::vector<ImplPtr> given;
  for (const Tensor& t : outputs) {
    const ImplPtr& impl = trace::impl_of(t);
    auto it = std::find(roots.begin(), roots.end(), impl);
    layout.push_back(it == roots.end() ? -1 : static_cast<int32_t>(it - roots.begin()));
    given.push_back(it == roots.end() ? impl : nullptr);
  }
  WarmGraph w{exec::executable_for(key, ex.graph, offers), offers, std::move(writes), std::move(layout),
              std::move(given), step_epoch.load(std::memory_order_relaxed), {}};
  auto note_grad = [&](const std::weak_ptr<TensorImpl>& weak) {
    if (ImplPtr t = weak.lock(); t && t->requires_grad) w.grads.push_back({t, t->grad, t->grad != nullptr});
  };
  for (const auto& t : ex.param_tensors) note_grad(t);
  for (const auto& [p, t] : ex.param_aliases) note_grad(t);
  WarmTable& t = warm_table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.entries[key] = std::make_shared<const WarmGraph>(std::move(w));
}

namespace {
// The views of tensors a replay wrote back take their new values (ops/views.h).
void rederive_written_views(const std::vector<const TensorImpl*>& written) {
  for (const TensorImpl* t : written) {
    auto& base = const_cast<TensorImpl&>(*t);
    if (!base.views.empty() && detail::has_live_views(base)) detail::rederive_views(base, written);
  }
}
}  // namespace

GraphInputs graph_inputs(const std::vector<Tensor>& outputs) {
  std::vector<ImplPtr> roots = pending_impls(outputs, "graph_inputs");
  GraphInputs in;
  if (roots.empty()) return in;
  trace::Extracted ex = extract_with_updates(roots);
  check_replayable(roots, ex, "graph_inputs");
  for (size_t p = 0; p < ex.params.size(); ++p) {
    ImplPtr t = ex.param_tensors[p].lock();
    if (!t) {
      t = trace::make_data(ex.param_types[p], ex.params[p]);
    } else if (t->is_pending()) {
      // Updated in place by the trace: back to the value the graph reads (its views too).
      t->restore_value(ex.params[p], {});
      t->grad_fn = nullptr;
      if (detail::has_live_views(*t)) detail::rederive_views(*t, {});
    }
    in.tensor_ids.push_back(t->id);
    in.values.push_back(trace::tensor_of(t));
  }
  return in;
}

std::vector<Tensor> run_cached_graph(const GraphHash& hash, const std::vector<Tensor>& inputs) {
  std::shared_ptr<const WarmGraph> held;
  {
    WarmTable& t = warm_table();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.entries.find(hash);
    LAZYRT_CHECK(it != t.entries.end(), "run_cached_graph: no graph with hash ", hash.to_string(),
                 " was warmed up; call warm_up_cache(outputs) after tracing the step");
    held = it->second;
  }
  const WarmGraph& w = *held;
  LAZYRT_CHECK(w.epoch == step_epoch.load(std::memory_order_relaxed), "run_cached_graph: a module or "
               "optimizer changed since graph ", hash.to_string(), " was warmed up (train()/eval(), a "
               "replaced or deleted attribute, a new optimizer, an optimizer setting other than the "
               "learning rate): the graph would compute the old step. Trace the step again and warm it up");
  for (const GradAtWarmUp& g : w.grads) {
    ImplPtr t = g.tensor.lock();
    const bool same = !t || (static_cast<bool>(t->grad) == g.had_grad &&
                             (!g.had_grad || (!g.grad.owner_before(t->grad) && !t->grad.owner_before(g.grad))));
    LAZYRT_CHECK(same, "run_cached_graph: the gradient of a tensor the graph reads (id ", t->id, ", ",
                 ir::type_str(t->type), ") was set, cleared or replaced since the graph was warmed up: "
                 "the step's backward would accumulate into another gradient. Trace the step again "
                 "and warm it up, or use compile_step");
  }
  const Executable& exe = *w.exe;
  const auto& types = exe.param_types();
  LAZYRT_CHECK(inputs.size() == types.size(), "run_cached_graph: ", inputs.size(),
               " inputs given, the graph takes ", types.size(), " (as graph_inputs returns them)");
  for (size_t i = 0; i < inputs.size(); ++i) {
    LAZYRT_CHECK(inputs[i].defined(), "run_cached_graph: input ", i, " is undefined");
    const Shape& want = types[i].shape;
    LAZYRT_CHECK(inputs[i].shape() == want && inputs[i].dtype() == types[i].dtype, "run_cached_graph: input ",
                 i, " is ", dtype_name(inputs[i].dtype()), shape_str(inputs[i].shape()), ", the graph takes ",
                 dtype_name(types[i].dtype), shape_str(want));
  }
  // Inputs that other threads' draws change (the generator's state): read and written back
  // under its lock.
  std::unique_lock<std::recursive_mutex> shared;
  for (const Tensor& t : inputs)
    if (trace::impl_of(t)->shared_state && !shared.owns_lock())
      shared = std::unique_lock<std::recursive_mutex>(*trace::impl_of(t)->shared_state);
  std::vector<Tensor> pending;
  for (const Tensor& t : inputs)
    if (t.is_pending()) pending.push_back(t);
  if (!pending.empty()) sync(pending);

  std::vector<std::shared_ptr<Buffer>> params;
  params.reserve(inputs.size());
  exec::Frame frame;
  frame.size_for(exe);
  for (size_t i = 0; i < inputs.size(); ++i) {
    trace::impl_of(inputs[i])->release_leaf();
    params.push_back(trace::impl_of(inputs[i])->data());
    frame.params[i] = params.back()->data();
  }
  // An updated input's buffer is written in place when only the input and `params` hold it.
  auto offer = [&](size_t k) -> const std::shared_ptr<Buffer>& {
    const int32_t p = w.updates[k];
    return p >= 0 && exe.donation_accepted(k) ? exec::writable(params[p], exe.output_types()[k].bytes(), 2) : kNoBuffer;
  };
  auto param = [&](int32_t i) -> const std::shared_ptr<Buffer>& { return params[i]; };
  static auto& replay_graph = metrics::detail::counter_cell("ReplayGraph");
  exec::run(*w.exe, frame, offer, param, replay_graph);
  std::vector<Tensor> results;
  std::vector<const TensorImpl*> written;
  results.reserve(frame.outs.size());
  written.reserve(frame.outs.size());
  for (size_t k = 0; k < frame.outs.size(); ++k) {
    const int32_t p = w.updates[k];
    if (p >= 0) {
      trace::impl_of(inputs[p])->set_data(std::move(frame.outs[k]));
      written.push_back(trace::impl_of(inputs[p]).get());
      results.push_back(inputs[p]);
    } else if (ImplPtr state = w.writes[k].lock()) {
      // A buffer of its own, not one of the executable's constants or another output's (as a sync gives).
      const runtime::OutputSource::Kind kind = exe.outputs()[k].kind;
      if (kind == runtime::OutputSource::Kind::Const || kind == runtime::OutputSource::Kind::Alias)
        frame.outs[k] = backend::current().copy(*frame.outs[k]);
      state->set_data(std::move(frame.outs[k]));
      written.push_back(state.get());
      results.push_back(trace::tensor_of(state));
    } else {
      results.push_back(trace::tensor_of(trace::make_data(exe.output_types()[k], std::move(frame.outs[k]))));
    }
  }
  rederive_written_views(written);
  std::vector<Tensor> ordered;
  ordered.reserve(w.layout.size() + results.size());
  std::vector<char> placed(results.size(), 0);
  for (size_t i = 0; i < w.layout.size(); ++i) {
    if (w.layout[i] >= 0) {
      ordered.push_back(results[w.layout[i]]);
      placed[w.layout[i]] = 1;
      continue;
    }
    ordered.push_back(trace::tensor_of(w.given[i]));
  }
  for (size_t k = 0; k < results.size(); ++k)
    if (!placed[k]) ordered.push_back(std::move(results[k]));
  return ordered;
}

// ---- compile_step ---------------------------------------------------------------------------

namespace {

// Where parameter p of a traced step comes from on each call.
struct Binding {
  enum class Kind { Arg, State, Constant } kind;
  int32_t arg = -1;
  std::weak_ptr<TensorImpl> state;
  std::shared_ptr<Buffer> constant;
  // State: what autograd saw of the tensor when the step was traced.
  bool requires_grad = false;
  bool leaf = true;
  // Other live tensors that held the same buffer when traced: the graph reads them as one
  // value, so they must still share a buffer (else the call retraces).
  std::vector<std::weak_ptr<TensorImpl>> aliases;
};

// Where output k of a traced step goes on each call.
struct Sink {
  enum class Kind { Result, UpdateArg, UpdateState, Grad, ArgGrad } kind;
  int32_t index = -1;                // the result or argument
  std::weak_ptr<TensorImpl> tensor;  // the updated tensor, or the leaf whose gradient it is
  int32_t binding = -1;              // the State binding of that same tensor, if any
};

// The gradient a traced step read before changing it: which tensor (or none) it was.
struct GradGuard {
  std::weak_ptr<TensorImpl> leaf;
  std::weak_ptr<TensorImpl> grad;
  bool had_grad = false;
  int32_t binding = -1;  // the State binding of the leaf, if any
};

// A leaf whose gradient the step sets to none.
struct ClearGrad {
  std::weak_ptr<TensorImpl> leaf;
  int32_t binding = -1;
};

// Whether two pointers own the same object, without locking the weak one (an expired weak
// pointer owns nothing a live shared pointer could).
bool same_owner(const std::weak_ptr<TensorImpl>& w, const ImplPtr& p) {
  return !w.owner_before(p) && !p.owner_before(w);
}

struct Variant {
  // Guards: what the trace assumed besides the captured tensors' values.
  std::vector<ir::TensorType> arg_types;
  std::vector<char> arg_requires_grad;
  std::vector<int32_t> arg_class;                 // per argument, the first one sharing its tensor or buffer
  std::vector<char> pin;                          // per argument: traced as itself, not a proxy,
  std::vector<std::weak_ptr<TensorImpl>> pinned;  // so the call must pass that very tensor
  std::vector<GradGuard> grad_guards;
  uint64_t epoch = 0;
  bool grad_mode = true;
  bool autocast = false;
  DType autocast_dtype = DType::bf16;
  std::shared_ptr<const HostGuard> host;  // the front end's (CompileStepOptions::host_guard)

  std::shared_ptr<Executable> exe;
  std::recursive_mutex* shared_state = nullptr;  // the generator's lock, where the step draws
  std::vector<Binding> bindings;
  std::vector<Sink> sinks;
  std::vector<ClearGrad> clear_grads;
  bool any_pending = false;  // set by lock_state: a captured tensor must be computed first
  std::vector<int32_t> offers;      // per sink, the parameter whose buffer it may be written into
  std::vector<int32_t> sink_reads;  // per sink, the parameter holding its destination's old value
  size_t results = 0;
  // Run-time scratch, sized at trace time.
  std::vector<Tensor> result_tensors;  // the step's own output handles
  std::vector<const std::shared_ptr<Buffer>*> params;  // per binding, the buffer it holds
  std::vector<ImplPtr> holds, sink_holds;               // the state tensors in use
  exec::Frame frame;
  std::vector<size_t> out_bytes;  // per output
  std::vector<ir::TensorType> out_types;  // per output, its traced type
  // Where the executable is a bucket graph's (compile/polymorphic.h): per binding, a buffer of
  // its padded type that each call copies the bound value into (null: bound as it is); per
  // sink, whether its output is padded (cropped into a buffer of its own after the run).
  std::vector<std::shared_ptr<Buffer>> padded_inputs;
  std::vector<compile::Box> input_boxes, sink_boxes;  // per binding, per sink
  std::vector<uint64_t> padded_sinks;  // per sink, its padded dims (bit d for dim d)
  std::vector<std::shared_ptr<Buffer>> sizes;  // the sizes the bucket graph reads
  std::vector<const TensorImpl*> written;  // the tensors a call wrote back (reserved per sink)
  std::vector<std::pair<TensorImpl*, size_t>> lent_copies;  // (tensor, output) copied into lent memory
  // Results that were tensors from outside the step (an updated argument or state tensor) or
  // views of them (a detached parameter, a row of an argument): each call returns that very
  // tensor, or such a view of it again, as PyTorch would.
  struct ResultView {
    size_t result;
    int32_t arg = -1;                  // the base is this argument, or
    std::weak_ptr<TensorImpl> state;   // this state tensor
    trace::ViewOf chain;               // its steps, from the base
    std::vector<int64_t> strides;
    int64_t storage_offset = 0;
    bool identity = false;             // the base itself
  };
  std::vector<ResultView> result_views;
  // What the variant is estimated to hold: its executable's arena and constants, its result
  // buffers and its constant parameters (the weight the variant caps count).
  uint64_t bytes = 0;
};

}  // namespace

void invalidate_compiled_steps() { step_epoch.fetch_add(1, std::memory_order_relaxed); }

struct CompiledStep::State {
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
  CompileStepOptions options;
  std::vector<std::unique_ptr<Variant>> variants;  // most recently used first
  uint64_t variant_bytes = 0;                      // their bytes together
  int traces = 0;
  std::mutex mu;
  // The generator's lock once a variant draws random numbers: its calls run under it, as other
  // threads' draws change the state they read and write back.
  std::recursive_mutex* shared_state = nullptr;
};

namespace {

std::string types_str(const std::vector<Tensor>& args) {
  std::string s;
  for (size_t i = 0; i < args.size(); ++i)
    s += (i ? ", " : "") + std::string(dtype_name(args[i].dtype())) + shape_str(args[i].shape());
  return s;
}

// Per argument, the first argument that is the same tensor or holds the same buffer.
void arg_classes(const std::vector<Tensor>& args, std::vector<int32_t>& out) {
  out.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const TensorImpl* a = trace::impl_of(args[i]).get();
    out[i] = static_cast<int32_t>(i);
    for (size_t j = 0; j < i; ++j) {
      const TensorImpl* b = trace::impl_of(args[j]).get();
      if (a == b || (a->data() && a->data() == b->data())) {
        out[i] = out[j];
        break;
      }
    }
  }
}

// The guards that need no captured tensor: arguments, modes, the epoch.
bool matches(const Variant& v, const std::vector<Tensor>& args) {
  if (args.size() != v.arg_types.size()) return false;
  if (v.epoch != step_epoch.load(std::memory_order_relaxed) || v.grad_mode != autograd::grad_enabled() ||
      v.autocast != amp::autocast_enabled() || (v.autocast && v.autocast_dtype != amp::autocast_dtype()))
    return false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].defined() || args[i].dtype() != v.arg_types[i].dtype || args[i].shape() != v.arg_types[i].shape ||
        args[i].requires_grad() != static_cast<bool>(v.arg_requires_grad[i]))
      return false;
    if (v.pin[i] && v.pinned[i].lock() != trace::impl_of(args[i])) return false;
  }
  if (v.host && !v.host->holds()) return false;
  if (args.size() > 1) {
    thread_local std::vector<int32_t> classes;
    arg_classes(args, classes);
    if (classes != v.arg_class) return false;
  }
  return true;
}

// A stand-in for an argument in the trace: a tensor of its own with its own buffer, so that the
// graph tells reads of the argument from reads of captured state, whatever the argument is.
// Its buffer is never read: tracing only records (a sync while tracing is refused) and every
// run binds the argument itself in its place. So it is allocated, not filled: a step over
// large state (a model's parameters and optimizer state passed as arguments) does not copy
// it all when it is traced, and large buffers left untouched take no resident memory.
Tensor proxy_of(const Tensor& a) {
  const std::shared_ptr<Buffer>& src = trace::impl_of(a)->data();
  auto t = trace::make_data({a.dtype(), a.shape()}, backend::current().allocate(src->bytes()));
  t->requires_grad = a.requires_grad();
  t->dynamic = trace::impl_of(a)->dynamic;
  return trace::tensor_of(std::move(t));
}

// Whether tensor t (or its buffer) is captured by the traced graph or changed by the step
// other than through its argument proxy.
bool captured_elsewhere(const TensorImpl& t, const trace::Extracted& ex, const trace::RebindJournal& journal) {
  for (size_t p = 0; p < ex.params.size(); ++p)
    if (ex.param_tensors[p].lock().get() == &t || (t.data() && ex.params[p] == t.data())) return true;
  for (const auto& e : journal.entries())
    if (e.tensor.get() == &t) return true;
  return false;
}

// Where the traced graph reads dims marked dynamic: the variant's executable is its bucket
// graph's, shared by every size of the bucket; the padded outputs are offered no buffer.
// False where there is none (no marks, or an op that cannot take padding).
bool compile_polymorphic(Variant& v, const trace::Extracted& ex) {
  if (std::none_of(ex.param_dynamic.begin(), ex.param_dynamic.end(), [](const trace::DynamicMarks& d) { return d.any(); }))
    return false;
  std::string why;
  std::optional<compile::PolymorphicGraph> pg = trace::polymorphic_graph(ex, &why);
  if (!pg) {
    if (why != compile::kNothingToPad) trace::note_polymorphic_refusal(why);
    return false;
  }
  std::vector<int32_t> offers = v.offers;
  v.padded_sinks.assign(offers.size(), 0);
  for (size_t k = 0; k < offers.size(); ++k) {
    for (const compile::PaddedDim& d : pg->outputs[k]) v.padded_sinks[k] |= uint64_t{1} << d.dim;
    if (v.padded_sinks[k] || (offers[k] >= 0 && !pg->params[offers[k]].empty())) offers[k] = -1;
  }
  v.offers = offers;
  v.exe = exec::executable_for(exec::cache_key(pg->graph, offers), pg->graph, offers);
  metrics::increment("PolymorphicGraph");
  v.padded_inputs.resize(pg->params.size());
  v.input_boxes = pg->param_boxes;
  v.sink_boxes = pg->output_boxes;
  for (size_t p = 0; p < pg->params.size(); ++p)
    if (!pg->params[p].empty()) {
      v.padded_inputs[p] = backend::current().allocate(v.exe->param_types()[p].bytes());
      std::memset(v.padded_inputs[p]->data(), 0, v.padded_inputs[p]->bytes());
    }
  for (int64_t n : pg->sizes) {
    v.sizes.push_back(backend::current().allocate(sizeof(int64_t)));
    std::memcpy(v.sizes.back()->data(), &n, sizeof(int64_t));
  }
  return true;
}

// Traces the step once. Arguments not in `pin` are traced through proxies; returns null and
// adds to `pin` the arguments found to be captured state as well, or syncs state found still
// pending from before the step (trace again then).
std::unique_ptr<Variant> trace_once(CompiledStep::State& st, const std::vector<Tensor>& args,
                                    std::vector<char>& pin) {
  auto v = std::make_unique<Variant>();
  const size_t n = args.size();
  for (const Tensor& a : args) {
    v->arg_types.push_back({a.dtype(), a.shape()});
    v->arg_requires_grad.push_back(a.requires_grad());
  }
  arg_classes(args, v->arg_class);
  v->grad_mode = autograd::grad_enabled();
  v->autocast = amp::autocast_enabled();
  v->autocast_dtype = amp::autocast_dtype();

  trace::RebindJournal journal;
  bool repin = false;
  try {
    std::vector<Tensor> call_args(n);
    for (size_t i = 0; i < n; ++i) call_args[i] = pin[i] ? args[i] : proxy_of(args[i]);
    auto arg_of = [&](const TensorImpl* t) {
      for (size_t i = 0; i < n; ++i)
        if (trace::impl_of(call_args[i]).get() == t) return static_cast<int32_t>(i);
      return int32_t{-1};
    };
    std::vector<Tensor> results;
    {
      trace::SyncForbidden no_sync(
          "compile_step: the step reads a value or syncs (item, to_vector, mark_step, sync) while "
          "it is traced; a compiled step must stay lazy: return the value instead");
      static auto& trace_time = metrics::detail::timing_cell("TraceTime");
      detail::ScopedTimer timer(trace_time);
      results = st.fn(call_args);
    }
    // State still pending from before the step (recorded on another thread, which the trace's
    // mark_step() leaves alone: a model made on one thread and trained on another) is computed
    // now and the step traced again, so that the graph reads it rather than computing it on
    // every replay.
    if (!journal.pending_before().empty()) {
      std::vector<ImplPtr> earlier = journal.pending_before();
      journal.undo();
      trace::sync_tensors(earlier);
      return nullptr;
    }
    // Outputs: the results, then every tensor the step updated, then gradients it left.
    std::vector<ImplPtr> roots;
    auto root_index = [&](const ImplPtr& t) {
      auto it = std::find(roots.begin(), roots.end(), t);
      if (it != roots.end()) return static_cast<int32_t>(it - roots.begin());
      roots.push_back(t);
      return static_cast<int32_t>(roots.size() - 1);
    };
    std::vector<std::pair<int32_t, Sink>> sinks;
    for (size_t k = 0; k < results.size(); ++k) {
      LAZYRT_CHECK(results[k].defined() && results[k].is_pending(), "compile_step: result ", k,
                   " is not computed by the step (return tensors the step computes)");
      sinks.push_back({root_index(trace::impl_of(results[k])), {Sink::Kind::Result, static_cast<int32_t>(k), {}}});
    }
    for (size_t i = 0; i < n; ++i) {
      if (pin[i]) continue;  // a pinned argument is journaled like any tensor from before
      const ImplPtr& proxy = trace::impl_of(call_args[i]);
      if (proxy->is_pending())
        sinks.push_back({root_index(proxy), {Sink::Kind::UpdateArg, static_cast<int32_t>(i), {}}});
      // The argument's gradient: backward continues from the argument itself on every call.
      if (proxy->grad && proxy->grad->is_pending())
        sinks.push_back({root_index(proxy->grad), {Sink::Kind::ArgGrad, static_cast<int32_t>(i), {}}});
    }
    for (const auto& e : journal.entries()) {
      const std::string what = ir::type_str(e.tensor->type);
      if (e.value_changed) {
        LAZYRT_CHECK(e.tensor->is_pending(), "compile_step: the step gives a tensor (", what,
                     ") a value it does not compute (manual_seed, or a value read back); do that outside the step");
        const int32_t arg = arg_of(e.tensor.get());
        Sink s = arg >= 0 ? Sink{Sink::Kind::UpdateArg, arg, {}} : Sink{Sink::Kind::UpdateState, -1, e.tensor};
        sinks.push_back({root_index(e.tensor), s});
      }
      if (e.grad_read) v->grad_guards.push_back({e.tensor, e.grad, e.grad != nullptr, -1});
      if (e.grad_changed) {
        const ImplPtr& g = e.tensor->grad;
        if (!g) {
          v->clear_grads.push_back({e.tensor, -1});
        } else {
          LAZYRT_CHECK(g->is_pending(), "compile_step: the step sets the gradient of a tensor (", what,
                       ") to a tensor it does not compute; assign gradients outside the step");
          sinks.push_back({root_index(g), {Sink::Kind::Grad, -1, e.tensor}});
        }
      }
    }
    trace::Extracted ex = trace::extract_graph(roots);
    // An argument that the step also reaches as captured state must be traced as itself.
    for (size_t i = 0; i < n; ++i)
      if (!pin[i] && captured_elsewhere(*trace::impl_of(args[i]), ex, journal)) pin[i] = repin = true;
    if (repin) {
      journal.undo();
      return nullptr;
    }
    // One graph output per sink, in sink order.
    std::vector<ir::ValueRef> root_outputs = ex.graph.outputs;
    ex.graph.outputs.clear();
    for (const auto& [root, sink] : sinks) {
      ex.graph.outputs.push_back(root_outputs[root]);
      v->sinks.push_back(sink);
    }
    v->results = results.size();
    for (size_t k = 0; k < results.size(); ++k) {
      const ImplPtr& self = trace::impl_of(results[k]);
      if (const int32_t arg = arg_of(self.get()); arg >= 0 || journal.existed_before(*self)) {
        Variant::ResultView rv{k, arg, {}, {}, {}, 0, true};
        if (arg < 0) rv.state = self;
        v->result_views.push_back(std::move(rv));
        continue;
      }
      const TensorImpl& r = *self;
      const ImplPtr base = r.view_of ? r.view_of->root() : nullptr;
      if (!base) continue;
      Variant::ResultView rv{k, arg_of(base.get()), {}, {}, r.strides, r.storage_offset, false};
      if (rv.arg < 0) {
        if (!journal.existed_before(*base)) continue;  // a view of a value made by the step
        rv.state = base;
      }
      rv.chain.steps = r.view_of->steps;
      rv.chain.detached = r.view_of->detached;
      rv.chain.grad = r.view_of->grad;
      v->result_views.push_back(std::move(rv));
    }
    for (size_t p = 0; p < ex.params.size(); ++p) {
      ImplPtr src = ex.param_tensors[p].lock();
      Binding b{Binding::Kind::Constant, -1, {}, ex.params[p]};
      const int32_t arg = src ? arg_of(src.get()) : -1;
      if (arg >= 0) b = {Binding::Kind::Arg, arg, {}, nullptr};
      else if (src) b = {Binding::Kind::State, -1, src, nullptr};
      v->bindings.push_back(std::move(b));
    }
    for (const auto& [p, weak] : ex.param_aliases) {
      Binding& b = v->bindings[p];
      ImplPtr t = weak.lock();
      if (!t) continue;
      if (b.kind == Binding::Kind::Constant) b = {Binding::Kind::State, -1, t, nullptr};  // the live one
      else if (b.kind == Binding::Kind::State) b.aliases.push_back(t);
    }
    // Tensors that are bound anyway are reached through their binding on each call.
    auto binding_of = [&](const std::weak_ptr<TensorImpl>& t) {
      for (size_t p = 0; p < v->bindings.size(); ++p)
        if (v->bindings[p].kind == Binding::Kind::State && same_owner(v->bindings[p].state, t.lock()))
          return static_cast<int32_t>(p);
      return int32_t{-1};
    };
    for (Sink& s : v->sinks)
      if (s.kind == Sink::Kind::UpdateState || s.kind == Sink::Kind::Grad) s.binding = binding_of(s.tensor);
    for (GradGuard& g : v->grad_guards) g.binding = binding_of(g.leaf);
    for (ClearGrad& c : v->clear_grads) c.binding = binding_of(c.leaf);
    // An update may be written into the buffer of the parameter holding its old value (the
    // compiler decides whether it can write it there directly); a gradient likewise, when the
    // step read the gradient it replaces (accumulation).
    v->offers.assign(v->sinks.size(), -1);
    for (size_t k = 0; k < v->sinks.size(); ++k) {
      const Sink& s = v->sinks[k];
      ImplPtr old_grad;
      if (s.kind == Sink::Kind::Grad)
        for (const GradGuard& g : v->grad_guards)
          if (same_owner(g.leaf, s.tensor.lock())) old_grad = g.grad.lock();
      for (size_t p = 0; p < v->bindings.size(); ++p) {
        const Binding& b = v->bindings[p];
        if ((s.kind == Sink::Kind::UpdateArg && b.kind == Binding::Kind::Arg && b.arg == s.index) ||
            (s.kind == Sink::Kind::UpdateState && b.kind == Binding::Kind::State &&
             b.state.lock() == s.tensor.lock()) ||
            (old_grad && b.kind == Binding::Kind::State && same_owner(b.state, old_grad)))
          v->offers[k] = static_cast<int32_t>(p);
      }
    }
    v->sink_reads = v->offers;
    for (ir::ValueRef o : ex.graph.outputs) v->out_types.push_back(ex.graph.type(o));
    if (!compile_polymorphic(*v, ex)) {
      GraphHash key = exec::cache_key(ex.graph, v->offers);
      v->exe = exec::executable_for(key, ex.graph, v->offers);
    }
    v->pin = pin;
    for (size_t i = 0; i < n; ++i)
      if (pin[i]) v->pinned.push_back(trace::impl_of(args[i]));
      else v->pinned.emplace_back();
  } catch (...) {
    journal.undo();
    throw;
  }
  journal.undo();
  // What autograd sees of captured state, as it was before the step.
  for (Binding& b : v->bindings)
    if (b.kind == Binding::Kind::State)
      if (ImplPtr t = b.state.lock()) {
        b.requires_grad = t->requires_grad;
        b.leaf = t->grad_fn == nullptr;
      }
  return v;
}

std::unique_ptr<Variant> trace_step(CompiledStep::State& st, const std::vector<Tensor>& args) {
  for (size_t i = 0; i < args.size(); ++i) LAZYRT_CHECK(args[i].defined(), "compile_step: argument ", i, " is undefined");
  // A step starts from device data: whatever is pending now (fresh modules, load_state_dict,
  // in-place edits, the arguments) is computed first, so that the step's graph reads every
  // tensor from before it as an input and a replay never recomputes it.
  mark_step();
  // Arguments recorded on another thread are not among the tensors mark_step() syncs.
  std::vector<ImplPtr> pending_args;
  for (const Tensor& a : args)
    if (a.is_pending()) pending_args.push_back(trace::impl_of(a));
  trace::sync_tensors(pending_args);
  // Arguments that are the same tensor (or buffer) as another one are traced as themselves.
  std::vector<int32_t> classes;
  arg_classes(args, classes);
  std::vector<char> pin(args.size(), 0);
  for (size_t i = 0; i < args.size(); ++i)
    if (classes[i] != static_cast<int32_t>(i)) pin[i] = pin[classes[i]] = 1;
  // Traced again (at most twice) where arguments turn out to be captured state as well, and
  // where state from before the step was still pending.
  std::unique_ptr<Variant> v;
  for (int attempt = 0; attempt < 3 && !v; ++attempt) v = trace_once(st, args, pin);
  LAZYRT_ASSERT(v, "compile_step: tracing did not settle which arguments are captured state");
  v->epoch = step_epoch.load(std::memory_order_relaxed);
  if (st.options.host_guard) v->host = st.options.host_guard();
  for (const Binding& b : v->bindings)
    if (ImplPtr t = b.state.lock(); t && t->shared_state) v->shared_state = t->shared_state;
  for (const Sink& k : v->sinks)
    if (ImplPtr t = k.tensor.lock(); t && t->shared_state) v->shared_state = t->shared_state;
  if (v->shared_state) st.shared_state = v->shared_state;
  const size_t np = v->bindings.size(), no = v->sinks.size();
  v->params.resize(np);
  v->holds.resize(np);
  v->sink_holds.resize(no);
  v->frame.size_for(*v->exe);
  for (const auto& t : v->out_types) v->out_bytes.push_back(t.bytes());
  v->written.reserve(v->sinks.size());
  for (size_t s = 0; s < v->sizes.size(); ++s) v->frame.params[np + s] = v->sizes[s]->data();
  for (size_t k = 0; k < v->results; ++k) {
    auto buf = backend::current().allocate(v->out_types[k].bytes());
    v->result_tensors.push_back(trace::tensor_of(trace::make_data(v->out_types[k], buf)));
  }
  // Results keep the marks of the dims that derive from a marked one, as a sync's do.
  for (size_t k = 0; k < v->padded_sinks.size(); ++k)
    if (v->sinks[k].kind == Sink::Kind::Result)
      trace::impl_of(v->result_tensors[v->sinks[k].index])->dynamic.soft |= v->padded_sinks[k];
  v->bytes = v->exe->held_bytes();
  for (const Tensor& t : v->result_tensors) v->bytes += trace::impl_of(t)->data()->bytes();
  for (const Binding& b : v->bindings)
    if (b.constant) v->bytes += b.constant->bytes();
  for (const auto& b : v->padded_inputs)
    if (b) v->bytes += b->bytes();
  return v;
}

// Evicts the least recently used variants while the step is over either cap. The first
// variant (the one in use) always stays.
void evict_variants(CompiledStep::State& st) {
  static auto& evictions = metrics::detail::counter_cell("CompiledStepVariantEvictions");
  const CompileStepOptions& o = st.options;
  while (st.variants.size() > 1 &&
         (st.variants.size() > o.max_variants || (o.max_variant_bytes > 0 && st.variant_bytes > o.max_variant_bytes))) {
    st.variant_bytes -= st.variants.back()->bytes;
    st.variants.pop_back();
    evictions.add(1);
  }
}

// A captured tensor during a call: through its binding's hold, or locked into `hold`.
TensorImpl* resolve(const Variant& v, int32_t binding, const std::weak_ptr<TensorImpl>& weak, ImplPtr& hold) {
  if (binding >= 0) return v.holds[binding].get();
  if (!hold) hold = weak.lock();
  return hold.get();
}

// Sinks' current tensors (for buffer reuse) and where the new values go.
TensorImpl* sink_tensor(const Variant& v, const Sink& s, const std::vector<Tensor>& args, ImplPtr& hold) {
  switch (s.kind) {
    case Sink::Kind::Result: return trace::impl_of(v.result_tensors[s.index]).get();
    case Sink::Kind::UpdateArg: return trace::impl_of(args[s.index]).get();
    case Sink::Kind::UpdateState: return resolve(v, s.binding, s.tensor, hold);
    case Sink::Kind::Grad: {
      // The step leaves a new gradient tensor; the old one's buffer (and the tensor itself)
      // is reused only where nothing but the leaf holds it, so nobody can tell.
      TensorImpl* leaf = resolve(v, s.binding, s.tensor, hold);
      return leaf && leaf->grad && leaf->grad.use_count() == 1 && !leaf->grad->grad_fn ? leaf->grad.get() : nullptr;
    }
    case Sink::Kind::ArgGrad: return nullptr;
  }
  return nullptr;
}

// Locks the captured tensors (v.holds) and checks the guards that need them: every captured
// tensor exists and is as autograd saw it, no argument is captured state unless it was when
// traced, and every gradient the step read is still the same tensor (or still none).
// On a failure the holds are released.
bool lock_state(Variant& v, const std::vector<Tensor>& args) {
  bool ok = true;
  v.any_pending = false;
  for (size_t p = 0; ok && p < v.bindings.size(); ++p) {
    const Binding& b = v.bindings[p];
    if (b.kind != Binding::Kind::State) continue;
    v.holds[p] = b.state.lock();
    const TensorImpl* t = v.holds[p].get();
    if (!t || t->requires_grad != b.requires_grad || (t->grad_fn == nullptr) != b.leaf) ok = false;
    else v.any_pending |= t->is_pending();
    for (size_t a = 0; ok && a < b.aliases.size(); ++a)
      if (ImplPtr other = b.aliases[a].lock())
        if (other->is_pending() || t->is_pending() || other->data() != t->data()) ok = false;
    for (size_t i = 0; ok && i < args.size(); ++i)
      if (trace::impl_of(args[i]).get() == t && !v.pin[i]) ok = false;
  }
  for (size_t g = 0; ok && g < v.grad_guards.size(); ++g) {
    const GradGuard& gg = v.grad_guards[g];
    ImplPtr hold;
    const TensorImpl* leaf = resolve(v, gg.binding, gg.leaf, hold);
    if (!leaf || static_cast<bool>(leaf->grad) != gg.had_grad || (gg.had_grad && !same_owner(gg.grad, leaf->grad)))
      ok = false;
  }
  for (size_t k = 0; ok && k < v.sinks.size(); ++k) {
    const Sink& s = v.sinks[k];
    if ((s.kind == Sink::Kind::UpdateState || s.kind == Sink::Kind::Grad) && s.binding < 0 && s.tensor.expired())
      ok = false;
  }
  if (!ok)
    for (auto& h : v.holds) h = nullptr;
  return ok;
}

// Copies each output (tensor, output index) into the lent memory its tensor holds. A source
// that is itself lent memory (a parameter passed through, or another output's tensor when two
// outputs are one value: the zeros zero_grad writes into gradients of one shape) is copied
// aside first only when one of these copies writes over it.
void copy_into_lent(Variant& v, const std::vector<std::pair<TensorImpl*, size_t>>& lent) {
  auto written_over = [&lent](const Buffer& b) {
    const auto* lo = static_cast<const char*>(b.data());
    const auto* hi = lo + b.bytes();
    for (const auto& [t, k] : lent) {
      const auto* d = static_cast<const char*>(t->data()->data());
      if (d < hi && lo < d + t->data()->bytes()) return true;
    }
    return false;
  };
  std::vector<std::shared_ptr<Buffer>> sources;
  sources.reserve(lent.size());
  for (const auto& [t, k] : lent) {
    const std::shared_ptr<Buffer>& b = v.frame.outs[k];
    sources.push_back(b->is_adopted() && written_over(*b) ? backend::current().copy(*b) : b);
  }
  for (size_t i = 0; i < lent.size(); ++i)
    if (lent[i].first->data()->bytes() > 0)
      std::memcpy(lent[i].first->data()->data(), sources[i]->data(), sources[i]->bytes());
}

// The tensors the run reads and writes are held (v.holds, v.sink_holds) from binding to
// write-back, so their buffers stay alive and parameters are bound by pointer, without a
// reference count per buffer.
void replay(Variant& v, const std::vector<Tensor>& args) {
  Executable& exe = *v.exe;
  // Bind: every parameter must be device data; pending ones (state loaded with
  // load_state_dict, an edited parameter, a lazy argument) are computed first, in one graph.
  bool any_pending = v.any_pending;
  for (const Tensor& a : args) any_pending |= trace::impl_of(a)->is_pending();
  if (any_pending) {
    std::vector<ImplPtr> pending;
    for (size_t p = 0; p < v.bindings.size(); ++p) {
      const Binding& b = v.bindings[p];
      TensorImpl* t = b.kind == Binding::Kind::Arg ? trace::impl_of(args[b.arg]).get() : v.holds[p].get();
      if (t && t->is_pending()) pending.push_back(t->shared_from_this());
    }
    trace::sync_tensors(pending);
  }
  for (size_t p = 0; p < v.bindings.size(); ++p) {
    const Binding& b = v.bindings[p];
    TensorImpl* t = b.kind == Binding::Kind::Arg ? trace::impl_of(args[b.arg]).get() : v.holds[p].get();
    if (t) {
      t->release_leaf();
      v.params[p] = &t->data();
    } else {
      v.params[p] = &b.constant;
    }
    if (!v.padded_inputs.empty() && v.padded_inputs[p]) {
      // Into the bucket's shape: the padding (zeros since allocation) is never written.
      const compile::Box& box = v.input_boxes[p];
      exec::copy_box((*v.params[p])->data(), box.traced, v.padded_inputs[p]->data(), box.padded, box.traced,
                     dtype_size(v.exe->param_types()[p].dtype));
      v.params[p] = &v.padded_inputs[p];
    }
    v.frame.params[p] = (*v.params[p])->data();
  }
  // Each output may be written into the buffer its destination already holds, when nobody
  // else holds that buffer: a replay then writes parameters and state in place.
  auto offer = [&](size_t k) -> const std::shared_ptr<Buffer>& {
    // A destination the graph also reads is written only where the compiler accepted it (it
    // refuses, for one, when the old value is itself an output).
    if (v.sink_reads[k] >= 0 && !exe.donation_accepted(k)) return kNoBuffer;
    if (!v.padded_sinks.empty() && v.padded_sinks[k]) return kNoBuffer;
    TensorImpl* t = sink_tensor(v, v.sinks[k], args, v.sink_holds[k]);
    if (!t) return kNoBuffer;
    t->release_leaf();
    return t->is_pending() ? kNoBuffer : exec::writable(t->data(), v.out_bytes[k], 1);
  };
  // Outputs the executable did not compute are resolved before any write-back changes a
  // parameter's buffer.
  auto param_at = [&v](int32_t p) -> const std::shared_ptr<Buffer>& { return *v.params[p]; };
  static auto& replay_graph = metrics::detail::counter_cell("ReplayGraph");
  exec::run(exe, v.frame, offer, param_at, replay_graph);
  for (size_t k = 0; k < v.padded_sinks.size(); ++k)
    if (v.padded_sinks[k])
      v.frame.outs[k] = exec::cropped_copy(*v.frame.outs[k], v.sink_boxes[k], v.out_types[k]);
  std::vector<std::pair<int32_t, Tensor>> arg_grads;
  // The tensors written back, kept only when one of them has views (rare): those views are
  // re-derived after the write-back, except the ones written too.
  std::vector<const TensorImpl*>& written = v.written;
  written.clear();
  bool any_views = false;
  std::vector<std::pair<TensorImpl*, size_t>>& lent = v.lent_copies;
  lent.clear();
  for (size_t k = 0; k < v.sinks.size(); ++k) {
    const std::shared_ptr<Buffer>& b = v.frame.outs[k];
    // Replays mostly write back into the buffer the tensor already holds: no copy then. A
    // value that went elsewhere (a constant, a parameter passed through, an output the
    // compiler could not write there) is copied into memory lent for writing, below, and
    // otherwise becomes the tensor's buffer.
    auto write_back = [&b, &written, &any_views, &lent, k](TensorImpl& t) {
      if (!t.is_pending() && t.data() != b && t.data()->is_adopted() && t.data()->replay_writable() &&
          t.data()->bytes() == b->bytes())
        lent.emplace_back(&t, k);
      else if (t.is_pending() || t.data() != b)
        t.set_data(b);
      written.push_back(&t);
      any_views |= !t.views.empty();
    };
    const Sink& s = v.sinks[k];
    TensorImpl* held = s.kind == Sink::Kind::UpdateState || s.kind == Sink::Kind::Grad
                           ? resolve(v, s.binding, s.tensor, v.sink_holds[k])
                           : nullptr;
    switch (s.kind) {
      case Sink::Kind::Result: write_back(*trace::impl_of(v.result_tensors[s.index])); break;
      case Sink::Kind::UpdateArg: write_back(*trace::impl_of(args[s.index])); break;
      case Sink::Kind::UpdateState:
        if (held) write_back(*held);
        break;
      case Sink::Kind::Grad:
        if (held) {
          if (held->grad && held->grad.use_count() == 1 && !held->grad->grad_fn) write_back(*held->grad);
          else held->set_grad_impl(trace::make_data(v.out_types[k], b));
        }
        break;
      case Sink::Kind::ArgGrad:
        arg_grads.emplace_back(s.index, trace::tensor_of(trace::make_data(v.out_types[k], b)));
        break;
    }
  }
  if (!lent.empty()) copy_into_lent(v, lent);
  for (const ClearGrad& c : v.clear_grads) {
    ImplPtr hold;
    if (TensorImpl* t = resolve(v, c.binding, c.leaf, hold))
      if (t->grad) t->set_grad_impl(nullptr);
  }
  if (any_views) rederive_written_views(written);
  for (auto& o : v.frame.outs) o = nullptr;
  for (auto& h : v.sink_holds) h = nullptr;
  for (auto& h : v.holds) h = nullptr;
  // The gradient of an argument flows on from the argument, as backward would have taken it:
  // into its .grad if it is a leaf, through its own graph if it is not.
  for (auto& [i, g] : arg_grads) autograd::backward(args[i], g);
}

}  // namespace

CompiledStep::CompiledStep(std::shared_ptr<State> state) : state_(std::move(state)) {}

namespace {

// The variant that runs these arguments, with its captured tensors locked (lock_state): the
// most recently used one that matches, else a new trace. Called under st.mu. The variant
// returned is first in st.variants. A trace that fails (the step function throws, or the
// trace does not match its own call) leaves the step as it was.
Variant& variant_for(CompiledStep::State& st, const std::vector<Tensor>& args) {
  for (size_t i = 0; i < st.variants.size(); ++i) {
    if (!matches(*st.variants[i], args) || !lock_state(*st.variants[i], args)) continue;
    if (i > 0) std::rotate(st.variants.begin(), st.variants.begin() + static_cast<ptrdiff_t>(i),
                           st.variants.begin() + static_cast<ptrdiff_t>(i) + 1);
    return *st.variants.front();
  }
  LAZYRT_CHECK(st.options.retrace_on_guard_failure, "compile_step: the call does not match the trace (",
               args.size(), " arguments: ", types_str(args),
               "; or a captured tensor, a gradient the step reads, the grad or autocast mode, a "
               "module or an optimizer setting changed since); retracing is off");
  for (size_t i = 0; i < args.size(); ++i) LAZYRT_CHECK(args[i].defined(), "compile_step: argument ", i, " is undefined");
  std::unique_ptr<Variant> traced = trace_step(st, args);
  LAZYRT_CHECK(matches(*traced, args) && lock_state(*traced, args),
               "compile_step: the step changes what it depends on while it is traced (it switches "
               "train/eval, replaces a module attribute or an optimizer setting, or changes a "
               "gradient it reads before reading it); such a step cannot be replayed");
  // Variants that can never match again go: captured state gone, or traced before a change
  // of modules or optimizer settings.
  const uint64_t epoch = step_epoch.load(std::memory_order_relaxed);
  std::erase_if(st.variants, [&](const std::unique_ptr<Variant>& cand) {
    bool stale = cand->epoch != epoch;
    for (const Binding& b : cand->bindings)
      stale = stale || (b.kind == Binding::Kind::State && b.state.expired());
    if (stale) st.variant_bytes -= cand->bytes;
    return stale;
  });
  ++st.traces;
  st.variant_bytes += traced->bytes;
  st.variants.insert(st.variants.begin(), std::move(traced));
  evict_variants(st);
  return *st.variants.front();
}

// The variant for args, replayed on them. A call that traced hands the memory tracing and
// compiling freed back to the system once its replay is done.
Variant& replay_call(CompiledStep::State& st, const std::vector<Tensor>& args) {
  const int traces = st.traces;
  std::unique_lock<std::recursive_mutex> shared;
  if (st.shared_state) shared = std::unique_lock<std::recursive_mutex>(*st.shared_state);
  Variant& v = variant_for(st, args);
  if (v.shared_state && !shared.owns_lock()) shared = std::unique_lock<std::recursive_mutex>(*v.shared_state);
  replay(v, args);
  if (st.traces != traces) runtime::release_free_heap();
  return v;
}
}  // namespace

const std::vector<Tensor>& CompiledStep::run(const std::vector<Tensor>& args) {
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu);
  return replay_call(st, args).result_tensors;
}

std::vector<Tensor> CompiledStep::operator()(const std::vector<Tensor>& args) {
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu);
  Variant& v = replay_call(st, args);
  std::vector<Tensor> copies;
  copies.reserve(v.result_tensors.size());
  for (const Tensor& t : v.result_tensors) copies.push_back(detail::detached_value(t));
  for (const Variant::ResultView& rv : v.result_views) {
    ImplPtr base = rv.arg >= 0 ? trace::impl_of(args[static_cast<size_t>(rv.arg)]) : rv.state.lock();
    if (!base) continue;
    if (rv.identity) copies[rv.result] = trace::tensor_of(std::move(base));
    else detail::attach_view(copies[rv.result], *base, rv.chain, rv.strides, rv.storage_offset);
  }
  return copies;
}

int CompiledStep::traces() const {
  std::lock_guard<std::mutex> lock(state_->mu);  // another thread's call may be tracing
  return state_->traces;
}

size_t CompiledStep::variants() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->variants.size();
}

uint64_t CompiledStep::variant_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->variant_bytes;
}

void CompiledStep::set_max_variants(size_t max_variants) {
  LAZYRT_CHECK(max_variants >= 1, "CompiledStep::set_max_variants: got 0; a compiled step keeps at least 1 variant");
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->options.max_variants = max_variants;
  evict_variants(*state_);
}

size_t CompiledStep::max_variants() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->options.max_variants;
}

void CompiledStep::set_max_variant_bytes(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->options.max_variant_bytes = bytes;
  evict_variants(*state_);
}

uint64_t CompiledStep::max_variant_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->options.max_variant_bytes;
}

CompiledStep compile_step(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                          const std::vector<Tensor>& example_args, CompileStepOptions options) {
  LAZYRT_CHECK(static_cast<bool>(fn), "compile_step: the step function is empty");
  LAZYRT_CHECK(options.max_variants >= 1, "compile_step: max_variants is 0; a compiled step keeps at least 1 variant");
  auto st = std::make_shared<CompiledStep::State>();
  st->fn = std::move(fn);
  st->options = options;
  st->variants.push_back(trace_step(*st, example_args));
  st->variant_bytes = st->variants.front()->bytes;
  st->traces = 1;
  return CompiledStep(std::move(st));
}

}  // namespace lazyrt
