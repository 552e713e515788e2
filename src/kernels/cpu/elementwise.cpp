// Elementwise kernels: unary, binary, comparisons, where, cast and fill. Each op is a small
// functor over the compute type; the loops around it come from BroadcastLayout.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/kernel.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops.h"

namespace lazyrt::kernels {

BroadcastLayout::BroadcastLayout(const Shape& out, const std::vector<Shape>& inputs) {
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
}

namespace {

template <class T>
constexpr bool is_float_v = std::is_floating_point_v<compute_t<T>>;

// ---- functors ---------------------------------------------------------------------------
struct NegF { template <class C> static C f(C x) { return -x; } };
struct AbsF { template <class C> static C f(C x) { return x < C(0) ? C(-x) : x; } };
struct ExpF { template <class C> static C f(C x) { return std::exp(x); } };
struct LogF { template <class C> static C f(C x) { return std::log(x); } };
struct SqrtF { template <class C> static C f(C x) { return std::sqrt(x); } };
struct RsqrtF { template <class C> static C f(C x) { return C(1) / std::sqrt(x); } };
struct ReluF {
  template <class C> static C f(C x) { return x != x ? x : (x > C(0) ? x : C(0)); }
};
struct SigmoidF { template <class C> static C f(C x) { return C(1) / (C(1) + std::exp(-x)); } };
struct TanhF { template <class C> static C f(C x) { return std::tanh(x); } };
struct IsNanF { template <class C> static bool f(C x) { return x != x; } };
struct LogicalNotF { template <class C> static bool f(C x) { return x == C(0); } };

struct AddF { template <class C> static C f(C a, C b) { return a + b; } };
struct SubF { template <class C> static C f(C a, C b) { return a - b; } };
struct MulF {
  template <class C> static C f(C a, C b) {
    if constexpr (std::is_same_v<C, bool>) return a && b;
    else return a * b;
  }
};
struct DivF { template <class C> static C f(C a, C b) { return a / b; } };
struct PowF {
  template <class C> static C f(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      return std::pow(a, b);
    } else {
      // Integer power by squaring; a negative exponent truncates toward zero as in PyTorch.
      if (b < 0) return a == 1 ? C(1) : a == -1 ? C((b % 2 == 0) ? 1 : -1) : C(0);
      C r = 1, base = a;
      for (auto e = b; e > 0; e >>= 1) {
        if (e & 1) r = static_cast<C>(r * base);
        base = static_cast<C>(base * base);
      }
      return r;
    }
  }
};
struct MaximumF {
  template <class C> static C f(C a, C b) { return a != a ? a : b != b ? b : (a > b ? a : b); }
};
struct MinimumF {
  template <class C> static C f(C a, C b) { return a != a ? a : b != b ? b : (a < b ? a : b); }
};
struct EqF { template <class C> static bool f(C a, C b) { return a == b; } };
struct NeF { template <class C> static bool f(C a, C b) { return a != b; } };
struct LtF { template <class C> static bool f(C a, C b) { return a < b; } };
struct LeF { template <class C> static bool f(C a, C b) { return a <= b; } };
struct GtF { template <class C> static bool f(C a, C b) { return a > b; } };
struct GeF { template <class C> static bool f(C a, C b) { return a >= b; } };
struct AndF { template <class C> static bool f(C a, C b) { return a != C(0) && b != C(0); } };
struct OrF { template <class C> static bool f(C a, C b) { return a != C(0) || b != C(0); } };

// Which storage types a functor is instantiated for; the result rules reject the others
// before a kernel is ever made.
enum class Domain { Any, NotBool, Float };
template <Domain D, class T>
constexpr bool in_domain() {
  if constexpr (D == Domain::Float) return is_float_v<T>;
  else if constexpr (D == Domain::NotBool) return !std::is_same_v<T, bool>;
  else return true;
}

// ---- makers -----------------------------------------------------------------------------
template <class F, Domain D, bool kToBool>
Kernel unary(const KernelSpec& s) {
  const int64_t n = s.outputs[0].numel();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (!in_domain<D, T>()) {
      LAZYRT_ASSERT(false, "kernel ", ir::op_name(s.op), " made for ", dtype_name(s.inputs[0].dtype));
      return {};
    } else {
      using C = compute_t<T>;
      using R = std::conditional_t<kToBool, bool, T>;
      return {[n](const void* const* in, void* const* out) {
        const T* a = static_cast<const T*>(in[0]);
        R* o = static_cast<R*>(out[0]);
        parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) o[i] = convert<R>(F::template f<C>(convert<C>(a[i])));
        });
      }};
    }
  });
}

template <class F, Domain D, bool kToBool>
Kernel binary(const KernelSpec& s) {
  auto layout = std::make_shared<const BroadcastLayout>(
      s.outputs[0].shape, std::vector<Shape>{s.inputs[0].shape, s.inputs[1].shape});
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (!in_domain<D, T>()) {
      LAZYRT_ASSERT(false, "kernel ", ir::op_name(s.op), " made for ", dtype_name(s.inputs[0].dtype));
      return {};
    } else {
      using C = compute_t<T>;
      using R = std::conditional_t<kToBool, bool, T>;
      return {[layout](const void* const* in, void* const* out) {
        const T* a = static_cast<const T*>(in[0]);
        const T* b = static_cast<const T*>(in[1]);
        R* o = static_cast<R*>(out[0]);
        layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t* st, int64_t oo) {
          const T* pa = a + off[0];
          const T* pb = b + off[1];
          R* po = o + oo;
          if (st[0] == 1 && st[1] == 1) {
            for (int64_t i = 0; i < n; ++i)
              po[i] = convert<R>(F::template f<C>(convert<C>(pa[i]), convert<C>(pb[i])));
          } else if (st[0] == 1 && st[1] == 0) {
            const C vb = convert<C>(pb[0]);
            for (int64_t i = 0; i < n; ++i) po[i] = convert<R>(F::template f<C>(convert<C>(pa[i]), vb));
          } else if (st[0] == 0 && st[1] == 1) {
            const C va = convert<C>(pa[0]);
            for (int64_t i = 0; i < n; ++i) po[i] = convert<R>(F::template f<C>(va, convert<C>(pb[i])));
          } else {
            for (int64_t i = 0; i < n; ++i)
              po[i] = convert<R>(
                  F::template f<C>(convert<C>(pa[i * st[0]]), convert<C>(pb[i * st[1]])));
          }
        });
      }};
    }
  });
}

}  // namespace

#define LAZYRT_UNARY(Enum, F, D, ToBool) \
  Kernel make_##Enum(const KernelSpec& s) { return unary<F, Domain::D, ToBool>(s); }
#define LAZYRT_BINARY(Enum, F, D, ToBool) \
  Kernel make_##Enum(const KernelSpec& s) { return binary<F, Domain::D, ToBool>(s); }

LAZYRT_UNARY(Neg, NegF, NotBool, false)
LAZYRT_UNARY(Abs, AbsF, NotBool, false)
LAZYRT_UNARY(Exp, ExpF, Float, false)
LAZYRT_UNARY(Log, LogF, Float, false)
LAZYRT_UNARY(Sqrt, SqrtF, Float, false)
LAZYRT_UNARY(Rsqrt, RsqrtF, Float, false)
LAZYRT_UNARY(Relu, ReluF, NotBool, false)
LAZYRT_UNARY(Sigmoid, SigmoidF, Float, false)
LAZYRT_UNARY(Tanh, TanhF, Float, false)
LAZYRT_UNARY(IsNan, IsNanF, Any, true)
LAZYRT_UNARY(LogicalNot, LogicalNotF, Any, true)

LAZYRT_BINARY(Add, AddF, Any, false)
LAZYRT_BINARY(Sub, SubF, NotBool, false)
LAZYRT_BINARY(Mul, MulF, Any, false)
LAZYRT_BINARY(Div, DivF, Float, false)
LAZYRT_BINARY(Pow, PowF, NotBool, false)
LAZYRT_BINARY(Maximum, MaximumF, Any, false)
LAZYRT_BINARY(Minimum, MinimumF, Any, false)
LAZYRT_BINARY(Eq, EqF, Any, true)
LAZYRT_BINARY(Ne, NeF, Any, true)
LAZYRT_BINARY(Lt, LtF, Any, true)
LAZYRT_BINARY(Le, LeF, Any, true)
LAZYRT_BINARY(Gt, GtF, Any, true)
LAZYRT_BINARY(Ge, GeF, Any, true)
LAZYRT_BINARY(LogicalAnd, AndF, Any, true)
LAZYRT_BINARY(LogicalOr, OrF, Any, true)

#undef LAZYRT_UNARY
#undef LAZYRT_BINARY

Kernel make_Where(const KernelSpec& s) {
  auto layout = std::make_shared<const BroadcastLayout>(
      s.outputs[0].shape,
      std::vector<Shape>{s.inputs[0].shape, s.inputs[1].shape, s.inputs[2].shape});
  return visit_dtype(s.inputs[1].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[layout](const void* const* in, void* const* out) {
      const bool* c = static_cast<const bool*>(in[0]);
      const T* a = static_cast<const T*>(in[1]);
      const T* b = static_cast<const T*>(in[2]);
      T* o = static_cast<T*>(out[0]);
      layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t* st, int64_t oo) {
        for (int64_t i = 0; i < n; ++i)
          o[oo + i] = c[off[0] + i * st[0]] ? a[off[1] + i * st[1]] : b[off[2] + i * st[2]];
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

void fill(void* dst, DType dtype, double value, int64_t n) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v = convert<T>(value);
    T* o = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  });
}

Kernel make_Full(const KernelSpec& s) {
  const double value = s.attrs.f(0);
  const DType dtype = s.outputs[0].dtype;
  const int64_t n = s.outputs[0].numel();
  return {[value, dtype, n](const void* const*, void* const* out) { fill(out[0], dtype, value, n); }};
}

Kernel make_Parameter(const KernelSpec&) {
  LAZYRT_ASSERT(false, "parameters are bound, not computed: they have no kernel");
}

Kernel make_While(const KernelSpec&) {
  LAZYRT_ASSERT(false, "while is lowered by the compiler (control_flow.cpp), not a kernel");
}

}  // namespace lazyrt::kernels
