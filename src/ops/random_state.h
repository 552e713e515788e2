// The default generator's offset, as loops see it (src/trace/loops.cpp): while a loop body is
// traced, the offset is a carry of the loop, so every iteration draws new numbers, the same
// ones as the unrolled loop, and the generator continues from where the loop ends.
#pragma once

#include "lazyrt/tensor.h"

namespace lazyrt::detail {

/// Installs `offset` as the generator's offset tensor and returns the one it replaces.
Tensor exchange_random_offset(Tensor offset);

}  // namespace lazyrt::detail
