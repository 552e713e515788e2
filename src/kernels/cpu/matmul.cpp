// Batched matrix product with broadcast batch dims. Floating types go through BLAS GEMM
// (16-bit floats via f32 in the workspace); integer types use a plain loop.
#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops.h"

namespace lazyrt::kernels {
namespace {

struct MatmulLayout {
  int64_t n = 0, k = 0, m = 0;
  std::vector<int64_t> x_off, y_off;  // per batch, element offsets of the operand matrices
  bool fold_batch = false;            // x's batches are contiguous and y is shared: one GEMM

  MatmulLayout(const Shape& xs, const Shape& ys, const Shape& os) {
    n = xs[xs.size() - 2];
    k = xs.back();
    m = ys.back();
    Shape batch(os.begin(), os.end() - 2);
    auto offsets = [&](const Shape& s) {
      Shape b(s.begin(), s.end() - 2);
      std::vector<int64_t> st = contiguous_strides(b);
      std::vector<int64_t> strides(batch.size(), 0);
      const int64_t mat = s[s.size() - 2] * s.back();
      for (size_t j = 0; j < b.size(); ++j)
        strides[batch.size() - b.size() + j] = b[j] == 1 ? 0 : st[j] * mat;
      std::vector<int64_t> out;
      out.reserve(static_cast<size_t>(shape_numel(batch)));
      StridedLayout(batch, strides).for_each_run([&](int64_t off, int64_t cnt, int64_t stride) {
        for (int64_t i = 0; i < cnt; ++i) out.push_back(off + i * stride);
      });
      return out;
    };
    x_off = offsets(xs);
    y_off = offsets(ys);
    fold_batch = true;
    for (size_t b = 0; b < x_off.size(); ++b)
      if (x_off[b] != static_cast<int64_t>(b) * n * k || y_off[b] != y_off[0]) fold_batch = false;
  }
  size_t batches() const { return x_off.size(); }
};

// Products this small cost less than a BLAS call's fixed overhead (argument checks, thread
// and buffer management: about a microsecond), so they run as a plain loop.
inline constexpr int64_t kSmallGemm = 4096;  // n * k * m

// Output elements W at a time along a row, each a dot product accumulated in order over k:
// the same sums, in the same order, as a row-by-row update, with the accumulators in
// registers and each element of a read once per W outputs.
template <int W, class T>
void small_gemm_cols(const T* __restrict arow, const T* __restrict b, T* __restrict out, int64_t k,
                     int64_t m) {
  T acc[W] = {};
  for (int64_t p = 0; p < k; ++p) {
    const T av = arow[p];
    const T* brow = b + p * m;
    for (int j = 0; j < W; ++j) acc[j] += av * brow[j];
  }
  for (int j = 0; j < W; ++j) out[j] = acc[j];
}

template <class T>
void small_gemm(const T* __restrict a, const T* __restrict b, T* __restrict c, int64_t n, int64_t k,
                int64_t m) {
  for (int64_t i = 0; i < n; ++i) {
    const T* arow = a + i * k;
    T* crow = c + i * m;
    int64_t j = 0;
    for (; j + 4 <= m; j += 4) small_gemm_cols<4>(arow, b + j, crow + j, k, m);
    switch (m - j) {
      case 3: small_gemm_cols<3>(arow, b + j, crow + j, k, m); break;
      case 2: small_gemm_cols<2>(arow, b + j, crow + j, k, m); break;
      case 1: small_gemm_cols<1>(arow, b + j, crow + j, k, m); break;
      default: break;
    }
  }
}

template <class T>
void gemm(const T* a, const T* b, T* c, int64_t n, int64_t k, int64_t m) {
  if (n == 0 || m == 0) return;
  if constexpr (std::is_floating_point_v<T>) {
    if (n * k * m <= kSmallGemm) {
      small_gemm(a, b, c, n, k, m);
      return;
    }
  }
  const auto lda = static_cast<blasint>(std::max<int64_t>(k, 1));
  const auto ldb = static_cast<blasint>(std::max<int64_t>(m, 1));
  const auto ldc = ldb;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, k, 1.0f, a, lda, b, ldb, 0.0f,
                c, ldc);
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, k, 1.0, a, lda, b, ldb, 0.0, c,
                ldc);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      T* row = c + i * m;
      std::fill(row, row + m, T(0));
      for (int64_t p = 0; p < k; ++p) {
        const T av = a[i * k + p];
        const T* brow = b + p * m;
        for (int64_t j = 0; j < m; ++j) row[j] = static_cast<T>(row[j] + av * brow[j]);
      }
    }
  }
}

template <class T>
void run_batches(const MatmulLayout& L, const T* x, const T* y, T* o) {
  if (L.fold_batch) {
    gemm(x, y + (L.batches() ? L.y_off[0] : 0), o,
         L.n * static_cast<int64_t>(L.batches()), L.k, L.m);
    return;
  }
  for (size_t b = 0; b < L.batches(); ++b)
    gemm(x + L.x_off[b], y + L.y_off[b], o + static_cast<int64_t>(b) * L.n * L.m, L.n, L.k, L.m);
}

}  // namespace

Kernel make_Matmul(const KernelSpec& s) {
  auto layout = std::make_shared<const MatmulLayout>(s.inputs[0].shape, s.inputs[1].shape,
                                                     s.outputs[0].shape);
  const int64_t xn = s.inputs[0].numel(), yn = s.inputs[1].numel(), on = s.outputs[0].numel();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      LAZYRT_ASSERT(false, "matmul kernel made for b8");
      return {};
    } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      Kernel k{[layout, xn, yn, on](const void* const* in, void* const* out) {
                 const T* x = static_cast<const T*>(in[0]);
                 const T* y = static_cast<const T*>(in[1]);
                 float* xf = static_cast<float*>(out[1]);
                 float* yf = xf + xn;
                 float* of = yf + yn;
                 for (int64_t i = 0; i < xn; ++i) xf[i] = static_cast<float>(x[i]);
                 for (int64_t i = 0; i < yn; ++i) yf[i] = static_cast<float>(y[i]);
                 run_batches<float>(*layout, xf, yf, of);
                 T* o = static_cast<T*>(out[0]);
                 for (int64_t i = 0; i < on; ++i) o[i] = T(of[i]);
               },
               static_cast<size_t>(xn + yn + on) * sizeof(float)};
      return k;
    } else {
      return {[layout](const void* const* in, void* const* out) {
        run_batches<T>(*layout, static_cast<const T*>(in[0]), static_cast<const T*>(in[1]),
                       static_cast<T*>(out[0]));
      }};
    }
  });
}

}  // namespace lazyrt::kernels
