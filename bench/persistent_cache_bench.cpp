// First-step latency of an MLP training step (784-256-10, batch 64, softmax cross-entropy,
// hand-written gradients, SGD through add_) in a cold process, whose persistent cache
// directory is empty, against a warm process, whose directory a previous process filled.
//
// Each measurement is a fresh child process (this program with --child DIR), so nothing but
// the directory carries over. The child times its first step from the first traced op to the
// loss being available (trace, compile or load, execute), then one more step as the
// in-memory-cache floor. The parent runs, per round, a child without a persistent cache (the
// baseline), a cold child on a new directory and a warm child on the directory the cold one
// filled, and prints medians and the cold/warm ratio. Then the same with generated kernels
// compiled before the first run (LAZYRT_JIT=sync): the cold child starts the compiler process
// and compiles the step's kernels, the warm child loads them from the directory without
// starting it. Children run OpenBLAS single-threaded
// (unless OPENBLAS_NUM_THREADS is set) so that thread start-up and contention on a busy
// machine do not drown the difference.
//
//   persistent_cache_bench [--runs N]
#include <lazyrt/lazyrt.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace lazyrt;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 64, kIn = 784, kHidden = 256, kOut = 10;
constexpr double kLearningRate = 0.1;

// Deterministic values in [-scale, scale): the same data in every process.
Tensor filled(Shape shape, double scale, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>((static_cast<double>(s >> 11) / 9007199254740992.0 * 2 - 1) * scale);
  }
  return tensor(v, shape);
}

struct Mlp {
  Tensor w1 = filled({kIn, kHidden}, 1 / std::sqrt(double{kIn}), 1);
  Tensor b1 = filled({kHidden}, 0.01, 2);
  Tensor w2 = filled({kHidden, kOut}, 1 / std::sqrt(double{kHidden}), 3);
  Tensor b2 = filled({kOut}, 0.01, 4);
};

// One training step, traced and then run by mark_step(); returns the loss (materialized).
Tensor train_step(Mlp& m, const Tensor& x, const Tensor& onehot) {
  const double inv_batch = 1.0 / kBatch;
  Tensor z1 = matmul(x, m.w1) + m.b1;
  Tensor h = relu(z1);
  Tensor logits = matmul(h, m.w2) + m.b2;
  Tensor shifted = logits - amax(logits, {1}, true);
  Tensor e = exp(shifted);
  Tensor denom = sum(e, {1}, true);
  Tensor loss = -sum(onehot * (shifted - log(denom))) * inv_batch;
  // Backward by hand.
  Tensor dlogits = (e / denom - onehot) * inv_batch;
  Tensor dw2 = matmul(transpose(h, 0, 1), dlogits);
  Tensor db2 = sum(dlogits, {0});
  Tensor dz1 = matmul(dlogits, transpose(m.w2, 0, 1)) * cast(z1 > 0, DType::f32);
  Tensor dw1 = matmul(transpose(x, 0, 1), dz1);
  Tensor db1 = sum(dz1, {0});
  m.w1.add_(dw1, -kLearningRate);
  m.b1.add_(db1, -kLearningRate);
  m.w2.add_(dw2, -kLearningRate);
  m.b2.add_(db2, -kLearningRate);
  mark_step();
  return loss;
}

int child(const std::string& dir) {
  cache::set_persistent_dir(dir);  // "" for none
  Mlp m;
  Tensor x = filled({kBatch, kIn}, 1.0, 5);
  std::vector<float> labels(kBatch * kOut, 0.0f);
  for (int64_t i = 0; i < kBatch; ++i) labels[i * kOut + (i * 7) % kOut] = 1;
  Tensor onehot = tensor(labels, {kBatch, kOut});
  metrics::reset();

  const auto t0 = Clock::now();
  const double first_loss = train_step(m, x, onehot).item();
  const auto t1 = Clock::now();
  const double compile_ns = static_cast<double>(metrics::timing_total_ns("CompileTime"));
  const double execute_ns = static_cast<double>(metrics::timing_total_ns("ExecuteTime"));
  const double second_loss = train_step(m, x, onehot).item();
  const auto t2 = Clock::now();

  auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  std::printf("first_step_us %.1f\n", us(t1 - t0));
  std::printf("second_step_us %.1f\n", us(t2 - t1));
  std::printf("compile_us %.1f\n", compile_ns / 1e3);
  std::printf("execute_us %.1f\n", execute_ns / 1e3);
  std::printf("loss %.9g %.9g\n", first_loss, second_loss);
  std::printf("jit_us %.1f\n", static_cast<double>(metrics::timing_total_ns("JitCompileTime")) / 1e3);
  for (const char* c : {"UncachedCompile", "CachedCompile", "PersistentCacheHit", "PersistentCacheMiss",
                        "PersistentCacheDeserializeFailure", "JitModules", "JitObjectCacheHits", "JitCompilerStarts",
                        "JitFailures"})
    std::printf("counter %s %lld\n", c, static_cast<long long>(metrics::counter(c)));
  return 0;
}

struct Sample {
  double first_us = 0, second_us = 0, compile_us = 0, execute_us = 0, jit_us = 0;
  std::string loss;
  std::map<std::string, long long> counters;
};

// jit: LAZYRT_JIT for the child ("" leaves it as it is).
Sample run_child(const std::string& self, const std::string& dir, const std::string& jit = "") {
  const std::string cmd = (jit.empty() ? "" : "LAZYRT_JIT=" + jit + " ") + "'" + self + "' --child '" + dir + "'";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    std::perror("popen");
    std::exit(1);
  }
  std::string out;
  std::array<char, 512> buf;
  while (fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  if (pclose(pipe) != 0) {
    std::fprintf(stderr, "child failed:\n%s", out.c_str());
    std::exit(1);
  }
  Sample s;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "first_step_us") in >> s.first_us;
    else if (key == "second_step_us") in >> s.second_us;
    else if (key == "compile_us") in >> s.compile_us;
    else if (key == "execute_us") in >> s.execute_us;
    else if (key == "jit_us") in >> s.jit_us;
    else if (key == "loss") s.loss = line.substr(5);
    else if (key == "counter") {
      std::string name;
      long long v;
      in >> name >> v;
      s.counters[name] = v;
    }
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void row(const char* what, const std::vector<double>& v) {
  std::printf("| %s | %.0f [%.0f, %.0f] |\n", what, median(v), *std::min_element(v.begin(), v.end()),
              *std::max_element(v.begin(), v.end()));
}

std::string new_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "lazyrt-bench-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  return tmpl;
}

// The same rounds with generated kernels compiled before the first run (LAZYRT_JIT=sync).
int generated(const std::string& self, int runs) {
  std::vector<double> cold_first, warm_first, cold_jit, warm_jit, second;
  long long modules = 0;
  for (int r = 0; r < runs; ++r) {
    const std::string dir = new_dir();
    Sample cold = run_child(self, dir, "sync");
    Sample warm = run_child(self, dir, "sync");
    std::filesystem::remove_all(dir);
    modules = cold.counters["JitModules"];
    if (modules < 1 || cold.counters["JitObjectCacheHits"] != 0 || cold.counters["JitCompilerStarts"] != 1 ||
        warm.counters["JitModules"] != modules || warm.counters["JitObjectCacheHits"] != modules ||
        warm.counters["JitCompilerStarts"] != 0 || cold.counters["JitFailures"] != 0 ||
        warm.counters["JitFailures"] != 0 || cold.loss != warm.loss) {
      std::fprintf(stderr, "unexpected run with generated kernels: cold modules %lld hits %lld starts %lld, "
                   "warm modules %lld hits %lld starts %lld, losses '%s' and '%s'\n", cold.counters["JitModules"],
                   cold.counters["JitObjectCacheHits"], cold.counters["JitCompilerStarts"],
                   warm.counters["JitModules"], warm.counters["JitObjectCacheHits"],
                   warm.counters["JitCompilerStarts"], cold.loss.c_str(), warm.loss.c_str());
      return 1;
    }
    cold_first.push_back(cold.first_us);
    warm_first.push_back(warm.first_us);
    cold_jit.push_back(cold.jit_us);
    warm_jit.push_back(warm.jit_us);
    second.push_back(cold.second_us);
    second.push_back(warm.second_us);
  }
  std::printf("\n### With generated kernels compiled before the first run (LAZYRT_JIT=sync)\n\n");
  std::printf("The same rounds, without the run lacking a persistent cache. The cold process starts the compiler "
              "process (lazyrt-jitc, which loads LLVM) and compiles the step's %lld module(s) of kernels; the warm "
              "one loads their shared objects from the directory and starts no compiler. Every round checks the "
              "counters (cold: %lld module(s) compiled, no hit, one compiler started; warm: every module a hit, "
              "no compiler) and that the losses are equal.\n\n", modules, modules);
  std::printf("| measure | us |\n|---|---:|\n");
  row("cold process: first step", cold_first);
  row("&nbsp;&nbsp;of which generating kernels (compiler start, compile, link, load)", cold_jit);
  row("**warm process: first step**", warm_first);
  row("&nbsp;&nbsp;of which loading generated kernels", warm_jit);
  row("any process: second step (in-memory cache)", second);
  std::printf("\ncold / warm first-step ratio with generated kernels (medians): **%.2fx**.\n",
              median(cold_first) / median(warm_first));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--child") return child(argv[2]);
  int runs = 9;
  if (argc == 3 && std::string(argv[1]) == "--runs") runs = std::max(1, std::atoi(argv[2]));
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);

  std::vector<double> off_first, off_compile, cold_first, warm_first, cold_compile, warm_compile,
      execute, second;
  for (int r = 0; r < runs; ++r) {
    Sample off = run_child(self, "");
    if (off.counters["UncachedCompile"] != 1 || off.counters["PersistentCacheMiss"] != 0) {
      std::fprintf(stderr, "unexpected run without a persistent cache\n");
      return 1;
    }
    off_first.push_back(off.first_us);
    off_compile.push_back(off.compile_us);
    const std::string tmpl = new_dir();
    Sample cold = run_child(self, tmpl);
    Sample warm = run_child(self, tmpl);
    std::filesystem::remove_all(tmpl);
    if (cold.counters["PersistentCacheMiss"] != 1 || cold.counters["UncachedCompile"] != 1 ||
        warm.counters["PersistentCacheHit"] != 1 || warm.counters["UncachedCompile"] != 0 ||
        cold.loss != warm.loss || cold.loss != off.loss) {
      std::fprintf(stderr, "unexpected run: cold miss %lld compile %lld, warm hit %lld compile %lld, "
                   "losses '%s' and '%s'\n", cold.counters["PersistentCacheMiss"],
                   cold.counters["UncachedCompile"], warm.counters["PersistentCacheHit"],
                   warm.counters["UncachedCompile"], cold.loss.c_str(), warm.loss.c_str());
      return 1;
    }
    cold_first.push_back(cold.first_us);
    warm_first.push_back(warm.first_us);
    cold_compile.push_back(cold.compile_us);
    warm_compile.push_back(warm.compile_us);
    for (const Sample* s : {&off, &cold, &warm}) execute.push_back(s->execute_us);
    second.push_back(off.second_us);
    second.push_back(cold.second_us);
    second.push_back(warm.second_us);
  }
  std::printf("## Persistent cache: first-step latency, cold process against warm process\n\n");
  std::printf("Workload: an MLP training step %lld-%lld-%lld, batch %lld, softmax cross-entropy with hand-written "
              "gradients and SGD through `add_` (lr %.1f), fixed pseudo-random data, traced and run by "
              "`mark_step()`. Each of %d rounds starts three fresh processes: one without a persistent cache, a "
              "cold one on an empty cache directory, and a warm one on the directory the cold one filled. first "
              "step = from the first traced op to the loss (trace, compile or load, execute); the second step "
              "hits the in-memory cache. Every round checks the cache counters (cold: one miss and one compile; "
              "warm: one hit, no compile) and that the three processes' losses are equal. OPENBLAS_NUM_THREADS=%s. "
              "Microseconds, median [min, max] over the rounds.\n\n",
              static_cast<long long>(kIn), static_cast<long long>(kHidden), static_cast<long long>(kOut),
              static_cast<long long>(kBatch), kLearningRate, runs, std::getenv("OPENBLAS_NUM_THREADS"));
  std::printf("| measure | us |\n|---|---:|\n");
  row("no persistent cache: first step", off_first);
  row("&nbsp;&nbsp;of which compile", off_compile);
  row("cold process: first step", cold_first);
  row("&nbsp;&nbsp;of which compile (miss, write)", cold_compile);
  row("**warm process: first step**", warm_first);
  row("&nbsp;&nbsp;of which load from disk (hit)", warm_compile);
  row("any process: first execution", execute);
  row("any process: second step (in-memory cache)", second);
  std::printf("\ncold / warm first-step ratio (medians): **%.2fx**; no cache / warm: %.2fx.\n",
              median(cold_first) / median(warm_first), median(off_first) / median(warm_first));
  return generated(self, runs);
}
