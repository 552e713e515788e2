#include <cstdlib>
#include "lazyrt/metrics.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "util/metrics_cells.h"

namespace lazyrt::metrics {
namespace {

using detail::CounterCell;
using detail::TimingCell;

// The lock guards the maps (creating cells, walking them), not the values in the cells.
struct Registry {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<CounterCell>, std::less<>> counters;
  std::map<std::string, std::unique_ptr<TimingCell>, std::less<>> timings;
  std::vector<detail::StepCells*> steps;  // executables' timed steps, in registration order
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: usable from static destructors
  return *r;
}

template <class Cell>
Cell* find(std::map<std::string, std::unique_ptr<Cell>, std::less<>>& m, std::string_view name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : it->second.get();
}

template <class Cell>
Cell& find_or_add(std::map<std::string, std::unique_ptr<Cell>, std::less<>>& m, std::string_view name) {
  auto it = m.find(name);
  if (it == m.end()) it = m.emplace(std::string(name), std::make_unique<Cell>()).first;
  return *it->second;
}

}  // namespace

std::vector<StepTiming> step_timings() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<detail::StepCells*> cells = r.steps;
  std::sort(cells.begin(), cells.end(), [](auto* a, auto* b) { return a->executable < b->executable; });
  std::vector<StepTiming> out;
  for (const detail::StepCells* c : cells)
    for (size_t i = 0; i < c->ops.size(); ++i) {
      const int64_t runs = c->runs[i].load(std::memory_order_relaxed);
      if (runs > 0)
        out.push_back({c->executable, static_cast<int64_t>(i), c->ops[i], c->bytes[i], runs,
                       c->total_ns[i].load(std::memory_order_relaxed), c->alone_runs[i].load(std::memory_order_relaxed),
                       c->alone_ns[i].load(std::memory_order_relaxed)});
    }
  return out;
}

namespace detail {

StepCells::StepCells(int64_t executable, std::vector<std::string> ops, std::vector<int64_t> bytes)
    : executable(executable), ops(std::move(ops)), bytes(std::move(bytes)),
      runs(new std::atomic<int64_t>[this->ops.size()]()), total_ns(new std::atomic<int64_t>[this->ops.size()]()),
      alone_runs(new std::atomic<int64_t>[this->ops.size()]()), alone_ns(new std::atomic<int64_t>[this->ops.size()]()) {}

void register_steps(StepCells* cells) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.steps.push_back(cells);
}

void unregister_steps(StepCells* cells) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.steps.erase(std::remove(r.steps.begin(), r.steps.end(), cells), r.steps.end());
}

CounterCell& counter_cell(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return find_or_add(r.counters, name);
}

TimingCell& timing_cell(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return find_or_add(r.timings, name);
}

}  // namespace detail

int64_t counter(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const CounterCell* c = find(r.counters, name);
  return c ? c->value.load() : 0;
}

int64_t timing_count(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const TimingCell* t = find(r.timings, name);
  return t ? t->count.load() : 0;
}

int64_t timing_total_ns(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const TimingCell* t = find(r.timings, name);
  return t ? t->total_ns.load() : 0;
}

void increment(std::string_view name, int64_t by) { detail::counter_cell(name).add(by); }

Counter::Counter(std::string_view name) : cell_(&detail::counter_cell(name)) {}
void Counter::add(int64_t by) { static_cast<detail::CounterCell*>(cell_)->add(by); }

void record_timing(std::string_view name, int64_t ns) { detail::timing_cell(name).record(ns); }

// Cells at zero (never touched, or reset) are left out.
std::string report() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::ostringstream os;
  os << "Counters:\n";
  for (const auto& [name, c] : r.counters)
    if (const int64_t v = c->value.load()) os << "  " << name << ": " << v << '\n';
  os << "Timings (count, total ms, mean us, max us):\n";
  for (const auto& [name, t] : r.timings) {
    int64_t count, total, max;
    {
      std::lock_guard<util::SpinLock> cell(t->mu);
      count = t->count.load();
      total = t->total_ns.load();
      max = t->max_ns.load();
    }
    if (!count) continue;
    double total_ms = static_cast<double>(total) / 1e6;
    double mean_us = static_cast<double>(total) / 1e3 / static_cast<double>(count);
    os << "  " << name << ": " << count << ", " << total_ms << " ms, " << mean_us << " us, "
       << static_cast<double>(max) / 1e3 << " us\n";
  }
  return os.str();
}

// Cells are zeroed, not removed: hot paths hold references to them.
void reset() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (detail::StepCells* c : r.steps)
    for (size_t i = 0; i < c->ops.size(); ++i) {
      c->runs[i] = 0;
      c->total_ns[i] = 0;
      c->alone_runs[i] = 0;
      c->alone_ns[i] = 0;
    }
  for (auto& [name, c] : r.counters) c->value = 0;
  for (auto& [name, t] : r.timings) {
    std::lock_guard<util::SpinLock> cell(t->mu);
    t->count = 0;
    t->total_ns = 0;
    t->max_ns = 0;
  }
}

namespace detail {

std::atomic<bool>& kernel_timings_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("LAZYRT_KERNEL_TIMINGS");
    return env && std::string_view(env) == "1";
  }()};
  return on;
}

std::atomic<bool>& kernel_timings_alone_flag() {
  static std::atomic<bool> on{false};
  return on;
}

}  // namespace detail

void set_kernel_timings(bool on, bool alone) {
  detail::kernel_timings_alone_flag().store(on && alone, std::memory_order_relaxed);
  detail::kernel_timings_flag().store(on, std::memory_order_relaxed);
}
bool kernel_timings() { return detail::kernel_timings_flag().load(std::memory_order_relaxed); }

}  // namespace lazyrt::metrics
