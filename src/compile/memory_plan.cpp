#include "compile/memory_plan.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "util/check.h"

namespace lazyrt::compile {
namespace {

size_t align(size_t n) {
  return n == 0 ? kArenaAlignment : (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// Free blocks by offset, coalesced; the arena grows at its top when nothing fits.
class FreeList {
 public:
  size_t take(size_t bytes, size_t* top, size_t* blocks) {
    // Best fit: the smallest free block that holds it.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    if (best != free_.end()) {
      size_t off = best->first, size = best->second;
      free_.erase(best);
      if (size > bytes) free_[off + bytes] = size - bytes;
      return off;
    }
    // A free block at the top can be extended instead of leaving a hole.
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == *top) {
        size_t off = last->first;
        free_.erase(last);
        *top = off + bytes;
        return off;
      }
    }
    ++*blocks;
    size_t off = *top;
    *top = detail::bytes_add(*top, bytes, "memory plan: the arena");
    return off;
  }
  void give(size_t off, size_t bytes) {
    auto it = free_.emplace(off, bytes).first;
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

 private:
  std::map<size_t, size_t> free_;
};

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferRequest>& reqs) {
  MemoryPlan plan;
  plan.offsets.assign(reqs.size(), 0);
  int32_t steps = 0;
  for (const auto& r : reqs) {
    LAZYRT_ASSERT(r.last >= r.first, "request lives backwards");
    steps = std::max(steps, r.last + 1);
  }
  std::vector<std::vector<int32_t>> defined_at(steps), dies_at(steps);
  for (size_t i = 0; i < reqs.size(); ++i) {
    defined_at[reqs[i].first].push_back(static_cast<int32_t>(i));
    dies_at[reqs[i].last].push_back(static_cast<int32_t>(i));
  }
  // owner[i]: the request whose block request i's memory belongs to (itself unless it took
  // over another's block); a block is released when its last holder dies.
  std::vector<bool> taken_over(reqs.size(), false);
  FreeList free;
  size_t top = 0;
  for (int32_t s = 0; s < steps; ++s) {
    for (int32_t i : defined_at[s]) {
      const BufferRequest& r = reqs[i];
      int32_t j = r.inplace_of;
      if (j >= 0 && reqs[j].last == s && !taken_over[j] && align(reqs[j].bytes) == align(r.bytes) &&
          reqs[j].first < s) {
        taken_over[j] = true;
        plan.offsets[i] = plan.offsets[j];
        continue;
      }
      plan.offsets[i] = free.take(align(r.bytes), &top, &plan.distinct_blocks);
    }
    for (int32_t i : dies_at[s])
      if (!taken_over[i]) free.give(plan.offsets[i], align(reqs[i].bytes));
  }
  plan.arena_bytes = top;
  return plan;
}

}  // namespace lazyrt::compile
