// The processes a collective op runs across, as the kernels see them. src/distributed
// implements a Communicator over Gloo and installs it for the process group it creates; a
// collective kernel finds it here when the graph runs. Nothing below src/distributed knows
// Gloo, sockets or ranks' addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ir/op.h"
#include "lazyrt/types.h"

namespace lazyrt::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// `count` elements of `dtype` at in, reduced across the ranks into out (mean: the sum
  /// divided by the size, in the dtype's compute type). in may be out (reduced in place);
  /// otherwise in is only read, and nothing but out is written.
  virtual void all_reduce(const void* in, void* out, size_t count, DType dtype, ir::ReduceOp op) = 0;
  /// Every rank's `bytes` at in, in rank order, at out (size() * bytes).
  virtual void all_gather(const void* in, void* out, size_t bytes) = 0;
  /// data holds size() parts of `count` elements; out gets part rank() reduced across the
  /// ranks. data is clobbered.
  virtual void reduce_scatter(void* data, void* out, size_t count, DType dtype, ir::ReduceOp op) = 0;
  /// src's `bytes` at data, on every rank.
  virtual void broadcast(void* data, size_t bytes, int src) = 0;
};

/// Installs (or, with null, removes) the communicator of group `group`.
void set_communicator(int64_t group, std::shared_ptr<Communicator> c);
/// The communicator of group `group`; throws lazyrt::Error naming `op` when there is none (no
/// process group was initialized, or it was destroyed).
std::shared_ptr<Communicator> communicator(int64_t group, std::string_view op);

}  // namespace lazyrt::runtime
