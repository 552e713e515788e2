#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include "trace/lazy_tensor.h"

namespace lazyrt {
using ::testing::HasSubstr;

namespace {
const void* data_ptr(const Tensor& t) { return trace::impl_of(t)->data()->data(); }
}  // namespace

TEST(Sync, OpsOnlyRecordUntilAValueIsRead) {
  metrics::reset();
  Tensor a = tensor({1, 2, 3}, {3});
  Tensor b = a * 2.0 + 1.0;
  EXPECT_TRUE(b.is_pending());
  EXPECT_FALSE(a.is_pending());
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 0);
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{3, 5, 7}));
  EXPECT_FALSE(b.is_pending());
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 1);
}

TEST(Sync, MarkStepSyncsEveryPendingTensorInOneGraph) {
  metrics::reset();
  Tensor a = tensor({1, 2}, {2});
  Tensor b = exp(a);
  Tensor c = b + a;
  Tensor d = sum(c);
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 1);
  EXPECT_FALSE(b.is_pending());
  EXPECT_FALSE(c.is_pending());
  EXPECT_FALSE(d.is_pending());
  EXPECT_NEAR(d.item(), std::exp(1.0) + std::exp(2.0) + 3, 1e-5);
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 1) << "reading a synced tensor runs nothing";
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 1) << "nothing pending, nothing to run";
}

TEST(Sync, SyncOnlyTheChosenTensors) {
  Tensor a = tensor({1, 2}, {2});
  Tensor b = a + 1.0;
  Tensor c = a + 2.0;
  sync({b});
  EXPECT_FALSE(b.is_pending());
  EXPECT_TRUE(c.is_pending());
}

TEST(Sync, ReadingAValueLeavesGraphsThatOnlyShareAConstantPending) {
  // x * 2 and y * 2 read one cached constant node; they share no work, so reading one syncs
  // that one alone. A graph that shares a computed node (x * 2 itself) joins.
  Tensor x = tensor({1, 2}, {2}), y = tensor({3, 4}, {2});
  Tensor a = x * 2.0;
  Tensor b = y * 2.0;
  Tensor c = a + 1.0;
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{6, 8}));
  EXPECT_TRUE(a.is_pending());
  EXPECT_TRUE(c.is_pending());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{3, 5}));
  EXPECT_FALSE(a.is_pending()) << "a shares its node with c's graph";
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 4}));
}

TEST(Sync, DroppedTensorsAreNotComputed) {
  metrics::reset();
  Tensor a = tensor({1, 2}, {2});
  { Tensor unused = exp(a); }
  mark_step();
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 0);
}

TEST(InPlace, RebindsTheValueAndKeepsTheIdentity) {
  Tensor w = tensor({1, 2, 3}, {3});
  Tensor alias = w;  // the same handle
  auto* identity = trace::impl_of(w).get();
  w.add_(tensor({10, 10, 10}, {3}), 0.5);
  EXPECT_EQ(trace::impl_of(w).get(), identity);
  EXPECT_TRUE(alias.is_pending());
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{6, 7, 8}));
  w.mul_(tensor({2}, {1}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{12, 14, 16}));
  w.copy_(tensor({5}, {1}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{5, 5, 5}));
  w.zero_();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(InPlace, ValuesTakenBeforeTheUpdateKeepTheOldValue) {
  Tensor w = tensor({1, 2, 3}, {3});
  Tensor before = w * 1.0;  // pending, reads w's old buffer
  Tensor snapshot = w.clone();
  Tensor alias = w.detach();  // a view, as in PyTorch: it sees the update
  w.add_(ones({3}));
  mark_step();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{2, 3, 4}));
  EXPECT_EQ(before.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(snapshot.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{2, 3, 4}));
}

TEST(InPlace, RefusesToBroadcastTheTensorOrNarrowItsDtype) {
  Tensor w = tensor({1, 2, 3}, {3});
  try {
    w.add_(tensor({1, 2, 3, 4, 5, 6}, {2, 3}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("add_"));
    EXPECT_THAT(e.what(), HasSubstr("[2, 3]"));
  }
  Tensor i = tensor(std::vector<int64_t>{1, 2}, {2});
  EXPECT_THROW(i.mul_(tensor({0.5, 0.5}, {2})), Error);
  EXPECT_FALSE(w.is_pending()) << "a failed in-place op leaves the tensor as it was";
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
}

TEST(Donation, InPlaceUpdateWritesIntoTheTensorsOwnBuffer) {
  Tensor w = tensor({1, 2, 3}, {3});
  Tensor g = tensor({1, 1, 1}, {3});
  const void* before = data_ptr(w);
  w.add_(g, -1);
  mark_step();
  EXPECT_EQ(data_ptr(w), before);
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 1, 2}));
}

TEST(Donation, NeverWhenAnotherTensorStillHoldsTheBuffer) {
  Tensor w = tensor({1, 2, 3}, {3});
  Tensor keep = w.clone();  // shares w's buffer
  const void* before = data_ptr(w);
  w.add_(ones({3}));
  mark_step();
  EXPECT_NE(data_ptr(w), before);
  EXPECT_EQ(keep.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(data_ptr(keep), before);
}

TEST(Donation, NeverWhenAPendingTensorOutsideTheSyncReadsTheOldValue) {
  Tensor w = tensor({1, 2, 3}, {3});
  Tensor later = w + 100.0;  // not synced below, reads w's old buffer
  w.add_(ones({3}));
  sync({w});
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{2, 3, 4}));
  EXPECT_EQ(later.to_vector<float>(), (std::vector<float>{101, 102, 103}));
}

// Memory adopted from elsewhere (NumPy, DLPack) is read but never written: an in-place update
// of its tensor goes to a new buffer even when nothing else holds the old one.
TEST(Donation, NeverIntoAdoptedMemory) {
  std::vector<float> host{1, 2, 3};
  bool released = false;
  {
    auto buf = runtime::adopt(host.data(), host.size() * sizeof(float), [&] { released = true; });
    Tensor w = trace::tensor_of(trace::make_data({DType::f32, {3}}, std::move(buf)));
    w.add_(ones({3}));
    mark_step();
    EXPECT_NE(data_ptr(w), host.data());
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{2, 3, 4}));
    EXPECT_EQ(host, (std::vector<float>{1, 2, 3})) << "the adopted memory is untouched";
    EXPECT_TRUE(released) << "the old value is let go once the tensor moved on";
  }
}

// The same step on new data every time: one compile, then cache hits.
TEST(CompileCache, TrainingLikeLoopCompilesOnce) {
  cache::clear_memory();
  metrics::reset();
  Tensor w = tensor({0, 0, 0}, {3, 1});
  w.to_vector<float>();
  for (int step = 0; step < 10; ++step) {
    std::vector<float> xs(12), ys(4);
    for (int i = 0; i < 12; ++i) xs[i] = static_cast<float>((i * (step + 3)) % 7) / 7.0f;
    for (int i = 0; i < 4; ++i) ys[i] = static_cast<float>(i + step);
    Tensor x = tensor(xs, {4, 3});
    Tensor y = tensor(ys, {4, 1});
    Tensor err = matmul(x, w) - y;
    Tensor loss = mean(err * err);
    w.add_(matmul(transpose(x, 0, 1), err), -0.1);
    mark_step();
    EXPECT_FALSE(loss.is_pending());
  }
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), 9);
  EXPECT_EQ(metrics::counter("ExecuteGraph"), 10);
}

TEST(Metrics, ReportListsCountersAndTimings) {
  metrics::reset();
  (exp(tensor({1}, {1})) * 3.0).to_vector<float>();
  std::string r = metrics::report();
  for (const char* name : {"UncachedCompile", "ExecuteGraph", "TraceTime", "CompileTime", "ExecuteTime"})
    EXPECT_THAT(r, HasSubstr(name));
  EXPECT_EQ(metrics::counter("NeverTouched"), 0);
  EXPECT_EQ(metrics::timing_count("ExecuteTime"), 1);
}

// Kernel timings: one per op kind that ran, counted once per run, only while on.
TEST(Metrics, KernelTimingsNameTheOpsThatRan) {
  metrics::reset();
  Tensor a = tensor({1, 2, 3, 4}, {2, 2});
  auto run = [&] { (matmul(a, a).sum() * 2.0).to_vector<float>(); };
  run();
  EXPECT_EQ(metrics::timing_count("Kernel:matmul"), 0) << "off by default";
  metrics::set_kernel_timings(true);
  EXPECT_TRUE(metrics::kernel_timings());
  run();
  run();
  metrics::set_kernel_timings(false);
  run();
  EXPECT_EQ(metrics::timing_count("Kernel:matmul"), 2);
  EXPECT_EQ(metrics::timing_count("Kernel:conv2d"), 0);
  EXPECT_THAT(metrics::report(), HasSubstr("Kernel:matmul: 2,"));
}

// Step timings: each step of the executable, with the bytes it reads and writes, counted per
// run while kernel timings are on, cleared by reset(), gone with the executable.
TEST(Metrics, StepTimingsListEachStepWithItsBytes) {
  metrics::reset();
  cache::clear_memory();
  std::vector<float> xs(64 * 32, 0.5f), ws(32 * 16, 0.25f);
  Tensor x = tensor(xs, {64, 32}), w = tensor(ws, {32, 16});
  mark_step();
  auto run = [&] { (relu(matmul(x, w)) + 1.0).sum().to_vector<float>(); };
  run();
  EXPECT_TRUE(metrics::step_timings().empty()) << "nothing is timed while off";
  metrics::set_kernel_timings(true);
  run();
  run();
  metrics::set_kernel_timings(false);
  run();
  const std::vector<metrics::StepTiming> rows = metrics::step_timings();
  ASSERT_FALSE(rows.empty());
  int64_t matmul_bytes = 0;
  for (const metrics::StepTiming& r : rows) {
    EXPECT_EQ(r.executable, rows[0].executable) << "one executable ran";
    EXPECT_EQ(r.runs, 2) << r.op;
    EXPECT_GT(r.total_ns, 0) << r.op;
    if (r.op == "matmul" || r.op == "gemm") matmul_bytes = r.bytes;
  }
  EXPECT_EQ(matmul_bytes, (64 * 32 + 32 * 16 + 64 * 16) * 4) << "the product reads x and w and writes [64, 16]";
  metrics::reset();
  EXPECT_TRUE(metrics::step_timings().empty()) << "reset clears the runs";
  metrics::set_kernel_timings(true);
  run();
  metrics::set_kernel_timings(false);
  EXPECT_FALSE(metrics::step_timings().empty());
  cache::clear_memory();  // the only owner of the executable
  EXPECT_TRUE(metrics::step_timings().empty()) << "a dropped executable's steps are gone";
}

TEST(Printing, LooksLikePyTorch) {
  EXPECT_EQ(tensor({1, 2, 3, 4}, {2, 2}).to_string(), "tensor([[1., 2.],\n        [3., 4.]])");
  EXPECT_EQ(tensor({1.5, -2}, {2}).to_string(), "tensor([1.5000, -2.0000])");
  EXPECT_EQ(tensor(std::vector<int64_t>{3, 4}, {2}).to_string(), "tensor([3, 4])");
  EXPECT_EQ(tensor(std::vector<bool>{true, false}, {2}).to_string(), "tensor([True, False])");
  EXPECT_EQ(scalar_tensor(2.5, DType::f64).to_string(), "tensor(2.5000, dtype=f64)");
}

}  // namespace lazyrt
