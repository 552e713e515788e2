// Counters and timings in the style of PyTorch/XLA's metrics. Thread-safe.
//
// Counters: UncachedCompile (a graph was compiled), CachedCompile (found in memory),
//           PersistentCacheHit / PersistentCacheMiss / PersistentCacheDeserializeFailure (one
//           of them per lookup on disk; a hit is not an UncachedCompile), ExecuteGraph,
//           ReplayGraph, MemoryCacheEvictions (an executable the in-memory cache's caps
//           dropped), CompiledStepVariantEvictions (a compiled step's variant its caps dropped),
//           LibraryKernels (a kernel made through a library: oneDNN's convolutions),
//           PolymorphicGraph (a sync run, or a compiled step's variant made, on a bucket graph
//           of dims marked dynamic), PolymorphicRefused (one that could not be: compiled as traced).
// Timings:  TraceTime (graph extraction and hashing at a sync), CompileTime (everything after
//           an in-memory miss: loading from disk, or compiling and storing), ExecuteTime.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lazyrt::metrics {

/// The value of a counter; 0 when it was never touched.
int64_t counter(std::string_view name);
/// How many times a timing was recorded, and their total in nanoseconds.
int64_t timing_count(std::string_view name);
int64_t timing_total_ns(std::string_view name);
/// Every counter and timing, one per line, sorted by name.
std::string report();
/// Sets every counter and timing back to zero.
void reset();

/// Adds `by` to a counter (front ends count what they do).
void increment(std::string_view name, int64_t by = 1);
/// A counter found once by name, for counting on a hot path: add() is one atomic add. Valid for
/// the life of the process.
class Counter {
 public:
  explicit Counter(std::string_view name);
  void add(int64_t by = 1);

 private:
  void* cell_;
};

/// Kernel timings: while on, every kernel an executable runs records a timing named
/// `Kernel:<op>` (`Kernel:fusion` for a fused node; a loop's covers its body's kernels, which
/// record their own too). Off by default, or on from the start with LAZYRT_KERNEL_TIMINGS=1;
/// off, it costs one flag read per executable run.
///
/// alone: each step is also timed on its own. After its timed run, a step that writes no byte
/// it reads (and is not a collective or a loop) runs kAloneRuns times more on the same
/// operands, each run timed into its alone figures (StepTiming): the kernel with its operands
/// in cache, as a limit measured alone has them, where the step's own time includes what the
/// kernels before it left in cache. Those runs compute the same values again; the step's
/// results are as without them.
inline constexpr int kAloneRuns = 3;
void set_kernel_timings(bool on, bool alone = false);
bool kernel_timings();

/// One step of an executable, timed while kernel timings are on: the executable (numbered in
/// the order executables were made), the step's place in it, its op (`fusion` for a fused node),
/// the bytes its operands and results hold (what the step must read and write at least), how
/// many runs were timed since the last reset() and their total.
struct StepTiming {
  int64_t executable = 0;
  int64_t step = 0;
  std::string op;
  int64_t bytes = 0;
  int64_t runs = 0;
  int64_t total_ns = 0;
  int64_t alone_runs = 0;  // runs on its own (set_kernel_timings(on, alone)), and their total
  int64_t alone_ns = 0;
};
/// Every timed step of the executables alive now, by executable and step.
std::vector<StepTiming> step_timings();

}  // namespace lazyrt::metrics
