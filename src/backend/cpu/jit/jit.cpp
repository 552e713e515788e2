// Modules of generated kernels and the background compiler thread (see jit.h).
#include "backend/cpu/jit/jit.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "scalar/elementwise_fns.h"
#include "ir/hash.h"
#include "backend/cpu/jit/code_server.h"
#include "lazyrt/cache.h"
#include "lazyrt/metrics.h"
#include "util/check.h"
#include "util/metrics_cells.h"

namespace lazyrt::jit {
namespace {

Mode mode_from_env() {
  const char* env = std::getenv("LAZYRT_JIT");
  if (!env || !*env || std::strcmp(env, "1") == 0 || std::strcmp(env, "on") == 0) return Mode::Tiered;
  if (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0) return Mode::Off;
  if (std::strcmp(env, "sync") == 0) return Mode::Sync;
  std::fprintf(stderr, "lazyrt: LAZYRT_JIT=%s is not one of 0, off, 1, on, sync; generated kernels are on\n", env);
  return Mode::Tiered;
}

std::atomic<Mode>& mode_cell() {
  static std::atomic<Mode> m{mode_from_env()};
  return m;
}

bool generated_form(const ir::Node& n) {
  switch (n.op) {
    case ir::OpKind::Parameter:
    case ir::OpKind::Full:
    case ir::OpKind::Cast:
    case ir::OpKind::Where: return true;
    default: return scalar::has_elementwise_fn(n.op);
  }
}

// The generator: the compiler process's client (code_server.h).
struct Loaded {
  Generator* gen = nullptr;
  std::string error;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    r.gen = process_generator(r.error);
    return r;
  }();
  return l;
}

// The background compiler: one thread, modules in the order they became hot.
class Compiler {
 public:
  void submit(std::shared_ptr<Module> m) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;  // shut down: the interpreter keeps running the module
    queue_.push_back(std::move(m));
    ++pending_;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    wake_.notify_one();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return pending_ == 0; });
  }
  // Drops what waits, ends the compile in flight (its module keeps running interpreted), and
  // ends the thread.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      pending_ -= static_cast<int>(queue_.size());
      queue_.clear();
      wake_.notify_one();
    }
    if (thread_.joinable() && loaded().gen) loaded().gen->abort();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    idle_.notify_all();
  }
  ~Compiler() { shutdown(); }
  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

  // fork(): the child has no compiler thread, and the generator's lock may have been held by
  // it. The child drops the thread's handle and what was queued, and runs the interpreter only
  // (generation off), so it never waits on either.
  void before_fork() { mu_.lock(); }
  void after_fork_in_parent() { mu_.unlock(); }
  void after_fork_in_child() {
    new (&thread_) std::thread();  // the parent's handle: not joinable here, never destroyed
    // The parent's thread may have been waiting on them: their state counts a waiter the child
    // does not have (destroying them would wait for it forever).
    new (&wake_) std::condition_variable();
    new (&idle_) std::condition_variable();
    queue_.clear();
    pending_ = 0;
    stop_ = true;
    mu_.unlock();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      std::shared_ptr<Module> m = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      // A module whose graph is gone (only the queue holds it) needs no code.
      if (m.use_count() > 1) {
        try {
          compile_now(*m);
        } catch (const std::exception& e) {
          if (!stopping()) {  // else shutdown() ended it
            metrics::increment("JitFailures", 1);
            static std::once_flag warned;
            std::call_once(warned, [&] {
              std::fprintf(stderr, "lazyrt: generating kernels failed, the interpreter runs them: %s\n", e.what());
            });
          }
        }
      }
      m.reset();
      lock.lock();
      if (--pending_ == 0) idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::shared_ptr<Module>> queue_;
  int pending_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

std::atomic<Compiler*> the_compiler{nullptr};

Compiler& compiler() {
  (void)loaded();
  static Compiler c;
  static const bool registered = [] {
    the_compiler.store(&c);
    pthread_atfork([] { c.before_fork(); }, [] { c.after_fork_in_parent(); },
                   [] {
                     c.after_fork_in_child();
                     set_mode(Mode::Off);
                   });
    return true;
  }();
  (void)registered;
  return c;
}

}  // namespace

std::atomic<int64_t> threshold{int64_t{1} << 22};

Mode mode() { return mode_cell().load(std::memory_order_relaxed); }
int64_t compile_threshold() { return threshold.load(std::memory_order_relaxed); }
void set_compile_threshold(int64_t element_ops) { threshold.store(element_ops, std::memory_order_relaxed); }
void set_mode(Mode m) { mode_cell().store(m, std::memory_order_relaxed); }

Generator* generator() {
  if (mode() == Mode::Off) return nullptr;
  const Loaded& l = loaded();
  if (!l.gen) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr, "lazyrt: no generated kernels (%s); the interpreter runs them\n", l.error.c_str());
    });
  }
  return l.gen;
}

std::shared_ptr<Module> new_module() {
  if (mode() == Mode::Off) return nullptr;
  return std::make_shared<Module>();
}

int Module::add(FusedRegion r) {
  auto takes = [&](const ir::Graph& g) {
    for (const ir::Node& n : g.nodes) {
      if (!generated_form(n)) return false;
      if (r.cond)
        for (const ir::TensorType& t : n.results)
          if (t.numel() != 1) return false;
    }
    return true;
  };
  if (!takes(r.region) || (r.cond && !takes(*r.cond))) return -1;
  // Equal regions by their 128-bit hash, as the compile caches tell graphs apart.
  const GraphHash gh = ir::hash_graph(r.region);
  ir::Hasher h;
  h.add(gh.hi);
  h.add(gh.lo);
  h.add(static_cast<uint64_t>(r.inner_strides.size()));
  for (int64_t s : r.inner_strides) h.add(static_cast<uint64_t>(s));
  if (r.cond) {
    const GraphHash ch = ir::hash_graph(*r.cond);
    h.add(ch.hi);
    h.add(ch.lo);
  }
  const GraphHash key = h.finish();
  const auto [at, fresh] = region_index_.try_emplace({key.hi, key.lo}, static_cast<int>(regions_.size()));
  if (fresh) {
    regions_.push_back(std::move(r));
    fns_.push_back(std::make_unique<std::atomic<FusedFn>>(nullptr));
  }
  region_of_.push_back(at->second);
  return static_cast<int>(region_of_.size()) - 1;
}

void Module::finish(const std::shared_ptr<Module>& m) {
  if (!m || m->empty()) return;
  if (mode() == Mode::Tiered && !cache::persistent_dir().empty()) {
    Generator* gen = generator();
    if (!gen) return;
    try {
      std::vector<FusedFn> fns;
      if (std::shared_ptr<void> code = gen->load_cached(m->regions(), fns)) {
        m->submitted_.store(true);
        m->install(std::move(code), fns);
        metrics::increment("JitModules", 1);
        metrics::increment("JitKernels", static_cast<int64_t>(fns.size()));
      }
    } catch (const std::exception&) {  // not loaded: compiled once hot, as without a cache
      metrics::increment("JitFailures", 1);
    }
    return;
  }
  if (mode() != Mode::Sync) return;
  m->submitted_.store(true);
  try {
    compile_now(*m);
  } catch (const std::exception& e) {
    metrics::increment("JitFailures", 1);
    std::fprintf(stderr, "lazyrt: generating kernels failed, the interpreter runs them: %s\n", e.what());
  }
}

void Module::ran_interpreted(const std::shared_ptr<Module>& self, int k, int64_t work) {
  if (submitted_.load(std::memory_order_relaxed)) return;
  const int runs = k == 0 ? runs_.fetch_add(1, std::memory_order_relaxed) + 1 : runs_.load(std::memory_order_relaxed);
  const int64_t total = work_.fetch_add(work, std::memory_order_relaxed) + work;
  if (runs < kCompileAfterRuns || total < compile_threshold()) return;
  if (submitted_.exchange(true)) return;
  if (mode() == Mode::Off) return;
  // The compiler thread compiles only once the generator is ready for it (see shutdown()).
  static const bool prepared = [] {
    Generator* gen = generator();
    if (!gen) return false;
    try {
      gen->prepare();
      return true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lazyrt: generated kernels are off: %s\n", e.what());
      return false;
    }
  }();
  if (prepared) compiler().submit(self);
}

void Module::install(std::shared_ptr<void> code, const std::vector<FusedFn>& fns) {
  LAZYRT_ASSERT(fns.size() == fns_.size(), "generated ", fns.size(), " loops for ", fns_.size(), " regions");
  code_ = std::move(code);
  for (size_t k = 0; k < fns.size(); ++k) fns_[k]->store(fns[k], std::memory_order_release);
}

void compile_now(Module& m) {
  Generator* gen = generator();
  if (!gen) throw Error("generated kernels: " + (mode() == Mode::Off ? std::string("LAZYRT_JIT is off") : loaded().error));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<FusedFn> fns;
  std::shared_ptr<void> code = gen->compile(m.regions(), fns);
  m.install(std::move(code), fns);
  metrics::increment("JitModules", 1);
  metrics::increment("JitKernels", static_cast<int64_t>(fns.size()));
  metrics::record_timing("JitCompileTime",
                                 std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

void wait_idle() {
  if (Compiler* c = the_compiler.load()) c->wait_idle();
}

void shutdown() {
  set_mode(Mode::Off);
  if (Compiler* c = the_compiler.load()) c->shutdown();
}

}  // namespace lazyrt::jit
