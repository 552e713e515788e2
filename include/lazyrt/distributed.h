// Data-parallel training across processes (and hosts) over Gloo.
//
// A process group is the set of processes that run the same program on their share of the
// data. init_process_group() joins it: from torchrun's environment (MASTER_ADDR, MASTER_PORT,
// RANK, WORLD_SIZE, LOCAL_RANK; rank 0 serves a small TCP store the others meet at), or from a
// store directory every process can see (`init_method = "file:///path"`, rank and size given
// or from the environment). Every collective and barrier gives up after the group's timeout:
// a peer that died or stopped answering is a lazyrt::Error on every other rank, never a hang,
// and the group is unusable after it (destroy it).
//
// Collectives are ops of the graph, like any other: all_reduce(t) returns a new lazy tensor,
// and the communication happens inside the executable when the graph runs. Every rank must
// run the same collectives in the same order: a graph orders its collectives by a token that
// each one takes from the one before, and the graph's hash depends on the group's size but not
// on the rank, so every rank compiles one graph and shares one cache entry (a compiled step
// with collectives replays on every rank). Collectives are not differentiated; gradients are
// reduced after backward (reduce_gradients), as PyTorch/XLA does.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "lazyrt/tensor.h"

namespace lazyrt::optim {
class Optimizer;
}

namespace lazyrt::distributed {

struct InitOptions {
  /// "env://" (torchrun's variables), "tcp://host:port" (rank 0 serves the store on that port
  /// of host; RANK and WORLD_SIZE as for env://) or "file:///a/directory" (a store in files
  /// there).
  std::string init_method = "env://";
  /// -1: from RANK and WORLD_SIZE.
  int rank = -1;
  int world_size = -1;
  /// How long joining, a barrier or a collective may wait for the other ranks.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

/// Joins the process group (see above); throws lazyrt::Error naming what is missing or wrong
/// (an unset variable, a rank outside [0, WORLD_SIZE), the store unreachable, a rank that did
/// not join within the timeout), or when a group is already initialized.
void init_process_group(const InitOptions& options = {});
bool is_initialized();
/// This process's rank, the group's size, LOCAL_RANK (0 when unset); throw when no group is
/// initialized.
int get_rank();
int get_world_size();
int get_local_rank();
/// Returns once every rank has called it (pending lazy work is not synced).
void barrier();
/// Leaves the group: its connections close; a new one may be initialized after.
void destroy_process_group();

enum class ReduceOp { Sum, Mean, Max, Min };

/// The elementwise reduction of every rank's `t` (same shape and dtype on every rank).
Tensor all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
/// Every rank's `t`, concatenated along dim 0 in rank order.
Tensor all_gather(const Tensor& t);
/// The reduction of every rank's `t`, of which rank r keeps the r-th of world_size equal parts
/// of dim 0.
Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::Sum);
/// Rank `src`'s `t`, on every rank.
Tensor broadcast(const Tensor& t, int src = 0);

/// The reduction of each of `tensors` across the ranks, as new tensors: tensors of one dtype
/// are flattened into buffers of at most `bucket_bytes` (a larger tensor is a bucket of its
/// own), one all_reduce each, and split back into the tensors' shapes. Every rank must pass
/// tensors of the same shapes and dtypes in the same order.
inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;
std::vector<Tensor> all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::Sum,
                                         size_t bucket_bytes = kDefaultBucketBytes);
/// The gradients of `params` replaced in place by their mean (or `op`) across the ranks, in
/// buckets as all_reduce_coalesced makes them. Parameters without a
/// gradient are skipped (every rank must have the same ones). Records lazily: call it between
/// backward() and the optimizer's step(), in a traced or a compiled step alike.
void all_reduce_gradients(const std::vector<Tensor>& params, ReduceOp op = ReduceOp::Mean,
                          size_t bucket_bytes = kDefaultBucketBytes);
/// all_reduce_gradients over the optimizer's parameters (PyTorch/XLA's reduce_gradients).
void reduce_gradients(const optim::Optimizer& optimizer, size_t bucket_bytes = kDefaultBucketBytes);
/// Every tensor's value replaced in place (without autograd history) by rank `src`'s, and
/// synced: start data-parallel training from the same parameters on every rank.
void broadcast_parameters(const std::vector<Tensor>& tensors, int src = 0);

}  // namespace lazyrt::distributed
