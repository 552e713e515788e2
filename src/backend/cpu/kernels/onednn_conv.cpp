// conv2d and its two backward ops through oneDNN, for the cpu backend (the reference backend
// keeps conv.cpp's im2col + GEMM, which also serves every dtype and geometry oneDNN does not).
//
// The primitive is made when the kernel is made, with its memory formats left to oneDNN
// ("any"): the graph's tensors stay NCHW / OIHW, and operands whose chosen format is blocked
// are reordered into the kernel's workspace around the call. The workspace also holds the
// primitive's scratchpad, so a run allocates nothing. Threads: oneDNN's OpenMP team is sized
// to the kernel pool's (LAZYRT_NUM_THREADS) for the call and restored afterwards, so the
// process's own OpenMP setting (PyTorch's, for one) is left as it was.
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <mutex>
#include <optional>

#include "backend/cpu/kernels/kernel.h"
#include "backend/cpu/kernels/parallel.h"
#include "util/check.h"
#include "util/metrics_cells.h"

namespace lazyrt::kernels {
namespace {

using dnnl::memory;
using Dims = memory::dims;

const dnnl::engine& engine() {
  static const auto* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

enum class Pass { Forward, BackwardInput, BackwardWeight };

// One operand of the primitive: the graph's plain buffer and, when oneDNN chose another
// format, its copy in the workspace with the reorder between them.
struct Operand {
  int arg = 0;                // DNNL_ARG_*
  memory user, inner;         // inner is user when no reorder is needed
  std::optional<dnnl::reorder> reorder;
  size_t offset = 0;          // of inner in the workspace, when reordered
};

// The made primitive with its memory objects. Memory objects carry their data pointers, which
// are set per call: a mutex keeps two concurrent runs of one executable from sharing them.
struct Conv {
  dnnl::primitive prim;
  std::array<Operand, 3> ops;  // two inputs (graph operand order), then the result
  memory scratch;
  dnnl::stream stream{engine()};
  std::mutex mutex;
  size_t workspace_bytes = 0;
};

memory::desc plain(const Shape& s, bool grouped_weights, int64_t groups) {
  if (!grouped_weights)
    return {Dims(s.begin(), s.end()), memory::data_type::f32, memory::format_tag::nchw};
  return {Dims{groups, s[0] / groups, s[1], s[2], s[3]}, memory::data_type::f32, memory::format_tag::goihw};
}

memory::desc any(const memory::desc& d) { return {d.dims(), memory::data_type::f32, memory::format_tag::any}; }

void execute(const dnnl::primitive& p, const dnnl::stream& s, std::initializer_list<dnnl_exec_arg_t> args) {
  const dnnl_status_t st = dnnl_primitive_execute(p.get(), s.get(), static_cast<int>(args.size()), args.begin());
  LAZYRT_ASSERT(st == dnnl_success, "oneDNN primitive failed with status ", static_cast<int>(st));
}

// Sets operand k up for the primitive's chosen format `chosen`, reserving workspace for a copy.
void place(Conv& c, size_t k, int arg, const memory::desc& user, const memory::desc& chosen, bool is_result) {
  Operand& o = c.ops[k];
  o.arg = arg;
  o.user = memory(user, engine(), DNNL_MEMORY_NONE);
  if (chosen == user) {
    o.inner = o.user;
    return;
  }
  o.inner = memory(chosen, engine(), DNNL_MEMORY_NONE);
  o.reorder = is_result ? dnnl::reorder(o.inner, o.user) : dnnl::reorder(o.user, o.inner);
  o.offset = c.workspace_bytes;
  c.workspace_bytes += (chosen.get_size() + 63) / 64 * 64;
}

template <Pass kPass>
std::optional<Kernel> make(const KernelSpec& s) {
  if (s.outputs[0].dtype != DType::f32) return std::nullopt;
  for (const auto& t : s.inputs)
    if (t.numel() == 0) return std::nullopt;
  if (s.outputs[0].numel() == 0) return std::nullopt;
  const ir::NodeAttrs a(s.op, s.attrs);
  const auto& stride = a.ints<"stride">();
  const auto& padding = a.ints<"padding">();
  const auto& dilation = a.ints<"dilation">();
  const int64_t groups = a.i<"groups">();
  // The forward conv's shapes.
  const Shape& x = kPass == Pass::Forward ? s.inputs[0].shape
                   : kPass == Pass::BackwardInput ? s.outputs[0].shape : s.inputs[1].shape;
  const Shape& w = kPass == Pass::BackwardWeight ? s.outputs[0].shape : s.inputs[1].shape;
  const Shape& y = kPass == Pass::Forward ? s.outputs[0].shape : s.inputs[0].shape;
  const Dims strides{stride[0], stride[1]}, pad{padding[0], padding[1]};
  const Dims dilates{dilation[0] - 1, dilation[1] - 1};
  const memory::desc xd = plain(x, false, 1), wd = plain(w, groups > 1, groups), yd = plain(y, false, 1);
  auto c = std::make_shared<Conv>();
  try {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const auto algo = dnnl::algorithm::convolution_direct;
    const auto fwd_kind =
        dnnl::prop_kind::forward_training;
    const dnnl::convolution_forward::desc fwd(fwd_kind, algo, any(xd), any(wd), any(yd), strides, dilates, pad, pad);
    const dnnl::convolution_forward::primitive_desc fwd_pd(fwd, attr, engine());
    memory::desc scratch;
    if constexpr (kPass == Pass::Forward) {
      c->prim = dnnl::convolution_forward(fwd_pd);
      place(*c, 0, DNNL_ARG_SRC, xd, fwd_pd.src_desc(), false);
      place(*c, 1, DNNL_ARG_WEIGHTS, wd, fwd_pd.weights_desc(), false);
      place(*c, 2, DNNL_ARG_DST, yd, fwd_pd.dst_desc(), true);
      scratch = fwd_pd.scratchpad_desc();
    } else if constexpr (kPass == Pass::BackwardInput) {
      const dnnl::convolution_backward_data::desc bwd(algo, any(xd), any(wd), any(yd), strides, dilates, pad, pad);
      const dnnl::convolution_backward_data::primitive_desc pd(bwd, attr, engine(), fwd_pd);
      c->prim = dnnl::convolution_backward_data(pd);
      place(*c, 0, DNNL_ARG_DIFF_DST, yd, pd.diff_dst_desc(), false);
      place(*c, 1, DNNL_ARG_WEIGHTS, wd, pd.weights_desc(), false);
      place(*c, 2, DNNL_ARG_DIFF_SRC, xd, pd.diff_src_desc(), true);
      scratch = pd.scratchpad_desc();
    } else {
      const dnnl::convolution_backward_weights::desc bwd(algo, any(xd), any(wd), any(yd), strides, dilates, pad, pad);
      const dnnl::convolution_backward_weights::primitive_desc pd(bwd, attr, engine(), fwd_pd);
      c->prim = dnnl::convolution_backward_weights(pd);
      place(*c, 0, DNNL_ARG_DIFF_DST, yd, pd.diff_dst_desc(), false);
      place(*c, 1, DNNL_ARG_SRC, xd, pd.src_desc(), false);
      place(*c, 2, DNNL_ARG_DIFF_WEIGHTS, wd, pd.diff_weights_desc(), true);
      scratch = pd.scratchpad_desc();
    }
    c->scratch = memory(scratch, engine(), DNNL_MEMORY_NONE);
  } catch (const dnnl::error&) {
    return std::nullopt;  // a geometry oneDNN does not implement: conv.cpp's kernel serves it
  }
  static auto& made = metrics::detail::counter_cell("LibraryKernels");
  made.add(1);
  const size_t scratch_offset = c->workspace_bytes;
  const size_t ws = c->workspace_bytes + c->scratch.get_desc().get_size();
  return Kernel{[c, scratch_offset, ws](const void* const* in, void* const* out) {
                  std::lock_guard<std::mutex> lock(c->mutex);
                  char* work = ws ? static_cast<char*>(out[1]) : nullptr;
                  const std::array<void*, 3> data{const_cast<void*>(in[0]), const_cast<void*>(in[1]), out[0]};
                  for (size_t k = 0; k < 3; ++k) {
                    Operand& o = c->ops[k];
                    o.user.set_data_handle(data[k]);
                    if (o.reorder) o.inner.set_data_handle(work + o.offset);
                  }
                  c->scratch.set_data_handle(c->scratch.get_desc().get_size() ? work + scratch_offset : nullptr);
                  const OmpTeam team(num_threads());
                  for (size_t k = 0; k < 2; ++k)
                    if (const Operand& o = c->ops[k]; o.reorder)
                      execute(*o.reorder, c->stream, {{DNNL_ARG_FROM, o.user.get()}, {DNNL_ARG_TO, o.inner.get()}});
                  const Operand &a = c->ops[0], &b = c->ops[1], &r = c->ops[2];
                  execute(c->prim, c->stream,
                          {{a.arg, a.inner.get()}, {b.arg, b.inner.get()}, {r.arg, r.inner.get()},
                           {DNNL_ARG_SCRATCHPAD, c->scratch.get()}});
                  if (r.reorder)
                    execute(*r.reorder, c->stream, {{DNNL_ARG_FROM, r.inner.get()}, {DNNL_ARG_TO, r.user.get()}});
                },
                ws};
}

}  // namespace

std::optional<Kernel> make_onednn_conv(const KernelSpec& spec) {
  switch (spec.op) {
    case ir::OpKind::Conv2d: return make<Pass::Forward>(spec);
    case ir::OpKind::Conv2dBackwardInput: return make<Pass::BackwardInput>(spec);
    case ir::OpKind::Conv2dBackwardWeight: return make<Pass::BackwardWeight>(spec);
    default: return std::nullopt;
  }
}

}  // namespace lazyrt::kernels
