#include <gtest/gtest.h>

#include <cstring>

#include "compile/compile.h"
#include "runtime/buffer.h"
#include "support/alloc_counter.h"
#include "support/graphs.h"

namespace lazyrt::runtime {
using ir::Graph;
using ir::OpKind;
using ir::ValueRef;
using lazyrt::testing::f32;

namespace {
std::shared_ptr<Buffer> floats(std::vector<float> v) {
  auto b = allocate(v.size() * sizeof(float));
  std::memcpy(b->data(), v.data(), v.size() * sizeof(float));
  return b;
}
std::vector<float> read(const Buffer& b, size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), b.data(), n * sizeof(float));
  return v;
}

// y = relu(x @ w + b) summed over rows, and w - 0.5 * w (an update of w).
Graph layer() {
  Graph g;
  ValueRef x = g.add_parameter(f32({2, 3}));
  ValueRef w = g.add_parameter(f32({3, 2}));
  ValueRef b = g.add_parameter(f32({2}));
  ValueRef h = g.add(OpKind::Relu, {g.add(OpKind::Add, {g.add(OpKind::Matmul, {x, w}), b})});
  ValueRef s = g.add(OpKind::Sum, {h}, {std::vector<int64_t>{0}, false});
  ValueRef w2 = g.add(OpKind::Sub, {w, g.add(OpKind::Mul, {w, g.add_full(0.5, {}, DType::f32)})});
  g.outputs = {s, w2};
  return g;
}
}  // namespace

TEST(Executable, ComputesTheGraph) {
  auto exe = compile::compile(layer());
  auto x = floats({1, 2, 3, 4, 5, 6}), w = floats({1, -1, 0, 1, 2, 0}), b = floats({0.5, -20});
  auto s = allocate(8), w2 = allocate(24);
  const void* params[] = {x->data(), w->data(), b->data()};
  void* outs[] = {s->data(), w2->data()};
  exe->run(params, outs);
  // x@w = [[7, 1], [16, 1]]; + b = [[7.5, -19], [16.5, -19]]; relu; column sums.
  EXPECT_EQ(read(*s, 2), (std::vector<float>{24, 0}));
  EXPECT_EQ(read(*w2, 6), (std::vector<float>{0.5, -0.5, 0, 0.5, 1, 0}));
}

TEST(Executable, RunPerformsZeroHeapAllocations) {
  auto exe = compile::compile(layer());
  auto x = floats({1, 2, 3, 4, 5, 6}), w = floats({1, -1, 0, 1, 2, 0}), b = floats({0.5, -20});
  auto s = allocate(8), w2 = allocate(24);
  const void* params[] = {x->data(), w->data(), b->data()};
  void* outs[] = {s->data(), w2->data()};
  exe->run(params, outs);  // first run outside the count: BLAS may set itself up
  lazyrt::testing::CountAllocations count;
  for (int i = 0; i < 10; ++i) exe->run(params, outs);
  EXPECT_EQ(count.count(), 0);
}

namespace {
// while c < limit: (c, x, y) <- (c + 1, y + y, x). Carries c i64[], x and y f32[2]; limit is a
// captured i64[]. x is computed by the body, y is a parameter passed through to another
// position, so both ways a carry reaches the next iteration are exercised.
Graph swapping_loop() {
  const ir::TensorType i64{DType::i64, {}};
  auto cond = std::make_shared<Graph>();
  {
    ValueRef c = cond->add_parameter(i64);
    cond->add_parameter(f32({2}));
    cond->add_parameter(f32({2}));
    ValueRef limit = cond->add_parameter(i64);
    cond->outputs = {cond->add(OpKind::Lt, {c, limit})};
  }
  auto body = std::make_shared<Graph>();
  {
    ValueRef c = body->add_parameter(i64);
    ValueRef x = body->add_parameter(f32({2}));
    ValueRef y = body->add_parameter(f32({2}));
    body->add_parameter(i64);
    body->outputs = {body->add(OpKind::Add, {c, body->add_full(1, {}, DType::i64)}),
                     body->add(OpKind::Add, {y, y}), x};
  }
  Graph g;
  ValueRef c = g.add_parameter(i64), x = g.add_parameter(f32({2})), y = g.add_parameter(f32({2}));
  ValueRef limit = g.add_parameter(i64);
  ValueRef w = g.add(OpKind::While, {c, x, y, limit}, {int64_t{3}});
  g.nodes[w.node].regions = {cond, body};
  g.outputs = {w, {w.node, 1}, {w.node, 2}};
  return g;
}
}  // namespace

TEST(Executable, WhileLoopEndsOnEitherCarrySetAndAllocatesNothing) {
  auto exe = compile::compile(swapping_loop());
  auto x = floats({1, 2}), y = floats({10, 20});
  auto c = allocate(8), limit = allocate(8), c_out = allocate(8), x_out = allocate(8), y_out = allocate(8);
  const void* params[] = {c->data(), x->data(), y->data(), limit->data()};
  void* outs[] = {c_out->data(), x_out->data(), y_out->data()};
  auto run = [&](int64_t trips) {
    *static_cast<int64_t*>(c->data()) = 0;
    *static_cast<int64_t*>(limit->data()) = trips;
    exe->run(params, outs);
    EXPECT_EQ(*static_cast<int64_t*>(c_out->data()), trips);
  };
  // (x, y) -> (2y, x) -> (2x, 2y) -> (4y, 2x) -> (4x, 4y)
  run(3);
  EXPECT_EQ(read(*x_out, 2), (std::vector<float>{40, 80}));
  EXPECT_EQ(read(*y_out, 2), (std::vector<float>{2, 4}));
  run(4);
  EXPECT_EQ(read(*x_out, 2), (std::vector<float>{4, 8}));
  EXPECT_EQ(read(*y_out, 2), (std::vector<float>{40, 80}));
  run(0);
  EXPECT_EQ(read(*x_out, 2), (std::vector<float>{1, 2}));
  EXPECT_EQ(read(*y_out, 2), (std::vector<float>{10, 20}));
  lazyrt::testing::CountAllocations count;
  for (int64_t trips : {1, 2, 5, 1000}) run(trips);
  EXPECT_EQ(count.count(), 0);
}

TEST(Executable, DonatedOutputWrittenInPlaceWhenNothingReadsTheParameterAfter) {
  Graph g;
  ValueRef w = g.add_parameter(f32({4}));
  ValueRef gr = g.add_parameter(f32({4}));
  g.outputs = {g.add(OpKind::Sub, {w, gr})};
  auto exe = compile::compile(g, {0});
  ASSERT_TRUE(exe->donation_accepted(0));
  EXPECT_EQ(exe->stats().steps, 1u) << exe->to_text();
  auto wb = floats({1, 2, 3, 4}), gb = floats({1, 1, 1, 1});
  const void* params[] = {wb->data(), gb->data()};
  void* outs[] = {wb->data()};
  exe->run(params, outs);
  EXPECT_EQ(read(*wb, 4), (std::vector<float>{0, 1, 2, 3}));
}

TEST(Executable, DonatedOutputCopiedInLastWhenTheParameterIsReadLater) {
  // out0 = w + 1 is produced first, but w is read again for out1 afterwards.
  Graph g;
  ValueRef w = g.add_parameter(f32({3}));
  ValueRef a = g.add(OpKind::Add, {w, g.add_full(1, {}, DType::f32)});
  ValueRef s = g.add(OpKind::Sum, {g.add(OpKind::Mul, {w, a})}, {std::vector<int64_t>{0}, false});
  g.outputs = {a, s};
  auto exe = compile::compile(g, {0, -1});
  ASSERT_TRUE(exe->donation_accepted(0));
  auto wb = floats({1, 2, 3});
  auto sb = allocate(4);
  const void* params[] = {wb->data()};
  void* outs[] = {wb->data(), sb->data()};
  exe->run(params, outs);
  EXPECT_EQ(read(*wb, 3), (std::vector<float>{2, 3, 4}));
  EXPECT_EQ(read(*sb, 1)[0], 1 * 2 + 2 * 3 + 3 * 4);
}

TEST(Executable, DonationRefusedWhenAnotherOutputReturnsTheParameter) {
  Graph g;
  ValueRef w = g.add_parameter(f32({3}));
  g.outputs = {g.add(OpKind::Exp, {w}), w};
  auto exe = compile::compile(g, {0, -1});
  EXPECT_FALSE(exe->donation_accepted(0));
  EXPECT_EQ(exe->outputs()[1].kind, OutputSource::Kind::Param);
}

TEST(Executable, ConstantAndAliasedOutputs) {
  Graph g;
  ValueRef x = g.add_parameter(f32({2}));
  ValueRef e = g.add(OpKind::Exp, {x});
  g.outputs = {e, e, g.add_full(3, {2}, DType::f32)};
  auto exe = compile::compile(g);
  EXPECT_EQ(exe->outputs()[0].kind, OutputSource::Kind::Computed);
  EXPECT_EQ(exe->outputs()[1].kind, OutputSource::Kind::Alias);
  EXPECT_EQ(exe->outputs()[1].index, 0);
  ASSERT_EQ(exe->outputs()[2].kind, OutputSource::Kind::Const);
  EXPECT_EQ(read(*exe->constant_output(exe->outputs()[2].index), 2), (std::vector<float>{3, 3}));
}

TEST(Executable, LargeConstantsAreFilledWhenItRunsNotKept) {
  // A 256 KiB constant read by a product, and one returned: neither is kept by the executable
  // (the caches weigh it by what it holds), both are filled by steps on every run.
  constexpr int64_t n = 256;
  Graph g;
  ValueRef x = g.add_parameter(f32({n, n}));
  ValueRef c = g.add_full(0.5, {n, n}, DType::f32);
  g.outputs = {g.add(OpKind::Matmul, {x, c}), g.add_full(2, {n * n}, DType::f32)};
  auto exe = compile::compile(g);
  EXPECT_EQ(exe->outputs()[1].kind, OutputSource::Kind::Computed);
  const size_t constant_bytes = n * n * sizeof(float);
  EXPECT_LE(exe->held_bytes(), constant_bytes) << exe->to_text();
  std::vector<float> xs(static_cast<size_t>(n * n));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 7) - 3;
  auto xb = floats(xs);
  for (int run = 0; run < 2; ++run) {
    auto y = allocate(constant_bytes), o = allocate(constant_bytes);
    std::memset(o->data(), 0, constant_bytes);
    const void* params[] = {xb->data()};
    void* outs[] = {y->data(), o->data()};
    exe->run(params, outs);
    const std::vector<float> yv = read(*y, static_cast<size_t>(n * n)), ov = read(*o, static_cast<size_t>(n * n));
    for (int64_t r = 0; r < n; r += 37) {
      double row = 0;
      for (int64_t k = 0; k < n; ++k) row += xs[static_cast<size_t>(r * n + k)];
      for (int64_t j = 0; j < n; j += 51) EXPECT_EQ(yv[static_cast<size_t>(r * n + j)], 0.5 * row) << r << ", " << j;
    }
    EXPECT_EQ(ov.front(), 2);
    EXPECT_EQ(ov.back(), 2);
  }
}

// An index computed in the graph (labels reshaped, as a cross-entropy does) is checked right
// after the step that computes it, not where the indexing op runs: an update produced after
// that check is written straight into its donated buffer instead of aside and copied in; a bad
// index still changes nothing.
TEST(Executable, AComputedIndexIsCheckedWhereItIsComputed) {
  Graph g;
  ValueRef labels = g.add_parameter({DType::i64, {3}});
  ValueRef logits = g.add_parameter(f32({3, 4}));
  ValueRef w = g.add_parameter(f32({4}));
  ValueRef idx = g.add(OpKind::Reshape, {labels}, {std::vector<int64_t>{3, 1}});
  ValueRef w2 = g.add(OpKind::Sub, {w, g.add_full(1, {}, DType::f32)});
  ValueRef picked = g.add(OpKind::Gather, {logits, idx}, {int64_t{1}});
  g.outputs = {w2, picked};
  auto exe = compile::compile(g, {2, -1});
  ASSERT_TRUE(exe->donation_accepted(0));
  const std::string text = exe->to_text();
  EXPECT_EQ(exe->stats().steps, 4u) << text;  // reshape, its index check, sub, gather: no copies
  EXPECT_NE(text.find("sub(param 2, const+0) -> out 0"), std::string::npos) << text;

  auto lb = allocate(3 * sizeof(int64_t));
  auto logit = floats({0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23});
  auto wb = floats({1, 2, 3, 4});
  auto out = allocate(3 * sizeof(float));
  const void* params[] = {lb->data(), logit->data(), wb->data()};
  void* outs[] = {wb->data(), out->data()};
  const int64_t bad[] = {0, 7, 1};
  std::memcpy(lb->data(), bad, sizeof bad);
  EXPECT_THROW(exe->run(params, outs), Error);
  EXPECT_EQ(read(*wb, 4), (std::vector<float>{1, 2, 3, 4})) << "a bad index changes nothing";
  const int64_t good[] = {3, 0, 2};
  std::memcpy(lb->data(), good, sizeof good);
  exe->run(params, outs);
  EXPECT_EQ(read(*wb, 4), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(read(*out, 3), (std::vector<float>{3, 10, 22}));
}

}  // namespace lazyrt::runtime
