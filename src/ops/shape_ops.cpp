// Shape and indexing ops with PyTorch's semantics. The IR ops among them (slice, pad, flip,
// concat, index_select, gather, scatter, scatter_add, index_add) are recorded with
// normalized attributes (dims wrapped, bounds clamped); the rest are exact compositions:
// view / flatten (reshape), narrow / split / chunk (slice), stack (reshape + concat), repeat
// (reshape + expand + reshape), masked_fill / tril / triu (where).
//
// As everywhere in src/ops, every argument is checked before the first node is recorded.
#include <algorithm>
#include <numeric>

#include "ir/graph.h"
#include "lazyrt/tensor.h"
#include "ops/op_helpers.h"
#include "trace/lazy_tensor.h"
#include "util/check.h"

namespace lazyrt {

using detail::apply;
using detail::cast_to;
using detail::constant_tensor;
using detail::impl_of;
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
  return apply(OpKind::Slice, {a}, {starts, ends, steps});
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
  try {
    return reshape(a, std::move(shape));
  } catch (const Error& e) {
    throw Error(std::string("view (an alias of reshape): ") + e.what());
  }
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
  const int64_t n = split_size == 0 ? 1 : std::max<int64_t>((size + split_size - 1) / split_size, 1);
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
  if (size == 0) return pieces(a, dim, std::vector<int64_t>(static_cast<size_t>(chunks), 0));
  return split(a, (size + chunks - 1) / chunks, dim);
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
    out.push_back(repeats[d] * padded[d]);
  }
  if (out == padded) return reshape(a, out);
  return reshape(expand(reshape(a, interleaved), expanded), out);
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

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  impl_of(a, "gather");
  impl_of(index, "gather");
  dim = wrap_dim(dim, a.shape(), "gather");
  return on_scalars(a, index, nullptr, [&](const Tensor& x, const Tensor& i, const Tensor*) {
    return apply(OpKind::Gather, {x, i}, {dim});
  });
}

namespace {
Tensor scatter_op(OpKind op, const char* name, const Tensor& a, int64_t dim, const Tensor& index,
                  const Tensor& src) {
  impl_of(a, name);
  impl_of(index, name);
  impl_of(src, name);
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
  return scatter_op(OpKind::ScatterAdd, "scatter_add", a, dim, index, src);
}

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source,
                 Scalar alpha) {
  impl_of(a, "index_add");
  impl_of(index, "index_add");
  impl_of(source, "index_add");
  dim = wrap_dim(dim, a.shape(), "index_add");
  // Checked here, before alpha's multiplication is recorded.
  ir::infer_types(OpKind::IndexAdd, {impl_of(a).type, impl_of(index).type, impl_of(source).type},
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

}  // namespace lazyrt
