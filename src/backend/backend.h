// Backends: what turns an optimized graph into an Executable and runs it. The work that does not
// depend on the machine (the passes, fusion decisions, memory planning, read-before-update
// ordering: compile/) takes a backend's capabilities as input; lowering and kernels are the
// backend's. One backend is current per process (LAZYRT_BACKEND, or set_backend()), and its
// fingerprint is part of every cache key, in memory and on disk, so executables of one backend
// never run for another.
//
// Backends today:
//   cpu        the CPU kernels, with elementwise fusion, transposes folded into gemm and
//              convolutions through oneDNN
//   reference  the hand-written CPU kernels one op at a time: no fusion nodes, no gemm
//              rewriting, no library kernels. The oracle other backends are compared with
//              (tests/cpp/compile/backend_test.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "runtime/executable.h"

namespace lazyrt::backend {

/// What a backend's lowering takes, which the backend-independent passes respect.
struct Capabilities {
  /// Elementwise fusion: the most ops in one fusion node and the most operands it reads; 0:
  /// the backend takes no fusion nodes.
  int max_fused_ops = 0;
  int max_fused_inputs = 0;
  /// Matrix products of transposes become gemm nodes (reading the untransposed values).
  bool gemm = false;
  /// Library kernels where they serve an op (oneDNN's convolutions); the hand-written kernel
  /// otherwise.
  bool library_kernels = false;
  /// Fusion groups may hold reductions over the trailing dims of their values, and the ops
  /// that read them per row (ops.def, fusion).
  bool fuses_reductions = false;

  bool fuses() const { return max_fused_ops > 1 && max_fused_inputs > 0; }
};

/// The executables of a graph's loop regions, compiled by compile/ before the graph is lowered,
/// so that lowering never calls back into compile: regions[i] holds node i's, in the order
/// compile::lower makes them (while: cond, body; scan: body; scan_vjp: the vector-Jacobian
/// product, then the forward's carries). Empty for every other node, fusion nodes included:
/// a backend lowers a fusion's region itself. May be shorter than the graph's nodes.
using RegionExecutables = std::vector<std::vector<std::shared_ptr<runtime::Executable>>>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const std::string& name() const = 0;
  /// Distinguishes this backend's executables in every cache key.
  virtual uint64_t fingerprint() const = 0;
  virtual const Capabilities& capabilities() const = 0;
  /// Whether the backend runs `op` on operands of these dtypes. compile() refuses a graph with a
  /// node it does not run, naming the node, before anything is lowered. The cpu and reference
  /// backends run every row of the op table on every dtype its type rules accept.
  virtual bool supports(ir::OpKind op, const std::vector<DType>& operand_dtypes) const {
    (void)op;
    (void)operand_dtypes;
    return true;
  }
  /// The executable of a graph that compile/ optimized with these capabilities. donations as
  /// compile::compile takes them; regions: the executables of its loop regions (below).
  virtual std::shared_ptr<runtime::Executable> lower(const ir::Graph& optimized, const std::vector<int32_t>& donations,
                                                     const RegionExecutables& regions) const = 0;

  // Memory. Tensor data lives in the backend's buffers; everything outside the executables
  // (making tensors from host data, reading values, NumPy and DLPack views, giving a tensor a
  // buffer of its own) goes through these. The defaults are for a device whose memory is the
  // host's, as the cpu and reference backends' is: host access is the memory itself.
  /// A buffer of `bytes` on the device.
  virtual std::shared_ptr<runtime::Buffer> allocate(size_t bytes) const;
  /// A new buffer with a copy of `b`'s bytes.
  virtual std::shared_ptr<runtime::Buffer> copy(const runtime::Buffer& b) const;
  /// A buffer with a copy of `bytes` of host memory at `data`.
  virtual std::shared_ptr<runtime::Buffer> from_host(const void* data, size_t bytes) const;
  /// The bytes of `b` in host memory, kept alive by the result: b's own memory where the device
  /// is the host, else a host copy.
  virtual std::shared_ptr<const void> to_host(const std::shared_ptr<runtime::Buffer>& b) const;
};

/// Buffers belong to the backend that was current when they were made. Every backend today
/// keeps them in host memory, so tensors made under one backend run under another.

// The registry (backend/registry.cpp): the backends by name, and the current one.

/// The current backend: set_current()'s, else LAZYRT_BACKEND's (read once), else cpu. An
/// unknown LAZYRT_BACKEND throws lazyrt::Error naming the known backends.
const Backend& current();
/// The backend of that name; throws lazyrt::Error naming the known ones.
const Backend& get(std::string_view name);
/// Makes `name` current for the whole process. Executables already made (compiled steps,
/// warmed-up graphs) keep running on the backend they were made for.
void set_current(std::string_view name);
std::vector<std::string> names();

}  // namespace lazyrt::backend
