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

#include "backend/cpu/kernels/loops.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/parallel.h"

namespace lazyrt::kernels {
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

// Index (within the plane) of the max of window (oh, ow).
template <class T>
int64_t argmax(const T* plane, const PoolGeom& g, int64_t oh, int64_t ow) {
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
  return best;
}

// fn(first plane, end plane) over the planes, split across threads where there is enough work
// (planes are independent).
template <class F>
void for_planes(const PoolGeom& g, const F& fn) {
  const int64_t work = std::max<int64_t>(1, g.OH * g.OW * g.kh * g.kw);
  parallel_for(g.planes, std::max<int64_t>(1, kParallelGrain / work), fn);
}

template <class T>
void max_pool(const PoolGeom& g, const T* x, T* out) {
  for_planes(g, [&](int64_t p0, int64_t p1) {
    T* o = out + p0 * g.OH * g.OW;
    for (int64_t p = p0; p < p1; ++p) {
      const T* plane = x + p * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) *o++ = plane[argmax(plane, g, oh, ow)];
    }
  });
}

template <class T>
void max_pool_backward(const PoolGeom& g, const T* gout, const T* x, T* dx) {
  using C = compute_t<T>;
  for_planes(g, [&](int64_t p0, int64_t p1) {
    std::fill(dx + p0 * g.H * g.W, dx + p1 * g.H * g.W, convert<T>(0));
    const T* go = gout + p0 * g.OH * g.OW;
    for (int64_t p = p0; p < p1; ++p) {
      const T* plane = x + p * g.H * g.W;
      T* dplane = dx + p * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          T& d = dplane[argmax(plane, g, oh, ow)];
          d = convert<T>(static_cast<C>(convert<C>(d) + convert<C>(*go++)));
        }
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
constexpr bool kPoolable = !std::is_same_v<T, bool> && !std::is_same_v<T, int32_t>;

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

Kernel make_MaxPool2d(const KernelSpec& s) {
  const PoolGeom g = max_pool_geom(s, s.inputs[0].shape, s.outputs[0].shape);
  return pool_kernel(s, s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[g](const void* const* in, void* const* out) {
      max_pool(g, static_cast<const T*>(in[0]), static_cast<T*>(out[0]));
    }};
  });
}

Kernel make_MaxPool2dBackward(const KernelSpec& s) {
  const PoolGeom g = max_pool_geom(s, s.inputs[1].shape, s.inputs[0].shape);
  return pool_kernel(s, s.inputs[1].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[g](const void* const* in, void* const* out) {
      max_pool_backward(g, static_cast<const T*>(in[0]), static_cast<const T*>(in[1]),
                        static_cast<T*>(out[0]));
    }};
  });
}

Kernel make_MaxPool2dIndices(const KernelSpec& s) {
  const PoolGeom g = max_pool_geom(s, s.inputs[0].shape, s.outputs[0].shape);
  return pool_kernel(s, s.inputs[0].dtype, [&](auto tag) -> Kernel {
    using T = decltype(tag);
    return {[g](const void* const* in, void* const* out) {
      const T* x = static_cast<const T*>(in[0]);
      int64_t* indices = static_cast<int64_t*>(out[0]);
      for_planes(g, [&](int64_t p0, int64_t p1) {
        int64_t* o = indices + p0 * g.OH * g.OW;
        for (int64_t p = p0; p < p1; ++p) {
          const T* plane = x + p * g.H * g.W;
          for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t ow = 0; ow < g.OW; ++ow) *o++ = argmax(plane, g, oh, ow);
        }
      });
    }};
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
