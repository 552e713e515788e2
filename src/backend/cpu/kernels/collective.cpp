// The collective ops: each hands its buffers to the communicator of its group (runtime/
// collective.h, Gloo behind it) and writes the next ordering token. The group's size is
// checked against the one the graph was traced for; a failure of the collective (a peer gone,
// a timeout) is the communicator's lazyrt::Error. all_reduce and broadcast may be given their
// operand's buffer for their result (lowering's can_alias: an operand that dies there); else
// the communicator reads the operand where it lies and writes the result aside, so no kernel
// copies its operand first. Lowering keeps every output of the graph aside until the
// collective is done (kChecked), so a failed run writes no output, except the result of the
// graph's last collective, written straight into its output (a tensor reduced in place gets
// in[0] == out[0], its donated buffer), which a failure leaves partly written (lower.cpp).
#include <cstring>

#include "backend/cpu/kernels/ops.h"
#include "runtime/collective.h"
#include "util/check.h"

namespace lazyrt::kernels {
namespace {

// What a collective's kernel knows of it, read from its spec once: the group, the sizes, the
// dtype, and the reduction (all_reduce, reduce_scatter) or source rank (broadcast).
struct Geometry {
  std::string_view name;
  int64_t world, group;
  DType dtype;
  size_t in_bytes, out_bytes, out_count;
  ir::ReduceOp reduce = ir::ReduceOp::Sum;
  int src = 0;
};

Geometry geometry(const KernelSpec& s) {
  const ir::NodeAttrs at(s.op, s.attrs);
  Geometry g{ir::op_name(s.op), at.i<"world">(), at.i<"group">(), s.inputs[0].dtype, s.inputs[0].bytes(),
             s.outputs[0].bytes(), static_cast<size_t>(s.outputs[0].numel())};
  if (s.op == ir::OpKind::AllReduce || s.op == ir::OpKind::ReduceScatter)
    g.reduce = static_cast<ir::ReduceOp>(at.i<"reduce">());
  if (s.op == ir::OpKind::Broadcast) g.src = static_cast<int>(at.i<"src">());
  return g;
}

// The kernel of a collective: finds the group (checking its size against the graph's), runs
// body(communicator, geometry, in, out) unless the result is empty, and writes the token
// (result 1).
template <class Body>
Kernel collective(const KernelSpec& s, Body body, size_t workspace_bytes = 0) {
  return {[g = geometry(s), body](const void* const* in, void* const* out) {
            const std::shared_ptr<runtime::Communicator> c = runtime::communicator(g.group, g.name);
            LAZYRT_CHECK(c->size() == g.world, g.name, ": the graph was traced for a process group of ", g.world,
                         " processes, but this one has ", c->size());
            if (g.out_bytes) body(*c, g, in, out);
            *static_cast<uint8_t*>(out[1]) = 0;
          },
          workspace_bytes};
}

}  // namespace

Kernel make_AllReduce(const KernelSpec& s) {
  return collective(s, [](runtime::Communicator& c, const Geometry& g, const void* const* in, void* const* out) {
    c.all_reduce(in[0], out[0], g.out_count, g.dtype, g.reduce);
  });
}

Kernel make_AllGather(const KernelSpec& s) {
  return collective(s, [](runtime::Communicator& c, const Geometry& g, const void* const* in, void* const* out) {
    c.all_gather(in[0], out[0], g.in_bytes);
  });
}

// The workspace (out[2]): a copy of the input, which the ring reduces in place.
Kernel make_ReduceScatter(const KernelSpec& s) {
  const size_t workspace = s.inputs[0].bytes();
  return collective(
      s,
      [](runtime::Communicator& c, const Geometry& g, const void* const* in, void* const* out) {
        std::memcpy(out[2], in[0], g.in_bytes);
        c.reduce_scatter(out[2], out[0], g.out_count, g.dtype, g.reduce);
      },
      workspace);
}

Kernel make_Broadcast(const KernelSpec& s) {
  return collective(s, [](runtime::Communicator& c, const Geometry& g, const void* const* in, void* const* out) {
    if (in[0] != out[0]) std::memcpy(out[0], in[0], g.out_bytes);
    c.broadcast(out[0], g.out_bytes, g.src);
  });
}

}  // namespace lazyrt::kernels
