#include "trace/lazy_tensor.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>

#include "util/check.h"
#include "util/pool.h"
#include "util/spin_lock.h"

namespace lazyrt::trace {
namespace {

std::atomic<int64_t> next_id{1};
std::atomic<int64_t> next_scope{1};
thread_local std::vector<int64_t> scope_stack;
// Per active scope: what its refusal of an in-place update of an outside tensor says (nullptr:
// a loop body's).
thread_local std::vector<const char*> scope_in_place_errors;
// Per active scope: the tensors from outside it that require grad and were read in it.
thread_local std::vector<std::vector<std::shared_ptr<TensorImpl>>> scope_grad_captures;
thread_local RebindJournal* active_journal = nullptr;

// How many scope stack entries and journals all threads hold. While none, the per-thread state
// is not read at all: that takes a call into the thread-local storage of a shared library on
// every op. A thread's own entries are always counted here before it reads them.
std::atomic<int64_t> scope_entries{0};
std::atomic<int64_t> journals{0};

RebindJournal* journal() {
  return journals.load(std::memory_order_relaxed) == 0 ? nullptr : active_journal;
}

// A number per thread, never 0 and never reused while the process lives (2^32 threads).
std::atomic<uint32_t> next_thread_tag{1};
uint32_t this_thread_tag() {
  thread_local constinit uint32_t tag = 0;
  if (tag == 0) [[unlikely]]
    tag = next_thread_tag.fetch_add(1, std::memory_order_relaxed);
  return tag;
}

}  // namespace

// Pending tensors, for mark_step. Tensors enter when they get IR and leave when they are
// materialized or destroyed: a doubly linked list through the tensors (no allocation per
// op), under `mu`.
struct PendingRegistry {
  util::SpinLock mu;
  TensorImpl* head = nullptr;
  size_t size = 0;

  void insert(TensorImpl* t) {
    if (t->registered_) return;
    t->registered_ = true;
    t->pending_prev_ = nullptr;
    t->pending_next_ = head;
    if (head) head->pending_prev_ = t;
    head = t;
    ++size;
  }
  void erase(TensorImpl* t) {
    if (!t->registered_) return;
    t->registered_ = false;
    (t->pending_prev_ ? t->pending_prev_->pending_next_ : head) = t->pending_next_;
    if (t->pending_next_) t->pending_next_->pending_prev_ = t->pending_prev_;
    t->pending_prev_ = t->pending_next_ = nullptr;
    --size;
  }
  // The registered tensors that got their pending value on thread `thread`.
  template <class F>
  void for_each_of(uint32_t thread, F&& f) const {
    for (TensorImpl* t = head; t; t = t->pending_next_)
      if (t->pending_thread_ == thread) f(t);
  }
};

namespace {

PendingRegistry& pending_registry() {
  static PendingRegistry* r = new PendingRegistry();
  return *r;
}

}  // namespace

int64_t current_scope() {
  if (scope_entries.load(std::memory_order_relaxed) == 0) return 0;
  return scope_stack.empty() ? 0 : scope_stack.back();
}

bool scope_is_active(int64_t scope) {
  if (scope == 0) return true;
  if (scope_entries.load(std::memory_order_relaxed) == 0) return false;
  for (int64_t s : scope_stack)
    if (s == scope) return true;
  return false;
}

TraceScope::TraceScope(const char* in_place_error) : id_(next_scope++) {
  scope_stack.push_back(id_);
  scope_in_place_errors.push_back(in_place_error);
  scope_grad_captures.emplace_back();
  scope_entries.fetch_add(1, std::memory_order_relaxed);
}
TraceScope::~TraceScope() {
  scope_entries.fetch_sub(1, std::memory_order_relaxed);
  scope_stack.pop_back();
  scope_in_place_errors.pop_back();
  scope_grad_captures.pop_back();
}

TopLevel::TopLevel() {
  scope_stack.push_back(0);
  scope_in_place_errors.push_back(nullptr);
  scope_grad_captures.emplace_back();
  scope_entries.fetch_add(1, std::memory_order_relaxed);
}
TopLevel::~TopLevel() {
  scope_entries.fetch_sub(1, std::memory_order_relaxed);
  scope_stack.pop_back();
  scope_in_place_errors.pop_back();
  scope_grad_captures.pop_back();
}

const std::vector<std::shared_ptr<TensorImpl>>& TraceScope::grad_captures() const {
  return scope_grad_captures.back();
}

void note_grad_capture(const std::shared_ptr<TensorImpl>& t) {
  // Every scope nested inside the one the tensor was made in reads it from outside.
  for (size_t i = scope_stack.size(); i-- > 0 && scope_stack[i] != t->scope;) {
    auto& list = scope_grad_captures[i];
    if (std::find(list.begin(), list.end(), t) == list.end()) list.push_back(t);
  }
}

// A dropped node's operands are dropped after it, one node at a time (DeferredDrop: an
// unrolled loop's chain would overflow the stack); its vectors, its result types' shapes too,
// keep their capacity for the next ops recorded on this thread.
LazyNode::~LazyNode() {
  util::DeferredDrop<LazyNode>::Scope scope;
  for (LazyValue& v : operands) scope.defer(v.node);
  util::VectorStash<std::vector<LazyValue>>::give(std::move(operands));
  for (ir::TensorType& t : types) util::VectorStash<Shape>::give(std::move(t.shape));
  util::VectorStash<std::vector<ir::TensorType>>::give(std::move(types));
}

namespace {

// A copy of a type whose shape goes into a vector that kept its capacity (VectorStash).
ir::TensorType stashed_copy(const ir::TensorType& of) { return {of.dtype, ir::stashed_shape(of.shape)}; }

}  // namespace

TensorImpl::TensorImpl(ir::TensorType t) : id(next_id++), scope(current_scope()), type(std::move(t)) {}
TensorImpl::TensorImpl(ir::TensorType t, int64_t s) : id(next_id++), scope(s), type(std::move(t)) {}

TensorImpl::~TensorImpl() {
  if (ir) {
    auto& r = pending_registry();
    std::lock_guard<util::SpinLock> lock(r.mu);
    r.erase(this);
  }
  // The shape's vector keeps its capacity for the next tensor made on this thread (VectorStash),
  // once the rest of this destructor is done with it.
  struct GiveShape {
    Shape& shape;
    ~GiveShape() { util::VectorStash<Shape>::give(std::move(shape)); }
  } give_shape{type.shape};
  // A base that dies leaves its views. One alone is a tensor of its own from now on; several
  // still alias each other, so a stand-in with the base's value and history takes its place.
  if (views.empty()) return;
  std::vector<std::shared_ptr<TensorImpl>> live;
  for (const auto& w : views)
    if (auto v = w.lock(); v && v->view_of) live.push_back(std::move(v));
  if (live.size() == 1) live[0]->view_of.reset();
  if (live.size() < 2) return;
  auto stand_in = util::make_pooled<TensorImpl>(type, scope);
  stand_in->requires_grad = requires_grad;
  stand_in->grad_fn = grad_fn;
  if (ir) {
    stand_in->ir = ir;
    stand_in->origin_ = ir.node;
    auto& r = pending_registry();
    std::lock_guard<util::SpinLock> lock(r.mu);
    stand_in->pending_thread_ = pending_thread_;
    r.insert(stand_in.get());
  } else {
    stand_in->data_ = data_;
  }
  for (auto& v : live) {
    v->view_of->base = stand_in;
    v->view_of->kept_base = stand_in;
    stand_in->views.push_back(v);
  }
}

LazyValue TensorImpl::value() {
  if (ir) {
    if (RebindJournal* j = journal()) j->pending_reading(*this);
    return ir;
  }
  if (!leaf_) {
    LAZYRT_ASSERT(data_, "tensor ", id, " holds neither data nor IR");
    auto n = util::make_pooled<LazyNode>();
    n->op = ir::OpKind::Parameter;
    n->types = ir::single_result(stashed_copy(type));
    n->data = data_;
    n->source_tensor = id;
    n->source = weak_from_this();
    n->dynamic = dynamic;
    if (auto origin = detached_from.lock(); origin && origin->data_ == data_) {
      n->also = origin;
      n->also_tensor = origin->id;
    }
    leaf_ = {std::move(n), 0};
  }
  return leaf_;
}

void TensorImpl::set_ir(LazyValue v) {
  if (scope != current_scope()) {
    const char* custom = scope_in_place_errors.empty() ? nullptr : scope_in_place_errors.back();
    if (custom) throw Error(detail::str_cat(custom, " (", ir::type_str(type), ")"));
    throw Error(detail::str_cat("while_loop: the loop body modifies a tensor from outside the loop in place (",
                                ir::type_str(type), "); return the new value as part of the carry instead"));
  }
  if (RebindJournal* j = journal()) j->value_changing(*this);
  LAZYRT_ASSERT(v.type() == type, "rebinding tensor ", id, " of ", ir::type_str(type), " to ",
                ir::type_str(v.type()));
  LazyValue old;  // dropped after the lock: the graph it ends may free buffers
  const uint32_t thread = this_thread_tag();
  {
    // Under the registry's lock: other threads read registered tensors' values (see
    // with_live_pending).
    auto& r = pending_registry();
    std::lock_guard<util::SpinLock> lock(r.mu);
    pending_thread_ = thread;
    if (!ir) {
      r.insert(this);
      origin_ = v.node;
      from_data_ = data_ != nullptr;
      replaced_.clear();
    }
    old = std::exchange(ir, std::move(v));
  }
  data_.reset();
  leaf_ = {};
}

void TensorImpl::set_data(std::shared_ptr<runtime::Buffer> buffer) {
  if (!ir && buffer == data_) return;  // replays write back into the same buffer
  if (RebindJournal* j = journal()) j->value_changing(*this);
  LazyValue old;
  if (ir) {
    auto& r = pending_registry();
    std::lock_guard<util::SpinLock> lock(r.mu);
    r.erase(this);
    old = std::exchange(ir, {});
  }
  leaf_ = {};
  data_ = std::move(buffer);
}

std::vector<std::shared_ptr<LazyNode>> TensorImpl::making() const {
  auto& r = pending_registry();
  std::lock_guard<util::SpinLock> lock(r.mu);
  std::vector<std::shared_ptr<LazyNode>> out;
  if (auto o = origin_.lock()) out.push_back(std::move(o));
  for (const auto& w : replaced_)
    if (auto n = w.lock()) out.push_back(std::move(n));
  return out;
}

void TensorImpl::value_replaced() {
  constexpr size_t kKept = 8;  // an initialisation replaces a value once or twice
  if (!ir || from_data_ || view_of) return;
  auto& r = pending_registry();
  std::lock_guard<util::SpinLock> lock(r.mu);
  if (replaced_.size() < kKept) replaced_.push_back(ir.node);
}

void TensorImpl::take_computed(const std::shared_ptr<LazyNode>& o, std::shared_ptr<runtime::Buffer> buffer) {
  LAZYRT_ASSERT(o && ir && o->types.size() == 1 && o->types[0] == type, "tensor ", id, ": no value to compute");
  o->op = ir::OpKind::Parameter;
  o->operands.clear();
  o->attrs = {};
  o->regions.clear();
  o->data = buffer;
  o->source_tensor = id;
  o->source = weak_from_this();
  o->dynamic = dynamic;
  if (ir.node == o) {
    set_data(std::move(buffer));
  } else {
    auto& r = pending_registry();
    std::lock_guard<util::SpinLock> lock(r.mu);
    from_data_ = true;
    replaced_.clear();
  }
}

void TensorImpl::restore_value(std::shared_ptr<runtime::Buffer> data, LazyValue value) {
  if (value) {
    LazyValue old;
    const uint32_t thread = this_thread_tag();
    {
      auto& r = pending_registry();
      std::lock_guard<util::SpinLock> lock(r.mu);
      pending_thread_ = thread;
      if (!ir) {
        r.insert(this);
        origin_ = value.node;
        replaced_.clear();
      }
      old = std::exchange(ir, std::move(value));
    }
    data_.reset();
    leaf_ = {};
  } else {
    RebindJournal* saved = active_journal;
    active_journal = nullptr;
    set_data(std::move(data));
    active_journal = saved;
  }
}

void note_grad_read(TensorImpl& t) {
  if (RebindJournal* j = journal()) j->grad_reading(t);
}

// Each thread's current mark_step() number: unique across threads, so a tensor's note of the
// step its gradient changed in never matches another thread's step, and another thread's
// mark_step() never ends this thread's.
namespace {
std::atomic<uint64_t> mark_steps{1};
thread_local constinit uint64_t thread_mark_step = 0;
}  // namespace
uint64_t mark_step_count() {
  if (thread_mark_step == 0) [[unlikely]]
    thread_mark_step = mark_steps.fetch_add(1, std::memory_order_relaxed);
  return thread_mark_step;
}
void count_mark_step() { thread_mark_step = mark_steps.fetch_add(1, std::memory_order_relaxed); }

bool TensorImpl::grad_changed_since_mark_step() const {
  if (grad_mark_ != mark_step_count()) return false;
  if (had_grad_at_mark_ != static_cast<bool>(grad)) return true;
  return had_grad_at_mark_ && (grad_at_mark_.owner_before(grad) || grad.owner_before(grad_at_mark_));
}

void TensorImpl::set_grad_impl(std::shared_ptr<TensorImpl> g) {
  if (RebindJournal* j = journal()) j->grad_changing(*this);
  if (grad_mark_ != mark_step_count()) {
    grad_mark_ = mark_step_count();
    grad_at_mark_ = grad;
    had_grad_at_mark_ = grad != nullptr;
  }
  grad = std::move(g);
}

RebindJournal::RebindJournal() : first_new_id_(next_id.load()), previous_(active_journal) {
  journals.fetch_add(1, std::memory_order_relaxed);
  active_journal = this;
}

RebindJournal::~RebindJournal() {
  active_journal = previous_;
  journals.fetch_sub(1, std::memory_order_relaxed);
}

bool RebindJournal::existed_before(const TensorImpl& t) const {
  return t.id < first_new_id_ || t.shared_state != nullptr;
}

RebindJournal::Entry& RebindJournal::entry(TensorImpl& t) {
  for (Entry& e : entries_)
    if (e.tensor.get() == &t) return e;
  entries_.push_back({});
  entries_.back().tensor = t.shared_from_this();
  return entries_.back();
}

void RebindJournal::pending_reading(TensorImpl& t) {
  if (!existed_before(t)) return;
  for (const Entry& e : entries_)
    if (e.value_changed && e.tensor.get() == &t) return;  // pending with the traced code's own value
  for (const auto& p : pending_before_)
    if (p.get() == &t) return;
  pending_before_.push_back(t.shared_from_this());
}

void RebindJournal::value_changing(TensorImpl& t) {
  if (!existed_before(t)) return;  // made during the trace: nothing to restore
  if (t.is_pending()) pending_reading(t);
  Entry& e = entry(t);
  if (e.value_changed) return;
  e.value_changed = true;
  e.data = t.data();
  e.ir = t.pending();
  e.grad_fn = t.grad_fn;
  e.requires_grad = t.requires_grad;
}

void RebindJournal::grad_changing(TensorImpl& t) {
  if (!existed_before(t)) return;
  Entry& e = entry(t);
  if (e.grad_changed) return;
  e.grad_changed = true;
  if (!e.grad_read) e.grad = t.grad;
}

void RebindJournal::grad_reading(TensorImpl& t) {
  if (!existed_before(t)) return;
  Entry& e = entry(t);
  if (e.grad_changed || e.grad_read) return;
  e.grad_read = true;
  e.grad = t.grad;
}

std::unique_lock<std::recursive_mutex> lock_shared_state(const std::vector<std::shared_ptr<TensorImpl>>& tensors) {
  for (const auto& t : tensors)
    if (t && t->shared_state) return std::unique_lock<std::recursive_mutex>(*t->shared_state);
  return {};
}

void RebindJournal::undo() {
  RebindJournal* saved = active_journal;
  active_journal = nullptr;
  for (Entry& e : entries_) {
    std::unique_lock<std::recursive_mutex> shared;
    if (e.tensor->shared_state) shared = std::unique_lock<std::recursive_mutex>(*e.tensor->shared_state);
    if (e.value_changed) {
      e.tensor->restore_value(e.data, e.ir);
      e.tensor->grad_fn = e.grad_fn;
      e.tensor->requires_grad = e.requires_grad;
    }
    if (e.grad_changed) e.tensor->grad = e.grad;
  }
  active_journal = saved;
}

namespace {

// The operands' types of record(), copied into storage kept for the thread: assigning a shape
// into one of equal or larger capacity allocates nothing.
struct OperandTypes;
using OperandTypeStorage = util::PerThread<std::vector<ir::TensorType>, OperandTypes>;

}  // namespace

LazyValue record(ir::OpKind op, std::vector<LazyValue> operands, ir::Attrs attrs) {
  std::vector<ir::TensorType>& in = OperandTypeStorage::get();
  if (in.size() < operands.size()) in.resize(operands.size());
  for (size_t k = 0; k < operands.size(); ++k) in[k] = operands[k].type();
  auto n = util::make_pooled<LazyNode>();
  n->types = ir::infer_types(op, std::span<const ir::TensorType>(in.data(), operands.size()), attrs);
  n->op = op;
  n->operands = std::move(operands);
  n->attrs = std::move(attrs);
  n->scope = current_scope();
  return {std::move(n), 0};
}

LazyValue constant(double value, DType dtype, Shape shape) {
  return record(ir::OpKind::Full, {}, {value, std::move(shape), dtype});
}

LazyValue scalar_constant(double value, DType dtype) {
  if (current_scope() != 0) return constant(value, dtype);
  // Direct-mapped by the value's bits and the dtype (so 0.0 and -0.0, and every NaN, are
  // their own entries).
  struct Entry {
    uint64_t bits = 0;
    DType dtype = DType::f32;
    std::shared_ptr<LazyNode> node;
  };
  struct Table {
    Entry entries[64];
  };
  Entry* table = util::PerThread<Table, Table>::get().entries;
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  Entry& e = table[((bits ^ static_cast<uint64_t>(dtype)) * 0x9E3779B97F4A7C15ull) >> 58];
  if (!e.node || e.bits != bits || e.dtype != dtype) {
    LazyValue v = constant(value, dtype);
    v.node->shared = true;
    e = {bits, dtype, std::move(v.node)};
  }
  return {e.node, 0};
}

std::shared_ptr<TensorImpl> make_data(ir::TensorType type, std::shared_ptr<runtime::Buffer> data) {
  auto t = util::make_pooled<TensorImpl>(std::move(type));
  t->set_data(std::move(data));
  return t;
}

std::shared_ptr<TensorImpl> make_pending(LazyValue v) {
  auto t = util::make_pooled<TensorImpl>(stashed_copy(v.type()));
  t->set_ir(std::move(v));
  return t;
}

std::shared_ptr<TensorImpl> make_placeholder(ir::TensorType type, int32_t index) {
  auto n = util::make_pooled<LazyNode>();
  n->op = ir::OpKind::Parameter;
  n->types = {type};
  n->scope = current_scope();
  n->placeholder = index;
  return make_pending({std::move(n), 0});
}

std::vector<std::shared_ptr<TensorImpl>> live_pending_tensors() {
  std::vector<std::shared_ptr<TensorImpl>> out;
  const uint32_t thread = this_thread_tag();
  {
    auto& r = pending_registry();
    std::lock_guard<util::SpinLock> lock(r.mu);
    out.reserve(r.size);
    // Tensors of a loop body being traced (or leaked from one) are symbolic: not synced.
    r.for_each_of(thread, [&](TensorImpl* t) {
      if (t->scope == 0)
        if (auto sp = t->weak_from_this().lock()) out.push_back(std::move(sp));
    });
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
  return out;
}

void with_live_pending(const std::function<void(const std::vector<TensorImpl*>&)>& fn) {
  const uint32_t thread = this_thread_tag();
  auto& r = pending_registry();
  std::lock_guard<util::SpinLock> lock(r.mu);
  std::vector<TensorImpl*> live;
  live.reserve(r.size);
  r.for_each_of(thread, [&](TensorImpl* t) {
    if (t->scope == 0) live.push_back(t);
  });
  std::sort(live.begin(), live.end(), [](const TensorImpl* a, const TensorImpl* b) { return a->id < b->id; });
  fn(live);
}

}  // namespace lazyrt::trace
