// The collectives as lazy ops, the ordering token, and data-parallel helpers built on them.
//
// The token: each collective takes the token its predecessor gave (result 1 of its node) and
// gives the next one, so the collectives of a graph are a chain every rank runs in one order.
// The chain's end is held weakly: once the last collective's node is gone (its results were
// computed and nothing pending reads them) or a mark_step() has passed, the next collective
// starts a new chain from a constant token. Every rank runs the same program, so every rank
// makes the same chains and graphs.
#include <mutex>

#include "distributed/process_group.h"
#include "lazyrt/distributed.h"
#include "lazyrt/optim.h"
#include "ops/op_helpers.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"

namespace lazyrt::distributed {
namespace {

using ir::OpKind;

std::mutex token_mu;
std::weak_ptr<trace::LazyNode> chain_end;
uint64_t chain_mark = 0;

int64_t reduce_attr(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return static_cast<int64_t>(ir::ReduceOp::Sum);
    case ReduceOp::Mean: return static_cast<int64_t>(ir::ReduceOp::Mean);
    case ReduceOp::Max: return static_cast<int64_t>(ir::ReduceOp::Max);
    case ReduceOp::Min: return static_cast<int64_t>(ir::ReduceOp::Min);
  }
  throw Error("collective: unknown ReduceOp");
}

Tensor collective(OpKind op, const char* name, const Tensor& t, ir::Attrs attrs) {
  LAZYRT_CHECK(t.defined(), name, ": the tensor is undefined");
  LAZYRT_CHECK(trace::current_scope() == 0, name,
               ": collectives cannot be traced inside a while_loop, fori_loop or scan body");
  const int world = detail::world_size_for(name);
  attrs.values.push_back(int64_t{world});
  attrs.values.push_back(int64_t{0});  // the default group
  trace::LazyValue input = lazyrt::detail::value_of(t);
  std::lock_guard<std::mutex> lock(token_mu);
  trace::LazyValue token;
  if (auto end = chain_end.lock(); end && chain_mark == trace::mark_step_count()) token = {std::move(end), 1};
  else token = trace::constant(0, DType::b8);
  trace::LazyValue v = trace::record(op, {std::move(input), std::move(token)}, std::move(attrs));
  chain_end = v.node;
  chain_mark = trace::mark_step_count();
  return trace::tensor_of(trace::make_pending(std::move(v)));
}

}  // namespace

Tensor all_reduce(const Tensor& t, ReduceOp op) {
  return collective(OpKind::AllReduce, "all_reduce", t, {reduce_attr(op)});
}

Tensor all_gather(const Tensor& t) { return collective(OpKind::AllGather, "all_gather", t, {}); }

Tensor reduce_scatter(const Tensor& t, ReduceOp op) {
  return collective(OpKind::ReduceScatter, "reduce_scatter", t, {reduce_attr(op)});
}

Tensor broadcast(const Tensor& t, int src) {
  return collective(OpKind::Broadcast, "broadcast", t, {int64_t{src}});
}

std::vector<Tensor> all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, size_t bucket_bytes) {
  LAZYRT_CHECK(bucket_bytes > 0, "all_reduce_coalesced: bucket_bytes must be positive");
  NoGradGuard no_grad;
  std::vector<Tensor> out(tensors.size());
  // Open buckets, one per dtype, in the order their first tensor came: the indices of their
  // tensors and their bytes.
  struct Bucket {
    DType dtype;
    std::vector<size_t> members;
    size_t bytes = 0;
  };
  std::vector<Bucket> open;
  auto flush = [&](Bucket& b) {
    if (b.members.empty()) return;
    if (b.members.size() == 1) {
      out[b.members[0]] = all_reduce(tensors[b.members[0]], op);
    } else {
      std::vector<Tensor> flat;
      for (size_t i : b.members) flat.push_back(reshape(tensors[i], {-1}));
      const Tensor reduced = all_reduce(cat(flat, 0), op);
      int64_t offset = 0;
      for (size_t i : b.members) {
        const Tensor& t = tensors[i];
        out[i] = reshape(narrow(reduced, 0, offset, t.numel()), t.shape());
        offset += t.numel();
      }
    }
    b.members.clear();
    b.bytes = 0;
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    LAZYRT_CHECK(t.defined(), "all_reduce_coalesced: tensor ", i, " is undefined");
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    Bucket* b = nullptr;
    for (Bucket& o : open)
      if (o.dtype == t.dtype()) b = &o;
    if (!b) {
      open.push_back({t.dtype(), {}, 0});
      b = &open.back();
    }
    if (!b->members.empty() && b->bytes + bytes > bucket_bytes) flush(*b);
    b->members.push_back(i);
    b->bytes += bytes;
  }
  for (Bucket& b : open) flush(b);
  return out;
}

void all_reduce_gradients(const std::vector<Tensor>& params, ReduceOp op, size_t bucket_bytes) {
  LAZYRT_CHECK(bucket_bytes > 0, "all_reduce_gradients: bucket_bytes must be positive");
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    LAZYRT_CHECK(p.defined(), "all_reduce_gradients: a parameter is undefined");
    if (Tensor g = p.grad(); g.defined()) grads.push_back(std::move(g));
  }
  const std::vector<Tensor> reduced = all_reduce_coalesced(grads, op, bucket_bytes);
  for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(reduced[i]);
}

void reduce_gradients(const optim::Optimizer& optimizer, size_t bucket_bytes) {
  all_reduce_gradients(optimizer.params(), ReduceOp::Mean, bucket_bytes);
}

void broadcast_parameters(const std::vector<Tensor>& tensors, int src) {
  {
    NoGradGuard no_grad;
    for (const Tensor& t : tensors) {
      LAZYRT_CHECK(t.defined(), "broadcast_parameters: a tensor is undefined");
      Tensor(t).copy_(broadcast(t.detach(), src));
    }
  }
  sync(tensors);
}

}  // namespace lazyrt::distributed
