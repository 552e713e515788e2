#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <limits>
#include <random>
#include <set>

#include "ir/serialize.h"
#include "support/graphs.h"
#include "trace/lazy_tensor.h"
#include "util/bytes.h"

namespace lazyrt::ir {
using lazyrt::testing::every_op_graph;
using lazyrt::testing::f32;
using ::testing::HasSubstr;

namespace {

// Whatever deserialize_graph makes of `bytes`: "ok" for a graph (which it has verified) or
// the error. Anything else escaping (another exception type, a crash) fails the test.
std::string outcome(std::string_view bytes) {
  try {
    Graph g = deserialize_graph(bytes);
    verify(g);
    return "ok";
  } catch (const Error& e) {
    return e.what();
  }
}

// Writes a graph byte by byte in the documented format, for inputs the writer refuses.
struct RawGraph {
  lazyrt::detail::ByteWriter w;
  RawGraph() { w.u32(kGraphFormatVersion); }
  std::string bytes() const { return w.str(); }
};

// A traced training step with a loop in it, as a sync would extract it.
Graph traced_step_graph() {
  Tensor w = tensor({0.5, -0.25, 1, 2}, {2, 2});
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor y = tanh(matmul(x, w));
  Carry out = fori_loop(0, 3, [&](const Tensor&, const Carry& c) { return Carry{c[0] * 0.5 + y}; },
                        {zeros({3, 2})});
  Tensor loss = (out[0] * out[0]).mean();
  w.add_(matmul(transpose(x, 0, 1), out[0]), -0.1);
  return trace::pending_graph({trace::impl_of(loss), trace::impl_of(w)});
}

}  // namespace

TEST(Serialize, EveryOpGraphCoversTheWholeOpTable) {
  std::set<OpKind> used;
  for (const Node& n : every_op_graph().nodes) used.insert(n.op);
  EXPECT_EQ(used.size(), static_cast<size_t>(kNumOps))
      << "a new op in ops.def needs a use in every_op_graph (tests/cpp/support/graphs.h)";
}

TEST(Serialize, RoundTripsEveryOpAndAttributeKind) {
  const Graph g = every_op_graph();
  ASSERT_NO_THROW(verify(g));
  const Graph back = deserialize_graph(serialize_graph(g));
  EXPECT_TRUE(same_graph(g, back));
  EXPECT_EQ(hash_graph(g), hash_graph(back));
  EXPECT_EQ(to_text(g), to_text(back));
}

TEST(Serialize, RoundTripsATracedStepWithLoopRegions) {
  const Graph g = traced_step_graph();
  const Graph back = deserialize_graph(serialize_graph(g));
  EXPECT_TRUE(same_graph(g, back));
  EXPECT_EQ(hash_graph(g), hash_graph(back));
  EXPECT_THAT(to_text(back), HasSubstr("while"));
}

TEST(Serialize, RoundTripsNestedLoops) {
  Graph inner;
  inner.outputs = {testing::add_count_up_loop(inner, inner.add_parameter({DType::i64, {}}), 3)};
  Graph g;
  ValueRef init = g.add_full(0, {}, DType::i64);
  ValueRef w = testing::add_count_up_loop(g, init, 5);
  // Replace the body by one that runs the inner loop.
  auto body = std::make_shared<Graph>(inner);
  g.nodes[w.node].regions[1] = body;
  g.outputs = {w};
  ASSERT_NO_THROW(verify(g));
  EXPECT_TRUE(same_graph(g, deserialize_graph(serialize_graph(g))));
}

TEST(Serialize, FloatConstantsKeepTheirExactBits) {
  Graph g;
  for (double v : {0.1, -0.0, 1e-310, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()})
    g.outputs.push_back(g.add_full(v, {2}, DType::f64));
  EXPECT_TRUE(same_graph(g, deserialize_graph(serialize_graph(g))));
}

TEST(Serialize, OpsAreWrittenByName) {
  const std::string bytes = serialize_graph(every_op_graph());
  EXPECT_NE(bytes.find("matmul"), std::string::npos);
  EXPECT_NE(bytes.find("logical_not"), std::string::npos);
  // An op this build does not know is refused by name.
  Graph g;
  g.outputs = {g.add(OpKind::Exp, {g.add_parameter(f32({2}))})};
  std::string renamed = serialize_graph(g);
  renamed.replace(renamed.find("exp"), 3, "pxe");
  EXPECT_THAT(outcome(renamed), HasSubstr("unknown op 'pxe'"));
}

TEST(Serialize, RejectsEveryTruncation) {
  const std::string bytes = serialize_graph(every_op_graph());
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_NE(outcome(std::string_view(bytes).substr(0, n)), "ok") << "prefix of " << n << " bytes";
}

TEST(Serialize, FlippedBytesAreRejectedOrStillVerify) {
  const std::string bytes = serialize_graph(traced_step_graph());
  std::mt19937 rng(7);
  int rejected = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int trial = 0; trial < 3; ++trial) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << (rng() % 8)));
      rejected += outcome(bad) != "ok";  // "ok" means it passed verify: a valid graph
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(Serialize, RejectsWrongVersionTrailingBytesAndEmptyInput) {
  const std::string bytes = serialize_graph(every_op_graph());
  std::string other_version = bytes;
  other_version[0] = static_cast<char>(kGraphFormatVersion + 1);
  EXPECT_THAT(outcome(other_version), HasSubstr("format version"));
  EXPECT_THAT(outcome(bytes + "x"), HasSubstr("unexpected bytes after the end"));
  EXPECT_THAT(outcome(""), HasSubstr("truncated"));
}

TEST(Serialize, RejectsCountsTheInputCannotHold) {
  RawGraph raw;
  raw.w.i64(0);
  raw.w.u32(0xFFFFFFFFu);  // four billion nodes in a few bytes
  EXPECT_THAT(outcome(raw.bytes()), HasSubstr("cannot fit"));
  RawGraph params;
  params.w.i64(int64_t{1} << 40);
  params.w.u32(0);
  params.w.u32(0);
  EXPECT_THAT(outcome(params.bytes()), HasSubstr("parameters"));
}

TEST(Serialize, RejectsHugeOrNegativeShapesAndUnknownDTypes) {
  auto one_parameter = [](uint8_t dtype, std::vector<int64_t> dims) {
    RawGraph raw;
    raw.w.i64(1);
    raw.w.u32(1);
    raw.w.short_string("parameter");
    raw.w.u32(0);                                  // operands
    raw.w.u32(1);                                  // attributes
    raw.w.u8(static_cast<uint8_t>(AttrKind::Int));
    raw.w.i64(0);
    raw.w.u32(1);                                  // results
    raw.w.u8(dtype);
    raw.w.u32(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) raw.w.i64(d);
    raw.w.u32(0);                                  // regions
    raw.w.u32(1);                                  // outputs
    raw.w.i32(0);
    raw.w.i32(0);
    return raw.bytes();
  };
  EXPECT_EQ(outcome(one_parameter(0, {2, 3})), "ok");
  EXPECT_THAT(outcome(one_parameter(0, {int64_t{1} << 40, int64_t{1} << 40})),
              HasSubstr("more than"));
  EXPECT_THAT(outcome(one_parameter(0, {-4})), HasSubstr("negative"));
  EXPECT_THAT(outcome(one_parameter(kNumDTypes, {2})), HasSubstr("unknown dtype"));
}

TEST(Serialize, RejectsRegionsNestedTooDeep) {
  Graph g;
  g.outputs = {g.add_parameter({DType::i64, {}})};
  for (int depth = 0; depth < kMaxRegionDepth; ++depth) {
    Graph outer;
    outer.outputs = {testing::add_count_up_loop(outer, outer.add_parameter({DType::i64, {}}), 2)};
    outer.nodes[outer.outputs[0].node].regions[1] = std::make_shared<Graph>(g);
    g = outer;
  }
  EXPECT_THROW(serialize_graph(g), Error);

  // The reader stops at the limit before looking at anything else, whatever the nodes hold.
  auto nested = [](int depth) {
    RawGraph raw;
    for (int d = 0; d < depth; ++d) {
      raw.w.i64(0);
      raw.w.u32(1);
      raw.w.short_string("while");
      for (int count = 0; count < 3; ++count) raw.w.u32(0);  // operands, attributes, results
      raw.w.u32(1);                                          // one region, nested
    }
    raw.w.i64(0);
    raw.w.u32(0);
    raw.w.u32(0);
    for (int d = 0; d < depth; ++d) raw.w.u32(0);  // outputs of each enclosing graph
    return raw.bytes();
  };
  EXPECT_THAT(outcome(nested(kMaxRegionDepth)), HasSubstr("nested deeper"));
  EXPECT_THAT(outcome(nested(100000)), HasSubstr("nested deeper"));
  EXPECT_THAT(outcome(nested(3)), HasSubstr("invalid"));  // parsed, then refused by verify
}

TEST(Serialize, ParsedGraphsAreVerified) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2}));
  g.outputs = {g.add(OpKind::Exp, {x})};
  g.nodes[1].operands[0] = {1, 0};  // reads itself
  EXPECT_THAT(outcome(serialize_graph(g)), HasSubstr("invalid"));
}

TEST(Verify, OnlyAWhileOwnsRegions) {
  Graph g;
  g.outputs = {g.add(OpKind::Exp, {g.add_parameter(f32({2}))})};
  g.nodes[1].regions.push_back(std::make_shared<Graph>());
  EXPECT_THROW(verify(g), Error);
}

TEST(ShapeNumel, OverflowIsAnErrorNotAWrongCount) {
  EXPECT_EQ(shape_numel({2, 3}), 6);
  EXPECT_THROW(shape_numel({int64_t{1} << 40, int64_t{1} << 40}), Error);
}

}  // namespace lazyrt::ir
