// Cached-graph replay: run a traced step's compiled graph again and again on new inputs,
// without tracing or hashing, with every tensor the step updates in place (parameters,
// optimizer state, the random generator's state, gradients) written back each time.
//
// The low-level calls mirror PyTorch/XLA's (_get_graph_hash, _xla_warm_up_cache,
// _get_tensors_xla_device_data_node, _run_cached_graph). Unlike those, the graph of some
// outputs always includes the in-place updates of the tensors it reads, so a replay can never
// silently return the same loss with stale weights.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lazyrt/tensor.h"

namespace lazyrt {

/// A process-unique id of a tensor (stable for the tensor's life, kept by in-place ops).
int64_t tensor_id(const Tensor& t);

/// Compiles and caches the graph of `outputs` (and of the in-place updates of what it reads),
/// under graph_hash(outputs). Nothing is executed; the tensors stay pending.
///
/// graph_hash, warm_up_cache and graph_inputs take what was recorded since the last
/// mark_step() as the traced step: the graph of the outputs and every tensor updated in place
/// since then (optimizer moments and step counts the outputs do not list, a counter set by
/// fill_ or copy_), all performed and written back by each replay. State made since then and
/// before the step (a model built or loaded, an input drawn, an optimizer's state made, with
/// no mark_step() in between) is computed once, by the first of these calls: the replays read
/// it as data, and never make it again. They throw lazyrt::Error for a step they could not
/// replay exactly: one that changes the gradient of a tensor the graph reads (gradients made
/// by the step and left set: use compile_step, or zero_grad(set_to_none) at its end), or
/// reads an earlier value of pending state that cannot be computed apart from the step.
void warm_up_cache(const std::vector<Tensor>& outputs);

struct GraphInputs {
  std::vector<int64_t> tensor_ids;
  std::vector<Tensor> values;
};
/// The parameter leaves of that graph, in parameter order. A leaf whose tensor the traced code
/// updated in place is returned as that same tensor, holding its value from before the trace
/// again (the pending update is dropped: replays perform it).
GraphInputs graph_inputs(const std::vector<Tensor>& outputs);

/// Runs the graph warmed up under `hash` once on the inputs' current values (in the order of
/// graph_inputs). Every input the traced code updated in place gets its new value (written
/// into its own buffer when nothing else holds that buffer), and so does every other tensor
/// the step set in place. Returns one result per tensor given to warm_up_cache, in that order
/// (one the step does not compute is returned as it is), then the step's other in-place
/// updates; an updated tensor is returned as that tensor. Throws lazyrt::Error for an unknown
/// hash or inputs of the wrong number, shapes or dtypes, changing nothing.
std::vector<Tensor> run_cached_graph(const GraphHash& hash, const std::vector<Tensor>& inputs);

/// A step function traced once and replayed. Calling it binds the arguments, runs the
/// compiled graph, writes back every tensor the step updates in place (and gradients it
/// leaves, or clears), and returns the step's outputs.
///
/// Tracing starts with mark_step(): whatever is pending (fresh modules, load_state_dict, edits)
/// is computed first, so the step's graph reads all earlier state as inputs. Guards run before
/// every call: the arguments' number, shapes, dtypes, requires_grad and aliasing; that every
/// captured tensor still exists, with the same requires_grad; that every gradient the step
/// read before changing it is the same tensor (or still none); the grad and autocast modes;
/// that no module or optimizer setting changed (invalidate_compiled_steps); and the front end's
/// guard of its host program (CompileStepOptions::host_guard). A failed guard
/// retraces (by default) or throws; a replay never runs stale. The gradient of an argument
/// that requires grad flows on from the argument after each call, as backward would take it.
/// Tensors the step creates from host data, and scalars in its ops, are constants of the
/// trace: pass values that change between calls as arguments.
class CompiledStep {
 public:
  struct State;
  explicit CompiledStep(std::shared_ptr<State> state);

  /// One step; the returned tensors are the caller's to keep.
  std::vector<Tensor> operator()(const std::vector<Tensor>& args);
  /// One step, allocating nothing when the shapes match the trace: the returned tensors are
  /// the step's own output handles, rebound to new values by the next call. The vector itself
  /// may go with its variant at the next call (copy the handles to keep them).
  const std::vector<Tensor>& run(const std::vector<Tensor>& args);
  /// How many times the step was traced (1 unless guards forced retraces).
  int traces() const;

  /// The compiled variants held now (one per argument signature and guard state met), and
  /// the bytes they are estimated to hold (executables' arenas and constants, output buffers).
  size_t variants() const;
  uint64_t variant_bytes() const;
  /// The caps on variants (CompileStepOptions); lowering one evicts at once. Throws
  /// lazyrt::Error for max_variants 0, changing nothing.
  void set_max_variants(size_t max_variants);
  size_t max_variants() const;
  void set_max_variant_bytes(uint64_t bytes);
  uint64_t max_variant_bytes() const;

 private:
  std::shared_ptr<State> state_;
};

/// A compiled step keeps one compiled variant (the traced graph, its executable, its buffers)
/// per argument signature it is called with. Beyond either cap the least recently used
/// variants are evicted (counted as CompiledStepVariantEvictions); a call that needs an
/// evicted variant again traces it again, as for any new signature. The variant in use is
/// never evicted, even when it alone is over the byte cap.
inline constexpr size_t kDefaultMaxVariants = 64;
inline constexpr uint64_t kDefaultMaxVariantBytes = uint64_t{8} << 30;  // 8 GiB

/// What a step's front end checks of its host program besides what a trace sees (the Python
/// values a Python step function reads: a global learning rate, a closure's loss weight, the
/// function it calls). Made when a variant is traced, checked before the variant is replayed;
/// a variant whose guard fails is not replayed (the call retraces or throws, as for any guard).
class HostGuard {
 public:
  virtual ~HostGuard() = default;
  virtual bool holds() const = 0;
};

struct CompileStepOptions {
  bool retrace_on_guard_failure = true;  // false: a failed guard throws lazyrt::Error
  size_t max_variants = kDefaultMaxVariants;  // at least 1
  uint64_t max_variant_bytes = kDefaultMaxVariantBytes;  // 0: no byte cap
  /// Called right after each trace, from the tracing thread; null or a null result: no guard.
  std::function<std::shared_ptr<const HostGuard>()> host_guard;
};

/// Makes every compiled step retrace on its next call (and run_cached_graph refuse graphs
/// warmed up before). A traced step bakes in what it read besides tensor values; modules call
/// this when their train/eval mode changes or (from Python) an attribute is replaced or
/// deleted, and optimizers when created and when a hyperparameter other than the learning rate
/// changes. Call it after changing any other such value a step reads.
void invalidate_compiled_steps();

/// Traces fn(example_args) once, without running it, and leaves every tensor as it was.
/// Throws lazyrt::Error for options.max_variants 0.
CompiledStep compile_step(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                          const std::vector<Tensor>& example_args,
                          CompileStepOptions options = {});

}  // namespace lazyrt
