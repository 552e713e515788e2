// The interpreter of an elementwise region (fused.cpp), shared by the fused kernels: the
// fusion kernel walks its BroadcastLayout with it, the fused reductions (fused_rows.cpp) walk
// their rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/kernels/loops.h"
#include "ir/graph.h"

namespace lazyrt::kernels {

struct Instr;

/// A region of parameters, constants and elementwise ops (casts and where included), turned
/// once into a list of instructions; running it computes its outputs over n elements in blocks,
/// every intermediate value in small arrays on the stack.
class ElementwiseProgram {
 public:
  explicit ElementwiseProgram(const ir::Graph& region);
  ~ElementwiseProgram();

  /// n elements: element i of operand k is at element off[k] + i * st[k] of in[k]; element i
  /// of output j is stored at element out_offset + i of out[j], after every operand element of
  /// its block is read (an output may share an operand's buffer). `repeats`: the layout whose
  /// repeated operands (BroadcastLayout::repeat) this run reads, the run beginning at element
  /// `run_pos` of its innermost dim; null where no operand repeats.
  void run(const void* const* in, const int64_t* off, const int64_t* st, int64_t n, void* const* out,
           int64_t out_offset, const BroadcastLayout* repeats = nullptr, int64_t run_pos = 0) const;

  /// The ops it runs per element.
  size_t num_ops() const;

 private:
  struct Operand;
  struct Result;
  std::vector<Operand> operands_;
  std::vector<Result> results_;
  std::vector<Instr> code_;
  std::vector<int16_t> temps_;  // values computed into stack slots
  std::vector<std::pair<int16_t, const void*>> constants_;
  std::unique_ptr<double[]> constant_blocks_;  // a block of compute values per constant
};

}  // namespace lazyrt::kernels
