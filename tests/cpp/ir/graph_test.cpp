#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "ir/graph.h"
#include "support/graphs.h"

namespace lazyrt::ir {
using lazyrt::testing::f32;
using ::testing::HasSubstr;

Graph small_graph() {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef b = g.add_parameter(f32({3}));
  ValueRef one = g.add_full(1.0, {}, DType::f32);
  ValueRef y = g.add(OpKind::Add, {x, b});
  ValueRef z = g.add(OpKind::Mul, {y, one});
  ValueRef s = g.add(OpKind::Sum, {z}, {std::vector<int64_t>{1}, false});
  g.outputs = {s, z};
  return g;
}

TEST(Graph, PrintsOneLinePerNodeAndTheOutputs) {
  EXPECT_EQ(to_text(small_graph()),
            "%0 = parameter {index=0} : f32[2, 3]\n"
            "%1 = parameter {index=1} : f32[3]\n"
            "%2 = full {value=1, shape=[], dtype=f32} : f32[]\n"
            "%3 = add(%0, %1) : f32[2, 3]\n"
            "%4 = mul(%3, %2) : f32[2, 3]\n"
            "%5 = sum(%4) {dims=[1], keepdim=false} : f32[2]\n"
            "return %5, %4\n");
}

TEST(Graph, DotNamesEveryNodeAndEdge) {
  std::string dot = to_dot(small_graph());
  EXPECT_THAT(dot, HasSubstr("n3 [label=\"%3 = add(%0, %1) : f32[2, 3]\"]"));
  EXPECT_THAT(dot, HasSubstr("n0 -> n3"));
  EXPECT_THAT(dot, HasSubstr("n5 -> out0"));
}

TEST(Graph, AddInfersResultTypes) {
  Graph g;
  ValueRef a = g.add_parameter({DType::f64, {4, 1, 3}});
  ValueRef b = g.add_parameter({DType::f64, {5, 3}});
  ValueRef c = g.add(OpKind::Lt, {a, b});
  EXPECT_EQ(g.type(c), (TensorType{DType::b8, {4, 5, 3}}));
  ValueRef m = g.add(OpKind::Matmul, {g.add_parameter({DType::f32, {7, 1, 2, 3}}),
                                      g.add_parameter({DType::f32, {6, 3, 4}})});
  EXPECT_EQ(g.type(m), (TensorType{DType::f32, {7, 6, 2, 4}}));
}

TEST(Graph, AddRejectsBadOperandsWithTheOpAndShapes) {
  Graph g;
  ValueRef a = g.add_parameter(f32({2, 3}));
  ValueRef b = g.add_parameter(f32({4, 5}));
  try {
    g.add(OpKind::Matmul, {a, b});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("matmul"));
    EXPECT_THAT(e.what(), HasSubstr("[2, 3]"));
    EXPECT_THAT(e.what(), HasSubstr("[4, 5]"));
  }
  EXPECT_EQ(g.nodes.size(), 2u) << "a rejected node must not be appended";
}

TEST(Graph, IntegerConstantsMustFitTheirDType) {
  Graph g;
  EXPECT_NO_THROW(g.add_full(-9.2e18, {2}, DType::i64));
  EXPECT_NO_THROW(g.add_full(2147483647, {2}, DType::i32));
  EXPECT_NO_THROW(g.add_full(1e300, {2}, DType::f64));
  EXPECT_THAT([&] { g.add_full(1e30, {2}, DType::i64); },
              ::testing::ThrowsMessage<Error>(HasSubstr("full: value 1e+30 does not fit i64")));
  EXPECT_THROW(g.add_full(2147483648.0, {2}, DType::i32), Error);
  EXPECT_THROW(g.add_full(std::nan(""), {2}, DType::i64), Error);
}

TEST(Verify, AcceptsAWellFormedGraph) { EXPECT_NO_THROW(verify(small_graph())); }

TEST(Verify, RejectsAForwardReference) {
  Graph g = small_graph();
  g.nodes[3].operands[0] = {4, 0};
  EXPECT_THROW(verify(g), Error);
}

TEST(Verify, RejectsAResultTypeTheRuleDoesNotGive) {
  Graph g = small_graph();
  g.nodes[3].results[0] = f32({3, 2});
  try {
    verify(g);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("%3 (add)"));
  }
}

TEST(Verify, RejectsWrongOperandCountAndAttributeKinds) {
  Graph g = small_graph();
  g.nodes[3].operands.pop_back();
  EXPECT_THROW(verify(g), Error);
  Graph h = small_graph();
  h.nodes[5].attrs.values[1] = int64_t{1};
  EXPECT_THROW(verify(h), Error);
}

TEST(Verify, RejectsDuplicateParametersAndDanglingOutputs) {
  Graph g = small_graph();
  g.nodes[1].attrs.values[0] = int64_t{0};
  EXPECT_THROW(verify(g), Error);
  Graph h = small_graph();
  h.outputs.push_back({42, 0});
  EXPECT_THROW(verify(h), Error);
}

TEST(Verify, RejectsACallWhoseRegionDoesNotFitItsOperandsOrResults) {
  auto message = [](const Graph& g) {
    try {
      verify(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto graph = [](Graph region, Shape b_shape) {
    Graph g;
    ValueRef x = g.add_parameter(f32({2, 3}));
    g.outputs = {lazyrt::testing::add_call(g, seal(std::move(region)), x, g.add_parameter(f32(b_shape)))};
    return g;
  };
  EXPECT_EQ(message(graph(lazyrt::testing::scale_shift_region(), {3})), "no error");
  EXPECT_THAT(message(graph(lazyrt::testing::scale_shift_region(), {1, 3})),
              HasSubstr("call parameter 1 is f32[3], its operand f32[1, 3]"));
  Graph one_result = lazyrt::testing::scale_shift_region();
  one_result.outputs.pop_back();
  Graph two_results = graph(lazyrt::testing::scale_shift_region(), {3});
  two_results.nodes.back().regions = {seal(one_result)};
  EXPECT_THAT(message(two_results), HasSubstr("region returns 1 values for 2 results"));
  Graph no_region = graph(lazyrt::testing::scale_shift_region(), {3});
  no_region.nodes.back().regions.clear();
  EXPECT_THAT(message(no_region), HasSubstr("a call needs one region"));
  Graph other_results = graph(lazyrt::testing::scale_shift_region(), {3});
  other_results.nodes.back().results[1] = {DType::f64, {2, 3}};
  EXPECT_THAT(message(other_results), HasSubstr("region output 1 is f32[2, 3], result 1 is f64[2, 3]"));
  EXPECT_THAT(message(graph(lazyrt::testing::scale_shift_region(), {2})),
              HasSubstr("call parameter 1 is f32[3], its operand f32[2]"));
}

}  // namespace lazyrt::ir
