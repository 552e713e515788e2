// Generated kernels: the fusion regions of a graph compiled to machine code (LLVM, in a compiler
// process of its own: code_server.h),
// tiered behind the fused interpreter (backend/cpu/kernels/fused.cpp).
//
// Lowering a graph for the cpu backend gives its fused kernels one Module. Each fusion region
// the code generator takes is added to it; the fused kernel runs the interpreter until the
// module's code is ready, then the generated loop. A module is compiled as one LLVM module,
// all of its kernels together, on a background thread, once it is hot: its graph has run at
// least twice and its kernels have interpreted at least compile_threshold() element-ops
// (elements times ops; 2^22 by default, a few milliseconds of interpreting, against ~30 ms to
// compile a module). A graph run once, or a small graph run a few times (most tests, one-off
// code), never pays for compilation. The interpreter stays as the fallback (a region the
// generator does not take, a failed compilation) and as the reference the generated code is
// tested against.
//
// LAZYRT_JIT (read once): 0 or off: no generated code; sync: a module is compiled when its
// graph is lowered, before the first run (tests, benchmarks that time steady state from the
// first call); unset, 1 or on: tiered, as above. LAZYRT_JIT_DUMP=dir writes each module's
// optimized LLVM IR there (lazyrt_kernels_<n>.ll).
//
// fork(): a child has no compiler thread; it drops the parent's queue and runs the interpreter
// only (generation off), so it never waits on a lock or thread of the parent's.
//
// The code generator runs in a process of its own, lazyrt-jitc, beside liblazyrt.so, started
// when the first module is compiled (code_server.h): this process never loads LLVM. If it
// cannot be run, generation is off (one warning on stderr).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace lazyrt::jit {

enum class Mode { Off, Tiered, Sync };
/// LAZYRT_JIT's mode, or set_mode()'s.
Mode mode();
/// For the whole process, for modules lowered from now on.
void set_mode(Mode m);

/// A fusion region's loop over one innermost run of its BroadcastLayout: for i < n, element
/// i of the run reads operand k at element off[k] + i * inner_strides[k] of in[k] and writes
/// result j at element out_offset + i of out[j]. Results are stored after the operands they
/// may overwrite are read (a result may share an operand's buffer, as in the interpreter).
using FusedFn = void (*)(const void* const* in, const int64_t* off, void* const* out, int64_t out_offset,
                         int64_t n);

/// A whole while loop over one-element values: in[k] holds operand k (the carries, then the
/// captures), out[k] receives carry k's final value. An out may be an in's buffer.
using LoopFn = void (*)(const void* const* in, void* const* out);

/// What a generated loop is made from: a fusion region (a FusedFn), or a while loop whose
/// operands and values all have one element (a LoopFn).
struct FusedRegion {
  ir::Graph region;                    // the fusion node's region, or the loop's body
  std::vector<int64_t> inner_strides;  // per operand, its element stride within a run; none for a loop
  /// A loop's condition (one b8 value); the body's outputs are the new carries. Both read the
  /// loop's operands as their parameters. Every op is one the generator takes.
  std::optional<ir::Graph> cond;
};

/// The generated kernels of one lowered graph. Kernels with equal regions (the same ops, types
/// and strides: every layer of a model, every iteration of an unrolled loop) share one loop,
/// compiled once.
class Module {
 public:
  static constexpr int kCompileAfterRuns = 2;

  /// Whether the generator takes this region (parameters, constants, casts, where and the ops
  /// of the elementwise table: the kernel library has a function for each; for a loop, in
  /// its cond and body, over one-element values only); if so, adds it
  /// (or finds an equal one added before) and returns the kernel's index, else -1. Indices
  /// number the kernels added, 0 the first.
  int add(FusedRegion r);
  /// Called once lowering has added every region: compiles now in Sync mode; in tiered mode,
  /// loads the module's code now where the persistent cache holds it (a warm process runs
  /// generated code from the first step, and never starts the compiler for it).
  static void finish(const std::shared_ptr<Module>& m);

  /// The loop of kernel k once compiled, else null.
  FusedFn fn(int k) const {
    return fns_[static_cast<size_t>(region_of_[static_cast<size_t>(k)])]->load(std::memory_order_acquire);
  }
  /// The same for a kernel added as a while loop (a region with a cond).
  LoopFn loop_fn(int k) const { return reinterpret_cast<LoopFn>(reinterpret_cast<void (*)()>(fn(k))); }
  /// Kernel k of the module ran interpreted, `work` element-ops: counts toward compilation.
  /// Kernel 0 counts the graph's runs.
  void ran_interpreted(const std::shared_ptr<Module>& self, int k, int64_t work);
  bool empty() const { return regions_.empty(); }

  /// The distinct regions, in the order of their first kernels: what is compiled.
  const std::vector<FusedRegion>& regions() const { return regions_; }
  /// Installs the compiled code: fns[r] for region r; `code` owns their memory.
  void install(std::shared_ptr<void> code, const std::vector<FusedFn>& fns);

 private:
  std::vector<FusedRegion> regions_;
  std::map<std::pair<uint64_t, uint64_t>, int> region_index_;  // a region's hash (graph and strides)
  std::vector<int> region_of_;          // per kernel: its region
  std::vector<std::unique_ptr<std::atomic<FusedFn>>> fns_;  // per region
  std::shared_ptr<void> code_;
  std::atomic<int> runs_{0};
  std::atomic<int64_t> work_{0};
  std::atomic<bool> submitted_{false};
};

/// Element-ops a module's kernels interpret before it is compiled (tiered mode).
int64_t compile_threshold();
void set_compile_threshold(int64_t element_ops);

/// A new module for a graph being lowered, or null where generation is off.
std::shared_ptr<Module> new_module();

/// Compiles `m` on the calling thread; throws lazyrt::Error if the generator fails or is absent.
void compile_now(Module& m);
/// Waits until every module handed to the background thread so far is compiled (or failed).
void wait_idle();
/// Generation off for the rest of the process: drops the modules waiting to be compiled and
/// ends the one being compiled (Generator::abort; its module stays interpreted). The Python package calls it from its atexit hook, before
/// the interpreter finalizes; the compiler thread's own static ends it at exit otherwise.
void shutdown();

/// The code generator (code_server.h's process_generator).
class Generator {
 public:
  virtual ~Generator() = default;
  /// Compiles the regions as one module; fns receives one loop per region. The result owns the
  /// code. Throws lazyrt::Error.
  virtual std::shared_ptr<void> compile(const std::vector<FusedRegion>& regions, std::vector<FusedFn>& fns) = 0;
  /// The regions' code where the persistent cache holds it (fns filled, as compile does), else
  /// null: nothing is compiled.
  virtual std::shared_ptr<void> load_cached(const std::vector<FusedRegion>& regions, std::vector<FusedFn>& fns) = 0;
  /// Checks that the generator can compile before modules are handed to the compiler thread.
  /// Throws lazyrt::Error.
  virtual void prepare() = 0;
  /// Ends the compile in flight, if any: compile() throws, now and from then on. Any thread.
  virtual void abort() = 0;
  /// The generator's version, the LLVM version and the CPU's (code_fingerprint()).
  virtual std::string fingerprint() const = 0;
};

/// The generator, or null (generation off, or the compiler missing).
Generator* generator();

}  // namespace lazyrt::jit
