// The scalar functions generated kernels are built from, compiled to LLVM bitcode at build time
// (by clang, -O2 -ffp-contract=off -fno-math-errno, as the library's own flags) and embedded in
// the library. A generated kernel calls them per element; they are inlined into its loop and
// vectorized with it.
//
// Every function here is an instantiation of what the interpreter runs (elementwise_fns.h,
// util/dtype_dispatch.h, util/half.h), from the same source: an op's value is computed by the
// same operations in the same order whichever tier runs it, so the two agree bit for bit
// (tests/cpp/jit/agreement_test.cpp checks every op on every dtype).
//
// Names (looked up by codegen.cpp; a missing one is an error there, not a wrong value):
//   lazyrt_jit_load_<T>(const void* base, int64_t i)          element i of a T array, as compute value
//   lazyrt_jit_store_<T>(void* base, int64_t i, C value)      stores it back as T
//   lazyrt_jit_op_<Op>_<T>(const void* row, C a, C b, C c)    the op on compute values; row: the
//                                                            bytes of the row's functor (attributes)
//   lazyrt_jit_cast_<From>_<To>(C value)                      cast as the one-op kernel casts
//   lazyrt_jit_where_<T>(bool c, C a, C b)
// with T one of f32 f64 bf16 f16 i32 i64 b8 and C = compute_t<T>. Arguments an op of lower
// arity does not take are ignored. Functions of an op on a dtype outside its domain exist and
// return zero: codegen never calls them (the type rules reject such nodes first).
#include "scalar/elementwise_fns.h"

namespace lazyrt::jit::lib {

using namespace lazyrt::scalar;

template <class Row, class T>
inline compute_t<std::conditional_t<Row::to_bool, bool, T>> apply(const void* row, compute_t<T> a, compute_t<T> b,
                                                                  compute_t<T> c) {
  using R = std::conditional_t<Row::to_bool, bool, T>;
  using C = compute_t<T>;
  using CR = compute_t<R>;
  if constexpr (!in_domain<Row::domain, T>()) {
    return CR{};
  } else {
    using F = std::decay_t<decltype(Row::f)>;
    const F& f = *static_cast<const F*>(row);
    return resolve_form(f, [&](const auto& g) -> CR {
      if constexpr (Row::arity == 1) return round_to<R>(convert<CR>(g.template operator()<C>(a)));
      else if constexpr (Row::arity == 2) return round_to<R>(convert<CR>(g.template operator()<C>(a, b)));
      else return round_to<R>(convert<CR>(g.template operator()<C>(a, b, c)));
    });
  }
}

}  // namespace lazyrt::jit::lib

using lazyrt::bf16;
using lazyrt::compute_t;
using lazyrt::convert;
using lazyrt::f16;
using lazyrt::scalar::row_facts;
using lazyrt::scalar::RowFn;

#define LAZYRT_JIT_DTYPES(X, ...) \
  X(f32, float, __VA_ARGS__)      \
  X(f64, double, __VA_ARGS__)     \
  X(bf16, bf16, __VA_ARGS__)      \
  X(f16, f16, __VA_ARGS__)        \
  X(i32, int32_t, __VA_ARGS__)    \
  X(i64, int64_t, __VA_ARGS__)    \
  X(b8, bool, __VA_ARGS__)

// The same list, for expansion inside the first (casts: every pair of dtypes).
#define LAZYRT_JIT_DTYPES_INNER(X, ...) \
  X(f32, float, __VA_ARGS__)            \
  X(f64, double, __VA_ARGS__)           \
  X(bf16, bf16, __VA_ARGS__)            \
  X(f16, f16, __VA_ARGS__)              \
  X(i32, int32_t, __VA_ARGS__)          \
  X(i64, int64_t, __VA_ARGS__)          \
  X(b8, bool, __VA_ARGS__)

// Loads and stores.
#define LAZYRT_JIT_MEMORY(name, T, _)                                                          \
  extern "C" compute_t<T> lazyrt_jit_load_##name(const void* base, int64_t i) {               \
    return convert<compute_t<T>>(static_cast<const T*>(base)[i]);                            \
  }                                                                                          \
  extern "C" void lazyrt_jit_store_##name(void* base, int64_t i, compute_t<T> v) {            \
    static_cast<T*>(base)[i] = convert<T>(v);                                                 \
  }
LAZYRT_JIT_DTYPES(LAZYRT_JIT_MEMORY, _)

// The ops of the elementwise table, on every dtype.
#define LAZYRT_JIT_OP_ON(name, T, Op, F)                                                              \
  extern "C" compute_t<std::conditional_t<row_facts(lazyrt::ir::OpKind::Op).to_bool, bool, T>>              \
      lazyrt_jit_op_##Op##_##name(const void* row, compute_t<T> a, compute_t<T> b, compute_t<T> c) {         \
    return lazyrt::jit::lib::apply<RowFn<lazyrt::ir::OpKind::Op, lazyrt::scalar::F>, T>(row, a, b, c);       \
  }
#define LAZYRT_JIT_OP(Op, F, ...) LAZYRT_JIT_DTYPES(LAZYRT_JIT_OP_ON, Op, F)
LAZYRT_ELEMENTWISE_FNS(LAZYRT_JIT_OP)

// Casts: a compute value holds a From exactly; cast it as the one-op kernel casts the stored
// value (fused.cpp's run_cast).
#define LAZYRT_JIT_CAST_TO(to_name, To, from_name, From)                                         \
  extern "C" compute_t<To> lazyrt_jit_cast_##from_name##_##to_name(compute_t<From> v) {         \
    return convert<compute_t<To>>(convert<To>(convert<From>(v)));                               \
  }
#define LAZYRT_JIT_CAST_FROM(from_name, From, _) LAZYRT_JIT_DTYPES_INNER(LAZYRT_JIT_CAST_TO, from_name, From)
LAZYRT_JIT_DTYPES(LAZYRT_JIT_CAST_FROM, _)

#define LAZYRT_JIT_WHERE(name, T, _) \
  extern "C" compute_t<T> lazyrt_jit_where_##name(bool c, compute_t<T> a, compute_t<T> b) { return c ? a : b; }
LAZYRT_JIT_DTYPES(LAZYRT_JIT_WHERE, _)
