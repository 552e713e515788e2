// One-op elementwise kernels: the functions of elementwise_fns.h inside loops that broadcast
// with BroadcastLayout, and where, cast and fill.
#include <cmath>
#include <cstring>
#include <limits>

#include "scalar/elementwise_fns.h"
#include "backend/cpu/kernels/kernel.h"
#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)

BroadcastLayout::BroadcastLayout(const Shape& out, const std::vector<Shape>& inputs, int64_t repeat_runs_below) {
  LAZYRT_ASSERT(inputs.size() <= 8, "too many elementwise inputs");
  LAZYRT_ASSERT(out.size() <= static_cast<size_t>(kMaxRank), "rank ", out.size(),
                " exceeds the kernel limit ", kMaxRank);
  numel = shape_numel(out);
  const size_t rank = out.size();
  std::vector<std::vector<int64_t>> full(inputs.size(), std::vector<int64_t>(rank, 0));
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Shape& in = inputs[k];
    LAZYRT_ASSERT(in.size() <= rank, "input rank above output rank");
    int64_t stride = 1;
    for (size_t j = in.size(); j-- > 0;) {
      size_t d = rank - in.size() + j;
      full[k][d] = in[j] == 1 ? 0 : stride;
      stride *= in[j];
    }
  }
  strides.assign(inputs.size(), {});
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    bool merge = !shape.empty();
    if (merge) {
      for (size_t k = 0; k < inputs.size(); ++k)
        if (strides[k].back() != full[k][d] * out[d]) merge = false;
    }
    if (merge) {
      shape.back() *= out[d];
      for (size_t k = 0; k < inputs.size(); ++k) strides[k].back() = full[k][d];
    } else {
      shape.push_back(out[d]);
      for (size_t k = 0; k < inputs.size(); ++k) strides[k].push_back(full[k][d]);
    }
  }
  if (shape.size() < 2 || shape.back() >= repeat_runs_below) return;
  const size_t last = shape.size() - 1;
  auto repeated = [&](size_t k) { return strides[k][last] == 0 && strides[k][last - 1] != 0; };
  bool any = false;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!repeated(k) && strides[k][last - 1] != strides[k][last] * shape[last]) return;
    any = any || repeated(k);
  }
  if (!any) return;
  repeat.assign(inputs.size(), 1);
  group_stride.assign(inputs.size(), 0);
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (repeated(k)) {
      repeat[k] = shape[last];
      group_stride[k] = strides[k][last - 1];
      strides[k][last - 1] = 0;
    } else {
      strides[k][last - 1] = strides[k][last];
    }
    strides[k].pop_back();
  }
  shape[last - 1] *= shape[last];
  shape.pop_back();
}

namespace {

// ---- loops ------------------------------------------------------------------------------
// o[i] = f(a[i]) for i < n, in the compute type C.
template <class C, class T, class R, class F>
inline void map1_body(const T* a, R* o, int64_t n, const F& f) {
  for (int64_t i = 0; i < n; ++i) o[i] = convert<R>(f.template operator()<C>(convert<C>(a[i])));
}
template <class C, class T, class R, class F>
LAZYRT_ISA_CLONES void map1_clones(const T* a, R* o, int64_t n, const F& f) {
  map1_body<C>(a, o, n, f);
}
template <class C, class T, class R, class F>
void map1(const T* a, R* o, int64_t n, const F& f) {
  if constexpr (std::is_floating_point_v<C>) map1_clones<C>(a, o, n, f);
  else map1_body<C>(a, o, n, f);
}

// o[i] = f(a[i * sa], b[i * sb]) for i < n, in the compute type C; unit and zero strides get
// loops of their own.
template <class C, class T, class R, class F>
inline void map2_body(const T* a, int64_t sa, const T* b, int64_t sb, R* o, int64_t n, const F& f) {
  auto op = [&f](C x, C y) { return convert<R>(f.template operator()<C>(x, y)); };
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = op(convert<C>(a[i]), convert<C>(b[i]));
  } else if (sa == 1 && sb == 0) {
    const C vb = convert<C>(b[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = op(convert<C>(a[i]), vb);
  } else if (sa == 0 && sb == 1) {
    const C va = convert<C>(a[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = op(va, convert<C>(b[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = op(convert<C>(a[i * sa]), convert<C>(b[i * sb]));
  }
}
template <class C, class T, class R, class F>
LAZYRT_ISA_CLONES void map2_clones(const T* a, int64_t sa, const T* b, int64_t sb, R* o, int64_t n, const F& f) {
  map2_body<C>(a, sa, b, sb, o, n, f);
}
template <class C, class T, class R, class F>
void map2(const T* a, int64_t sa, const T* b, int64_t sb, R* o, int64_t n, const F& f) {
  if constexpr (std::is_floating_point_v<C>) map2_clones<C>(a, sa, b, sb, o, n, f);
  else map2_body<C>(a, sa, b, sb, o, n, f);
}

template <class E, class T>
Kernel unary(const KernelSpec& s, const E& e) {
  using C = compute_t<T>;
  using R = std::conditional_t<E::to_bool, bool, T>;
  const int64_t n = s.outputs[0].numel();
  return {[n, f = e.f](const void* const* in, void* const* out) {
    const T* a = static_cast<const T*>(in[0]);
    R* o = static_cast<R*>(out[0]);
    parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) { map1<C>(a + b, o + b, e - b, f); });
  }};
}

template <class E, class T>
Kernel binary(const KernelSpec& s, const E& e) {
  using C = compute_t<T>;
  using R = std::conditional_t<E::to_bool, bool, T>;
  auto layout = std::make_shared<const BroadcastLayout>(
      s.outputs[0].shape, std::vector<Shape>{s.inputs[0].shape, s.inputs[1].shape});
  return {[layout, f = e.f](const void* const* in, void* const* out) {
    const T* a = static_cast<const T*>(in[0]);
    const T* b = static_cast<const T*>(in[1]);
    R* o = static_cast<R*>(out[0]);
    layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t* st, int64_t oo) {
      map2<C>(a + off[0], st[0], b + off[1], st[1], o + oo, n, f);
    });
  }};
}

template <class E, class T>
Kernel ternary(const KernelSpec& s, const E& e) {
  using C = compute_t<T>;
  auto layout = std::make_shared<const BroadcastLayout>(
      s.outputs[0].shape,
      std::vector<Shape>{s.inputs[0].shape, s.inputs[1].shape, s.inputs[2].shape});
  return {[layout, f = e.f](const void* const* in, void* const* out) {
    const T* x = static_cast<const T*>(in[0]);
    const T* y = static_cast<const T*>(in[1]);
    const T* z = static_cast<const T*>(in[2]);
    T* o = static_cast<T*>(out[0]);
    layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t* st, int64_t oo) {
      for (int64_t i = 0; i < n; ++i)
        o[oo + i] = convert<T>(f.template operator()<C>(convert<C>(x[off[0] + i * st[0]]),
                                                        convert<C>(y[off[1] + i * st[1]]),
                                                        convert<C>(z[off[2] + i * st[2]])));
    });
  }};
}

// The one-op kernel of an elementwise op of the table in elementwise_fns.h.
Kernel elementwise(const KernelSpec& s) {
  return visit_elementwise(s.op, s.attrs, [&](const auto& e) -> Kernel {
    using E = std::decay_t<decltype(e)>;
    return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
      using T = decltype(tag);
      if constexpr (!in_domain<E::domain, T>()) {
        LAZYRT_ASSERT(false, "kernel ", ir::op_name(s.op), " made for ", dtype_name(s.inputs[0].dtype));
        return {};
      } else if constexpr (E::arity == 1) {
        return unary<E, T>(s, e);
      } else if constexpr (E::arity == 2) {
        return binary<E, T>(s, e);
      } else {
        return ternary<E, T>(s, e);
      }
    });
  });
}

}  // namespace

// One maker per row of the scalar-function list (elementwise_fns.h).
#define LAZYRT_ELEMENTWISE(Op, ...) \
  Kernel make_##Op(const KernelSpec& s) { return elementwise(s); }
LAZYRT_ELEMENTWISE_FNS(LAZYRT_ELEMENTWISE)
#undef LAZYRT_ELEMENTWISE

// where over one run: each value's bits picked by the condition byte (vm::select_bits), a loop
// that vectorizes where a branch per element would mispredict on a mask of mixed signs. Strides
// 1 (or 0, a broadcast value) take a loop of their own, cloned per ISA.
template <class T>
inline void where_run_body(const uint8_t* c, int64_t sc, const T* a, int64_t sa, const T* b, int64_t sb, T* o,
                           int64_t n) {
  if (sc == 1 && sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = vm::select_bits(c[i], a[i], b[i]);
  } else if (sc == 1 && sa == 0 && sb == 1) {
    const T va = a[0];
    for (int64_t i = 0; i < n; ++i) o[i] = vm::select_bits(c[i], va, b[i]);
  } else if (sc == 1 && sa == 1 && sb == 0) {
    const T vb = b[0];
    for (int64_t i = 0; i < n; ++i) o[i] = vm::select_bits(c[i], a[i], vb);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = vm::select_bits(c[i * sc], a[i * sa], b[i * sb]);
  }
}
template <class T>
LAZYRT_ISA_CLONES void where_run_clones(const uint8_t* c, int64_t sc, const T* a, int64_t sa, const T* b, int64_t sb,
                                        T* o, int64_t n) {
  where_run_body(c, sc, a, sa, b, sb, o, n);
}

Kernel make_Where(const KernelSpec& s) {
  auto layout = std::make_shared<const BroadcastLayout>(
      s.outputs[0].shape,
      std::vector<Shape>{s.inputs[0].shape, s.inputs[1].shape, s.inputs[2].shape});
  return visit_dtype(s.inputs[1].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[layout](const void* const* in, void* const* out) {
      const auto* c = static_cast<const uint8_t*>(in[0]);  // bool: any non-zero byte is true
      const T* a = static_cast<const T*>(in[1]);
      const T* b = static_cast<const T*>(in[2]);
      T* o = static_cast<T*>(out[0]);
      layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t* st, int64_t oo) {
        if constexpr (std::is_floating_point_v<compute_t<T>>)
          where_run_clones(c + off[0], st[0], a + off[1], st[1], b + off[2], st[2], o + oo, n);
        else
          where_run_body(c + off[0], st[0], a + off[1], st[1], b + off[2], st[2], o + oo, n);
      });
    }};
  });
}

Kernel make_Cast(const KernelSpec& s) {
  const int64_t n = s.outputs[0].numel();
  return visit_dtype(s.inputs[0].dtype, [&](auto from_tag) -> Kernel {
    using From = decltype(from_tag);
    return visit_dtype(s.outputs[0].dtype, [&](auto to_tag) -> Kernel {
      using To = decltype(to_tag);
      return {[n](const void* const* in, void* const* out) {
        const From* a = static_cast<const From*>(in[0]);
        To* o = static_cast<To*>(out[0]);
        parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) o[i] = convert<To>(a[i]);
        });
      }};
    });
  });
}

Kernel make_Full(const KernelSpec& s) {
  const double value = ir::NodeAttrs(s.op, s.attrs).f<"value">();
  const DType dtype = s.outputs[0].dtype;
  const int64_t n = s.outputs[0].numel();
  return {[value, dtype, n](const void* const*, void* const* out) { fill_elements(out[0], dtype, value, n); }};
}

Kernel make_Iota(const KernelSpec& s) {
  const int64_t n = s.outputs[0].numel();
  return visit_dtype(s.outputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[n](const void* const*, void* const* out) {
      T* o = static_cast<T*>(out[0]);
      parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = convert<T>(i);
      });
    }};
  });
}

Kernel make_Parameter(const KernelSpec&) {
  LAZYRT_ASSERT(false, "parameters are bound, not computed: they have no kernel");
}

Kernel make_Fusion(const KernelSpec&) {
  LAZYRT_ASSERT(false, "fusion is lowered by the compiler (control_flow.cpp), not a kernel");
}

Kernel make_Call(const KernelSpec&) {
  LAZYRT_ASSERT(false, "call is inlined by the compiler (compile::inline_calls), not a kernel");
}

Kernel make_While(const KernelSpec&) {
  LAZYRT_ASSERT(false, "while is lowered by the compiler (control_flow.cpp), not a kernel");
}

Kernel make_Scan(const KernelSpec&) {
  LAZYRT_ASSERT(false, "scan is lowered by the compiler (control_flow.cpp), not a kernel");
}

Kernel make_ScanVjp(const KernelSpec&) {
  LAZYRT_ASSERT(false, "scan_vjp is lowered by the compiler (control_flow.cpp), not a kernel");
}

}  // namespace lazyrt::kernels
