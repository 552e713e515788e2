// while_loop against the unrolled host loop, the 1M-iteration scalar loop target, and the
// same scalar loop in libtorch (when built with it). Prints a markdown report to stdout.
//
// Usage: while_loop_bench [--reps R]   (R timed repetitions per cell, default 5)
//
// Every cell reports the median of R timed repetitions and their spread [min, max]; one
// warm-up repetition before them is not counted. Exit status 1 when the two forms, or lazyrt
// and libtorch, disagree; a missed speed target is reported, not an error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include <lazyrt/lazyrt.h>

#ifdef LAZYRT_BENCH_HAVE_TORCH
#include "torch_peer.h"
#endif

namespace {

using namespace lazyrt;
using Clock = std::chrono::steady_clock;

// ---- workload of the table -------------------------------------------------------------
constexpr int64_t kRows = 8, kDim = 32;
const std::vector<int64_t> kSizes = {10, 100, 1000, 10000};
// The unrolled form is left out at the next N once one repetition is projected to take longer.
constexpr double kUnrolledBudgetSeconds = 20;
// ---- scalar loop ------------------------------------------------------------------------
constexpr int64_t kTargetIterations = 1000000;
constexpr double kTargetNsPerIteration = 100;
constexpr int64_t kTorchIterations = 100000;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// CPU time of the calling thread: unlike wall time, it does not grow while other processes
// hold the CPU, so it tells a slow loop from a busy machine.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// "1-, 5- and 15-minute load averages" from /proc/loadavg, or "unknown".
std::string load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "unknown";
  double a = 0, b = 0, c = 0;
  const int got = std::fscanf(f, "%lf %lf %lf", &a, &b, &c);
  std::fclose(f);
  if (got != 3) return "unknown";
  return fmt("%.2f", a) + " " + fmt("%.2f", b) + " " + fmt("%.2f", c);
}

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {median, v.front(), v.back()};
}

// Three significant digits or more, without exponents: 0.0512, 1.23, 45.6, 1234.
std::string num(double v) {
  const double a = std::fabs(v);
  return fmt(a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : "%.3g", v);
}

// "1.23 [1.20, 1.31]": median [min, max]. Values that do not vary (node counts, bytes) print
// once.
std::string cell(const Stats& s, const char* f = nullptr) {
  auto show = [f](double v) { return f ? fmt(f, v) : num(v); };
  if (s.min == s.max) return show(s.median);
  return show(s.median) + " [" + show(s.min) + ", " + show(s.max) + "]";
}

std::string cell(const std::vector<double>& v, const char* f = nullptr) { return cell(stats(v), f); }

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "while_loop_bench: %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

// ---- 1. while_loop versus the unrolled host loop -----------------------------------------

struct Workload {
  Tensor w, b, x0, c0;
};

Workload make_workload() {
  std::vector<float> w(kDim * kDim), b(kDim), x(kRows * kDim);
  for (int64_t i = 0; i < kDim * kDim; ++i)
    w[i] = 0.9f / std::sqrt(static_cast<float>(kDim)) * std::sin(0.7f * static_cast<float>(i) + 0.3f);
  for (int64_t i = 0; i < kDim; ++i) b[i] = 0.05f * std::cos(static_cast<float>(i));
  for (int64_t i = 0; i < kRows * kDim; ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  return {tensor(w, {kDim, kDim}), tensor(b, {kDim}), tensor(x, {kRows, kDim}),
          scalar_tensor(0, DType::i64)};
}

Tensor layer(const Tensor& x, const Workload& wl) { return tanh(matmul(x, wl.w) + wl.b); }

// One cold run: the compile cache is cleared first, so the run traces, compiles and executes.
struct Run {
  double nodes = 0, trace_ms = 0, compile_ms = 0, execute_ms = 0, total_ms = 0, peak_kib = 0;
  std::vector<float> x;
  int64_t counter = 0;
};

using LoopForm = std::function<std::pair<Tensor, Tensor>(int64_t n, const Workload&)>;

std::pair<Tensor, Tensor> host_loop(int64_t n, const Workload& wl) {
  Tensor x = wl.x0, c = wl.c0;
  for (int64_t i = 0; i < n; ++i) {
    x = layer(x, wl);
    c = c + 1;
  }
  return {x, c};
}

std::pair<Tensor, Tensor> structured_loop(int64_t n, const Workload& wl) {
  Tensor limit = scalar_tensor(static_cast<double>(n), DType::i64);
  Carry out = while_loop([&](const Carry& c) { return c[0] < limit; },
                         [&](const Carry& c) { return Carry{c[0] + 1, layer(c[1], wl)}; },
                         {wl.c0, wl.x0});
  return {out[1], out[0]};
}

Run run_cold(const LoopForm& form, int64_t n, const Workload& wl) {
  Run r;
  cache::clear_memory();
  metrics::reset();
  debug::reset_peak_memory();
  const int64_t live_before = debug::live_memory_bytes();
  auto t0 = Clock::now();
  auto [x, c] = form(n, wl);
  const double record_ms = seconds_since(t0) * 1e3;
  r.nodes = static_cast<double>(debug::graph_node_count({x, c}));  // not timed
  t0 = Clock::now();
  mark_step();
  r.total_ms = record_ms + seconds_since(t0) * 1e3;
  r.peak_kib = static_cast<double>(debug::peak_memory_bytes() - live_before) / 1024;
  r.trace_ms = record_ms + static_cast<double>(metrics::timing_total_ns("TraceTime")) / 1e6;
  r.compile_ms = static_cast<double>(metrics::timing_total_ns("CompileTime")) / 1e6;
  r.execute_ms = static_cast<double>(metrics::timing_total_ns("ExecuteTime")) / 1e6;
  if (metrics::counter("UncachedCompile") != 1) fail("a cold run did not compile exactly once");
  r.x = x.to_vector<float>();
  r.counter = static_cast<int64_t>(c.item());
  return r;
}

struct Cell {
  std::vector<double> nodes, trace_ms, compile_ms, execute_ms, total_ms, peak_kib;
  void add(const Run& r) {
    nodes.push_back(r.nodes);
    trace_ms.push_back(r.trace_ms);
    compile_ms.push_back(r.compile_ms);
    execute_ms.push_back(r.execute_ms);
    total_ms.push_back(r.total_ms);
    peak_kib.push_back(r.peak_kib);
  }
};

void print_row(int64_t n, const char* form, const Cell& c) {
  std::printf("| %lld | %s | %s | %s | %s | %s | %s | %s |\n", static_cast<long long>(n), form,
              cell(c.nodes, "%.0f").c_str(), cell(c.trace_ms).c_str(), cell(c.compile_ms).c_str(),
              cell(c.execute_ms).c_str(), cell(c.total_ms).c_str(), cell(c.peak_kib, "%.1f").c_str());
}

void compare_forms(int reps) {
  const Workload wl = make_workload();
  std::printf(
      "## 1. while_loop versus the unrolled host loop\n\n"
      "Workload: `x <- tanh(matmul(x, W) + b)` and `c <- c + 1`, N times; x f32[%lld, %lld], "
      "W f32[%lld, %lld], b f32[%lld], c i64[] starting at 0; inputs are device data with "
      "W[i, j] = 0.9 / sqrt(32) * sin(0.7 * (32 i + j) + 0.3), b[j] = 0.05 * cos(j), "
      "x[r, j] = sin(0.37 * (32 r + j)).\n\n"
      "- **host loop**: a C++ `for` loop over the tensor ops, then `mark_step()`; the graph grows "
      "with N.\n"
      "- **while_loop**: `while_loop(c < limit, body)` with `limit` an i64 tensor input; the "
      "graph is the same for every N.\n\n"
      "Each row: %d timed cold runs after 1 warm-up run (not counted), median [min, max]. A cold "
      "run clears the compile cache first, so it traces, compiles and executes. trace = "
      "recording the ops + graph extraction and hashing; compile = `CompileTime`; execute = "
      "`ExecuteTime`; total = wall time from the first op to the synced result (graph node "
      "counting excluded). Peak memory: lazyrt device buffers (tensor data, arenas, constants) "
      "allocated above what was live before the run. Results of the two forms are checked equal "
      "(x within 1e-5, counter exact) before anything is reported.\n\n",
      static_cast<long long>(kRows), static_cast<long long>(kDim), static_cast<long long>(kDim),
      static_cast<long long>(kDim), static_cast<long long>(kDim), reps);
  std::printf("| N | form | graph nodes | trace ms | compile ms | execute ms | total ms | peak memory KiB |\n"
              "|---:|---|---:|---:|---:|---:|---:|---:|\n");
  std::optional<std::pair<int64_t, double>> last_host;  // N, median total seconds
  std::string skipped, summary;
  for (int64_t n : kSizes) {
    const double projected = last_host ? last_host->second * 1.5 * static_cast<double>(n) /
                                             static_cast<double>(last_host->first)
                                       : 0;
    const bool with_host = projected <= kUnrolledBudgetSeconds;
    if (!with_host && skipped.empty())
      skipped = "The host loop was left out from N = " + std::to_string(n) + ": one run was projected to take " +
                fmt("%.1f", projected) + " s, over the budget of " + fmt("%.0f", kUnrolledBudgetSeconds) +
                " s.\n";
    // Warm-up (BLAS set-up, page faults, allocator), then the check of both forms.
    const Run loop_check = run_cold(structured_loop, n, wl);
    if (loop_check.counter != n) fail("while_loop counter is " + std::to_string(loop_check.counter));
    if (with_host) {
      const Run host_check = run_cold(host_loop, n, wl);
      if (host_check.counter != n) fail("host loop counter is " + std::to_string(host_check.counter));
      for (size_t i = 0; i < host_check.x.size(); ++i)
        if (std::fabs(host_check.x[i] - loop_check.x[i]) > 1e-5f)
          fail("at N = " + std::to_string(n) + " x[" + std::to_string(i) + "] differs: host " +
               std::to_string(host_check.x[i]) + ", while_loop " + std::to_string(loop_check.x[i]));
    }
    Cell host, loop;
    for (int r = 0; r < reps; ++r) {  // interleaved, so drifting machine load hits both forms
      if (with_host) host.add(run_cold(host_loop, n, wl));
      loop.add(run_cold(structured_loop, n, wl));
    }
    if (with_host) {
      print_row(n, "host loop", host);
      last_host = {n, stats(host.total_ms).median / 1e3};
      auto ratio = [](const std::vector<double>& a, const std::vector<double>& b) {
        return num(stats(a).median / stats(b).median);
      };
      summary = "At N = " + std::to_string(n) + " the unrolled host loop has " +
                ratio(host.nodes, loop.nodes) + "x the graph nodes of the while_loop, compiles " +
                ratio(host.compile_ms, loop.compile_ms) + "x longer, and takes " +
                ratio(host.total_ms, loop.total_ms) + "x the total time (medians).\n";
    } else {
      std::printf("| %lld | host loop | skipped | | | | | |\n", static_cast<long long>(n));
    }
    print_row(n, "while_loop", loop);
  }
  std::printf("\n%s%s\n", summary.c_str(), skipped.c_str());
}

// ---- 2. the scalar loop: 1M-iteration target and the libtorch peer ----------------------

struct ScalarRun {
  double total_s = 0, execute_s = 0, sync_cpu_s = 0;
  int64_t counter = 0;
  double x = 0;
};

// c = 0 (i64), x = 0 (f32); while c < n: c = c + 1; x = x + 1. The compile cache stays on:
// after the warm-up, every run is a cache hit and executes the compiled loop.
ScalarRun scalar_loop(int64_t n) {
  metrics::reset();
  const auto t0 = Clock::now();
  Tensor limit = scalar_tensor(static_cast<double>(n), DType::i64);
  Carry out = while_loop([&](const Carry& c) { return c[0] < limit; },
                         [](const Carry& c) { return Carry{c[0] + 1, c[1] + 1}; },
                         {scalar_tensor(0, DType::i64), scalar_tensor(0, DType::f32)});
  const double cpu0 = thread_cpu_seconds();
  sync(out);
  ScalarRun r;
  r.sync_cpu_s = thread_cpu_seconds() - cpu0;
  r.total_s = seconds_since(t0);
  r.execute_s = static_cast<double>(metrics::timing_total_ns("ExecuteTime")) / 1e9;
  r.counter = static_cast<int64_t>(out[0].item());
  r.x = out[1].item();
  return r;
}

void check_scalar(const char* who, int64_t n, int64_t counter, double x) {
  if (counter != n || x != static_cast<double>(n))
    fail(std::string(who) + ": the scalar loop of " + std::to_string(n) + " iterations gave c = " +
         std::to_string(counter) + ", x = " + std::to_string(x));
}

double scalar_target(int reps) {
  const int64_t n = kTargetIterations;
  std::printf(
      "## 2. Target: a while_loop of %lld scalar iterations\n\n"
      "Workload: carries c i64[] = 0 and x f32[] = 0; cond `c < limit` (limit an i64 tensor "
      "input = %lld); body `(c + 1, x + 1)`. 1 warm-up run (it compiles; not counted), then %d "
      "timed runs, each a compile-cache hit; results checked (c = x = %lld) on every run. "
      "execute = `ExecuteTime` (the compiled loop); end to end = tracing the loop, hashing, "
      "cache lookup, executing and binding the results. Target: execute <= %.0f ns per "
      "iteration, i.e. under %.1f s in all.\n\n",
      static_cast<long long>(n), static_cast<long long>(n), reps, static_cast<long long>(n),
      kTargetNsPerIteration, kTargetNsPerIteration * static_cast<double>(n) / 1e9);
  ScalarRun warm = scalar_loop(n);
  check_scalar("lazyrt", n, warm.counter, warm.x);
  std::vector<double> exec_ms, total_ms, ns_iter, cpu_ns_iter;
  for (int r = 0; r < reps; ++r) {
    ScalarRun s = scalar_loop(n);
    check_scalar("lazyrt", n, s.counter, s.x);
    exec_ms.push_back(s.execute_s * 1e3);
    total_ms.push_back(s.total_s * 1e3);
    ns_iter.push_back(s.execute_s * 1e9 / static_cast<double>(n));
    cpu_ns_iter.push_back(s.sync_cpu_s * 1e9 / static_cast<double>(n));
  }
  const Stats ns = stats(ns_iter);
  std::printf("| measure | median [min, max] |\n|---|---:|\n");
  std::printf("| execute ms | %s |\n", cell(stats(exec_ms)).c_str());
  std::printf("| end to end ms | %s |\n", cell(stats(total_ms)).c_str());
  std::printf("| **execute ns / iteration** | **%s** |\n", cell(ns, "%.1f").c_str());
  const Stats cpu = stats(cpu_ns_iter);
  std::printf("| thread CPU ns / iteration (whole sync) | %s |\n\n", cell(cpu, "%.1f").c_str());
  std::printf("Target %s: %.1f ns per iteration (median wall time) against %.0f ns.",
              ns.median <= kTargetNsPerIteration ? "met" : "NOT met", ns.median,
              kTargetNsPerIteration);
  if (ns.median > kTargetNsPerIteration && cpu.median <= kTargetNsPerIteration)
    std::printf(" The loop's own CPU time, %.1f ns per iteration, is within it: other load on "
                "the machine took the difference (load average now %s).",
                cpu.median, load_average().c_str());
  std::printf("\n\n");
  return ns.median;
}

void against_torch(int reps) {
  const int64_t n = kTorchIterations;
  std::printf("## 3. The scalar loop against PyTorch\n\n");
#ifndef LAZYRT_BENCH_HAVE_TORCH
  (void)reps;
  (void)n;
  std::printf("Skipped: this build did not find libtorch (CMake `find_package(Torch)`), or it was "
              "turned off with `-DLAZYRT_BENCH_WITH_TORCH=OFF`.\n\n");
#else
  using namespace lazyrt::bench;
  std::printf(
      "The loop of section 2 at N = %lld (libtorch eager needs microseconds per iteration, so "
      "N = %lld would take seconds a run), libtorch %s on the CPU, in this process. "
      "1 warm-up run each (not counted; for TorchScript it is the profiling run that "
      "specializes the graph), then %d timed runs, median [min, max]; every result checked "
      "(c = x = %lld) before and during timing. lazyrt times are end to end (trace, cache hit, "
      "execute), as the libtorch times are. ratio = time / lazyrt time.\n\n",
      static_cast<long long>(n), static_cast<long long>(kTargetIterations),
      torch_version().c_str(), reps, static_cast<long long>(n));
  struct Peer {
    const char* name;
    std::function<TorchLoopResult(int64_t)> run;
  };
  const std::vector<Peer> peers = {
      {"lazyrt `while_loop`",
       [](int64_t k) {
         ScalarRun s = scalar_loop(k);
         return TorchLoopResult{s.total_s, s.counter, s.x};
       }},
      {"libtorch eager, `while (c < n).item()` (InferenceMode)", torch_eager_while},
      {"libtorch eager, host `for` counter, `x = x + 1` (InferenceMode)", torch_eager_for},
      {"TorchScript `while bool(c < n)` (scripted function)", torch_script_while},
  };
  std::vector<Stats> times;
  for (const Peer& p : peers) {
    TorchLoopResult warm = p.run(n);
    check_scalar(p.name, n, warm.counter, warm.x);
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      TorchLoopResult t = p.run(n);
      check_scalar(p.name, n, t.counter, t.x);
      ms.push_back(t.seconds * 1e3);
    }
    times.push_back(stats(ms));
  }
  std::printf("| implementation | ms | ns / iteration | ratio |\n|---|---:|---:|---:|\n");
  for (size_t i = 0; i < peers.size(); ++i)
    std::printf("| %s | %s | %.1f | %.1fx |\n", peers[i].name, cell(times[i]).c_str(),
                times[i].median * 1e6 / static_cast<double>(n), times[i].median / times[0].median);
  std::printf("\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--reps R]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1) reps = 1;

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf("# while_loop benchmark\n\n%s; %u hardware threads; load average %s at the start; "
              "%s build; compiler %s; OPENBLAS_NUM_THREADS %s.\n\n", date,
              std::thread::hardware_concurrency(), load_average().c_str(), LAZYRT_BENCH_BUILD_TYPE,
              __VERSION__, blas_threads ? blas_threads : "unset");
  compare_forms(reps);
  std::fflush(stdout);
  scalar_target(std::max(reps, 10));
  std::fflush(stdout);
  against_torch(reps);
  std::printf("Load average at the end: %s.\n", load_average().c_str());
  return 0;
}
