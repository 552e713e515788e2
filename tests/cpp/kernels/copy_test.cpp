// The strided copy behind permute, expand, slice and flip (kernels/copy.h), on tensors large
// enough to be split across threads, with transposes copied in tiles whose sizes do not divide
// the dims, and concat, split across threads by rows or by chunks of each input: every element
// checked against the index arithmetic of the op's definition, for elements of 8, 4, 2 and 1
// bytes.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/kernels/parallel.h"

namespace lazyrt {
namespace {

// Element i of a row-major tensor of `shape` as its index per dim.
std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + idx[d];
  return i;
}

// Distinct values (as far as the dtype holds them) in a tensor made from host data, so that
// the op runs as a kernel rather than being folded.
Tensor source(const Shape& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 7919) % (dtype == DType::f16 ? 2048 : 1000003);
  return tensor(v, shape).to(dtype);
}

std::vector<int64_t> values_of(const Tensor& t) { return t.to(DType::i64).to_vector<int64_t>(); }

// out = op(in); element j of out must be element from(j's index) of in.
void check(const std::string& what, const Shape& in_shape, DType dtype, const std::function<Tensor(const Tensor&)>& op,
           const std::function<std::vector<int64_t>(const std::vector<int64_t>&)>& from) {
  const Tensor in = source(in_shape, dtype);
  const Tensor out = op(in);
  const std::vector<int64_t> a = values_of(in), b = values_of(out);
  const Shape out_shape = out.shape();
  for (int64_t j = 0; j < static_cast<int64_t>(b.size()); ++j) {
    const int64_t i = ravel(from(unravel(j, out_shape)), in_shape);
    ASSERT_EQ(b[static_cast<size_t>(j)], a[static_cast<size_t>(i)])
        << what << " " << dtype_name(dtype) << ": output element " << j << " should be input element " << i;
  }
}

// Three threads, whatever the machine has: the chunks start mid-odometer.
struct AtThreeThreads {
  int before = kernels::num_threads();
  AtThreeThreads() { kernels::set_num_threads(3); }
  ~AtThreeThreads() { kernels::set_num_threads(before); }
};

}  // namespace

TEST(CopyKernel, PermutesSlicesFlipsAndExpandsMoveEveryElementWhereTheOpSays) {
  AtThreeThreads threads;
  for (DType dtype : {DType::i64, DType::f32, DType::f16, DType::b8}) {
    // A head split and its transposed key: tiles of 45 x 67 and 67 x 45.
    const Shape bthd{8, 67, 5, 45};
    for (const std::vector<int64_t>& perm : {std::vector<int64_t>{0, 2, 3, 1}, std::vector<int64_t>{0, 3, 1, 2},
                                             std::vector<int64_t>{0, 2, 1, 3}, std::vector<int64_t>{3, 1, 2, 0}}) {
      check("permute", bthd, dtype, [&](const Tensor& x) { return permute(x, perm); },
            [&](const std::vector<int64_t>& o) {
              std::vector<int64_t> i(4);
              for (size_t d = 0; d < 4; ++d) i[static_cast<size_t>(perm[d])] = o[d];
              return i;
            });
    }
    // A matrix transpose; a transpose whose rows are shorter than a tile (strided runs).
    check("transpose", {300, 257}, dtype, [](const Tensor& x) { return transpose(x, 0, 1); },
          [](const std::vector<int64_t>& o) { return std::vector<int64_t>{o[1], o[0]}; });
    check("transpose", {50, 9, 300}, dtype, [](const Tensor& x) { return transpose(x, 1, 2); },
          [](const std::vector<int64_t>& o) { return std::vector<int64_t>{o[0], o[2], o[1]}; });
    // A strided window: every third column from 2, and a flip of two dims.
    check("slice", {90, 2500}, dtype, [](const Tensor& x) { return slice(x, 1, 2, std::nullopt, 3); },
          [](const std::vector<int64_t>& o) { return std::vector<int64_t>{o[0], 2 + 3 * o[1]}; });
    check("flip", {40, 60, 70}, dtype, [](const Tensor& x) { return flip(x, {0, 2}); },
          [](const std::vector<int64_t>& o) { return std::vector<int64_t>{39 - o[0], o[1], 69 - o[2]}; });
    check("expand", {1, 300, 1}, dtype, [](const Tensor& x) { return expand(x, {70, 300, 40}); },
          [](const std::vector<int64_t>& o) { return std::vector<int64_t>{0, o[1], 0}; });
  }
}

TEST(CopyKernel, ConcatsPutEveryInputElementInItsBlock) {
  AtThreeThreads threads;
  for (DType dtype : {DType::i64, DType::f32, DType::f16, DType::b8}) {
    // Along dim 0 (one outer row: each input copied in chunks, its bytes not a multiple of
    // one), and along dims 1 and 2 (many outer rows, split between threads).
    for (int64_t dim : {0, 1, 2}) {
      Shape sa{70, 41, 33}, sb{70, 41, 33}, sc{70, 41, 33};
      sa[static_cast<size_t>(dim)] = 29;
      sb[static_cast<size_t>(dim)] = 1;
      const Tensor a = source(sa, dtype), b = source(sb, dtype), c = source(sc, dtype);
      const Tensor out = cat({a, b, c}, dim);
      const std::vector<int64_t> va = values_of(a), vb = values_of(b), vc = values_of(c), vo = values_of(out);
      const Shape so = out.shape();
      ASSERT_EQ(so[static_cast<size_t>(dim)], sa[static_cast<size_t>(dim)] + 1 + sc[static_cast<size_t>(dim)]);
      for (int64_t j = 0; j < static_cast<int64_t>(vo.size()); ++j) {
        std::vector<int64_t> idx = unravel(j, so);
        int64_t& at = idx[static_cast<size_t>(dim)];
        const std::vector<int64_t>* from = &va;
        const Shape* shape = &sa;
        if (at >= sa[static_cast<size_t>(dim)] + 1) {
          at -= sa[static_cast<size_t>(dim)] + 1;
          from = &vc;
          shape = &sc;
        } else if (at >= sa[static_cast<size_t>(dim)]) {
          at -= sa[static_cast<size_t>(dim)];
          from = &vb;
          shape = &sb;
        }
        ASSERT_EQ(vo[static_cast<size_t>(j)], (*from)[static_cast<size_t>(ravel(idx, *shape))])
            << "concat along " << dim << " " << dtype_name(dtype) << ": output element " << j;
      }
    }
  }
}

}  // namespace lazyrt
