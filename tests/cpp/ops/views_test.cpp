// Views in the C++ API: writes through views reach the base and its other views, writes to the
// base reach its views, PyTorch's layout decides where reshape aliases, and compiled steps write
// bases and views back. Values are worked out from PyTorch's rules (the Python suite,
// tests/python/test_views.py, compares against PyTorch itself).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include <lazyrt/lazyrt.h>

#include "support/error_of.h"

namespace lazyrt {
namespace {

using indexing::None;
using indexing::Slice;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_support::error_of;

// [[0, 1, 2], [3, 4, 5]] as f32
Tensor t2x3() { return tensor({0, 1, 2, 3, 4, 5}, {2, 3}); }

TEST(Views, WritesThroughAViewReachTheBaseAndItsOtherViews) {
  Tensor base = t2x3();
  Tensor column = base.index({Slice(), 1});  // [1, 4]
  Tensor flat = reshape(base, {6});
  Tensor tr = transpose(base, 0, 1);  // [[0, 3], [1, 4], [2, 5]]
  tr.index({2}).add_(full({2}, 10));  // base[:, 2] += 10
  EXPECT_THAT(base.to_vector<float>(), ElementsAre(0, 1, 12, 3, 4, 15));
  EXPECT_THAT(flat.to_vector<float>(), ElementsAre(0, 1, 12, 3, 4, 15));
  column.mul_(full({}, -1));
  EXPECT_THAT(base.to_vector<float>(), ElementsAre(0, -1, 12, 3, -4, 15));
  EXPECT_THAT(tr.to_vector<float>(), ElementsAre(0, 3, -1, -4, 12, 15));
  EXPECT_TRUE(column.is_view() && flat.is_view() && tr.is_view());
}

TEST(Views, WritesToTheBaseReachItsViews) {
  Tensor base = t2x3();
  Tensor row = base.index({1});
  Tensor every_other = narrow(reshape(base, {6}), 0, 1, 4).index({Slice(None, None, 2)});  // [1, 3]
  base.add_(full({}, 1));
  EXPECT_THAT(row.to_vector<float>(), ElementsAre(4, 5, 6));
  EXPECT_THAT(every_other.to_vector<float>(), ElementsAre(2, 4));
  base.index_put_({0}, 7.0);
  mark_step();
  EXPECT_THAT(every_other.to_vector<float>(), ElementsAre(7, 4));
}

TEST(Views, SelectAtATensorPositionIsAView) {
  Tensor base = t2x3();
  Tensor row = select(base, 0, tensor(std::vector<int64_t>{-1}, {}));  // base[1]: the position read when it runs
  EXPECT_TRUE(row.is_view());
  EXPECT_THAT(row.to_vector<float>(), ElementsAre(3, 4, 5));
  row.add_(full({}, 10));  // through the view
  EXPECT_THAT(base.to_vector<float>(), ElementsAre(0, 1, 2, 13, 14, 15));
  base.mul_(full({}, 2));  // to the base
  EXPECT_THAT(row.to_vector<float>(), ElementsAre(26, 28, 30));
  EXPECT_THAT(error_of([&] { select(base, 0, tensor(std::vector<int64_t>{0, 1}, {2})); }),
              HasSubstr("select: a tensor position must be one integer"));
  Tensor window = narrow(base, 1, tensor(std::vector<int64_t>{1}, {}), 2);  // base[:, 1:3]
  window.zero_();
  EXPECT_THAT(base.to_vector<float>(), ElementsAre(0, 0, 0, 26, 0, 0));
  EXPECT_THAT(error_of([&] { select(base, 1, tensor(std::vector<int64_t>{3}, {})).to_vector<float>(); }),
              HasSubstr("index_select"));
}

TEST(Views, ALoopWritesTheRowItsCounterSelects) {
  // fori_loop's body writes row i of its carried buffer, selected by the counter itself.
  Carry out = fori_loop(0, 3, [](const Tensor& i, const Carry& c) {
    Tensor buf = c[0];
    select(buf, 0, i).copy_(add(select(buf, 0, i), cast(i, DType::f32)));
    return Carry{buf};
  }, {tensor({0, 1, 2, 3, 4, 5}, {3, 2})});
  EXPECT_THAT(out[0].to_vector<float>(), ElementsAre(0, 1, 3, 4, 6, 7));
}

TEST(Views, LayoutIsPyTorchs) {
  Tensor base = t2x3();
  Tensor tr = transpose(base, 0, 1);
  EXPECT_THAT(tr.strides(), ElementsAre(1, 3));
  EXPECT_FALSE(tr.is_contiguous());
  Tensor s = base.index({Slice(), Slice(1, None)});
  EXPECT_THAT(s.strides(), ElementsAre(3, 1));
  EXPECT_EQ(s.storage_offset(), 1);
  EXPECT_THAT(expand(base.index({Slice(0, 1)}), {4, 3}).strides(), ElementsAre(0, 1));
  EXPECT_THAT(unsqueeze(base, 1).strides(), ElementsAre(3, 3, 1));
  // A transpose cannot be flattened in place: reshape copies, view refuses.
  Tensor copy = reshape(tr, {6});
  EXPECT_FALSE(copy.is_view());
  copy.zero_();
  EXPECT_THAT(base.to_vector<float>(), ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(error_of([&] { view(tr, {6}); }), HasSubstr("not compatible"));
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous() && !c.is_view());
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(0, 3, 1, 4, 2, 5));
}

TEST(Views, RefusedWritesChangeNothing) {
  Tensor base = t2x3();
  Tensor e = expand(base.index({Slice(0, 1)}), {4, 3});
  EXPECT_THAT(error_of([&] { e.add_(full({}, 1)); }), HasSubstr("more than one element"));
  EXPECT_THAT(base.to_vector<float>(), ElementsAre(0, 1, 2, 3, 4, 5));
  Tensor p = t2x3().requires_grad_();
  Tensor row = p.index({0});
  EXPECT_THAT(error_of([&] { row.zero_(); }), HasSubstr("view of a leaf"));
  EXPECT_THAT(p.to_vector<float>(), ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(row.to_vector<float>(), ElementsAre(0, 1, 2));
}

TEST(Views, DetachIsAViewThatKeepsTheHistory) {
  Tensor p = tensor({1, 2, 3}, {3}).requires_grad_();
  p.detach().index({Slice(0, 2)}).mul_(full({}, 2));
  EXPECT_TRUE(p.is_leaf() && p.requires_grad());
  EXPECT_THAT(p.to_vector<float>(), ElementsAre(2, 4, 3));
  (p * p).sum().backward();
  EXPECT_THAT(p.grad().to_vector<float>(), ElementsAre(4, 8, 6));
  p.set_data(tensor({5, 5, 5}, {3}));
  EXPECT_THAT(p.to_vector<float>(), ElementsAre(5, 5, 5));
  EXPECT_TRUE(p.is_leaf() && p.requires_grad());
  EXPECT_THAT(error_of([&] { p.set_data(tensor({1, 2}, {2})); }), HasSubstr("set_data"));
}

TEST(Views, GradientsFlowThroughAWriteToAView) {
  // y = 2x; y[1] *= 3; loss = sum(y * [1, 2, 3]): dloss/dx = [2, 12, 6].
  Tensor x = tensor({1, 1, 1}, {3}).requires_grad_();
  Tensor y = x * 2.0;
  y.index({Slice(1, 2)}).mul_(full({}, 3));
  (y * tensor({1, 2, 3}, {3})).sum().backward();
  EXPECT_THAT(x.grad().to_vector<float>(), ElementsAre(2, 12, 6));
  EXPECT_THAT(y.to_vector<float>(), ElementsAre(2, 6, 2));
}

TEST(Views, CompiledStepsWriteBasesAndHeldViewsBack) {
  Tensor w = zeros({2, 3});
  mark_step();
  Tensor row = w.index({1});  // held across every call
  CompiledStep step = compile_step(
      [&](const std::vector<Tensor>& args) {
        w.index({0}).add_(args[0]);   // through a view
        transpose(w, 0, 1).index({Slice(), 1}).add_(args[0] * 2.0);  // w[1] += 2x, through a chain
        return std::vector<Tensor>{w.sum()};
      },
      {tensor({1, 2, 3}, {3})});
  for (int i = 1; i <= 3; ++i) {
    const float k = static_cast<float>(i);
    std::vector<Tensor> out = step({tensor({k, 0, -k}, {3})});
    mark_step();
    EXPECT_FLOAT_EQ(out[0].item(), 0.0f);
  }
  // Sum of x over the calls: [6, 0, -6]; row 0 gets it once, row 1 twice.
  EXPECT_THAT(w.to_vector<float>(), ElementsAre(6, 0, -6, 12, 0, -12));
  EXPECT_THAT(row.to_vector<float>(), ElementsAre(12, 0, -12));
  EXPECT_EQ(step.traces(), 1);
}

}  // namespace
}  // namespace lazyrt
