// The kernels of the data-movement, indexing, convolution and pooling ops beyond what the
// torch parity cases reach: convolutions big enough to be split into several chunks of
// images (checked against a direct convolution written out here), workspaces that do not
// grow with the batch, and steps that run without heap allocations.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "compile/compile.h"
#include "backend/cpu/kernels/kernel.h"
#include "runtime/buffer.h"
#include "support/alloc_counter.h"

namespace lazyrt {
namespace {

using ir::OpKind;

std::vector<double> draw(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

struct ConvCase {
  int64_t N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  int64_t OH() const { return (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t OW() const { return (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

// out = conv(x, w); dx, dw: the gradients of sum(out * g). Straight from the definition.
void direct_conv(const ConvCase& c, const std::vector<double>& x, const std::vector<double>& w,
                 const std::vector<double>& g, std::vector<double>& out, std::vector<double>& dx,
                 std::vector<double>& dw) {
  const int64_t Cg = c.C / c.groups, Og = c.O / c.groups, OH = c.OH(), OW = c.OW();
  out.assign(static_cast<size_t>(c.N * c.O * OH * OW), 0);
  dx.assign(x.size(), 0);
  dw.assign(w.size(), 0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const size_t oi = static_cast<size_t>(((n * c.O + o) * OH + oh) * OW + ow);
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t ih = oh * c.sh - c.ph + i * c.dh, iw = ow * c.sw - c.pw + j * c.dw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const int64_t ch = (o / Og) * Cg + ci;
                const size_t xi = static_cast<size_t>(((n * c.C + ch) * c.H + ih) * c.W + iw);
                const size_t wi = static_cast<size_t>(((o * Cg + ci) * c.kh + i) * c.kw + j);
                out[oi] += x[xi] * w[wi];
                dx[xi] += g[oi] * w[wi];
                dw[wi] += g[oi] * x[xi];
              }
        }
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (std::abs(got[i] - want[i]) > 1e-10 * (1 + std::abs(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
      ++bad;
    }
}

// Images of (72 + 4) x 4096 f64 columns: about 2.5 MB each, so a batch of 5 runs as a chunk
// of 3 images and a chunk of 2.
TEST(ConvKernels, ChunkedBatchesMatchADirectConvolution) {
  const ConvCase c{5, 16, 64, 64, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2};
  std::mt19937 rng(42);
  auto xv = draw(static_cast<size_t>(c.N * c.C * c.H * c.W), rng);
  auto wv = draw(static_cast<size_t>(c.O * (c.C / c.groups) * c.kh * c.kw), rng);
  auto gv = draw(static_cast<size_t>(c.N * c.O * c.OH() * c.OW()), rng);
  Tensor x = tensor(xv, {c.N, c.C, c.H, c.W}).requires_grad_();
  Tensor w = tensor(wv, {c.O, c.C / c.groups, c.kh, c.kw}).requires_grad_();
  Tensor out = conv2d(x, w, Tensor(), {c.sh, c.sw}, {c.ph, c.pw}, {c.dh, c.dw}, c.groups);
  sum(out * tensor(gv, out.shape())).backward();
  std::vector<double> want_out, want_dx, want_dw;
  direct_conv(c, xv, wv, gv, want_out, want_dx, want_dw);
  expect_close(out.to_vector<double>(), want_out, "out");
  expect_close(x.grad().to_vector<double>(), want_dx, "dx");
  expect_close(w.grad().to_vector<double>(), want_dw, "dw");
}

// Strides, dilation and a batch that is not a multiple of the chunk, in f32 through sgemm.
TEST(ConvKernels, ChunkedStridedDilatedF32MatchesADirectConvolution) {
  const ConvCase c{7, 6, 80, 70, 9, 3, 2, 2, 1, 2, 1, 2, 3, 3};
  std::mt19937 rng(7);
  auto xv = draw(static_cast<size_t>(c.N * c.C * c.H * c.W), rng);
  auto wv = draw(static_cast<size_t>(c.O * (c.C / c.groups) * c.kh * c.kw), rng);
  auto gv = draw(static_cast<size_t>(c.N * c.O * c.OH() * c.OW()), rng);
  auto f32 = [](const std::vector<double>& v, Shape s) {
    return tensor(std::vector<float>(v.begin(), v.end()), std::move(s));
  };
  auto round_f32 = [](std::vector<double> v) {
    for (double& d : v) d = static_cast<float>(d);
    return v;
  };
  Tensor x = f32(xv, {c.N, c.C, c.H, c.W}).requires_grad_();
  Tensor w = f32(wv, {c.O, c.C / c.groups, c.kh, c.kw}).requires_grad_();
  Tensor out = conv2d(x, w, Tensor(), {c.sh, c.sw}, {c.ph, c.pw}, {c.dh, c.dw}, c.groups);
  sum(out * f32(gv, out.shape())).backward();
  std::vector<double> want_out, want_dx, want_dw;
  direct_conv(c, round_f32(xv), round_f32(wv), round_f32(gv), want_out, want_dx, want_dw);
  auto check = [](const Tensor& t, const std::vector<double>& want, const char* what) {
    std::vector<float> got = t.to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    int bad = 0;
    for (size_t i = 0; i < got.size() && bad < 5; ++i)
      if (std::abs(got[i] - want[i]) > 1e-4 * (1 + std::abs(want[i]))) {
        ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
        ++bad;
      }
  };
  check(out, want_out, "out");
  check(x.grad(), want_dx, "dx");
  check(w.grad(), want_dw, "dw");
}

// The conv kernels' workspace holds a bounded chunk of images, not the batch.
TEST(ConvKernels, WorkspaceIsBoundedWhateverTheBatch) {
  auto workspace = [](OpKind op, int64_t batch) {
    const ir::TensorType x{DType::f32, {batch, 64, 32, 32}}, w{DType::f32, {64, 64, 3, 3}};
    const ir::TensorType out{DType::f32, {batch, 64, 32, 32}};
    const std::vector<int64_t> one{1, 1};
    ir::Attrs conv{one, one, one, int64_t{1}};
    switch (op) {
      case OpKind::Conv2d: return kernels::make_kernel({op, conv, {x, w}, {out}}).workspace_bytes;
      case OpKind::Conv2dBackwardInput: {
        ir::Attrs a{x.shape, one, one, one, int64_t{1}};
        return kernels::make_kernel({op, a, {out, w}, {x}}).workspace_bytes;
      }
      default: {
        ir::Attrs a{w.shape, one, one, one, int64_t{1}};
        return kernels::make_kernel({op, a, {out, x}, {w}}).workspace_bytes;
      }
    }
  };
  // One image: a 576 x 1024 column matrix (2.25 MiB); the target is 8 MiB.
  const size_t one_image = 576 * 1024 * 4;
  for (OpKind op : {OpKind::Conv2d, OpKind::Conv2dBackwardInput, OpKind::Conv2dBackwardWeight}) {
    EXPECT_EQ(workspace(op, 1), one_image) << ir::op_name(op);
    EXPECT_LE(workspace(op, 1024), size_t{8} << 20) << ir::op_name(op);
    EXPECT_EQ(workspace(op, 1024), workspace(op, 64)) << ir::op_name(op);
  }
}

// scatter and index_add may write their result over operand 0; when the source is that same
// value, it must still be read as it was.
TEST(NnKernels, ScatterAndIndexAddOfATensorIntoItself) {
  // x and the op's result are values inside the graph (not its inputs or outputs), so the
  // memory planner may put them in one buffer.
  Tensor a = tensor(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor x = a * 2.0f;
  Tensor s = scatter(x, 0, tensor(std::vector<int64_t>{1, 0, 1, 0, 1, 0}, {2, 3}), x) - 1.0f;
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{5, 1, 9, -1, 7, 3}));
  Tensor y = a * 2.0f;
  Tensor t = index_add(y, 0, tensor(std::vector<int64_t>{1, 0}, {2}), y) - 1.0f;
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{5, 9, 13, 5, 9, 13}));
}

// Every new hand-written kernel in one graph (the reference backend's; the cpu backend's oneDNN
// convolutions allocate oneDNN's per-call argument map): after the first run (BLAS may set
// itself up), running it allocates nothing.
TEST(NnKernels, RunWithoutHeapAllocations) {
  ir::Graph g;
  auto f32 = [](Shape s) { return ir::TensorType{DType::f32, std::move(s)}; };
  const std::vector<int64_t> one{1, 1}, two{2, 2}, zero{0, 0};
  ir::ValueRef x = g.add_parameter(f32({2, 4, 6, 6}));
  ir::ValueRef w = g.add_parameter(f32({4, 2, 3, 3}));
  ir::ValueRef rows = g.add_parameter({DType::i64, {3}});
  ir::ValueRef idx = g.add_parameter({DType::i64, {2, 4, 6, 6}});
  ir::ValueRef y = g.add(OpKind::Conv2d, {x, w}, {one, one, one, int64_t{2}});
  ir::ValueRef dx = g.add(OpKind::Conv2dBackwardInput, {y, w}, {Shape{2, 4, 6, 6}, one, one, one, int64_t{2}});
  ir::ValueRef dw = g.add(OpKind::Conv2dBackwardWeight, {y, x}, {Shape{4, 2, 3, 3}, one, one, one, int64_t{2}});
  ir::ValueRef mp = g.add(OpKind::MaxPool2d, {dx}, {two, two, zero, one, false});
  ir::ValueRef mpb = g.add(OpKind::MaxPool2dBackward, {mp, dx}, {two, two, zero, one, false});
  ir::ValueRef ap = g.add(OpKind::AvgPool2d, {mpb}, {two, one, one, true, false, int64_t{0}});
  ir::ValueRef apb = g.add(OpKind::AvgPool2dBackward, {ap}, {Shape{2, 4, 6, 6}, two, one, one, true, false, int64_t{0}});
  ir::ValueRef sl = g.add(OpKind::Slice, {apb}, {std::vector<int64_t>{0, 1, 0, 0}, Shape{2, 4, 6, 6},
                                                  std::vector<int64_t>{1, 2, 1, 3}});
  ir::ValueRef pd = g.add(OpKind::Pad, {sl}, {std::vector<int64_t>{0, 1, -1, 0}, std::vector<int64_t>{0, 1, 0, 2},
                                              std::vector<int64_t>{0, 0, 1, 0}, 0.5});
  ir::ValueRef fl = g.add(OpKind::Flip, {pd}, {std::vector<int64_t>{1, 3}});
  ir::ValueRef cc = g.add(OpKind::Concat, {fl, fl}, {int64_t{0}});
  ir::ValueRef is = g.add(OpKind::IndexSelect, {x, rows}, {int64_t{1}});
  ir::ValueRef ia = g.add(OpKind::IndexAdd, {x, rows, is}, {int64_t{1}});
  ir::ValueRef ga = g.add(OpKind::Gather, {ia, idx}, {int64_t{3}});
  ir::ValueRef sc = g.add(OpKind::Scatter, {ga, idx, x}, {int64_t{2}});
  ir::ValueRef sa = g.add(OpKind::ScatterAdd, {sc, idx, dx}, {int64_t{0}});
  g.outputs = {dw, cc, sa};
  auto exe = compile::compile(g, {}, backend::get("reference"));

  std::mt19937 rng(3);
  std::vector<std::shared_ptr<runtime::Buffer>> params;
  auto floats = [&](int64_t n) {
    auto b = runtime::allocate(static_cast<size_t>(n) * 4);
    auto v = draw(static_cast<size_t>(n), rng);
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(b->data())[i] = static_cast<float>(v[i]);
    return b;
  };
  params.push_back(floats(2 * 4 * 6 * 6));
  params.push_back(floats(4 * 2 * 3 * 3));
  params.push_back(runtime::allocate(3 * 8));
  params.push_back(runtime::allocate(2 * 4 * 6 * 6 * 8));
  const int64_t picks[] = {3, 0, 3};
  std::memcpy(params[2]->data(), picks, sizeof(picks));
  for (int64_t i = 0; i < 2 * 4 * 6 * 6; ++i) static_cast<int64_t*>(params[3]->data())[i] = i % 2;
  std::vector<std::shared_ptr<runtime::Buffer>> outs;
  for (const auto& t : exe->output_types()) outs.push_back(runtime::allocate(t.bytes()));
  std::vector<const void*> in_ptrs;
  for (auto& p : params) in_ptrs.push_back(p->data());
  std::vector<void*> out_ptrs;
  for (auto& o : outs) out_ptrs.push_back(o->data());
  exe->run(in_ptrs.data(), out_ptrs.data());
  lazyrt::testing::CountAllocations count;
  for (int i = 0; i < 10; ++i) exe->run(in_ptrs.data(), out_ptrs.data());
  EXPECT_EQ(count.count(), 0);
}

}  // namespace
}  // namespace lazyrt
