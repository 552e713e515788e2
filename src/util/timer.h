// Records the time from construction to destruction into a metrics timing.
#pragma once

#include <chrono>

#include "util/metrics_cells.h"

namespace lazyrt::detail {

class ScopedTimer {
 public:
  /// `cell`: from metrics::detail::timing_cell(name), resolved once by the caller.
  explicit ScopedTimer(metrics::detail::TimingCell& cell)
      : cell_(cell), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    cell_.record(std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - start_)
                     .count());
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  metrics::detail::TimingCell& cell_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace lazyrt::detail
