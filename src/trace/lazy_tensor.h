// The state behind a Tensor handle, and the pending IR that tensors point into.
//
// Pending IR is a DAG of LazyNodes owned through shared_ptr: a tensor owns its value's node,
// a node owns its operands. Nothing is global, so an op that throws halfway leaves nothing
// behind: its temporaries die with it. At a sync the DAG reachable from the synced tensors is
// flattened into an ir::Graph (extract.cpp).
//
// Materialized tensors enter the DAG through parameter leaves: a leaf holds the tensor's buffer
// (not the tensor), so rebinding the tensor later never changes a graph already traced.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "compile/polymorphic.h"
#include "ir/graph.h"
#include "lazyrt/tensor.h"
#include "runtime/buffer.h"
#include "runtime/executable.h"

namespace lazyrt::autograd {
struct GradNode;
}

namespace lazyrt::trace {

struct LazyNode;
struct TensorImpl;

// Dims marked dynamic (bit d for dim d): by mark_dynamic (hard: a graph that cannot keep the
// dim dynamic refuses, and compiles as traced) or maybe_mark_dynamic (soft: the dim gives way
// where it meets a static one). A sync's results carry soft marks on the dims that derive
// from marked ones.
struct DynamicMarks {
  uint64_t hard = 0, soft = 0;
  bool any() const { return (hard | soft) != 0; }
  DynamicMarks& operator|=(const DynamicMarks& o) {
    hard |= o.hard;
    soft |= o.soft;
    return *this;
  }
};

struct LazyValue {
  std::shared_ptr<LazyNode> node;
  int32_t index = 0;
  explicit operator bool() const { return node != nullptr; }
  const ir::TensorType& type() const;
};

struct LazyNode {
  LazyNode() = default;
  LazyNode(const LazyNode&) = delete;
  LazyNode& operator=(const LazyNode&) = delete;
  ~LazyNode();

  ir::OpKind op = ir::OpKind::Parameter;
  std::vector<LazyValue> operands;
  ir::Attrs attrs;
  std::vector<ir::TensorType> types;
  std::vector<std::shared_ptr<const ir::Graph>> regions;  // while: cond, body
  // The trace scope the node was recorded in: 0 at top level, a loop's scope inside its body.
  int64_t scope = 0;
  // Parameter leaves only: the device data and the id of the tensor it was taken from; or,
  // for a loop placeholder (no data), which carry it stands for.
  std::shared_ptr<runtime::Buffer> data;
  int64_t source_tensor = -1;
  std::weak_ptr<TensorImpl> source;
  // The tensor `source` was detached from, sharing its buffer (see TensorImpl::detached_from).
  std::weak_ptr<TensorImpl> also;
  int64_t also_tensor = -1;
  int32_t placeholder = -1;
  // Parameter leaves only: the tensor's dims marked dynamic when the leaf was made.
  DynamicMarks dynamic;
  // A scalar constant from the thread's cache (scalar_constant): one node read by many graphs,
  // so sharing it says nothing about two graphs sharing work.
  bool shared = false;
};

inline const ir::TensorType& LazyValue::type() const { return node->types[index]; }

// View semantics, by functionalization (ops/views.h): a view holds a value of its own, derived
// from its base's by a chain of view steps. A write to a view is turned into a new value of the
// base (each step's inverse scatters the new value back), and every new value of a base
// re-derives its live views; graphs stay pure, no buffer is ever shared for writing.
struct TensorImpl;
struct ViewStep {
  enum class Kind : uint8_t { Reshape, Permute, Expand, Slice, Detach, Take };
  Kind kind;
  Shape in;                      // the shape the step reads
  std::vector<int64_t> a, b, c;  // Reshape, Expand: a = shape; Permute: a = dims;
                                 // Slice: a = starts, b = ends, c = steps;
                                 // Take: a = {dim, 1 if the dim is dropped (a select) else 0}
  // Take: the positions along dim, an i64 vector of its own (their values when the view was
  // made), read when the graph runs: select or narrow at a tensor position, as at a loop's
  // counter in its body.
  std::shared_ptr<TensorImpl> index;
};
struct ViewOf {
  std::weak_ptr<TensorImpl> base;  // never a view itself
  // Set when the base died while more than one of its views lived: a stand-in for the base
  // that those views keep alive, so that they still see each other's writes.
  std::shared_ptr<TensorImpl> kept_base;
  std::vector<ViewStep> steps;  // from the base's value to this tensor's
  bool detached = false;        // a detach() on the way: writes keep the base's autograd history
  bool grad = false;            // made where gradients were recorded: re-derivations record them
  std::shared_ptr<TensorImpl> root() const { return kept_base ? kept_base : base.lock(); }
};

struct TensorImpl : std::enable_shared_from_this<TensorImpl> {
  explicit TensorImpl(ir::TensorType type);
  TensorImpl(ir::TensorType type, int64_t scope);
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  const int64_t id;
  const int64_t scope;  // the trace scope the tensor was made in
  ir::TensorType type;
  // Autograd: a leaf that requires grad has no grad_fn; a result of a recorded op has one.
  bool requires_grad = false;
  std::shared_ptr<autograd::GradNode> grad_fn;
  std::shared_ptr<TensorImpl> grad;
  // A value autograd saved for backward (not a tensor the user holds). Atomic: syncs on
  // other threads read it (sync_for_read).
  std::atomic<bool> saved_for_backward{false};
  // State every thread may change (the random generator's seed and offset): every change of
  // its value, a sync's or a replay's included, takes this lock.
  std::recursive_mutex* shared_state = nullptr;
  // For a data tensor made by detach(): the tensor whose buffer it shares (held weakly). A
  // graph reading the buffer reads that tensor's value too, and replays must know it.
  std::weak_ptr<TensorImpl> detached_from;
  // Dims whose size may change from one graph to the next: a graph reading the tensor's data
  // is compiled for every size of their bucket at once (compile/polymorphic.h).
  DynamicMarks dynamic;

  // PyTorch's layout of the elements, which decides what reshape() and view() can alias:
  // strides and offset in the base's elements; empty strides for a contiguous tensor.
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  // Views only: where the value comes from (ops/views.h).
  std::unique_ptr<ViewOf> view_of;
  // Bases only: their views (those that died are pruned now and then).
  std::vector<std::weak_ptr<TensorImpl>> views;

  bool is_pending() const { return static_cast<bool>(ir); }
  /// The tensor's value in the IR: its pending value, or a parameter leaf for its data.
  LazyValue value();
  /// Rebinds to a pending value (in-place ops): drops the data.
  void set_ir(LazyValue v);
  /// Materializes: drops the pending value.
  void set_data(std::shared_ptr<runtime::Buffer> buffer);
  const std::shared_ptr<runtime::Buffer>& data() const { return data_; }
  const LazyValue& pending() const { return ir; }
  /// The node of the first pending value the tensor held since it last held data (held
  /// weakly): a graph reading it computes this tensor's value from an earlier pending one.
  std::shared_ptr<LazyNode> origin() const { return origin_.lock(); }
  /// Whether the tensor held data before its pending value (an in-place update of state),
  /// rather than being made pending.
  bool pending_from_data() const { return from_data_; }
  /// Whether its gradient is another tensor (or none instead of one, or one instead of none)
  /// than at the last mark_step().
  bool grad_changed_since_mark_step() const;
  /// The values that may end the tensor's making since it last held data, earliest first: its
  /// origin, then each pending value that replaced the one before whole (copy_, zero_, fill_:
  /// an initialisation or a load), the first few of them. The low-level replay calls compute
  /// the one the step reads once (state made before the step).
  std::vector<std::shared_ptr<LazyNode>> making() const;
  /// The pending value was replaced whole (copy_, zero_, fill_), not derived in place.
  void value_replaced();
  /// Makes `value`, one of making()'s (computed into `buffer`), data: its node becomes a
  /// parameter leaf of that buffer, so every graph reading it reads the data, and the tensor
  /// counts as state updated in place since it held data (or, where it is still the tensor's
  /// value, holds the data).
  void take_computed(const std::shared_ptr<LazyNode>& value, std::shared_ptr<runtime::Buffer> buffer);
  /// Puts back a value saved by a RebindJournal (data, or pending IR).
  void restore_value(std::shared_ptr<runtime::Buffer> data, LazyValue value);
  /// Drops the cached parameter leaf, so the data buffer's owners are the tensor and whatever
  /// else really holds it (replays write into a buffer only its tensor owns).
  void release_leaf() {
    if (!ir) leaf_ = {};
  }
  /// Replaces the gradient, journaling the old one when a RebindJournal is active.
  void set_grad_impl(std::shared_ptr<TensorImpl> g);

 private:
  std::shared_ptr<runtime::Buffer> data_;
  LazyValue ir;
  LazyValue leaf_;  // cached parameter leaf for data_
  std::weak_ptr<LazyNode> origin_;
  std::vector<std::weak_ptr<LazyNode>> replaced_;  // see making()
  bool from_data_ = false;
  // The gradient at the last mark_step(), noted at the first change after it.
  uint64_t grad_mark_ = 0;
  std::weak_ptr<TensorImpl> grad_at_mark_;
  bool had_grad_at_mark_ = false;
  // The registry of pending tensors (lazy_tensor.cpp) is a list through the tensors
  // themselves: entering and leaving it allocates nothing. Guarded by the registry's lock.
  friend struct PendingRegistry;
  TensorImpl* pending_prev_ = nullptr;
  TensorImpl* pending_next_ = nullptr;
  bool registered_ = false;
  // The thread that gave the tensor its pending value (this_thread_tag()): mark_step() and a
  // read's joining of other pending tensors take the calling thread's only.
  uint32_t pending_thread_ = 0;
};

/// The runtime's way between a public Tensor handle and its state (the public header keeps
/// TensorImpl opaque).
struct TensorAccess {
  static const std::shared_ptr<TensorImpl>& impl(const Tensor& t) { return t.impl_; }
  static Tensor wrap(std::shared_ptr<TensorImpl> impl) { return Tensor(std::move(impl)); }
};
inline const std::shared_ptr<TensorImpl>& impl_of(const Tensor& t) { return TensorAccess::impl(t); }
inline Tensor tensor_of(std::shared_ptr<TensorImpl> impl) { return TensorAccess::wrap(std::move(impl)); }

/// Numbers the calling thread's mark_step() calls: the low-level replay calls take what the
/// thread recorded since its last one as the traced step. Numbers are unique across threads.
uint64_t mark_step_count();
void count_mark_step();

/// Called wherever a tensor's gradient is read (Tensor::grad, autograd's accumulation), so a
/// RebindJournal can note which gradients a traced step depends on.
void note_grad_read(TensorImpl& t);

/// Trace scopes: while a loop body is traced, ops record into the loop's scope. The scope
/// stack is per thread.
int64_t current_scope();
bool scope_is_active(int64_t scope);
class TraceScope {
 public:
  /// in_place_error: what the refusal of an in-place update of a tensor from outside the scope
  /// says (by default a loop body's); kept by the caller while the scope lives.
  explicit TraceScope(const char* in_place_error = nullptr);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  int64_t id() const { return id_; }
  /// The tensors from outside that require grad and were read in this scope (it must be the
  /// innermost), in the order first read: a differentiable loop takes them as inputs.
  const std::vector<std::shared_ptr<TensorImpl>>& grad_captures() const;

 private:
  int64_t id_;
};

/// While alive (per thread), tensors are made at the top level, outside any loop scope being
/// traced: for state that lives on, such as the random generator's, made on first use.
class TopLevel {
 public:
  TopLevel();
  ~TopLevel();
  TopLevel(const TopLevel&) = delete;
  TopLevel& operator=(const TopLevel&) = delete;
};

/// Notes that `t`, which requires grad, is read in the active scopes nested inside its own.
void note_grad_capture(const std::shared_ptr<TensorImpl>& t);

/// While active (per thread), records the first change of value or gradient of every tensor
/// that existed before it, with what it held, so that a trace can be undone: compile_step
/// traces a step without running it and then puts everything back.
class RebindJournal {
 public:
  struct Entry {
    std::shared_ptr<TensorImpl> tensor;
    bool value_changed = false;
    std::shared_ptr<runtime::Buffer> data;  // the value before
    LazyValue ir;
    std::shared_ptr<autograd::GradNode> grad_fn;
    bool requires_grad = false;
    bool grad_changed = false;
    std::shared_ptr<TensorImpl> grad;  // the gradient before
    // The traced code read the gradient before changing it: what it computes depends on
    // which gradient tensor (or none) the tensor had.
    bool grad_read = false;
  };
  RebindJournal();
  ~RebindJournal();
  RebindJournal(const RebindJournal&) = delete;
  RebindJournal& operator=(const RebindJournal&) = delete;

  const std::vector<Entry>& entries() const { return entries_; }
  /// Whether `t` existed before the journal started. State every thread shares (the random
  /// generator's seed and offset) counts as existing before every journal, even where it was
  /// made on first use inside the traced code: it outlives the trace, so the trace's changes
  /// of it are updates to undo and to replay, not values of the step's own.
  bool existed_before(const TensorImpl& t) const;
  /// Restores every journaled tensor's value, autograd state and gradient.
  void undo();
  /// The tensors from before the journal that were still pending when the traced code read or
  /// changed them: values another thread recorded and did not sync (mark_step() syncs the
  /// calling thread's), which a trace would compute again instead of reading.
  const std::vector<std::shared_ptr<TensorImpl>>& pending_before() const { return pending_before_; }

  // Hooks called by TensorImpl.
  void pending_reading(TensorImpl& t);
  void value_changing(TensorImpl& t);
  void grad_changing(TensorImpl& t);
  void grad_reading(TensorImpl& t);

 private:
  Entry& entry(TensorImpl& t);
  int64_t first_new_id_;
  RebindJournal* previous_;
  std::vector<Entry> entries_;
  std::vector<std::shared_ptr<TensorImpl>> pending_before_;
};

/// Records `op` over these operands: infers result types (throwing lazyrt::Error on bad
/// operands before anything is built) and returns result 0 of the new node.
LazyValue record(ir::OpKind op, std::vector<LazyValue> operands, ir::Attrs attrs = {});
/// A scalar (or shaped) constant of the graph.
LazyValue constant(double value, DType dtype, Shape shape = {});
/// A scalar constant for an operand (never a tensor's own value): outside loop bodies, the same
/// node every time for the same value and dtype, from a small cache kept per thread. An
/// optimizer's numbers (beta1, 1 - beta1, eps, ...) are recorded and dropped every step
/// otherwise.
LazyValue scalar_constant(double value, DType dtype);

std::shared_ptr<TensorImpl> make_data(ir::TensorType type, std::shared_ptr<runtime::Buffer> data);
std::shared_ptr<TensorImpl> make_pending(LazyValue v);
/// A tensor standing for carry `index` of the loop being traced in the current scope.
std::shared_ptr<TensorImpl> make_placeholder(ir::TensorType type, int32_t index);

/// Every live tensor that holds pending IR at the top level and got it on the calling thread,
/// in creation order. Another thread's pending tensors are that thread's trace in progress:
/// syncing them would rebind tensors it is recording into (mark_step() runs beside other
/// threads' tracing and replays).
std::vector<std::shared_ptr<TensorImpl>> live_pending_tensors();
/// Calls fn with the same tensors as live_pending_tensors(), in creation order, under the
/// registry's lock. Every write of a registered tensor's value takes that lock, so their values
/// (pending()) stay as they are and their graphs valid to walk while fn runs. fn must not
/// record, rebind or sync anything, and must not keep the pointers (weak_from_this().lock()
/// one to keep it; it fails for a tensor being destroyed).
void with_live_pending(const std::function<void(const std::vector<TensorImpl*>&)>& fn);

/// Holds the shared_state lock of the first of these tensors that has one (there is one such
/// state), if any.
std::unique_lock<std::recursive_mutex> lock_shared_state(const std::vector<std::shared_ptr<TensorImpl>>& tensors);

/// The flattened pending graph of some pending tensors (one output per tensor, in order).
struct Extracted {
  ir::Graph graph;                                       // empty where only hashed
  GraphHash graph_hash;                                  // where only hashed: hash_graph(graph)
  std::vector<int32_t> donations;                        // per output, the parameter offered
  std::vector<std::shared_ptr<runtime::Buffer>> params;  // per parameter, its buffer
  std::vector<ir::TensorType> param_types;               // per parameter, its type
  std::vector<int32_t> param_nodes;                      // per parameter, its graph node
  std::vector<int64_t> param_sources;                    // per parameter, the tensor it came from
  std::vector<std::weak_ptr<TensorImpl>> param_tensors;  // per parameter, that tensor
  // Other tensors holding a parameter's buffer (a detached copy of a state tensor, say), as
  // (parameter, tensor). A parameter's tensor above is the oldest of them.
  std::vector<std::pair<int32_t, std::weak_ptr<TensorImpl>>> param_aliases;
  std::vector<DynamicMarks> param_dynamic;               // per parameter, its dims marked dynamic
};
/// The graph of the pending tensors, with its parameters and donations; with hash_only, all
/// of it but the graph, and graph_hash instead.
Extracted extract_graph(const std::vector<std::shared_ptr<TensorImpl>>& pending, bool hash_only = false);
/// The bucket graph of an extracted (built) graph whose parameters have dims marked dynamic
/// (compile/polymorphic.h); nullopt, with the reason in `why`, where there is none.
std::optional<compile::PolymorphicGraph> polymorphic_graph(const Extracted& ex, std::string* why);
/// Counts a graph that reads marked dims but was compiled as traced (PolymorphicRefused), and
/// keeps why for last_polymorphic_refusal.
void note_polymorphic_refusal(const std::string& why);
std::string last_polymorphic_refusal();
/// The pending tensors among `requested`, each once, in order.
std::vector<std::shared_ptr<TensorImpl>> pending_only(const std::vector<std::shared_ptr<TensorImpl>>& requested);
/// While alive (per thread), any sync throws lazyrt::Error with `reason`.
class SyncForbidden {
 public:
  explicit SyncForbidden(const char* reason);
  ~SyncForbidden();
  SyncForbidden(const SyncForbidden&) = delete;
  SyncForbidden& operator=(const SyncForbidden&) = delete;

 private:
  const char* previous_;
};

/// The graph sync would compile for these tensors (unoptimized); nothing is executed.
ir::Graph pending_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors);

/// Syncs these tensors as one graph (extract, hash, look up or compile, execute, bind).
void sync_tensors(const std::vector<std::shared_ptr<TensorImpl>>& tensors);

/// The sync behind reading a value (item, to_vector, numpy): these tensors, plus every live
/// pending tensor whose graph shares a computed node with theirs (a training step's parameter
/// and optimizer updates share the forward pass with its loss). A loop that reads the loss
/// every step without mark_step() so starts each step from device data: one graph, flat
/// memory, instead of a pending history that grows with every step.
void sync_for_read(const std::vector<std::shared_ptr<TensorImpl>>& tensors);

}  // namespace lazyrt::trace
