#include "backend/cpu/kernels/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int n);
extern "C" int omp_get_max_active_levels();
extern "C" void omp_set_max_active_levels(int levels);

namespace lazyrt::kernels {
namespace {

constexpr auto kSpin = std::chrono::microseconds(50);

// Whether done() became true within kSpin. Between checks the thread yields its CPU, so that
// another thread ready to run there (a BLAS or OpenMP worker of the next kernel) is not kept
// waiting by the watch.
template <class Done>
bool spin_until(const Done& done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return done();
    std::this_thread::yield();
  }
  return true;
}

// Workers sleep until a job is posted; a job is a chunked range that workers and the caller
// take chunks of through an atomic counter until none are left. A step's kernels come one
// after another, microseconds apart, and waking a sleeping thread costs tens of microseconds
// (more in a virtual machine): so a worker that finished a job watches for the next one for
// kSpin before it sleeps, and the caller watches for the workers to finish for as long before
// it sleeps on them.
class Pool {
 public:
  explicit Pool(int threads) { resize(threads); }
  ~Pool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    std::lock_guard<std::mutex> busy(busy_);
    stop();
    quit_ = false;
    for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { work(); });
  }

  // False when another thread is using the pool: the caller then runs the range itself.
  bool run(int64_t n, int64_t grain, detail::ChunkFn fn, const void* ctx) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || workers_.empty()) return false;
    const int64_t chunks = std::min<int64_t>(n / grain, static_cast<int64_t>(size()) * 4);
    const int workers = static_cast<int>(workers_.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = fn;
      ctx_ = ctx;
      n_ = n;
      chunks_ = chunks;
      next_.store(0);
      done_.store(0);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    take_chunks();
    if (!spin_until([&] { return done_.load(std::memory_order_acquire) == workers; })) {
      std::unique_lock<std::mutex> lock(mu_);
      finished_.wait(lock, [&] { return done_.load() == workers; });
    }
    return true;
  }

 private:
  void take_chunks() {
    for (int64_t c; (c = next_.fetch_add(1)) < chunks_;) {
      // In 128 bits: n_ * (c + 1) may pass 2^63 for the largest tensors.
      const auto begin = static_cast<int64_t>(static_cast<__int128>(n_) * c / chunks_);
      const auto end = static_cast<int64_t>(static_cast<__int128>(n_) * (c + 1) / chunks_);
      fn_(ctx_, begin, end);
    }
  }

  void work() {
    uint64_t seen = 0;
    while (true) {
      if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return quit_ || generation_.load() != seen; });
      }
      {
        std::lock_guard<std::mutex> lock(mu_);  // the job's fields, written under it
        if (quit_) return;
        seen = generation_.load();
      }
      take_chunks();
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.fetch_add(1, std::memory_order_release);
      }
      finished_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::mutex busy_;  // one job at a time
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::vector<std::thread> workers_;
  bool quit_ = false;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> done_{0};
  detail::ChunkFn fn_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t n_ = 0, chunks_ = 0;
  std::atomic<int64_t> next_{0};
};

int default_threads() {
  if (const char* env = std::getenv("LAZYRT_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// The process's pool, made by its first use; never destroyed: workers may outlive statics.
// fork(): the child has none of the parent's threads, so a pool it inherited would wait for
// workers that never come. The child leaves that pool (its threads, its locks, possibly held
// at the fork) untouched and makes one of its own, of the same size, on its first parallel
// kernel. GNU OpenMP, which oneDNN's kernels run on, has the same flaw and no such remedy: a
// forked child's parallel region waits forever for the parent's team. So in a child the
// OpenMP team of lazyrt's kernels is one thread, the caller (OmpTeam).
std::atomic<Pool*> current_pool{nullptr};
std::mutex making_pool;  // held around fork(), so that the child's copy is unlocked
int inherited_threads = 0;  // the child's pool size: its parent's
std::atomic<bool> forked_child{false};

void before_fork() { making_pool.lock(); }
void after_fork_in_parent() { making_pool.unlock(); }
void after_fork_in_child() {
  if (Pool* p = current_pool.load(std::memory_order_relaxed)) inherited_threads = p->size();
  current_pool.store(nullptr, std::memory_order_relaxed);
  forked_child.store(true, std::memory_order_relaxed);
  making_pool.unlock();
}

Pool& pool() {
  Pool* p = current_pool.load(std::memory_order_acquire);
  if (p) [[likely]] return *p;
  static const bool fork_handlers = (pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child), true);
  (void)fork_handlers;
  std::lock_guard<std::mutex> lock(making_pool);
  p = current_pool.load(std::memory_order_relaxed);
  if (!p) {
    p = new Pool(inherited_threads > 0 ? inherited_threads : default_threads());
    current_pool.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

int num_threads() { return pool().size(); }
void set_num_threads(int n) { pool().resize(n); }

OmpTeam::OmpTeam(int n) : before_(omp_get_max_threads()) {
  if (forked_child.load(std::memory_order_relaxed)) {
    // No active parallel region at all (see current_pool): a oneDNN primitive made in the
    // parent asks for its team's size of then.
    n = 1;
    levels_before_ = omp_get_max_active_levels();
    omp_set_max_active_levels(0);
  }
  if (n != before_) omp_set_num_threads(n);
}
OmpTeam::~OmpTeam() {
  if (omp_get_max_threads() != before_) omp_set_num_threads(before_);
  if (levels_before_ >= 0) omp_set_max_active_levels(levels_before_);
}

namespace detail {
void run_parallel(int64_t n, int64_t grain, ChunkFn fn, const void* ctx) {
  if (!pool().run(n, grain, fn, ctx)) fn(ctx, 0, n);
}
}  // namespace detail

}  // namespace lazyrt::kernels
