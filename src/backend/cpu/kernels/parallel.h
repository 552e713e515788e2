// Kernels over large tensors run on several threads. parallel_for splits [0, n) into chunks of
// at least `grain` items, taken through an atomic counter by the calling thread and the others;
// below two chunks, or while another thread's call is running, it runs inline. A chunk that
// throws stops the call and its exception reaches the caller. Nothing allocates per call, so
// executables stay allocation-free.
//
// LAZYRT_NUM_THREADS threads in all (the caller included), by default one per hardware thread.
// They are the calling thread's OpenMP team, the threads oneDNN's kernels run on too; a forked
// child and ThreadSanitizer builds use a pool of lazyrt's own instead (parallel.cpp says why).
#pragma once

#include <cstdint>

namespace lazyrt::kernels {

/// Elements below which an elementwise kernel stays on one thread.
inline constexpr int64_t kParallelGrain = 32768;

int num_threads();
void set_num_threads(int n);
/// False in a forked child and in ThreadSanitizer builds, which run on lazyrt's own pool.
bool runs_on_openmp_team();

/// While alive, the OpenMP team that oneDNN's kernels run on has n threads (one in a process
/// forked after lazyrt's kernels ran: parallel.cpp says why); then it is as it was, so that the
/// process's own OpenMP setting (PyTorch's, for one) is left alone.
class OmpTeam {
 public:
  explicit OmpTeam(int n);
  ~OmpTeam();
  OmpTeam(const OmpTeam&) = delete;
  OmpTeam& operator=(const OmpTeam&) = delete;

 private:
  int before_;
  int levels_before_ = -1;  // a forked child: the active levels it allowed (parallel.cpp)
};

namespace detail {
using ChunkFn = void (*)(const void* ctx, int64_t begin, int64_t end);
void run_parallel(int64_t n, int64_t grain, ChunkFn fn, const void* ctx);
}  // namespace detail

/// fn(begin, end) over disjoint chunks covering [0, n).
template <class F>
void parallel_for(int64_t n, int64_t grain, const F& fn) {
  if (n <= 0) return;
  if (n < 2 * grain || num_threads() == 1) {
    fn(int64_t{0}, n);
    return;
  }
  detail::run_parallel(
      n, grain, [](const void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); }, &fn);
}

}  // namespace lazyrt::kernels
