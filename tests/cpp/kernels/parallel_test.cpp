// Kernels over large tensors run on the thread pool; results must not depend on it.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "backend/cpu/kernels/parallel.h"

extern "C" int omp_in_parallel();
extern "C" int omp_get_num_threads();

namespace lazyrt {
namespace {

// Runs a test body at n threads, then restores the count it found.
struct AtThreads {
  explicit AtThreads(int n) { kernels::set_num_threads(n); }
  ~AtThreads() { kernels::set_num_threads(before); }
  int before = kernels::num_threads();
};

}  // namespace

// The kernels' threads are the calling thread's OpenMP team, the one oneDNN's convolutions run
// on, so that two sets of threads do not take turns on the CPUs. ThreadSanitizer does not see
// libgomp's synchronisation: its builds run on lazyrt's own pool.
TEST(Parallel, KernelsRunOnTheCallersOpenMPTeam) {
#if defined(__SANITIZE_THREAD__)
  const bool expect_team = false;
#else
  const bool expect_team = true;
#endif
  ASSERT_EQ(kernels::runs_on_openmp_team(), expect_team);
  AtThreads two(2);
  std::atomic<int> in_team{0}, outside{0};
  kernels::parallel_for(1 << 20, 1000, [&](int64_t, int64_t) {
    (omp_in_parallel() && omp_get_num_threads() == 2 ? in_team : outside)++;
  });
  EXPECT_EQ(in_team.load() > 0, expect_team);
  EXPECT_EQ(outside.load() > 0, !expect_team);
}

// An exception thrown by a chunk, on whichever thread, reaches the caller once every thread is
// done; the chunks not yet started are skipped, and the next call runs as usual.
TEST(Parallel, AChunkThatThrowsReachesTheCaller) {
  AtThreads two(std::max(2, kernels::num_threads()));
  const int64_t n = 1 << 20;
  for (const int64_t bad : {int64_t{0}, n - 1, n / 2}) {
    std::atomic<int64_t> done{0};
    try {
      kernels::parallel_for(n, 1000, [&](int64_t b, int64_t e) {
        if (b <= bad && bad < e) throw std::runtime_error("chunk at " + std::to_string(bad));
        done += e - b;
      });
      ADD_FAILURE() << "no exception for the chunk at " << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "chunk at " + std::to_string(bad));
    }
    EXPECT_LT(done.load(), n);
    std::atomic<int64_t> covered{0};
    kernels::parallel_for(n, 1000, [&](int64_t b, int64_t e) { covered += e - b; });
    EXPECT_EQ(covered.load(), n) << "after the chunk at " << bad << " threw";
  }
}

TEST(Parallel, ChunksCoverTheRangeExactlyOnce) {
  const int64_t n = 1000003;
  std::vector<std::atomic<int>> hits(n);
  std::set<std::thread::id> threads;
  std::mutex mu;
  const bool pooled = kernels::num_threads() > 1;
  kernels::parallel_for(n, 1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    // On a loaded machine one thread could take every chunk before the pool wakes; the first
    // chunk waits (up to 2 s) for another thread to join, so the check below is about the
    // pool, not the scheduler.
    if (pooled && b == 0)
      for (int k = 0; k < 2000; ++k) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (threads.size() > 1) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  if (pooled) EXPECT_GT(threads.size(), 1u) << "large ranges use the pool";
  int calls = 0;
  kernels::parallel_for(10, 1000, [&](int64_t b, int64_t e) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    ++calls;
  });
  EXPECT_EQ(calls, 1) << "small ranges run inline";
}

TEST(Parallel, LargeElementwiseBroadcastAndReductionsMatchPlainLoops) {
  const int64_t rows = 300, cols = 1000;
  std::vector<float> a(rows * cols), b(cols), c(rows);
  for (int64_t i = 0; i < rows * cols; ++i) a[i] = static_cast<float>(i % 97) * 0.5f - 7;
  for (int64_t j = 0; j < cols; ++j) b[j] = static_cast<float>(j % 13) - 3;
  for (int64_t i = 0; i < rows; ++i) c[i] = static_cast<float>(i % 5);
  Tensor ta = tensor(a, {rows, cols}), tb = tensor(b, {cols}), tc = tensor(c, {rows, 1});
  std::vector<float> y = (ta * tb + tc).to_vector<float>();      // rows x cols, two broadcasts
  std::vector<float> e = exp(ta * 0.01).to_vector<float>();       // unary
  std::vector<float> rs = sum(ta, {1}).to_vector<float>();        // row sums
  std::vector<float> cs = sum(ta, {0}).to_vector<float>();        // column sums
  std::vector<float> flat = (tensor(a, {rows * cols}) + 1).to_vector<float>();  // one long run
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      ASSERT_EQ(y[i * cols + j], a[i * cols + j] * b[j] + c[i]);
      ASSERT_EQ(flat[i * cols + j], a[i * cols + j] + 1);
      ASSERT_FLOAT_EQ(e[i * cols + j], std::exp(a[i * cols + j] * 0.01f));
    }
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += a[i * cols + j];
    ASSERT_FLOAT_EQ(rs[i], static_cast<float>(s));
  }
  for (int64_t j = 0; j < cols; ++j) {
    double s = 0;
    for (int64_t i = 0; i < rows; ++i) s += a[i * cols + j];
    ASSERT_FLOAT_EQ(cs[j], static_cast<float>(s));
  }
}

TEST(Parallel, RandomDrawsDoNotDependOnTheThreadCount) {
  const int before = kernels::num_threads();
  kernels::set_num_threads(1);
  manual_seed(21);
  std::vector<float> one = randn({200000}).to_vector<float>();
  kernels::set_num_threads(std::max(2, before));
  manual_seed(21);
  std::vector<float> many = randn({200000}).to_vector<float>();
  kernels::set_num_threads(before);
  EXPECT_EQ(one, many);
}

// Pooling splits its planes across threads: every value, index and gradient must be the one
// the single-threaded kernel gives (ties and NaNs included, where the window order decides).
TEST(Parallel, PoolingDoesNotDependOnTheThreadCount) {
  const Shape shape{6, 40, 19, 21};  // 240 planes: several chunks for 3x3 and 2x2 windows
  std::vector<float> x(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 31) - 15;  // many ties
  for (size_t i = 0; i < x.size(); i += 997) x[i] = std::nanf("");
  auto run = [&](int threads) {
    kernels::set_num_threads(threads);
    std::vector<std::vector<float>> f;
    std::vector<int64_t> places;
    Tensor t = tensor(x, shape);
    t.requires_grad_();
    auto [mx, idx] = max_pool2d_with_indices(t, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true);
    Tensor av = avg_pool2d(t, {3, 2}, {2, 1}, {1, 1}, true, false);
    Tensor weights = tensor(std::vector<float>(static_cast<size_t>(shape_numel(mx.shape())), 0.5f), mx.shape());
    ((mx * weights).sum() + av.sum()).backward();
    f.push_back(mx.to_vector<float>());
    f.push_back(av.to_vector<float>());
    f.push_back(max_pool2d(t, {2, 2}).to_vector<float>());
    f.push_back(t.grad().to_vector<float>());
    places = idx.to_vector<int64_t>();
    return std::make_pair(f, places);
  };
  const int before = kernels::num_threads();
  auto one = run(1);
  auto many = run(std::max(2, before));
  kernels::set_num_threads(before);
  ASSERT_EQ(one.second, many.second);
  ASSERT_EQ(one.first.size(), many.first.size());
  for (size_t k = 0; k < one.first.size(); ++k) {
    ASSERT_EQ(one.first[k].size(), many.first[k].size()) << k;
    for (size_t i = 0; i < one.first[k].size(); ++i) {
      const float a = one.first[k][i], b = many.first[k][i];
      ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << "result " << k << " at " << i << ": " << a << " vs " << b;
    }
  }
}

}  // namespace lazyrt
