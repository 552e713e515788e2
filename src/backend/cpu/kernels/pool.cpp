// 2-D max and average pooling over NCHW and their backward ops. Each (n, c) plane is pooled
// on its own. The window rules are PyTorch's CPU kernels', so that results (and which
// element of a tie or a NaN takes a max pool's gradient) match:
//   max: the window is clipped to the input; the first element greater than every earlier
//        one wins, and any NaN wins over what came before it.
//   avg: the divisor is the window clipped to the padded input (count_include_pad), or to
//        the input, or divisor_override; the sum runs in row-major window order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <vector>

#include "backend/cpu/kernels/loops.h"
#include "scalar/vmath.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/parallel.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)
namespace {

struct PoolGeom {
  int64_t planes, H, W, OH, OW;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  bool count_include_pad = true;
  int64_t divisor = 0;  // 0: none

  // The window of output (oh, ow) clipped to the input, stepping by the dilation.
  void window(int64_t oh, int64_t ow, int64_t* h0, int64_t* h1, int64_t* w0, int64_t* w1) const {
    *h0 = oh * sh - ph;
    *w0 = ow * sw - pw;
    *h1 = std::min(*h0 + (kh - 1) * dh + 1, H);
    *w1 = std::min(*w0 + (kw - 1) * dw + 1, W);
    while (*h0 < 0) *h0 += dh;
    while (*w0 < 0) *w0 += dw;
  }

  // Avg pooling (no dilation): the clipped window and its divisor.
  int64_t avg_window(int64_t oh, int64_t ow, int64_t* h0, int64_t* h1, int64_t* w0,
                     int64_t* w1) const {
    *h0 = oh * sh - ph;
    *w0 = ow * sw - pw;
    *h1 = std::min(*h0 + kh, H + ph);
    *w1 = std::min(*w0 + kw, W + pw);
    const int64_t padded_size = (*h1 - *h0) * (*w1 - *w0);
    *h0 = std::max<int64_t>(*h0, 0);
    *w0 = std::max<int64_t>(*w0, 0);
    *h1 = std::min(*h1, H);
    *w1 = std::min(*w1, W);
    if (divisor) return divisor;
    return count_include_pad ? padded_size : (*h1 - *h0) * (*w1 - *w0);
  }
};

PoolGeom make_geom(const Shape& x, const Shape& out, const std::vector<int64_t>& kernel,
                   const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                   const std::vector<int64_t>& dilation) {
  PoolGeom g{};
  g.planes = x[0] * x[1];
  g.H = x[2], g.W = x[3], g.OH = out[2], g.OW = out[3];
  g.kh = kernel[0], g.kw = kernel[1];
  g.sh = stride[0], g.sw = stride[1];
  g.ph = padding[0], g.pw = padding[1];
  g.dh = dilation[0], g.dw = dilation[1];
  return g;
}

// Index (within the plane) of the max of window (oh, ow), and the max into *value. A window
// with no element in the input (dilation stepping over it all) has the lowest value and the
// index of its first place, past the plane's end, as PyTorch gives them.
template <class T>
int64_t argmax(const T* plane, const PoolGeom& g, int64_t oh, int64_t ow, compute_t<T>* value) {
  using C = compute_t<T>;
  int64_t h0, h1, w0, w1;
  g.window(oh, ow, &h0, &h1, &w0, &w1);
  int64_t best = h0 * g.W + w0;
  C best_value = std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                      : std::numeric_limits<C>::lowest();
  for (int64_t h = h0; h < h1; h += g.dh) {
    for (int64_t w = w0; w < w1; w += g.dw) {
      const C v = convert<C>(plane[h * g.W + w]);
      if (v > best_value || std::isnan(v)) {
        best_value = v;
        best = h * g.W + w;
      }
    }
  }
  *value = best_value;
  return best;
}

// One tap of every window of a plane: `rows` rows of n outputs, n a multiple of kLanes, rows
// of m and t 64-byte aligned; output (r, i)'s element at tap `tap` is x[r * x_row + i]. It
// takes the running maximum m[r * n + i] (and t[...] its tap) when greater, or a nan. Selects
// over arrays in whole vectors, which become blends: no branch on the data (a branch
// mispredicts on every new maximum).
constexpr int64_t kLanes = 16;
template <class C>
LAZYRT_ISA_CLONES void max_tap(const C* __restrict x, int64_t x_row, int64_t rows, int64_t n, int32_t tap,
                               C* __restrict m, int32_t* __restrict t) {
  for (int64_t r = 0; r < rows; ++r) {
    const C* xr = x + r * x_row;
    C* mr = static_cast<C*>(__builtin_assume_aligned(m + r * n, 64));
    int32_t* tr = static_cast<int32_t*>(__builtin_assume_aligned(t + r * n, 64));
    for (int64_t i0 = 0; i0 < n; i0 += kLanes) {
      for (int64_t i = i0; i < i0 + kLanes; ++i) {  // a fixed trip count: whole vectors
        const C v = xr[i];
        const bool take = (v > mr[i]) | (v != v);
        mr[i] = take ? v : mr[i];
        tr[i] = take ? tap : tr[i];
      }
    }
  }
}

// The argmax (index within the plane) and the maximum of every window of a plane, as argmax()
// gives them, over scratch that the kernel's workspace holds (bytes(g) a piece of planes run
// at once). The plane is copied (in its compute type) into a buffer padded with the lowest
// value on every side a window reaches past, where no element is ever taken, so that every
// window is whole; each padded row is stored as sw phases (columns w with w % sw == q, in
// order), so that one tap of consecutive windows reads consecutive elements. Then the windows
// are done a tap at a time over all of them (max_tap), in window order, so that ties and nans
// resolve as in argmax(); rows of outputs kLanes at a time (the padding covers the extra
// ones). A window where nothing was taken (every element the lowest value, or none in the
// plane) gets argmax()'s own answer.
template <class T>
struct PlaneArgmax {
  using C = compute_t<T>;
  struct Dims {
    int64_t pitch, Hp, Wp, Wq, row_pitch;
    explicit Dims(const PoolGeom& g)
        : pitch((g.OW + kLanes - 1) / kLanes * kLanes), Hp((g.OH - 1) * g.sh + (g.kh - 1) * g.dh + 1),
          Wp((pitch - 1) * g.sw + (g.kw - 1) * g.dw + 1), Wq((Wp + g.sw - 1) / g.sw), row_pitch(Wq * g.sw) {}
  };
  static size_t round64(size_t n) { return (n + 63) / 64 * 64; }
  // Scratch bytes: padded plane, maxima, taps, a plane of indices and the taps' offsets, each
  // 64-byte aligned, and 64 bytes to align the start.
  static size_t bytes(const PoolGeom& g) {
    const Dims d(g);
    return 64 + round64(static_cast<size_t>(d.Hp * d.row_pitch) * sizeof(C)) +
           round64(static_cast<size_t>(g.OH * d.pitch) * sizeof(C)) +
           round64(static_cast<size_t>(g.OH * d.pitch) * sizeof(int32_t)) +
           round64(static_cast<size_t>(g.OH * g.OW) * sizeof(int64_t)) +
           round64(static_cast<size_t>(g.kh * g.kw) * sizeof(int64_t));
  }
  PlaneArgmax(const PoolGeom& g, void* scratch) : d(g) {
    char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(scratch) + 63) / 64 * 64);
    padded = reinterpret_cast<C*>(p);
    p += round64(static_cast<size_t>(d.Hp * d.row_pitch) * sizeof(C));
    best = reinterpret_cast<C*>(p);
    p += round64(static_cast<size_t>(g.OH * d.pitch) * sizeof(C));
    taps = reinterpret_cast<int32_t*>(p);
    p += round64(static_cast<size_t>(g.OH * d.pitch) * sizeof(int32_t));
    idx = reinterpret_cast<int64_t*>(p);
    p += round64(static_cast<size_t>(g.OH * g.OW) * sizeof(int64_t));
    tap_offset = reinterpret_cast<int64_t*>(p);
    for (int64_t i = 0, k = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j, ++k) tap_offset[k] = i * g.dh * g.W + j * g.dw;
  }
  const Dims d;
  C* padded;
  C* best;
  int32_t* taps;
  int64_t* idx;         // a plane's indices, for callers that keep them nowhere else
  int64_t* tap_offset;  // per tap, its place in the plane from the window's corner

  // The plane's windows: their indices into out_idx (OH * OW), then fn(output, maximum) for each.
  template <class Fn>
  void run(const T* plane, const PoolGeom& g, int64_t* out_idx, const Fn& fn) {
    const C lowest = std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                          : std::numeric_limits<C>::lowest();
    const int64_t sw = g.sw;
    const int64_t pitch = d.pitch, Hp = d.Hp, Wq = d.Wq, row_pitch = d.row_pitch;
    for (int64_t hp = 0; hp < Hp; ++hp) {
      C* row = padded + hp * row_pitch;
      const int64_t h = hp - g.ph;
      if (h < 0 || h >= g.H) {
        std::fill(row, row + row_pitch, lowest);
        continue;
      }
      const T* in = plane + h * g.W;
      for (int64_t q = 0; q < sw; ++q) {
        // phase[k] is column k * sw + q - pw of the input row: inside it for k in [k0, k1).
        C* phase = row + q * Wq;
        const int64_t first = q - g.pw;  // the column of k = 0
        const int64_t k0 = std::min(Wq, first >= 0 ? 0 : (-first + sw - 1) / sw);
        const int64_t k1 = std::max(k0, std::min(Wq, g.W - first <= 0 ? 0 : (g.W - first + sw - 1) / sw));
        std::fill(phase, phase + k0, lowest);
        for (int64_t k = k0; k < k1; ++k) phase[k] = convert<C>(in[k * sw + first]);
        std::fill(phase + k1, phase + Wq, lowest);
      }
    }
    std::fill(best, best + g.OH * pitch, lowest);
    std::fill(taps, taps + g.OH * pitch, -1);
    int32_t tap = 0;
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j, ++tap) {
        const int64_t col = j * g.dw;
        const C* x = padded + i * g.dh * row_pitch + col % sw * Wq + col / sw;
        max_tap(x, g.sh * row_pitch, g.OH, pitch, tap, best, taps);
      }
    for (int64_t oh = 0, o = 0; oh < g.OH; ++oh) {
      const int64_t corner = (oh * g.sh - g.ph) * g.W - g.pw;  // of window (oh, 0) in the plane
      for (int64_t ow = 0; ow < g.OW; ++ow, ++o) {
        const int32_t k = taps[oh * pitch + ow];
        C value = best[oh * pitch + ow];
        out_idx[o] = k < 0 ? argmax(plane, g, oh, ow, &value) : corner + ow * g.sw + tap_offset[k];
        fn(o, value);
      }
    }
  }
};

// fn(first plane, end plane) over the planes, split across threads where there is enough work
// (planes are independent).
template <class F>
void for_planes(const PoolGeom& g, const F& fn) {
  const int64_t work = std::max<int64_t>(1, g.OH * g.OW * g.kh * g.kw);
  parallel_for(g.planes, std::max<int64_t>(1, kParallelGrain / work), fn);
}

// fn(first plane, end plane, scratch) over the planes in pieces, each with its own slice of
// `workspace` (pieces_for(g) slices of PlaneArgmax<T>::bytes(g)), the pieces split across
// threads where there is enough work.
int64_t pieces_for(const PoolGeom& g) {
  const int64_t work = std::max<int64_t>(1, g.OH * g.OW * g.kh * g.kw);
  return std::max<int64_t>(1, std::min<int64_t>({g.planes, num_threads(), g.planes * work / kParallelGrain}));
}
template <class T, class F>
void for_plane_pieces(const PoolGeom& g, int64_t pieces, void* workspace, const F& fn) {
  const size_t slice = PlaneArgmax<T>::bytes(g);
  parallel_for(pieces, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      PlaneArgmax<T> windows(g, static_cast<char*>(workspace) + static_cast<size_t>(c) * slice);
      fn(g.planes * c / pieces, g.planes * (c + 1) / pieces, windows);
    }
  });
}

template <class T>
void max_pool(const PoolGeom& g, int64_t pieces, const T* x, T* out, void* workspace) {
  for_plane_pieces<T>(g, pieces, workspace, [&](int64_t p0, int64_t p1, PlaneArgmax<T>& windows) {
    for (int64_t p = p0; p < p1; ++p) {
      T* o = out + p * g.OH * g.OW;
      windows.run(x + p * g.H * g.W, g, windows.idx, [&](int64_t k, compute_t<T> v) { o[k] = convert<T>(v); });
    }
  });
}

template <class T>
void max_pool_backward(const PoolGeom& g, int64_t pieces, const T* gout, const T* x, T* dx, void* workspace) {
  using C = compute_t<T>;
  for_plane_pieces<T>(g, pieces, workspace, [&](int64_t p0, int64_t p1, PlaneArgmax<T>& windows) {
    std::fill(dx + p0 * g.H * g.W, dx + p1 * g.H * g.W, convert<T>(0));
    const T* go = gout + p0 * g.OH * g.OW;
    for (int64_t p = p0; p < p1; ++p) {
      T* dplane = dx + p * g.H * g.W;
      windows.run(x + p * g.H * g.W, g, windows.idx, [](int64_t, C) {});
      for (int64_t o = 0; o < g.OH * g.OW; ++o) {
        const int64_t at = windows.idx[o];
        const T grad = *go++;
        if (at >= g.H * g.W) continue;  // an empty window: its value depends on no element
        T& d = dplane[at];
        d = convert<T>(static_cast<C>(convert<C>(d) + convert<C>(grad)));
      }
    }
  });
}

template <class T>
void avg_pool(const PoolGeom& g, const T* x, T* out) {
  using C = compute_t<T>;
  for_planes(g, [&](int64_t p0, int64_t p1) {
    T* o = out + p0 * g.OH * g.OW;
    for (int64_t p = p0; p < p1; ++p) {
      const T* plane = x + p * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          int64_t h0, h1, w0, w1;
          const int64_t divide = g.avg_window(oh, ow, &h0, &h1, &w0, &w1);
          C sum = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) sum = static_cast<C>(sum + convert<C>(plane[h * g.W + w]));
          *o++ = h0 < h1 && w0 < w1 ? convert<T>(static_cast<C>(sum / static_cast<C>(divide))) : convert<T>(0);
        }
      }
    }
  });
}

template <class T>
void avg_pool_backward(const PoolGeom& g, const T* gout, T* dx) {
  using C = compute_t<T>;
  for_planes(g, [&](int64_t p0, int64_t p1) {
    std::fill(dx + p0 * g.H * g.W, dx + p1 * g.H * g.W, convert<T>(0));
    const T* go = gout + p0 * g.OH * g.OW;
    for (int64_t p = p0; p < p1; ++p) {
      T* dplane = dx + p * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          int64_t h0, h1, w0, w1;
          const int64_t divide = g.avg_window(oh, ow, &h0, &h1, &w0, &w1);
          const C delta = static_cast<C>(convert<C>(*go++) / static_cast<C>(divide));
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              T& d = dplane[h * g.W + w];
              d = convert<T>(static_cast<C>(convert<C>(d) + delta));
            }
        }
      }
    }
  });
}

template <class T>
constexpr bool kPoolable = !std::is_same_v<T, bool>;

template <class Fn>
Kernel pool_kernel(const KernelSpec& s, DType dtype, Fn&& make) {
  return visit_dtype(dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    if constexpr (kPoolable<T>) {
      return make(T{});
    } else {
      LAZYRT_ASSERT(false, "pooling kernel ", ir::op_name(s.op), " made for ", dtype_name(dtype));
      return {};
    }
  });
}

}  // namespace

namespace {

// The geometry of a max pooling op whose input has shape x and whose pooled values shape out.
PoolGeom max_pool_geom(const KernelSpec& s, const Shape& x, const Shape& out) {
  const ir::NodeAttrs a(s.op, s.attrs);
  return make_geom(x, out, a.ints<"kernel">(), a.ints<"stride">(), a.ints<"padding">(), a.ints<"dilation">());
}

}  // namespace

// A max pooling kernel over geometry g: run(g, pieces, in, out, workspace), with the workspace
// its pieces of planes need (none where there is no window).
template <class Run>
Kernel max_pool_kernel(const KernelSpec& s, const PoolGeom& g, DType dtype, Run&& run) {
  return pool_kernel(s, dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    const bool empty = g.planes == 0 || g.OH == 0 || g.OW == 0;
    const int64_t pieces = empty ? 0 : pieces_for(g);
    return {[g, pieces, run](const void* const* in, void* const* out) {
              run(T{}, g, pieces, in, out, pieces ? out[1] : nullptr);
            },
            empty ? 0 : static_cast<size_t>(pieces) * PlaneArgmax<T>::bytes(g)};
  });
}

Kernel make_MaxPool2d(const KernelSpec& s) {
  const PoolGeom g = max_pool_geom(s, s.inputs[0].shape, s.outputs[0].shape);
  return max_pool_kernel(s, g, s.inputs[0].dtype, [](auto tag, const PoolGeom& g, int64_t pieces,
                                                      const void* const* in, void* const* out, void* ws) {
    using T = decltype(tag);
    if (pieces) max_pool(g, pieces, static_cast<const T*>(in[0]), static_cast<T*>(out[0]), ws);
  });
}

Kernel make_MaxPool2dBackward(const KernelSpec& s) {
  const PoolGeom g = max_pool_geom(s, s.inputs[1].shape, s.inputs[0].shape);
  return max_pool_kernel(s, g, s.inputs[1].dtype, [](auto tag, const PoolGeom& g, int64_t pieces,
                                                      const void* const* in, void* const* out, void* ws) {
    using T = decltype(tag);
    T* dx = static_cast<T*>(out[0]);
    if (!pieces) std::fill(dx, dx + g.planes * g.H * g.W, convert<T>(0));  // no window: no gradient
    else max_pool_backward(g, pieces, static_cast<const T*>(in[0]), static_cast<const T*>(in[1]), dx, ws);
  });
}

Kernel make_MaxPool2dIndices(const KernelSpec& s) {
  const PoolGeom g = max_pool_geom(s, s.inputs[0].shape, s.outputs[0].shape);
  return max_pool_kernel(s, g, s.inputs[0].dtype, [](auto tag, const PoolGeom& g, int64_t pieces,
                                                      const void* const* in, void* const* out, void* ws) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(in[0]);
    int64_t* indices = static_cast<int64_t*>(out[0]);
    if (!pieces) return;
    for_plane_pieces<T>(g, pieces, ws, [&](int64_t p0, int64_t p1, PlaneArgmax<T>& windows) {
      for (int64_t p = p0; p < p1; ++p)
        windows.run(x + p * g.H * g.W, g, indices + p * g.OH * g.OW, [](int64_t, compute_t<T>) {});
    });
  });
}

Kernel make_AvgPool2d(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  PoolGeom g = make_geom(s.inputs[0].shape, s.outputs[0].shape, a.ints<"kernel">(),
                         a.ints<"stride">(), a.ints<"padding">(), {1, 1});
  g.count_include_pad = a.b<"count_include_pad">();
  g.divisor = a.i<"divisor">();
  return pool_kernel(s, s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[g](const void* const* in, void* const* out) {
      avg_pool(g, static_cast<const T*>(in[0]), static_cast<T*>(out[0]));
    }};
  });
}

Kernel make_AvgPool2dBackward(const KernelSpec& s) {
  const ir::NodeAttrs a(s.op, s.attrs);
  PoolGeom g = make_geom(s.outputs[0].shape, s.inputs[0].shape, a.ints<"kernel">(),
                         a.ints<"stride">(), a.ints<"padding">(), {1, 1});
  g.count_include_pad = a.b<"count_include_pad">();
  g.divisor = a.i<"divisor">();
  return pool_kernel(s, s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[g](const void* const* in, void* const* out) {
      avg_pool_backward(g, static_cast<const T*>(in[0]), static_cast<T*>(out[0]));
    }};
  });
}

}  // namespace lazyrt::kernels
