// Shape and indexing ops with PyTorch's semantics. The IR ops among them (slice, pad, flip,
// concat, index_select, gather, scatter, scatter_add, index_add) are recorded with
// normalized attributes (dims wrapped, bounds clamped); the rest are exact compositions:
// view / flatten (reshape), narrow / split / chunk (slice), stack (reshape + concat), repeat
// (reshape + expand + reshape), masked_fill / tril / triu (where). Python's indexing
// (Tensor::index, index_put_, index_put, index_copy, index_fill) composes them too: see the
// section at the end.
//
// As everywhere in src/ops, every argument is checked before the first node is recorded.
#include <algorithm>
#include <numeric>
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "lazyrt/tensor.h"
#include "ops/op_helpers.h"
#include "ops/views.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"
#include "util/metrics_cells.h"

namespace lazyrt {

using detail::apply;
using detail::cast_to;
using detail::constant_tensor;
using detail::impl_of;
using detail::make_view;
using detail::strides_of;
using detail::wrap_dim;
using ir::OpKind;

namespace {

void check_has_dims(const Tensor& a, const char* op) {
  LAZYRT_CHECK(!impl_of(a, op).type.shape.empty(), op, ": cannot be applied to a 0-dim tensor");
}

// a[start:end:step] along dim, bounds already normalized (0 <= start <= end <= size).
Tensor slice_dim(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const Shape& s = a.shape();
  if (start == 0 && end == s[dim] && (step == 1 || s[dim] <= 1)) return a;
  std::vector<int64_t> starts(s.size(), 0), steps(s.size(), 1);
  Shape ends = s;
  starts[dim] = start;
  ends[dim] = end;
  steps[dim] = step;
  Tensor r = apply(OpKind::Slice, {a}, {starts, ends, steps});
  const auto& t = *trace::impl_of(a);
  std::vector<int64_t> strides = strides_of(t);
  const int64_t offset = detail::stride_mul_add(start, strides[dim], t.storage_offset);
  strides[dim] = detail::stride_mul_add(strides[dim], step);
  make_view(a, r, {trace::ViewStep::Kind::Slice, s, std::move(starts), std::move(ends), std::move(steps), nullptr},
            std::move(strides), offset);
  return r;
}

// A split into more tensors than this is refused: each piece is a tensor of its own on the
// host (torch would try, and run out of memory).
constexpr int64_t kMaxPieces = int64_t{1} << 24;
void check_piece_count(const char* op, int64_t n, const Shape& shape) {
  LAZYRT_CHECK(n <= kMaxPieces, op, ": ", n, " pieces of ", shape_str(shape), " are more than lazyrt returns (2^24)");
}

// Pieces of the given sizes (each >= 0, adding up to the size of dim).
std::vector<Tensor> pieces(const Tensor& a, int64_t dim, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t n : sizes) {
    out.push_back(slice_dim(a, dim, start, start + n, 1));
    start += n;
  }
  return out;
}

std::string shapes_str(const std::vector<Tensor>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + shape_str(ts[i].shape());
  return s;
}

// Runs fn on a, index and src viewed as 1-D when a is 0-dim (as torch allows for gather and
// scatter), and gives the result a's shape back.
template <class Fn>
Tensor on_scalars(const Tensor& a, const Tensor& index, const Tensor* src, Fn&& fn) {
  if (a.dim() != 0 || index.dim() != 0 || (src && src->dim() != 0)) return fn(a, index, src);
  Tensor s1 = src ? reshape(*src, {1}) : Tensor();
  return reshape(fn(reshape(a, {1}), reshape(index, {1}), src ? &s1 : nullptr), {});
}

}  // namespace

// ---- shape ------------------------------------------------------------------------------------

Tensor view(const Tensor& a, Shape shape) {
  Tensor r;
  try {
    r = reshape(a, std::move(shape));
  } catch (const Error& e) {
    throw Error(std::string("view: ") + e.what());
  }
  LAZYRT_CHECK(r.shape() == a.shape() || trace::impl_of(r)->view_of, "view: size ", shape_str(r.shape()),
               " is not compatible with the input's size ", shape_str(a.shape()), " and strides ",
               shape_str(strides_of(*trace::impl_of(a))),
               " (at least one dim spans two runs of memory, as after a transpose); use reshape(), which copies");
  return r;
}

Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) {
  impl_of(a, "flatten");
  start_dim = wrap_dim(start_dim, a.shape(), "flatten");
  end_dim = wrap_dim(end_dim, a.shape(), "flatten");
  LAZYRT_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " comes after end_dim ",
               end_dim, " (shape ", shape_str(a.shape()), ")");
  if (a.dim() == 0) return reshape(a, {1});
  const Shape& s = a.shape();
  Shape out(s.begin(), s.begin() + start_dim);
  out.push_back(std::accumulate(s.begin() + start_dim, s.begin() + end_dim + 1, int64_t{1},
                                std::multiplies<>()));
  out.insert(out.end(), s.begin() + end_dim + 1, s.end());
  return reshape(a, out);
}

Tensor slice(const Tensor& a, int64_t dim, std::optional<int64_t> start,
             std::optional<int64_t> end, int64_t step) {
  check_has_dims(a, "slice");
  dim = wrap_dim(dim, a.shape(), "slice");
  LAZYRT_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t size = a.shape()[dim];
  int64_t s = start.value_or(0), e = end.value_or(size);
  // torch's clamping: negatives count from the end, then both are clamped into [0, size]
  // with end >= start.
  if (s < 0) s += size;
  if (e < 0) e += size;
  s = std::clamp<int64_t>(s, 0, size);
  e = std::clamp<int64_t>(e, s, size);
  return slice_dim(a, dim, s, e, step);
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  check_has_dims(a, "narrow");
  dim = wrap_dim(dim, a.shape(), "narrow");
  const int64_t size = a.shape()[dim];
  LAZYRT_CHECK(start >= -size && start <= size, "narrow: start ", start,
               " out of range for dim ", dim, " of shape ", shape_str(a.shape()), " (expected ",
               -size, " to ", size, ")");
  if (start < 0) start += size;
  LAZYRT_CHECK(length >= 0 && start <= size - length, "narrow: start (", start, ") + length (",
               length, ") exceeds the size ", size, " of dim ", dim, " of shape ",
               shape_str(a.shape()));
  return slice_dim(a, dim, start, start + length, 1);
}

namespace {
// a's elements at positions start, ..., start + length - 1 along dim (start a one-element
// integer tensor, read when the graph runs; negative counts from the end), as a view; `drop`:
// length 1 and the dim removed (select). A position out of range fails when the graph runs
// (index_select checks it).
Tensor take_at(const Tensor& a, int64_t dim, const Tensor& start, int64_t length, bool drop, const char* op) {
  impl_of(start, op);
  check_has_dims(a, op);
  dim = wrap_dim(dim, a.shape(), op);
  LAZYRT_CHECK(is_integral(start.dtype()) && start.numel() == 1, op,
               ": a tensor position must be one integer (i32 or i64), got ", dtype_name(start.dtype()),
               shape_str(start.shape()));
  const int64_t size = a.shape()[dim];
  LAZYRT_CHECK(size > 0 && length >= 0 && length <= size, op, ": ", length, " element(s) of dim ", dim,
               " of shape ", shape_str(a.shape()), " cannot be taken");
  // The positions as a value of their own: a later in-place change of `start` moves no view.
  Tensor i = reshape(cast_to(start, DType::i64), {1});
  i = where(lt(i, full({}, 0, DType::i64)), add(i, full({}, size, DType::i64)), i);
  if (!drop) i = add(arange(length, DType::i64), i);
  const auto& t = *trace::impl_of(a);
  trace::ViewStep step{trace::ViewStep::Kind::Take, a.shape(), {dim, drop ? 1 : 0}, {}, {},
                       trace::impl_of(detail::detached_value(i))};
  Tensor r = index_select(a, dim, trace::tensor_of(step.index));
  std::vector<int64_t> strides = strides_of(t);
  if (drop) {
    Shape out = a.shape();
    out.erase(out.begin() + dim);
    r = reshape(r, out);
    strides.erase(strides.begin() + dim);
  }
  // The storage offset depends on the position, known when the graph runs: the base's is given.
  make_view(a, r, std::move(step), std::move(strides), t.storage_offset);
  return r;
}
}  // namespace

Tensor select(const Tensor& a, int64_t dim, const Tensor& index) {
  return take_at(a, dim, index, 1, true, "select");
}

Tensor narrow(const Tensor& a, int64_t dim, const Tensor& start, int64_t length) {
  return take_at(a, dim, start, length, false, "narrow");
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  LAZYRT_CHECK(!tensors.empty(), "cat: expects a non-empty list of tensors");
  DType dtype = impl_of(tensors[0], "cat").type.dtype;
  std::vector<size_t> kept;  // positions of the tensors that take part in the shape
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    impl_of(t, "cat");
    LAZYRT_CHECK(t.dim() > 0, "cat: a 0-dim tensor (at position ", i,
                 ") cannot be concatenated; got shapes ", shapes_str(tensors));
    dtype = promote_types(dtype, t.dtype());
    if (!(t.dim() == 1 && t.numel() == 0)) kept.push_back(i);
  }
  if (kept.empty()) return cast_to(tensors[0], dtype);
  const Tensor& first = tensors[kept[0]];
  dim = wrap_dim(dim, first.shape(), "cat");
  for (size_t i : kept) {
    const Shape& s = tensors[i].shape();
    bool fits = s.size() == first.shape().size();
    for (size_t d = 0; fits && d < s.size(); ++d)
      fits = static_cast<int64_t>(d) == dim || s[d] == first.shape()[d];
    LAZYRT_CHECK(fits, "cat: sizes of tensors must match except in dim ", dim, ": tensor ",
                 kept[0], " has shape ", shape_str(first.shape()), ", tensor ", i, " has shape ",
                 shape_str(s));
  }
  // A skipped tensor that requires grad still takes part, as an empty slice along dim: torch
  // gives it a gradient (of zero elements), so its .grad is set after backward.
  Shape empty = first.shape();
  empty[dim] = 0;
  std::vector<Tensor> operands;
  for (size_t i = 0, k = 0; i < tensors.size(); ++i) {
    if (k < kept.size() && kept[k] == i) {
      operands.push_back(cast_to(tensors[i], dtype));
      ++k;
    } else if (tensors[i].requires_grad()) {
      operands.push_back(cast_to(reshape(tensors[i], empty), dtype));
    }
  }
  return apply(OpKind::Concat, operands, {dim});
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  LAZYRT_CHECK(!tensors.empty(), "stack: expects a non-empty list of tensors");
  const Shape& shape = impl_of(tensors[0], "stack").type.shape;
  for (size_t i = 0; i < tensors.size(); ++i)
    LAZYRT_CHECK(impl_of(tensors[i], "stack").type.shape == shape,
                 "stack: expects each tensor to be equal size, but got ", shape_str(shape),
                 " at entry 0 and ", shape_str(tensors[i].shape()), " at entry ", i);
  const auto rank = static_cast<int64_t>(shape.size());
  LAZYRT_CHECK(dim >= -(rank + 1) && dim <= rank, "stack: dim ", dim,
               " out of range for tensors of shape ", shape_str(shape), " (expected ",
               -(rank + 1), " to ", rank, ")");
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) parts.push_back(unsqueeze(t, dim));
  return cat(parts, dim < 0 ? dim + rank + 1 : dim);
}

std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) {
  check_has_dims(a, "split");
  dim = wrap_dim(dim, a.shape(), "split");
  const int64_t size = a.shape()[dim];
  LAZYRT_CHECK(split_size >= 0, "split: split_size must be non-negative, got ", split_size);
  LAZYRT_CHECK(split_size > 0 || size == 0, "split: split_size can only be 0 if the size of dim ",
               dim, " is 0, but it is ", size, " (shape ", shape_str(a.shape()), ")");
  const int64_t n = split_size == 0 ? 1 : std::max<int64_t>(size / split_size + (size % split_size != 0), 1);
  check_piece_count("split", n, a.shape());
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < n; ++i) sizes.push_back(std::min(split_size, size - i * split_size));
  return pieces(a, dim, sizes);
}

std::vector<Tensor> split_with_sizes(const Tensor& a, const std::vector<int64_t>& split_sizes,
                                     int64_t dim) {
  check_has_dims(a, "split_with_sizes");
  dim = wrap_dim(dim, a.shape(), "split_with_sizes");
  const int64_t size = a.shape()[dim];
  int64_t total = 0;
  for (int64_t n : split_sizes) {
    LAZYRT_CHECK(n >= 0, "split_with_sizes: split_sizes must be non-negative, got ",
                 shape_str(split_sizes));
    // Past the dim's size the sum can only mismatch; stop before it can overflow.
    LAZYRT_CHECK(n <= size - total, "split_with_sizes: expects split_sizes to sum exactly to ", size,
                 " (the size of dim ", dim, " of shape ", shape_str(a.shape()), "), but got split_sizes=",
                 shape_str(split_sizes));
    total += n;
  }
  LAZYRT_CHECK(total == size, "split_with_sizes: expects split_sizes to sum exactly to ", size,
               " (the size of dim ", dim, " of shape ", shape_str(a.shape()),
               "), but got split_sizes=", shape_str(split_sizes));
  return pieces(a, dim, split_sizes);
}

std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& split_sizes, int64_t dim) {
  return split_with_sizes(a, split_sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  check_has_dims(a, "chunk");
  LAZYRT_CHECK(chunks > 0, "chunk: expects chunks to be greater than 0, got ", chunks);
  dim = wrap_dim(dim, a.shape(), "chunk");
  const int64_t size = a.shape()[dim];
  if (size == 0) {
    // As torch: `chunks` empty pieces.
    check_piece_count("chunk", chunks, a.shape());
    return pieces(a, dim, std::vector<int64_t>(static_cast<size_t>(chunks), 0));
  }
  return split(a, size / chunks + (size % chunks != 0), dim);  // ceil, without overflow
}

Tensor flip(const Tensor& a, std::vector<int64_t> dims) {
  impl_of(a, "flip");
  for (auto& d : dims) d = wrap_dim(d, a.shape(), "flip");
  std::sort(dims.begin(), dims.end());
  auto dup = std::adjacent_find(dims.begin(), dims.end());
  LAZYRT_CHECK(dup == dims.end(), "flip: dim ", dup == dims.end() ? 0 : *dup,
               " appears more than once in the list of dims");
  // Reversing a dim of size 0 or 1 changes nothing.
  std::vector<int64_t> real;
  for (int64_t d : dims)
    if (a.dim() > 0 && a.shape()[d] > 1) real.push_back(d);
  if (real.empty()) return a;
  return apply(OpKind::Flip, {a}, {real});
}

Tensor repeat(const Tensor& a, std::vector<int64_t> repeats) {
  impl_of(a, "repeat");
  const auto rank = static_cast<size_t>(a.dim());
  LAZYRT_CHECK(repeats.size() >= rank, "repeat: ", repeats.size(),
               " repeats given for a tensor of shape ", shape_str(a.shape()),
               " (at least one per dim is needed)");
  for (int64_t r : repeats)
    LAZYRT_CHECK(r >= 0, "repeat: repeats must be non-negative, got ", shape_str(repeats));
  // [s0, s1] repeated [r0, r1]: [1, s0, 1, s1] expanded to [r0, s0, r1, s1], then merged.
  Shape padded(repeats.size() - rank, 1);
  padded.insert(padded.end(), a.shape().begin(), a.shape().end());
  Shape interleaved, expanded, out;
  for (size_t d = 0; d < repeats.size(); ++d) {
    interleaved.insert(interleaved.end(), {1, padded[d]});
    expanded.insert(expanded.end(), {repeats[d], padded[d]});
    int64_t size;
    LAZYRT_CHECK(!__builtin_mul_overflow(repeats[d], padded[d], &size), "repeat: ", shape_str(a.shape()),
                 " repeated ", shape_str(repeats), " would have a dim beyond 64 bits");
    out.push_back(size);
  }
  if (out == padded) return reshape(a, out);
  return reshape(expand(reshape(a, interleaved), expanded), out);
}

Tensor tile(const Tensor& a, std::vector<int64_t> reps) {
  impl_of(a, "tile");
  if (reps.size() < static_cast<size_t>(a.dim())) reps.insert(reps.begin(), a.dim() - reps.size(), 1);
  return repeat(a, std::move(reps));
}

// Each shift as two slices swapped along its dim (a slice of everything is the input itself).
Tensor roll(const Tensor& a, std::vector<int64_t> shifts, std::vector<int64_t> dims) {
  impl_of(a, "roll");
  if (dims.empty()) {
    LAZYRT_CHECK(shifts.size() == 1, "roll: without dims, expects one shift, got ", shape_str(shifts));
    return reshape(roll(reshape(a, {-1}), shifts, {0}), a.shape());
  }
  LAZYRT_CHECK(shifts.size() == dims.size(), "roll: shifts ", shape_str(shifts), " and dims ",
               shape_str(dims), " must have one length");
  for (auto& d : dims) d = wrap_dim(d, a.shape(), "roll");
  LAZYRT_CHECK(a.dim() > 0, "roll: cannot roll a 0-dim tensor along a dim");
  Tensor out = a;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t n = a.shape()[dims[i]];
    if (n == 0) continue;
    const int64_t k = ((shifts[i] % n) + n) % n;
    if (k == 0) continue;
    out = cat({slice_dim(out, dims[i], n - k, n, 1), slice_dim(out, dims[i], 0, n - k, 1)}, dims[i]);
  }
  return out;
}

std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing) {
  LAZYRT_CHECK(indexing == "ij" || indexing == "xy", "meshgrid: indexing must be \"ij\" or \"xy\", got \"",
               indexing, "\"");
  LAZYRT_CHECK(!tensors.empty(), "meshgrid: expects at least one tensor");
  Shape out;
  for (const Tensor& t : tensors) {
    impl_of(t, "meshgrid");
    LAZYRT_CHECK(t.dim() <= 1, "meshgrid: expects 0-dim or 1-D tensors, got ", dtype_name(t.dtype()),
                 shape_str(t.shape()));
    LAZYRT_CHECK(t.dtype() == tensors[0].dtype(), "meshgrid: expects tensors of one dtype, got ",
                 dtype_name(tensors[0].dtype()), " and ", dtype_name(t.dtype()));
    out.push_back(t.numel());
  }
  // "xy": the first two inputs' dims swapped (Cartesian indexing).
  const bool xy = indexing == "xy" && tensors.size() >= 2;
  if (xy) std::swap(out[0], out[1]);
  std::vector<Tensor> grids;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t at = xy && i < 2 ? 1 - i : i;
    Shape view(out.size(), 1);
    view[at] = out[at];
    grids.push_back(expand(reshape(tensors[i], view), out));
  }
  return grids;
}

Tensor pad(const Tensor& a, std::vector<int64_t> pad, Scalar value) {
  impl_of(a, "pad");
  const auto rank = static_cast<size_t>(a.dim());
  LAZYRT_CHECK(pad.size() % 2 == 0, "pad: the padding length must be divisible by 2, got ",
               pad.size(), " values ", shape_str(pad));
  LAZYRT_CHECK(pad.size() / 2 <= rank, "pad: padding length too large: ", pad.size() / 2,
               " (left, right) pairs for a tensor of shape ", shape_str(a.shape()), " (rank ",
               rank, ")");
  std::vector<int64_t> low(rank, 0), high(rank, 0);
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    low[rank - 1 - i] = pad[2 * i];
    high[rank - 1 - i] = pad[2 * i + 1];
  }
  if (std::all_of(pad.begin(), pad.end(), [](int64_t p) { return p == 0; })) return a;
  return apply(OpKind::Pad, {a}, {low, high, std::vector<int64_t>(rank, 0), value.to_double()});
}

// ---- indexing ---------------------------------------------------------------------------------

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  impl_of(a, "index_select");
  impl_of(index, "index_select");
  dim = wrap_dim(dim, a.shape(), "index_select");
  if (a.dim() == 0) {
    // torch gives a 0-dim result for a 0-dim input (every index must be 0).
    LAZYRT_CHECK(index.numel() >= 1 && index.dim() <= 1,
                 "index_select: expects a non-empty index vector for a 0-dim input, got ",
                 dtype_name(index.dtype()), shape_str(index.shape()));
    Tensor r = apply(OpKind::IndexSelect, {reshape(a, {1}), reshape(index, {-1})}, {int64_t{0}});
    return reshape(slice_dim(r, 0, 0, 1, 1), {});
  }
  return apply(OpKind::IndexSelect, {a, index}, {dim});
}

namespace {
// gather's and scatter's index: i64, or i32 (as torch 2.x takes it) widened to i64, which is
// what their kernels read.
Tensor gather_index(const Tensor& index, const char* name) {
  LAZYRT_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32, name,
               ": expects an i64 or i32 index, got ", dtype_name(index.dtype()), shape_str(index.shape()));
  return index.dtype() == DType::i64 ? index : cast_to(index, DType::i64);
}
}  // namespace

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index_) {
  impl_of(a, "gather");
  impl_of(index_, "gather");
  const Tensor index = gather_index(index_, "gather");
  dim = wrap_dim(dim, a.shape(), "gather");
  return on_scalars(a, index, nullptr, [&](const Tensor& x, const Tensor& i, const Tensor*) {
    return apply(OpKind::Gather, {x, i}, {dim});
  });
}

namespace {
Tensor scatter_op(OpKind op, const char* name, const Tensor& a, int64_t dim, const Tensor& index_,
                  const Tensor& src) {
  impl_of(a, name);
  impl_of(index_, name);
  impl_of(src, name);
  const Tensor index = gather_index(index_, name);
  dim = wrap_dim(dim, a.shape(), name);
  return on_scalars(a, index, &src, [&](const Tensor& x, const Tensor& i, const Tensor* s) {
    return apply(op, {x, i, *s}, {dim});
  });
}
}  // namespace

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_op(OpKind::Scatter, "scatter", a, dim, index, src);
}
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value) {
  impl_of(a, "scatter");
  impl_of(index, "scatter");
  return scatter_op(OpKind::Scatter, "scatter", a, dim, index,
                    constant_tensor(value.to_double(), a.dtype(), index.shape()));
}
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  // torch 2.x sums into a 16-bit tensor in f32 and rounds once (its index_add and index_put
  // round after every addition, as the scatter_add op does in the tensor's dtype).
  const DType compute = detail::opmath_type(impl_of(a, "scatter_add").type.dtype);
  if (compute != a.dtype() && impl_of(src, "scatter_add").type.dtype == a.dtype())
    return cast_to(scatter_op(OpKind::ScatterAdd, "scatter_add", cast_to(a, compute), dim, index, cast_to(src, compute)),
                   a.dtype());
  return scatter_op(OpKind::ScatterAdd, "scatter_add", a, dim, index, src);
}

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source,
                 Scalar alpha) {
  impl_of(a, "index_add");
  impl_of(index, "index_add");
  impl_of(source, "index_add");
  dim = wrap_dim(dim, a.shape(), "index_add");
  // Checked here, before alpha's multiplication is recorded.
  ir::infer_types(OpKind::IndexAdd, std::vector<ir::TensorType>{impl_of(a).type, impl_of(index).type, impl_of(source).type},
                  {dim});
  Tensor src = source;
  // alpha in source's dtype (an integer tensor truncates it, as torch does).
  if (alpha.to_double() != 1) src = mul(source, constant_tensor(alpha.to_double(), source.dtype()));
  return apply(OpKind::IndexAdd, {a, index, src}, {dim});
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) {
  impl_of(a, "masked_fill");
  LAZYRT_CHECK(impl_of(mask, "masked_fill").type.dtype == DType::b8,
               "masked_fill: expects a b8 mask, got ", dtype_name(mask.dtype()),
               shape_str(mask.shape()));
  ir::broadcast_shapes(a.shape(), mask.shape(), "masked_fill");
  return where(mask, constant_tensor(value.to_double(), a.dtype()), a);
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, const Tensor& value) {
  impl_of(a, "masked_fill");
  LAZYRT_CHECK(impl_of(mask, "masked_fill").type.dtype == DType::b8,
               "masked_fill: expects a b8 mask, got ", dtype_name(mask.dtype()),
               shape_str(mask.shape()));
  LAZYRT_CHECK(impl_of(value, "masked_fill").type.shape.empty(),
               "masked_fill: only a 0-dim value tensor is supported, got ",
               dtype_name(value.dtype()), shape_str(value.shape()));
  ir::broadcast_shapes(a.shape(), mask.shape(), "masked_fill");
  return where(mask, cast_to(value, a.dtype()), a);
}

namespace {
// Keeps the elements whose column minus row is <= diagonal (lower) or >= diagonal (upper).
Tensor triangle(const Tensor& a, int64_t diagonal, bool lower, const char* op) {
  impl_of(a, op);
  LAZYRT_CHECK(a.dim() >= 2, op, ": expects a tensor with at least 2 dims, got ",
               dtype_name(a.dtype()), shape_str(a.shape()));
  const int64_t rows = a.shape()[a.dim() - 2], cols = a.shape()[a.dim() - 1];
  Tensor offset = reshape(arange(cols), {1, cols}) - reshape(arange(rows), {rows, 1});
  Tensor keep = lower ? offset <= diagonal : offset >= diagonal;
  return where(keep, a, constant_tensor(0, a.dtype()));
}
}  // namespace

Tensor tril(const Tensor& a, int64_t diagonal) { return triangle(a, diagonal, true, "tril"); }
Tensor triu(const Tensor& a, int64_t diagonal) { return triangle(a, diagonal, false, "triu"); }

// ---- Python's indexing: Tensor::index, index_put_, index_put, index_copy, index_fill ----------
//
// An index is read once into a Plan: the basic entries (ints, slices, None, bools, 0-dim
// integer tensors) as a list of steps that turn the tensor into the "sliced" tensor, and the
// advanced entries (index tensors, masks) as positions over the sliced tensor's dims. Getting
// applies the steps, then gathers the advanced entries with one index_select over their dims
// merged into one. Setting is functional: the flat positions the index picks in the tensor
// (an i64 tensor the shape of the result, built the same way from host-computed aranges) take
// the value through one scatter over the flattened tensor, so the graph stays pure and the
// gradients follow from slice, index_select, scatter and where. A lone mask whose value does
// not depend on the number of trues becomes a where, so t[t < 0] = 0 reads nothing.

namespace indexing {
TensorIndex::TensorIndex(const char* ellipsis) : kind_(Kind::Ellipsis) {
  LAZYRT_CHECK(ellipsis != nullptr && std::string_view(ellipsis) == "...",
               "TensorIndex: the only string index is \"...\" (Ellipsis), got \"",
               ellipsis ? ellipsis : "", "\"");
}
}  // namespace indexing

namespace {

using indexing::TensorIndex;

// An advanced entry over the sliced tensor: it covers `span` dims from `dim`. `index` holds
// positions within those dims taken as one (row-major), any shape; `exact` when they are known
// to be in range (a mask's trues, a bool). A mask is read into `index` by resolve().
struct Adv {
  int64_t dim = 0, span = 1;
  Tensor index;
  Tensor mask;           // b8, shape = the covered dims; undefined once resolved
  bool exact = false;
  bool scalar = false;   // made from a 0-dim b8 tensor (an index, not a mask, in PyTorch)
};

struct Step {
  enum Kind { Select, SelectTensor, Slice, Unsqueeze } kind;
  int64_t dim = 0, start = 0, end = 0, step = 1;
  Tensor index;  // SelectTensor: a 0-dim integer tensor
};

struct Plan {
  std::vector<Step> steps;
  Shape shape;                          // the sliced tensor's
  std::vector<int64_t> origin;          // per dim of it: the tensor's dim, or -1 (inserted)
  std::vector<int64_t> first, stride;   // per dim: its first element and step in that dim
  int64_t offset = 0;                   // flat position added by the selected ints
  struct Dynamic {
    Tensor index;  // a 0-dim index tensor, wrapped
    int64_t size, multiplier;
  };
  std::vector<Dynamic> dynamic;
  std::vector<Adv> adv;
};

std::vector<int64_t> contiguous(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = detail::stride_mul_add(st[d], s[d]);
  return st;
}

Tensor as_i64(const Tensor& t) { return cast_to(t, DType::i64); }

// Negative indices counted from the end (those below -size stay, for the range check to name).
Tensor wrap_index(const Tensor& index, int64_t size) {
  Tensor i = as_i64(index);
  return where(logical_and(i < Scalar(0), i >= Scalar(-size)), i + Scalar(size), i);
}

// index (wrapped) itself, checked against [0, size) when the graph runs: a check node, which
// fails before the graph writes anything, as index_select would.
Tensor checked_index(const Tensor& index, int64_t size) {
  return apply(OpKind::Check, {index, logical_and(index >= Scalar(0), index < Scalar(size))},
               {static_cast<int64_t>(ir::CheckKind::IndexInBounds)});
}

void erase_dim(Plan& p, int64_t dim) {
  p.shape.erase(p.shape.begin() + dim);
  p.origin.erase(p.origin.begin() + dim);
  p.first.erase(p.first.begin() + dim);
  p.stride.erase(p.stride.begin() + dim);
}
void insert_dim(Plan& p, int64_t dim) {
  p.steps.push_back({Step::Unsqueeze, dim, 0, 0, 1, Tensor()});
  p.shape.insert(p.shape.begin() + dim, 1);
  p.origin.insert(p.origin.begin() + dim, -1);
  p.first.insert(p.first.begin() + dim, 0);
  p.stride.insert(p.stride.begin() + dim, 1);
}

// zero_dim_advanced: a 0-dim integer tensor is an advanced index (torch.index_put), not an int
// (Python's t[i]).
Plan make_plan(const Shape& shape, const std::vector<TensorIndex>& indices, const char* op,
               bool zero_dim_advanced = false) {
  const auto rank = static_cast<int64_t>(shape.size());
  int64_t consumed = 0, ellipses = 0;
  for (const TensorIndex& ix : indices) {
    switch (ix.kind()) {
      case TensorIndex::Kind::Integer:
      case TensorIndex::Kind::Slice: ++consumed; break;
      case TensorIndex::Kind::Ellipsis: ++ellipses; break;
      case TensorIndex::Kind::Tensor: {
        const Tensor& t = ix.tensor();
        impl_of(t, op);
        consumed += t.dtype() == DType::b8 ? t.dim() : 1;
        break;
      }
      default: break;
    }
  }
  LAZYRT_CHECK(ellipses <= 1, op, ": an index can only have a single ellipsis ('...')");
  LAZYRT_CHECK(consumed <= rank, op, ": too many indices for tensor of dimension ", rank, " (shape ",
               shape_str(shape), ", ", consumed, " dims indexed)");
  const std::vector<int64_t> strides = contiguous(shape);
  Plan p;
  p.shape = shape;
  for (int64_t d = 0; d < rank; ++d) p.origin.push_back(d);
  p.first.assign(shape.size(), 0);
  p.stride.assign(shape.size(), 1);
  int64_t dim = 0;
  for (const TensorIndex& ix : indices) {
    switch (ix.kind()) {
      case TensorIndex::Kind::None: insert_dim(p, dim++); break;
      case TensorIndex::Kind::Ellipsis: dim += rank - consumed; break;
      case TensorIndex::Kind::Integer: {
        const int64_t size = p.shape[dim];
        int64_t i = ix.integer();
        LAZYRT_CHECK(i >= -size && i < size, op, ": index ", i, " is out of bounds for dimension ", dim,
                     " with size ", size);
        if (i < 0) i += size;
        p.offset = detail::stride_mul_add(detail::stride_mul_add(i, p.stride[dim], p.first[dim]), strides[p.origin[dim]], p.offset);
        p.steps.push_back({Step::Select, dim, i, i + 1, 1, Tensor()});
        erase_dim(p, dim);
        break;
      }
      case TensorIndex::Kind::Slice: {
        const indexing::Slice& s = ix.slice();
        const int64_t step = s.step.value_or(1);
        LAZYRT_CHECK(step != 0, op, ": slice step cannot be zero");
        LAZYRT_CHECK(step > 0, op, ": slice step must be positive (PyTorch has no negative steps; use flip), got ",
                     step);
        const int64_t size = p.shape[dim];
        int64_t b = s.start.value_or(0), e = s.stop.value_or(size);
        if (b < 0) b += size;
        if (e < 0) e += size;
        b = std::clamp<int64_t>(b, 0, size);
        e = std::clamp<int64_t>(e, b, size);
        p.steps.push_back({Step::Slice, dim, b, e, step, Tensor()});
        p.first[dim] = detail::stride_mul_add(b, p.stride[dim], p.first[dim]);
        // Wraps only for a step past the dim's size (at most one element taken, the stride
        // never used) or an empty tensor.
        p.stride[dim] = detail::stride_mul_add(p.stride[dim], step);
        // ceil((e - b) / step) without forming e - b + step - 1, which a huge step overflows.
        p.shape[dim] = (e - b) / step + ((e - b) % step != 0);
        ++dim;
        break;
      }
      case TensorIndex::Kind::Boolean: {
        insert_dim(p, dim);
        Adv a;
        a.dim = dim++;
        a.index = zeros({ix.boolean() ? 1 : 0}, DType::i64);
        a.exact = true;
        p.adv.push_back(std::move(a));
        break;
      }
      case TensorIndex::Kind::Tensor: {
        const Tensor& t = ix.tensor();
        const DType dt = t.dtype();
        if (dt == DType::b8 && t.dim() == 0) {  // a dim of size 1 (true) or 0 (false)
          insert_dim(p, dim);
          Adv a;
          a.dim = dim++;
          a.mask = reshape(t, {1});
          a.scalar = true;
          p.adv.push_back(std::move(a));
        } else if (dt == DType::b8) {
          for (int64_t j = 0; j < t.dim(); ++j)
            LAZYRT_CHECK(dim + j < static_cast<int64_t>(p.shape.size()) && t.shape()[j] == p.shape[dim + j], op,
                         ": the shape of the mask ", shape_str(t.shape()), " at index ", j,
                         " does not match the shape of the indexed tensor ", shape_str(p.shape), " at index ",
                         dim + j);
          Adv a;
          a.dim = dim;
          a.span = t.dim();
          a.mask = t;
          dim += t.dim();
          p.adv.push_back(std::move(a));
        } else if (t.dim() == 0 && is_integral(dt) && !zero_dim_advanced) {  // acts as an int
          const int64_t size = p.shape[dim];
          Tensor w = wrap_index(t, size);
          p.steps.push_back({Step::SelectTensor, dim, 0, 0, 1, w});
          p.offset = detail::stride_mul_add(p.first[dim], strides[p.origin[dim]], p.offset);
          p.dynamic.push_back({w, size, detail::stride_mul_add(p.stride[dim], strides[p.origin[dim]])});
          erase_dim(p, dim);
        } else {
          // i32 indices as torch 2.x takes them (1.13 took only i64 and bool).
          LAZYRT_CHECK(dt == DType::i64 || dt == DType::i32, op,
                       ": tensors used as indices must be i64 (long), i32 (int) or b8 (bool) tensors, got ",
                       dtype_name(dt), shape_str(t.shape()));
          Adv a;
          a.dim = dim++;
          a.index = as_i64(t);
          p.adv.push_back(std::move(a));
        }
        break;
      }
    }
  }
  return p;
}

// Reads the masks: the positions of their trues. A pending mask is computed first (a sync),
// counted as DynamicShapeSync.
void resolve(Plan& p) {
  for (Adv& a : p.adv) {
    if (!a.mask.defined()) continue;
    std::vector<int64_t> trues;
    if (a.mask.numel() > 0) {
      if (a.mask.is_pending()) {
        static auto& dynamic = metrics::detail::counter_cell("DynamicShapeSync");
        dynamic.add(1);
      }
      const std::vector<bool> values = a.mask.to_vector<bool>();
      for (size_t i = 0; i < values.size(); ++i)
        if (values[i]) trues.push_back(static_cast<int64_t>(i));
    }
    const auto n = static_cast<int64_t>(trues.size());
    a.index = tensor(trues, {n});
    a.exact = true;
    a.mask = Tensor();
  }
}

Tensor apply_steps(const Plan& p, Tensor x) {
  for (const Step& s : p.steps) {
    switch (s.kind) {
      case Step::Select: x = squeeze(slice_dim(x, s.dim, s.start, s.end, 1), s.dim); break;
      case Step::SelectTensor:
        x = squeeze(apply(OpKind::IndexSelect, {x, reshape(s.index, {1})}, {s.dim}), s.dim);
        break;
      case Step::Slice: x = slice_dim(x, s.dim, s.start, s.end, s.step); break;
      case Step::Unsqueeze: x = unsqueeze(x, s.dim); break;
    }
  }
  return x;
}

// The flat positions in a tensor of `shape` of the sliced tensor's elements (i64, p.shape).
Tensor positions(const Plan& p, const Shape& shape) {
  const std::vector<int64_t> strides = contiguous(shape);
  Tensor acc = full({}, p.offset, DType::i64);
  for (const Plan::Dynamic& d : p.dynamic) acc = acc + checked_index(d.index, d.size) * Scalar(d.multiplier);
  const auto rank = static_cast<int64_t>(p.shape.size());
  for (int64_t d = 0; d < rank; ++d) {
    if (p.origin[d] < 0 || p.shape[d] == 1) {
      if (p.origin[d] >= 0) acc = acc + Scalar(detail::stride_mul_add(p.first[d], strides[p.origin[d]]));
      continue;
    }
    // (first + i * stride) * the dim's stride, for i in [0, size): lazily, whatever the size.
    const int64_t st = strides[p.origin[d]];
    Shape s(p.shape.size(), 1);
    s[d] = p.shape[d];
    acc = acc + reshape(arange(p.shape[d]) * Scalar(detail::stride_mul_add(p.stride[d], st)) +
                             Scalar(detail::stride_mul_add(p.first[d], st)), s);
  }
  return expand(acc, p.shape);
}

// s[adv...]: the advanced entries broadcast together; their result dims replace theirs when
// they are adjacent, else they come first.
Tensor gather_advanced(const Tensor& s, const std::vector<Adv>& adv, const char* op) {
  Shape b = adv[0].index.shape();
  for (size_t j = 1; j < adv.size(); ++j) {
    try {
      b = ir::broadcast_shapes(b, adv[j].index.shape(), op);
    } catch (const Error&) {
      std::string shapes;
      for (size_t k = 0; k < adv.size(); ++k) shapes += (k ? ", " : "") + shape_str(adv[k].index.shape());
      throw Error(std::string(op) + ": shape mismatch: indexing tensors could not be broadcast together with shapes " +
                  shapes);
    }
  }
  bool adjacent = true;
  int64_t span = 0;
  for (size_t j = 0; j < adv.size(); ++j) {
    span += adv[j].span;
    if (j + 1 < adv.size() && adv[j].dim + adv[j].span != adv[j + 1].dim) adjacent = false;
  }
  Tensor x = s;
  int64_t p = adv[0].dim;
  if (!adjacent) {
    std::vector<int64_t> perm, rest;
    std::vector<bool> covered(static_cast<size_t>(s.dim()), false);
    for (const Adv& a : adv)
      for (int64_t d = a.dim; d < a.dim + a.span; ++d) {
        perm.push_back(d);
        covered[d] = true;
      }
    for (int64_t d = 0; d < s.dim(); ++d)
      if (!covered[d]) perm.push_back(d);
    x = permute(s, perm);
    p = 0;
  }
  const Shape xs = x.shape();  // a copy: x is rebound below
  Shape merged(xs.begin(), xs.begin() + p);
  merged.push_back(std::accumulate(xs.begin() + p, xs.begin() + p + span, int64_t{1}, std::multiplies<>()));
  merged.insert(merged.end(), xs.begin() + p + span, xs.end());
  x = reshape(x, merged);
  Tensor linear;
  int64_t d = p;
  for (const Adv& a : adv) {
    const int64_t size = std::accumulate(xs.begin() + d, xs.begin() + d + a.span, int64_t{1}, std::multiplies<>());
    d += a.span;
    Tensor i = a.exact ? a.index : wrap_index(a.index, size);
    if (adv.size() > 1 && !a.exact) i = checked_index(i, size);
    linear = linear.defined() ? linear * Scalar(size) + i : i;
  }
  Tensor r = apply(OpKind::IndexSelect, {x, reshape(linear, {-1})}, {p});
  Shape out(merged.begin(), merged.begin() + p);
  out.insert(out.end(), b.begin(), b.end());
  out.insert(out.end(), merged.begin() + p + 1, merged.end());
  return reshape(r, out);
}

Tensor get(const Tensor& self, const std::vector<TensorIndex>& indices, const char* op) {
  impl_of(self, op);
  Plan p = make_plan(self.shape(), indices, op);
  resolve(p);
  Tensor s = apply_steps(p, self);
  return p.adv.empty() ? s : gather_advanced(s, p.adv, op);
}

// The tensor with the elements at `pos` (flat positions, any shape) replaced by (or, with
// accumulate, added to) value broadcast to pos's shape.
Tensor put_at(const Tensor& self, const Tensor& pos, const Tensor& value, bool accumulate) {
  Tensor flat = reshape(self, {self.numel()});
  Tensor idx = reshape(pos, {-1});
  Tensor src = reshape(expand(value, pos.shape()), {-1});
  Tensor r = apply(accumulate ? OpKind::ScatterAdd : OpKind::Scatter, {flat, idx, src}, {int64_t{0}});
  return reshape(r, self.shape());
}

void check_value_shape(const Tensor& value, const Shape& target, const char* op) {
  bool fits = value.dim() <= static_cast<int64_t>(target.size());
  for (int64_t j = 1; fits && j <= value.dim(); ++j) {
    const int64_t v = value.shape()[value.dim() - j], t = target[target.size() - j];
    fits = v == 1 || v == t;
  }
  LAZYRT_CHECK(fits, op, ": shape mismatch: value tensor of shape ", shape_str(value.shape()),
               " cannot be broadcast to indexing result of shape ", shape_str(target));
}

struct PutOptions {
  bool number = false;           // the value was a number (already in self's dtype)
  bool accumulate = false;
  bool strip = true;             // leading dims of size 1 of the value are dropped (Python's setitem)
  bool zero_dim_advanced = false;
};

// The new value of self after self[indices] = value.
Tensor put(const Tensor& self, const std::vector<TensorIndex>& indices, Tensor value, const char* op,
           PutOptions o) {
  impl_of(self, op);
  impl_of(value, op);
  // PyTorch's shortcuts for one entry: false writes nothing.
  if (indices.size() == 1 && indices[0].is_boolean() && !indices[0].boolean()) return self;
  Plan p = make_plan(self.shape(), indices, op, o.zero_dim_advanced);
  if (o.strip) {
    Shape vs = value.shape();
    size_t lead = 0;
    while (lead < vs.size() && vs[lead] == 1) ++lead;
    if (lead) value = reshape(value, Shape(vs.begin() + lead, vs.end()));
  }
  const bool lone_mask = p.adv.size() == 1 && p.adv[0].mask.defined() && !p.adv[0].scalar;
  // With index tensors PyTorch wants the value in the tensor's dtype (a lone mask with one value
  // is a masked_fill, which converts); a lone bool is a basic index.
  const bool advanced = !p.adv.empty() && !(indices.size() == 1 && indices[0].is_boolean());
  if (!o.number && advanced && !(lone_mask && value.numel() == 1))
    LAZYRT_CHECK(value.dtype() == self.dtype(), op, ": index_put requires the source and destination dtypes to match, got ",
                 dtype_name(self.dtype()), " for the destination and ", dtype_name(value.dtype()), " for the source");
  value = cast_to(value, self.dtype());

  if (lone_mask && !o.accumulate) {
    const Adv& a = p.adv[0];
    Shape one(p.shape.begin(), p.shape.begin() + a.dim);  // the result's shape with one true
    one.push_back(1);
    one.insert(one.end(), p.shape.begin() + a.dim + a.span, p.shape.end());
    bool fits = value.dim() <= static_cast<int64_t>(one.size());
    for (int64_t j = 1; fits && j <= value.dim(); ++j) {
      const int64_t v = value.shape()[value.dim() - j], t = one[one.size() - j];
      fits = v == 1 || v == t;
    }
    if (fits) {  // the same value wherever the mask is true: a where, nothing read
      Shape placed(p.shape.begin(), p.shape.begin() + a.dim);
      placed.insert(placed.end(), static_cast<size_t>(a.span), 1);
      placed.insert(placed.end(), p.shape.begin() + a.dim + a.span, p.shape.end());
      Shape mask_shape(static_cast<size_t>(a.dim), 1);
      mask_shape.insert(mask_shape.end(), a.mask.shape().begin(), a.mask.shape().end());
      mask_shape.insert(mask_shape.end(), p.shape.size() - static_cast<size_t>(a.dim + a.span), 1);
      Tensor s = apply_steps(p, self);
      Tensor updated = where(reshape(a.mask, mask_shape), reshape(expand(value, one), placed), s);
      if (p.steps.empty()) return updated;
      return put_at(self, positions(p, self.shape()), updated, false);
    }
  }
  resolve(p);
  Tensor pos = positions(p, self.shape());
  if (!p.adv.empty()) pos = gather_advanced(pos, p.adv, op);
  check_value_shape(value, pos.shape(), op);
  if (p.steps.empty() && p.adv.empty() && !o.accumulate)  // everything: the tensor still takes part
    return where(full({}, true, DType::b8), expand(value, self.shape()), self);  // (its gradient is zero)
  return put_at(self, pos, value, o.accumulate);
}

}  // namespace

namespace detail {
Tensor slice_scatter(const Tensor& self, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                     const std::vector<int64_t>& steps, const Tensor& value) {
  std::vector<TensorIndex> index;
  for (size_t d = 0; d < starts.size(); ++d) index.emplace_back(indexing::Slice(starts[d], ends[d], steps[d]));
  PutOptions o;
  o.strip = false;
  return put(self, index, value, "slice_scatter", o);
}
}  // namespace detail

Tensor Tensor::index(std::vector<indexing::TensorIndex> indices) const { return get(*this, indices, "index"); }

Tensor& Tensor::index_put_(std::vector<indexing::TensorIndex> indices, const Tensor& value) {
  return copy_(put(*this, indices, value, "index_put_", {}));
}

Tensor& Tensor::index_put_(std::vector<indexing::TensorIndex> indices, Scalar value) {
  impl_of(*this, "index_put_");
  PutOptions o;
  o.number = true;
  return copy_(put(*this, indices, full({}, value, dtype()), "index_put_", o));
}

Tensor index_put(const Tensor& a, const std::vector<Tensor>& indices, const Tensor& values, bool accumulate) {
  impl_of(a, "index_put");
  std::vector<TensorIndex> ix;
  for (const Tensor& t : indices) {
    if (t.defined()) ix.emplace_back(t);
    else ix.emplace_back(indexing::Slice());
  }
  PutOptions o;
  o.accumulate = accumulate;
  o.strip = false;
  o.zero_dim_advanced = true;
  return put(a, ix, values, "index_put", o);
}

namespace {
void check_index_vector(const Tensor& index, const char* op) {
  LAZYRT_CHECK(impl_of(index, op).type.dtype == DType::i64, op, ": expects an i64 (long) index, got ",
               dtype_name(index.dtype()), shape_str(index.shape()));
  LAZYRT_CHECK(index.dim() <= 1, op, ": the index must be a vector or a 0-dim tensor, got ", shape_str(index.shape()));
}
}  // namespace

Tensor index_copy(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source) {
  impl_of(a, "index_copy");
  impl_of(source, "index_copy");
  check_index_vector(index, "index_copy");
  LAZYRT_CHECK(a.dtype() == source.dtype(), "index_copy: self and source must have the same dtype, got ",
               dtype_name(a.dtype()), " and ", dtype_name(source.dtype()));
  if (a.dim() == 0) {
    LAZYRT_CHECK(source.numel() == 1 && index.numel() == 1, "index_copy: a 0-dim tensor takes one index and one value, got index ",
                 shape_str(index.shape()), " and source ", shape_str(source.shape()));
    wrap_dim(dim, a.shape(), "index_copy");
    return reshape(index_copy(reshape(a, {1}), 0, reshape(index, {1}), reshape(source, {1})), {});
  }
  dim = wrap_dim(dim, a.shape(), "index_copy");
  const int64_t n = index.numel();
  Shape expected = a.shape();
  expected[dim] = n;
  Tensor src = source.dim() == 0 && a.dim() == 1 ? reshape(source, {1}) : source;
  LAZYRT_CHECK(src.shape() == expected, "index_copy: source of shape ", shape_str(source.shape()),
               " does not fit a tensor of shape ", shape_str(a.shape()), " with ", n, " indices along dim ", dim,
               " (expected ", shape_str(expected), ")");
  Shape is(a.shape().size(), 1);
  is[dim] = n;
  Tensor idx = expand(reshape(index, is), expected);
  return apply(OpKind::Scatter, {a, idx, src}, {dim});
}

namespace {
Tensor index_fill_with(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& value) {
  if (a.dim() == 0) {
    wrap_dim(dim, a.shape(), "index_fill");
    return reshape(index_fill_with(reshape(a, {1}), 0, reshape(index, {-1}), value), {});
  }
  dim = wrap_dim(dim, a.shape(), "index_fill");
  const int64_t size = a.shape()[dim];
  Tensor flat = reshape(wrap_index(index, size), {-1});
  // The dim's entries that index names, as a mask along dim.
  Tensor hit = apply(OpKind::Scatter, {zeros({size}, DType::b8), flat, ones({flat.numel()}, DType::b8)}, {int64_t{0}});
  Shape ms(a.shape().size(), 1);
  ms[dim] = size;
  return where(reshape(hit, ms), cast_to(value, a.dtype()), a);
}
}  // namespace

Tensor index_fill(const Tensor& a, int64_t dim, const Tensor& index, Scalar value) {
  impl_of(a, "index_fill");
  check_index_vector(index, "index_fill");
  return index_fill_with(a, dim, index, full({}, value, a.dtype()));
}

Tensor index_fill(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& value) {
  impl_of(a, "index_fill");
  check_index_vector(index, "index_fill");
  LAZYRT_CHECK(impl_of(value, "index_fill").type.shape.empty(),
               "index_fill: only supports a 0-dim value tensor, got ", dtype_name(value.dtype()),
               shape_str(value.shape()));
  return index_fill_with(a, dim, index, value);
}

}  // namespace lazyrt
