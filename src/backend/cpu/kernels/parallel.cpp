#include "backend/cpu/kernels/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "util/denormals.h"

extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int n);
extern "C" int omp_get_max_active_levels();
extern "C" void omp_set_max_active_levels(int levels);
// GNU OpenMP's entry for a parallel region (what `#pragma omp parallel` compiles to): fn(data)
// on a team of num_threads, the caller included; it returns when all are done.
extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);

// ThreadSanitizer does not see libgomp's synchronisation: sanitized builds run kernels on the
// pool below, whose locks it sees.
#if defined(__SANITIZE_THREAD__)
#define LAZYRT_OWN_POOL_ONLY 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LAZYRT_OWN_POOL_ONLY 1
#endif
#endif
#ifndef LAZYRT_OWN_POOL_ONLY
#define LAZYRT_OWN_POOL_ONLY 0
#endif

namespace lazyrt::kernels {
namespace {

// One parallel_for: [0, n) in `count` chunks, taken through an atomic counter by whichever
// threads run it. A chunk that throws stops the job (the chunks not yet taken are skipped) and
// its exception reaches the caller once every thread is done.
class Job {
 public:
  Job(int64_t n, int64_t grain, int threads, detail::ChunkFn fn, const void* ctx)
      : fn_(fn), ctx_(ctx), n_(n), count_(std::min<int64_t>(n / grain, static_cast<int64_t>(threads) * 4)) {}

  void take_chunks() noexcept {
    const util::FlushDenormals flushed;  // on the threads that help, as on the caller's
    for (int64_t c; (c = next_.fetch_add(1)) < count_;) {
      // In 128 bits: n_ * (c + 1) may pass 2^63 for the largest tensors.
      const auto begin = static_cast<int64_t>(static_cast<__int128>(n_) * c / count_);
      const auto end = static_cast<int64_t>(static_cast<__int128>(n_) * (c + 1) / count_);
      try {
        fn_(ctx_, begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu_);
        if (!error_) error_ = std::current_exception();
        next_.store(count_);
      }
    }
  }
  // After every thread is done.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  detail::ChunkFn fn_;
  const void* ctx_;
  int64_t n_, count_;
  std::atomic<int64_t> next_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

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

// lazyrt's own threads, used where OpenMP's team cannot be (a forked child, sanitized builds:
// see run_parallel). Workers sleep until a job is posted, then take its chunks with the caller.
// A step's kernels come one after another, microseconds apart, and waking a sleeping thread
// costs tens of microseconds (more in a virtual machine): so a worker that finished a job
// watches for the next one for kSpin before it sleeps, and the caller watches for the workers
// to finish for as long before it sleeps on them.
class Pool {
 public:
  explicit Pool(int threads) { resize(threads); }
  ~Pool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    std::lock_guard<std::mutex> busy(busy_);
    if (threads == size()) return;
    stop();
    quit_ = false;
    // A new worker waits for the next job, not the last one (its Job is gone).
    const uint64_t seen = generation_.load();
    for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, seen] { work(seen); });
  }

  // False when another thread is using the pool: the caller then runs the range itself.
  bool run(Job& job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || workers_.empty()) return false;
    const int workers = static_cast<int>(workers_.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      done_.store(0);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job.take_chunks();
    if (!spin_until([&] { return done_.load(std::memory_order_acquire) == workers; })) {
      std::unique_lock<std::mutex> lock(mu_);
      finished_.wait(lock, [&] { return done_.load() == workers; });
    }
    return true;
  }

 private:
  void work(uint64_t seen) {
    while (true) {
      if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return quit_ || generation_.load() != seen; });
      }
      Job* job;
      {
        std::lock_guard<std::mutex> lock(mu_);  // the job's pointer, written under it
        if (quit_) return;
        seen = generation_.load();
        job = job_;
      }
      job->take_chunks();
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
  Job* job_ = nullptr;
};

int default_threads() {
  if (const char* env = std::getenv("LAZYRT_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::atomic<int>& thread_count() {
  static std::atomic<int> n{default_threads()};
  return n;
}

// fork(): the child has none of the parent's threads. GNU OpenMP keeps its team across a fork,
// so a forked child's parallel region waits forever for threads that are not there; a pool
// inherited from the parent would too. A forked child therefore runs kernels on a pool of its
// own, made on its first parallel kernel (the parent's, if it had one, is left untouched: its
// threads, its locks, possibly held at the fork), and runs oneDNN's kernels on one thread, the
// caller (OmpTeam).
std::atomic<Pool*> current_pool{nullptr};
std::mutex making_pool;  // held around fork(), so that the child's copy is unlocked
std::atomic<bool> forked_child{false};

void before_fork() { making_pool.lock(); }
void after_fork_in_parent() { making_pool.unlock(); }
void after_fork_in_child() {
  current_pool.store(nullptr, std::memory_order_relaxed);
  forked_child.store(true, std::memory_order_relaxed);
  making_pool.unlock();
}
[[maybe_unused]] const bool fork_handlers = (pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child), true);

Pool& pool() {
  Pool* p = current_pool.load(std::memory_order_acquire);
  if (p) [[likely]] return *p;
  std::lock_guard<std::mutex> lock(making_pool);
  p = current_pool.load(std::memory_order_relaxed);
  if (!p) {
    p = new Pool(thread_count().load());  // never destroyed: workers may outlive statics
    current_pool.store(p, std::memory_order_release);
  }
  return *p;
}

bool own_pool() { return LAZYRT_OWN_POOL_ONLY || forked_child.load(std::memory_order_relaxed); }

// Elsewhere the kernels run on the OpenMP team of the calling thread, the one oneDNN's
// convolutions (and, in a PyTorch process, PyTorch's kernels) run on. Two sets of threads
// would take turns: each team's workers keep their CPUs busy for a while after a region, so as
// to start the next one at once, and on a machine with no spare cores the other's next kernel
// waits for that. One call at a time, as on the pool: OpenMP gives every calling thread a team
// of its own, and two at once would oversubscribe the CPUs.
std::mutex omp_busy;

void omp_region(void* job) { static_cast<Job*>(job)->take_chunks(); }

bool run_on_omp_team(Job& job, int threads) {
  std::unique_lock<std::mutex> busy(omp_busy, std::try_to_lock);
  if (!busy.owns_lock()) return false;
  GOMP_parallel(omp_region, &job, static_cast<unsigned>(threads), 0);
  return true;
}

}  // namespace

int num_threads() { return thread_count().load(std::memory_order_relaxed); }
bool runs_on_openmp_team() { return !own_pool(); }
void set_num_threads(int n) {
  n = std::max(n, 1);
  thread_count().store(n);
  if (Pool* p = current_pool.load(std::memory_order_acquire)) p->resize(n);
}

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
  const int threads = num_threads();
  Job job(n, grain, threads, fn, ctx);
  const bool ran = own_pool() ? pool().run(job) : run_on_omp_team(job, threads);
  if (ran)
    job.rethrow();
  else
    fn(ctx, 0, n);
}
}  // namespace detail

}  // namespace lazyrt::kernels
