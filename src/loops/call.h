// Functions recorded as call nodes (ops.def): a computation that repeats over operands of the
// same types (an optimizer's update of each parameter) is traced once into a region, and each
// use records one node that owns it. The trace then records, hashes and drops one node per use
// instead of one per op, and compile inlines the region again (compile::inline_calls), so
// what runs is what tracing the function each time would have given.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "lazyrt/loops.h"

namespace lazyrt::detail {

class TracedFunction {
 public:
  using Fn = std::function<Carry(const Carry&)>;
  /// `fn` must compute its results from its operands and constants only: a tensor it reads
  /// from elsewhere, or a random draw, is refused (lazyrt::Error naming `name`) when it is
  /// traced.
  TracedFunction(std::string name, Fn fn);

  /// fn(operands), as one call node. Where a gradient could be recorded (grad mode on and an
  /// operand that requires grad, or a loop body being differentiated), fn runs as itself:
  /// a call has no gradient rule.
  Carry operator()(const Carry& operands);
  /// The same into `results` (cleared first), whose capacity a caller can keep.
  void apply(const Carry& operands, Carry& results);

  /// Forgets the traced regions: from now on the function computes something else.
  void clear() { traced_.clear(); }
  /// How many regions are kept (one per distinct list of operand types).
  size_t regions() const { return traced_.size(); }

 private:
  struct Traced {
    std::vector<ir::TensorType> types;
    std::shared_ptr<const ir::Graph> region;
    std::vector<ir::TensorType> results;  // the region's outputs
  };
  const Traced& trace(const Carry& operands);

  std::string name_;
  std::string in_place_error_;
  Fn fn_;
  std::vector<Traced> traced_;
};

}  // namespace lazyrt::detail
