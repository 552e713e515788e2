// Elementwise math kernels: transcendental functions, activations, rounding and clamp. Each op
// is a functor over the compute type; functors with attributes (gelu's form, softplus's beta)
// carry them as members, read once when the kernel is made.
//
// The formulas are PyTorch's CPU kernels' (torch 1.13), term for term, so results agree to
// the rounding of the libm calls: gelu is x * 0.5 * (1 + erf(x / sqrt 2)) or its tanh form,
// silu is x / (1 + exp(-x)), round is nearbyint (half to even).
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops.h"

namespace lazyrt::kernels {
namespace {

template <class C>
constexpr bool is_float_c = std::is_floating_point_v<C>;

struct SinF { template <class C> C operator()(C x) const { return std::sin(x); } };
struct CosF { template <class C> C operator()(C x) const { return std::cos(x); } };
struct Log1pF { template <class C> C operator()(C x) const { return std::log1p(x); } };
struct Expm1F { template <class C> C operator()(C x) const { return std::expm1(x); } };
struct ErfF { template <class C> C operator()(C x) const { return std::erf(x); } };
struct SiluF { template <class C> C operator()(C x) const { return x / (C(1) + std::exp(-x)); } };

struct GeluF {
  bool tanh_form;
  template <class C> C operator()(C x) const {
    if (tanh_form) {
      const C beta = C(M_SQRT2 * M_2_SQRTPI * 0.5);
      const C kappa = C(0.044715);
      const C inner = beta * (x + kappa * (x * x * x));
      return C(0.5) * x * (C(1) + std::tanh(inner));
    }
    return x * C(0.5) * (C(1) + std::erf(x * C(M_SQRT1_2)));
  }
};

// Linear above the threshold, where log1p(exp(beta x)) / beta equals x to working precision.
struct SoftplusF {
  double beta, threshold;
  template <class C> C operator()(C x) const {
    const C b = C(beta);
    return x * b > C(threshold) ? x : std::log1p(std::exp(x * b)) / b;
  }
};

// Rounding is the identity on integers.
struct FloorF {
  template <class C> C operator()(C x) const {
    if constexpr (is_float_c<C>) return std::floor(x);
    else return x;
  }
};
struct CeilF {
  template <class C> C operator()(C x) const {
    if constexpr (is_float_c<C>) return std::ceil(x);
    else return x;
  }
};
// nearbyint rounds halfway cases to even under the default rounding mode, as torch.round.
struct RoundF {
  template <class C> C operator()(C x) const {
    if constexpr (is_float_c<C>) return std::nearbyint(x);
    else return x;
  }
};
// sign(nan) is 0 and sign(-0.0) is +0, as in torch; sign of a bool is the bool.
struct SignF {
  template <class C> C operator()(C x) const {
    if constexpr (std::is_same_v<C, bool>) return x;
    else return static_cast<C>(static_cast<C>(C(0) < x) - static_cast<C>(x < C(0)));
  }
};

enum class Domain { Any, NotBool, Float };
template <Domain D, class T>
constexpr bool in_domain() {
  if constexpr (D == Domain::Float) return is_float_c<compute_t<T>>;
  else if constexpr (D == Domain::NotBool) return !std::is_same_v<T, bool>;
  else return true;
}

// out[i] = f(in[i]) over the whole tensor; in and out may be the same buffer.
template <Domain D, class F>
Kernel unary(const KernelSpec& s, F f) {
  const int64_t n = s.outputs[0].numel();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (!in_domain<D, T>()) {
      LAZYRT_ASSERT(false, "kernel ", ir::op_name(s.op), " made for ", dtype_name(s.inputs[0].dtype));
      return {};
    } else {
      using C = compute_t<T>;
      return {[n, f](const void* const* in, void* const* out) {
        const T* a = static_cast<const T*>(in[0]);
        T* o = static_cast<T*>(out[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = convert<T>(f.template operator()<C>(convert<C>(a[i])));
      }};
    }
  });
}

// PyTorch's clamp: min(max(x, lo), hi) with nan in x propagated. A nan bound gives nan, as
// torch's tensor-bound kernel does (the public op drops a lone nan scalar bound, which
// torch's one-bound kernels ignore).
template <class C>
C clamp_value(C x, C lo, C hi, bool has_min, bool has_max) {
  if constexpr (is_float_c<C>) {
    if ((has_min && lo != lo) || (has_max && hi != hi)) return std::numeric_limits<C>::quiet_NaN();
    if (x != x) return x;
  }
  if (has_min && x < lo) x = lo;
  if (has_max && x > hi) x = hi;
  return x;
}

}  // namespace

Kernel make_Sin(const KernelSpec& s) { return unary<Domain::Float>(s, SinF{}); }
Kernel make_Cos(const KernelSpec& s) { return unary<Domain::Float>(s, CosF{}); }
Kernel make_Log1p(const KernelSpec& s) { return unary<Domain::Float>(s, Log1pF{}); }
Kernel make_Expm1(const KernelSpec& s) { return unary<Domain::Float>(s, Expm1F{}); }
Kernel make_Erf(const KernelSpec& s) { return unary<Domain::Float>(s, ErfF{}); }
Kernel make_Silu(const KernelSpec& s) { return unary<Domain::Float>(s, SiluF{}); }
Kernel make_Gelu(const KernelSpec& s) { return unary<Domain::Float>(s, GeluF{s.attrs.b(0)}); }
Kernel make_Softplus(const KernelSpec& s) {
  return unary<Domain::Float>(s, SoftplusF{s.attrs.f(0), s.attrs.f(1)});
}
Kernel make_Floor(const KernelSpec& s) { return unary<Domain::NotBool>(s, FloorF{}); }
Kernel make_Ceil(const KernelSpec& s) { return unary<Domain::NotBool>(s, CeilF{}); }
Kernel make_Round(const KernelSpec& s) { return unary<Domain::NotBool>(s, RoundF{}); }
Kernel make_Sign(const KernelSpec& s) { return unary<Domain::Any>(s, SignF{}); }

Kernel make_Clamp(const KernelSpec& s) {
  auto layout = std::make_shared<const BroadcastLayout>(
      s.outputs[0].shape,
      std::vector<Shape>{s.inputs[0].shape, s.inputs[1].shape, s.inputs[2].shape});
  const bool has_min = s.attrs.b(0), has_max = s.attrs.b(1);
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      LAZYRT_ASSERT(false, "kernel clamp made for b8");
      return {};
    } else {
      using C = compute_t<T>;
      return {[layout, has_min, has_max](const void* const* in, void* const* out) {
        const T* x = static_cast<const T*>(in[0]);
        const T* lo = static_cast<const T*>(in[1]);
        const T* hi = static_cast<const T*>(in[2]);
        T* o = static_cast<T*>(out[0]);
        layout->for_each_run([&](const int64_t* off, int64_t n, const int64_t* st, int64_t oo) {
          for (int64_t i = 0; i < n; ++i)
            o[oo + i] = convert<T>(clamp_value<C>(convert<C>(x[off[0] + i * st[0]]),
                                                  convert<C>(lo[off[1] + i * st[1]]),
                                                  convert<C>(hi[off[2] + i * st[2]]), has_min, has_max));
        });
      }};
    }
  });
}

}  // namespace lazyrt::kernels
