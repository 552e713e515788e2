#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <unistd.h>

#include "ir/graph.h"
#include "support/graphs.h"

namespace lazyrt::ir {
using lazyrt::testing::f32;

namespace {
Graph mlp_like(Shape x_shape) {
  Graph g;
  ValueRef x = g.add_parameter(f32(x_shape));
  ValueRef w = g.add_parameter(f32({x_shape.back(), 4}));
  ValueRef h = g.add(OpKind::Relu, {g.add(OpKind::Matmul, {x, w})});
  g.outputs = {g.add(OpKind::Sum, {h}, {std::vector<int64_t>{0, 1}, false})};
  return g;
}

// A traced program whose hash the cross-process test compares.
GraphHash traced_program_hash() {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = tensor({0.5, -1, 2}, {3, 1});
  Tensor y = relu(matmul(x, w) + 1.0).sum();
  return graph_hash({y});
}
}  // namespace

TEST(Hash, EqualStructuresHashEqual) {
  EXPECT_EQ(hash_graph(mlp_like({8, 3})), hash_graph(mlp_like({8, 3})));
}

TEST(Hash, CoversShapesOpsAttributesAndOutputs) {
  const GraphHash base = hash_graph(mlp_like({8, 3}));
  EXPECT_NE(base, hash_graph(mlp_like({9, 3})));
  Graph op = mlp_like({8, 3});
  op.nodes[3].op = OpKind::Abs;
  EXPECT_NE(base, hash_graph(op));
  Graph attr = mlp_like({8, 3});
  attr.nodes[4].attrs.values[1] = true;
  EXPECT_NE(base, hash_graph(attr));
  Graph out = mlp_like({8, 3});
  out.outputs.push_back(out.outputs[0]);
  EXPECT_NE(base, hash_graph(out));
  Graph params = mlp_like({8, 3});
  std::swap(params.nodes[0].attrs, params.nodes[1].attrs);  // parameter order swapped
  EXPECT_NE(base, hash_graph(params));
  Graph constant;
  constant.outputs = {constant.add_full(1.0, {}, DType::f32)};
  Graph constant2;
  constant2.outputs = {constant2.add_full(2.0, {}, DType::f32)};
  EXPECT_NE(hash_graph(constant), hash_graph(constant2));
}

TEST(Hash, ASealedRegionHashesAsItsGraphAndACopyForgetsTheKeptHash) {
  const Graph region = mlp_like({8, 3});
  const std::shared_ptr<const Graph> sealed = seal(region);
  ASSERT_TRUE(sealed->hash_memo.value.has_value());
  EXPECT_EQ(*sealed->hash_memo.value, hash_graph(region));
  // A node hashes the kept hash: it must be the region's own, or two nodes with other regions
  // would hash alike. A copy that is changed is hashed afresh.
  Graph copy = *sealed;
  EXPECT_FALSE(copy.hash_memo.value.has_value());
  copy.nodes[3].op = OpKind::Abs;
  auto with_region = [](std::shared_ptr<const Graph> r) {
    Graph g;
    ValueRef x = g.add_parameter(f32({8, 3}));
    ValueRef w = g.add_parameter(f32({3, 4}));
    g.outputs = {lazyrt::testing::add_call(g, std::move(r), x, w)};
    verify(g);
    return hash_graph(g);
  };
  EXPECT_EQ(with_region(sealed), with_region(std::make_shared<const Graph>(region)));
  EXPECT_NE(with_region(sealed), with_region(seal(copy)));
  EXPECT_NE(with_region(sealed), with_region(std::make_shared<const Graph>(copy)));
}

TEST(Hash, ExcludesTensorContents) {
  Tensor a = tensor({1, 2, 3}, {3});
  Tensor b = tensor({7, 8, 9}, {3});
  EXPECT_EQ(graph_hash({exp(a) * 2.0}), graph_hash({exp(b) * 2.0}));
  EXPECT_NE(graph_hash({exp(a) * 2.0}), graph_hash({exp(a) * 3.0}));
}

TEST(Hash, GraphHashExecutesNothing) {
  Tensor a = tensor({1, 2, 3}, {3});
  Tensor y = exp(a);
  const int64_t executed = metrics::counter("ExecuteGraph");
  graph_hash({y});
  EXPECT_TRUE(y.is_pending());
  EXPECT_EQ(metrics::counter("ExecuteGraph"), executed);
}

// Not a check by itself: prints the hash when asked to, for the cross-process test below.
TEST(Hash, ProbePrintsTracedHash) {
  if (std::getenv("LAZYRT_HASH_PROBE")) std::printf("HASH=%s\n", traced_program_hash().to_string().c_str());
}

TEST(Hash, DeterministicAcrossProcesses) {
  auto run_probe = [] {
    std::string cmd = "LAZYRT_HASH_PROBE=1 /proc/" + std::to_string(getpid()) +
                      "/exe --gtest_filter=Hash.ProbePrintsTracedHash 2>/dev/null";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    std::string out;
    std::array<char, 256> buf;
    while (pipe && fgets(buf.data(), buf.size(), pipe.get())) out += buf.data();
    auto at = out.find("HASH=");
    return at == std::string::npos ? std::string() : out.substr(at + 5, 32);
  };
  const std::string first = run_probe();
  const std::string second = run_probe();
  ASSERT_EQ(first.size(), 32u) << "the probe process printed no hash";
  EXPECT_EQ(first, second);
  EXPECT_EQ(first, traced_program_hash().to_string());
}

}  // namespace lazyrt::ir
