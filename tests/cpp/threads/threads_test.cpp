// Several threads using lazyrt at once, as programs do that train or serve independent models
// side by side: each thread traces and syncs graphs of its own tensors (some of the same
// structure as other threads' graphs, so that they share executables through the cache, some
// of its own), reads values, replays compiled steps of its own model, and shares one persistent
// cache directory with the others, while another thread reads the metrics. Every value is
// checked against plain arithmetic done here. `make check-tsan` runs these tests under
// ThreadSanitizer, which fails them on any data race.
//
// What threads must not do at once (tensor.h): trace one graph from two threads; draws from the
// default generator are safe, in an order that depends on timing. mark_step() syncs the calling
// thread's pending values only, so it and a compile_step trace (which begins with one) may
// overlap another thread's tracing. Optimizers being created, and module mode changes, make
// every compiled step retrace, so the compiled step test below builds its models one thread at
// a time. threads_stress.cpp compares many more mixes bit for bit with their sequential runs
// (`make stress-threads`).
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include "support/temp_dir.h"
#include "util/metrics_cells.h"

#include <stdlib.h>

#include <atomic>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace lazyrt {
namespace {

namespace fs = std::filesystem;

constexpr int kThreads = 4;

// Deterministic inputs in [-1, 1): a hash of (thread, round, which, index).
float input_value(int thread, int round, int which, int64_t i) {
  uint64_t h = (static_cast<uint64_t>(thread) * 1000003u + static_cast<uint64_t>(round)) * 9176u +
               static_cast<uint64_t>(which) * 7919u + static_cast<uint64_t>(i) * 2654435761u;
  h ^= h >> 13;
  h *= 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return static_cast<float>(h % 2000) / 1000.0f - 1.0f;
}

std::vector<float> inputs(int thread, int round, int which, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = input_value(thread, round, which, i);
  return v;
}

bool near(double actual, double expected, double rtol = 1e-4, double atol = 1e-5) {
  return std::fabs(actual - expected) <= atol + rtol * std::fabs(expected);
}

// Failures seen by worker threads, reported by the main thread (one line each).
class Failures {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(what);
  }
  std::string text() const {
    std::ostringstream os;
    for (size_t i = 0; i < lines_.size() && i < 20; ++i) os << "\n  " << lines_[i];
    if (lines_.size() > 20) os << "\n  ... " << lines_.size() << " in all";
    return os.str();
  }
  bool empty() const { return lines_.empty(); }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// Runs fn(thread) on kThreads threads at once, and while they run, a reader of the metrics
// and cache sizes (which must only ever see counters grow).
void run_threads(const std::function<void(int)>& fn, Failures& failures) {
  std::atomic<bool> done{false};
  std::thread reader([&] {
    int64_t last_cached = 0, last_executed = 0;
    int reads = 0;
    while (!done.load() || reads == 0) {
      const std::string report = metrics::report();
      const int64_t cached = metrics::counter("CachedCompile");
      const int64_t executed = metrics::counter("ExecuteGraph");
      if (cached < last_cached || executed < last_executed)
        failures.add("a metrics counter went down while threads ran");
      if (report.empty()) failures.add("metrics::report() is empty");
      last_cached = cached;
      last_executed = executed;
      (void)metrics::timing_count("ExecuteTime");
      (void)metrics::timing_total_ns("CompileTime");
      (void)cache::memory_size();
      ++reads;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(fn, t);
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
}

// ---- independent graphs ----------------------------------------------------------------------

// acc = relu(sum(tanh(x @ w + b) * 0.5, dim 1)) accumulated in place into zeros, with a large
// elementwise part (e = exp(-u*u) summed), so that kernels use the thread pool while other
// threads' kernels want it too. x: [6, k], w: [k, 5], b: [5], u: [256, 300].
struct GraphInputs {
  int64_t k;
  std::vector<float> x, w, b, u;
};

GraphInputs graph_inputs_for(int thread, int round, int64_t k) {
  return {k, inputs(thread, round, 0, 6 * k), inputs(thread, round, 1, k * 5), inputs(thread, round, 2, 5),
          inputs(thread, round, 3, 256 * 300)};
}

std::vector<double> expected_acc(const GraphInputs& in) {
  std::vector<double> out(6);
  for (int i = 0; i < 6; ++i) {
    double row = 0;
    for (int j = 0; j < 5; ++j) {
      double dot = in.b[j];
      for (int64_t p = 0; p < in.k; ++p) dot += static_cast<double>(in.x[i * in.k + p]) * in.w[p * 5 + j];
      row += std::tanh(dot) * 0.5;
    }
    out[i] = std::max(row, 0.0);
  }
  return out;
}

double expected_e(const GraphInputs& in) {
  double s = 0;
  for (float v : in.u) s += std::exp(-static_cast<double>(v) * v);
  return s;
}

// Traces the graph, syncs it the way `how` says, and checks both results.
void trace_sync_and_check(const GraphInputs& in, int how, const std::string& where, Failures& failures) {
  Tensor x = tensor(in.x, {6, in.k}), w = tensor(in.w, {in.k, 5}), b = tensor(in.b, {5});
  Tensor u = tensor(in.u, {256, 300});
  Tensor acc = zeros({6});
  acc.add_(relu((tanh(matmul(x, w) + b) * 0.5).sum({1})));
  Tensor e = exp(-(u * u)).sum();
  std::vector<float> got_acc;
  double got_e = 0;
  switch (how) {
    case 0:  // an explicit sync of both, then reads of device data
      sync({acc, e});
      got_acc = acc.to_vector<float>();
      got_e = e.item();
      break;
    case 1:  // reads of pending tensors: each read syncs what it needs
      got_acc = acc.to_vector<float>();
      got_e = e.item();
      break;
    default:  // one sync for one, a read for the other
      sync({e});
      got_acc = acc.to_vector<float>();
      got_e = e.item();
      break;
  }
  const std::vector<double> want = expected_acc(in);
  for (int i = 0; i < 6; ++i)
    if (!near(got_acc[i], want[i]))
      failures.add(where + ": acc[" + std::to_string(i) + "] = " + std::to_string(got_acc[i]) + ", expected " +
                   std::to_string(want[i]));
  // 76800 terms: f32 summation in any order is within about 1e-3 of the exact sum, relatively.
  if (!near(got_e, expected_e(in), 1e-3))
    failures.add(where + ": sum(exp(-u*u)) = " + std::to_string(got_e) + ", expected " +
                 std::to_string(expected_e(in)));
}

TEST(Threads, IndependentGraphsTracedSyncedAndReadAtOnce) {
  constexpr int kRounds = 12;
  const int64_t uncached0 = metrics::counter("UncachedCompile"), cached0 = metrics::counter("CachedCompile");
  Failures failures;
  // Even rounds: k = 8 in every thread, one structure for all. Odd rounds: k = 9 + thread, a
  // structure of each thread's own.
  run_threads(
      [&](int t) {
        for (int r = 0; r < kRounds; ++r) {
          const int64_t k = r % 2 == 0 ? 8 : 9 + t;
          trace_sync_and_check(graph_inputs_for(t, r, k), r % 3,
                               "thread " + std::to_string(t) + " round " + std::to_string(r), failures);
        }
      },
      failures);
  EXPECT_TRUE(failures.empty()) << failures.text();
  // The graphs: way 0 syncs acc and e together, ways 1 and 2 sync acc's graph and e's graph
  // one after the other (e's is the same for every k). Per thread: rounds 0, 3, 6, 9 take way
  // 0 (one sync), the other eight rounds two syncs: 20. Structures: shared by every thread,
  // both-at-once and acc alone for k = 8, and e alone; each thread's own, both-at-once and acc
  // alone for its k.
  const int64_t syncs = kThreads * 20, shared = 3, structures = shared + 2 * kThreads;
  const int64_t uncached = metrics::counter("UncachedCompile") - uncached0;
  const int64_t cached = metrics::counter("CachedCompile") - cached0;
  EXPECT_EQ(cached + uncached, syncs) << "each sync looks its executable up once";
  // A structure is compiled once, or by several threads that meet it at the same moment;
  // every other sync finds it in the cache.
  EXPECT_GE(uncached, structures);
  EXPECT_LE(uncached, structures + shared * (kThreads - 1));
}

// Per-step kernel timings while threads run their graphs: executables register their steps on
// their first timed run and record as they run, while a reader lists them (run_threads' reader
// checks that counters only grow, so nothing resets them meanwhile).
TEST(Threads, StepTimingsWhileGraphsRunAtOnce) {
  Failures failures;
  metrics::set_kernel_timings(true);
  std::atomic<bool> done{false};
  std::thread lister([&] {
    int lists = 0;
    while (!done.load() || lists == 0) {
      for (const metrics::StepTiming& t : metrics::step_timings())
        if (t.runs <= 0 || t.bytes < 0 || t.total_ns < 0 || t.op.empty()) failures.add("a malformed step timing");
      ++lists;
      std::this_thread::yield();
    }
  });
  run_threads(
      [&](int t) {
        for (int r = 0; r < 4; ++r)
          trace_sync_and_check(graph_inputs_for(t, r, 8 + t), r % 3,
                               "thread " + std::to_string(t) + " round " + std::to_string(r), failures);
      },
      failures);
  done = true;
  lister.join();
  metrics::reset();
  trace_sync_and_check(graph_inputs_for(0, 0, 8), 0, "after the threads", failures);
  metrics::set_kernel_timings(false);
  EXPECT_TRUE(failures.empty()) << failures.text();
  EXPECT_FALSE(metrics::step_timings().empty()) << "the last graph's steps were timed";
}

// ---- compiled steps on per-thread models -------------------------------------------------------

// Linear(4, 1) trained by SGD on mse_loss, batches of 8, replayed by compile_step; the same
// in double precision here.
struct HostLinear {
  double w[4], b;
  double step(const std::vector<float>& x, const std::vector<float>& target, double lr) {
    double grad_w[4] = {0, 0, 0, 0}, grad_b = 0, loss = 0;
    for (int i = 0; i < 8; ++i) {
      double pred = b;
      for (int j = 0; j < 4; ++j) pred += x[i * 4 + j] * w[j];
      const double d = pred - target[i];
      loss += d * d / 8;
      for (int j = 0; j < 4; ++j) grad_w[j] += 2 * d / 8 * x[i * 4 + j];
      grad_b += 2 * d / 8;
    }
    for (int j = 0; j < 4; ++j) w[j] -= lr * grad_w[j];
    b -= lr * grad_b;
    return loss;
  }
};

TEST(Threads, CompiledStepsReplayPerThreadModelsAtOnce) {
  constexpr int kSteps = 15;
  struct Model {
    std::shared_ptr<nn::Linear> linear;
    std::unique_ptr<optim::SGD> opt;
    std::unique_ptr<CompiledStep> step;
    HostLinear host;
    double lr;
  };
  std::vector<Model> models(kThreads);
  std::mutex one_at_a_time;
  std::barrier built(kThreads), traced(kThreads);
  const int64_t replays0 = metrics::counter("ReplayGraph");
  Failures failures;
  run_threads(
      [&](int t) {
        Model& m = models[t];
        m.lr = 0.05 + 0.01 * t;
        {
          // Modules draw their initial values and optimizers invalidate compiled steps: one
          // thread at a time, before any step is traced.
          std::lock_guard<std::mutex> lock(one_at_a_time);
          m.linear = std::make_shared<nn::Linear>(4, 1);
          std::vector<float> w = inputs(t, 100, 0, 4), b = inputs(t, 100, 1, 1);
          m.linear->load_state_dict({{"weight", tensor(w, {1, 4})}, {"bias", tensor(b, {1})}});
          for (int j = 0; j < 4; ++j) m.host.w[j] = w[j];
          m.host.b = b[0];
          optim::SGDOptions o;
          o.lr = m.lr;
          m.opt = std::make_unique<optim::SGD>(m.linear->parameters(), o);
        }
        built.arrive_and_wait();
        {
          // The traces run at once: each begins with a mark_step() of its own thread's values.
          auto fn = [&m](const std::vector<Tensor>& a) {
            Tensor loss = nn::mse_loss(m.linear->forward(a[0]), a[1]);
            loss.backward();
            m.opt->step();
            m.opt->zero_grad();
            return std::vector<Tensor>{loss};
          };
          m.step = std::make_unique<CompiledStep>(
              compile_step(fn, {tensor(inputs(t, 0, 2, 32), {8, 4}), tensor(inputs(t, 0, 3, 8), {8, 1})}));
        }
        traced.arrive_and_wait();
        for (int s = 0; s < kSteps; ++s) {
          const std::vector<float> x = inputs(t, s, 2, 32), target = inputs(t, s, 3, 8);
          const double want = m.host.step(x, target, m.lr);
          std::vector<Tensor> out = (*m.step)({tensor(x, {8, 4}), tensor(target, {8, 1})});
          const double got = out.at(0).item();
          if (!near(got, want))
            failures.add("thread " + std::to_string(t) + " step " + std::to_string(s) + ": loss " +
                         std::to_string(got) + ", expected " + std::to_string(want));
        }
        const std::vector<float> w = m.linear->weight.to_vector<float>();
        for (int j = 0; j < 4; ++j)
          if (!near(w[j], m.host.w[j]))
            failures.add("thread " + std::to_string(t) + ": weight[" + std::to_string(j) + "] = " +
                         std::to_string(w[j]) + ", expected " + std::to_string(m.host.w[j]));
        if (!near(m.linear->bias.item(), m.host.b))
          failures.add("thread " + std::to_string(t) + ": bias differs");
      },
      failures);
  EXPECT_TRUE(failures.empty()) << failures.text();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(models[t].step->traces(), 1) << "thread " << t << " retraced";
  EXPECT_EQ(metrics::counter("ReplayGraph") - replays0, kThreads * kSteps) << "every call is a replay";
}

// Plain traced training steps, no compile_step: each thread builds its model (the initial draws
// share the process's generator), traces forward, backward and the optimizer's update, and
// reads the loss, which syncs the update with it (it reaches the loss's graph).
TEST(Threads, PlainTrainingStepsAtOnce) {
  constexpr int kSteps = 8;
  Failures failures;
  run_threads(
      [&](int t) {
        auto linear = std::make_shared<nn::Linear>(4, 1);
        std::vector<float> w0 = inputs(t, 200, 0, 4), b0 = inputs(t, 200, 1, 1);
        linear->load_state_dict({{"weight", tensor(w0, {1, 4})}, {"bias", tensor(b0, {1})}});
        HostLinear host{{w0[0], w0[1], w0[2], w0[3]}, b0[0]};
        optim::SGDOptions o;
        o.lr = 0.1 - 0.01 * t;
        optim::SGD opt(linear->parameters(), o);
        for (int s = 0; s < kSteps; ++s) {
          const std::vector<float> x = inputs(t, s, 4, 32), target = inputs(t, s, 5, 8);
          Tensor loss = nn::mse_loss(linear->forward(tensor(x, {8, 4})), tensor(target, {8, 1}));
          loss.backward();
          opt.step();
          opt.zero_grad();
          const double want = host.step(x, target, o.lr), got = loss.item();
          if (!near(got, want))
            failures.add("thread " + std::to_string(t) + " step " + std::to_string(s) + ": loss " +
                         std::to_string(got) + ", expected " + std::to_string(want));
        }
        const std::vector<float> w = linear->weight.to_vector<float>();
        for (int j = 0; j < 4; ++j)
          if (!near(w[j], host.w[j]))
            failures.add("thread " + std::to_string(t) + ": weight[" + std::to_string(j) + "] = " +
                         std::to_string(w[j]) + ", expected " + std::to_string(host.w[j]));
      },
      failures);
  EXPECT_TRUE(failures.empty()) << failures.text();
}

// ---- one thread's trace beside another thread's mark_step -------------------------------------

// A one-shot signal from one thread to another.
class Signal {
 public:
  void set() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

// Linear(4, 1) with initial values from inputs(key, ...), loaded (so still pending), and SGD.
std::pair<std::shared_ptr<nn::Linear>, std::shared_ptr<optim::SGD>> small_model(int key, double lr) {
  auto linear = std::make_shared<nn::Linear>(4, 1);
  linear->load_state_dict({{"weight", tensor(inputs(key, 300, 0, 4), {1, 4})}, {"bias", tensor(inputs(key, 300, 1, 1), {1})}});
  optim::SGDOptions o;
  o.lr = lr;
  return {linear, std::make_shared<optim::SGD>(linear->parameters(), o)};
}

// mark_step() syncs what the calling thread recorded: another thread's values, still being
// recorded, stay pending (syncing them rebound tensors that thread was tracing into).
TEST(Threads, MarkStepLeavesAnotherThreadsPendingValuesAlone) {
  Signal recorded, marked;
  bool pending_after = false;
  double value = 0;
  std::thread other([&] {
    Tensor x = tensor(std::vector<float>{1, 2, 3}, {3});
    Tensor y = x * 2.0 + 1.0;
    recorded.set();
    marked.wait();
    pending_after = y.is_pending();
    y.add_(ones({3}));  // still this thread's trace to extend
    value = y.sum().item();
  });
  recorded.wait();
  Tensor mine = tensor(std::vector<float>{4}, {1}) * 3.0;
  mark_step();
  EXPECT_FALSE(mine.is_pending()) << "the calling thread's own values are synced";
  marked.set();
  other.join();
  EXPECT_TRUE(pending_after) << "another thread's pending value was synced by this thread's mark_step";
  EXPECT_EQ(value, 3 + 5 + 7 + 3);
}

// A compile_step trace on one thread while another thread calls mark_step (a plain training
// loop beside a step being compiled): the trace keeps its own pending values, and the step
// replays as the same step compiled alone.
TEST(Threads, CompileStepTracedWhileAnotherThreadMarksSteps) {
  auto make = [] {
    auto model = small_model(7, 0.05);
    mark_step();
    return model;
  };
  auto step_fn = [](nn::Linear& linear, optim::SGD& opt, Signal* traced, Signal* resume) {
    return [&linear, &opt, traced, resume](const std::vector<Tensor>& a) {
      Tensor loss = nn::mse_loss(linear.forward(a[0]), a[1]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      if (traced) {  // halfway: everything recorded, nothing returned yet
        traced->set();
        resume->wait();
      }
      return std::vector<Tensor>{loss};
    };
  };
  const Tensor x = tensor(inputs(7, 0, 2, 32), {8, 4}), target = tensor(inputs(7, 0, 3, 8), {8, 1});
  // Alone first: the expected losses and weights.
  auto [ref_linear, ref_opt] = make();
  CompiledStep ref = compile_step(step_fn(*ref_linear, *ref_opt, nullptr, nullptr), {x, target});
  std::vector<double> want;
  for (int i = 0; i < 3; ++i) want.push_back(ref({x, target}).at(0).item());
  const std::vector<float> want_w = ref_linear->weight.to_vector<float>();

  auto [linear, opt] = make();
  Signal traced, resume;
  std::string error;
  std::vector<double> got;
  std::thread tracer([&] {
    try {
      CompiledStep step = compile_step(step_fn(*linear, *opt, &traced, &resume), {x, target});
      for (int i = 0; i < 3; ++i) got.push_back(step({x, target}).at(0).item());
    } catch (const std::exception& e) {
      error = e.what();
      traced.set();
    }
  });
  traced.wait();
  Tensor plain = tensor(std::vector<float>{1, 2}, {2}) + 1.0;  // this thread's own plain step
  mark_step();
  resume.set();
  tracer.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, want);
  EXPECT_EQ(linear->weight.to_vector<float>(), want_w);
  EXPECT_EQ(plain.to_vector<float>(), (std::vector<float>{2, 3}));
}

// A model made on one thread (its initial values loaded, still pending: that thread never
// synced them) and compiled and trained on another: the trace on the second thread computes
// the pending state first, so replays read the weights instead of recomputing the initial
// ones every time. The same as doing all of it on one thread.
TEST(Threads, StepCompiledOnAnotherThreadThanItsModelsPendingState) {
  auto make = [] { return small_model(9, 0.1); };
  auto train = [](nn::Linear& linear, optim::SGD& opt, std::vector<double>& losses) {
    auto fn = [&linear, &opt](const std::vector<Tensor>& a) {
      Tensor loss = nn::mse_loss(linear.forward(a[0]), a[1]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    };
    const Tensor x = tensor(inputs(9, 0, 2, 32), {8, 4}), target = tensor(inputs(9, 0, 3, 8), {8, 1});
    CompiledStep step = compile_step(fn, {x, target});
    for (int i = 0; i < 4; ++i) losses.push_back(step({x, target}).at(0).item());
  };
  std::vector<double> want, got;
  {
    auto [linear, opt] = make();
    train(*linear, *opt, want);
  }
  auto [linear, opt] = make();  // pending on this thread
  ASSERT_TRUE(linear->weight.is_pending());
  std::string error;
  std::thread([&] {
    try {
      train(*linear, *opt, got);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, want);
  EXPECT_NE(want.at(0), want.at(3)) << "the steps train";
}

// A loop body that draws random numbers is traced with the generator's offset as a carry of
// the loop. Another thread drawing meanwhile (its own model's initial values) draws from the
// generator itself, not into that loop.
TEST(Threads, DrawsBesideALoopBodyBeingTracedOnAnotherThread) {
  Signal in_body, drawn;
  std::string error;
  std::vector<float> looped;
  std::thread tracer([&] {
    try {
      Carry out = fori_loop(0, 3, [&](const Tensor&, const Carry& c) {
        Tensor r = rand({4});
        in_body.set();
        drawn.wait();
        return Carry{c[0] + r};
      }, {zeros({4})});
      looped = out[0].to_vector<float>();
    } catch (const std::exception& e) {
      error = e.what();
      in_body.set();
    }
  });
  in_body.wait();
  std::string draw_error;
  std::vector<float> mine;
  try {
    mine = rand({4}).to_vector<float>();
  } catch (const std::exception& e) {
    draw_error = e.what();
  }
  drawn.set();
  tracer.join();
  EXPECT_EQ(draw_error, "");
  EXPECT_EQ(error, "");
  ASSERT_EQ(mine.size(), 4u);
  ASSERT_EQ(looped.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(mine[i] >= 0 && mine[i] < 1) << mine[i];
    EXPECT_TRUE(looped[i] >= 0 && looped[i] < 3) << looped[i];
  }
}

// Threads drawing from the default generator at once, each syncing its draws with mark_step()
// (models made and initialised on their own threads): every draw takes a part of the stream of
// its own, so together they are the draws of one thread, in some order.
TEST(Threads, DrawsAndMarkStepsAtOnceTakeDisjointPartsOfTheStream) {
  constexpr int kDraws = 150;
  manual_seed(4242);
  std::vector<std::vector<float>> blocks[kThreads];
  Failures failures;
  run_threads(
      [&](int t) {
        try {
          for (int i = 0; i < kDraws; ++i) {
            Tensor r = rand({16});
            mark_step();
            blocks[t].push_back(r.to_vector<float>());
          }
        } catch (const std::exception& e) {
          failures.add("thread " + std::to_string(t) + ": " + e.what());
        }
      },
      failures);
  ASSERT_TRUE(failures.empty()) << failures.text();
  std::vector<std::vector<float>> got, want;
  for (auto& b : blocks) got.insert(got.end(), b.begin(), b.end());
  manual_seed(4242);
  for (int i = 0; i < kThreads * kDraws; ++i) want.push_back(rand({16}).to_vector<float>());
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_TRUE(got == want) << "the draws of several threads are not the draws of one";
}

// Compiled steps that draw (dropout) replayed on several threads while another thread draws
// and syncs: each replay reads and advances the generator's offset as one draw does, so none
// is lost or repeated, and the offset ends advanced by every element drawn.
TEST(Threads, StepsThatDrawReplayedAtOnceAdvanceTheGeneratorByEveryDraw) {
  constexpr int kCalls = 100;
  manual_seed(99);
  const Tensor x = ones({256});
  std::vector<std::unique_ptr<CompiledStep>> steps;
  for (int t = 0; t < 2; ++t)
    steps.push_back(std::make_unique<CompiledStep>(compile_step(
        [](const std::vector<Tensor>& a) {
          NoGradGuard no_grad;
          return std::vector<Tensor>{dropout(a[0], 0.5)};
        },
        {x})));
  const int64_t offset0 = static_cast<int64_t>(random_state().second.item());
  Failures failures;
  run_threads(
      [&](int t) {
        try {
          for (int i = 0; i < kCalls; ++i) {
            if (t < 2) {
              for (float v : (*steps[t])({x}).at(0).to_vector<float>())
                if (v != 0 && v != 2) failures.add("a dropout output of " + std::to_string(v));
            } else {
              Tensor r = rand({16});
              mark_step();
              (void)r.to_vector<float>();
            }
          }
        } catch (const std::exception& e) {
          failures.add("thread " + std::to_string(t) + ": " + e.what());
        }
      },
      failures);
  ASSERT_TRUE(failures.empty()) << failures.text();
  const int64_t drawn = 2 * kCalls * 256 + (kThreads - 2) * kCalls * 16;
  EXPECT_EQ(static_cast<int64_t>(random_state().second.item()) - offset0, drawn);
}

// The low-level replay calls take what this thread recorded since its own last mark_step() as
// the step: another thread's mark_step() in between neither ends it nor hides what it did
// (here, a gradient created by the step, which those calls refuse).
TEST(Threads, LowLevelReplayChecksSeeTheirOwnThreadsStep) {
  Tensor w = tensor(std::vector<float>{1, 2, 3, 4}, {4});
  w.requires_grad_();
  const Tensor x = tensor(std::vector<float>{0.5f, -1, 2, 0.25f}, {4});
  mark_step();
  Tensor loss = (w * x).sum();
  loss.backward();  // creates w's gradient: not replayable by the low-level calls
  std::thread([] { mark_step(); }).join();
  try {
    (void)graph_hash({loss});
    ADD_FAILURE() << "graph_hash took a step that created a gradient the graph reads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient"), std::string::npos) << e.what();
  }
  // A step on this thread alone, after its own mark_step(), is taken.
  mark_step();
  w.set_grad(Tensor());
  mark_step();
  Tensor y = w * x;
  EXPECT_NE(graph_hash({y}), GraphHash{});
}

// metrics::reset() while threads record timings (every executable run records ExecuteTime): a
// report shows each timing's count, total, mean and maximum from one moment, so timings of
// 1 us each always report a mean and a maximum of 1 us, however the resets fall.
TEST(Threads, MetricsResetBesideTimingsKeepsEachTimingWhole) {
  const std::string name = "ThreadsTestTiming";
  std::atomic<bool> done{false};
  std::vector<std::thread> recorders;
  for (int t = 0; t < 2; ++t)
    recorders.emplace_back([&] {
      while (!done.load(std::memory_order_relaxed))
        for (int i = 0; i < 64; ++i) metrics::record_timing(name, 1000);
    });
  std::thread resetter([&] {
    while (!done.load(std::memory_order_relaxed)) metrics::reset();
  });
  std::string bad;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
  while (bad.empty() && std::chrono::steady_clock::now() < until) {
    const std::string report = metrics::report();
    const size_t at = report.find("  " + name + ": ");
    if (at == std::string::npos) continue;
    const std::string line = report.substr(at, report.find('\n', at) - at);
    // "  Name: count, total ms, mean us, max us"
    const size_t mean_at = line.find(" ms, ") + 5, max_at = line.find(" us, ") + 5;
    if (std::stod(line.substr(mean_at)) != 1.0 || std::stod(line.substr(max_at)) != 1.0) bad = line;
  }
  done = true;
  for (auto& th : recorders) th.join();
  resetter.join();
  EXPECT_EQ(bad, "") << "a timing reported with a count and a time from either side of a reset";
}

// ---- one persistent cache directory --------------------------------------------------------------

using testing::TempDir;

TEST(Threads, SharedPersistentCacheDirectory) {
  TempDir dir;
  cache::set_persistent_dir(dir.path());
  cache::clear_memory();
  constexpr int kRounds = 6;
  // Round r: k = 8 + r % 3 in every thread, way r % 3 (shared structures: both-at-once for
  // k = 8, acc alone for k = 9 and 10, e alone), and in odd rounds both-at-once for k = 20 +
  // thread too (one structure per thread).
  auto work = [](int t, int pass, Failures& failures) {
    for (int r = 0; r < kRounds; ++r) {
      const std::string where = "pass " + std::to_string(pass) + " thread " + std::to_string(t) + " round " +
                                std::to_string(r);
      trace_sync_and_check(graph_inputs_for(t, r + 10 * pass, 8 + r % 3), r % 3, where, failures);
      if (r % 2 == 1) trace_sync_and_check(graph_inputs_for(t, r + 10 * pass, 20 + t), 0, where + " (own)", failures);
    }
  };
  Failures failures;
  const int64_t failures0 = metrics::counter("PersistentCacheDeserializeFailure");
  // First pass: the threads compile and store the entries, several at once.
  run_threads([&](int t) { work(t, 0, failures); }, failures);
  // Second pass, with the in-memory cache emptied: every graph now comes from the directory.
  cache::clear_memory();
  const int64_t uncached = metrics::counter("UncachedCompile"), hits = metrics::counter("PersistentCacheHit");
  run_threads([&](int t) { work(t, 1, failures); }, failures);
  EXPECT_TRUE(failures.empty()) << failures.text();
  EXPECT_EQ(metrics::counter("UncachedCompile") - uncached, 0) << "the second pass compiles nothing";
  EXPECT_GE(metrics::counter("PersistentCacheHit") - hits, 4 + kThreads) << "every structure is loaded from disk";
  EXPECT_EQ(metrics::counter("PersistentCacheDeserializeFailure") - failures0, 0)
      << "entries written by several threads at once are whole";
  // One entry per structure (four shared, one per thread), whoever wrote it; no leftovers.
  // Generated code has a folder of its own there (jit/), written whenever a module finishes
  // compiling on the background thread, also one an earlier test started: not an entry.
  int entries = 0, temporaries = 0;
  for (const auto& f : fs::directory_iterator(dir.path())) {
    if (f.is_directory() && f.path().filename() == "jit") continue;
    (f.path().extension() == ".tmp" ? temporaries : entries)++;
  }
  EXPECT_EQ(entries, 4 + kThreads);
  EXPECT_EQ(temporaries, 0);
  cache::set_persistent_dir("");
  cache::clear_memory();
}

}  // namespace
}  // namespace lazyrt
