// Indexing along one dim: index_select and index_add (a vector of indices picks whole
// slices), gather, scatter and scatter_add (an index tensor picks one element per index
// element). Index values are checked against the size of the indexed dim before anything is
// written, and a bad one throws lazyrt::Error naming the op, as PyTorch does when it runs.
//
// The scatter family copies its operand 0 into the output first (skipped when the compiler
// placed the output over it) and then updates the output. With repeated indices, updates
// apply in row-major order of the index: scatter keeps the last, as PyTorch's CPU kernel.
#include <cstring>

#include "backend/cpu/kernels/loops.h"
#include "scalar/elementwise_fns.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)
namespace {

template <class Fn>
decltype(auto) visit_index(DType d, Fn&& fn) {
  if (d == DType::i32) return fn(int32_t{});
  LAZYRT_ASSERT(d == DType::i64, "index of dtype ", dtype_name(d));
  return fn(int64_t{});
}

template <class I>
void check_indices(const I* index, int64_t n, int64_t size, const char* op, int64_t dim) {
  for (int64_t i = 0; i < n; ++i)
    LAZYRT_CHECK(index[i] >= 0 && index[i] < size, op, ": index ", static_cast<int64_t>(index[i]),
                 " is out of bounds for dim ", dim, " with size ", size);
}

// x viewed as [outer, size, inner] around `dim`. An empty x has no outer or inner elements to
// visit (its other dims may multiply past 64 bits); its indices are still checked against size.
struct DimSplit {
  int64_t outer = 1, size = 1, inner = 1;
  DimSplit(const Shape& s, int64_t dim) {
    if (shape_numel(s) == 0) {
      outer = inner = 0;
      size = s[static_cast<size_t>(dim)];
      return;
    }
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
      if (d < dim) outer *= s[d];
      else if (d == dim) size = s[d];
      else inner *= s[d];
    }
  }
};

// Row-major walk over an index tensor's shape. For each innermost row it calls
// fn(linear, off_a, off_b, n, stride_a, stride_b): `linear` is the row's first element in the
// (contiguous) index, off_* the matching element offsets in two other operands whose
// strides per index dim are `a` and `b`.
struct IndexWalk {
  Shape shape;
  std::vector<int64_t> a, b;

  template <class Fn>
  void run(Fn&& fn) const {
    const int64_t numel = shape_numel(shape);
    if (numel == 0) return;
    const size_t rank = shape.size();
    const int64_t n = shape[rank - 1];
    std::array<int64_t, kMaxRank> idx{};
    int64_t oa = 0, ob = 0;
    for (int64_t linear = 0; linear < numel; linear += n) {
      fn(linear, oa, ob, n, a[rank - 1], b[rank - 1]);
      for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
        if (++idx[d] < shape[d]) {
          oa += a[d];
          ob += b[d];
          break;
        }
        oa -= a[d] * (shape[d] - 1);
        ob -= b[d] * (shape[d] - 1);
        idx[d] = 0;
      }
    }
  }
};

// The strides of `target` per index dim, with `dim`'s set to 0 (the index value supplies it).
std::vector<int64_t> strides_without(const Shape& target, int64_t dim) {
  std::vector<int64_t> st = contiguous_strides(target);
  st[dim] = 0;
  return st;
}

void copy_operand0(const void* const* in, void* const* out, size_t bytes) {
  if (in[0] != out[0] && bytes) std::memcpy(out[0], in[0], bytes);
}

template <class T>
T add_values(T a, T b) {
  using C = compute_t<T>;
  if constexpr (is_signed_int_c<C>) return convert<T>(wrap_add(convert<C>(a), convert<C>(b)));  // wraps, as torch
  else return convert<T>(static_cast<C>(convert<C>(a) + convert<C>(b)));
}

}  // namespace

Kernel make_IndexSelect(const KernelSpec& s) {
  const int64_t dim = ir::NodeAttrs(s.op, s.attrs).i<"dim">();
  const DimSplit x(s.inputs[0].shape, dim);
  const int64_t n = s.inputs[1].numel();
  const size_t row = static_cast<size_t>(x.inner) * dtype_size(s.inputs[0].dtype);
  return visit_index(s.inputs[1].dtype, [&](auto itag) -> Kernel {
    using I = decltype(itag);
    return {[x, n, row, dim](const void* const* in, void* const* out) {
      const char* src = static_cast<const char*>(in[0]);
      const I* index = static_cast<const I*>(in[1]);
      char* dst = static_cast<char*>(out[0]);
      check_indices(index, n, x.size, "index_select", dim);
      if (row == 0) return;  // nothing to copy (and the source may be no buffer at all)
      for (int64_t o = 0; o < x.outer; ++o) {
        const char* block = src + static_cast<size_t>(o * x.size) * row;
        for (int64_t j = 0; j < n; ++j, dst += row)
          std::memcpy(dst, block + static_cast<size_t>(index[j]) * row, row);
      }
    }};
  });
}

Kernel make_IndexAdd(const KernelSpec& s) {
  const int64_t dim = ir::NodeAttrs(s.op, s.attrs).i<"dim">();
  const DimSplit x(s.inputs[0].shape, dim);
  const int64_t n = s.inputs[1].numel();
  const size_t bytes = s.inputs[0].bytes();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return visit_index(s.inputs[1].dtype, [&](auto itag) -> Kernel {
      using I = decltype(itag);
      return {[x, n, bytes, dim](const void* const* in, void* const* out) {
        const I* index = static_cast<const I*>(in[1]);
        const T* src = static_cast<const T*>(in[2]);
        T* dst = static_cast<T*>(out[0]);
        check_indices(index, n, x.size, "index_add", dim);
        copy_operand0(in, out, bytes);
        for (int64_t o = 0; o < x.outer; ++o) {
          T* block = dst + o * x.size * x.inner;
          for (int64_t j = 0; j < n; ++j, src += x.inner) {
            T* row = block + static_cast<int64_t>(index[j]) * x.inner;
            for (int64_t i = 0; i < x.inner; ++i) row[i] = add_values(row[i], src[i]);
          }
        }
      }};
    });
  });
}

Kernel make_Gather(const KernelSpec& s) {
  const int64_t dim = ir::NodeAttrs(s.op, s.attrs).i<"dim">();
  const Shape& xs = s.inputs[0].shape;
  const int64_t size = xs[dim];
  const int64_t dim_stride = contiguous_strides(xs)[dim];
  const int64_t n = s.inputs[1].numel();
  auto walk = std::make_shared<const IndexWalk>(
      IndexWalk{s.inputs[1].shape, strides_without(xs, dim), std::vector<int64_t>(xs.size(), 0)});
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using W = decltype(tag);
    return {[walk, size, dim_stride, n, dim](const void* const* in, void* const* out) {
      const W* x = static_cast<const W*>(in[0]);
      const int64_t* index = static_cast<const int64_t*>(in[1]);
      W* o = static_cast<W*>(out[0]);
      check_indices(index, n, size, "gather", dim);
      walk->run([&](int64_t lin, int64_t xo, int64_t, int64_t len, int64_t xs_, int64_t) {
        for (int64_t i = 0; i < len; ++i) o[lin + i] = x[xo + i * xs_ + index[lin + i] * dim_stride];
      });
    }};
  });
}

namespace {

template <bool kAdd>
Kernel scatter(const KernelSpec& s, const char* name) {
  const int64_t dim = ir::NodeAttrs(s.op, s.attrs).i<"dim">();
  const Shape& xs = s.inputs[0].shape;
  const int64_t size = xs[dim];
  const int64_t dim_stride = contiguous_strides(xs)[dim];
  const int64_t n = s.inputs[1].numel();
  const size_t bytes = s.inputs[0].bytes();
  auto walk = std::make_shared<const IndexWalk>(
      IndexWalk{s.inputs[1].shape, strides_without(xs, dim), contiguous_strides(s.inputs[2].shape)});
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[walk, size, dim_stride, n, bytes, dim, name](const void* const* in, void* const* out) {
      const int64_t* index = static_cast<const int64_t*>(in[1]);
      const T* src = static_cast<const T*>(in[2]);
      T* o = static_cast<T*>(out[0]);
      check_indices(index, n, size, name, dim);
      copy_operand0(in, out, bytes);
      walk->run([&](int64_t lin, int64_t oo, int64_t so, int64_t len, int64_t os, int64_t ss) {
        for (int64_t i = 0; i < len; ++i) {
          T& dst = o[oo + i * os + index[lin + i] * dim_stride];
          if constexpr (kAdd) dst = add_values(dst, src[so + i * ss]);
          else dst = src[so + i * ss];
        }
      });
    }};
  });
}

}  // namespace

runtime::KernelFn make_index_check(const KernelSpec& s) {
  const int64_t dim = ir::NodeAttrs(s.op, s.attrs).i<"dim">();
  const int64_t size = s.inputs[0].shape[static_cast<size_t>(dim)];
  const int64_t n = s.inputs[1].numel();
  const char* name = ir::op_name(s.op).data();
  return visit_index(s.inputs[1].dtype, [&](auto itag) -> runtime::KernelFn {
    using I = decltype(itag);
    return [n, size, name, dim](const void* const* in, void* const*) {
      check_indices(static_cast<const I*>(in[0]), n, size, name, dim);
    };
  });
}

Kernel make_Scatter(const KernelSpec& s) { return scatter<false>(s, "scatter"); }
Kernel make_ScatterAdd(const KernelSpec& s) { return scatter<true>(s, "scatter_add"); }

}  // namespace lazyrt::kernels
