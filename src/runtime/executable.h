// An Executable: the compiled form of one graph. A flat list of steps, each a kernel with its
// operand and result slots resolved at compile time, an arena sized at compile time, and the
// graph's constants already filled in.
//
// run() binds the parameter and output pointers, then calls the kernels in order. It allocates
// nothing. One Executable may be shared by several threads; runs are serialized by its mutex.
// An owner that runs an executable many times over a few fixed sets of buffers (a loop body
// over its two carry sets) binds each set once into a Binding and runs that, so the pointers
// are not resolved again on every run.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <functional>

#include "ir/graph.h"
#include "runtime/buffer.h"

namespace lazyrt::metrics::detail {
struct StepCells;
}

namespace lazyrt::runtime {

/// A step's work: in holds one pointer per input; out one per output, then the workspace if the
/// step has one. Backends make these (a CPU kernel, a region's sub-executables).
using KernelFn = std::function<void(const void* const* in, void* const* out)>;

enum class SlotKind : uint8_t { Arena, Param, Output, Const };

/// Where a value lives: an arena offset, parameter i, output i, or a constant offset.
struct Slot {
  SlotKind kind = SlotKind::Arena;
  int32_t index = 0;
  size_t offset = 0;
};

struct Step {
  ir::OpKind op;
  KernelFn fn;
  std::vector<Slot> in;
  std::vector<Slot> out;  // results, then the workspace if the kernel has one
  int64_t bytes = 0;      // its operands' and results' bytes: what it must read and write at least
  // The bytes of each slot of in, then of out (the workspace's: 0), where the step may run
  // again on the same operands (metrics' alone timings: no collective, no loop); else empty.
  std::vector<size_t> repeat_sizes;
};

/// How the executable produces output k.
struct OutputSource {
  enum class Kind : uint8_t {
    Computed,  // a step writes it into the output pointer the caller passes
    Param,     // it is parameter `index`, unchanged: the caller reuses that buffer
    Const,     // it is constant buffer `index` of the executable
    Alias,     // it is the same value as output `index`
  };
  Kind kind = Kind::Computed;
  int32_t index = 0;
};

struct ExecutableStats {
  size_t steps = 0;
  size_t arena_bytes = 0;
  size_t arena_blocks = 0;
  size_t constant_bytes = 0;
};

class Executable {
 public:
  struct Parts {
    ir::Graph graph;  // the optimized graph this was lowered from
    std::vector<Step> steps;
    size_t arena_bytes = 0;
    size_t arena_blocks = 0;
    std::shared_ptr<Buffer> constants;
    /// arena_bytes of memory, from the backend that lowered the graph (Backend::allocate).
    std::shared_ptr<Buffer> arena;
    std::vector<std::shared_ptr<Buffer>> constant_outputs;
    std::vector<OutputSource> outputs;
    std::vector<bool> donation_accepted;  // per output
    std::vector<ir::TensorType> param_types;
    std::vector<ir::TensorType> output_types;
  };
  explicit Executable(Parts parts);
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  /// params[i]: buffer of parameter i (may be null if the graph does not read it).
  /// outputs[k]: destination of output k when outputs()[k] is Computed; for a donated output
  /// the caller passes the donated parameter's buffer.
  void run(const void* const* params, void* const* outputs);
  /// As run(), without taking the mutex: for an executable owned by one step of another
  /// (a loop body), which the owner's own run already serializes.
  void run_unlocked(const void* const* params, void* const* outputs);

  /// Every kernel argument of one run, the parameter and output pointers included.
  class Binding {
   private:
    friend class Executable;
    std::vector<void*> args_;
  };
  /// A binding sized for this executable. It allocates, so make bindings ahead of running.
  Binding make_binding() const { Binding b; b.args_ = args_; return b; }
  /// Fills `b` (made by make_binding() of this executable) with these pointers, as run()
  /// takes them. Allocates nothing.
  void bind(Binding& b, const void* const* params, void* const* outputs) const;
  /// As run_unlocked(), with the pointers bound into `b`: no lock, no allocation.
  void run_bound(const Binding& b);

  const std::vector<OutputSource>& outputs() const { return parts_.outputs; }
  const std::vector<ir::TensorType>& output_types() const { return parts_.output_types; }
  const std::vector<ir::TensorType>& param_types() const { return parts_.param_types; }
  /// Whether output k may be written into the parameter buffer the caller offered to donate.
  bool donation_accepted(size_t k) const { return parts_.donation_accepted[k]; }
  const std::shared_ptr<Buffer>& constant_output(int32_t i) const {
    return parts_.constant_outputs[i];
  }
  const ir::Graph& graph() const { return parts_.graph; }
  ExecutableStats stats() const;
  /// The memory this executable holds for its whole life: its arena, its constants and the
  /// buffers of its constant outputs (what the caches weigh it by).
  size_t held_bytes() const;
  /// One line per step: "3: add(arena+0, param 1) -> out 0".
  std::string to_text() const;

 private:
  struct Patch {
    uint32_t arg;
    SlotKind kind;
    int32_t index;
  };
  // Writes the parameter and output pointers into their places in `args`.
  void patch(std::vector<void*>& args, const void* const* params, void* const* outputs) const;
  void run_steps(void* const* args);
  void run_steps_timed(void* const* args);  // metrics::kernel_timings() on
  // Whether step i may run again on the pointers `args` binds (metrics' alone timings); if so,
  // `saved` holds copies of the operands its results overwrite (by operand index).
  bool save_overwritten(size_t i, void* const* args, std::vector<std::pair<size_t, std::vector<char>>>& saved) const;

  Parts parts_;
  std::vector<void*> args_;                             // all kernel arguments, step by step
  std::vector<std::pair<uint32_t, uint32_t>> bases_;    // per step: first input, first output
  std::vector<Patch> patches_;                          // arguments bound at run time
  std::mutex mu_;
  int64_t id_;                                           // metrics::StepTiming::executable
  std::unique_ptr<metrics::detail::StepCells> step_cells_;  // made on the first timed run
};

}  // namespace lazyrt::runtime
