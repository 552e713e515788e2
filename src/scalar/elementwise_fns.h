// The scalar functions of the elementwise ops, and the one table that maps an elementwise op
// of ops.def to its function. Both the one-op kernels (elementwise.cpp) and the fused kernel
// (fused.cpp) are built from this table, so an op computes the same values whichever runs it.
//
// A function is a small functor over the compute type C (float for the 16-bit dtypes, the
// storage type otherwise); functors with attributes (gelu's form, softplus's beta) carry them
// as members, read once when a kernel is made. Formulas follow PyTorch's CPU kernels (torch
// 1.13) term for term, so results agree to the rounding of the libm calls. In f32 (and the
// 16-bit dtypes, computed in f32) exp, erf and tanh are vmath.h's, within 1 ulp, so that loops over
// them vectorize; f64 calls the C library.
#pragma once

#include <cmath>
#include <limits>
#include <string_view>
#include <type_traits>

#include "ir/graph.h"
#include "util/dtype_dispatch.h"
#include "scalar/vmath.h"
#include "util/check.h"

namespace lazyrt::scalar {

template <class C>
constexpr bool is_float_c = std::is_floating_point_v<C>;

// Signed integer arithmetic wraps (two's complement), as torch's does; in C++ its overflow is
// undefined, so it is done in the unsigned type.
template <class C>
constexpr bool is_signed_int_c = std::is_integral_v<C> && std::is_signed_v<C>;
template <class C>
C wrap_add(C a, C b) { using U = std::make_unsigned_t<C>; return static_cast<C>(static_cast<U>(a) + static_cast<U>(b)); }
template <class C>
C wrap_sub(C a, C b) { using U = std::make_unsigned_t<C>; return static_cast<C>(static_cast<U>(a) - static_cast<U>(b)); }
template <class C>
C wrap_mul(C a, C b) { using U = std::make_unsigned_t<C>; return static_cast<C>(static_cast<U>(a) * static_cast<U>(b)); }

// exp, erf and tanh of a compute value: vmath.h's in f32, the C library's in f64.
template <class C> LAZYRT_VM_INLINE C exp_c(C x) {
  if constexpr (std::is_same_v<C, float>) return vm::exp_f32(x);
  else return std::exp(x);
}
template <class C> LAZYRT_VM_INLINE C erf_c(C x) {
  if constexpr (std::is_same_v<C, float>) return vm::erf_f32(x);
  else return std::erf(x);
}
template <class C> LAZYRT_VM_INLINE C tanh_c(C x) {
  if constexpr (std::is_same_v<C, float>) return vm::tanh_f32(x);
  else return std::tanh(x);
}

// ---- unary ------------------------------------------------------------------------------
struct NegF {
  template <class C> C operator()(C x) const {
    if constexpr (is_signed_int_c<C>) return wrap_sub(C(0), x);
    else return -x;
  }
};
struct AbsF {
  template <class C> C operator()(C x) const { return x < C(0) ? NegF{}(x) : x; }
};
struct ExpF { template <class C> C operator()(C x) const { return exp_c(x); } };
struct LogF { template <class C> C operator()(C x) const { return std::log(x); } };
struct SqrtF { template <class C> C operator()(C x) const { return std::sqrt(x); } };
struct RsqrtF { template <class C> C operator()(C x) const { return C(1) / std::sqrt(x); } };
struct ReluF {
  template <class C> C operator()(C x) const { return x != x ? x : (x > C(0) ? x : C(0)); }
};
struct SigmoidF {
  template <class C> C operator()(C x) const { return C(1) / (C(1) + exp_c(-x)); }
};
struct TanhF { template <class C> C operator()(C x) const { return tanh_c(x); } };
struct IsNanF { template <class C> bool operator()(C x) const { return x != x; } };
struct LogicalNotF { template <class C> bool operator()(C x) const { return x == C(0); } };
struct SinF { template <class C> C operator()(C x) const { return std::sin(x); } };
struct CosF { template <class C> C operator()(C x) const { return std::cos(x); } };
struct Log1pF { template <class C> C operator()(C x) const { return std::log1p(x); } };
struct Expm1F { template <class C> C operator()(C x) const { return std::expm1(x); } };
struct ErfF { template <class C> C operator()(C x) const { return erf_c(x); } };
struct AtanF { template <class C> C operator()(C x) const { return std::atan(x); } };
struct AsinhF { template <class C> C operator()(C x) const { return std::asinh(x); } };
// silu is x / (1 + exp(-x)).
struct SiluF { template <class C> C operator()(C x) const { return x / (C(1) + exp_c(-x)); } };

// gelu is x * 0.5 * (1 + erf(x / sqrt 2)), or its tanh form. The form is a type of its own,
// so that a loop over one form has no branch (and vectorizes); GeluForm, the row's functor,
// carries the attribute until resolve_form (below) picks the type.
template <bool kTanh>
struct GeluF {
  template <class C> C operator()(C x) const {
    if constexpr (kTanh) {
      const C beta = C(M_SQRT2 * M_2_SQRTPI * 0.5);
      const C kappa = C(0.044715);
      const C inner = beta * (x + kappa * (x * x * x));
      return C(0.5) * x * (C(1) + tanh_c(inner));
    } else {
      return x * C(0.5) * (C(1) + erf_c(x * C(M_SQRT1_2)));
    }
  }
};
struct GeluForm {
  bool tanh_form;
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
struct AddF {
  template <class C> C operator()(C a, C b) const {
    if constexpr (is_signed_int_c<C>) return wrap_add(a, b);
    else return a + b;
  }
};
struct SubF {
  template <class C> C operator()(C a, C b) const {
    if constexpr (is_signed_int_c<C>) return wrap_sub(a, b);
    else return a - b;
  }
};
struct MulF {
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, bool>) return a && b;
    else if constexpr (is_signed_int_c<C>) return wrap_mul(a, b);
    else return a * b;
  }
};
struct DivF { template <class C> C operator()(C a, C b) const { return a / b; } };
struct Atan2F { template <class C> C operator()(C y, C x) const { return std::atan2(y, x); } };
struct PowF {
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_floating_point_v<C>) {
      return std::pow(a, b);
    } else {
      // Integer power by squaring; a negative exponent truncates toward zero as in PyTorch.
      if (b < 0) return a == 1 ? C(1) : a == -1 ? C((b % 2 == 0) ? 1 : -1) : C(0);
      C r = 1, base = a;
      for (auto e = b; e > 0; e >>= 1) {
        if constexpr (is_signed_int_c<C>) {  // wraps on overflow, as torch does
          if (e & 1) r = wrap_mul(r, base);
          base = wrap_mul(base, base);
        } else {
          if (e & 1) r = static_cast<C>(r * base);
          base = static_cast<C>(base * base);
        }
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

/// What an elementwise row of ops.def implies for its scalar function: the arity (the row's
/// operand count), and from the row's result rule the dtypes it takes (Domain) and whether it
/// returns b8. known: the rule is one of an elementwise row's.
struct RowFacts {
  int arity;
  Domain domain;
  bool to_bool;
  bool known;
};
constexpr RowFacts facts_of_rule(int operands, std::string_view rule) {
  if (rule == "UnaryToBool" || rule == "Compare") return {operands, Domain::Any, true, true};
  if (rule == "UnaryFloat" || rule == "BinaryFloat") return {operands, Domain::Float, false, true};
  if (rule == "UnaryNumeric" || rule == "BinaryNumeric" || rule == "Clamp") return {operands, Domain::NotBool, false, true};
  if (rule == "Unary" || rule == "Binary") return {operands, Domain::Any, false, true};
  return {operands, Domain::Any, false, false};
}
inline constexpr RowFacts kRowFacts[] = {
#define OP(Enum, name, operands, rule, ...) facts_of_rule(operands, #rule),
#include "lazyrt/ops.def"
#undef OP
};
constexpr const RowFacts& row_facts(ir::OpKind op) { return kRowFacts[static_cast<size_t>(op)]; }
/// The ElementwiseFn of row Op with functor F.
template <ir::OpKind Op, class F>
using RowFn = ElementwiseFn<F, row_facts(Op).arity, row_facts(Op).domain, row_facts(Op).to_bool>;

// The scalar function of every elementwise row of ops.def but cast and where (whose operands
// differ in dtype: their kernels are written out): op, functor, and the functor's fields from
// the attributes `a` (arity, domain and bool result: row_facts).
#define LAZYRT_ELEMENTWISE_FNS(X)                             \
  X(Neg, NegF)                                                \
  X(Abs, AbsF)                                                \
  X(Exp, ExpF)                                                \
  X(Log, LogF)                                                \
  X(Sqrt, SqrtF)                                              \
  X(Rsqrt, RsqrtF)                                            \
  X(Relu, ReluF)                                              \
  X(Sigmoid, SigmoidF)                                        \
  X(Tanh, TanhF)                                              \
  X(IsNan, IsNanF)                                            \
  X(LogicalNot, LogicalNotF)                                  \
  X(Sin, SinF)                                                \
  X(Cos, CosF)                                                \
  X(Log1p, Log1pF)                                            \
  X(Expm1, Expm1F)                                            \
  X(Erf, ErfF)                                                \
  X(Atan, AtanF)                                              \
  X(Asinh, AsinhF)                                            \
  X(Gelu, GeluForm, a.b<"tanh">())                            \
  X(Silu, SiluF)                                              \
  X(Softplus, SoftplusF, a.f<"beta">(), a.f<"threshold">())   \
  X(Floor, FloorF)                                            \
  X(Ceil, CeilF)                                              \
  X(Round, RoundF)                                            \
  X(Sign, SignF)                                              \
  X(Add, AddF)                                                \
  X(Sub, SubF)                                                \
  X(Mul, MulF)                                                \
  X(Div, DivF)                                                \
  X(Atan2, Atan2F)                                            \
  X(Pow, PowF)                                                \
  X(Maximum, MaximumF)                                        \
  X(Minimum, MinimumF)                                        \
  X(Eq, EqF)                                                  \
  X(Ne, NeF)                                                  \
  X(Lt, LtF)                                                  \
  X(Le, LeF)                                                  \
  X(Gt, GtF)                                                  \
  X(Ge, GeF)                                                  \
  X(LogicalAnd, AndF)                                         \
  X(LogicalOr, OrF)                                           \
  X(Clamp, ClampF, a.b<"has_min">(), a.b<"has_max">())

/// Whether LAZYRT_ELEMENTWISE_FNS has a row for op.
constexpr bool has_elementwise_fn(ir::OpKind op) {
#define LAZYRT_LISTED(Op, ...) \
  if (op == ir::OpKind::Op) return true;
  LAZYRT_ELEMENTWISE_FNS(LAZYRT_LISTED)
#undef LAZYRT_LISTED
  return false;
}
constexpr bool every_elementwise_row_has_a_fn() {
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpKind>(i);
    if (ir::has_flag_c(op, ir::kElementwise) && op != ir::OpKind::Cast && op != ir::OpKind::Where &&
        (!has_elementwise_fn(op) || !row_facts(op).known))
      return false;
  }
  return true;
}
static_assert(every_elementwise_row_has_a_fn(),
              "an elementwise row of ops.def has no scalar function in LAZYRT_ELEMENTWISE_FNS, or a result "
              "rule facts_of_rule does not know");

/// Whether elementwise op `op` (a row of LAZYRT_ELEMENTWISE_FNS) maps zeros to zero: its scalar
/// function gives 0 (false) with every operand 0 or -0 (padding may hold either; atan2(0, -0)
/// is pi), for every value of its attributes: read off the function in double, with
/// value-initialized attributes where their value cannot make it 0 (softplus: log(2) / beta;
/// clamp of zeros: 0 with either bound), both forms of gelu. Bucket graphs
/// (compile/polymorphic.cpp) read such a result's zero padding unmasked.
template <class F, int kArity>
bool zero_at_zero() {
  if constexpr (std::is_same_v<F, GeluForm>) {
    return GeluF<false>{}(0.0) == 0 && GeluF<true>{}(0.0) == 0 && GeluF<false>{}(-0.0) == 0 &&
           GeluF<true>{}(-0.0) == 0;
  } else {
    const F f{};
    for (int signs = 0; signs < (1 << kArity); ++signs) {
      [[maybe_unused]] const double a = signs & 1 ? -0.0 : 0.0, b = signs & 2 ? -0.0 : 0.0, c = signs & 4 ? -0.0 : 0.0;
      bool zero;
      if constexpr (kArity == 1) zero = f(a) == 0;
      else if constexpr (kArity == 2) zero = f(a, b) == 0;
      else zero = f(a, b, c) == 0;
      if (!zero) return false;
    }
    return true;
  }
}
inline bool maps_zero_to_zero(ir::OpKind op) {
#define LAZYRT_AT_ZERO(Op, F, ...) \
  if (op == ir::OpKind::Op) return zero_at_zero<F, row_facts(ir::OpKind::Op).arity>();
  LAZYRT_ELEMENTWISE_FNS(LAZYRT_AT_ZERO)
#undef LAZYRT_AT_ZERO
  return false;
}

/// k(the functor a loop runs) for a row's functor f: f itself, or, for a row whose attribute
/// selects a form, the functor type of that form.
template <class F, class K>
decltype(auto) resolve_form(const F& f, K&& k) { return k(f); }
template <class K>
decltype(auto) resolve_form(const GeluForm& f, K&& k) {
  return f.tanh_form ? k(GeluF<true>{}) : k(GeluF<false>{});
}

/// Calls v(ElementwiseFn<F, ...>{f}) for an op of LAZYRT_ELEMENTWISE_FNS, with F the row's own
/// functor (for a row that selects a form by attribute, the functor that carries the attribute:
/// resolve_form picks the form). Asserts on other ops.
template <class V>
decltype(auto) visit_elementwise_row(ir::OpKind op, const ir::Attrs& attrs, V&& v) {
  [[maybe_unused]] const ir::NodeAttrs a(op, attrs);
  switch (op) {
#define LAZYRT_CASE(Op, F, ...) \
  case ir::OpKind::Op: return v(RowFn<ir::OpKind::Op, F>{F{__VA_ARGS__}});
    LAZYRT_ELEMENTWISE_FNS(LAZYRT_CASE)
#undef LAZYRT_CASE
    default: break;
  }
  LAZYRT_ASSERT(false, ir::op_name(op), " has no elementwise function");
  return v(RowFn<ir::OpKind::Neg, NegF>{});
}

/// Calls v(ElementwiseFn<...>{functor}) for an op of LAZYRT_ELEMENTWISE_FNS, with the functor
/// a loop runs (its form resolved). Asserts on others.
template <class V>
decltype(auto) visit_elementwise(ir::OpKind op, const ir::Attrs& attrs, V&& v) {
  return visit_elementwise_row(op, attrs, [&](const auto& row) -> decltype(auto) {
    using Row = std::decay_t<decltype(row)>;
    return resolve_form(row.f, [&](const auto& f) -> decltype(auto) {
      return v(ElementwiseFn<std::decay_t<decltype(f)>, Row::arity, Row::domain, Row::to_bool>{f});
    });
  });
}

/// Rounds a compute value to what storing it as T and reading it back gives: the 16-bit
/// floats round to their precision; other types keep the value.
template <class T>
inline compute_t<T> round_to(compute_t<T> x) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return static_cast<float>(T(x));
  else return x;
}

}  // namespace lazyrt::scalar
