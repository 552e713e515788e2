// threads_stress: lazyrt used from several threads at once, each round compared bit for bit with
// the same work done one piece after another on one thread (the same kernels, the same data).
//
// Each round is one of:
//   replays   four models of one architecture (Linear(8, 16), Tanh, Linear(16, 2), AdamW, MSE on
//             fixed 32x8 data), each with its own compiled step made on the main thread; one
//             thread per model calls its step `steps` times.
//   mixed     three models replayed as above while one more thread trains a fourth with plain
//             traced steps (step, mark_step, item) and another keeps changing the cache and
//             metrics settings (memory capacity 1 and 1024, clear_memory, a persistent
//             directory and none, report, counter, reset).
//   random    a seeded mix: 2 to 6 threads, each replaying a model's step, training one with
//             plain steps, compiling its own step on the thread and replaying it, or sharing a
//             compiled step with another thread (both call it on the same data, so any order of
//             the calls gives the same values); two architectures; generated kernels on or off;
//             the settings thread or not.
// The sequential run of a round makes the same models afresh and runs each thread's work in
// turn. A round whose values differ, or that throws, prints its seed and the program exits 1.
//
//   threads_stress [--rounds N] [--seed S] [--steps K] [--only replays|mixed|random] [--quiet]
//
// Round r runs with seed S + r; `--rounds 1 --seed S` reruns one.
#include <lazyrt/lazyrt.h>


#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/jit/jit.h"
#include "support/temp_dir.h"

namespace {

using namespace lazyrt;

// Deterministic values in [-1, 1) from (a, b, i).
float value(uint64_t a, uint64_t b, uint64_t i) {
  uint64_t h = (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ (i * 0x165667B19E3779F9ull);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return static_cast<float>(h % 20000) / 10000.0f - 1.0f;
}

std::vector<float> values(uint64_t a, uint64_t b, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(a, b, i) * scale;
  return v;
}

// One model and its data: made alike for the concurrent and the sequential run.
struct Model {
  int hidden = 16;
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<CompiledStep> step;
  Tensor x, y;

  Model(uint64_t seed, int index, int hidden_) : hidden(hidden_) {
    net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(8, hidden), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(hidden, 2)});
    const uint64_t key = seed * 64 + static_cast<uint64_t>(index);
    nn::StateDict init;
    uint64_t which = 0;
    for (const auto& [name, p] : net->named_parameters())
      init.emplace_back(name, tensor(values(key, ++which, static_cast<size_t>(p.numel()), 0.3f), p.shape()));
    net->load_state_dict(init);
    opt = std::make_unique<optim::AdamW>(net->parameters());
    x = tensor(values(key, 100, 32 * 8), {32, 8});
    y = tensor(values(key, 101, 32 * 2), {32, 2});
    mark_step();
  }

  Tensor traced_step(const Tensor& xb, const Tensor& yb) {
    Tensor loss = nn::mse_loss(net->forward(xb), yb);
    loss.backward();
    opt->step();
    opt->zero_grad();
    return loss;
  }

  void compile() {
    step = std::make_unique<CompiledStep>(compile_step(
        [this](const std::vector<Tensor>& a) { return std::vector<Tensor>{traced_step(a[0], a[1])}; }, {x, y}));
  }

  // The parameters' bits.
  std::vector<uint32_t> weights() const {
    std::vector<uint32_t> out;
    for (const Tensor& p : net->parameters()) {
      std::vector<float> v = p.to_vector<float>();
      const size_t at = out.size();
      out.resize(at + v.size());
      std::memcpy(out.data() + at, v.data(), v.size() * sizeof(float));
    }
    return out;
  }
};

uint32_t bits(double loss) {
  const float f = static_cast<float>(loss);
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

enum class Role { Replay, Trace, CompileOnThread, SharedStep };

struct Work {
  Role role;
  int model;  // index into the round's models
  int steps;
};

struct RoundPlan {
  std::string kind;
  std::vector<int> hidden;  // per model
  std::vector<Work> work;   // per thread
  bool settings = false;
  bool jit = false;
};

RoundPlan plan_for(const std::string& kind, uint64_t seed, int steps) {
  RoundPlan p;
  p.kind = kind;
  if (kind == "replays") {
    p.hidden = {16, 16, 16, 16};
    for (int m = 0; m < 4; ++m) p.work.push_back({Role::Replay, m, steps});
    p.jit = jit::mode() != jit::Mode::Off;
    return p;
  }
  if (kind == "mixed") {
    p.hidden = {16, 16, 16, 16};
    for (int m = 0; m < 3; ++m) p.work.push_back({Role::Replay, m, steps});
    p.work.push_back({Role::Trace, 3, std::max(1, steps / 10)});
    p.settings = true;
    p.jit = jit::mode() != jit::Mode::Off;
    return p;
  }
  std::mt19937_64 rng(seed);
  auto pick = [&rng](int lo, int hi) { return static_cast<int>(lo + rng() % static_cast<uint64_t>(hi - lo + 1)); };
  const int threads = pick(2, 6);
  p.settings = pick(0, 1) == 1;
  p.jit = pick(0, 1) == 1;
  for (int t = 0; t < threads; ++t) {
    const int r = pick(0, 9);
    const int hidden = pick(0, 2) == 0 ? 12 : 16;
    if (r < 5) {
      p.work.push_back({Role::Replay, static_cast<int>(p.hidden.size()), pick(steps / 4 + 1, steps)});
      p.hidden.push_back(hidden);
    } else if (r < 7) {
      p.work.push_back({Role::Trace, static_cast<int>(p.hidden.size()), pick(1, std::max(1, steps / 10))});
      p.hidden.push_back(hidden);
    } else if (r < 8) {
      p.work.push_back({Role::CompileOnThread, static_cast<int>(p.hidden.size()), pick(1, steps)});
      p.hidden.push_back(hidden);
    } else if (t + 1 < threads) {
      // Two threads on one compiled step, the same number of calls each.
      const int n = pick(1, steps);
      p.work.push_back({Role::SharedStep, static_cast<int>(p.hidden.size()), n});
      p.work.push_back({Role::SharedStep, static_cast<int>(p.hidden.size()), n});
      p.hidden.push_back(hidden);
      ++t;
    } else {
      p.work.push_back({Role::Replay, static_cast<int>(p.hidden.size()), pick(1, steps)});
      p.hidden.push_back(hidden);
    }
  }
  return p;
}

// What a round produced: per model, its losses (in call order, or sorted for a shared step)
// and its final parameters.
struct Outcome {
  std::vector<std::vector<uint32_t>> losses, weights;
  std::string error;
};

// One thread's work on model m.
void run_work(const Work& w, Model& m, std::vector<uint32_t>& losses) {
  switch (w.role) {
    case Role::Replay:
      for (int s = 0; s < w.steps; ++s) losses.push_back(bits((*m.step)({m.x, m.y}).at(0).item()));
      break;
    case Role::SharedStep:
      // The other thread's calls may retrace meanwhile (the first call after an optimizer was
      // made): the step's own figures are read as they change.
      for (int s = 0; s < w.steps; ++s) {
        losses.push_back(bits((*m.step)({m.x, m.y}).at(0).item()));
        if (m.step->traces() < 1 || m.step->variants() < 1) throw std::runtime_error("a compiled step lost its trace");
      }
      break;
    case Role::CompileOnThread:
      m.compile();
      for (int s = 0; s < w.steps; ++s) losses.push_back(bits((*m.step)({m.x, m.y}).at(0).item()));
      break;
    case Role::Trace:
      for (int s = 0; s < w.steps; ++s) {
        Tensor loss = m.traced_step(m.x, m.y);
        mark_step();
        losses.push_back(bits(loss.item()));
      }
      break;
  }
}

using testing::TempDir;

// Keeps changing the cache and metrics settings until `done`.
void change_settings(uint64_t seed, const std::string& dir, const std::atomic<bool>& done) {
  std::mt19937_64 rng(seed ^ 0x5E771);
  while (!done.load()) {
    switch (rng() % 8) {
      case 0: cache::set_memory_capacity(1); break;
      case 1: cache::set_memory_capacity(1024); break;
      case 2: cache::clear_memory(); break;
      case 3: cache::set_persistent_dir(dir); break;
      case 4: cache::set_persistent_dir(""); break;
      case 5: (void)metrics::report(); break;
      case 6: (void)metrics::counter("ReplayGraph"); break;
      default: metrics::reset(); break;
    }
    std::this_thread::yield();
  }
  cache::set_memory_capacity(1024);
  cache::set_persistent_dir("");
}

Outcome run_round(const RoundPlan& p, uint64_t seed, bool concurrent) {
  Outcome out;
  jit::wait_idle();  // a module compiling in the background finishes under the mode it began in
  jit::set_mode(p.jit ? jit::Mode::Tiered : jit::Mode::Off);
  // Each model is made and its step compiled on this thread, one model after the other, as a
  // user would: each optimizer made invalidates the steps compiled before it, which then
  // retrace on their first call, on their threads.
  std::vector<std::unique_ptr<Model>> models;
  for (size_t m = 0; m < p.hidden.size(); ++m) {
    models.push_back(std::make_unique<Model>(seed, static_cast<int>(m), p.hidden[m]));
    for (const Work& w : p.work)
      if ((w.role == Role::Replay || w.role == Role::SharedStep) && w.model == static_cast<int>(m)) {
        models[m]->compile();
        break;
      }
  }
  std::vector<std::vector<uint32_t>> losses(p.work.size());
  if (concurrent) {
    std::mutex mu;
    std::atomic<int> ready{0};
    std::atomic<bool> done{false};
    TempDir dir;
    std::thread settings;
    if (p.settings) settings = std::thread(change_settings, seed, dir.path(), std::cref(done));
    std::vector<std::thread> threads;
    for (size_t t = 0; t < p.work.size(); ++t)
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < static_cast<int>(p.work.size())) std::this_thread::yield();
        try {
          run_work(p.work[t], *models[p.work[t].model], losses[t]);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (out.error.empty()) out.error = "thread " + std::to_string(t) + ": " + e.what();
        }
      });
    for (auto& th : threads) th.join();
    done = true;
    if (settings.joinable()) settings.join();
  } else {
    try {
      for (size_t t = 0; t < p.work.size(); ++t) run_work(p.work[t], *models[p.work[t].model], losses[t]);
    } catch (const std::exception& e) {
      out.error = std::string("sequential: ") + e.what();
    }
  }
  out.losses.resize(models.size());
  for (size_t t = 0; t < p.work.size(); ++t) {
    auto& l = out.losses[p.work[t].model];
    l.insert(l.end(), losses[t].begin(), losses[t].end());
  }
  for (size_t m = 0; m < models.size(); ++m) {
    std::sort(out.losses[m].begin(), out.losses[m].end());  // a shared step's calls in any order
    out.weights.push_back(models[m]->weights());
  }
  return out;
}

std::string describe(const RoundPlan& p) {
  static const char* names[] = {"replay", "trace", "compile-on-thread", "shared-step"};
  std::string s = p.kind + ": " + std::to_string(p.work.size()) + " threads (";
  for (size_t t = 0; t < p.work.size(); ++t)
    s += (t ? ", " : "") + std::string(names[static_cast<int>(p.work[t].role)]) + " of model " +
         std::to_string(p.work[t].model) + " x" + std::to_string(p.work[t].steps);
  s += ")";
  if (p.settings) s += ", settings changing";
  s += p.jit ? ", generated kernels" : ", interpreter";
  return s;
}

// Where two runs' bits first differ (what, its index, the two values), or empty.
std::string first_difference(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want, const std::string& what) {
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (got[i] != want[i]) {
      float a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      return what + " " + std::to_string(i) + " is " + std::to_string(a) + ", sequentially " + std::to_string(b);
    }
  return got.size() == want.size() ? "" : "a different number of " + what + "s";
}

// Empty when the two agree, else what differs first.
std::string compare(const Outcome& got, const Outcome& want) {
  if (!got.error.empty()) return got.error;
  if (!want.error.empty()) return want.error;
  for (size_t m = 0; m < want.losses.size(); ++m) {
    std::string diff = first_difference(got.losses[m], want.losses[m], "loss (in sorted order)");
    if (diff.empty()) diff = first_difference(got.weights[m], want.weights[m], "parameter element");
    if (!diff.empty()) return "model " + std::to_string(m) + ": " + diff;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  long rounds = 1000;
  uint64_t seed = 1;
  int steps = 200;
  std::string only;
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "threads_stress: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rounds") rounds = std::stol(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--only") only = next();
    else if (a == "--quiet") quiet = true;
    else {
      std::fprintf(stderr, "usage: threads_stress [--rounds N] [--seed S] [--steps K] [--only replays|mixed|random] [--quiet]\n");
      return 2;
    }
  }
  if (steps < 1 || rounds < 0 || (!only.empty() && only != "replays" && only != "mixed" && only != "random")) {
    std::fprintf(stderr, "threads_stress: bad arguments\n");
    return 2;
  }
  const jit::Mode mode0 = jit::mode();
  std::map<std::string, std::pair<long, long>> tally;  // kind: rounds run, rounds differing
  long failed = 0;
  for (long r = 0; r < rounds; ++r) {
    const uint64_t s = seed + static_cast<uint64_t>(r);
    static const char* kinds[] = {"replays", "mixed", "random"};
    const std::string kind = only.empty() ? kinds[s % 3] : only;
    jit::set_mode(mode0);
    const RoundPlan p = plan_for(kind, s, steps);
    const Outcome got = run_round(p, s, true);
    const Outcome want = run_round(p, s, false);
    const std::string diff = compare(got, want);
    tally[kind].first++;
    if (!diff.empty()) {
      tally[kind].second++;
      ++failed;
      std::printf("round %ld, seed %llu: %s\n  %s\n  rerun: threads_stress --rounds 1 --seed %llu --steps %d%s%s\n", r,
                  static_cast<unsigned long long>(s), describe(p).c_str(), diff.c_str(),
                  static_cast<unsigned long long>(s), steps, only.empty() ? "" : " --only ", only.c_str());
      std::fflush(stdout);
    } else if (!quiet && (r + 1) % 50 == 0) {
      std::printf("%ld rounds, %ld differing\n", r + 1, failed);
      std::fflush(stdout);
    }
  }
  jit::set_mode(mode0);
  for (const auto& [kind, t] : tally) std::printf("%s: %ld rounds, %ld differing\n", kind.c_str(), t.first, t.second);
  return failed ? 1 : 0;
}
