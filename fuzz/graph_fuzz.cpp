// libFuzzer target for the public tensor API, built with AddressSanitizer and
// UndefinedBehaviorSanitizer: each input is decoded into a small program (a few input tensors,
// then a sequence of ops with attributes taken from the input, extreme ones included: negative
// and out-of-range dims, sizes of 2^31, 2^62 and INT64_MAX, nan and infinite scalars, indices
// out of range), which is traced, synced and read back.
//
// The property: the only exception that may leave the public API is lazyrt::Error (the program
// catches it and goes on with its next op). Any other exception, a crash, a sanitizer report
// or a hang is a bug.
//
// Every call, however extreme its arguments, reaches lazyrt: refusing them cleanly is part of
// what is tested, and lazy ops do not allocate until a sync. Only syncs are bounded: a tensor
// is synced or read only when the work of its whole history (elements computed, times the
// inner size of products, convolutions and loop trip counts) stays under about a million, so
// each input runs in milliseconds. The host data the program makes itself is at most 8^4
// elements a tensor.
#include <fuzzer/FuzzedDataProvider.h>
#include <lazyrt/lazyrt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

// The plain elementwise rows of the op table (lazyrt/ops.def's api column): one and two operands.
#define LAZYRT_ROW_Public(name)
#define LAZYRT_ROW_Internal(name)
#define LAZYRT_ROW_Unary(name) &lazyrt::name,
#define LAZYRT_ROW_UnaryFloat(name) &lazyrt::name,
#define LAZYRT_ROW_Arith(name)
#define LAZYRT_ROW_ArithFloat(name)
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_ROW_##api(name)
constexpr lazyrt::Tensor (*kUnaryRows[])(const lazyrt::Tensor&) = {
#include "lazyrt/ops.def"
};
#undef LAZYRT_ROW_Unary
#undef LAZYRT_ROW_UnaryFloat
#undef LAZYRT_ROW_Arith
#undef LAZYRT_ROW_ArithFloat
#define LAZYRT_ROW_Unary(name)
#define LAZYRT_ROW_UnaryFloat(name)
#define LAZYRT_ROW_Arith(name) &lazyrt::name,
#define LAZYRT_ROW_ArithFloat(name) &lazyrt::name,
constexpr lazyrt::Tensor (*kBinaryRows[])(const lazyrt::Tensor&, const lazyrt::Tensor&) = {
#include "lazyrt/ops.def"
};
#undef OP
#undef LAZYRT_ROW_Public
#undef LAZYRT_ROW_Internal
#undef LAZYRT_ROW_Unary
#undef LAZYRT_ROW_UnaryFloat
#undef LAZYRT_ROW_Arith
#undef LAZYRT_ROW_ArithFloat

using namespace lazyrt;
using lazyrt::indexing::Slice;
using lazyrt::indexing::TensorIndex;

// Work (elements computed, see above) a synced graph may take.
constexpr double kMaxWork = 1 << 20;
constexpr size_t kMaxPool = 12;
constexpr int kMaxOps = 48;

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

const int64_t kExtremeInts[] = {
    kI64Min,       kI64Min + 1,        -(int64_t{1} << 62), -(int64_t{1} << 32),
    -(int64_t{1} << 31) - 1, -(int64_t{1} << 31), -65536, -1000,
    1000,          65536,              (int64_t{1} << 31) - 1, int64_t{1} << 31,
    (int64_t{1} << 32) + 1, 3037000500 /* ~sqrt(2^63) */, int64_t{1} << 40, int64_t{1} << 62,
    kI64Max - 1,   kI64Max};

const double kExtremeDoubles[] = {
    std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::quiet_NaN(),
    std::numeric_limits<double>::infinity(),  -std::numeric_limits<double>::infinity(),
    -0.0, 1e-45, 1e-310, 3.4028234663852886e38, 1e39, -1e39, 1e300, 65504.0, 65520.0,
    2147483648.0, 9.223372036854775807e18, -9.223372036854775808e18, 1.8446744073709552e19};

const DType kDTypes[] = {DType::f32, DType::f64, DType::i32, DType::i64,
                         DType::b8,  DType::bf16, DType::f16};

double numel_of(const Tensor& t) {
  double n = 1;
  for (int64_t d : t.shape()) n *= static_cast<double>(d);
  return n;
}

// A tensor of the program, with a bound on the work its value needs. Tensors that may alias
// (views, in-place targets) share `group`, which holds the work of in-place updates made
// through any of them.
struct Entry {
  Tensor t;
  double cost = 0;
  std::shared_ptr<double> group;
  double effective() const { return std::max(cost, *group); }
};

// GRAPH_FUZZ_VERBOSE=1: each op's case and each result's type and work, to stderr (to read a
// finding's program).
bool verbose() {
  static const bool v = std::getenv("GRAPH_FUZZ_VERBOSE") != nullptr;
  return v;
}

class Program {
 public:
  explicit Program(FuzzedDataProvider& in) : in_(in) {}

  void run() {
    const int n_inputs = 1 + in_.ConsumeIntegralInRange<int>(0, 3);
    for (int i = 0; i < n_inputs; ++i) guarded([&] { make_input(); });
    for (int op = 0; op < kMaxOps && in_.remaining_bytes() > 0; ++op) guarded([&] { step(); });
    guarded([&] { read_all(); });
  }

 private:
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const lazyrt::Error&) {
      // A refusal: the property allows it, and the tensors are as they were.
    }
  }

  // ---- bytes to values -----------------------------------------------------------------
  uint8_t byte() { return in_.ConsumeIntegral<uint8_t>(); }
  bool flag() { return byte() & 1; }

  int64_t extreme_int() { return kExtremeInts[byte() % std::size(kExtremeInts)]; }
  // A dim argument: mostly in [-5, 5].
  int64_t dim_arg() {
    const uint8_t b = byte();
    return b < 240 ? int64_t{b % 11} - 5 : extreme_int();
  }
  // A size argument: mostly in [0, 8], sometimes negative or extreme.
  int64_t size_arg() {
    const uint8_t b = byte();
    if (b < 228) return b % 9;
    if (b < 238) return -1 - b % 3;
    return extreme_int();
  }
  // A small count of things (dims in a list, tensors to cat).
  size_t count(size_t max) { return byte() % (max + 1); }
  std::vector<int64_t> dims_arg(size_t max) {
    std::vector<int64_t> v(count(max));
    for (auto& d : v) d = dim_arg();
    return v;
  }
  std::vector<int64_t> sizes_arg(size_t max) {
    std::vector<int64_t> v(count(max));
    for (auto& d : v) d = size_arg();
    return v;
  }
  double double_arg() {
    const uint8_t b = byte();
    if (b < 200) return (static_cast<int>(b % 33) - 16) / 4.0;
    return kExtremeDoubles[b % std::size(kExtremeDoubles)];
  }
  Scalar scalar_arg() {
    switch (byte() % 4) {
      case 0: return Scalar(flag());
      case 1: return Scalar(byte() < 230 ? int64_t{byte() % 9} - 4 : extreme_int());
      default: return Scalar(double_arg());
    }
  }
  DType dtype_arg() { return kDTypes[byte() % std::size(kDTypes)]; }
  std::optional<DType> opt_dtype() {
    if (flag()) return std::nullopt;
    return dtype_arg();
  }

  // ---- the pool of tensors ---------------------------------------------------------------
  // A copy: handles and groups are shared, so in-place ops through it reach the pool's tensor,
  // and it stays valid while results are pushed.
  // Every entry a step picks counts toward the work of what it pushes (picked_): an operand
  // passed as a bare tensor (an index, a bias, a clamp bound) is part of the result's graph.
  Entry pick() {
    Entry e = pool_[byte() % pool_.size()];
    picked_ = std::max(picked_, e.effective());
    return e;
  }
  bool has_pool() const { return !pool_.empty(); }

  // Adds a result made from `ins`; `factor` is the work per result element. A view or a
  // result that may alias its input shares the group of alias_of.
  void push(const Tensor& r, std::initializer_list<const Entry*> ins, double factor = 1,
            const Entry* alias_of = nullptr) {
    double cost = picked_;
    for (const Entry* e : ins) cost = std::max(cost, e->effective());
    cost += numel_of(r) * std::max(factor, 1.0);
    Entry e{r, cost, alias_of ? alias_of->group : std::make_shared<double>(0)};
    if (verbose()) std::fprintf(stderr, "  -> %s%s, work %g\n", dtype_name(r.dtype()), shape_str(r.shape()).c_str(), cost);
    if (pool_.size() < kMaxPool) {
      pool_.push_back(std::move(e));
    } else {
      pool_[byte() % kMaxPool] = std::move(e);
    }
  }
  void push_all(const std::vector<Tensor>& rs, const Entry& in) {
    for (const Tensor& r : rs) push(r, {&in}, 1, &in);
  }
  // After a successful in-place update of e by a value that needed `cost`.
  void updated(Entry& e, double cost) {
    *e.group = std::max(*e.group, cost + numel_of(e.t));
    if (*e.group > kMaxWork) huge_inplace_ = true;
  }

  // ---- inputs ----------------------------------------------------------------------------
  Shape small_shape() {
    Shape s(byte() % 5);
    for (auto& d : s) d = byte() % 9;
    return s;
  }
  Shape any_shape() {
    Shape s(byte() % 5);
    for (auto& d : s) d = size_arg();
    return s;
  }
  // Host values for a tensor of n elements: small numbers, sometimes extreme ones.
  std::vector<double> values(size_t n) {
    std::vector<double> v(n);
    const bool extremes = flag();
    for (auto& x : v) {
      const uint8_t b = byte();
      if (extremes && b >= 224) {
        x = (b & 1) ? kExtremeDoubles[b % std::size(kExtremeDoubles)]
                    : static_cast<double>(kExtremeInts[b % std::size(kExtremeInts)]);
      } else {
        x = static_cast<int>(b % 13) - 4 + ((b & 0x80) ? 0.5 : 0.0);
      }
    }
    return v;
  }
  template <class T>
  static std::vector<T> convert(const std::vector<double>& v) {
    std::vector<T> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double x = v[i];
      if constexpr (std::is_integral_v<T>) {
        // The C++ conversion would be undefined outside T's range: saturate here.
        if (std::isnan(x)) {
          out[i] = 0;
        } else if (x <= static_cast<double>(std::numeric_limits<T>::min())) {
          out[i] = std::numeric_limits<T>::min();
        } else if (x >= static_cast<double>(std::numeric_limits<T>::max())) {
          out[i] = std::numeric_limits<T>::max();
        } else {
          out[i] = static_cast<T>(x);
        }
      } else {
        out[i] = static_cast<T>(x);
      }
    }
    return out;
  }
  static uint16_t to_half_bits(double x, DType dt) {
    const float f = static_cast<float>(x);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (dt == DType::bf16) return static_cast<uint16_t>(u >> 16);
    // f16 by truncation: exact enough for a fuzzer, keeps nan/inf.
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
    const uint32_t mant = (u >> 13) & 0x3ffu;
    if (((u >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    if (exp <= 0) return static_cast<uint16_t>(sign);
    return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
  }

  Tensor host_tensor(DType dt, const Shape& shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    const std::vector<double> v = values(n);
    switch (dt) {
      case DType::f32: return tensor(convert<float>(v), shape);
      case DType::f64: return tensor(v, shape);
      case DType::i32: return tensor(convert<int32_t>(v), shape);
      case DType::i64: return tensor(convert<int64_t>(v), shape);
      case DType::b8: {
        std::vector<bool> b(n);
        for (size_t i = 0; i < n; ++i) b[i] = v[i] != 0;
        return tensor(b, shape);
      }
      case DType::bf16:
      case DType::f16: {
        std::vector<uint16_t> bits(n);
        for (size_t i = 0; i < n; ++i) bits[i] = to_half_bits(v[i], dt);
        return from_blob(bits.data(), shape, dt);
      }
    }
    return Tensor();
  }

  // i64 indices, mostly in range [-2, 8), some far out.
  Tensor index_tensor(const Shape& shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<int64_t> v(n);
    for (auto& x : v) {
      const uint8_t b = byte();
      x = b < 240 ? int64_t{b % 10} - 2 : kExtremeInts[b % std::size(kExtremeInts)];
    }
    return tensor(v, shape);
  }

  void make_input() {
    const uint8_t kind = byte() % 16;
    if (kind < 9) {
      const DType dt = dtype_arg();
      const Shape s = small_shape();
      Tensor t = host_tensor(dt, s);
      push(t, {});
      return;
    }
    switch (kind) {
      case 9: push(zeros(any_shape(), dtype_arg()), {}); break;
      case 10: push(ones(any_shape(), dtype_arg()), {}); break;
      case 11: push(full(any_shape(), scalar_arg(), dtype_arg()), {}); break;
      case 12: push(arange(size_arg(), dtype_arg()), {}); break;
      case 13: push(scalar_tensor(double_arg(), dtype_arg()), {}); break;
      case 14: push(rand(any_shape(), dtype_arg()), {}); break;
      default:
        if (byte() == 255) {  // a null pointer: to be refused unless the shape is empty
          const Shape s = small_shape();
          push(from_blob(nullptr, s, dtype_arg()), {});
        } else {
          push(index_tensor(small_shape()), {});
        }
        break;
    }
  }

  // ---- one op ----------------------------------------------------------------------------
  void step() {
    picked_ = 0;
    if (!has_pool()) {
      make_input();
      return;
    }
    const uint8_t op = byte();
    if (verbose()) std::fprintf(stderr, "op %d\n", op % 64);
    switch (op % 64) {
      case 0: make_input(); break;
      case 1: {  // unary elementwise
        Entry a = pick();
        Tensor r;
        const size_t k = byte() % (std::size(kUnaryRows) + 9);
        if (k < std::size(kUnaryRows)) {
          r = kUnaryRows[k](a.t);
        } else {
          switch (k - std::size(kUnaryRows)) {
            case 0: r = reciprocal(a.t); break;
            case 1: r = round(a.t, dim_arg()); break;
            case 2: r = isinf(a.t); break;
            case 3: r = nan_to_num(a.t); break;
            case 4: r = gelu(a.t, flag() ? "tanh" : "none"); break;
            case 5: r = silu(a.t); break;
            case 6: r = softplus(a.t, scalar_arg(), scalar_arg()); break;
            case 7: r = -a.t; break;
            default: r = leaky_relu(a.t, scalar_arg()); break;
          }
        }
        push(r, {&a});
        break;
      }
      case 2: {  // binary elementwise, broadcasting
        Entry a = pick();
        Entry b = pick();
        Tensor r;
        const size_t k = byte() % (std::size(kBinaryRows) + 6);
        if (k < std::size(kBinaryRows)) {
          r = kBinaryRows[k](a.t, b.t);
        } else {
          switch (k - std::size(kBinaryRows)) {
            case 0: r = add(a.t, b.t, scalar_arg()); break;
            case 1: r = sub(a.t, b.t, scalar_arg()); break;
            case 2: r = pow(a.t, b.t); break;
            case 3: r = a.t * b.t; break;
            case 4: r = a.t / b.t; break;
            default: r = a.t - b.t; break;
          }
        }
        push(r, {&a, &b});
        break;
      }
      case 3: {  // with a scalar
        Entry a = pick();
        const Scalar s = scalar_arg();
        Tensor r;
        switch (byte() % 8) {
          case 0: r = a.t + s; break;
          case 1: r = s - a.t; break;
          case 2: r = a.t * s; break;
          case 3: r = s / a.t; break;
          case 4: r = pow(a.t, s); break;
          case 5: r = a.t < s; break;
          case 6: r = a.t == s; break;
          default: r = a.t / s; break;
        }
        push(r, {&a});
        break;
      }
      case 4: {  // reductions over dims
        Entry a = pick();
        const std::vector<int64_t> dims = dims_arg(3);
        const bool keep = flag();
        Tensor r;
        switch (byte() % 10) {
          case 0: r = sum(a.t, dims, keep); break;
          case 1: r = mean(a.t, dims, keep); break;
          case 2: r = amax(a.t, dims, keep); break;
          case 3: r = amin(a.t, dims, keep); break;
          case 4: r = var(a.t, dims, double_arg(), keep); break;
          case 5: r = lazyrt::std(a.t, dims, double_arg(), keep); break;
          case 6: r = logsumexp(a.t, dims, keep); break;
          case 7: r = all(a.t, dims, keep); break;
          case 8: r = any(a.t, dims, keep); break;
          default: r = norm(a.t, double_arg(), dims, keep); break;
        }
        push(r, {&a});
        break;
      }
      case 5: {  // reductions along one dim
        Entry a = pick();
        std::optional<int64_t> dim;
        if (flag()) dim = dim_arg();
        const bool keep = flag();
        switch (byte() % 5) {
          case 0: push(prod(a.t, dim, keep), {&a}); break;
          case 1: push(argmax(a.t, dim, keep), {&a}); break;
          case 2: push(argmin(a.t, dim, keep), {&a}); break;
          case 3: {
            auto [v, i] = max(a.t, dim.value_or(0), keep);
            push(v, {&a});
            push(i, {&a});
            break;
          }
          default: {
            auto [v, i] = min(a.t, dim.value_or(-1), keep);
            push(v, {&a});
            push(i, {&a});
            break;
          }
        }
        break;
      }
      case 6: {  // reshape / view
        Entry a = pick();
        const Shape s = sizes_arg(4);
        push(flag() ? reshape(a.t, s) : view(a.t, s), {&a}, 1, &a);
        break;
      }
      case 7: {
        Entry a = pick();
        push(permute(a.t, dims_arg(5)), {&a}, 1, &a);
        break;
      }
      case 8: {
        Entry a = pick();
        const int64_t d0 = dim_arg(), d1 = dim_arg();
        push(transpose(a.t, d0, d1), {&a}, 1, &a);
        break;
      }
      case 9: {
        Entry a = pick();
        push(expand(a.t, sizes_arg(5)), {&a}, 1, &a);
        break;
      }
      case 10: {
        Entry a = pick();
        const int64_t d = dim_arg();
        std::optional<int64_t> start, end;
        if (flag()) start = flag() ? dim_arg() : extreme_int();
        if (flag()) end = flag() ? dim_arg() : extreme_int();
        const int64_t step = byte() < 240 ? 1 + byte() % 3 : (flag() ? 0 : extreme_int());
        push(slice(a.t, d, start, end, step), {&a}, 1, &a);
        break;
      }
      case 11: {
        Entry a = pick();
        const int64_t d = dim_arg(), start = dim_arg(), len = size_arg();
        push(narrow(a.t, d, start, len), {&a}, 1, &a);
        break;
      }
      case 12: {  // select, as t[..., i]
        Entry a = pick();
        const int64_t d = dim_arg();
        const int64_t i = dim_arg();
        std::vector<TensorIndex> idx;
        if (d >= 0 && d < 6) {
          for (int64_t k = 0; k < d; ++k) idx.emplace_back(Slice());
        } else {
          idx.emplace_back(indexing::Ellipsis);
        }
        idx.emplace_back(i);
        push(a.t.index(idx), {&a}, 1, &a);
        break;
      }
      case 13: {
        Entry a = pick();
        const int64_t d = dim_arg();
        push(flag() ? squeeze(a.t, d) : unsqueeze(a.t, d), {&a}, 1, &a);
        break;
      }
      case 14: {
        Entry a = pick();
        const int64_t s = dim_arg(), e = dim_arg();
        push(flatten(a.t, s, e), {&a}, 1, &a);
        break;
      }
      case 15: {  // cat / stack
        std::vector<Tensor> ts;
        std::vector<const Entry*> ins;
        const size_t n = count(3);
        double cost = 0;
        for (size_t i = 0; i < n; ++i) {
          Entry e = pick();
          ts.push_back(e.t);
          cost = std::max(cost, e.effective());
        }
        const int64_t d = dim_arg();
        Tensor r = flag() ? cat(ts, d) : stack(ts, d);
        Entry tmp{Tensor(), cost, std::make_shared<double>(0)};
        push(r, {&tmp});
        break;
      }
      case 16: {  // split / chunk
        Entry a = pick();
        const int64_t d = dim_arg();
        switch (byte() % 3) {
          case 0: push_all(split(a.t, size_arg(), d), a); break;
          case 1: push_all(split(a.t, sizes_arg(4), d), a); break;
          default: push_all(chunk(a.t, size_arg(), d), a); break;
        }
        break;
      }
      case 17: {
        Entry a = pick();
        std::vector<int64_t> p(count(8));
        for (auto& x : p) x = byte() < 230 ? int64_t{byte() % 7} - 2 : extreme_int();
        push(pad(a.t, p, scalar_arg()), {&a});
        break;
      }
      case 18: {  // index_select / gather
        Entry a = pick();
        const int64_t d = dim_arg();
        Tensor idx = flag() ? index_tensor(small_shape()) : pick().t;
        push(flag() ? index_select(a.t, d, idx) : gather(a.t, d, idx), {&a});
        break;
      }
      case 19: {  // scatter family
        Entry a = pick();
        const int64_t d = dim_arg();
        Tensor idx = flag() ? index_tensor(small_shape()) : pick().t;
        Entry src = pick();
        switch (byte() % 5) {
          case 0: push(scatter(a.t, d, idx, src.t), {&a, &src}); break;
          case 1: push(scatter(a.t, d, idx, scalar_arg()), {&a}); break;
          case 2: push(scatter_add(a.t, d, idx, src.t), {&a, &src}); break;
          case 3: push(index_add(a.t, d, idx, src.t, scalar_arg()), {&a, &src}); break;
          default: push(index_copy(a.t, d, idx, src.t), {&a, &src}); break;
        }
        break;
      }
      case 20: {
        Entry a = pick();
        const int64_t d = dim_arg();
        Tensor idx = index_tensor(small_shape());
        push(index_fill(a.t, d, idx, scalar_arg()), {&a});
        break;
      }
      case 21: {  // index_put with i64 indices or undefined (whole dim)
        Entry a = pick();
        std::vector<Tensor> idx(count(3));
        for (auto& t : idx)
          if (flag()) t = index_tensor(small_shape());
        Entry v = pick();
        push(index_put(a.t, idx, v.t, flag()), {&a, &v});
        break;
      }
      case 22: {  // matmul family
        Entry a = pick();
        Entry b = pick();
        Tensor r;
        switch (byte() % 3) {
          case 0: r = matmul(a.t, b.t); break;
          case 1: r = bmm(a.t, b.t); break;
          default: r = a.t.matmul(b.t); break;
        }
        const double k = a.t.dim() > 0 ? static_cast<double>(a.t.size(-1)) : 1;
        push(r, {&a, &b}, k);
        break;
      }
      case 23: {
        Entry a = pick();
        const int64_t d = dim_arg();
        const std::optional<DType> dt = opt_dtype();
        push(flag() ? softmax(a.t, d, dt) : log_softmax(a.t, d, dt), {&a});
        break;
      }
      case 24: {  // conv2d with arbitrary attributes
        Entry x = pick();
        Entry w = pick();
        Tensor bias = flag() ? pick().t : Tensor();
        std::vector<int64_t> stride = sizes_arg(2), padding = sizes_arg(2), dilation = sizes_arg(2);
        const int64_t groups = size_arg();
        Tensor r = flag() ? conv2d(x.t, w.t, bias, stride, padding, dilation, groups)
                          : conv2d(x.t, w.t, bias, stride, flag() ? Padding::Same : Padding::Valid,
                                   dilation, groups);
        double k = 1;
        for (size_t i = 1; i < w.t.shape().size(); ++i) k *= static_cast<double>(w.t.shape()[i]);
        push(r, {&x, &w}, k);
        break;
      }
      case 25: {  // pooling
        Entry x = pick();
        std::vector<int64_t> kernel = sizes_arg(2), stride = sizes_arg(2), padding = sizes_arg(2);
        double k = 1;
        for (int64_t v : kernel) k *= static_cast<double>(v);
        Tensor r;
        if (flag()) {
          r = max_pool2d(x.t, kernel, stride, padding, sizes_arg(2), flag());
        } else {
          std::optional<int64_t> divisor;
          if (flag()) divisor = size_arg();
          const bool ceil_mode = flag(), include_pad = flag();
          r = avg_pool2d(x.t, kernel, stride, padding, ceil_mode, include_pad, divisor);
        }
        push(r, {&x}, k);
        break;
      }
      case 26: {  // creation with arbitrary sizes
        switch (byte() % 6) {
          case 0: push(zeros(any_shape(), dtype_arg()), {}); break;
          case 1: push(ones(any_shape(), dtype_arg()), {}); break;
          case 2: {
            const Shape s = any_shape();
            push(full(s, scalar_arg(), dtype_arg()), {});
            break;
          }
          case 3: push(arange(flag() ? extreme_int() : size_arg(), dtype_arg()), {}); break;
          case 4: push(zeros_like(pick().t), {}); break;
          default: push(randn(any_shape(), dtype_arg()), {}); break;
        }
        break;
      }
      case 27: {
        Entry c = pick();
        Entry a = pick();
        Entry b = pick();
        push(where(c.t, a.t, b.t), {&c, &a, &b});
        break;
      }
      case 28: {  // clamp
        Entry a = pick();
        std::optional<Scalar> lo, hi;
        if (flag()) lo = scalar_arg();
        if (flag()) hi = scalar_arg();
        switch (byte() % 3) {
          case 0: push(clamp(a.t, lo, hi), {&a}); break;
          case 1: {
            std::optional<Tensor> tlo, thi;
            if (flag()) tlo = pick().t;
            if (flag()) thi = pick().t;
            push(clamp(a.t, tlo, thi), {&a});
            break;
          }
          default: push(flag() ? clamp_min(a.t, scalar_arg()) : clamp_max(a.t, scalar_arg()), {&a});
        }
        break;
      }
      case 29: {
        Entry a = pick();
        push(flag() ? cast(a.t, dtype_arg()) : a.t.to(dtype_arg()), {&a});
        break;
      }
      case 30: {
        Entry a = pick();
        const int64_t d = dim_arg();
        const std::optional<DType> dt = opt_dtype();
        push(flag() ? cumsum(a.t, d, dt) : cumprod(a.t, d, dt), {&a});
        break;
      }
      case 31: {  // topk / sort
        Entry a = pick();
        const int64_t d = dim_arg();
        const double factor = 8 + std::log2(numel_of(a.t) + 1);
        if (flag()) {
          const int64_t k = size_arg();
          auto [v, i] = topk(a.t, k, d, flag(), flag());
          push(v, {&a}, factor);
          push(i, {&a}, factor);
        } else if (flag()) {
          auto [v, i] = sort(a.t, d, flag(), flag());
          push(v, {&a}, factor);
          push(i, {&a}, factor);
        } else {
          push(argsort(a.t, d, flag()), {&a}, factor);
        }
        break;
      }
      case 32: {  // in place
        Entry a = pick();
        Entry b = pick();
        const double cost = std::max(a.effective(), b.effective());
        switch (byte() % 4) {
          case 0: a.t.add_(b.t, scalar_arg()); break;
          case 1: a.t.mul_(b.t); break;
          case 2: a.t.copy_(b.t); break;
          default: a.t.zero_(); break;
        }
        updated(a, cost);
        break;
      }
      case 33: {  // index_put_ through Tensor::index's vocabulary
        Entry a = pick();
        std::vector<TensorIndex> idx = index_list();
        if (flag()) {
          a.t.index_put_(idx, scalar_arg());
          updated(a, a.effective());
        } else {
          Entry v = pick();
          const double cost = std::max(a.effective(), v.effective());
          a.t.index_put_(idx, v.t);
          updated(a, cost);
        }
        break;
      }
      case 34: {
        Entry a = pick();
        std::vector<TensorIndex> idx = index_list();
        push(a.t.index(idx), {&a}, 1, &a);
        break;
      }
      case 35: fori(); break;
      case 36: while_(); break;
      case 37: scan_(); break;
      case 38: {  // autograd
        Entry a = pick();
        switch (byte() % 4) {
          case 0: a.t.requires_grad_(flag()); break;
          case 1: {
            if (a.t.numel() == 1 && flag()) {
              a.t.backward();
            } else {
              Entry g = pick();
              a.t.backward(g.t);
            }
            grad_cost_ = std::max(grad_cost_, 3 * a.effective());
            break;
          }
          case 2: {
            Tensor g = a.t.grad();
            if (g.defined()) {
              Entry tmp{Tensor(), grad_cost_, std::make_shared<double>(0)};
              push(g, {&tmp});
            }
            break;
          }
          default: push(a.t.detach(), {&a}, 1, &a); break;
        }
        break;
      }
      case 39: {
        Entry a = pick();
        switch (byte() % 3) {
          case 0: push(a.t.clone(), {&a}); break;
          case 1: push(a.t.contiguous(), {&a}, 1, &a); break;
          default: {
            Entry b = pick();
            const double cost = std::max(a.effective(), b.effective());
            a.t.set_data(b.t);
            updated(a, cost);
            break;
          }
        }
        break;
      }
      case 40: {
        Entry a = pick();
        push(flip(a.t, dims_arg(3)), {&a});
        break;
      }
      case 41: {  // repeat / tile: result sizes multiply
        Entry a = pick();
        const std::vector<int64_t> reps = sizes_arg(5);
        push(flag() ? repeat(a.t, reps) : tile(a.t, reps), {&a});
        break;
      }
      case 42: {
        Entry a = pick();
        const std::vector<int64_t> shifts = dims_arg(2);
        push(roll(a.t, shifts, dims_arg(2)), {&a});
        break;
      }
      case 43: {
        Entry a = pick();
        push(flag() ? tril(a.t, dim_arg()) : triu(a.t, dim_arg()), {&a});
        break;
      }
      case 44: {
        Entry a = pick();
        Entry m = pick();
        if (flag()) {
          push(masked_fill(a.t, m.t, scalar_arg()), {&a, &m});
        } else {
          Entry v = pick();
          push(masked_fill(a.t, m.t, v.t), {&a, &m, &v});
        }
        break;
      }
      case 45: {
        Entry w = pick();
        Entry i = pick();
        std::optional<int64_t> padding_idx;
        if (flag()) padding_idx = dim_arg();
        const double dim = w.t.dim() > 1 ? static_cast<double>(w.t.size(1)) : 1;
        push(embedding(w.t, i.t, padding_idx), {&w, &i}, dim);
        break;
      }
      case 46: {
        Entry i = pick();
        // num_classes -1 reads the indices' values (a sync), so only within the read budget.
        const bool infer = flag() && syncable(i);
        push(one_hot(i.t, infer ? -1 : size_arg()), {&i});
        break;
      }
      case 47: {
        Entry in = pick();
        Entry a = pick();
        Entry b = pick();
        const double k = a.t.dim() > 0 ? static_cast<double>(a.t.size(-1)) : 1;
        Tensor r = flag() ? addmm(in.t, a.t, b.t, scalar_arg(), scalar_arg())
                          : baddbmm(in.t, a.t, b.t, scalar_arg(), scalar_arg());
        push(r, {&in, &a, &b}, k);
        break;
      }
      case 48: {
        Entry a = pick();
        Entry b = pick();
        Entry c = pick();
        switch (byte() % 4) {
          case 0: push(lerp(a.t, b.t, scalar_arg()), {&a, &b}); break;
          case 1: push(lerp(a.t, b.t, c.t), {&a, &b, &c}); break;
          case 2: push(addcmul(a.t, b.t, c.t, scalar_arg()), {&a, &b, &c}); break;
          default: push(addcdiv(a.t, b.t, c.t, scalar_arg()), {&a, &b, &c}); break;
        }
        break;
      }
      case 49: {
        Entry a = pick();
        std::vector<int64_t> s(count(4));
        for (auto& d : s) d = byte() % 9;
        std::optional<Tensor> w, b;
        if (flag()) w = pick().t;
        if (flag()) b = pick().t;
        push(layer_norm(a.t, s, w, b, double_arg()), {&a}, 4);
        break;
      }
      case 50: {  // einsum
        static const char* kEquations[] = {"ij,jk->ik", "ij,jk", "ii->i", "...ij,...jk->...ik",
                                           "i,i->", "bij->bji", "ij->", "i,j->ij", "ab,ab->a",
                                           "a...,a...->...", "ij,j", "->", "iij->j", "x"};
        const char* eq = kEquations[byte() % std::size(kEquations)];
        std::vector<Tensor> ops;
        double cost = 0, k = 1;
        for (size_t i = 0, n = count(3); i < n; ++i) {
          Entry e = pick();
          ops.push_back(e.t);
          cost = std::max(cost, e.effective());
          k = std::max(k, numel_of(e.t));
        }
        Tensor r = einsum(eq, ops);
        Entry tmp{Tensor(), cost, std::make_shared<double>(0)};
        push(r, {&tmp}, k);
        break;
      }
      case 51: {  // nn functional
        Entry x = pick();
        switch (byte() % 5) {
          case 0: {
            std::vector<int64_t> out = sizes_arg(2);
            push(nn::adaptive_avg_pool2d(x.t, out), {&x}, 16);
            break;
          }
          case 1: {
            std::vector<double> scale(count(2));
            for (auto& s : scale) s = double_arg();
            const std::vector<int64_t> size = scale.empty() ? sizes_arg(2) : std::vector<int64_t>{};
            push(nn::interpolate(x.t, size, scale, flag() ? "bilinear" : "nearest"), {&x}, 4);
            break;
          }
          case 2: push(nn::group_norm(x.t, size_arg()), {&x}, 4); break;
          case 3: {
            Entry t = pick();
            push(nn::cross_entropy(x.t, t.t, std::abs(double_arg()) / 8, flag() ? "sum" : "mean",
                                   dim_arg()),
                 {&x, &t}, 4);
            break;
          }
          default: {
            Entry k = pick();
            Entry v = pick();
            const double factor = x.t.dim() > 0 ? numel_of(k.t) : 1;
            push(nn::scaled_dot_product_attention(x.t, k.t, v.t, Tensor(), 0, flag()),
                 {&x, &k, &v}, factor);
            break;
          }
        }
        break;
      }
      case 52: {  // meshgrid
        std::vector<Tensor> ts;
        double cost = 0;
        for (size_t i = 0, n = count(3); i < n; ++i) {
          Entry e = pick();
          ts.push_back(e.t);
          cost = std::max(cost, e.effective());
        }
        Entry tmp{Tensor(), cost, std::make_shared<double>(0)};
        for (const Tensor& r : meshgrid(ts, flag() ? "xy" : "ij")) push(r, {&tmp});
        break;
      }
      case 53: {  // random
        switch (byte() % 4) {
          case 0: push(randint(extreme_or_small(), extreme_or_small(), any_shape(), dtype_arg()), {}); break;
          case 1: {
            Entry p = pick();
            push(bernoulli(p.t), {&p});
            break;
          }
          case 2: {
            Entry p = pick();
            push(multinomial(p.t, size_arg(), flag()), {&p}, 8);
            break;
          }
          default: {
            Entry x = pick();
            push(dropout(x.t, double_arg(), flag()), {&x});
            break;
          }
        }
        break;
      }
      case 54: sync_some(); break;
      default: {  // the most common ops again, so that programs chain them
        Entry a = pick();
        Entry b = pick();
        push(a.t + b.t, {&a, &b});
        break;
      }
    }
  }

  // x plus a few, saturating at INT64_MAX.
  int64_t near(int64_t x) {
    const int64_t d = byte() % 8;
    return x > kI64Max - d ? kI64Max : x + d;
  }
  int64_t extreme_or_small() { return byte() < 220 ? int64_t{byte() % 9} - 4 : extreme_int(); }

  std::vector<TensorIndex> index_list() {
    std::vector<TensorIndex> idx;
    for (size_t i = 0, n = count(4); i < n; ++i) {
      switch (byte() % 7) {
        case 0: idx.emplace_back(dim_arg()); break;
        case 1: {
          std::optional<int64_t> a, b, c;
          if (flag()) a = dim_arg();
          if (flag()) b = dim_arg();
          if (flag()) c = byte() < 230 ? 1 + byte() % 3 : extreme_int();
          idx.emplace_back(Slice(a, b, c));
          break;
        }
        case 2: idx.emplace_back(indexing::None); break;
        case 3: idx.emplace_back(indexing::Ellipsis); break;
        case 4: idx.emplace_back(flag()); break;
        case 5: idx.emplace_back(index_tensor(small_shape())); break;
        default: {  // any dtype: masks, ints, or refused
          // A mask is read on the host (its nonzero places shape the result): only one
          // within the read budget.
          Entry e = pick();
          if (e.t.dtype() != DType::b8 || syncable(e)) idx.emplace_back(e.t);
          break;
        }
      }
    }
    return idx;
  }

  // Loop bodies: each carry goes through one of a few shape-keeping ops (or, rarely, one that
  // is refused: a read, an in-place write to an outer tensor, a changed shape).
  static Tensor body_op(uint8_t code, const Tensor& x, const Tensor& i, const Tensor& outer) {
    switch (code % 10) {
      case 0: return x;
      case 1: return x + x;
      case 2: return neg(x);
      case 3: return x + cast(i, x.dtype());
      case 4: return outer.defined() ? x * outer : x;
      case 5: return relu(x);
      case 6: return flip(x, {0});
      case 7: return sum(x, {}, true);
      case 8: {
        (void)x.item();  // refused inside a body
        return x;
      }
      default: {
        Tensor o = outer;
        if (o.defined()) o.add_(x);  // refused inside a body
        return x;
      }
    }
  }

  std::vector<uint8_t> codes(size_t n) {
    std::vector<uint8_t> c(n);
    for (auto& x : c) x = byte() < 240 ? byte() % 6 : byte();
    return c;
  }

  void fori() {
    const size_t n = 1 + count(2);
    Carry init;
    double cost = 0, width = 0;
    for (size_t k = 0; k < n; ++k) {
      Entry e = pick();
      init.push_back(e.t);
      cost = std::max(cost, e.effective());
      width += numel_of(e.t);
    }
    Tensor outer;
    if (flag()) {
      Entry e = pick();
      outer = e.t;
      cost = std::max(cost, e.effective());
      width += numel_of(e.t);
    }
    int64_t lo = extreme_or_small();
    int64_t hi = byte() < 230 ? near(lo) : extreme_int();
    if (flag()) std::swap(lo, hi);
    const std::vector<uint8_t> c = codes(n);
    std::function<Carry(const Tensor&, const Carry&)> body;
    if (byte() != 255) {  // rarely an empty function
      body = [c, outer](const Tensor& i, const Carry& carry) {
        Carry out;
        for (size_t k = 0; k < carry.size(); ++k)
          out.push_back(body_op(c[k % c.size()], carry[k], i, outer));
        return out;
      };
    }
    const double trips = std::max(0.0, static_cast<double>(hi) - static_cast<double>(lo));
    const Carry r = fori_loop(lo, hi, body, init, flag() ? 0 : size_arg());
    Entry tmp{Tensor(), cost + trips * std::max(width, 1.0), std::make_shared<double>(0)};
    for (const Tensor& t : r) push(t, {&tmp});
  }

  void while_() {
    const int64_t start = extreme_or_small();
    const int64_t limit = byte() < 230 ? near(start) : extreme_int();
    Carry init{scalar_tensor(static_cast<double>(start), DType::i64)};
    // The f64 round trip of scalar_tensor moves large starts, and one of 2^63 or more becomes
    // INT64_MIN (as a cast converts it): trips use what the graph holds.
    const auto held = [](int64_t x) {
      const double d = static_cast<double>(x);
      return d >= 9.223372036854775807e18 ? -9.223372036854775808e18 : d;
    };
    const double trips = std::max(0.0, held(limit) - held(start)) + 2;
    double cost = 0, width = 1;
    for (size_t k = 0, n = count(2); k < n; ++k) {
      Entry e = pick();
      init.push_back(e.t);
      cost = std::max(cost, e.effective());
      width += numel_of(e.t);
    }
    const std::vector<uint8_t> c = codes(init.size());
    const uint8_t cond_kind = byte() % 4;
    const Tensor limit_t = scalar_tensor(static_cast<double>(limit), DType::i64);
    std::function<Tensor(const Carry&)> cond = [cond_kind, limit_t](const Carry& carry) {
      Tensor t = lt(carry[0], limit_t);
      switch (cond_kind) {
        case 0: return t;
        case 1: return reshape(t, {1, 1});
        case 2: return carry.size() > 1 ? logical_and(t, carry[1]) : t;  // shape from carry[1]
        default: return cast(t, DType::f32);
      }
    };
    std::function<Carry(const Carry&)> body = [c](const Carry& carry) {
      Carry out{carry[0] + 1};
      for (size_t k = 1; k < carry.size(); ++k)
        out.push_back(body_op(c[k], carry[k], carry[0], Tensor()));
      return out;
    };
    if (byte() == 255) cond = nullptr;  // empty functions
    if (byte() == 255) body = nullptr;
    const Carry r = while_loop(cond, body, init, flag() ? 0 : size_arg());
    Entry tmp{Tensor(), cost + trips * width, std::make_shared<double>(0)};
    for (const Tensor& t : r) push(t, {&tmp});
  }

  void scan_() {
    Entry carry = pick();
    Entry xs = pick();
    const uint8_t kind = byte() % 4;
    ScanFn fn = [kind](const Carry& c, const Carry& xs) -> std::pair<Carry, Carry> {
      const Tensor x = xs.empty() ? c[0] : xs[0];  // no xs: a length-only scan
      switch (kind) {
        case 0: return {{c[0] + x}, {c[0]}};
        case 1: return {{c[0]}, {x * 2}};
        case 2: return {{maximum(c[0], x)}, {}};
        default: return {{c[0] + 1}, {c[0], sum(x)}};
      }
    };
    const bool reverse = flag();
    const int64_t length = flag() ? -1 : size_arg();
    Carry xs_list;
    if (flag()) xs_list.push_back(xs.t);
    auto [fin, ys] = scan(fn, {carry.t}, xs_list, reverse, length, flag() ? 0 : size_arg());
    // The trips: the rows of xs when it is given, else the length asked for.
    const double rows = !xs_list.empty() && xs.t.dim() > 0 ? static_cast<double>(xs.t.size(0))
                                                           : std::max<double>(static_cast<double>(length), 1);
    Entry tmp{Tensor(),
              std::max(carry.effective(), xs.effective()) +
                  (rows + 1) * (numel_of(carry.t) + numel_of(xs.t) + 1),
              std::make_shared<double>(0)};
    for (const Tensor& t : fin) push(t, {&tmp});
    for (const Tensor& t : ys) push(t, {&tmp});
  }

  // ---- reading results -------------------------------------------------------------------
  bool syncable(const Entry& e) const {
    return !huge_inplace_ && e.effective() <= kMaxWork && numel_of(e.t) <= kMaxWork &&
           grad_cost_ <= kMaxWork;
  }

  static void touch(const Tensor& t) {
    const std::shared_ptr<const void> data = t.host_data();
    const size_t n = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    const auto* p = static_cast<const unsigned char*>(data.get());
    unsigned sum = 0;
    for (size_t i = 0; i < n; ++i) sum += p[i];
    volatile unsigned sink = sum;
    (void)sink;
  }

  void read(const Entry& e) {
    const Tensor& t = e.t;
    if (verbose())
      std::fprintf(stderr, "read %s%s, work %g\n", dtype_name(t.dtype()), shape_str(t.shape()).c_str(), e.effective());
    switch (byte() % 6) {
      case 0: sync({t}); break;
      case 1:
        if (t.numel() == 1) {
          (void)t.item();
        } else {
          touch(t);
        }
        break;
      case 2: touch(t); break;
      case 3:
        if (t.numel() <= 64) (void)t.to_string();
        break;
      case 4:
        switch (t.dtype()) {
          case DType::f32: (void)t.to_vector<float>(); break;
          case DType::f64: (void)t.to_vector<double>(); break;
          case DType::i32: (void)t.to_vector<int32_t>(); break;
          case DType::i64: (void)t.to_vector<int64_t>(); break;
          case DType::b8: (void)t.to_vector<bool>(); break;
          default: touch(t); break;
        }
        break;
      default: (void)graph_hash({t}); break;
    }
  }

  // Reading a value also computes every live pending tensor that shares its graph (lazyrt's
  // rule): tensors beyond the budget are let go before anything is read, so that a read stays
  // within it. Recording them was the test.
  void drop_unsyncable() {
    std::erase_if(pool_, [this](const Entry& e) { return !syncable(e); });
  }

  void sync_some() {
    drop_unsyncable();
    if (!has_pool()) return;
    if (flag()) {
      for (const Entry& e : pool_)
        if (!syncable(e)) return;
      mark_step();
      return;
    }
    std::vector<Tensor> ts;
    for (size_t i = 0, n = 1 + count(2); i < n; ++i) {
      const Entry e = pick();
      if (syncable(e)) ts.push_back(e.t);
    }
    sync(ts);
  }

  void read_all() {
    drop_unsyncable();
    for (size_t i = 0; i < pool_.size(); ++i) {
      guarded([&] {
        if (syncable(pool_[i])) read(pool_[i]);
      });
    }
  }

  FuzzedDataProvider& in_;
  std::vector<Entry> pool_;
  double grad_cost_ = 0;
  double picked_ = 0;
  bool huge_inplace_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LAZYRT_NUM_THREADS", "1", 0);
  lazyrt::cache::set_persistent_dir("");
  lazyrt::cache::set_memory_capacity(64);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  // Any other exception is left uncaught: with no handler for it, std::terminate runs at the
  // throw, so the crash report names the exception and the stack that threw it.
  try {
    lazyrt::set_backend(in.ConsumeBool() ? "reference" : "cpu");
    lazyrt::manual_seed(in.ConsumeIntegral<uint8_t>());
    Program(in).run();
  } catch (const lazyrt::Error&) {
    // Only a refusal outside any op (set_backend, manual_seed) gets here: fine.
  }
  return 0;
}
