// The graph executor: the one place that turns an extracted graph into results.
//
//   key      cache_key(graph, donations): the graph's structural hash, its donation offers and
//            the current backend (backend/backend.h)
//   cache    executable_for(key, ...): the in-memory cache, then the persistent cache on disk,
//            then compilation (whose result goes into both)
//   bind     the parameters' buffers, and per output a buffer to write it into: a buffer the
//            caller offers (a donated parameter, or the buffer the destination tensor holds
//            and nobody else does) when it may be overwritten, else a fresh one
//   run      the executable, timed and counted
//   results  every output's buffer, including those the executable did not compute (a
//            parameter passed through, a constant, another output)
//
// What happens to the results (which tensor gets which buffer) is the caller's: a sync binds
// them to the synced tensors, a replay writes them back into the state it captured.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "compile/polymorphic.h"
#include "ir/graph.h"
#include "lazyrt/types.h"
#include "runtime/buffer.h"
#include "runtime/executable.h"
#include "util/metrics_cells.h"

namespace lazyrt::exec {

using BufferPtr = std::shared_ptr<runtime::Buffer>;

/// The cache key of a graph compiled with these donation offers by the current backend; from
/// the graph's hash_graph where the graph itself was never built.
GraphHash cache_key(const ir::Graph& graph, const std::vector<int32_t>& donations);
GraphHash cache_key(const GraphHash& graph_hash, const std::vector<int32_t>& donations);

/// The executable for `key` from the in-memory cache (counted), or null.
std::shared_ptr<runtime::Executable> cached_executable(const GraphHash& key);
/// The executable for `key`: from the in-memory cache, the disk cache, or compiled by the
/// current backend (counted).
std::shared_ptr<runtime::Executable> executable_for(const GraphHash& key, const ir::Graph& graph,
                                                    const std::vector<int32_t>& donations);

/// `offer` if a replay may write an output of `bytes` into it: lazyrt owns it or its owner lent
/// it for writing (Buffer::replay_writable), it has that size, and its only holders are the
/// `owners` the caller accounts for. Otherwise null.
inline const BufferPtr& writable(const BufferPtr& offer, size_t bytes, long owners) {
  static const BufferPtr none;
  return offer && offer->replay_writable() && offer.use_count() <= owners && offer->bytes() == bytes ? offer
                                                                                                      : none;
}

/// Copies the elements of `box` (no larger than either shape in any dim) from the start of
/// `src`, a row-major array of shape `from`, to the start of `dst`, of shape `to`; elements of
/// `esize` bytes. A bucket graph's inputs are padded and its outputs cropped with it
/// (compile/polymorphic.h).
void copy_box(const void* src, const Shape& from, void* dst, const Shape& to, const Shape& box, size_t esize);
/// `src`, of traced type `t`, in a fresh buffer of its padded shape (zeros in the padding).
BufferPtr padded_copy(const runtime::Buffer& src, const ir::TensorType& t, const compile::Box& box);
/// The valid elements of `src` (a padded value of this box) in a fresh buffer of type `t`.
BufferPtr cropped_copy(const runtime::Buffer& src, const compile::Box& box, const ir::TensorType& t);

/// Reusable scratch for runs of one executable: sized once, so a run allocates nothing but
/// the fresh output buffers it needs.
struct Frame {
  std::vector<const void*> params;  // per parameter, its data
  std::vector<BufferPtr> outs;      // per output, its buffer
  std::vector<void*> out_ptrs;      // per output, where the executable writes it (or null)

  void size_for(const runtime::Executable& exe) {
    params.resize(exe.param_types().size());
    outs.resize(exe.outputs().size());
    out_ptrs.resize(exe.outputs().size());
  }
};

/// Binds, runs and resolves one execution. Before: frame.params holds the parameters' data.
/// offer(k) -> const BufferPtr&: for each output the executable computes, a buffer it may be
/// written into (checked with writable() by the caller) or null for a fresh one.
/// param(i) -> const BufferPtr&: the buffer of parameter i, for outputs that are parameters.
/// After: frame.outs[k] is the buffer of output k, for every k. `counter` is counted once per
/// run (ExecuteGraph for syncs, ReplayGraph for replays).
template <class Offer, class Param>
void run(runtime::Executable& exe, Frame& frame, const Offer& offer, const Param& param,
         metrics::detail::CounterCell& counter);

/// The run itself: exe.run, timed as ExecuteTime, and the counter.
void execute(runtime::Executable& exe, const void* const* params, void* const* outs,
             metrics::detail::CounterCell& counter);

/// Every output the executable did not compute, from where it is: a parameter, a constant,
/// or another output.
template <class Param>
void resolve_outputs(const runtime::Executable& exe, const Param& param, std::vector<BufferPtr>& outs) {
  using runtime::OutputSource;
  for (size_t k = 0; k < outs.size(); ++k) {
    const OutputSource& s = exe.outputs()[k];
    switch (s.kind) {
      case OutputSource::Kind::Computed: break;
      case OutputSource::Kind::Param: outs[k] = param(s.index); break;
      case OutputSource::Kind::Const: outs[k] = exe.constant_output(s.index); break;
      case OutputSource::Kind::Alias: break;  // below, once every computed one is known
    }
  }
  for (size_t k = 0; k < outs.size(); ++k)
    if (exe.outputs()[k].kind == OutputSource::Kind::Alias) outs[k] = outs[exe.outputs()[k].index];
}

template <class Offer, class Param>
void run(runtime::Executable& exe, Frame& frame, const Offer& offer, const Param& param,
         metrics::detail::CounterCell& counter) {
  const size_t n = exe.outputs().size();
  for (size_t k = 0; k < n; ++k) {
    frame.out_ptrs[k] = nullptr;
    if (exe.outputs()[k].kind != runtime::OutputSource::Kind::Computed) continue;
    const BufferPtr& b = offer(k);
    frame.outs[k] = b ? b : backend::current().allocate(exe.output_types()[k].bytes());
    frame.out_ptrs[k] = frame.outs[k]->data();
  }
  execute(exe, frame.params.data(), frame.out_ptrs.data(), counter);
  resolve_outputs(exe, param, frame.outs);
}

}  // namespace lazyrt::exec
