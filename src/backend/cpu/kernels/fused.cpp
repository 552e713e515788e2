// The kernel of a fusion node: its region, a group of elementwise ops, run as one pass over
// the elements instead of one kernel per op.
//
// The region is turned, once, into a list of instructions, each a function pointer made for
// one op and dtype from the table of elementwise_fns.h. Running walks the output in blocks of
// kBlock elements (the runs of a BroadcastLayout over the operands, cut into blocks): for each
// block, operands are made available as arrays of compute values (contiguous operands of a
// compute-typed dtype are read in place, others are gathered or splatted), every instruction
// runs over the block, and the results are stored. Intermediate values live in small arrays
// on the stack, so they stay in cache and nothing is allocated.
//
// Values are exactly those of the one-op kernels: every op computes in the compute type of
// its dtype and rounds its result to that dtype (a 16-bit result is rounded to 16 bits before
// the next op reads it), as if each intermediate had been stored.
//
// Results are stored after all instructions of a block have run, and a block only reads the
// operand elements at its own positions, so a result may be written over an operand of the
// same shape (in place, or into a donated buffer).
//
// Where the graph's lowering gives a jit::Module, the region is also handed to the code
// generator (jit/jit.h): once the module is compiled, each run of the layout calls the
// generated loop instead of interpreting; until then, each run counts toward compiling it.
// Layouts with repeated operands stay interpreted.
//
// The interpreter is ElementwiseProgram (fused_program.h): fused reductions (fusion nodes with
// reduced dims, fused_rows.cpp) run their elementwise parts with it too.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>

#include "scalar/elementwise_fns.h"
#include "backend/cpu/kernels/fused_program.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/jit/jit.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)

using MicroFn = void (*)(const Instr& ins, void* const* r, int64_t n);

// One op over a block: r[dst][i] = f(r[src[0]][i], ...), i < n.
struct Instr {
  MicroFn fn = nullptr;
  int16_t dst = 0;
  int16_t src[3] = {0, 0, 0};
  alignas(8) unsigned char state[16] = {};  // the functor, with its attributes
};

namespace {

constexpr int64_t kBlock = 128;
constexpr size_t kSlotBytes = kBlock * 8;  // a block of the widest compute type
constexpr int kMaxValues = 160;            // region nodes: operands, constants and ops

template <class F>
const F& functor(const Instr& ins) {
  return *reinterpret_cast<const F*>(ins.state);
}

template <class E, class T>
inline void run_op_body(const Instr& ins, void* const* r, int64_t n) {
  using F = decltype(E::f);
  using C = compute_t<T>;
  using R = std::conditional_t<E::to_bool, bool, T>;
  using CR = compute_t<R>;
  const F& f = functor<F>(ins);
  CR* o = static_cast<CR*>(r[ins.dst]);
  const C* a = static_cast<const C*>(r[ins.src[0]]);
  if constexpr (E::arity == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = round_to<R>(convert<CR>(f.template operator()<C>(a[i])));
  } else if constexpr (E::arity == 2) {
    const C* b = static_cast<const C*>(r[ins.src[1]]);
    for (int64_t i = 0; i < n; ++i)
      o[i] = round_to<R>(convert<CR>(f.template operator()<C>(a[i], b[i])));
  } else {
    const C* b = static_cast<const C*>(r[ins.src[1]]);
    const C* c = static_cast<const C*>(r[ins.src[2]]);
    for (int64_t i = 0; i < n; ++i)
      o[i] = round_to<R>(convert<CR>(f.template operator()<C>(a[i], b[i], c[i])));
  }
}

// The instruction of op E on dtype T; over floating compute types, cloned per ISA (vmath.h).
template <class E, class T>
LAZYRT_ISA_CLONES void run_op_clones(const Instr& ins, void* const* r, int64_t n) {
  run_op_body<E, T>(ins, r, n);
}
template <class E, class T>
void run_op_plain(const Instr& ins, void* const* r, int64_t n) {
  run_op_body<E, T>(ins, r, n);
}
template <class E, class T>
MicroFn run_op() {
  if constexpr (std::is_floating_point_v<compute_t<T>>) return &run_op_clones<E, T>;
  else return &run_op_plain<E, T>;
}

// A compute value holds a From exactly; cast it as the one-op kernel casts the stored value.
template <class From, class To>
void run_cast(const Instr& ins, void* const* r, int64_t n) {
  const auto* a = static_cast<const compute_t<From>*>(r[ins.src[0]]);
  auto* o = static_cast<compute_t<To>*>(r[ins.dst]);
  for (int64_t i = 0; i < n; ++i)
    o[i] = convert<compute_t<To>>(convert<To>(convert<From>(a[i])));
}

// A floating where picks each value's bits with a mask made from the condition
// (vm::select_bits), so the loop vectorizes instead of branching per element.
template <class T>
inline void run_where_body(const Instr& ins, void* const* r, int64_t n) {
  using C = compute_t<T>;
  const auto* c = static_cast<const uint8_t*>(r[ins.src[0]]);  // bool: any non-zero byte is true
  const C* a = static_cast<const C*>(r[ins.src[1]]);
  const C* b = static_cast<const C*>(r[ins.src[2]]);
  C* o = static_cast<C*>(r[ins.dst]);
  for (int64_t i = 0; i < n; ++i) o[i] = vm::select_bits(c[i], a[i], b[i]);
}
template <class T>
LAZYRT_ISA_CLONES void run_where_clones(const Instr& ins, void* const* r, int64_t n) {
  run_where_body<T>(ins, r, n);
}
template <class T>
void run_where(const Instr& ins, void* const* r, int64_t n) {
  run_where_body<T>(ins, r, n);
}

// n compute values of an operand stored as T, from element `at` with element stride `stride`.
using LoadFn = void (*)(const void* base, int64_t at, int64_t stride, int64_t n, void* dst);
template <class T>
void load(const void* base, int64_t at, int64_t stride, int64_t n, void* dst) {
  const T* p = static_cast<const T*>(base) + at;
  auto* o = static_cast<compute_t<T>*>(dst);
  if (stride == 0) {
    std::fill(o, o + n, convert<compute_t<T>>(p[0]));
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = convert<compute_t<T>>(p[i * stride]);
  }
}

// n compute values of a repeated operand (BroadcastLayout::repeat): element j of its run is
// its element (j / rep) * group_stride past `at`; the values for j, j + 1, ..., j + n - 1.
using RepeatFn = void (*)(const void* base, int64_t at, int64_t group_stride, int64_t rep, int64_t j, int64_t n,
                          void* dst);
template <class T>
void load_repeat(const void* base, int64_t at, int64_t group_stride, int64_t rep, int64_t j, int64_t n,
                 void* dst) {
  const T* p = static_cast<const T*>(base) + at;
  auto* o = static_cast<compute_t<T>*>(dst);
  int64_t group = j / rep, left = rep - j % rep;
  for (int64_t i = 0; i < n; ++group, left = rep) {
    const int64_t take = std::min(left, n - i);
    std::fill(o + i, o + i + take, convert<compute_t<T>>(p[group * group_stride]));
    i += take;
  }
}

using StoreFn = void (*)(const void* src, void* base, int64_t at, int64_t n);
template <class T>
void store(const void* src, void* base, int64_t at, int64_t n) {
  const auto* s = static_cast<const compute_t<T>*>(src);
  T* o = static_cast<T*>(base) + at;
  for (int64_t i = 0; i < n; ++i) o[i] = convert<T>(s[i]);
}

}  // namespace

struct ElementwiseProgram::Operand {
  int16_t value;
  bool in_place;  // compute type == storage type: a contiguous run is read where it lies
  int64_t elem_bytes;
  LoadFn load;
  RepeatFn load_repeat;
};

struct ElementwiseProgram::Result {
  int16_t value;
  StoreFn store;
};

void ElementwiseProgram::run(const void* const* in, const int64_t* off, const int64_t* st, int64_t n,
                             void* const* out, int64_t oo, const BroadcastLayout* repeats, int64_t run_pos) const {
  alignas(64) unsigned char slots[kMaxFusedOps + kMaxFusedInputs][kSlotBytes];
  void* r[kMaxValues];
  for (size_t t = 0; t < temps_.size(); ++t) r[temps_[t]] = slots[t];
  for (const auto& [v, block] : constants_) r[v] = const_cast<void*>(block);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (size_t k = 0; k < operands_.size(); ++k) {
      const Operand& o = operands_[k];
      if (repeats && repeats->repeat[k] > 1) {
        r[o.value] = slots[temps_.size() + k];
        o.load_repeat(in[k], off[k], repeats->group_stride[k], repeats->repeat[k], run_pos + b, m, r[o.value]);
      } else if (o.in_place && st[k] == 1) {
        r[o.value] = const_cast<char*>(static_cast<const char*>(in[k])) + (off[k] + b) * o.elem_bytes;
      } else {
        r[o.value] = slots[temps_.size() + k];
        o.load(in[k], off[k] + b * st[k], st[k], m, r[o.value]);
      }
    }
    for (const Instr& ins : code_) ins.fn(ins, r, m);
    for (size_t j = 0; j < results_.size(); ++j) results_[j].store(r[results_[j].value], out[j], oo + b, m);
  }
}

ElementwiseProgram::~ElementwiseProgram() = default;
size_t ElementwiseProgram::num_ops() const { return code_.size(); }

namespace {

// The fusion kernel: the program over the layout of its operands against its shape, or the
// generated loop once there is one.
struct Program {
  std::unique_ptr<BroadcastLayout> layout;
  std::unique_ptr<ElementwiseProgram> program;
  std::shared_ptr<jit::Module> generated;  // with the region's index in it, or null
  int generated_index = -1;

  void run(const void* const* in, void* const* out) const;
};

void Program::run(const void* const* in, void* const* out) const {
  if (generated) {
    if (jit::FusedFn fn = generated->fn(generated_index)) {
      layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t*, int64_t oo) { fn(in, off, out, oo, n); });
      return;
    }
    generated->ran_interpreted(generated, generated_index, layout->numel * static_cast<int64_t>(program->num_ops()));
  }
  const int64_t run = layout->shape.empty() ? 1 : layout->shape.back();
  const BroadcastLayout* repeats = layout->repeat.empty() ? nullptr : layout.get();
  layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t* st, int64_t oo) {
    program->run(in, off, st, n, out, oo, repeats, oo % run);
  });
}

// The instruction of region node `n`, whose operands are the values `src`.
Instr make_instr(const ir::Graph& region, const ir::Node& n, int16_t dst) {
  Instr ins;
  ins.dst = dst;
  for (size_t k = 0; k < n.operands.size(); ++k) ins.src[k] = static_cast<int16_t>(n.operands[k].node);
  const DType in = region.type(n.operands[0]).dtype;
  if (n.op == ir::OpKind::Cast) {
    visit_dtype(in, [&](auto from) {
      visit_dtype(n.results[0].dtype, [&](auto to) {
        ins.fn = &run_cast<decltype(from), decltype(to)>;
      });
    });
    return ins;
  }
  if (n.op == ir::OpKind::Where) {
    visit_dtype(region.type(n.operands[1]).dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<compute_t<T>>) ins.fn = &run_where_clones<T>;
      else ins.fn = &run_where<T>;
    });
    return ins;
  }
  visit_elementwise(n.op, n.attrs, [&](const auto& e) {
    using E = std::decay_t<decltype(e)>;
    static_assert(sizeof(e.f) <= sizeof(ins.state) && std::is_trivially_copyable_v<decltype(e.f)>);
    std::memcpy(ins.state, &e.f, sizeof(e.f));
    visit_dtype(in, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (in_domain<E::domain, T>()) ins.fn = run_op<E, T>();
    });
  });
  LAZYRT_ASSERT(ins.fn, "fused ", ir::op_name(n.op), " made for ", dtype_name(in));
  return ins;
}

}  // namespace

ElementwiseProgram::ElementwiseProgram(const ir::Graph& region) {
  LAZYRT_ASSERT(region.nodes.size() <= static_cast<size_t>(kMaxValues), "fusion region too large: ",
                region.nodes.size(), " nodes");
  operands_.resize(static_cast<size_t>(region.num_params));
  std::vector<std::pair<int16_t, const ir::Node*>> constants;
  for (size_t i = 0; i < region.nodes.size(); ++i) {
    const ir::Node& n = region.nodes[i];
    const auto v = static_cast<int16_t>(i);
    const DType dtype = n.results[0].dtype;
    if (n.op == ir::OpKind::Parameter) {
      const int64_t index = ir::NodeAttrs(n.op, n.attrs).i<"index">();
      visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        operands_[index] = {v, std::is_same_v<T, compute_t<T>>, static_cast<int64_t>(sizeof(T)), &load<T>,
                            &load_repeat<T>};
      });
    } else if (n.op == ir::OpKind::Full) {
      constants.emplace_back(v, &n);
    } else {
      temps_.push_back(v);
      code_.push_back(make_instr(region, n, v));
    }
  }
  // Every op and operand has a block of the stack (run): a fusion node has at most
  // kMaxFusedOps ops and kMaxFusedInputs operands, and a fused reduction's programs no more
  // values than its group.
  LAZYRT_ASSERT(temps_.size() + operands_.size() <= static_cast<size_t>(kMaxFusedOps + kMaxFusedInputs),
                "fused program of ", temps_.size(), " ops and ", operands_.size(), " operands exceeds ",
                kMaxFusedOps + kMaxFusedInputs, " values");
  constant_blocks_ = std::make_unique<double[]>(constants.size() * kBlock);
  for (size_t c = 0; c < constants.size(); ++c) {
    const ir::Node& n = *constants[c].second;
    double* block = constant_blocks_.get() + c * kBlock;
    const double value = ir::NodeAttrs(n.op, n.attrs).f<"value">();
    visit_dtype(n.results[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      std::fill_n(reinterpret_cast<compute_t<T>*>(block), kBlock, convert<compute_t<T>>(convert<T>(value)));
    });
    constants_.emplace_back(constants[c].first, block);
  }
  for (ir::ValueRef v : region.outputs)
    visit_dtype(region.type(v).dtype, [&](auto tag) {
      results_.push_back({static_cast<int16_t>(v.node), &store<decltype(tag)>});
    });
}

Kernel make_fused(const ir::Graph& region, const std::vector<ir::TensorType>& inputs,
                  const std::vector<ir::TensorType>& outputs, const ir::Attrs& attrs,
                  const std::shared_ptr<jit::Module>& module) {
  LAZYRT_ASSERT(!outputs.empty() && inputs.size() <= static_cast<size_t>(kMaxFusedInputs),
                "fusion of ", inputs.size(), " operands");
  const ir::NodeAttrs a(ir::OpKind::Fusion, attrs);
  if (a.i<"reduced">() > 0) return make_fused_rows(region, inputs, outputs, attrs, module);
  auto p = std::make_shared<Program>();
  std::vector<Shape> shapes;
  for (const auto& t : inputs) shapes.push_back(t.shape);
  // Short runs (a per-channel operand against small planes) are merged across channels, so
  // blocks stay kBlock long instead of one short run each.
  p->layout = std::make_unique<BroadcastLayout>(a.ints<"shape">(), shapes, kBlock);
  p->program = std::make_unique<ElementwiseProgram>(region);
  if (module && p->layout->repeat.empty()) {
    const size_t rank = p->layout->shape.size();
    jit::FusedRegion r{region, {}, std::nullopt};
    for (const auto& st : p->layout->strides) r.inner_strides.push_back(rank ? st[rank - 1] : 0);
    p->generated_index = module->add(std::move(r));
    if (p->generated_index >= 0) p->generated = module;
  }
  return {[p](const void* const* in, void* const* out) { p->run(in, out); }};
}

}  // namespace lazyrt::kernels
