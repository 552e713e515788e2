#include "lazyrt/metrics.h"

#include <map>
#include <mutex>
#include <sstream>

namespace lazyrt::metrics {
namespace {

struct Timing {
  int64_t count = 0;
  int64_t total_ns = 0;
  int64_t max_ns = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, int64_t, std::less<>> counters;
  std::map<std::string, Timing, std::less<>> timings;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: usable from static destructors
  return *r;
}

}  // namespace

int64_t counter(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.counters.find(name);
  return it == r.counters.end() ? 0 : it->second;
}

int64_t timing_count(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.timings.find(name);
  return it == r.timings.end() ? 0 : it->second.count;
}

int64_t timing_total_ns(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.timings.find(name);
  return it == r.timings.end() ? 0 : it->second.total_ns;
}

void increment(std::string_view name, int64_t by) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.counters.find(name);
  if (it == r.counters.end()) it = r.counters.emplace(std::string(name), 0).first;
  it->second += by;
}

void record_timing(std::string_view name, int64_t ns) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.timings.find(name);
  if (it == r.timings.end()) it = r.timings.emplace(std::string(name), Timing{}).first;
  it->second.count += 1;
  it->second.total_ns += ns;
  if (ns > it->second.max_ns) it->second.max_ns = ns;
}

std::string report() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::ostringstream os;
  os << "Counters:\n";
  for (const auto& [name, v] : r.counters) os << "  " << name << ": " << v << '\n';
  os << "Timings (count, total ms, mean us, max us):\n";
  for (const auto& [name, t] : r.timings) {
    double total_ms = static_cast<double>(t.total_ns) / 1e6;
    double mean_us = t.count ? static_cast<double>(t.total_ns) / 1e3 / static_cast<double>(t.count) : 0;
    os << "  " << name << ": " << t.count << ", " << total_ms << " ms, " << mean_us << " us, "
       << static_cast<double>(t.max_ns) / 1e3 << " us\n";
  }
  return os.str();
}

void reset() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.counters.clear();
  r.timings.clear();
}

}  // namespace lazyrt::metrics
