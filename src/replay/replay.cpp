// Cached-graph replay: the low-level calls (graph_hash, warm_up_cache, graph_inputs,
// run_cached_graph) and compile_step.
//
// What a replay must write back is decided at trace time, from the graph itself: a tensor
// whose old value the graph reads as a parameter and which now holds a pending new value was
// updated in place, so its new value is an output and is written back into it on every run.
// compile_step also journals every tensor the step changes (values and gradients), which
// covers updates that never read the old value (zero_, copy_) and lets the trace be undone.
#include "lazyrt/replay.h"

#include <map>
#include <mutex>
#include <unordered_map>

#include "lazyrt/metrics.h"
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

std::vector<ImplPtr> pending_impls(const std::vector<Tensor>& ts, const char* op) {
  std::vector<ImplPtr> out;
  for (const Tensor& t : ts) {
    LAZYRT_CHECK(t.defined(), op, ": an output tensor is undefined");
    if (t.is_pending() && std::find(out.begin(), out.end(), t.impl()) == out.end()) out.push_back(t.impl());
  }
  return out;
}

// The outputs plus, repeatedly, every pending tensor whose old value the graph reads: the
// in-place updates a replay must perform and write back.
trace::Extracted extract_with_updates(std::vector<ImplPtr>& roots) {
  while (true) {
    trace::Extracted ex = trace::extract_graph(roots);
    bool added = false;
    for (const auto& weak : ex.param_tensors) {
      ImplPtr t = weak.lock();
      if (t && t->is_pending() && t->scope == 0 && std::find(roots.begin(), roots.end(), t) == roots.end()) {
        roots.push_back(std::move(t));
        added = true;
      }
    }
    if (!added) return ex;
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

// A buffer of `bytes` for an output: `reuse` when its only holders are the `owners` the caller
// knows of (and lazyrt owns it: adopted memory is never written), else a new one.
std::shared_ptr<Buffer> output_buffer(size_t bytes, const std::shared_ptr<Buffer>& reuse, long owners) {
  if (reuse && !reuse->is_adopted() && reuse.use_count() <= owners && reuse->bytes() == bytes) return reuse;
  return runtime::allocate(bytes);
}

const std::shared_ptr<Buffer> kNoBuffer;

// After a run: the buffer holding output k, for outputs the executable did not compute.
// param_at(i): the buffer bound as parameter i.
template <class ParamAt>
std::shared_ptr<Buffer> resolve_output(const Executable& exe, size_t k, const ParamAt& param_at,
                                       std::vector<std::shared_ptr<Buffer>>& outs) {
  const OutputSource& s = exe.outputs()[k];
  switch (s.kind) {
    case OutputSource::Kind::Computed: return outs[k];
    case OutputSource::Kind::Param: return param_at(s.index);
    case OutputSource::Kind::Const: return exe.constant_output(s.index);
    case OutputSource::Kind::Alias: return outs[s.index];
  }
  return nullptr;
}

// ---- low level ----------------------------------------------------------------------------

struct WarmGraph {
  std::shared_ptr<Executable> exe;
  std::vector<int32_t> updates;  // per output, the parameter it updates in place, or -1
};

struct WarmTable {
  std::mutex mu;
  std::unordered_map<uint64_t, std::pair<GraphHash, WarmGraph>> entries;
};
WarmTable& warm_table() {
  static WarmTable* t = new WarmTable();
  return *t;
}

}  // namespace

int64_t tensor_id(const Tensor& t) {
  LAZYRT_CHECK(t.defined(), "tensor_id: the tensor is undefined");
  return t.impl()->id;
}

GraphHash graph_hash(const std::vector<Tensor>& outputs) {
  std::vector<ImplPtr> roots = pending_impls(outputs, "graph_hash");
  if (roots.empty()) return {};
  trace::Extracted ex = extract_with_updates(roots);
  return trace::cache_key(ex.graph, update_offers(roots, ex));
}

void warm_up_cache(const std::vector<Tensor>& outputs) {
  std::vector<ImplPtr> roots = pending_impls(outputs, "warm_up_cache");
  LAZYRT_CHECK(!roots.empty(), "warm_up_cache: none of the tensors is pending; trace a step first");
  trace::Extracted ex = extract_with_updates(roots);
  std::vector<int32_t> offers = update_offers(roots, ex);
  GraphHash key = trace::cache_key(ex.graph, offers);
  WarmGraph w{trace::executable_for(key, ex.graph, offers), offers};
  WarmTable& t = warm_table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.entries[key.lo ^ key.hi] = {key, std::move(w)};
}

GraphInputs graph_inputs(const std::vector<Tensor>& outputs) {
  std::vector<ImplPtr> roots = pending_impls(outputs, "graph_inputs");
  GraphInputs in;
  if (roots.empty()) return in;
  trace::Extracted ex = extract_with_updates(roots);
  for (size_t p = 0; p < ex.params.size(); ++p) {
    ImplPtr t = ex.param_tensors[p].lock();
    if (!t) {
      t = trace::make_data(ex.graph.nodes[ex.param_nodes[p]].results[0], ex.params[p]);
    } else if (t->is_pending()) {
      // Updated in place by the trace: back to the value the graph reads.
      t->restore_value(ex.params[p], {});
      t->grad_fn = nullptr;
    }
    in.tensor_ids.push_back(t->id);
    in.values.push_back(Tensor(t));
  }
  return in;
}

std::vector<Tensor> run_cached_graph(const GraphHash& hash, const std::vector<Tensor>& inputs) {
  WarmGraph w;
  {
    WarmTable& t = warm_table();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.entries.find(hash.lo ^ hash.hi);
    LAZYRT_CHECK(it != t.entries.end() && it->second.first == hash, "run_cached_graph: no graph with hash ",
                 hash.to_string(), " was warmed up; call warm_up_cache(outputs) after tracing the step");
    w = it->second.second;
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
  std::vector<Tensor> pending;
  for (const Tensor& t : inputs)
    if (t.is_pending()) pending.push_back(t);
  if (!pending.empty()) sync(pending);

  std::vector<std::shared_ptr<Buffer>> params;
  std::vector<const void*> param_ptrs;
  for (const Tensor& t : inputs) {
    t.impl()->release_leaf();
    params.push_back(t.impl()->data());
    param_ptrs.push_back(params.back()->data());
  }
  const size_t n = exe.outputs().size();
  std::vector<std::shared_ptr<Buffer>> outs(n);
  std::vector<void*> out_ptrs(n, nullptr);
  for (size_t k = 0; k < n; ++k) {
    if (exe.outputs()[k].kind != OutputSource::Kind::Computed) continue;
    const int32_t p = w.updates[k];
    // An updated input's buffer is written in place when only the input and `params` hold it.
    outs[k] = output_buffer(exe.output_types()[k].bytes(),
                            p >= 0 && exe.donation_accepted(k) ? params[p] : kNoBuffer, 2);
    out_ptrs[k] = outs[k]->data();
  }
  {
    static auto& execute_time = metrics::detail::timing_cell("ExecuteTime");
    detail::ScopedTimer timer(execute_time);
    w.exe->run(param_ptrs.data(), out_ptrs.data());
  }
  static auto& replay_graph = metrics::detail::counter_cell("ReplayGraph");
  replay_graph.add(1);
  std::vector<Tensor> results;
  for (size_t k = 0; k < n; ++k) {
    std::shared_ptr<Buffer> b =
        resolve_output(exe, k, [&](int32_t i) -> const std::shared_ptr<Buffer>& { return params[i]; }, outs);
    outs[k] = b;
    const int32_t p = w.updates[k];
    if (p >= 0) {
      inputs[p].impl()->set_data(std::move(b));
      results.push_back(inputs[p]);
    } else {
      results.push_back(Tensor(trace::make_data(exe.output_types()[k], std::move(b))));
    }
  }
  return results;
}

// ---- compile_step ---------------------------------------------------------------------------

namespace {

// Where parameter p of a traced step comes from on each call.
struct Binding {
  enum class Kind { Arg, State, Constant } kind;
  int32_t arg = -1;
  std::weak_ptr<TensorImpl> state;
  std::shared_ptr<Buffer> constant;
};

// Where output k of a traced step goes on each call.
struct Sink {
  enum class Kind { Result, UpdateArg, UpdateState, Grad } kind;
  int32_t index = -1;                // the result or argument
  std::weak_ptr<TensorImpl> tensor;  // the updated tensor, or the leaf whose gradient it is
};

struct Variant {
  std::vector<ir::TensorType> arg_types;
  std::shared_ptr<Executable> exe;
  std::vector<Binding> bindings;
  std::vector<Sink> sinks;
  std::vector<int32_t> offers;
  size_t results = 0;
  // Run-time scratch, sized at trace time.
  std::vector<Tensor> result_tensors;  // the step's own output handles
  std::vector<const std::shared_ptr<Buffer>*> params;  // per binding, the buffer it holds
  std::vector<std::shared_ptr<Buffer>> outs;
  std::vector<ImplPtr> holds, sink_holds;               // the state tensors in use
  std::vector<const void*> param_ptrs;
  std::vector<void*> out_ptrs;
  std::vector<size_t> out_bytes;  // per output
};

}  // namespace

struct CompiledStep::State {
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
  CompileStepOptions options;
  std::vector<std::unique_ptr<Variant>> variants;
  int traces = 0;
  std::mutex mu;
};

namespace {

std::string types_str(const std::vector<Tensor>& args) {
  std::string s;
  for (size_t i = 0; i < args.size(); ++i)
    s += (i ? ", " : "") + std::string(dtype_name(args[i].dtype())) + shape_str(args[i].shape());
  return s;
}

bool matches(const Variant& v, const std::vector<Tensor>& args) {
  if (args.size() != v.arg_types.size()) return false;
  for (size_t i = 0; i < args.size(); ++i)
    if (!args[i].defined() || args[i].dtype() != v.arg_types[i].dtype || args[i].shape() != v.arg_types[i].shape)
      return false;
  for (const Binding& b : v.bindings)
    if (b.kind == Binding::Kind::State && b.state.expired()) return false;
  for (const Sink& s : v.sinks)
    if ((s.kind == Sink::Kind::UpdateState || s.kind == Sink::Kind::Grad) && s.tensor.expired()) return false;
  return true;
}

std::unique_ptr<Variant> trace_step(CompiledStep::State& st, const std::vector<Tensor>& args) {
  for (size_t i = 0; i < args.size(); ++i) LAZYRT_CHECK(args[i].defined(), "compile_step: argument ", i, " is undefined");
  // Arguments enter the trace as device data: a pending argument is computed first.
  std::vector<Tensor> pending;
  for (const Tensor& a : args)
    if (a.is_pending()) pending.push_back(a);
  if (!pending.empty()) sync(pending);

  auto v = std::make_unique<Variant>();
  for (const Tensor& a : args) v->arg_types.push_back({a.dtype(), a.shape()});
  trace::RebindJournal journal;
  try {
    std::vector<Tensor> results;
    {
      trace::SyncForbidden no_sync(
          "compile_step: the step reads a value or syncs (item, to_vector, mark_step, sync) while "
          "it is traced; a compiled step must stay lazy: return the value instead");
      static auto& trace_time = metrics::detail::timing_cell("TraceTime");
      detail::ScopedTimer timer(trace_time);
      results = st.fn(args);
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
      sinks.push_back({root_index(results[k].impl()), {Sink::Kind::Result, static_cast<int32_t>(k), {}}});
    }
    for (const auto& e : journal.entries()) {
      if (e.value_changed && e.tensor->is_pending()) {
        int32_t arg = -1;
        for (size_t i = 0; i < args.size(); ++i)
          if (args[i].impl() == e.tensor) arg = static_cast<int32_t>(i);
        Sink s = arg >= 0 ? Sink{Sink::Kind::UpdateArg, arg, {}} : Sink{Sink::Kind::UpdateState, -1, e.tensor};
        sinks.push_back({root_index(e.tensor), s});
      }
      if (e.grad_changed && e.tensor->grad && e.tensor->grad->is_pending())
        sinks.push_back({root_index(e.tensor->grad), {Sink::Kind::Grad, -1, e.tensor}});
    }
    trace::Extracted ex = trace::extract_graph(roots);
    // One graph output per sink, in sink order.
    std::vector<ir::ValueRef> root_outputs = ex.graph.outputs;
    ex.graph.outputs.clear();
    for (const auto& [root, sink] : sinks) {
      ex.graph.outputs.push_back(root_outputs[root]);
      v->sinks.push_back(sink);
    }
    v->results = results.size();
    for (size_t p = 0; p < ex.params.size(); ++p) {
      ImplPtr src = ex.param_tensors[p].lock();
      Binding b{Binding::Kind::Constant, -1, {}, ex.params[p]};
      for (size_t i = 0; src && i < args.size(); ++i)
        if (args[i].impl() == src) b = {Binding::Kind::Arg, static_cast<int32_t>(i), {}, nullptr};
      if (src && b.kind == Binding::Kind::Constant) b = {Binding::Kind::State, -1, src, nullptr};
      v->bindings.push_back(std::move(b));
    }
    // An update may be written into the buffer of the parameter holding its old value.
    v->offers.assign(v->sinks.size(), -1);
    for (size_t k = 0; k < v->sinks.size(); ++k) {
      const Sink& s = v->sinks[k];
      for (size_t p = 0; p < v->bindings.size(); ++p) {
        const Binding& b = v->bindings[p];
        if ((s.kind == Sink::Kind::UpdateArg && b.kind == Binding::Kind::Arg && b.arg == s.index) ||
            (s.kind == Sink::Kind::UpdateState && b.kind == Binding::Kind::State &&
             b.state.lock() == s.tensor.lock()))
          v->offers[k] = static_cast<int32_t>(p);
      }
    }
    GraphHash key = trace::cache_key(ex.graph, v->offers);
    v->exe = trace::executable_for(key, ex.graph, v->offers);
  } catch (...) {
    journal.undo();
    throw;
  }
  journal.undo();
  const size_t np = v->bindings.size(), no = v->sinks.size();
  v->params.resize(np);
  v->holds.resize(np);
  v->sink_holds.resize(no);
  v->param_ptrs.resize(np);
  v->outs.resize(no);
  v->out_ptrs.resize(no);
  for (const auto& t : v->exe->output_types()) v->out_bytes.push_back(t.bytes());
  for (size_t k = 0; k < v->results; ++k) {
    auto buf = runtime::allocate(v->exe->output_types()[k].bytes());
    v->result_tensors.push_back(Tensor(trace::make_data(v->exe->output_types()[k], buf)));
  }
  ++st.traces;
  return v;
}

// Sinks' current tensors (for buffer reuse) and where the new values go.
TensorImpl* sink_tensor(const Variant& v, const Sink& s, const std::vector<Tensor>& args, ImplPtr& hold) {
  switch (s.kind) {
    case Sink::Kind::Result: return v.result_tensors[s.index].impl().get();
    case Sink::Kind::UpdateArg: return args[s.index].impl().get();
    case Sink::Kind::UpdateState: hold = s.tensor.lock(); return hold.get();
    case Sink::Kind::Grad: {
      hold = s.tensor.lock();
      return hold && hold->grad ? hold->grad.get() : nullptr;
    }
  }
  return nullptr;
}

// The tensors the run reads and writes are held (v.holds, v.sink_holds) from binding to
// write-back, so their buffers stay alive and parameters are bound by pointer, without a
// reference count per buffer.
void replay(Variant& v, const std::vector<Tensor>& args) {
  Executable& exe = *v.exe;
  // Bind: every parameter must be device data; a pending one (a state loaded with
  // load_state_dict, say) is computed first, off the hot path.
  for (size_t p = 0; p < v.bindings.size(); ++p) {
    const Binding& b = v.bindings[p];
    TensorImpl* t = nullptr;
    if (b.kind == Binding::Kind::Arg) {
      t = args[b.arg].impl().get();
    } else if (b.kind == Binding::Kind::State) {
      v.holds[p] = b.state.lock();
      t = v.holds[p].get();
    }
    if (t) {
      if (t->is_pending()) trace::sync_tensors({t->shared_from_this()});
      t->release_leaf();
      v.params[p] = &t->data();
    } else {
      v.params[p] = &b.constant;
    }
    v.param_ptrs[p] = (*v.params[p])->data();
  }
  for (size_t k = 0; k < v.sinks.size(); ++k) {
    v.out_ptrs[k] = nullptr;
    if (exe.outputs()[k].kind != OutputSource::Kind::Computed) continue;
    TensorImpl* t = sink_tensor(v, v.sinks[k], args, v.sink_holds[k]);
    if (t) t->release_leaf();
    const std::shared_ptr<Buffer>& current = t && !t->is_pending() ? t->data() : kNoBuffer;
    v.outs[k] = output_buffer(v.out_bytes[k], current, 1);
    v.out_ptrs[k] = v.outs[k]->data();
  }
  {
    static auto& execute_time = metrics::detail::timing_cell("ExecuteTime");
    detail::ScopedTimer timer(execute_time);
    exe.run(v.param_ptrs.data(), v.out_ptrs.data());
  }
  static auto& replay_graph = metrics::detail::counter_cell("ReplayGraph");
  replay_graph.add(1);
  // Outputs the executable did not compute, before any write-back changes a parameter's buffer.
  auto param_at = [&v](int32_t p) -> const std::shared_ptr<Buffer>& { return *v.params[p]; };
  for (size_t k = 0; k < v.sinks.size(); ++k)
    if (exe.outputs()[k].kind != OutputSource::Kind::Computed) v.outs[k] = resolve_output(exe, k, param_at, v.outs);
  for (size_t k = 0; k < v.sinks.size(); ++k) {
    const std::shared_ptr<Buffer>& b = v.outs[k];
    // Replays mostly write back into the buffer the tensor already holds: no copy then.
    auto write_back = [&b](TensorImpl& t) {
      if (t.is_pending() || t.data() != b) t.set_data(b);
    };
    const Sink& s = v.sinks[k];
    ImplPtr& held = v.sink_holds[k];
    if (!held && (s.kind == Sink::Kind::UpdateState || s.kind == Sink::Kind::Grad)) held = s.tensor.lock();
    switch (s.kind) {
      case Sink::Kind::Result: write_back(*v.result_tensors[s.index].impl()); break;
      case Sink::Kind::UpdateArg: write_back(*args[s.index].impl()); break;
      case Sink::Kind::UpdateState:
        if (held) write_back(*held);
        break;
      case Sink::Kind::Grad:
        if (held) {
          if (held->grad && !held->grad->grad_fn) write_back(*held->grad);
          else held->set_grad_impl(trace::make_data(exe.output_types()[k], b));
        }
        break;
    }
  }
  for (auto& o : v.outs) o = nullptr;
  for (auto& h : v.sink_holds) h = nullptr;
  for (auto& h : v.holds) h = nullptr;
}

}  // namespace

CompiledStep::CompiledStep(std::shared_ptr<State> state) : state_(std::move(state)) {}

const std::vector<Tensor>& CompiledStep::run(const std::vector<Tensor>& args) {
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu);
  Variant* v = nullptr;
  for (auto& cand : st.variants)
    if (matches(*cand, args)) {
      v = cand.get();
      break;
    }
  if (!v) {
    const Variant& first = *st.variants.front();
    std::vector<Tensor> traced;
    LAZYRT_CHECK(st.options.retrace_on_guard_failure, "compile_step: the call does not match the trace: ",
                 args.size(), " arguments (", types_str(args), "), traced with ", first.arg_types.size(),
                 " arguments, or a captured tensor no longer exists; retracing is off");
    for (size_t i = 0; i < args.size(); ++i) LAZYRT_CHECK(args[i].defined(), "compile_step: argument ", i, " is undefined");
    // Captured state that no longer exists makes a variant useless; drop those.
    std::erase_if(st.variants, [&](const auto& cand) {
      for (const Binding& b : cand->bindings)
        if (b.kind == Binding::Kind::State && b.state.expired()) return true;
      return false;
    });
    st.variants.push_back(trace_step(st, args));
    v = st.variants.back().get();
  }
  replay(*v, args);
  return v->result_tensors;
}

std::vector<Tensor> CompiledStep::operator()(const std::vector<Tensor>& args) {
  const std::vector<Tensor>& outs = run(args);
  std::vector<Tensor> copies;
  copies.reserve(outs.size());
  for (const Tensor& t : outs) copies.push_back(t.detach());
  return copies;
}

int CompiledStep::traces() const { return state_->traces; }

CompiledStep compile_step(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                          const std::vector<Tensor>& example_args, CompileStepOptions options) {
  LAZYRT_CHECK(static_cast<bool>(fn), "compile_step: the step function is empty");
  auto st = std::make_shared<CompiledStep::State>();
  st->fn = std::move(fn);
  st->options = options;
  st->variants.push_back(trace_step(*st, example_args));
  return CompiledStep(std::move(st));
}

}  // namespace lazyrt
