// Parity of lazyrt's public tensor ops with PyTorch. Each case of the fixture file (generated
// by tests/fixtures/gen_op_fixtures.py with torch) is its own test: the op runs in lazyrt on
// the case's inputs, is synced, and must give torch's dtype, shape and values. Expected values
// come only from torch, never from lazyrt.
//
// The dispatcher below maps a fixture op name to a call of the public API; its twin is
// TORCH_OPS in the generator, which says what torch call the same name stands for.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include <lazyrt/lazyrt.h>

#include "ir/graph.h"
#include "ir/op.h"
#include "ops/op_fixture.h"
#include "trace/lazy_tensor.h"
#include "util/half.h"

#ifndef LAZYRT_OP_FIXTURES
#error "LAZYRT_OP_FIXTURES (the generated fixture file) must be defined by tests/fixtures/tests.cmake"
#endif

namespace lazyrt::fixtures {
namespace {

constexpr const char* kLoadError = "__fixture_load_error__";

// ---- attributes -------------------------------------------------------------------------------

class Attrs {
 public:
  explicit Attrs(const OpCase& c) : c_(c) {}

  bool has(const std::string& key) const { return c_.attrs.count(key) != 0; }
  const std::vector<std::string>& raw(const std::string& key) const {
    auto it = c_.attrs.find(key);
    if (it == c_.attrs.end()) throw std::runtime_error("case needs attribute '" + key + "'");
    return it->second;
  }
  std::vector<int64_t> ints(const std::string& key) const {
    std::vector<int64_t> out;
    for (const auto& s : raw(key)) out.push_back(parse_int(s));
    return out;
  }
  std::vector<int64_t> ints_or_empty(const std::string& key) const {
    return has(key) ? ints(key) : std::vector<int64_t>{};
  }
  int64_t one_int(const std::string& key) const {
    auto v = ints(key);
    if (v.size() != 1) throw std::runtime_error("attribute '" + key + "' must be one integer");
    return v[0];
  }
  bool flag_or(const std::string& key, bool fallback) const {
    return has(key) ? one_int(key) != 0 : fallback;
  }
  DType dtype(const std::string& key) const { return parse_dtype(raw(key).at(0)); }
  // "KIND VALUE": the kind decides PyTorch's promotion, so the Scalar must keep it.
  Scalar scalar(const std::string& key) const {
    const auto& v = raw(key);
    if (v.size() != 2) throw std::runtime_error("scalar attribute '" + key + "' needs KIND VALUE");
    if (v[0] == "bool") return Scalar(parse_int(v[1]) != 0);
    if (v[0] == "int") return Scalar(parse_int(v[1]));
    if (v[0] == "float") return Scalar(parse_real(v[1]));
    throw std::runtime_error("unknown scalar kind '" + v[0] + "'");
  }
  Scalar scalar_or(const std::string& key, Scalar fallback) const {
    return has(key) ? scalar(key) : fallback;
  }

 private:
  const OpCase& c_;
};

// ---- dispatcher --------------------------------------------------------------------------------

using Args = std::vector<Tensor>;
struct OpEntry {
  static constexpr size_t kVariadic = static_cast<size_t>(-1);  // any number of inputs
  size_t arity;
  std::function<Tensor(const Args&, const Attrs&)> call;
};

const std::map<std::string, OpEntry>& dispatcher() {
  static const std::map<std::string, OpEntry> table = [] {
    std::map<std::string, OpEntry> t;
    // Input 0 transposed first where the case carries `transpose_input D0 D1`.
    auto first = [](const Args& x, const Attrs& a) {
      if (!a.has("transpose_input")) return x[0];
      const auto d = a.ints("transpose_input");
      return transpose(x[0], d.at(0), d.at(1));
    };
    auto unary = [&](const char* name, Tensor (*fn)(const Tensor&)) {
      t[name] = {1, [fn, first](const Args& x, const Attrs& a) { return fn(first(x, a)); }};
    };
    auto binary = [&](const char* name, Tensor (*fn)(const Tensor&, const Tensor&)) {
      t[name] = {2, [fn, first](const Args& x, const Attrs& a) { return fn(first(x, a), x[1]); }};
    };
    // The plain elementwise ops of the op table (lazyrt/ops.def's api column), by row.
#define LAZYRT_CASE_Public(name)
#define LAZYRT_CASE_Internal(name)
#define LAZYRT_CASE_Unary(name) unary(#name, lazyrt::name);
#define LAZYRT_CASE_UnaryFloat(name) unary(#name, lazyrt::name);
#define LAZYRT_CASE_Arith(name) binary(#name, lazyrt::name);
#define LAZYRT_CASE_ArithFloat(name) binary(#name, lazyrt::name);
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_CASE_##api(name)
#include "lazyrt/ops.def"
#undef OP
#undef LAZYRT_CASE_Public
#undef LAZYRT_CASE_Internal
#undef LAZYRT_CASE_Unary
#undef LAZYRT_CASE_UnaryFloat
#undef LAZYRT_CASE_Arith
#undef LAZYRT_CASE_ArithFloat
    t["cast"] = {1, [](const Args& x, const Attrs& a) { return cast(x[0], a.dtype("dtype")); }};
    t["unary_minus"] = {1, [](const Args& x, const Attrs&) { return -x[0]; }};

    t["add"] = {2, [](const Args& x, const Attrs& a) { return add(x[0], x[1], a.scalar_or("alpha", 1)); }};
    t["sub"] = {2, [](const Args& x, const Attrs& a) { return sub(x[0], x[1], a.scalar_or("alpha", 1)); }};
    t["pow"] = {2, [](const Args& x, const Attrs&) { return pow(x[0], x[1]); }};
    t["pow_scalar"] = {1, [](const Args& x, const Attrs& a) { return pow(x[0], a.scalar("exponent")); }};
    t["where"] = {3, [](const Args& x, const Attrs&) { return where(x[0], x[1], x[2]); }};

    t["operator_add"] = {2, [](const Args& x, const Attrs&) { return x[0] + x[1]; }};
    t["operator_sub"] = {2, [](const Args& x, const Attrs&) { return x[0] - x[1]; }};
    t["operator_mul"] = {2, [](const Args& x, const Attrs&) { return x[0] * x[1]; }};
    t["operator_div"] = {2, [](const Args& x, const Attrs&) { return x[0] / x[1]; }};

#define LAZYRT_SCALAR_OP(name, expr)                                  \
  t[name] = {1, [](const Args& x, const Attrs& a) {                   \
               const Scalar s = a.scalar("scalar");                   \
               return expr;                                           \
             }};
    LAZYRT_SCALAR_OP("add_scalar", x[0] + s)
    LAZYRT_SCALAR_OP("sub_scalar", x[0] - s)
    LAZYRT_SCALAR_OP("mul_scalar", x[0] * s)
    LAZYRT_SCALAR_OP("div_scalar", x[0] / s)
    LAZYRT_SCALAR_OP("radd_scalar", s + x[0])
    LAZYRT_SCALAR_OP("rsub_scalar", s - x[0])
    LAZYRT_SCALAR_OP("rmul_scalar", s * x[0])
    LAZYRT_SCALAR_OP("rdiv_scalar", s / x[0])
    LAZYRT_SCALAR_OP("eq_scalar", x[0] == s)
    LAZYRT_SCALAR_OP("ne_scalar", x[0] != s)
    LAZYRT_SCALAR_OP("lt_scalar", x[0] < s)
    LAZYRT_SCALAR_OP("le_scalar", x[0] <= s)
    LAZYRT_SCALAR_OP("gt_scalar", x[0] > s)
    LAZYRT_SCALAR_OP("ge_scalar", x[0] >= s)
#undef LAZYRT_SCALAR_OP

    using Reduction = Tensor (*)(const Tensor&, std::vector<int64_t>, bool);
    auto reduction = [&](const char* name, Reduction fn) {
      t[name] = {1, [fn](const Args& x, const Attrs& a) {
                   return fn(x[0], a.ints_or_empty("dims"), a.flag_or("keepdim", false));
                 }};
    };
    reduction("sum", lazyrt::sum);
    reduction("mean", lazyrt::mean);
    reduction("amax", lazyrt::amax);
    reduction("amin", lazyrt::amin);

    binary("matmul", lazyrt::matmul);
    t["transpose"] = {1, [](const Args& x, const Attrs& a) {
                        return transpose(x[0], a.one_int("d0"), a.one_int("d1"));
                      }};
    t["permute"] = {1, [](const Args& x, const Attrs& a) { return permute(x[0], a.ints_or_empty("dims")); }};
    t["reshape"] = {1, [](const Args& x, const Attrs& a) { return reshape(x[0], a.ints_or_empty("shape")); }};
    t["expand"] = {1, [](const Args& x, const Attrs& a) { return expand(x[0], a.ints_or_empty("shape")); }};
    t["unsqueeze"] = {1, [](const Args& x, const Attrs& a) { return unsqueeze(x[0], a.one_int("dim")); }};
    t["squeeze"] = {1, [](const Args& x, const Attrs& a) { return squeeze(x[0], a.one_int("dim")); }};
#include "ops/dispatch_shape.inc"
#include "ops/dispatch_math.inc"
#include "ops/dispatch_model.inc"
    return t;
  }();
  return table;
}

// ---- fixture cases -----------------------------------------------------------------------------

// Loaded once, at test registration, without the values: each case reads its own when it
// runs (with_values). An unreadable file becomes one failing case, so the failure shows up as
// a test instead of an empty suite.
const std::vector<OpCase>& fixture_cases() {
  static const std::vector<OpCase> cases = [] {
    try {
      return load_op_cases(LAZYRT_OP_FIXTURES, Values::Later);
    } catch (const std::exception& e) {
      OpCase c;
      c.name = "FixtureFileUnreadable";
      c.op = kLoadError;
      c.attrs["error"] = {e.what()};
      return std::vector<OpCase>{c};
    }
  }();
  return cases;
}

// ---- reading and describing values -------------------------------------------------------------

// The 16-bit values as they are stored: read from the buffer, not through a lazyrt cast.
template <class Half>
std::vector<double> half_values(const Tensor& t) {
  sync({t});
  const auto* p = static_cast<const Half*>(trace::impl_of(t)->data()->data());
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<float>(p[i]));
  return out;
}

std::vector<double> reals_of(const Tensor& t) {
  switch (t.dtype()) {
    case DType::f32: {
      auto v = t.to_vector<float>();
      return {v.begin(), v.end()};
    }
    case DType::bf16: return half_values<bf16>(t);
    case DType::f16: return half_values<f16>(t);
    default: return t.to_vector<double>();
  }
}

std::vector<int64_t> ints_of(const Tensor& t) {
  switch (t.dtype()) {
    case DType::i32: {
      auto v = t.to_vector<int32_t>();
      return {v.begin(), v.end()};
    }
    case DType::i64: return t.to_vector<int64_t>();
    default: {
      auto v = t.to_vector<bool>();
      return {v.begin(), v.end()};
    }
  }
}

template <class T>
std::string values_str(const std::vector<T>& v, int precision) {
  std::ostringstream os;
  os << std::setprecision(precision) << "{";
  const size_t shown = std::min<size_t>(v.size(), 32);
  for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << v[i];
  if (shown < v.size()) os << ", ... (" << v.size() << " values)";
  os << "}";
  return os.str();
}

int precision_of(DType d) { return d == DType::f64 ? 17 : 9; }

std::string describe(const FixtureTensor& t) {
  std::string s = std::string(dtype_name(t.dtype)) + shape_str(t.shape) + " ";
  return s + (is_floating(t.dtype) ? values_str(t.reals, precision_of(t.dtype)) : values_str(t.ints, 0));
}

std::string describe_case(const OpCase& c) {
  std::ostringstream os;
  os << "case " << c.name << " (fixture line " << c.line << "): op " << c.op;
  for (const auto& [key, values] : c.attrs) {
    os << " " << key << "=";
    for (size_t i = 0; i < values.size(); ++i) os << (i ? "," : "") << values[i];
  }
  for (size_t i = 0; i < c.inputs.size(); ++i) os << "\n  input " << i << ": " << describe(c.inputs[i]);
  os << "\n  torch: " << describe(c.expected);
  if (c.alt) os << "\n  torch, rounded once: " << describe(*c.alt);
  return os.str();
}

// The gap between a 16-bit value x and its neighbour away from zero: eps * 2^floor(log2 |x|)
// with eps = 2^-7 (bf16) or 2^-10 (f16), and the subnormal step below the smallest normal.
double half_ulp(double x, DType dtype) {
  const int mantissa_bits = dtype == DType::bf16 ? 7 : 10;
  const int min_exponent = dtype == DType::bf16 ? -126 : -14;
  const int exponent = x == 0 ? min_exponent : std::max(std::ilogb(x), min_exponent);
  return std::ldexp(1.0, exponent - mantissa_bits);
}

// How many terms the reductions of a traced graph add (or multiply) into one output element,
// summed over its reduction nodes (the errors of successive reductions add up): a matmul its
// inner dimension, a sum or mean the elements it reduces, softmax and cumsum the length of their
// dim, a convolution its input channels (per group) times its kernel area. Ops that only pick a
// value (amax, argsort, max_pool2d) round nothing and count nothing. 0: no reduction.
int64_t reduction_length(const ir::Graph& g) {
  using ir::OpKind;
  int64_t total = 0;
  for (const ir::Node& n : g.nodes) {
    const ir::NodeAttrs a(n.op, n.attrs);
    auto in = [&](size_t k) -> const Shape& { return g.type(n.operands.at(k)).shape; };
    auto out_numel = [&] { return std::max<int64_t>(n.results.at(0).numel(), 1); };
    auto dim_size = [&](int64_t dim) {
      const Shape& s = in(0);
      return s.empty() ? int64_t{1} : s.at(static_cast<size_t>(dim < 0 ? dim + static_cast<int64_t>(s.size()) : dim));
    };
    int64_t k = 1;
    switch (n.op) {
      case OpKind::Sum: case OpKind::Mean: case OpKind::Prod: case OpKind::Var: case OpKind::Std:
      case OpKind::Norm:
        k = shape_numel(in(0)) / out_numel();
        break;
      case OpKind::Softmax: case OpKind::LogSoftmax: k = dim_size(a.i<"dim">()); break;
      case OpKind::Cumsum: case OpKind::Cumprod: k = dim_size(a.i<"dim">()); break;
      case OpKind::Matmul: k = in(0).empty() ? 1 : in(0).back(); break;
      case OpKind::Conv2d: {
        const Shape& w = in(1);  // [out channels, in channels / groups, kh, kw]
        k = w.size() == 4 ? w[1] * w[2] * w[3] : 1;
        break;
      }
      case OpKind::AvgPool2d: {
        const auto& kernel = a.ints<"kernel">();
        k = std::accumulate(kernel.begin(), kernel.end(), int64_t{1}, std::multiplies<>());
        break;
      }
      default: break;
    }
    if (k > 1) total += k;
  }
  return total;
}

// Whether lazyrt's value matches torch's. nan only matches nan, inf only the same inf.
//
// f32 and f64: |actual - expected| <= atol + rtol * |expected|.
//
// A case whose graph reduces (reduction length K > 1, above) also allows for the summation
// order, which differs between torch's kernels, lazyrt's and OpenBLAS's (its blocking even
// depends on its thread count). A sum of K terms in any order is within K*u*sum|terms| of the
// exact one (u = eps/2, eps the float's machine epsilon), so two orders are within
// K*eps*sum|terms| of each other. Where the terms have one sign, sum|terms| is |expected|:
// rtol is at least K*eps. Where they cancel, sum|terms| is about sqrt(K) times the typical
// term while the results are about sqrt(K) times it too, so the output's root mean square
// (`scale`) stands for it: atol grows by K*eps*scale. (Random rounding errors make the typical
// difference about sqrt(K)*eps*scale, a margin of sqrt(K) below this.)
//
// bf16 and f16: one unit in the last place of the 16-bit type at the expected value, plus the
// f32 tolerance. Both torch and lazyrt compute a 16-bit op in f32 and round the result once,
// but with other libm routines, vector code and summation orders: their f32 results may differ
// as much as the f32 tolerance allows (a term that only matters for f16 values below about
// 1e-3, where the f16 ulp is finer than the f32 atol), and two f32 results on either side of a
// rounding boundary round to neighbouring 16-bit values. Rounding intermediate results to 16
// bits, or accumulating in 16 bits, is off by more and fails. (The ulp, eps * 2^floor(log2 |x|)
// with eps = 2^-7 or 2^-10, is used rather than eps * |x|, which would allow almost two.)
// Where torch's own 16-bit kernels round inside, the fixture holds the once-rounded result as a
// second answer rather than widening this bound (tests/fixtures/cases_half.py). A cast computes
// nothing, it only rounds: its 16-bit results must be torch's exactly (half_ulps = 0).
struct Tolerance {
  int half_ulps = 1;
  int64_t reduction_length = 0;  // K; 0 or 1: no reduction
  double scale = 0;              // root mean square of the expected (finite) values
};

bool close(double actual, double expected, DType dtype, const Tolerance& tol) {
  if (std::isnan(expected)) return std::isnan(actual);
  if (std::isinf(expected)) return actual == expected;
  if (!std::isfinite(actual)) return false;
  const bool half = dtype == DType::bf16 || dtype == DType::f16;
  if (half && tol.half_ulps == 0) return actual == expected;
  // 16-bit ops compute in f32.
  const double eps = dtype == DType::f64 ? std::numeric_limits<double>::epsilon()
                                         : std::numeric_limits<float>::epsilon();
  double rtol = dtype == DType::f64 ? 1e-12 : 1e-5;
  double atol = (dtype == DType::f64 ? 1e-12 : 1e-6) + (half ? half_ulp(expected, dtype) : 0);
  if (tol.reduction_length > 1) {
    const double k = static_cast<double>(tol.reduction_length);
    rtol = std::max(rtol, k * eps);
    atol += k * eps * tol.scale;
  }
  return std::fabs(actual - expected) <= atol + rtol * std::fabs(expected);
}

double rms_of_finite(const std::vector<double>& v) {
  double sum = 0;
  int64_t n = 0;
  for (double x : v)
    if (std::isfinite(x)) sum += x * x, ++n;
  return n ? std::sqrt(sum / static_cast<double>(n)) : 0;
}

// Checks one tensor's values against the fixture (an element may instead match `alt`, the
// other answer torch gives); says which elements differ.
::testing::AssertionResult values_match(const Tensor& t, const FixtureTensor& want,
                                        const std::optional<FixtureTensor>& alt = std::nullopt,
                                        Tolerance tol = {}) {
  std::ostringstream bad;
  int mismatches = 0;
  std::string actual;
  if (is_floating(want.dtype)) {
    auto got = reals_of(t);
    for (size_t i = 0; i < got.size(); ++i) {
      if (close(got[i], want.reals[i], want.dtype, tol) ||
          (alt && close(got[i], alt->reals.at(i), alt->dtype, tol)))
        continue;
      if (++mismatches > 8) continue;
      bad << std::setprecision(precision_of(want.dtype)) << "\n    [" << i << "] torch " << want.reals[i];
      if (alt) bad << " (or " << alt->reals[i] << ")";
      bad << ", lazyrt " << got[i];
    }
    actual = values_str(got, precision_of(want.dtype));
  } else {
    auto got = ints_of(t);
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want.ints[i] && ++mismatches <= 8)
        bad << "\n    [" << i << "] torch " << want.ints[i] << ", lazyrt " << got[i];
    actual = values_str(got, 0);
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  if (tol.reduction_length > 1)
    bad << "\n  (reduction length " << tol.reduction_length << ", output rms " << tol.scale << ")";
  return ::testing::AssertionFailure() << mismatches << " element(s) differ:" << bad.str()
                                       << "\n  lazyrt: " << actual;
}

// ---- the tests ---------------------------------------------------------------------------------

// The identity permutation of x: a pending value equal to x in every bit, so the op under test
// is traced and compiled together with the ops that produce its operands.
Tensor pending_copy(const Tensor& x) {
  std::vector<int64_t> dims(static_cast<size_t>(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  return permute(x, dims);
}

// The case with its values read (fixture_cases() has only names, ops and attributes).
OpCase with_values(OpCase c) {
  parse_values(c);
  return c;
}

// Runs the case's op in lazyrt and checks dtype, shape and values against torch's.
// The kernels' exact values against torch's, denormals included: lazyrt flushes them to zero by
// default (set_flush_denormal, as XLA's CPU backend), PyTorch does not.
class KeepDenormals {
 public:
  KeepDenormals() : was_(flush_denormal()) { set_flush_denormal(false); }
  ~KeepDenormals() { set_flush_denormal(was_); }
  KeepDenormals(const KeepDenormals&) = delete;
  KeepDenormals& operator=(const KeepDenormals&) = delete;

 private:
  bool was_;
};

void check_case(const OpCase& unread, bool pending_inputs) {
  const KeepDenormals keep;
  ASSERT_NE(unread.op, kLoadError) << unread.attrs.at("error").at(0);
  OpCase c;
  try {
    c = with_values(unread);
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
  SCOPED_TRACE(describe_case(c));
  auto it = dispatcher().find(c.op);
  ASSERT_NE(it, dispatcher().end()) << "no dispatcher entry for op '" << c.op << "'";
  if (it->second.arity != OpEntry::kVariadic)
    ASSERT_EQ(c.inputs.size(), it->second.arity) << "wrong number of inputs for op " << c.op;

  std::vector<Tensor> inputs;
  for (const auto& fi : c.inputs) inputs.push_back(make_tensor(fi));
  Tensor out;
  Tolerance tol;
  tol.half_ulps = c.op == "cast" ? 0 : 1;
  tol.scale = rms_of_finite(c.expected.reals);
  try {
    std::vector<Tensor> args = inputs;
    if (pending_inputs)
      for (Tensor& a : args) a = pending_copy(a);
    out = it->second.call(args, Attrs(c));
    if (out.is_pending()) tol.reduction_length = reduction_length(trace::pending_graph({trace::impl_of(out)}));
    sync({out});
  } catch (const std::exception& e) {
    FAIL() << "lazyrt threw where torch gave a result: " << e.what();
  }
  EXPECT_FALSE(out.is_pending()) << "sync left the result pending";

  ASSERT_EQ(std::string(dtype_name(out.dtype())), dtype_name(c.expected.dtype)) << "dtype differs";
  ASSERT_EQ(shape_str(out.shape()), shape_str(c.expected.shape)) << "shape differs";
  EXPECT_TRUE(values_match(out, c.expected, c.alt, tol));

  // Running an op must never write into its operands (e.g. a wrong buffer donation).
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_TRUE(values_match(inputs[i], c.inputs[i])) << "input " << i << " changed";
}

class OpParity : public ::testing::TestWithParam<OpCase> {};

// Operands are device data (graph parameters).
TEST_P(OpParity, MatchesTorch) { check_case(GetParam(), /*pending_inputs=*/false); }

// Operands are pending IR, so the op goes through the passes and fusion with its producers.
TEST_P(OpParity, MatchesTorchOnPendingInputs) { check_case(GetParam(), /*pending_inputs=*/true); }

template <class Param>
std::string test_name(const ::testing::TestParamInfo<Param>& info) {
  std::string name = info.param.name;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

std::vector<OpCase> ungrouped_cases() {
  std::vector<OpCase> out;
  for (const auto& c : fixture_cases())
    if (c.group.empty()) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Torch, OpParity, ::testing::ValuesIn(ungrouped_cases()), test_name<OpCase>);

// The cases of one group (the fixture's 'group' line), run as one test: every case, with
// device-data inputs and with pending inputs. A failure names its case.
struct CaseGroup {
  std::string name;
  std::vector<OpCase> cases;
};
void PrintTo(const CaseGroup& g, std::ostream* os) { *os << g.name; }

std::vector<CaseGroup> case_groups() {
  std::vector<CaseGroup> groups;
  std::map<std::string, size_t> index;
  for (const auto& c : fixture_cases()) {
    if (c.group.empty()) continue;
    auto [it, added] = index.emplace(c.group, groups.size());
    if (added) groups.push_back({c.group, {}});
    groups[it->second].cases.push_back(c);
  }
  return groups;
}

class OpParityGroup : public ::testing::TestWithParam<CaseGroup> {};

TEST_P(OpParityGroup, MatchesTorch) {
  for (const OpCase& c : GetParam().cases) {
    check_case(c, /*pending_inputs=*/false);
    SCOPED_TRACE("with pending inputs");
    check_case(c, /*pending_inputs=*/true);
  }
}

INSTANTIATE_TEST_SUITE_P(Torch, OpParityGroup, ::testing::ValuesIn(case_groups()), test_name<CaseGroup>);

// Every case again on the reference backend (one op at a time: no fusion, no gemm), with
// pending inputs so the whole composition runs there: the backend the others are compared
// with must match torch on its own. One test, the cases in turn; a failure names its case.
TEST(OpParityReferenceBackend, EveryCaseMatchesTorch) {
  const std::string before = current_backend();
  set_backend("reference");
  const int64_t compiles = metrics::counter("UncachedCompile");
  size_t checked = 0;
  for (const OpCase& c : fixture_cases()) {
    check_case(c, /*pending_inputs=*/true);
    ++checked;
    if (::testing::Test::HasFatalFailure()) break;
  }
  set_backend(before);
  EXPECT_EQ(checked, fixture_cases().size());
  EXPECT_GT(metrics::counter("UncachedCompile") - compiles, 1000) << "the cases compiled for the reference backend";
}

// The fixture and the dispatcher must agree on the op names, and every op must be exercised
// by several cases; otherwise a typo would silently drop an op from the parity check.
TEST(OpFixtures, EveryDispatcherOpHasSeveralCases) {
  std::map<std::string, int> count;
  for (const auto& c : fixture_cases()) count[c.op]++;
  for (const auto& [op, entry] : dispatcher()) EXPECT_GE(count[op], 2) << "op " << op;
}

TEST(OpFixtures, EveryFixtureOpIsDispatched) {
  std::set<std::string> names;
  for (const auto& c : fixture_cases()) {
    EXPECT_TRUE(dispatcher().count(c.op)) << "case " << c.name << " uses unknown op " << c.op;
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
  }
}

// Every op of the table must be reached by some parity case: the ops each case records are
// read off its pending graph. The exceptions are checked elsewhere against their own
// references, named here so that any other new row without a case fails.
TEST(OpFixtures, EveryOpOfTheTableHasAParityCase) {
  const std::set<std::string> elsewhere = {
      "parameter",              // every graph's inputs
      "while",                  // tests/cpp/trace/loops_test.cpp (known values)
      "scan",                   // tests/cpp/trace/scan_test.cpp, tests/python/test_scan.py (torch)
      "stop_gradient",          // likewise: detach() and no_grad inside differentiated loop bodies
      "scan_vjp",               // likewise: gradients with snapshots (checkpointing)
      "fusion",                 // made by compile, never traced: it runs every case with an
                                // elementwise chain, and tests/cpp/compile/fusion_test.cpp
      "call",                   // recorded by optimizers' updates (every training case runs
                                // them), tests/cpp/trace/call_test.cpp (the same ops run one by
                                // one) and tests/cpp/optim/training_test.cpp (torch)
      "gemm",                   // made by compile from matmuls of transposes: it runs every
                                // such case (linear layers, their gradients), and
                                // tests/cpp/compile/gemm_test.cpp (known values)
      "gemm_view",              // made by compile from products of views (attention's heads):
                                // tests/cpp/compile/gemm_test.cpp (against matmul of copies)
      "random",                 // tests/cpp/kernels/random_test.cpp (known answers, moments)
      "all_reduce",             // tests/cpp/distributed/process_group_test.cpp and
      "all_gather",             // tests/python/test_distributed.py, across processes (closed
      "reduce_scatter",         // forms, and a data-parallel step against torch on the whole
      "broadcast",              // batch)
      "check",                  // tests/cpp/trace/failed_run_test.cpp, and test_tensor.py for the
                                // values torch's bernoulli refuses
      "conv2d_backward_input",  // gradients: tests/cpp/autograd (finite differences, torch)
      "conv2d_backward_weight", "max_pool2d_backward", "avg_pool2d_backward",
      "cumprod_backward",       // cumprod's gradient: tests/cpp/autograd, test_grad_parity.py
  };
  std::set<std::string> seen;
  for (const auto& unread : fixture_cases()) {
    auto it = dispatcher().find(unread.op);
    if (it == dispatcher().end()) continue;
    const OpCase c = with_values(unread);
    std::vector<Tensor> args;
    for (const auto& fi : c.inputs) args.push_back(pending_copy(make_tensor(fi)));
    Tensor out;
    try {
      out = it->second.call(args, Attrs(c));
    } catch (const std::exception&) {
      continue;  // the case itself reports it
    }
    std::istringstream text(debug::graph_text({out}));
    for (std::string line; std::getline(text, line);) {
      auto eq = line.find(" = ");
      if (eq == std::string::npos) continue;
      auto name = line.substr(eq + 3);
      seen.insert(name.substr(0, name.find_first_of(" ({")));
    }
  }
  for (int i = 0; i < ir::kNumOps; ++i) {
    const std::string name(ir::op_name(static_cast<ir::OpKind>(i)));
    if (elsewhere.count(name)) continue;
    EXPECT_TRUE(seen.count(name)) << "op '" << name << "' of ops.def has no parity case against torch";
  }
}

}  // namespace
}  // namespace lazyrt::fixtures
