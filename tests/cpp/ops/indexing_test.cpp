// The C++ indexing API (Tensor::index, Tensor::index_put_, index_put, index_copy, index_fill)
// on small hand-computed cases; the Python suite (tests/python/test_indexing.py) compares a
// large table of keys against PyTorch. Values here are worked out from PyTorch's rules.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <lazyrt/lazyrt.h>

#include "trace/lazy_tensor.h"

#include "support/error_of.h"

namespace lazyrt {
namespace {

using indexing::Ellipsis;
using indexing::None;
using indexing::Slice;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing_support::error_of;

// [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] as f32
Tensor t3x4() {
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = static_cast<float>(i);
  return tensor(v, {3, 4});
}

TEST(Indexing, IntsSlicesNoneAndEllipsis) {
  Tensor t = t3x4();
  EXPECT_THAT(t.index({1}).to_vector<float>(), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(t.index({-1, -2}).to_vector<float>(), ElementsAre(10));
  EXPECT_EQ(t.index({-1, -2}).shape(), Shape{});
  Tensor s = t.index({Slice(), Slice(1, None, 2)});
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_THAT(s.to_vector<float>(), ElementsAre(1, 3, 5, 7, 9, 11));
  EXPECT_EQ(t.index({None, Ellipsis, None}).shape(), (Shape{1, 3, 4, 1}));
  EXPECT_THAT(t.index({"...", 0}).to_vector<float>(), ElementsAre(0, 4, 8));
  EXPECT_EQ(t.index({Slice(-100, 100), Slice(3, 1)}).shape(), (Shape{3, 0}));  // clamped, empty
  EXPECT_EQ(t.index({true}).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(t.index({false}).shape(), (Shape{0, 3, 4}));
}

TEST(Indexing, AdvancedIndicesBroadcastAndMove) {
  Tensor t = t3x4();
  // adjacent: t[[2, 0], [-1, 1]] = [t[2, 3], t[0, 1]]
  EXPECT_THAT(t.index({tensor({2, 0}, {2}, DType::i64), tensor({-1, 1}, {2}, DType::i64)}).to_vector<float>(),
              ElementsAre(11, 1));
  // broadcast [2, 1] with [2]: [[t[0,0], t[0,3]], [t[2,0], t[2,3]]]
  Tensor rc = t.index({tensor({0, 2}, {2, 1}, DType::i64), tensor({0, 3}, {2}, DType::i64)});
  EXPECT_EQ(rc.shape(), (Shape{2, 2}));
  EXPECT_THAT(rc.to_vector<float>(), ElementsAre(0, 3, 8, 11));
  // a slice between: the indexed dims go first, [2] + [4] ... of a [3, 4, 2] tensor
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<float>(i);
  Tensor u = tensor(v, {3, 4, 2});
  Tensor sep = u.index({tensor({0, 2}, {2}, DType::i64), Slice(), tensor({1, 0}, {2}, DType::i64)});
  EXPECT_EQ(sep.shape(), (Shape{2, 4}));
  EXPECT_THAT(sep.to_vector<float>(), ElementsAre(1, 3, 5, 7, 16, 18, 20, 22));
  // a 0-dim integer tensor acts as an int
  EXPECT_THAT(t.index({Slice(), scalar_tensor(-1, DType::i64)}).to_vector<float>(), ElementsAre(3, 7, 11));
}

TEST(Indexing, MasksAreReadAndCounted) {
  Tensor t = t3x4();
  const int64_t before = metrics::counter("DynamicShapeSync");
  Tensor picked = t.index({t > 8.0});  // pending: the mask is computed and read
  EXPECT_EQ(metrics::counter("DynamicShapeSync"), before + 1);
  EXPECT_THAT(picked.to_vector<float>(), ElementsAre(9, 10, 11));
  Tensor rows = t.index({tensor(std::vector<bool>{true, false, true}, {3})});  // device data: no sync
  EXPECT_EQ(metrics::counter("DynamicShapeSync"), before + 1);
  EXPECT_THAT(rows.to_vector<float>(), ElementsAre(0, 1, 2, 3, 8, 9, 10, 11));
}

TEST(Indexing, PutIsFunctionalAndCasts) {
  Tensor t = t3x4();
  Tensor alias = t;
  t.index_put_({Slice(), 1}, 2.7);
  t.index_put_({0}, tensor({-1, -2, -3, -4}, {4}, DType::f64));  // basic index: cast
  t.index_put_({t > 9.5}, 0);                                     // lone mask, one value: a where
  EXPECT_TRUE(alias.is_pending());  // the handle was rebound, graphs stay pure
  EXPECT_THAT(alias.to_vector<float>(), ElementsAre(-1, -2, -3, -4, 4, 2.7f, 6, 7, 8, 2.7f, 0, 0));
  Tensor i = tensor(std::vector<int64_t>{0, 1, 2, 3}, {2, 2});
  i.index_put_({tensor({1, 1}, {2}, DType::i64), tensor({0, 0}, {2}, DType::i64)},
               tensor({7, 9}, {2}, DType::i64));  // repeated: the last write wins
  EXPECT_THAT(i.to_vector<int64_t>(), ElementsAre(0, 1, 9, 3));
}

TEST(Indexing, PutGradient) {
  Tensor x = tensor({1, 2, 3, 4}, {4}, DType::f64);
  x.requires_grad_();
  Tensor v = tensor({10, 20}, {2}, DType::f64);
  v.requires_grad_();
  Tensor b = x * 1.0;
  b.index_put_({tensor({3, 0}, {2}, DType::i64)}, v);
  (b * tensor({1, 2, 3, 4}, {4}, DType::f64)).sum().backward();
  EXPECT_THAT(x.grad().to_vector<double>(), ElementsAre(0, 2, 3, 0));
  EXPECT_THAT(v.grad().to_vector<double>(), ElementsAre(4, 1));
  // getitem with a repeated index accumulates
  Tensor y = tensor({1, 2, 3}, {3}, DType::f64);
  y.requires_grad_();
  y.index({tensor({2, 2, 0}, {3}, DType::i64)}).sum().backward();
  EXPECT_THAT(y.grad().to_vector<double>(), ElementsAre(1, 0, 2));
}

TEST(Indexing, IndexPutCopyFill) {
  Tensor z = zeros({2, 3});
  EXPECT_THAT(index_put(z, {tensor({1, 1}, {2}, DType::i64), tensor({2, 2}, {2}, DType::i64)},
                        tensor({1, 2}, {2}), true)
                  .to_vector<float>(),
              ElementsAre(0, 0, 0, 0, 0, 3));
  EXPECT_THAT(index_put(z, {Tensor(), tensor({0}, {1}, DType::i64)}, tensor({5, 6}, {2, 1})).to_vector<float>(),
              ElementsAre(5, 0, 0, 6, 0, 0));
  EXPECT_THAT(index_copy(z, 1, tensor({2, 0}, {2}, DType::i64), tensor({1, 2, 3, 4}, {2, 2})).to_vector<float>(),
              ElementsAre(2, 0, 1, 4, 0, 3));
  EXPECT_THAT(index_fill(z, 1, tensor({-1}, {1}, DType::i64), 7).to_vector<float>(), ElementsAre(0, 0, 7, 0, 0, 7));
}

TEST(Indexing, Int32IndicesIndexAsInt64Ones) {
  // As torch 2.x: i32 index tensors in t[i], index_put_, gather and scatter (not index_fill).
  Tensor t = t3x4();
  Tensor i32 = tensor(std::vector<int32_t>{2, 0}, {2});
  Tensor i64 = tensor(std::vector<int64_t>{2, 0}, {2});
  EXPECT_EQ(t.index({i32}).to_vector<float>(), t.index({i64}).to_vector<float>());
  EXPECT_EQ(t.index({Slice(), i32}).to_vector<float>(), t.index({Slice(), i64}).to_vector<float>());
  Tensor p = t3x4();
  p.index_put_({i32}, 7);
  EXPECT_THAT(p.to_vector<float>(), ElementsAre(7, 7, 7, 7, 4, 5, 6, 7, 7, 7, 7, 7));
  Tensor g = tensor(std::vector<int32_t>{1, 0, 2, 2}, {1, 4});
  EXPECT_THAT(gather(t, 0, g).to_vector<float>(), ElementsAre(4, 1, 10, 11));
  EXPECT_THAT(scatter(t, 0, g, Scalar(-1)).to_vector<float>(), ElementsAre(0, -1, 2, 3, -1, 5, 6, 7, 8, 9, -1, -1));
  EXPECT_THAT(error_of([&] { gather(t, 0, tensor({0.5f}, {1, 1})); }),
              AllOf(HasSubstr("gather"), HasSubstr("i64 or i32"), HasSubstr("f32[1, 1]")));
}

TEST(Indexing, Errors) {
  Tensor t = t3x4();
  EXPECT_THAT(error_of([&] { t.index({3}); }), HasSubstr("index 3 is out of bounds for dimension 0 with size 3"));
  EXPECT_THAT(error_of([&] { t.index({0, -5}); }), HasSubstr("index -5 is out of bounds for dimension 0 with size 4"));
  EXPECT_THAT(error_of([&] { t.index({0, 0, 0}); }), HasSubstr("too many indices for tensor of dimension 2"));
  EXPECT_THAT(error_of([&] { t.index({Slice(None, None, -1)}); }), HasSubstr("step must be positive"));
  EXPECT_THAT(error_of([&] { t.index({Slice(None, None, 0)}); }), HasSubstr("step cannot be zero"));
  EXPECT_THAT(error_of([&] { t.index({Ellipsis, Ellipsis}); }), HasSubstr("single ellipsis"));
  EXPECT_THAT(error_of([&] { t.index({tensor({0.5}, {1})}); }), HasSubstr("i64 (long), i32 (int) or b8 (bool)"));
  EXPECT_THAT(error_of([&] { t.index({tensor({0, 1}, {2}, DType::i64), tensor({0, 1, 2}, {3}, DType::i64)}); }),
              HasSubstr("could not be broadcast together with shapes [2], [3]"));
  EXPECT_THAT(error_of([&] { t.index({tensor(std::vector<bool>{true, false}, {2})}); }),
              HasSubstr("shape of the mask [2] at index 0 does not match"));
  EXPECT_THAT(error_of([] { indexing::TensorIndex("x"); }), HasSubstr("\"...\""));
  EXPECT_THAT(error_of([&] { t.index_put_({0}, ones({2, 4})); }),
              HasSubstr("value tensor of shape [2, 4] cannot be broadcast to indexing result of shape [4]"));
  EXPECT_THAT(error_of([&] { t.index_put_({tensor({0}, {1}, DType::i64)}, ones({4}, DType::f64)); }),
              HasSubstr("dtypes to match"));
  // an index out of range at run time fails like index_select
  Tensor bad = t.index({tensor({5}, {1}, DType::i64)});
  EXPECT_THAT(error_of([&] { bad.to_vector<float>(); }), HasSubstr("out of bounds"));
  // a failed put leaves the tensor as it was
  Tensor before = t;
  EXPECT_THAT(error_of([&] { t.index_put_({5}, 1.0); }), HasSubstr("out of bounds"));
  EXPECT_EQ(trace::impl_of(t), trace::impl_of(before));
  EXPECT_FALSE(t.is_pending());
}

}  // namespace
}  // namespace lazyrt
