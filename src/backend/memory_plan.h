// Arena memory planning over a step list.
//
// Each request is a buffer defined by step `first` and last read by step `last`. Buffers whose
// lifetimes do not overlap share memory. A request may name another (`inplace_of`) whose last
// read is its defining step: it then takes over that buffer (the kernel writes its result over
// its operand), as long as the sizes match and nobody else took it first. At a step, results
// are placed before that step's dead operands are released, so a kernel never writes over an
// input it is still reading unless the request said it may.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lazyrt::backend {

struct BufferRequest {
  size_t bytes = 0;
  int32_t first = 0;
  int32_t last = 0;
  int32_t inplace_of = -1;
};

struct MemoryPlan {
  std::vector<size_t> offsets;  // per request, into the arena
  size_t arena_bytes = 0;
  size_t distinct_blocks = 0;  // how many distinct offsets the blocks of the arena start at
};

inline constexpr size_t kArenaAlignment = 64;

MemoryPlan plan_memory(const std::vector<BufferRequest>& requests);

}  // namespace lazyrt::backend
