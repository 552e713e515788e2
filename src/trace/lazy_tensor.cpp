#include "trace/lazy_tensor.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_set>

#include "util/check.h"

namespace lazyrt::trace {
namespace {

std::atomic<int64_t> next_id{1};

// Pending tensors, for mark_step. Tensors enter when they get IR and leave when they are
// materialized or destroyed.
struct PendingRegistry {
  std::mutex mu;
  std::unordered_set<TensorImpl*> set;
};
PendingRegistry& pending_registry() {
  static PendingRegistry* r = new PendingRegistry();
  return *r;
}

}  // namespace

TensorImpl::TensorImpl(ir::TensorType t) : id(next_id++), type(std::move(t)) {}

TensorImpl::~TensorImpl() {
  if (ir) {
    auto& r = pending_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.set.erase(this);
  }
}

LazyValue TensorImpl::value() {
  if (ir) return ir;
  if (!leaf_) {
    LAZYRT_ASSERT(data_, "tensor ", id, " holds neither data nor IR");
    auto n = std::make_shared<LazyNode>();
    n->op = ir::OpKind::Parameter;
    n->types = {type};
    n->data = data_;
    n->source_tensor = id;
    leaf_ = {std::move(n), 0};
  }
  return leaf_;
}

void TensorImpl::set_ir(LazyValue v) {
  LAZYRT_ASSERT(v.type() == type, "rebinding tensor ", id, " of ", ir::type_str(type), " to ",
                ir::type_str(v.type()));
  if (!ir) {
    auto& r = pending_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.set.insert(this);
  }
  ir = std::move(v);
  data_.reset();
  leaf_ = {};
}

void TensorImpl::set_data(std::shared_ptr<runtime::Buffer> buffer) {
  if (ir) {
    auto& r = pending_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.set.erase(this);
  }
  ir = {};
  leaf_ = {};
  data_ = std::move(buffer);
}

LazyValue record(ir::OpKind op, std::vector<LazyValue> operands, ir::Attrs attrs) {
  std::vector<ir::TensorType> in;
  in.reserve(operands.size());
  for (const LazyValue& v : operands) in.push_back(v.type());
  auto n = std::make_shared<LazyNode>();
  n->types = ir::infer_types(op, in, attrs);
  n->op = op;
  n->operands = std::move(operands);
  n->attrs = std::move(attrs);
  return {std::move(n), 0};
}

LazyValue constant(double value, DType dtype, Shape shape) {
  return record(ir::OpKind::Full, {}, {value, std::move(shape), dtype});
}

std::shared_ptr<TensorImpl> make_data(ir::TensorType type, std::shared_ptr<runtime::Buffer> data) {
  auto t = std::make_shared<TensorImpl>(std::move(type));
  t->set_data(std::move(data));
  return t;
}

std::shared_ptr<TensorImpl> make_pending(LazyValue v) {
  auto t = std::make_shared<TensorImpl>(v.type());
  t->set_ir(std::move(v));
  return t;
}

std::vector<std::shared_ptr<TensorImpl>> live_pending_tensors() {
  std::vector<std::shared_ptr<TensorImpl>> out;
  {
    auto& r = pending_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    out.reserve(r.set.size());
    for (TensorImpl* t : r.set)
      if (auto sp = t->weak_from_this().lock()) out.push_back(std::move(sp));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
  return out;
}

}  // namespace lazyrt::trace
