// Records the time from construction to destruction under a metrics timing name.
#pragma once

#include <chrono>
#include <string_view>

#include "lazyrt/metrics.h"

namespace lazyrt::detail {

class ScopedTimer {
 public:
  explicit ScopedTimer(std::string_view name)
      : name_(name), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start_)
                  .count();
    metrics::record_timing(name_, ns);
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  std::string_view name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace lazyrt::detail
