// The default generator's offset, as loops see it (src/loops/loops.cpp): while a loop body is
// traced, the offset is a carry of the loop, so every iteration draws new numbers, the same
// ones as the unrolled loop, and the generator continues from where the loop ends.
#pragma once

#include "lazyrt/tensor.h"

namespace lazyrt::detail {

/// Installs `offset` as the offset the calling thread's draws advance (the generator's own
/// offset, given back, ends that) and returns the one it replaces. Other threads' draws keep
/// advancing the generator's own offset meanwhile.
Tensor exchange_random_offset(Tensor offset);

}  // namespace lazyrt::detail
