// The default random generator. Its state is two i64 scalar tensors, seed and offset, that
// graphs read as inputs; every draw advances the offset in place by the number of counters it
// used. A traced step that draws random numbers therefore has the same graph every time, and
// replaying it advances the state like running it. Inside a loop body the offset is a carry of
// the loop (random_state.h).
#include <mutex>

#include "autograd/autograd.h"
#include "lazyrt/random.h"
#include "ops/op_helpers.h"
#include "ops/random_state.h"
#include "ops/views.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"

namespace lazyrt {
namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ull;

// An i64 scalar holding x exactly (seeds and counts beyond 2^53 do not survive a double).
Tensor i64_scalar(int64_t x) { return tensor(std::vector<int64_t>{x}, {}); }

// Every thread draws from it: a draw, a sync of its state, a replay of a step that draws, take
// `mu` (recursive: a replay syncs its pending state under it).
struct Generator {
  std::recursive_mutex mu;
  Tensor seed = i64_scalar(static_cast<int64_t>(kDefaultSeed));
  Tensor offset = scalar_tensor(0, DType::i64);
  Generator() {
    trace::impl_of(seed)->shared_state = &mu;
    trace::impl_of(offset)->shared_state = &mu;
  }
};

Generator& generator() {
  // Made at the top level even when first used inside a loop body: the state outlives it.
  // First used inside a step that compile_step traces, it is state from before that step all
  // the same (shared state: RebindJournal::existed_before), so the step reads and advances it
  // like any state it updates, rather than holding its first value as a constant.
  static Generator* g = [] {
    trace::TopLevel top;
    return new Generator();
  }();
  return *g;
}

// While a loop body is traced on this thread, the offset its draws advance: the loop's carry
// (random_state.h). Per thread: another thread's draws meanwhile advance the generator's own.
thread_local Tensor loop_offset;

Tensor draw(int64_t distribution, const Shape& shape, DType dtype, const char* op) {
  for (int64_t d : shape) LAZYRT_CHECK(d >= 0, op, ": negative dimension in shape ", shape_str(shape));
  LAZYRT_CHECK(is_floating(dtype), op, ": expects a floating dtype, got ", dtype_name(dtype));
  Generator& g = generator();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  NoGradGuard no_grad;
  Tensor& offset = loop_offset.defined() ? loop_offset : g.offset;
  Tensor r = detail::apply(ir::OpKind::Random, {g.seed, offset}, {distribution, Shape(shape), dtype});
  offset.add_(i64_scalar(shape_numel(shape)));
  return r;
}

}  // namespace

namespace detail {
Tensor exchange_random_offset(Tensor offset) {
  Generator& g = generator();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  Tensor previous = loop_offset.defined() ? loop_offset : g.offset;
  // The generator's own offset back: no loop body is traced on this thread any more.
  const bool outermost = trace::impl_of(offset) == trace::impl_of(g.offset);
  loop_offset = outermost ? Tensor() : std::move(offset);
  return previous;
}
}  // namespace detail

void manual_seed(uint64_t seed) {
  Generator& g = generator();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  // The state tensors keep their identity (captured state stays valid); only values change.
  // Every 64-bit seed its own stream: the i64 holds the seed's bits (the kernel reads them back
  // as unsigned).
  trace::impl_of(g.seed)->set_data(trace::impl_of(i64_scalar(static_cast<int64_t>(seed)))->data());
  trace::impl_of(g.offset)->set_data(trace::impl_of(scalar_tensor(0, DType::i64))->data());
}

std::pair<Tensor, Tensor> random_state() {
  Generator& g = generator();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  return {g.seed, g.offset};
}

Tensor rand(Shape shape, DType dtype) { return draw(0, shape, dtype, "rand"); }
Tensor randn(Shape shape, DType dtype) { return draw(1, shape, dtype, "randn"); }

Tensor randint(int64_t low, int64_t high, Shape shape, DType dtype) {
  LAZYRT_CHECK(low < high, "randint: low (", low, ") must be below high (", high, ")");
  int64_t range;
  LAZYRT_CHECK(!__builtin_sub_overflow(high, low, &range), "randint: the range [", low, ", ", high,
               ") holds more than 2^63 - 1 values, which is not supported");
  // u * range lies in [0, range), so truncation is the floor (capped at range - 1, as the
  // range rounded to a double may be larger).
  Tensor u = draw(0, shape, DType::f64, "randint");
  // The bounds as i64 tensors: a scalar operand becomes a full node, whose value is a double.
  const Tensor top = i64_scalar(range - 1), base = i64_scalar(low);
  return cast(clamp_max(cast(u * static_cast<double>(range), DType::i64), top) + base, dtype);
}

Tensor bernoulli(const Tensor& p) {
  LAZYRT_CHECK(is_floating(p.dtype()), "bernoulli: probabilities must be floating, got ",
               dtype_name(p.dtype()));
  // As torch, a probability outside [0, 1] (or NaN) is refused, when the graph runs.
  Tensor q = detail::detached_value(p);
  q = detail::apply(ir::OpKind::Check, {q, logical_and(q >= 0.0, q <= 1.0)},
                    {static_cast<int64_t>(ir::CheckKind::BernoulliProbability)});
  return cast(rand(p.shape(), p.dtype()) < q, p.dtype());
}

Tensor bernoulli(Shape shape, double p, DType dtype) {
  LAZYRT_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got ", p);
  return cast(rand(std::move(shape), dtype) < p, dtype);
}

Tensor dropout_mask(Shape shape, double p, DType dtype) {
  LAZYRT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  return cast(rand(std::move(shape), dtype) >= p, dtype) * (1.0 / (1.0 - p));
}

Tensor dropout(const Tensor& x, double p, bool training) {
  LAZYRT_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  if (p == 1) return x * 0.0;
  return x * dropout_mask(x.shape(), p, is_floating(x.dtype()) ? x.dtype() : DType::f32);
}

// With replacement: u uniform per sample, and the category is the number of cumulative
// weights (normalized) at or below u: the first category whose cumulative weight exceeds u,
// so a zero weight is never drawn. Without: the Gumbel top-k, log(w) - log(-log(u)).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  LAZYRT_CHECK(probs.defined(), "multinomial: probs is an undefined tensor");
  LAZYRT_CHECK(is_floating(probs.dtype()) && (probs.dim() == 1 || probs.dim() == 2),
               "multinomial: probs must be a floating [C] or [N, C] tensor, got ", dtype_name(probs.dtype()),
               shape_str(probs.shape()));
  const int64_t classes = probs.shape().back();
  LAZYRT_CHECK(classes > 0, "multinomial: probs must have at least one category, got ", shape_str(probs.shape()));
  LAZYRT_CHECK(num_samples > 0, "multinomial: num_samples must be positive, got ", num_samples);
  LAZYRT_CHECK(replacement || num_samples <= classes, "multinomial: cannot draw ", num_samples,
               " samples without replacement from ", classes, " categories");
  const Tensor w = probs.dim() == 1 ? unsqueeze(detail::detached_value(probs), 0) : detail::detached_value(probs);
  const DType t = DType::f64;
  const int64_t rows = w.shape()[0];
  Tensor out;
  if (replacement) {
    Tensor wt = cast(w, t);
    Tensor cdf = cumsum(wt, 1) / sum(wt, {1}, true);                            // [N, C]
    Tensor u = rand({rows, num_samples, 1}, t);                                 // [N, S, 1]
    Tensor below = cast(unsqueeze(cdf, 1) <= u, DType::i64);                    // [N, S, C]
    out = clamp_max(sum(below, {2}), classes - 1);
  } else {
    Tensor u = rand({rows, classes}, t);
    Tensor keys = log(cast(w, t)) - log(-log(u));
    out = topk(keys, num_samples, 1).second;
  }
  return probs.dim() == 1 ? squeeze(out, 0) : out;
}

}  // namespace lazyrt
