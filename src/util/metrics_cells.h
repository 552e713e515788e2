// The cells behind the metrics: one per counter or timing name, created on first use and
// never freed, so a hot path resolves its cell once and then records with a few atomic adds,
// without the registry's lock or a name lookup.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "lazyrt/metrics.h"
#include "util/spin_lock.h"

namespace lazyrt::metrics {

// Recording, by the runtime (the public lazyrt/metrics.h reads, and has increment()).
void record_timing(std::string_view name, int64_t nanoseconds);

namespace detail {

struct CounterCell {
  std::atomic<int64_t> value{0};
  void add(int64_t by) { value.fetch_add(by, std::memory_order_relaxed); }
};

// A timing's three figures change together, under `mu`: a reset() or a report between a
// record's updates would otherwise see (or leave) a count without its time, and report a mean
// or a total of runs that were reset. Single figures may be read without it.
struct TimingCell {
  util::SpinLock mu;
  std::atomic<int64_t> count{0}, total_ns{0}, max_ns{0};
  void record(int64_t ns) {
    std::lock_guard<util::SpinLock> lock(mu);
    count.store(count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    total_ns.store(total_ns.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
    if (ns > max_ns.load(std::memory_order_relaxed)) max_ns.store(ns, std::memory_order_relaxed);
  }
};

/// The cell of `name`, created (at zero) on first use; the reference stays valid forever.
CounterCell& counter_cell(std::string_view name);
TimingCell& timing_cell(std::string_view name);

/// The steps of one executable, timed one by one while kernel timings are on
/// (metrics::step_timings): made and registered by the executable on its first timed run,
/// unregistered by its destructor.
struct StepCells {
  int64_t executable = 0;
  std::vector<std::string> ops;
  std::vector<int64_t> bytes;
  std::unique_ptr<std::atomic<int64_t>[]> runs, total_ns, alone_runs, alone_ns;
  StepCells(int64_t executable, std::vector<std::string> ops, std::vector<int64_t> bytes);
  void record(size_t step, int64_t ns) {
    runs[step].fetch_add(1, std::memory_order_relaxed);
    total_ns[step].fetch_add(ns, std::memory_order_relaxed);
  }
  void record_alone(size_t step, int64_t ns) {
    alone_runs[step].fetch_add(1, std::memory_order_relaxed);
    alone_ns[step].fetch_add(ns, std::memory_order_relaxed);
  }
};
void register_steps(StepCells* cells);
void unregister_steps(StepCells* cells);

/// lazyrt::metrics::kernel_timings()'s flag, for hot paths, and whether steps are also timed
/// alone.
std::atomic<bool>& kernel_timings_flag();
std::atomic<bool>& kernel_timings_alone_flag();

}  // namespace detail
}  // namespace lazyrt::metrics
