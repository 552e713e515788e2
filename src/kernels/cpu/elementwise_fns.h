// The scalar functions of the elementwise ops, and the one table that maps an elementwise op
// of ops.def to its function. Both the one-op kernels (elementwise.cpp) and the fused kernel
// (fused.cpp) are built from this table, so an op computes the same values whichever runs it.
//
// A function is a small functor over the compute type C (float for the 16-bit dtypes, the
// storage type otherwise); functors with attributes (gelu's form, softplus's beta) carry them
// as members, read once when a kernel is made. Formulas follow PyTorch's CPU kernels (torch
// 1.13) term for term, so results agree to the rounding of the libm calls.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "ir/graph.h"
#include "kernels/cpu/loops.h"
#include "util/check.h"

namespace lazyrt::kernels {

template <class C>
constexpr bool is_float_c = std::is_floating_point_v<C>;

// ---- unary ------------------------------------------------------------------------------
struct NegF { template <class C> C operator()(C x) const { return -x; } };
struct AbsF { template <class C> C operator()(C x) const { return x < C(0) ? C(-x) : x; } };
struct ExpF { template <class C> C operator()(C x) const { return std::exp(x); } };
struct LogF { template <class C> C operator()(C x) const { return std::log(x); } };
struct SqrtF { template <class C> C operator()(C x) const { return std::sqrt(x); } };
struct RsqrtF { template <class C> C operator()(C x) const { return C(1) / std::sqrt(x); } };
struct ReluF {
  template <class C> C operator()(C x) const { return x != x ? x : (x > C(0) ? x : C(0)); }
};
struct SigmoidF {
  template <class C> C operator()(C x) const { return C(1) / (C(1) + std::exp(-x)); }
};
struct TanhF { template <class C> C operator()(C x) const { return std::tanh(x); } };
struct IsNanF { template <class C> bool operator()(C x) const { return x != x; } };
struct LogicalNotF { template <class C> bool operator()(C x) const { return x == C(0); } };
struct SinF { template <class C> C operator()(C x) const { return std::sin(x); } };
struct CosF { template <class C> C operator()(C x) const { return std::cos(x); } };
struct Log1pF { template <class C> C operator()(C x) const { return std::log1p(x); } };
struct Expm1F { template <class C> C operator()(C x) const { return std::expm1(x); } };
struct ErfF { template <class C> C operator()(C x) const { return std::erf(x); } };
// silu is x / (1 + exp(-x)).
struct SiluF { template <class C> C operator()(C x) const { return x / (C(1) + std::exp(-x)); } };

// gelu is x * 0.5 * (1 + erf(x / sqrt 2)), or its tanh form.
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

// ---- binary -----------------------------------------------------------------------------
struct AddF { template <class C> C operator()(C a, C b) const { return a + b; } };
struct SubF { template <class C> C operator()(C a, C b) const { return a - b; } };
struct MulF {
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, bool>) return a && b;
    else return a * b;
  }
};
struct DivF { template <class C> C operator()(C a, C b) const { return a / b; } };
struct PowF {
  template <class C> C operator()(C a, C b) const {
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
  template <class C> C operator()(C a, C b) const { return a != a ? a : b != b ? b : (a > b ? a : b); }
};
struct MinimumF {
  template <class C> C operator()(C a, C b) const { return a != a ? a : b != b ? b : (a < b ? a : b); }
};
struct EqF { template <class C> bool operator()(C a, C b) const { return a == b; } };
struct NeF { template <class C> bool operator()(C a, C b) const { return a != b; } };
struct LtF { template <class C> bool operator()(C a, C b) const { return a < b; } };
struct LeF { template <class C> bool operator()(C a, C b) const { return a <= b; } };
struct GtF { template <class C> bool operator()(C a, C b) const { return a > b; } };
struct GeF { template <class C> bool operator()(C a, C b) const { return a >= b; } };
struct AndF { template <class C> bool operator()(C a, C b) const { return a != C(0) && b != C(0); } };
struct OrF { template <class C> bool operator()(C a, C b) const { return a != C(0) || b != C(0); } };

// ---- ternary ----------------------------------------------------------------------------
// PyTorch's clamp: min(max(x, lo), hi) with nan in x propagated. A nan bound gives nan, as
// torch's tensor-bound kernel does (the public op drops a lone nan scalar bound, which
// torch's one-bound kernels ignore).
struct ClampF {
  bool has_min, has_max;
  template <class C> C operator()(C x, C lo, C hi) const {
    if constexpr (is_float_c<C>) {
      if ((has_min && lo != lo) || (has_max && hi != hi)) return std::numeric_limits<C>::quiet_NaN();
      if (x != x) return x;
    }
    if (has_min && x < lo) x = lo;
    if (has_max && x > hi) x = hi;
    return x;
  }
};

// ---- the table --------------------------------------------------------------------------
// Which storage types a function is instantiated for; the result rules reject the others
// before a kernel is ever made.
enum class Domain { Any, NotBool, Float };
template <Domain D, class T>
constexpr bool in_domain() {
  if constexpr (D == Domain::Float) return is_float_c<compute_t<T>>;
  else if constexpr (D == Domain::NotBool) return !std::is_same_v<T, bool>;
  else return true;
}

/// An elementwise op's function with its facts: arity, domain, and whether it returns b8.
template <class F, int kArity, Domain D, bool kToBool>
struct ElementwiseFn {
  static constexpr int arity = kArity;
  static constexpr Domain domain = D;
  static constexpr bool to_bool = kToBool;
  F f;
};

/// Calls v(ElementwiseFn<...>{functor}) for an elementwise op of ops.def other than cast and
/// where (whose operands differ in dtype: their kernels are written out). Asserts on others.
template <class V>
decltype(auto) visit_elementwise(ir::OpKind op, const ir::Attrs& attrs, V&& v) {
  using ir::OpKind;
  using D = Domain;
  const ir::NodeAttrs a(op, attrs);
  switch (op) {
    case OpKind::Neg: return v(ElementwiseFn<NegF, 1, D::NotBool, false>{});
    case OpKind::Abs: return v(ElementwiseFn<AbsF, 1, D::NotBool, false>{});
    case OpKind::Exp: return v(ElementwiseFn<ExpF, 1, D::Float, false>{});
    case OpKind::Log: return v(ElementwiseFn<LogF, 1, D::Float, false>{});
    case OpKind::Sqrt: return v(ElementwiseFn<SqrtF, 1, D::Float, false>{});
    case OpKind::Rsqrt: return v(ElementwiseFn<RsqrtF, 1, D::Float, false>{});
    case OpKind::Relu: return v(ElementwiseFn<ReluF, 1, D::NotBool, false>{});
    case OpKind::Sigmoid: return v(ElementwiseFn<SigmoidF, 1, D::Float, false>{});
    case OpKind::Tanh: return v(ElementwiseFn<TanhF, 1, D::Float, false>{});
    case OpKind::IsNan: return v(ElementwiseFn<IsNanF, 1, D::Any, true>{});
    case OpKind::LogicalNot: return v(ElementwiseFn<LogicalNotF, 1, D::Any, true>{});
    case OpKind::Sin: return v(ElementwiseFn<SinF, 1, D::Float, false>{});
    case OpKind::Cos: return v(ElementwiseFn<CosF, 1, D::Float, false>{});
    case OpKind::Log1p: return v(ElementwiseFn<Log1pF, 1, D::Float, false>{});
    case OpKind::Expm1: return v(ElementwiseFn<Expm1F, 1, D::Float, false>{});
    case OpKind::Erf: return v(ElementwiseFn<ErfF, 1, D::Float, false>{});
    case OpKind::Gelu: return v(ElementwiseFn<GeluF, 1, D::Float, false>{{a.b<"tanh">()}});
    case OpKind::Silu: return v(ElementwiseFn<SiluF, 1, D::Float, false>{});
    case OpKind::Softplus:
      return v(ElementwiseFn<SoftplusF, 1, D::Float, false>{{a.f<"beta">(), a.f<"threshold">()}});
    case OpKind::Floor: return v(ElementwiseFn<FloorF, 1, D::NotBool, false>{});
    case OpKind::Ceil: return v(ElementwiseFn<CeilF, 1, D::NotBool, false>{});
    case OpKind::Round: return v(ElementwiseFn<RoundF, 1, D::NotBool, false>{});
    case OpKind::Sign: return v(ElementwiseFn<SignF, 1, D::Any, false>{});
    case OpKind::Add: return v(ElementwiseFn<AddF, 2, D::Any, false>{});
    case OpKind::Sub: return v(ElementwiseFn<SubF, 2, D::NotBool, false>{});
    case OpKind::Mul: return v(ElementwiseFn<MulF, 2, D::Any, false>{});
    case OpKind::Div: return v(ElementwiseFn<DivF, 2, D::Float, false>{});
    case OpKind::Pow: return v(ElementwiseFn<PowF, 2, D::NotBool, false>{});
    case OpKind::Maximum: return v(ElementwiseFn<MaximumF, 2, D::Any, false>{});
    case OpKind::Minimum: return v(ElementwiseFn<MinimumF, 2, D::Any, false>{});
    case OpKind::Eq: return v(ElementwiseFn<EqF, 2, D::Any, true>{});
    case OpKind::Ne: return v(ElementwiseFn<NeF, 2, D::Any, true>{});
    case OpKind::Lt: return v(ElementwiseFn<LtF, 2, D::Any, true>{});
    case OpKind::Le: return v(ElementwiseFn<LeF, 2, D::Any, true>{});
    case OpKind::Gt: return v(ElementwiseFn<GtF, 2, D::Any, true>{});
    case OpKind::Ge: return v(ElementwiseFn<GeF, 2, D::Any, true>{});
    case OpKind::LogicalAnd: return v(ElementwiseFn<AndF, 2, D::Any, true>{});
    case OpKind::LogicalOr: return v(ElementwiseFn<OrF, 2, D::Any, true>{});
    case OpKind::Clamp:
      return v(ElementwiseFn<ClampF, 3, D::NotBool, false>{{a.b<"has_min">(), a.b<"has_max">()}});
    default: break;
  }
  LAZYRT_ASSERT(false, ir::op_name(op), " has no elementwise function");
  return v(ElementwiseFn<NegF, 1, D::NotBool, false>{});
}

/// Rounds a compute value to what storing it as T and reading it back gives: the 16-bit
/// floats round to their precision; other types keep the value.
template <class T>
inline compute_t<T> round_to(compute_t<T> x) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return static_cast<float>(T(x));
  else return x;
}

}  // namespace lazyrt::kernels
