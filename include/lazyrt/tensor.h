// Lazy tensors. A Tensor is a cheap handle to shared state: its shape and dtype, and either
// device data (a materialized buffer) or a pending IR value. Ops record IR and return at once;
// values are computed at a sync point (mark_step(), sync(), or reading a value).
//
// Thread-safety: threads may trace, sync and read graphs of their own tensors at once (graphs
// of one structure share executables), compile and replay steps of their own models, and use
// the caches and metrics; each gets the values the same work done sequentially gives, bit for
// bit (docs/design.md, "Threads"; tests/cpp/threads). A pending value belongs to the thread
// that recorded it: mark_step() syncs the calling thread's, and so do compile_step's trace and
// the low-level replay calls of replay.h look at the calling thread's only. Not at once:
// tracing one graph (or one tensor) from two threads. Random draws from several threads are
// safe, each taking its own part of the one stream, but which part depends on timing. Creating
// an optimizer or switching a module's mode makes every compiled step retrace on its next call.
#pragma once

#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lazyrt/types.h"

namespace lazyrt {

namespace trace {
struct TensorImpl;
struct TensorAccess;
}
namespace indexing {
class TensorIndex;
}

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor; every accessor but defined() throws

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t size(int64_t d) const;  // negative d counts from the end
  DType dtype() const;
  bool is_pending() const;  // holds un-materialized IR

  /// Syncs this tensor and copies its elements out in row-major order. T must match the
  /// dtype (float: f32, double: f64, int32_t: i32, int64_t: i64, bool: b8).
  template <class T>
  std::vector<T> to_vector() const;
  /// The value of a one-element tensor as a double; syncs.
  double item() const;
  /// Syncs and gives the elements in host memory, row-major (bf16/f16 as 16-bit patterns), kept
  /// alive by the result: the tensor's own memory where the backend's device is the host (no
  /// copy; never write through it), else a host copy.
  std::shared_ptr<const void> host_data() const;
  /// The device memory holding this tensor's value, or null while the value is pending; does not
  /// sync. It shares ownership with that memory: use_count() counts every tensor and view
  /// holding it, this pointer included. For front ends that lend lazyrt's memory to another
  /// framework without a copy (never write through it).
  std::shared_ptr<void> storage() const;
  /// Syncs and formats like PyTorch: tensor([[1., 2.], [3., 4.]]).
  std::string to_string() const;

  // In place: the handle keeps its identity and gets a new value. The new value must have
  // this tensor's shape (after broadcasting the right-hand side) and dtype.
  Tensor& add_(const Tensor& other, Scalar alpha = 1);
  Tensor& mul_(const Tensor& other);
  Tensor& copy_(const Tensor& src);
  Tensor& zero_();

  /// Python's indexing, as PyTorch does it (libtorch's Tensor::index): t.index({0, Slice(1, 3),
  /// None, Ellipsis, idx}) is t[0, 1:3, None, ..., idx]. Ints select (negative ones count from
  /// the end), slices take positive steps, None adds a dim, Ellipsis stands for the dims not
  /// named, bools add a dim of size 1 (true) or 0 (false). Index tensors (i64 with dims, or a
  /// 0-dim i64/i32 that acts as an int) are advanced indices: they broadcast together, and
  /// their result dims replace theirs where they are adjacent, else go first (NumPy's rule).
  /// A b8 mask picks the elements where it is true: the result's shape depends on the mask's
  /// values, so they are read (a sync, counted as DynamicShapeSync). An index tensor's values
  /// are checked when the graph runs. Without index tensors or masks the result is a view, as in
/// PyTorch; with them, a tensor of its own.
  Tensor index(std::vector<indexing::TensorIndex> indices) const;
  /// Python's t[indices] = value, as PyTorch does it: value broadcasts to t.index(indices)'s
  /// shape (leading dims of size 1 dropped first). Without index tensors it is cast to this
  /// tensor's dtype; with them it must have this dtype, as in PyTorch (a one-element value with
  /// a lone mask excepted). The tensor is rebound to a new value, like every in-place op; where
  /// integer indices repeat, the last write wins. t[mask] = value keeps the graph static (no
  /// read of the mask) unless the value has one element per true of the mask.
  Tensor& index_put_(std::vector<indexing::TensorIndex> indices, const Tensor& value);
  Tensor& index_put_(std::vector<indexing::TensorIndex> indices, Scalar value);

  // Autograd.
  Tensor& requires_grad_(bool requires_grad = true);
  bool requires_grad() const;
  bool is_leaf() const;  // no grad_fn: made by the user, not by a recorded op
  /// The accumulated gradient; undefined until a backward pass reaches this tensor.
  Tensor grad() const;
  /// Replaces the gradient (an undefined tensor clears it, as `p.grad = None`).
  void set_grad(const Tensor& grad);
  /// Accumulates d(this)/d(leaf) * gradient into the .grad of every leaf that requires grad.
  /// For a one-element tensor the gradient may be omitted (ones). The backward ops are lazy:
  /// they join the pending graph. The saved values are freed afterwards.
  void backward(const Tensor& gradient = Tensor()) const;
  /// A view of this tensor that does not require grad (PyTorch's detach() and .data): writes
  /// through it change this tensor's value but not its autograd history.
  Tensor detach() const;
  /// A copy that keeps the autograd history (as torch's clone). Values are immutable, so it
  /// costs nothing unless it must go through an op for gradients to flow back.
  Tensor clone() const;

  // Views, as in PyTorch. reshape/view, permute/transpose, expand, slicing and basic indexing,
  // narrow, select, split/chunk, squeeze/unsqueeze, flatten and detach return views: an
  // in-place op on a view changes its base and every other view of it, and one on the base shows
  // through its views (compiled steps and replays included). Each holds a value of its own in
  // the graph (docs/design.md, "Views"). Writing through an expanded view is refused.
  bool is_view() const;
  /// PyTorch's layout, which decides where reshape() aliases (else it copies) and view() works.
  std::vector<int64_t> strides() const;
  int64_t storage_offset() const;
  bool is_contiguous() const;
  /// This tensor when contiguous, else a contiguous copy (which keeps the autograd history).
  Tensor contiguous() const;
  /// PyTorch's `t.data = value`: this tensor takes value's value (same shape and dtype) and
  /// keeps its autograd state; its views see the new value. A view stops being one.
  void set_data(const Tensor& value);

  // Method forms of common ops.
  Tensor sum(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor mean(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor reshape(Shape shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor matmul(const Tensor& other) const;
  Tensor to(DType dtype) const;

  // The state behind the handle is the runtime's own (trace::TensorAccess).
 private:
  friend struct trace::TensorAccess;
  explicit Tensor(std::shared_ptr<trace::TensorImpl> impl);
  std::shared_ptr<trace::TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- indexing: the vocabulary of Tensor::index / index_put_ (libtorch's names) ---------------
namespace indexing {

struct EllipsisIndexType {
  explicit constexpr EllipsisIndexType() = default;
};
/// `...` in Python.
inline constexpr EllipsisIndexType Ellipsis{};
/// `None` in Python: a new dim of size 1 (also an absent bound of a Slice).
inline constexpr std::nullopt_t None = std::nullopt;

/// start:stop:step in Python; absent bounds take the whole dim, negative ones count from the
/// end, and out-of-range ones are clamped. step must be positive, as in PyTorch.
struct Slice {
  Slice(std::optional<int64_t> start = std::nullopt, std::optional<int64_t> stop = std::nullopt,
        std::optional<int64_t> step = std::nullopt)
      : start(start), stop(stop), step(step) {}
  std::optional<int64_t> start, stop, step;
};

/// One entry of an index: an int, a Slice, None, Ellipsis (or "..."), a bool, or a Tensor.
class TensorIndex {
 public:
  enum class Kind : uint8_t { None, Ellipsis, Integer, Boolean, Slice, Tensor };

  TensorIndex(std::nullopt_t) : kind_(Kind::None) {}  // NOLINT(runtime/explicit)
  TensorIndex(EllipsisIndexType) : kind_(Kind::Ellipsis) {}  // NOLINT(runtime/explicit)
  /// "..." (anything else throws lazyrt::Error).
  TensorIndex(const char* ellipsis);  // NOLINT(runtime/explicit)
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  TensorIndex(T i) : kind_(Kind::Integer), integer_(static_cast<int64_t>(i)) {}  // NOLINT
  template <class T, std::enable_if_t<std::is_same_v<T, bool>, int> = 0>
  TensorIndex(T b) : kind_(Kind::Boolean), integer_(b ? 1 : 0) {}  // NOLINT
  TensorIndex(Slice s) : kind_(Kind::Slice), slice_(s) {}  // NOLINT(runtime/explicit)
  TensorIndex(Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_ellipsis() const { return kind_ == Kind::Ellipsis; }
  bool is_integer() const { return kind_ == Kind::Integer; }
  bool is_boolean() const { return kind_ == Kind::Boolean; }
  bool is_slice() const { return kind_ == Kind::Slice; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }
  int64_t integer() const { return integer_; }
  bool boolean() const { return integer_ != 0; }
  const Slice& slice() const { return slice_; }
  const Tensor& tensor() const { return tensor_; }

 private:
  Kind kind_;
  int64_t integer_ = 0;
  Slice slice_;
  Tensor tensor_;
};

}  // namespace indexing

/// Whether ops record gradients on this thread (torch.is_grad_enabled), and setting it.
bool grad_enabled();
void set_grad_enabled(bool on);

/// RAII: ops inside record no gradient (optimizer updates, evaluation). Per thread.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// ---- creation -------------------------------------------------------------------------
// tensor(), scalar_tensor() make device data: graph inputs, never baked into a graph.
// zeros/ones/full/arange are recorded lazily as constants of the graph.
Tensor tensor(const std::vector<float>& data, Shape shape);
Tensor tensor(const std::vector<double>& data, Shape shape);
Tensor tensor(const std::vector<int32_t>& data, Shape shape);
Tensor tensor(const std::vector<int64_t>& data, Shape shape);
Tensor tensor(const std::vector<bool>& data, Shape shape);
/// A braced list of numbers, converted to `dtype` (f32 unless given): tensor({1, 2}, {2}).
Tensor tensor(std::initializer_list<double> values, Shape shape, DType dtype = DType::f32);
/// Device data from raw bytes in row-major order (bf16/f16 as their 16-bit patterns).
Tensor from_blob(const void* data, Shape shape, DType dtype);
/// Device data adopted without a copy: the tensor reads the memory at `data` (row-major, as
/// above, aligned for dtype) where it lies. lazyrt never writes into adopted memory (results
/// always go to buffers of its own) unless `writable`: the owner then lends it for in-place
/// updates, and a replay that updates this tensor in place (compile_step, run_cached_graph)
/// writes the new value into the memory itself, where the owner sees it (syncs still never
/// do). The caller must then not let other tensors it hands to the same replay overlap the
/// memory. lazyrt calls `release` once nothing holds the memory any more (no tensor, no graph),
/// on whichever thread drops it last; for an empty shape at once.
Tensor from_blob(void* data, Shape shape, DType dtype, std::function<void()> release, bool writable = false);
Tensor scalar_tensor(double value, DType dtype = DType::f32);
Tensor zeros(Shape shape, DType dtype = DType::f32);
Tensor ones(Shape shape, DType dtype = DType::f32);
Tensor full(Shape shape, Scalar value, DType dtype = DType::f32);
Tensor arange(int64_t n, DType dtype = DType::i64);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

// ---- elementwise -----------------------------------------------------------------------
// The plain elementwise ops of the op table (lazyrt/ops.def, its api column), with PyTorch's
// type promotion: neg, abs, exp, log, sqrt, rsqrt, relu, sigmoid, tanh, isnan, logical_not,
// sin, cos, log1p, expm1, erf, atan, floor, ceil, round, sign (one tensor); mul, div, atan2,
// maximum, minimum, eq, ne, lt, le, gt, ge, logical_and, logical_or (a tensor and a tensor or
// a number). The row's comment says what each computes.
#define LAZYRT_API_Public(name)
#define LAZYRT_API_Internal(name)
#define LAZYRT_API_Unary(name) Tensor name(const Tensor& a);
#define LAZYRT_API_UnaryFloat(name) Tensor name(const Tensor& a);
#define LAZYRT_API_Arith(name) \
  Tensor name(const Tensor& a, const Tensor& b); \
  Tensor name(const Tensor& a, Scalar b);
#define LAZYRT_API_ArithFloat(name) LAZYRT_API_Arith(name)
#define OP(Enum, name, operands, rule, flags, attrs, aten, api, grad) LAZYRT_API_##api(name)
#include "lazyrt/ops.def"
#undef OP
#undef LAZYRT_API_Public
#undef LAZYRT_API_Internal
#undef LAZYRT_API_Unary
#undef LAZYRT_API_UnaryFloat
#undef LAZYRT_API_Arith
#undef LAZYRT_API_ArithFloat

Tensor cast(const Tensor& a, DType dtype);
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, Scalar exponent);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, Scalar b);
Tensor operator!=(const Tensor& a, Scalar b);
Tensor operator<(const Tensor& a, Scalar b);
Tensor operator<=(const Tensor& a, Scalar b);
Tensor operator>(const Tensor& a, Scalar b);
Tensor operator>=(const Tensor& a, Scalar b);

// ---- reductions ------------------------------------------------------------------------
// dims empty means every dim. Negative dims count from the end.
Tensor sum(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);

// ---- linear algebra and shape ----------------------------------------------------------
/// PyTorch's matmul: 1-D and 2-D operands, and batched operands with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor reshape(const Tensor& a, Shape shape);  // one dim may be -1
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, std::vector<int64_t> dims);
Tensor expand(const Tensor& a, Shape shape);  // -1 keeps a dim
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, int64_t dim);  // no-op when that dim is not 1

// ---- shape, indexing and NN ops (PyTorch's names, arguments and defaults) ---------------
// As torch.* and torch.nn.functional.*: negative dims count from the end, indices are i64
// (i32 where torch takes it too) and are checked against the sizes when the graph runs.
// lazyrt has no views: results hold their own values, except that an op that changes
// nothing (a full slice, a reshape to the same shape) may return its input.

/// reshape under PyTorch's other name.
Tensor view(const Tensor& a, Shape shape);
/// Dims start_dim..end_dim merged into one; a 0-dim tensor becomes [1].
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
/// a[start:end:step] along dim (Python's a[..., start:end:step]). start and end may be
/// negative (counted from the end) and are clamped to the dim as torch does; step > 0.
Tensor slice(const Tensor& a, int64_t dim = 0, std::optional<int64_t> start = std::nullopt,
             std::optional<int64_t> end = std::nullopt, int64_t step = 1);
/// length elements of dim from start (which may be negative); no clamping.
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
/// The slice of a at position `index` along dim, that dim removed (a view, as select with an
/// int): index is a one-element integer tensor read when the graph runs, so a loop body may
/// select by its counter. Negative positions count from the end; one out of range fails then.
Tensor select(const Tensor& a, int64_t dim, const Tensor& index);
/// narrow with a tensor start (one integer, read when the graph runs), as select above.
Tensor narrow(const Tensor& a, int64_t dim, const Tensor& start, int64_t length);
/// Concatenation along dim, in the dtype torch.cat promotes the inputs to. 1-D empty tensors
/// (shape [0]) are skipped, as torch does for legacy reasons.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// The tensors (of one shape) stacked along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Pieces of split_size along dim (the last may be smaller). A braced single number,
/// split(t, {n}), picks this overload, as in libtorch.
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
/// Pieces of the given sizes, which must add up to the size of dim.
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& split_sizes, int64_t dim = 0);
std::vector<Tensor> split_with_sizes(const Tensor& a, const std::vector<int64_t>& split_sizes,
                                     int64_t dim = 0);
/// At most `chunks` pieces of ceil(size / chunks) along dim, as torch.chunk.
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);
/// The order of elements reversed along each of dims.
Tensor flip(const Tensor& a, std::vector<int64_t> dims);
/// Tiled repeats[i] times along dim i; extra leading repeats add leading dims.
Tensor repeat(const Tensor& a, std::vector<int64_t> repeats);
/// torch.nn.functional.pad in constant mode: (left, right) pairs from the last dim backwards;
/// negative pads crop.
Tensor pad(const Tensor& a, std::vector<int64_t> pad, Scalar value = 0);

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);  // index: 1-D
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
/// A copy of a with a[..., index[i][j], ...] = src[i][j] along dim (the last write wins on
/// repeated indices, as in torch on CPU).
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value);
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
/// A copy of a with alpha * source added to the slices of dim that index names.
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source,
                 Scalar alpha = 1);
/// Advanced indexing assignment (torch.index_put): a copy of a with a[indices...] = values, the
/// indices being i64 tensors (or b8 masks, whose values are read, see Tensor::index) that
/// broadcast together; an undefined Tensor stands for a whole dim (":"). values broadcasts to
/// the indexed shape and has a's dtype. With accumulate the values are added instead, repeated
/// indices adding up; without, the last write wins.
Tensor index_put(const Tensor& a, const std::vector<Tensor>& indices, const Tensor& values,
                 bool accumulate = false);
/// A copy of a with the slices of dim that index (i64, 1-D or 0-dim) names replaced by the
/// slices of source (a's dtype; source's dim has index.numel() entries), as torch.index_copy.
Tensor index_copy(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source);
/// A copy of a with the slices of dim that index names set to value (a number, or a 0-dim
/// tensor), as torch.index_fill. Negative indices count from the end.
Tensor index_fill(const Tensor& a, int64_t dim, const Tensor& index, Scalar value);
Tensor index_fill(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& value);
/// value where mask (b8, broadcast with a) is true; value converted to a's dtype.
Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value);
Tensor masked_fill(const Tensor& a, const Tensor& mask, const Tensor& value);  // 0-dim value
/// The lower (upper) triangle of the last two dims, from `diagonal` on; the rest zero.
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);
/// Rows of weight [num, dim] picked by indices: shape indices.shape + [dim]. Rows picked by
/// padding_idx get no gradient.
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> padding_idx = std::nullopt);
/// i64 one-hot rows of num_classes. num_classes = -1 takes max(indices) + 1, which reads the
/// indices (a sync). With num_classes given nothing is read, so an index outside
/// [0, num_classes) gives a row of zeros where torch raises.
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);

/// Batched matrix product of [b, n, k] and [b, k, m] (no broadcasting).
Tensor bmm(const Tensor& a, const Tensor& b);
/// beta * input + alpha * (mat1 @ mat2); input broadcasts to the product's shape, and with
/// beta == 0 it is ignored (nan and inf included).
Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2, Scalar beta = 1,
             Scalar alpha = 1);
/// 2-D convolution of input [N, C, H, W] (or unbatched [C, H, W]) with weight
/// [O, C / groups, kH, kW] and an optional bias [O]. stride, padding and dilation take one
/// value for both dims or one per dim.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
              std::vector<int64_t> dilation = {1}, int64_t groups = 1);
/// PyTorch's padding strings: "valid" (none) and "same" (the output keeps the input's size;
/// stride 1 only; an odd total pads one more at the end, as PyTorch).
enum class Padding { Valid, Same };
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::vector<int64_t> stride,
              Padding padding, std::vector<int64_t> dilation = {1}, int64_t groups = 1);
/// 2-D max pooling of [N, C, H, W] or [C, H, W]; stride defaults to kernel_size.
Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0},
                  std::vector<int64_t> dilation = {1}, bool ceil_mode = false);
/// max_pool2d and the place of each maximum in its input plane (row * W + column, i64), as
/// torch.nn.functional.max_pool2d(..., return_indices=True): the first maximum of a window,
/// or its last NaN.
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, std::vector<int64_t> kernel_size,
                                                  std::vector<int64_t> stride = {},
                                                  std::vector<int64_t> padding = {0},
                                                  std::vector<int64_t> dilation = {1}, bool ceil_mode = false);
/// 2-D average pooling; padded elements count toward the divisor unless count_include_pad
/// is false; divisor_override replaces the divisor.
Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0},
                  bool ceil_mode = false, bool count_include_pad = true,
                  std::optional<int64_t> divisor_override = std::nullopt);
// ---- math: functions, activations, reductions, normalization ---------------------------
// PyTorch's semantics and defaults (torch 1.13): integer and bool inputs of floating functions
// compute in f32, operands broadcast and promote as in torch, negative dims count from the
// end, and where torch accepts None the argument is a std::optional.

// Elementwise functions (the plain ones are above).
Tensor reciprocal(const Tensor& a);  // 1 / a; integers give f32
/// Rounded (half to even) to `decimals` decimal places, as torch.round(a, decimals=):
/// round(a * 10^decimals) / 10^decimals in a's dtype (negative decimals: tens, hundreds, ...).
/// Floating tensors only, unless decimals is 0.
Tensor round(const Tensor& a, int64_t decimals);
/// Bounds a to [min, max]; either bound may be absent, not both. A nan in a stays nan. With
/// min > max every element is max. Scalar bounds take part in type promotion as numbers (an
/// i64 tensor clamped to 0.5 becomes f32). As in torch, a nan in a tensor bound gives nan
/// there; a nan scalar bound makes every element nan when both bounds are given, and is
/// ignored when it is the only one.
Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt);
Tensor clamp(const Tensor& a, const std::optional<Tensor>& min,
             const std::optional<Tensor>& max = std::nullopt);
/// start + weight * (end - start), computed from the nearer end as torch does (for
/// |weight| >= 0.5: end - (end - start) * (1 - weight)). Floating tensors of one dtype.
Tensor lerp(const Tensor& start, const Tensor& end, Scalar weight);
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);
/// a + value * t1 * t2, and a + value * t1 / t2 (not for two integer t1, t2, as in torch).
Tensor addcmul(const Tensor& a, const Tensor& t1, const Tensor& t2, Scalar value = 1);
Tensor addcdiv(const Tensor& a, const Tensor& t1, const Tensor& t2, Scalar value = 1);
Tensor isinf(const Tensor& a);
Tensor isfinite(const Tensor& a);
/// nan, +inf and -inf replaced; infinities default to the dtype's largest and lowest finite
/// values. Integer and bool tensors are returned unchanged.
Tensor nan_to_num(const Tensor& a, std::optional<double> nan = 0.0,
                  std::optional<double> posinf = std::nullopt,
                  std::optional<double> neginf = std::nullopt);

// Activations (floating tensors only, as in torch).
/// approximate: "none" (the exact erf form) or "tanh".
Tensor gelu(const Tensor& a, std::string_view approximate = "none");
Tensor silu(const Tensor& a);
/// log(1 + exp(beta a)) / beta, and a itself where beta a > threshold.
Tensor softplus(const Tensor& a, Scalar beta = 1, Scalar threshold = 20);
Tensor leaky_relu(const Tensor& a, Scalar negative_slope = 0.01);

// Reductions. dims empty means every dim.
/// The product of all elements, or along one dim. Integer and bool tensors give i64.
Tensor prod(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
/// Variance: sum((a - mean)^2) / max(count - correction, 0); correction 1 is the unbiased
/// estimate, 0 the population variance. Floating tensors only. std is its square root.
Tensor var(const Tensor& a, std::vector<int64_t> dims = {}, double correction = 1,
           bool keepdim = false);
Tensor std(const Tensor& a, std::vector<int64_t> dims = {}, double correction = 1,
           bool keepdim = false);
/// log(sum(exp(a))) with the maximum taken out first; -inf for an all -inf or empty slice.
/// Integer and bool tensors compute in f32.
Tensor logsumexp(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
/// The index (i64) of the first largest / smallest element along dim, or in the flattened
/// tensor when dim is absent (keepdim then keeps every dim as 1). A nan counts as the largest
/// and the smallest. Not for b8 tensors or empty dims.
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
/// Whether every / any element is non-zero (b8). True / false over an empty dim.
Tensor all(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor any(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
/// Vector p-norm over dims for p = 1, 2 or INFINITY (max |a|). Floating tensors only.
Tensor norm(const Tensor& a, double p = 2, std::vector<int64_t> dims = {}, bool keepdim = false);

// Normalization.
/// exp(a) / sum(exp(a)) along dim, and its logarithm, with the maximum subtracted first so
/// large inputs do not overflow. With dtype the input is cast to it first (how integer
/// tensors are used, as in torch); otherwise it must be floating.
Tensor softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype = std::nullopt);
Tensor log_softmax(const Tensor& a, int64_t dim, std::optional<DType> dtype = std::nullopt);
/// Normalizes over the last normalized_shape.size() dims (which must equal normalized_shape):
/// (a - mean) / sqrt(var + eps) with the biased variance, then * weight + bias when given
/// (each of normalized_shape, a's dtype).
Tensor layer_norm(const Tensor& a, const Shape& normalized_shape,
                  const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);

// Along one dim.
/// The running sum / product along dim. Integer and bool tensors give i64 (as in torch);
/// with dtype the input is cast to it first. Floating sums accumulate in double.
Tensor cumsum(const Tensor& a, int64_t dim, std::optional<DType> dtype = std::nullopt);
Tensor cumprod(const Tensor& a, int64_t dim, std::optional<DType> dtype = std::nullopt);
/// Sorted values and their indices (i64) along dim. The sort is always stable (equal values
/// keep their order, so `stable` changes nothing); nan sorts above every number. A 0-dim
/// tensor sorts as one element.
std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim = -1, bool descending = false,
                               bool stable = false);
Tensor argsort(const Tensor& a, int64_t dim = -1, bool descending = false, bool stable = false);
/// The k largest (smallest) values along dim and their indices, in sorted order whether or not
/// `sorted` asks for it; ties go to the lower index.
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true,
                               bool sorted = true);
/// The largest (smallest) value along dim and its index (i64), as torch.max(a, dim) and
/// torch.min(a, dim): nan wins in both (it propagates), and ties go to the first index.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
/// clamp with one bound.
Tensor clamp_min(const Tensor& a, Scalar min);
Tensor clamp_min(const Tensor& a, const Tensor& min);
Tensor clamp_max(const Tensor& a, Scalar max);
Tensor clamp_max(const Tensor& a, const Tensor& max);

// Shape compositions.
/// Elements shifted by shifts[i] along dims[i], wrapping around; without dims the flattened
/// tensor is rolled and the shape restored.
Tensor roll(const Tensor& a, std::vector<int64_t> shifts, std::vector<int64_t> dims = {});
/// a repeated reps[i] times along dim i; fewer reps than dims are padded with leading ones
/// (the difference from repeat).
Tensor tile(const Tensor& a, std::vector<int64_t> reps);
/// Coordinate grids of 1-D (or 0-dim) tensors of one dtype: indexing "ij" (matrix) or "xy"
/// (Cartesian: the first two dims swapped).
std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing = "ij");
/// beta * input + alpha * (batch1 @ batch2) for [b, n, k] x [b, k, m]; input broadcasts to
/// [b, n, m], and with beta == 0 it is ignored (nan and inf included).
Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, Scalar beta = 1,
               Scalar alpha = 1);
/// Einstein summation, as torch.einsum: "ij,jk->ik", implicit outputs ("ij,jk": the labels
/// used once, sorted), "..." for broadcast dims, and a label repeated in one operand (its
/// diagonal). Contracts pairwise from the left through batched matmuls.
Tensor einsum(std::string_view equation, const std::vector<Tensor>& operands);

// ---- sync ------------------------------------------------------------------------------
/// Syncs every live tensor that holds pending IR recorded on the calling thread, as one graph.
/// Other threads' pending values are theirs to sync.
void mark_step();
/// Syncs these tensors, as one graph.
void sync(const std::vector<Tensor>& tensors);
/// Marks dim `dim` of `t` dynamic, as torch._dynamo.mark_dynamic does: a graph that reads t's
/// data (a pending t once it holds data) is compiled once for every size of that dim in its
/// bucket (the next power of two),
/// padded there and masked wherever padding would change a value; the results of such a graph
/// carry the mark on the dims that derive from it. A graph no rule can pad compiles as traced
/// (metrics counter PolymorphicRefused). Throws lazyrt::Error for a dim out of range or a view.
void mark_dynamic(const Tensor& t, int64_t dim);
/// As mark_dynamic, but the dim gives way (stays static in that graph) where it meets a
/// static dim of its size, as torch._dynamo.maybe_mark_dynamic: dynamic=True marks every dim
/// of every input so. The results of a graph carry such marks on the dims that derive from
/// marked ones.
void maybe_mark_dynamic(const Tensor& t, int64_t dim);
/// The dims of `t` marked dynamic either way, in order.
std::vector<int64_t> dynamic_dims(const Tensor& t);
/// The hash under which the pending graph of these tensors (with the in-place updates of the
/// tensors it reads, see replay.h) is compiled and cached. Nothing is executed and the tensors
/// stay pending. The zero hash when none of them is pending.
GraphHash graph_hash(const std::vector<Tensor>& outputs);

}  // namespace lazyrt
