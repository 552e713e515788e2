// The collective ops: each hands its buffers to the communicator of its group (runtime/
// collective.h, Gloo behind it) and writes the next ordering token. The group's size is
// checked against the one the graph was traced for; a failure of the collective (a peer gone,
// a timeout) is the communicator's lazyrt::Error. Results are the kernel's own buffers, never
// its operand's (collectives are not kInPlace), and lowering keeps every output of the graph
// aside until the collective is done (kChecked), so a failed run writes no output.
#include <cstring>

#include "backend/cpu/kernels/ops.h"
#include "runtime/collective.h"
#include "util/check.h"

namespace lazyrt::kernels {
namespace {

struct Geometry {
  std::string_view name;
  int64_t world, group;
  DType dtype;
  size_t in_bytes, out_bytes, out_count;
};

Geometry geometry(const KernelSpec& s) {
  const ir::NodeAttrs at(s.op, s.attrs);
  return {ir::op_name(s.op), at.i<"world">(), at.i<"group">(), s.inputs[0].dtype, s.inputs[0].bytes(),
          s.outputs[0].bytes(), static_cast<size_t>(s.outputs[0].numel())};
}

std::shared_ptr<runtime::Communicator> group_of(const Geometry& g) {
  std::shared_ptr<runtime::Communicator> c = runtime::communicator(g.group, g.name);
  LAZYRT_CHECK(c->size() == g.world, g.name, ": the graph was traced for a process group of ", g.world,
               " processes, but this one has ", c->size());
  return c;
}

void write_token(void* const* out) { *static_cast<uint8_t*>(out[1]) = 0; }

}  // namespace

Kernel make_AllReduce(const KernelSpec& s) {
  const Geometry g = geometry(s);
  const auto op = static_cast<ir::ReduceOp>(ir::NodeAttrs(s.op, s.attrs).i<"reduce">());
  return {[g, op](const void* const* in, void* const* out) {
    auto c = group_of(g);
    if (g.out_bytes) {
      if (in[0] != out[0]) std::memcpy(out[0], in[0], g.out_bytes);
      c->all_reduce(out[0], g.out_count, g.dtype, op);
    }
    write_token(out);
  }};
}

Kernel make_AllGather(const KernelSpec& s) {
  const Geometry g = geometry(s);
  return {[g](const void* const* in, void* const* out) {
    auto c = group_of(g);
    if (g.out_bytes) c->all_gather(in[0], out[0], g.in_bytes);
    write_token(out);
  }};
}

Kernel make_ReduceScatter(const KernelSpec& s) {
  const Geometry g = geometry(s);
  const auto op = static_cast<ir::ReduceOp>(ir::NodeAttrs(s.op, s.attrs).i<"reduce">());
  // The workspace: a copy of the input, which the ring reduces in place.
  return {[g, op](const void* const* in, void* const* out) {
            auto c = group_of(g);
            if (g.out_bytes) {
              std::memcpy(out[2], in[0], g.in_bytes);
              c->reduce_scatter(out[2], out[0], g.out_count, g.dtype, op);
            }
            write_token(out);
          },
          g.in_bytes};
}

Kernel make_Broadcast(const KernelSpec& s) {
  const Geometry g = geometry(s);
  const int src = static_cast<int>(ir::NodeAttrs(s.op, s.attrs).i<"src">());
  return {[g, src](const void* const* in, void* const* out) {
    auto c = group_of(g);
    if (g.out_bytes) {
      if (in[0] != out[0]) std::memcpy(out[0], in[0], g.out_bytes);
      c->broadcast(out[0], g.out_bytes, src);
    }
    write_token(out);
  }};
}

}  // namespace lazyrt::kernels
