// 2-D convolution (NCHW) and its two backward ops, as im2col / col2im around one GEMM per
// group and chunk of images:
//   forward          out_g[Og, P]  = W_g[Og, K] @ col[K, P]           (col = im2col(x_g))
//   backward input   col[K, P]     = W_g^T @ gout_g[Og, P], then dx_g += col2im(col)
//   backward weight  dW_g[Og, K]  += gout_g[Og, P] @ col^T
// with K = C/groups * kH * kW and P = OH * OW. A chunk packs several images side by side in
// the columns (P becomes chunk * P), so small late layers still give the GEMM wide matrices;
// the chunk is sized so the workspace (the column matrix, plus a packed copy of the output
// gradient or result when chunk > 1) stays near kWorkspaceTarget, whatever the batch size.
// A 1x1 convolution with stride 1 and no padding needs no column matrix: it is the input.
//
// f32 and f64 go through BLAS (cblas_sgemm / cblas_dgemm); i32 and i64 through a plain loop.
// bf16 and f16 compute in f32, as torch does: the operands are widened into the workspace, the
// f32 kernel runs there, and the result is rounded once.
#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"

namespace lazyrt::kernels {
namespace {

constexpr size_t kWorkspaceTarget = size_t{8} << 20;

struct ConvGeom {
  int64_t N, C, H, W;     // input
  int64_t O, kh, kw;      // weight [O, C / groups, kh, kw]
  int64_t OH, OW;         // output
  int64_t sh, sw, ph, pw, dh, dw, groups;
  int64_t Cg, Og, K, P;   // per group: input and output channels, GEMM depth, output pixels
  int64_t chunk;          // images per GEMM
  bool pointwise;         // the column matrix of an image is the image itself

  // Elements of the column matrix and of the packed output (gradient) of one chunk.
  int64_t col_elems() const { return pointwise ? 0 : K * chunk * P; }
  int64_t packed_elems() const { return chunk > 1 ? Og * chunk * P : 0; }
};

// x: [N, C, H, W], w: [O, C / groups, kh, kw], out: [N, O, OH, OW]; the attributes of
// conv2d or of either backward op (each has stride, padding, dilation and groups).
ConvGeom make_geom(const Shape& x, const Shape& w, const Shape& out, const ir::NodeAttrs& a,
                   size_t esize) {
  ConvGeom g{};
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
  g.O = w[0], g.kh = w[2], g.kw = w[3];
  g.OH = out[2], g.OW = out[3];
  const auto& stride = a.ints<"stride">();
  const auto& padding = a.ints<"padding">();
  const auto& dilation = a.ints<"dilation">();
  g.sh = stride[0], g.sw = stride[1];
  g.ph = padding[0], g.pw = padding[1];
  g.dh = dilation[0], g.dw = dilation[1];
  g.groups = a.i<"groups">();
  g.Cg = g.C / g.groups;
  g.Og = g.O / g.groups;
  g.K = g.Cg * g.kh * g.kw;
  g.P = g.OH * g.OW;
  g.pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
  g.chunk = 1;
  if (!g.pointwise && g.N > 1) {
    const auto per_image = static_cast<size_t>((g.K + g.Og) * g.P) * esize;
    const auto fit = per_image ? kWorkspaceTarget / per_image : static_cast<size_t>(g.N);
    g.chunk = std::clamp<int64_t>(static_cast<int64_t>(fit), 1, g.N);
  }
  return g;
}

size_t workspace_bytes(const ConvGeom& g, size_t esize) {
  return static_cast<size_t>(g.col_elems() + g.packed_elems()) * esize;
}

// C[M, N] = beta * C + op(A)[M, K] @ op(B)[K, N], row-major with leading dimensions.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const auto ta_ = ta ? CblasTrans : CblasNoTrans;
    const auto tb_ = tb ? CblasTrans : CblasNoTrans;
    auto ld = [](int64_t v) { return static_cast<blasint>(std::max<int64_t>(v, 1)); };
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta_, tb_, M, N, K, 1.0f, A, ld(lda), B, ld(ldb), beta, C, ld(ldc));
    else
      cblas_dgemm(CblasRowMajor, ta_, tb_, M, N, K, 1.0, A, ld(lda), B, ld(ldb), beta, C, ld(ldc));
  } else {
    for (int64_t m = 0; m < M; ++m) {
      T* c = C + m * ldc;
      for (int64_t n = 0; n < N; ++n) c[n] = beta == T(0) ? T(0) : static_cast<T>(beta * c[n]);
      for (int64_t k = 0; k < K; ++k) {
        const T av = ta ? A[k * lda + m] : A[m * lda + k];
        if (av == T(0)) continue;
        if (tb) {
          for (int64_t n = 0; n < N; ++n) c[n] = static_cast<T>(c[n] + av * B[n * ldb + k]);
        } else {
          const T* b = B + k * ldb;
          for (int64_t n = 0; n < N; ++n) c[n] = static_cast<T>(c[n] + av * b[n]);
        }
      }
    }
  }
}

// The output columns [lo, hi) of a kernel tap whose input column is o * s - p + j * d.
void valid_range(int64_t out, int64_t in, int64_t s, int64_t p, int64_t offset, int64_t* lo,
                 int64_t* hi) {
  // o * s + (offset - p) in [0, in)  <=>  o in [ceil((p - offset) / s), ceil((in + p - offset) / s))
  auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); };
  *lo = std::clamp<int64_t>(ceil_div(p - offset, s), 0, out);
  *hi = std::clamp<int64_t>(ceil_div(in + p - offset, s), *lo, out);
}

// The kernel taps of one group: fn(tap, in_row0, oh_lo, oh_hi, ow_lo, ow_hi, shift) for each
// channel c and tap (i, j), tap = (c * kh + i) * kw + j. Output rows [oh_lo, oh_hi) and
// columns [ow_lo, ow_hi) read the image inside its bounds: output (oh, ow) reads image row
// in_row0 + oh * sh (a row index into the group's [Cg * H] rows), column ow * sw + shift.
template <class Fn>
void for_each_tap(const ConvGeom& g, Fn&& fn) {
  for (int64_t c = 0; c < g.Cg; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      int64_t oh_lo, oh_hi;
      valid_range(g.OH, g.H, g.sh, g.ph, i * g.dh, &oh_lo, &oh_hi);
      for (int64_t j = 0; j < g.kw; ++j) {
        int64_t ow_lo, ow_hi;
        valid_range(g.OW, g.W, g.sw, g.pw, j * g.dw, &ow_lo, &ow_hi);
        fn((c * g.kh + i) * g.kw + j, c * g.H - g.ph + i * g.dh, oh_lo, oh_hi, ow_lo, ow_hi, j * g.dw - g.pw);
      }
    }
  }
}

// col[(c * kh + i) * kw + j][oh * OW + ow] = img[c][oh*sh - ph + i*dh][ow*sw - pw + j*dw], or 0
// outside the image; img is one group of one image, rows of col are `ld` apart.
template <class T>
void im2col(const T* img, const ConvGeom& g, T* col, int64_t ld) {
  for_each_tap(g, [&](int64_t tap, int64_t row0, int64_t oh_lo, int64_t oh_hi, int64_t ow_lo, int64_t ow_hi,
                      int64_t shift) {
    T* dst = col + tap * ld;
    std::fill(dst, dst + oh_lo * g.OW, T(0));
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      const T* src = img + (row0 + oh * g.sh) * g.W;
      T* row = dst + oh * g.OW;
      std::fill(row, row + ow_lo, T(0));
      if (g.sw == 1) {
        std::memcpy(row + ow_lo, src + ow_lo + shift, static_cast<size_t>(ow_hi - ow_lo) * sizeof(T));
      } else {
        for (int64_t ow = ow_lo; ow < ow_hi; ++ow) row[ow] = src[ow * g.sw + shift];
      }
      std::fill(row + ow_hi, row + g.OW, T(0));
    }
    std::fill(dst + oh_hi * g.OW, dst + g.OH * g.OW, T(0));
  });
}

// The adjoint of im2col: img[c][ih][iw] += every col entry that im2col read from there.
template <class T>
void col2im(const T* col, const ConvGeom& g, T* img, int64_t ld) {
  for_each_tap(g, [&](int64_t tap, int64_t row0, int64_t oh_lo, int64_t oh_hi, int64_t ow_lo, int64_t ow_hi,
                      int64_t shift) {
    const T* src = col + tap * ld;
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      T* dst = img + (row0 + oh * g.sh) * g.W;
      const T* row = src + oh * g.OW;
      for (int64_t ow = ow_lo; ow < ow_hi; ++ow) {
        T& v = dst[ow * g.sw + shift];
        v = static_cast<T>(v + row[ow]);
      }
    }
  });
}

// Rows [Og, P] of group `grp` of `nb` images starting at image n0 of t ([N, O, P]), packed
// side by side into dst [Og, nb * P].
template <class T>
void pack(const T* t, const ConvGeom& g, int64_t n0, int64_t nb, int64_t grp, T* dst) {
  const int64_t ld = nb * g.P;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < g.Og; ++r)
      std::memcpy(dst + r * ld + b * g.P, t + ((n0 + b) * g.O + grp * g.Og + r) * g.P,
                  static_cast<size_t>(g.P) * sizeof(T));
}

template <class T>
void unpack(const T* src, const ConvGeom& g, int64_t n0, int64_t nb, int64_t grp, T* t) {
  const int64_t ld = nb * g.P;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < g.Og; ++r)
      std::memcpy(t + ((n0 + b) * g.O + grp * g.Og + r) * g.P, src + r * ld + b * g.P,
                  static_cast<size_t>(g.P) * sizeof(T));
}

// The column matrix of images [n0, n0 + nb), group grp, of x; or x itself (pointwise).
template <class T>
const T* columns(const T* x, const ConvGeom& g, int64_t n0, int64_t nb, int64_t grp, T* col,
                 int64_t* ld) {
  const int64_t hw = g.H * g.W;
  if (g.pointwise) {
    *ld = g.P;
    return x + (n0 * g.C + grp * g.Cg) * hw;
  }
  *ld = nb * g.P;
  for (int64_t b = 0; b < nb; ++b) im2col(x + ((n0 + b) * g.C + grp * g.Cg) * hw, g, col + b * g.P, *ld);
  return col;
}

template <class T>
void conv_forward(const ConvGeom& g, const T* x, const T* w, T* out, T* ws) {
  T* col = ws;
  T* packed = ws + g.col_elems();
  for (int64_t n0 = 0; n0 < g.N; n0 += g.chunk) {
    const int64_t nb = std::min(g.chunk, g.N - n0);
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      int64_t ldb;
      const T* B = columns(x, g, n0, nb, grp, col, &ldb);
      const T* A = w + grp * g.Og * g.K;
      if (nb == 1) {
        gemm<T>(false, false, g.Og, g.P, g.K, A, g.K, B, ldb, T(0), out + (n0 * g.O + grp * g.Og) * g.P, g.P);
      } else {
        gemm<T>(false, false, g.Og, nb * g.P, g.K, A, g.K, B, ldb, T(0), packed, nb * g.P);
        unpack(packed, g, n0, nb, grp, out);
      }
    }
  }
}

template <class T>
void conv_backward_input(const ConvGeom& g, const T* gout, const T* w, T* dx, T* ws) {
  T* col = ws;
  T* packed = ws + g.col_elems();
  const int64_t hw = g.H * g.W;
  if (!g.pointwise) std::fill(dx, dx + g.N * g.C * hw, T(0));
  for (int64_t n0 = 0; n0 < g.N; n0 += g.chunk) {
    const int64_t nb = std::min(g.chunk, g.N - n0);
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const T* G = gout + (n0 * g.O + grp * g.Og) * g.P;
      if (nb > 1) {
        pack(gout, g, n0, nb, grp, packed);
        G = packed;
      }
      const T* A = w + grp * g.Og * g.K;
      const int64_t ld = nb * g.P;
      if (g.pointwise) {
        gemm<T>(true, false, g.K, g.P, g.Og, A, g.K, G, g.P, T(0), dx + (n0 * g.C + grp * g.Cg) * hw, g.P);
        continue;
      }
      gemm<T>(true, false, g.K, ld, g.Og, A, g.K, G, ld, T(0), col, ld);
      for (int64_t b = 0; b < nb; ++b) col2im(col + b * g.P, g, dx + ((n0 + b) * g.C + grp * g.Cg) * hw, ld);
    }
  }
}

template <class T>
void conv_backward_weight(const ConvGeom& g, const T* gout, const T* x, T* dw, T* ws) {
  T* col = ws;
  T* packed = ws + g.col_elems();
  std::fill(dw, dw + g.O * g.K, T(0));
  for (int64_t n0 = 0; n0 < g.N; n0 += g.chunk) {
    const int64_t nb = std::min(g.chunk, g.N - n0);
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const T* G = gout + (n0 * g.O + grp * g.Og) * g.P;
      if (nb > 1) {
        pack(gout, g, n0, nb, grp, packed);
        G = packed;
      }
      int64_t ldb;
      const T* B = columns(x, g, n0, nb, grp, col, &ldb);
      gemm<T>(false, true, g.Og, g.K, nb * g.P, G, nb * g.P, B, ldb, T(1), dw + grp * g.Og * g.K, g.K);
    }
  }
}

enum class Pass { Forward, BackwardInput, BackwardWeight };

template <Pass kPass, class T>
void run_pass(const ConvGeom& g, const T* a, const T* b, T* result, T* work) {
  if constexpr (kPass == Pass::Forward) conv_forward(g, a, b, result, work);
  else if constexpr (kPass == Pass::BackwardInput) conv_backward_input(g, a, b, result, work);
  else conv_backward_weight(g, a, b, result, work);
}

template <Pass kPass>
Kernel conv_kernel(const KernelSpec& s) {
  const DType dtype = s.outputs[0].dtype;
  // The shapes of the forward conv's input, weight and output.
  Shape x, w, out;
  if constexpr (kPass == Pass::Forward) {
    x = s.inputs[0].shape, w = s.inputs[1].shape, out = s.outputs[0].shape;
  } else if constexpr (kPass == Pass::BackwardInput) {
    x = s.outputs[0].shape, w = s.inputs[1].shape, out = s.inputs[0].shape;
  } else {
    x = s.inputs[1].shape, w = s.outputs[0].shape, out = s.inputs[0].shape;
  }
  return visit_dtype(dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      LAZYRT_ASSERT(false, "conv2d kernel made for ", dtype_name(dtype));
      return {};
    } else {
      const ConvGeom g = make_geom(x, w, out, ir::NodeAttrs(s.op, s.attrs), sizeof(C));
      const size_t ws = workspace_bytes(g, sizeof(C));
      if constexpr (std::is_same_v<T, C>) {
        return {[g, ws](const void* const* in, void* const* o) {
                  run_pass<kPass>(g, static_cast<const T*>(in[0]), static_cast<const T*>(in[1]),
                                  static_cast<T*>(o[0]), ws ? static_cast<T*>(o[1]) : nullptr);
                },
                ws};
      } else {
        const int64_t an = s.inputs[0].numel(), bn = s.inputs[1].numel(), rn = s.outputs[0].numel();
        return {[g, ws, an, bn, rn](const void* const* in, void* const* o) {
                  C* a = static_cast<C*>(o[1]);
                  C* b = a + an;
                  C* result = b + bn;
                  const T* a16 = static_cast<const T*>(in[0]);
                  const T* b16 = static_cast<const T*>(in[1]);
                  for (int64_t i = 0; i < an; ++i) a[i] = static_cast<C>(a16[i]);
                  for (int64_t i = 0; i < bn; ++i) b[i] = static_cast<C>(b16[i]);
                  run_pass<kPass>(g, a, b, result, ws ? result + rn : nullptr);
                  T* r16 = static_cast<T*>(o[0]);
                  for (int64_t i = 0; i < rn; ++i) r16[i] = T(result[i]);
                },
                static_cast<size_t>(an + bn + rn) * sizeof(C) + ws};
      }
    }
  });
}

}  // namespace

Kernel make_Conv2d(const KernelSpec& s) { return conv_kernel<Pass::Forward>(s); }
Kernel make_Conv2dBackwardInput(const KernelSpec& s) { return conv_kernel<Pass::BackwardInput>(s); }
Kernel make_Conv2dBackwardWeight(const KernelSpec& s) { return conv_kernel<Pass::BackwardWeight>(s); }

}  // namespace lazyrt::kernels
