// Batched matrix product with broadcast batch dims. Floating types go through a GEMM library
// (16-bit floats via f32 in the workspace); integer types use a plain loop.
//
// Libraries: OpenBLAS (cblas_sgemm, cblas_dgemm) serves f64 and the reference backend. Where
// the backend takes library kernels, every f32 product goes through oneDNN's dnnl_sgemm, on
// the OpenMP team that runs the backend's other kernels. OpenBLAS's own threads would run
// beside that team: after a product its workers keep polling for the next one while the team's
// workers poll for the next kernel, and with no spare core a kernel's chunk can wait a whole
// scheduler slice (8 ms was measured) for its thread. oneDNN was also the faster on every
// product of an MLP and a GPT step measured on AVX-512 (up to 2x on weight gradients over
// k = 2048, where OpenBLAS 0.3.21 runs its AVX2 kernels on an AMD Zen 4).
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "scalar/elementwise_fns.h"
#include "ir/gemm_view.h"
#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/parallel.h"
#include "util/metrics_cells.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)
namespace {

// x @ y over broadcast batch dims; x's matrices stored [k, n] when tx, y's [m, k] when ty, each
// with its leading dimension (row-to-row distance as stored), and the result's rows ldc apart.
struct MatmulLayout {
  int64_t n = 0, k = 0, m = 0;
  bool tx = false, ty = false;
  int64_t lda = 1, ldb = 1, ldc = 1;
  std::vector<int64_t> x_off, y_off, o_off;  // per batch, element offsets of the matrices
  bool fold_batch = false;            // x's batches are contiguous rows and y is shared: one GEMM
  bool onednn = false;                // f32 GEMMs through oneDNN, not OpenBLAS

  // Multiply-adds of all the batches (in double: the product may pass 64 bits).
  double macs() const {
    return static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(m) *
           static_cast<double>(batches());
  }

  MatmulLayout(const Shape& xs, const Shape& ys, const Shape& os, bool tx_ = false, bool ty_ = false)
      : tx(tx_), ty(ty_) {
    n = os[os.size() - 2];
    m = os.back();
    k = tx ? xs[xs.size() - 2] : xs.back();
    Shape batch(os.begin(), os.end() - 2);
    auto offsets = [&](const Shape& s) {
      Shape b(s.begin(), s.end() - 2);
      std::vector<int64_t> st = contiguous_strides(b);
      std::vector<int64_t> strides(batch.size(), 0);
      // Wrapping: past 64 bits only for an empty operand, which addresses nothing.
      const int64_t mat = lazyrt::detail::stride_mul_add(s[s.size() - 2], s.back());
      for (size_t j = 0; j < b.size(); ++j)
        strides[batch.size() - b.size() + j] = b[j] == 1 ? 0 : lazyrt::detail::stride_mul_add(st[j], mat);
      std::vector<int64_t> out;
      out.reserve(static_cast<size_t>(shape_numel(batch)));
      StridedLayout(batch, strides).for_each_run([&](int64_t off, int64_t cnt, int64_t stride) {
        for (int64_t i = 0; i < cnt; ++i) out.push_back(off + i * stride);
      });
      return out;
    };
    x_off = offsets(xs);
    y_off = offsets(ys);
    lda = std::max<int64_t>(tx ? n : k, 1);
    ldb = std::max<int64_t>(ty ? k : m, 1);
    ldc = std::max<int64_t>(m, 1);
    for (size_t b = 0; b < x_off.size(); ++b) o_off.push_back(static_cast<int64_t>(b) * n * m);
    fold_batch = can_fold();
  }

  // gemm_view: the operands' matrices as strided views (ir/gemm_view.h), the result permuted.
  MatmulLayout(const ir::StridedView& xv, const ir::StridedView& yv, const std::vector<int64_t>& out_perm,
               const Shape& out_shape) {
    const size_t rx = xv.sizes.size(), ry = yv.sizes.size();
    n = xv.sizes[rx - 2];
    k = xv.sizes[rx - 1];
    m = yv.sizes[ry - 1];
    const auto bx = ir::blas_matrix(xv), by = ir::blas_matrix(yv);
    LAZYRT_ASSERT(bx && by, "gemm_view made for views a GEMM cannot read");
    tx = bx->transposed;
    lda = bx->ld;
    ty = by->transposed;
    ldb = by->ld;
    // The logical result [batch.., n, m] in the stored one (out_perm of it, row-major).
    const size_t r = out_shape.size();
    std::vector<int64_t> logical_stride(r);
    const std::vector<int64_t> stored = contiguous_strides(out_shape);
    for (size_t q = 0; q < r; ++q) logical_stride[out_perm.empty() ? q : static_cast<size_t>(out_perm[q])] = stored[q];
    ldc = n <= 1 ? std::max<int64_t>(m, 1) : logical_stride[r - 2];
    const size_t nb = r - 2;
    Shape batch(nb);
    for (size_t q = 0; q < r; ++q) {
      const size_t d = out_perm.empty() ? q : static_cast<size_t>(out_perm[q]);
      if (d < nb) batch[d] = out_shape[q];
    }
    // Each batch's offsets, the operands' batch dims aligned to the right of the result's.
    auto walk = [&](const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, size_t rank,
                    int64_t base, std::vector<int64_t>& out) {
      std::vector<int64_t> st(nb, 0);
      for (size_t j = 0; j + 2 < rank; ++j)
        if (sizes[j] != 1) st[nb - (rank - 2) + j] = strides[j];
      StridedLayout(batch, st).for_each_run([&](int64_t off, int64_t cnt, int64_t stride) {
        for (int64_t i = 0; i < cnt; ++i) out.push_back(base + off + i * stride);
      });
    };
    walk(xv.sizes, xv.strides, rx, xv.offset, x_off);
    walk(yv.sizes, yv.strides, ry, yv.offset, y_off);
    std::vector<int64_t> batch_stride(logical_stride.begin(), logical_stride.begin() + static_cast<int64_t>(nb));
    for (size_t j = 0; j < nb; ++j)
      if (batch[j] == 1) batch_stride[j] = 0;
    StridedLayout(batch, batch_stride).for_each_run([&](int64_t off, int64_t cnt, int64_t stride) {
      for (int64_t i = 0; i < cnt; ++i) o_off.push_back(off + i * stride);
    });
    fold_batch = can_fold();
  }

  // One GEMM for every batch: x's batches are consecutive rows (row-major, ld apart), y is
  // shared, and the result's batches are consecutive rows too.
  bool can_fold() const {
    if (tx || x_off.empty()) return false;
    for (size_t b = 0; b < x_off.size(); ++b) {
      const auto i = static_cast<int64_t>(b);
      if (x_off[b] != x_off[0] + i * n * lda || y_off[b] != y_off[0] || o_off[b] != o_off[0] + i * n * ldc)
        return false;
    }
    return true;
  }
  size_t batches() const { return x_off.size(); }
};

// Products this small cost less than a BLAS call's fixed overhead (argument checks, thread
// and buffer management: about a microsecond), so they run as a plain loop.
inline constexpr int64_t kSmallGemm = 4096;  // n * k * m
// Products of fewer multiply-adds run on one thread. Split across threads, a product leaves
// its result in two cores' caches, and the kernels after it read the other core's half from
// there: in a small transformer layer's step at 2 threads (products of 0.5-2.1M
// multiply-adds) an elementwise kernel over the 128 KB result of one took 20 us instead of
// 3 us, and the step 760-1020 us against 600-630 us with these products on one thread. From
// about this size on, the half of the product's time that a second thread saves (25 us here)
// outweighs that.
inline constexpr double kOneThreadMacs = 1 << 22;

// Output elements W at a time along a row, each a dot product accumulated in order over k, with
// the accumulators in registers and each element of a read once per W outputs. a(p) =
// arow[p * sa_p], b(p, j) = b[p * sb_p + j * sb_j]. f32 products are summed in double, where
// each is exact and the sum rounds once at the end: an f32 sum in order loses accuracy with k
// (a graph attention's [16, 256] x [256, 1] gradient products were 2.5x further from float64
// than eager's blocked kernels), this is as accurate as they are or more.
template <int W, class T>
void small_gemm_cols(const T* __restrict arow, int64_t sa_p, const T* __restrict b, int64_t sb_p,
                     int64_t sb_j, T* __restrict out, int64_t k, bool accumulate) {
  using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;
  Acc acc[W] = {};
  if (accumulate)
    for (int j = 0; j < W; ++j) acc[j] = static_cast<Acc>(out[j]);
  for (int64_t p = 0; p < k; ++p) {
    const Acc av = arow[p * sa_p];
    const T* bp = b + p * sb_p;
    for (int j = 0; j < W; ++j) {
      if constexpr (is_signed_int_c<T>) acc[j] = wrap_add(acc[j], wrap_mul(av, bp[j * sb_j]));  // wraps, as torch
      else acc[j] += av * static_cast<Acc>(bp[j * sb_j]);
    }
  }
  for (int j = 0; j < W; ++j) out[j] = static_cast<T>(acc[j]);
}

// c[n, m] (rows ldc apart) = a x b with a(i, p) = a[i * sa_i + p * sa_p] and b as above (added
// to c where `accumulate`).
template <class T>
void small_gemm(const T* a, int64_t sa_i, int64_t sa_p, const T* b, int64_t sb_p, int64_t sb_j, T* c,
                int64_t ldc, int64_t n, int64_t k, int64_t m, bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const T* arow = a + i * sa_i;
    T* crow = c + i * ldc;
    int64_t j = 0;
    for (; j + 4 <= m; j += 4) small_gemm_cols<4>(arow, sa_p, b + j * sb_j, sb_p, sb_j, crow + j, k, accumulate);
    switch (m - j) {
      case 3: small_gemm_cols<3>(arow, sa_p, b + j * sb_j, sb_p, sb_j, crow + j, k, accumulate); break;
      case 2: small_gemm_cols<2>(arow, sa_p, b + j * sb_j, sb_p, sb_j, crow + j, k, accumulate); break;
      case 1: small_gemm_cols<1>(arow, sa_p, b + j * sb_j, sb_p, sb_j, crow + j, k, accumulate); break;
      default: break;
    }
  }
}

// c[n, m] (rows ldc_ apart) = x[n, k] y[k, m], x stored as [k, n] when tx, y as [m, k] when ty,
// with leading dimensions lda_ and ldb_; added to c where `accumulate`; f32 through oneDNN when
// `onednn` (the caller holds an OmpTeam).
template <class T>
void gemm(const T* a, int64_t lda_, const T* b, int64_t ldb_, T* c, int64_t ldc_, int64_t n, int64_t k, int64_t m,
          bool tx, bool ty, bool onednn, bool accumulate = false) {
  if (n == 0 || m == 0) return;
  if (k == 0) {  // sums of nothing; the operands may be no buffer at all
    if (!accumulate)
      for (int64_t i = 0; i < n; ++i) std::fill(c + i * ldc_, c + i * ldc_ + m, T(0));
    return;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    int64_t work = 0;
    if (__builtin_mul_overflow(n * k, m, &work) || work > kSmallGemm) {
      const auto lda = static_cast<blasint>(lda_);
      const auto ldb = static_cast<blasint>(ldb_);
      const auto ldc = static_cast<blasint>(ldc_);
      const CBLAS_TRANSPOSE ta = tx ? CblasTrans : CblasNoTrans, tb = ty ? CblasTrans : CblasNoTrans;
      if constexpr (std::is_same_v<T, float>) {
        if (onednn) {
          const dnnl_status_t st = dnnl_sgemm(tx ? 'T' : 'N', ty ? 'T' : 'N', n, m, k, 1.0f, a, lda, b, ldb,
                                              accumulate ? 1.0f : 0.0f, c, ldc);
          LAZYRT_ASSERT(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st));
        } else {
          cblas_sgemm(CblasRowMajor, ta, tb, n, m, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
        }
      } else
        cblas_dgemm(CblasRowMajor, ta, tb, n, m, k, 1.0, a, lda, b, ldb, accumulate ? 1.0 : 0.0, c, ldc);
      return;
    }
  }
  small_gemm(a, tx ? 1 : lda_, tx ? lda_ : 1, b, ty ? 1 : ldb_, ty ? ldb_ : 1, c, ldc_, n, k, m, accumulate);
}

// A 16-bit product: operands widened to f32 in the workspace, one GEMM, results rounded once.
template <class T, class Product>
Kernel via_f32(int64_t xn, int64_t yn, int64_t on, Product product) {
  return {[xn, yn, on, product](const void* const* in, void* const* out) {
            if (on == 0) return;  // an empty result: nothing to compute (nor, when the operands
                                  // are empty too, a workspace at out[1])
            const T* x = static_cast<const T*>(in[0]);
            const T* y = static_cast<const T*>(in[1]);
            float* xf = static_cast<float*>(out[1]);
            float* yf = xf + xn;
            float* of = yf + yn;
            for (int64_t i = 0; i < xn; ++i) xf[i] = static_cast<float>(x[i]);
            for (int64_t i = 0; i < yn; ++i) yf[i] = static_cast<float>(y[i]);
            product(xf, yf, of, in);
            T* o = static_cast<T*>(out[0]);
            for (int64_t i = 0; i < on; ++i) o[i] = T(of[i]);
          },
          static_cast<size_t>(xn + yn + on) * sizeof(float)};
}

// A gemm_view's valid extents (its optional i64[8] operand): per axis (the flattened batches,
// rows, columns, contracted elements), the valid count of each block of `block` (the whole
// axis where not positive): index i is valid where i % block < valid (all where valid is
// negative). Only valid elements are computed, from valid contracted elements alone; every
// other result element is 0.
struct Axis {
  int64_t size, valid, block;
  Axis(int64_t size_, const int64_t* e) : size(size_), valid(size_), block(std::max<int64_t>(size_, 1)) {
    if (!e) return;
    if (e[1] > 0) block = std::min(e[1], block);
    valid = e[0] >= 0 ? std::min(e[0], block) : block;
  }
  bool whole() const { return valid >= size; }
  // Each block's start and its valid count.
  template <class F>
  void blocks(F f) const {
    for (int64_t b0 = 0; b0 < size; b0 += block) f(b0, std::min(valid, size - b0), std::min(block, size - b0));
  }
};

template <class T>
void zero_block(T* c, int64_t ldc, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) std::fill(c + i * ldc, c + i * ldc + cols, T(0));
}

template <class T>
void run_batches(const MatmulLayout& L, const T* x, const T* y, T* o, const int64_t* extents) {
  const Axis B(static_cast<int64_t>(L.batches()), extents), N(L.n, extents ? extents + 2 : nullptr),
      M(L.m, extents ? extents + 4 : nullptr), K(L.k, extents ? extents + 6 : nullptr);
  std::optional<OmpTeam> team;
  if (L.onednn && K.valid > 0) team.emplace(L.macs() < kOneThreadMacs ? 1 : num_threads());
  if (B.whole() && N.whole() && M.whole() && K.whole()) {
    if (L.k == 0) {  // sums of nothing: x and y are empty, maybe no buffer, their offsets unused
      for (size_t b = 0; b < L.batches(); ++b)
        gemm<T>(nullptr, 1, nullptr, 1, o + L.o_off[b], L.ldc, L.n, 0, L.m, false, false, false);
    } else if (L.fold_batch) {
      gemm(x + L.x_off[0], L.lda, y + L.y_off[0], L.ldb, o + L.o_off[0], L.ldc,
           L.n * static_cast<int64_t>(L.batches()), L.k, L.m, false, L.ty, L.onednn);
    } else {
      for (size_t b = 0; b < L.batches(); ++b)
        gemm(x + L.x_off[b], L.lda, y + L.y_off[b], L.ldb, o + L.o_off[b], L.ldc, L.n, L.k, L.m, L.tx, L.ty,
             L.onednn);
    }
    return;
  }
  // Bounded: zeros outside the valid batches, rows and columns (and inside them where nothing
  // is contracted), then per valid batch and block of valid rows and columns the valid
  // contracted blocks summed, or one GEMM where the valid rows of the batches are consecutive.
  for (size_t bi = 0; bi < L.batches(); ++bi) {
    T* c = o + L.o_off[bi];
    if (static_cast<int64_t>(bi) % B.block >= B.valid) {
      zero_block(c, L.ldc, L.n, L.m);
      continue;
    }
    N.blocks([&](int64_t r0, int64_t rv, int64_t rlen) {
      zero_block(c + (r0 + rv) * L.ldc, L.ldc, rlen - rv, L.m);
      M.blocks([&](int64_t c0, int64_t cv, int64_t clen) {
        zero_block(c + r0 * L.ldc + c0 + (K.valid == 0 ? 0 : cv), L.ldc, rv, K.valid == 0 ? clen : clen - cv);
      });
    });
  }
  if (K.valid == 0) return;
  const auto single = [](const Axis& a) { return a.block >= a.size; };
  if (L.fold_batch && single(B) && single(N) && single(M) && single(K) && (N.whole() || B.valid <= 1)) {
    if (B.valid > 0)
      gemm(x + L.x_off[0], L.lda, y + L.y_off[0], L.ldb, o + L.o_off[0], L.ldc, (B.valid - 1) * L.n + N.valid, K.valid,
           M.valid, false, L.ty, L.onednn);
    return;
  }
  for (size_t bi = 0; bi < L.batches(); ++bi) {
    if (static_cast<int64_t>(bi) % B.block >= B.valid) continue;
    N.blocks([&](int64_t r0, int64_t rv, int64_t) {
      M.blocks([&](int64_t c0, int64_t cv, int64_t) {
        bool accumulate = false;
        K.blocks([&](int64_t p0, int64_t pv, int64_t) {
          if (pv == 0 || rv == 0 || cv == 0) return;
          const T* a = x + L.x_off[bi] + (L.tx ? p0 * L.lda + r0 : r0 * L.lda + p0);
          const T* b = y + L.y_off[bi] + (L.ty ? c0 * L.ldb + p0 : p0 * L.ldb + c0);
          gemm(a, L.lda, b, L.ldb, o + L.o_off[bi] + r0 * L.ldc + c0, L.ldc, rv, pv, cv, L.tx, L.ty, L.onednn,
               accumulate);
          accumulate = true;
        });
      });
    });
  }
}

// matmul, gemm and gemm_view: one kernel over a layout.
Kernel make_product(const KernelSpec& s, std::shared_ptr<MatmulLayout> made) {
  const DType dt = s.inputs[0].dtype;
  made->onednn = s.library && (dt == DType::f32 || dt == DType::bf16 || dt == DType::f16);
  if (made->onednn) {
    static auto& library = metrics::detail::counter_cell("LibraryKernels");
    library.add(1);
  }
  std::shared_ptr<const MatmulLayout> layout = std::move(made);
  const bool bounded = s.inputs.size() == 3;  // a gemm_view's valid extents
  const int64_t xn = s.inputs[0].numel(), yn = s.inputs[1].numel(), on = s.outputs[0].numel();
  return visit_dtype(s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      LAZYRT_ASSERT(false, "matmul kernel made for b8");
      return {};
    } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      return via_f32<T>(xn, yn, on, [layout, bounded](const float* x, const float* y, float* o, const void* const* in) {
        run_batches<float>(*layout, x, y, o, bounded ? static_cast<const int64_t*>(in[2]) : nullptr);
      });
    } else {
      return {[layout, bounded](const void* const* in, void* const* out) {
        run_batches<T>(*layout, static_cast<const T*>(in[0]), static_cast<const T*>(in[1]),
                       static_cast<T*>(out[0]), bounded ? static_cast<const int64_t*>(in[2]) : nullptr);
      }};
    }
  });
}

}  // namespace

Kernel make_Matmul(const KernelSpec& s) {
  return make_product(s, std::make_shared<MatmulLayout>(s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape));
}

Kernel make_Gemm(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  return make_product(s, std::make_shared<MatmulLayout>(s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape,
                                                        a.b<"transpose_x">(), a.b<"transpose_y">()));
}

Kernel make_GemmView(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  return make_product(s, std::make_shared<MatmulLayout>(ir::StridedView::decode(a.ints<"x_view">()),
                                                        ir::StridedView::decode(a.ints<"y_view">()),
                                                        a.ints<"out_perm">(), s.outputs[0].shape));
}

}  // namespace lazyrt::kernels
