// Bad calls of the public tensor ops: each throws lazyrt::Error whose message names the op and
// the shapes or dtypes it was given (DESIGN.md: "Ops check shapes eagerly and throw
// lazyrt::Error naming the op and the shapes; nothing is left half-built"), and a call that
// throws leaves every tensor as it was, with nothing new pending.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <lazyrt/lazyrt.h>

namespace lazyrt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The message of the lazyrt::Error that `call` throws; a test failure if it throws anything
// else or nothing.
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw an exception that is not lazyrt::Error: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

Tensor f32_2x3() { return tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}); }

// ---- messages -----------------------------------------------------------------------------------

TEST(OpErrors, IntegerConstantsOutOfRangeAreRefusedNotWrapped) {
  EXPECT_THAT(error_of([] { full({2}, 1e30, DType::i64); }), HasSubstr("does not fit i64"));
  Tensor small = tensor(std::vector<int32_t>{1, 2}, {2});
  EXPECT_THAT(error_of([&] { small + int64_t{3000000000}; }), HasSubstr("does not fit i32"));
  EXPECT_FALSE(small.is_pending());
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
