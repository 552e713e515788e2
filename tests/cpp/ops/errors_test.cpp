// Bad calls of the public tensor ops: each throws lazyrt::Error whose message names the op and
// the shapes or dtypes it was given (DESIGN.md: "Ops check shapes eagerly and throw
// lazyrt::Error naming the op and the shapes; nothing is left half-built"), and a call that
// throws leaves every tensor as it was, with nothing new pending.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <lazyrt/lazyrt.h>

#include "support/error_of.h"

namespace lazyrt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using testing_support::error_of;

Tensor f32_2x3() { return tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}); }

// ---- messages -----------------------------------------------------------------------------------

TEST(OpErrors, IntegerConstantsOutOfRangeAreRefusedNotWrapped) {
  EXPECT_THAT(error_of([] { full({2}, 1e30, DType::i64); }), HasSubstr("does not fit i64"));
  Tensor small = tensor(std::vector<int32_t>{1, 2}, {2});
  EXPECT_THAT(error_of([&] { small + int64_t{3000000000}; }), HasSubstr("does not fit i32"));
  EXPECT_FALSE(small.is_pending());
}

TEST(OpErrors, ShapeRulesRefuseSizesThatOverflow) {
  // Each of these wrapped int64 arithmetic in its shape rule (padding, dilation, kernel).
  Tensor x = zeros({1, 1, 4, 4}), w = zeros({1, 1, 3, 3});
  const int64_t huge = int64_t{1} << 62;
  EXPECT_THAT(error_of([&] { conv2d(x, w, Tensor(), {1}, {huge}); }), HasSubstr("conv2d: size arithmetic overflows"));
  EXPECT_THAT(error_of([&] { conv2d(x, w, Tensor(), {1}, {0}, {huge}); }), HasSubstr("conv2d: size arithmetic overflows"));
  EXPECT_THAT(error_of([&] { pad(x, {huge, huge}); }), HasSubstr("size arithmetic overflows"));
  EXPECT_THAT(error_of([&] { max_pool2d(x, {3}, {1}, {0}, {huge}); }), HasSubstr("max_pool2d: size arithmetic overflows"));
  EXPECT_THAT(error_of([&] { conv2d(x, w, Tensor(), {1}, {0}, {2}); }),
              HasSubstr("the padded input size (4 along dim 2) is smaller than the dilated kernel (5)"));
}

TEST(OpErrors, TensorsTooLargeToAddressAreRefusedWhenRecorded) {
  // Each of these wrapped the byte count (numel * element size) and wrote out of bounds.
  const int64_t big = int64_t{1} << 62, half = int64_t{1} << 31;
  EXPECT_THAT(error_of([&] { zeros({big}); }), AllOf(HasSubstr("full"), HasSubstr("2^62 bytes")));
  EXPECT_THAT(error_of([&] { zeros({half, half}); }), HasSubstr("f32[2147483648, 2147483648]"));
  EXPECT_THAT(error_of([&] { randn({half, half}); }), HasSubstr("random"));
  EXPECT_THAT(error_of([&] { expand(ones({1}), {big}); }), AllOf(HasSubstr("expand"), HasSubstr("2^62 bytes")));
  EXPECT_THAT(error_of([&] { arange(big); }), HasSubstr("2^62 bytes"));
  // A repeated dim beyond 64 bits (the product wrapped: undefined behaviour; found by fuzzing).
  EXPECT_THAT(error_of([&] { repeat(ones({5}), {INT64_MAX - 1}); }), HasSubstr("repeat: [5] repeated"));
  EXPECT_THAT(error_of([&] { zeros({INT64_MAX, 2}); }), HasSubstr("more elements than a 64-bit count can hold"));
  // Addressable but not there: an allocation that fails is an Error too, not std::bad_alloc.
  EXPECT_THAT(error_of([&] { sync({zeros({int64_t{1} << 50}, DType::f64)}); }), HasSubstr("out of memory"));
}

TEST(OpErrors, SizeArithmeticFoundByFuzzingIsCheckedOrLazy) {
  // Each was undefined behaviour (a wrapped product or difference), found by graph_fuzz.
  EXPECT_THAT(error_of([&] { reshape(ones({2}), {int64_t{1} << 62, 8}); }),
              HasSubstr("more elements than a 64-bit count can hold"));
  EXPECT_EQ(reshape(ones({0}), {int64_t{1} << 62, 8, 0}).shape(), (Shape{int64_t{1} << 62, 8, 0}));
  EXPECT_THAT(error_of([&] { nn::adaptive_avg_pool2d(ones({1, 1, 4, 4}), {int64_t{1} << 62, 1}); }),
              HasSubstr("adaptive_avg_pool2d: 4611686018427387904 outputs from 4 inputs"));
  EXPECT_THAT(error_of([&] { randint(INT64_MIN, int64_t{1} << 62, {2}); }), HasSubstr("randint: the range"));
  // The top of the i64 range: values stay in [high - 3, high).
  for (int64_t v : randint(INT64_MAX - 3, INT64_MAX, {64}).to_vector<int64_t>()) {
    EXPECT_GE(v, INT64_MAX - 3);
    EXPECT_LT(v, INT64_MAX);
  }
  // A slice's offset (3 * 2^62 elements in) of an empty tensor.
  EXPECT_EQ(slice(zeros({4, 0, int64_t{1} << 62}, DType::f16), 0, 3, 4).shape(), (Shape{1, 0, int64_t{1} << 62}));
  // The slice node's length rule formed end - start + step - 1: a step of 2^63 - 1 overflowed.
  EXPECT_EQ(slice(ones({4}), 0, 1, 4, INT64_MAX).to_vector<float>(), std::vector<float>{1});
  // ... and its kernel's source stride (2 * (2^63 - 1)), and the gradient's interior padding,
  // passed 64 bits: a dim of one element, whose stride is never applied.
  for (const char* backend : {"cpu", "reference"}) {
    set_backend(backend);
    Tensor x = tensor({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}).requires_grad_();
    Tensor row = slice(x, 0, 1, 4, INT64_MAX);
    EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{3, 4})) << backend;
    row.sum().backward();
    EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 0, 0, 0, 0})) << backend;
  }
  set_backend("cpu");
  // unsqueeze's new stride (the next dim's size times its stride) of an empty tensor.
  EXPECT_EQ(unsqueeze(zeros({int64_t{1} << 62, 8, 0}), 1).shape(), (Shape{int64_t{1} << 62, 1, 8, 0}));
  // index_select's [outer, size, inner] split of an empty input whose other dims multiply past
  // 64 bits; an index out of range is still refused when the graph runs.
  for (const char* backend : {"cpu", "reference"}) {
    set_backend(backend);
    Tensor picked = index_select(zeros({int64_t{1} << 62, 8, 0}), 1, tensor(std::vector<int64_t>{7, 0}, {2}));
    sync({picked});
    EXPECT_EQ(picked.shape(), (Shape{int64_t{1} << 62, 2, 0})) << backend;
    EXPECT_THAT(error_of([] { sync({index_select(zeros({int64_t{1} << 62, 8, 0}), 1,
                                                 tensor(std::vector<int64_t>{8}, {1}))}); }),
                HasSubstr("out of bounds")) << backend;
  }
  set_backend("cpu");
  // one_hot inferred its class count through a double: 2^63 - 1 converted out of range.
  EXPECT_THAT(error_of([] { one_hot(tensor(std::vector<int64_t>{INT64_MAX}, {1})); }),
              HasSubstr("one_hot: class value 9223372036854775807 leaves no room"));
  // split_with_sizes summed sizes past 64 bits before comparing with the dim.
  EXPECT_THAT(error_of([] { split_with_sizes(ones({5}), {5, INT64_MAX - 1}); }),
              HasSubstr("split_with_sizes: expects split_sizes to sum exactly to 5"));
  // chunk's ceil(size / chunks) overflowed for a huge chunk count.
  EXPECT_EQ(chunk(ones({7}), INT64_MAX - 1).size(), 7u);  // pieces of 1, as torch
  EXPECT_THAT(error_of([&] { chunk(ones({0}), INT64_MAX); }), HasSubstr("chunk: "));
  // split into 2^31 pieces (2^31 tensors on the host) is refused, not attempted.
  EXPECT_THAT(error_of([&] { split(zeros({int64_t{1} << 31, 0}), 1, 0); }), HasSubstr("split: 2147483648 pieces"));
  // Indexing an empty tensor whose other dims multiply past 64 bits (its contiguous strides
  // wrapped: undefined behaviour under UBSan).
  Tensor empty = zeros({0, 8, INT64_MAX - 1, 5}, DType::f16);
  EXPECT_EQ(empty.index({indexing::Slice(), indexing::Slice(std::nullopt, std::nullopt, 2)}).shape(),
            (Shape{0, 4, INT64_MAX - 1, 5}));
  // The weights and indices of pooling and resizing are ops of the graph: an empty batch asks
  // for 2^40 bins at once, and nothing of that size is made while tracing.
  Tensor pooled = nn::adaptive_avg_pool2d(ones({0, 1, 4, 4}), {int64_t{1} << 40, 1});
  EXPECT_TRUE(pooled.is_pending());
  EXPECT_EQ(pooled.shape(), (Shape{0, 1, int64_t{1} << 40, 1}));
  Tensor resized = nn::interpolate(ones({0, 1, 4, 4}), {int64_t{1} << 40, 2});
  EXPECT_EQ(resized.shape(), (Shape{0, 1, int64_t{1} << 40, 2}));
  // Kernels over empty tensors whose dims multiply past 64 bits: the strided copy's dim
  // merging and batched matmul's batch strides wrapped. Run by the reference backend, which
  // keeps every op a kernel (no folding of empty results).
  for (const char* backend : {"cpu", "reference"}) {
    set_backend(backend);
    Tensor copied = permute(zeros({INT64_MAX - 1, INT64_MAX, 0, 0}, DType::i64), {1, 0, 2, 3}).contiguous();
    sync({copied});
    EXPECT_EQ(copied.shape(), (Shape{INT64_MAX, INT64_MAX - 1, 0, 0})) << backend;
    Tensor product = matmul(zeros({0, int64_t{1} << 40, int64_t{1} << 30}), zeros({int64_t{1} << 30, 2}));
    sync({product});
    EXPECT_EQ(product.shape(), (Shape{0, int64_t{1} << 40, 2})) << backend;
    // A product over an empty inner dim is zeros; its operands may be no buffer at all (the
    // small-product kernel offset a null pointer).
    for (DType dt : {DType::i64, DType::f32, DType::bf16}) {
      Tensor batched = matmul(ones({2, 3, 0}, dt), ones({2, 0, 4}, dt));
      EXPECT_EQ(batched.to(DType::f64).to_vector<double>(), std::vector<double>(24, 0.0)) << backend;
      Tensor plain = matmul(ones({5, 0}, dt), ones({0, 2}, dt));
      EXPECT_EQ(plain.to(DType::f64).to_vector<double>(), std::vector<double>(10, 0.0)) << backend;
    }
  }
  set_backend("cpu");
}

TEST(OpErrors, InterpolateScaleBeyondSixtyFourBitsIsRefused) {
  // floor(4 * 1e30) does not convert to int64 (it was undefined behaviour; found by fuzzing).
  EXPECT_THAT(error_of([&] { nn::interpolate(zeros({1, 1, 4, 4}), {}, {1e30}); }),
              HasSubstr("interpolate: scale_factor"));
}

TEST(OpErrors, ForeignExceptionsAndNullDataAreRefusedAsErrors) {
  EXPECT_THAT(error_of([&] { from_blob(static_cast<const void*>(nullptr), {3}, DType::f32); }), HasSubstr("from_blob: null data"));
  EXPECT_THAT(error_of([&] { from_blob(nullptr, {3}, DType::f32, [] {}); }), HasSubstr("from_blob: null data"));
  EXPECT_EQ(from_blob(static_cast<const void*>(nullptr), {0}, DType::f32).numel(), 0);
  EXPECT_THAT(error_of([&] { while_loop({}, [](const Carry& c) { return c; }, {zeros({1})}); }),
              HasSubstr("while_loop: cond_fn and body_fn must be callables"));
  EXPECT_THAT(error_of([&] { fori_loop(0, 2, {}, {zeros({1})}); }), HasSubstr("fori_loop: body_fn"));
  EXPECT_THAT(error_of([&] { scan({}, {zeros({1})}, {zeros({2, 1})}); }), HasSubstr("scan: fn"));
}

TEST(OpErrors, IntegerToANegativeIntegerPowerIsRefusedAsInTorch) {
  Tensor i = tensor(std::vector<int64_t>{2, 3}, {2});
  EXPECT_THAT(error_of([&] { pow(i, -1); }), HasSubstr("pow: integers to negative integer powers are not allowed"));
  EXPECT_EQ(pow(i, 2).to_vector<int64_t>(), (std::vector<int64_t>{4, 9}));
  EXPECT_EQ(pow(i, -1.0).to_vector<float>(), (std::vector<float>{0.5f, 1.0f / 3}));
}

TEST(OpErrors, BoolToABoolPowerIsTheBaseOrOnesAsInTorch) {
  // torch 2.x: a b8 tensor to the power True is itself, to False ones; any other power of a
  // b8 tensor is refused, as b8 ** b8 is.
  Tensor b = tensor(std::vector<bool>{true, false}, {2});
  EXPECT_EQ(pow(b, true).dtype(), DType::b8);
  EXPECT_EQ(pow(b, true).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_EQ(pow(b, false).to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_THAT(error_of([&] { pow(b, b); }), HasSubstr("b8"));
}

TEST(OpErrors, MatmulInnerDimensionMismatchNamesBothShapes) {
  Tensor a = f32_2x3();
  Tensor b = zeros({4, 5});
  EXPECT_THAT(error_of([&] { matmul(a, b); }),
              AllOf(HasSubstr("matmul"), HasSubstr("[2, 3]"), HasSubstr("[4, 5]")));
}

TEST(OpErrors, MatmulInnerDimensionMismatchOfVectorsNamesBothShapes) {
  Tensor a = zeros({3});
  Tensor b = zeros({4});
  EXPECT_THAT(error_of([&] { matmul(a, b); }),
              AllOf(HasSubstr("matmul"), HasSubstr("[3]"), HasSubstr("[4]")));
}

TEST(OpErrors, BatchedMatmulInnerDimensionMismatchNamesBothShapes) {
  Tensor a = zeros({2, 3, 4});
  Tensor b = zeros({2, 5, 6});
  EXPECT_THAT(error_of([&] { matmul(a, b); }),
              AllOf(HasSubstr("matmul"), HasSubstr("[2, 3, 4]"), HasSubstr("[2, 5, 6]")));
}

TEST(OpErrors, AddBroadcastFailureNamesBothShapes) {
  Tensor a = f32_2x3();
  Tensor b = zeros({4});
  EXPECT_THAT(error_of([&] { add(a, b); }),
              AllOf(HasSubstr("add"), HasSubstr("[2, 3]"), HasSubstr("[4]")));
  EXPECT_THAT(error_of([&] { a + b; }),
              AllOf(HasSubstr("add"), HasSubstr("[2, 3]"), HasSubstr("[4]")));
}

TEST(OpErrors, AddWithAlphaBroadcastFailureNamesBothShapes) {
  Tensor a = f32_2x3();
  Tensor b = zeros({2, 2});
  EXPECT_THAT(error_of([&] { add(a, b, 2.0); }),
              AllOf(HasSubstr("add"), HasSubstr("[2, 3]"), HasSubstr("[2, 2]")));
}

TEST(OpErrors, SumDimOutOfRangeNamesOpAndShape) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { sum(a, {2}); }), AllOf(HasSubstr("sum"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { sum(a, {-3}); }), AllOf(HasSubstr("sum"), HasSubstr("[2, 3]")));
}

TEST(OpErrors, TransposeDimOutOfRangeNamesOpAndShape) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { transpose(a, 0, 2); }),
              AllOf(HasSubstr("transpose"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { transpose(a, -3, 1); }),
              AllOf(HasSubstr("transpose"), HasSubstr("[2, 3]")));
}

TEST(OpErrors, OtherShapeOpDimOutOfRangeNamesOpAndShape) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { unsqueeze(a, 3); }), AllOf(HasSubstr("unsqueeze"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { squeeze(a, 2); }), AllOf(HasSubstr("squeeze"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { permute(a, {0, 2}); }), AllOf(HasSubstr("permute"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { amax(a, {-3}); }), AllOf(HasSubstr("amax"), HasSubstr("[2, 3]")));
}

TEST(OpErrors, NegOfBoolNamesDtype) {
  Tensor flags = tensor(std::vector<bool>{true, false}, {2});
  EXPECT_THAT(error_of([&] { neg(flags); }), AllOf(HasSubstr("neg"), HasSubstr("b8")));
  EXPECT_THAT(error_of([&] { -flags; }), AllOf(HasSubstr("neg"), HasSubstr("b8")));
}

TEST(OpErrors, MeanOfIntegerNamesDtype) {
  Tensor ints = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_THAT(error_of([&] { mean(ints); }), AllOf(HasSubstr("mean"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { mean(ints, {1}); }), AllOf(HasSubstr("mean"), HasSubstr("i64")));
}

TEST(OpErrors, MatmulOfBoolNamesDtype) {
  Tensor flags = tensor(std::vector<bool>{true, false, true, true}, {2, 2});
  EXPECT_THAT(error_of([&] { matmul(flags, flags); }), AllOf(HasSubstr("matmul"), HasSubstr("b8")));
}

TEST(OpErrors, ReshapeToWrongElementCountNamesBothShapes) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { reshape(a, {4, 2}); }),
              AllOf(HasSubstr("reshape"), HasSubstr("[2, 3]"), HasSubstr("[4, 2]")));
  EXPECT_THAT(error_of([&] { reshape(a, {4, -1}); }),
              AllOf(HasSubstr("reshape"), HasSubstr("[2, 3]"), HasSubstr("[4, -1]")));
}

// ---- shape, indexing and NN ops ---------------------------------------------------------------------

TEST(OpErrors, CatOfMismatchedShapesNamesBothShapes) {
  EXPECT_THAT(error_of([&] { cat({zeros({2, 3}), zeros({2, 4})}, 0); }),
              AllOf(HasSubstr("cat"), HasSubstr("[2, 3]"), HasSubstr("[2, 4]"), HasSubstr("dim 0")));
  EXPECT_THAT(error_of([&] { cat({zeros({2, 3}), zeros({2, 3, 1})}, 1); }),
              AllOf(HasSubstr("cat"), HasSubstr("[2, 3]"), HasSubstr("[2, 3, 1]")));
  EXPECT_THAT(error_of([&] { cat({zeros({2}), scalar_tensor(1)}); }),
              AllOf(HasSubstr("cat"), HasSubstr("0-dim")));
  EXPECT_THAT(error_of([&] { cat({}); }), HasSubstr("cat"));
  EXPECT_THAT(error_of([&] { stack({zeros({2}), zeros({3})}); }),
              AllOf(HasSubstr("stack"), HasSubstr("[2]"), HasSubstr("[3]")));
}

TEST(OpErrors, SliceNarrowSplitArgumentsNameOpAndShape) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { slice(a, 1, 0, 2, 0); }), AllOf(HasSubstr("slice"), HasSubstr("step")));
  EXPECT_THAT(error_of([&] { slice(a, 1, 0, 2, -1); }), AllOf(HasSubstr("slice"), HasSubstr("-1")));
  EXPECT_THAT(error_of([&] { slice(a, 2); }), AllOf(HasSubstr("slice"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { slice(scalar_tensor(1), 0); }), AllOf(HasSubstr("slice"), HasSubstr("0-dim")));
  EXPECT_THAT(error_of([&] { narrow(a, 1, 2, 2); }),
              AllOf(HasSubstr("narrow"), HasSubstr("[2, 3]"), HasSubstr("length (2)")));
  EXPECT_THAT(error_of([&] { split(a, std::vector<int64_t>{1, 1}, 1); }),
              AllOf(HasSubstr("split_with_sizes"), HasSubstr("[1, 1]"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { split(a, 0, 1); }), AllOf(HasSubstr("split"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { chunk(a, 0); }), HasSubstr("chunk"));
  EXPECT_THAT(error_of([&] { flatten(a, 1, 0); }), AllOf(HasSubstr("flatten"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { view(a, {4}); }), AllOf(HasSubstr("view"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { flip(a, {1, -1}); }), AllOf(HasSubstr("flip"), HasSubstr("more than once")));
  EXPECT_THAT(error_of([&] { repeat(a, {2}); }), AllOf(HasSubstr("repeat"), HasSubstr("[2, 3]")));
}

TEST(OpErrors, PadWithTooManyPairsOrANegativeSizeNamesShape) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { pad(a, {1, 1, 1, 1, 1, 1}); }),
              AllOf(HasSubstr("pad"), HasSubstr("too large"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { pad(a, {1}); }), AllOf(HasSubstr("pad"), HasSubstr("divisible by 2")));
  EXPECT_THAT(error_of([&] { pad(a, {-2, -2}); }),
              AllOf(HasSubstr("pad"), HasSubstr("f32[2, 3]"), HasSubstr("negative size")));
}

TEST(OpErrors, IndexingShapeAndDtypeMismatchesNameBoth) {
  Tensor a = f32_2x3();
  Tensor idx = tensor(std::vector<int64_t>{0, 1}, {2});
  EXPECT_THAT(error_of([&] { gather(a, 1, idx); }),
              AllOf(HasSubstr("gather"), HasSubstr("f32[2, 3]"), HasSubstr("i64[2]")));
  // i32 indices gather (torch 2.x); a floating index names its dtype and shape.
  EXPECT_NO_THROW(gather(a, 1, tensor(std::vector<int32_t>{0, 1}, {1, 2})));
  EXPECT_THAT(error_of([&] { gather(a, 1, tensor(std::vector<float>{0, 1}, {1, 2})); }),
              AllOf(HasSubstr("gather"), HasSubstr("f32[1, 2]")));
  EXPECT_THAT(error_of([&] { gather(a, 0, tensor(std::vector<int64_t>{0, 0, 0, 0}, {1, 4})); }),
              AllOf(HasSubstr("gather"), HasSubstr("[1, 4]"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { scatter(a, 0, reshape(idx, {1, 2}), zeros({2, 3}, DType::f64)); }),
              AllOf(HasSubstr("scatter"), HasSubstr("f32[2, 3]"), HasSubstr("f64[2, 3]")));
  EXPECT_THAT(error_of([&] { scatter_add(a, 0, reshape(idx, {1, 2}), zeros({1, 1})); }),
              AllOf(HasSubstr("scatter_add"), HasSubstr("[1, 2]"), HasSubstr("[1, 1]")));
  EXPECT_THAT(error_of([&] { index_select(a, 0, tensor(std::vector<float>{0}, {1})); }),
              AllOf(HasSubstr("index_select"), HasSubstr("f32[1]")));
  EXPECT_THAT(error_of([&] { index_add(a, 0, idx, zeros({3, 3})); }),
              AllOf(HasSubstr("index_add"), HasSubstr("[2, 3]"), HasSubstr("[3, 3]")));
  EXPECT_THAT(error_of([&] { masked_fill(a, zeros({3}), 1.0); }),
              AllOf(HasSubstr("masked_fill"), HasSubstr("b8"), HasSubstr("f32[3]")));
  EXPECT_THAT(error_of([&] { masked_fill(a, ones({3}, DType::b8), zeros({1})); }),
              AllOf(HasSubstr("masked_fill"), HasSubstr("0-dim")));
  EXPECT_THAT(error_of([&] { tril(zeros({3})); }), AllOf(HasSubstr("tril"), HasSubstr("f32[3]")));
  EXPECT_THAT(error_of([&] { embedding(zeros({3}), idx); }),
              AllOf(HasSubstr("embedding"), HasSubstr("f32[3]")));
  EXPECT_THAT(error_of([&] { embedding(zeros({3, 2}), idx, 3); }),
              AllOf(HasSubstr("embedding"), HasSubstr("padding_idx 3")));
  EXPECT_THAT(error_of([&] { one_hot(tensor(std::vector<int32_t>{0, 1}, {2}), 3); }),
              AllOf(HasSubstr("one_hot"), HasSubstr("i32[2]")));
}

// torch checks index values when it runs the op; lazyrt when the graph runs, at the sync.
TEST(OpErrors, IndexOutOfRangeIsReportedWhenTheGraphRuns) {
  Tensor a = f32_2x3();
  Tensor g = gather(a, 1, tensor(std::vector<int64_t>{0, 5}, {1, 2}));
  EXPECT_THAT(error_of([&] { g.to_vector<float>(); }),
              AllOf(HasSubstr("gather"), HasSubstr("index 5"), HasSubstr("size 3")));
  Tensor s = index_select(a, 0, tensor(std::vector<int64_t>{-1}, {1}));
  EXPECT_THAT(error_of([&] { s.to_vector<float>(); }),
              AllOf(HasSubstr("index_select"), HasSubstr("index -1"), HasSubstr("size 2")));
  Tensor e = embedding(a, tensor(std::vector<int64_t>{2}, {1}));
  EXPECT_THAT(error_of([&] { sync({e}); }), AllOf(HasSubstr("index_select"), HasSubstr("index 2")));
  EXPECT_THAT(error_of([&] { one_hot(tensor(std::vector<int64_t>{1, -2}, {2})); }),
              AllOf(HasSubstr("one_hot"), HasSubstr("non-negative")));
  // The operand itself is untouched.
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(OpErrors, Conv2dChannelAndGroupMismatchesNameShapes) {
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 2, 5, 5}), zeros({4, 3, 3, 3})); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("[1, 2, 5, 5]"), HasSubstr("[4, 3, 3, 3]"),
                    HasSubstr("3 channels")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 5, 5}), zeros({3, 2, 3, 3}), Tensor(), {1}, {0}, {1}, 2); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("groups=2"), HasSubstr("[3, 2, 3, 3]")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 5, 5}), zeros({4, 2, 3, 3}), Tensor(), {1}, {0}, {1}, 3); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("groups=3")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 2, 2}), zeros({4, 4, 3, 3})); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("[1, 4, 2, 2]"), HasSubstr("[4, 4, 3, 3]")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 2, 2}), zeros({4, 4, 1, 1}), zeros({3})); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("bias"), HasSubstr("f32[3]")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({4, 4}), zeros({4, 4, 1, 1})); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("f32[4, 4]")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 2, 2}), zeros({4, 4, 1, 1}, DType::f64)); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("f32[1, 4, 2, 2]"), HasSubstr("f64[4, 4, 1, 1]")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 2, 2}), zeros({4, 4, 1, 1}), Tensor(), {0}); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("stride")));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 2, 2}, DType::b8), zeros({4, 4, 1, 1}, DType::b8)); }),
              AllOf(HasSubstr("conv2d"), HasSubstr("b8")));
}

TEST(OpErrors, PoolingWindowErrorsNameShapes) {
  Tensor x = zeros({1, 1, 4, 4});
  EXPECT_THAT(error_of([&] { max_pool2d(x, {2}, {}, {2}); }),
              AllOf(HasSubstr("max_pool2d"), HasSubstr("half of the kernel size")));
  EXPECT_THAT(error_of([&] { max_pool2d(x, {5}); }),
              AllOf(HasSubstr("max_pool2d"), HasSubstr("[1, 1, 4, 4]"), HasSubstr("too small")));
  EXPECT_THAT(error_of([&] { avg_pool2d(zeros({4, 4}), {2}); }),
              AllOf(HasSubstr("avg_pool2d"), HasSubstr("f32[4, 4]")));
  // Integers max-pool, as in torch 2.x; bools do not.
  EXPECT_EQ(max_pool2d(reshape(arange(16, DType::i64), {1, 1, 4, 4}), {2}).to_vector<int64_t>(),
            (std::vector<int64_t>{5, 7, 13, 15}));
  EXPECT_EQ(max_pool2d(reshape(arange(16, DType::i32), {1, 1, 4, 4}) * Scalar(-1), {2}, {}, {1}).to_vector<int32_t>(),
            (std::vector<int32_t>{0, -1, -3, -4, -5, -7, -12, -13, -15}));
  EXPECT_THAT(error_of([&] { max_pool2d(zeros({1, 1, 4, 4}, DType::b8), {2}); }),
              AllOf(HasSubstr("max_pool2d"), HasSubstr("b8")));
  EXPECT_THAT(error_of([&] { avg_pool2d(x, {2}, {}, {0}, false, true, 0); }),
              AllOf(HasSubstr("avg_pool2d"), HasSubstr("divisor_override")));
}

TEST(OpErrors, BmmAndAddmmMismatchesNameShapesAndDtypes) {
  EXPECT_THAT(error_of([&] { bmm(zeros({2, 3, 4}), zeros({1, 4, 5})); }),
              AllOf(HasSubstr("bmm"), HasSubstr("[2, 3, 4]"), HasSubstr("[1, 4, 5]")));
  EXPECT_THAT(error_of([&] { bmm(zeros({3, 4}), zeros({4, 5})); }), AllOf(HasSubstr("bmm"), HasSubstr("3-D")));
  EXPECT_THAT(error_of([&] { addmm(zeros({3}, DType::f64), zeros({2, 3}), zeros({3, 3})); }),
              AllOf(HasSubstr("addmm"), HasSubstr("f64[3]"), HasSubstr("f32[2, 3]")));
  EXPECT_THAT(error_of([&] { addmm(zeros({3}), zeros({2, 3}), zeros({2, 3})); }),
              AllOf(HasSubstr("addmm"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { addmm(zeros({4}), zeros({2, 3}), zeros({3, 3})); }),
              AllOf(HasSubstr("addmm"), HasSubstr("f32[4]"), HasSubstr("[2, 3]")));
}

// As for the ops above: a failing shape, indexing or NN op records nothing.
TEST(OpErrors, FailedShapeIndexingAndNnOpsLeaveNothingPending) {
  Tensor a = f32_2x3();
  Tensor idx = tensor(std::vector<int64_t>{0, 1}, {2});
  mark_step();
  const int64_t compiles = metrics::counter("UncachedCompile");
  EXPECT_THROW(cat({a, zeros({2, 4})}), Error);
  EXPECT_THROW(cat({a, zeros({2, 4}, DType::f64)}), Error);  // the casts come after the checks
  EXPECT_THROW(stack({a, zeros({3, 2})}), Error);
  EXPECT_THROW(slice(a, 0, 0, 1, 0), Error);
  EXPECT_THROW(pad(a, {1, 1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(index_add(a, 0, idx, zeros({3, 3}), 2.0), Error);  // alpha is applied after the check
  EXPECT_THROW(conv2d(zeros({1, 2, 5, 5}), zeros({4, 3, 3, 3}), zeros({4})), Error);
  EXPECT_THROW(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), zeros({5})), Error);
  EXPECT_THROW(addmm(zeros({4}), a, zeros({3, 3}), 0.5, 2.0), Error);
  EXPECT_THROW(max_pool2d(zeros({1, 1, 4, 4}), {5}), Error);
  EXPECT_FALSE(a.is_pending());
  mark_step();
  EXPECT_EQ(metrics::counter("UncachedCompile"), compiles) << "a failed op left IR behind";
}

// ---- calls PyTorch refuses ------------------------------------------------------------------------
// The API follows PyTorch, so what torch refuses (checked with torch 1.13) lazyrt refuses too,
// instead of returning a value torch would not.

TEST(OpErrors, SubWithABoolOperandIsRefusedAsInTorch) {
  Tensor flags = tensor(std::vector<bool>{true, false}, {2});
  Tensor ints = tensor(std::vector<int64_t>{1, 2}, {2});
  EXPECT_THAT(error_of([&] { sub(flags, ints); }), AllOf(HasSubstr("sub"), HasSubstr("b8")));
  EXPECT_THAT(error_of([&] { sub(ints, flags); }), AllOf(HasSubstr("sub"), HasSubstr("b8")));
  EXPECT_THAT(error_of([&] { flags - 1; }), AllOf(HasSubstr("sub"), HasSubstr("b8")));
  EXPECT_THAT(error_of([&] { 1 - flags; }), AllOf(HasSubstr("sub"), HasSubstr("b8")));
  EXPECT_THAT(error_of([&] { ints - true; }), HasSubstr("sub"));
}

TEST(OpErrors, IntegerAddWithFloatAlphaIsRefusedAsInTorch) {
  Tensor ints = tensor(std::vector<int64_t>{1, 2}, {2});
  EXPECT_THAT(error_of([&] { add(ints, ints, 0.5); }), AllOf(HasSubstr("add"), HasSubstr("i64")));
}

TEST(OpErrors, WhereWithNonBoolConditionNamesDtype) {
  Tensor cond = tensor(std::vector<float>{1, 0}, {2});
  Tensor x = tensor(std::vector<float>{1, 2}, {2});
  EXPECT_THAT(error_of([&] { where(cond, x, x); }), AllOf(HasSubstr("where"), HasSubstr("f32")));
}

TEST(OpErrors, MatmulOfMixedDtypesNamesBothDtypes) {
  Tensor a = tensor(std::vector<float>{1, 2}, {1, 2});
  Tensor b = tensor(std::vector<int64_t>{1, 2}, {2, 1});
  EXPECT_THAT(error_of([&] { matmul(a, b); }),
              AllOf(HasSubstr("matmul"), HasSubstr("f32"), HasSubstr("i64")));
}

// ---- math ops ------------------------------------------------------------------------------------

TEST(OpErrors, SoftmaxDimOutOfRangeNamesOpAndShape) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { softmax(a, 2); }), AllOf(HasSubstr("softmax"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { log_softmax(a, -3); }),
              AllOf(HasSubstr("log_softmax"), HasSubstr("[2, 3]")));
}

TEST(OpErrors, SoftmaxOfIntegersWithoutDtypeIsRefusedAsInTorch) {
  Tensor ints = tensor(std::vector<int64_t>{1, 2, 3}, {3});
  EXPECT_THAT(error_of([&] { softmax(ints, 0); }),
              AllOf(HasSubstr("softmax"), HasSubstr("i64"), HasSubstr("dtype")));
}

TEST(OpErrors, LayerNormShapeMismatchNamesBothShapes) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { layer_norm(a, {4}); }),
              AllOf(HasSubstr("layer_norm"), HasSubstr("[4]"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { layer_norm(a, {2, 3, 1}); }),
              AllOf(HasSubstr("layer_norm"), HasSubstr("[2, 3, 1]"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { layer_norm(a, {3}, zeros({4})); }),
              AllOf(HasSubstr("layer_norm"), HasSubstr("weight"), HasSubstr("[4]"), HasSubstr("[3]")));
  EXPECT_THAT(error_of([&] { layer_norm(a, {3}, std::nullopt, zeros({3}, DType::f64)); }),
              AllOf(HasSubstr("layer_norm"), HasSubstr("bias"), HasSubstr("f64"), HasSubstr("f32")));
  EXPECT_THAT(error_of([&] { layer_norm(a, {}); }), HasSubstr("layer_norm"));
}

TEST(OpErrors, NormWithUnsupportedPNamesP) {
  Tensor a = f32_2x3();
  EXPECT_THAT(error_of([&] { norm(a, 3); }), AllOf(HasSubstr("norm"), HasSubstr("p"), HasSubstr("3")));
  EXPECT_THAT(error_of([&] { norm(a, 0); }), AllOf(HasSubstr("norm"), HasSubstr("0")));
  EXPECT_THAT(error_of([&] { norm(a, -INFINITY); }), AllOf(HasSubstr("norm"), HasSubstr("-inf")));
  // torch.linalg.vector_norm: the inf norm of an empty dim has no value (1- and 2-norms give 0).
  EXPECT_THAT(error_of([&] { norm(zeros({0, 3}), INFINITY, {0}); }),
              AllOf(HasSubstr("norm"), HasSubstr("inf"), HasSubstr("[0, 3]"), HasSubstr("empty")));
  EXPECT_THAT(error_of([&] { norm(zeros({0, 3}), INFINITY); }), HasSubstr("empty"));
  EXPECT_NO_THROW(norm(zeros({0, 3}), INFINITY, {1}));
  Tensor ints = tensor(std::vector<int64_t>{1, 2}, {2});
  EXPECT_THAT(error_of([&] { norm(ints); }), AllOf(HasSubstr("norm"), HasSubstr("i64")));
}

TEST(OpErrors, ArgmaxOfAnEmptyDimNamesDimAndShape) {
  Tensor empty = zeros({0, 3});
  EXPECT_THAT(error_of([&] { argmax(empty, 0); }),
              AllOf(HasSubstr("argmax"), HasSubstr("dim 0"), HasSubstr("[0, 3]")));
  EXPECT_THAT(error_of([&] { argmin(empty); }), AllOf(HasSubstr("argmin"), HasSubstr("[0, 3]")));
  EXPECT_THAT(error_of([&] { argmax(f32_2x3(), 2); }), AllOf(HasSubstr("argmax"), HasSubstr("[2, 3]")));
  Tensor flags = tensor(std::vector<bool>{true, false}, {2});
  EXPECT_THAT(error_of([&] { argmax(flags); }), AllOf(HasSubstr("argmax"), HasSubstr("b8")));
}

TEST(OpErrors, FloatOnlyMathOpsNameTheDtype) {
  Tensor ints = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_THAT(error_of([&] { var(ints); }), AllOf(HasSubstr("var"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { lazyrt::std(ints, {1}); }), AllOf(HasSubstr("std"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { gelu(ints); }), AllOf(HasSubstr("gelu"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { silu(ints); }), AllOf(HasSubstr("silu"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { softplus(ints); }), AllOf(HasSubstr("softplus"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { leaky_relu(ints); }), AllOf(HasSubstr("leaky_relu"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { layer_norm(ints, {3}); }), AllOf(HasSubstr("layer_norm"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { lerp(ints, ints, 0.5); }), AllOf(HasSubstr("lerp"), HasSubstr("i64")));
  Tensor flags = tensor(std::vector<bool>{true, false}, {2});
  EXPECT_THAT(error_of([&] { floor(flags); }), AllOf(HasSubstr("floor"), HasSubstr("b8")));
  EXPECT_THAT(error_of([&] { round(flags); }), AllOf(HasSubstr("round"), HasSubstr("b8")));
}

TEST(OpErrors, MathOpArgumentsCheckedAsInTorch) {
  Tensor a = f32_2x3();
  Tensor ints = tensor(std::vector<int64_t>{1, 2, 3}, {3});
  EXPECT_THAT(error_of([&] { gelu(a, "fast"); }), AllOf(HasSubstr("gelu"), HasSubstr("fast")));
  EXPECT_THAT(error_of([&] { clamp(a, std::optional<Scalar>(), std::optional<Scalar>()); }),
              HasSubstr("clamp"));
  EXPECT_THAT(error_of([&] { clamp(a, std::optional<Tensor>(zeros({4}))); }),
              AllOf(HasSubstr("clamp"), HasSubstr("[2, 3]"), HasSubstr("[4]")));
  EXPECT_THAT(error_of([&] { lerp(a, cast(a, DType::f64), 0.5); }),
              AllOf(HasSubstr("lerp"), HasSubstr("f32"), HasSubstr("f64")));
  EXPECT_THAT(error_of([&] { lerp(a, a, zeros({2, 3}, DType::f64)); }),
              AllOf(HasSubstr("lerp"), HasSubstr("weight"), HasSubstr("f64")));
  EXPECT_THAT(error_of([&] { addcdiv(ints, ints, ints); }), AllOf(HasSubstr("addcdiv"), HasSubstr("i64")));
  EXPECT_THAT(error_of([&] { addcmul(a, a, zeros({4})); }),
              AllOf(HasSubstr("addcmul"), HasSubstr("[2, 3]"), HasSubstr("[4]")));
  EXPECT_THAT(error_of([&] { prod(a, 2); }), AllOf(HasSubstr("prod"), HasSubstr("[2, 3]")));
  EXPECT_THAT(error_of([&] { logsumexp(a, {0, -2}); }), HasSubstr("logsumexp"));
  EXPECT_THAT(error_of([&] { all(a, {5}); }), AllOf(HasSubstr("all"), HasSubstr("[2, 3]")));
}

// Failing math ops leave nothing behind either.
TEST(OpErrors, FailedMathOpsLeaveNothingPending) {
  Tensor a = f32_2x3();
  Tensor ints = tensor(std::vector<int64_t>{1, 2, 3}, {3});
  mark_step();
  const int64_t runs = metrics::counter("ExecuteGraph");
  EXPECT_THROW(softmax(a, 2), Error);
  EXPECT_THROW(layer_norm(a, {4}), Error);
  EXPECT_THROW(layer_norm(a, {3}, zeros({4})), Error);
  EXPECT_THROW(norm(a, 3), Error);
  EXPECT_THROW(argmax(zeros({0, 3}), 0), Error);
  EXPECT_THROW(clamp(a, std::optional<Tensor>(zeros({4}))), Error);
  EXPECT_THROW(lerp(a, zeros({4}), 0.5), Error);
  EXPECT_THROW(addcdiv(ints, ints, ints), Error);
  EXPECT_THROW(var(ints), Error);
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), runs) << "a failed op left IR behind";
  EXPECT_FALSE(a.is_pending());
}

// ---- state after an error -------------------------------------------------------------------------

// Every failing call above, plus in-place ops whose result does not fit the tensor: after them
// the operands hold their values, nothing is pending, and a mark_step compiles and runs nothing.
TEST(OpErrors, FailedOpsLeaveTensorsUnchangedAndNothingPending) {
  const std::vector<float> a_values{1, 2, 3, 4, 5, 6};
  const std::vector<float> b_values{-1, -2, -3, -4};
  const std::vector<int64_t> i_values{7, 8, 9, 10, 11, 12};
  Tensor a = tensor(a_values, {2, 3});
  Tensor b = tensor(b_values, {4});
  Tensor ints = tensor(i_values, {2, 3});
  Tensor flags = tensor(std::vector<bool>{true, false}, {2});
  mark_step();
  const int64_t compiles = metrics::counter("UncachedCompile");
  const int64_t runs = metrics::counter("ExecuteGraph");

  EXPECT_THROW(matmul(a, reshape(b, {4, 1})), Error);
  EXPECT_THROW(add(a, b), Error);
  EXPECT_THROW(a + b * 2.0, Error);  // the valid b * 2.0 is built first, then dropped
  EXPECT_THROW(sum(a, {2}), Error);
  EXPECT_THROW(transpose(a, 0, 5), Error);
  EXPECT_THROW(neg(flags), Error);
  EXPECT_THROW(mean(ints), Error);
  EXPECT_THROW(matmul(flags, flags), Error);
  EXPECT_THROW(reshape(a, {4, 2}), Error);
  EXPECT_THROW(a.add_(b), Error);                          // cannot broadcast
  EXPECT_THROW(a.add_(zeros({2, 1, 3})), Error);           // result [2, 2, 3] is not a's shape
  EXPECT_THROW(ints.add_(a), Error);                       // f32 result into an i64 tensor
  EXPECT_THROW(a.mul_(b), Error);

  for (const Tensor* t : {&a, &b, &ints, &flags}) EXPECT_FALSE(t->is_pending());
  mark_step();
  EXPECT_EQ(metrics::counter("UncachedCompile"), compiles) << "a failed op left IR behind";
  EXPECT_EQ(metrics::counter("ExecuteGraph"), runs) << "a failed op left IR behind";
  EXPECT_EQ(a.to_vector<float>(), a_values);
  EXPECT_EQ(b.to_vector<float>(), b_values);
  EXPECT_EQ(ints.to_vector<int64_t>(), i_values);
  EXPECT_EQ(flags.to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(ints.dtype(), DType::i64);
}

// A pending tensor used by a failing op keeps its pending value: the next sync runs exactly one
// graph and gives the value it had before the error. (Also shows the counters do move when
// something is pending, so the test above is not vacuous.)
TEST(OpErrors, FailedOpKeepsPendingOperandIntact) {
  Tensor a = f32_2x3();
  Tensor p = a * 2.0 + 1.0;
  ASSERT_TRUE(p.is_pending());
  EXPECT_THROW(matmul(p, p), Error);
  EXPECT_THROW(p.add_(zeros({3, 3})), Error);
  EXPECT_THROW(reshape(p, {7}), Error);
  EXPECT_TRUE(p.is_pending());
  EXPECT_EQ(p.shape(), (Shape{2, 3}));
  const int64_t runs = metrics::counter("ExecuteGraph");
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), runs + 1);
  EXPECT_FALSE(p.is_pending());
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{3, 5, 7, 9, 11, 13}));
}

}  // namespace
}  // namespace lazyrt
