#include "backend/memory_plan.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <set>

#include "util/check.h"

namespace lazyrt::backend {
namespace {

size_t align(size_t n) {
  return n == 0 ? kArenaAlignment : (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// Free blocks by offset, coalesced; the arena grows at its top when nothing fits.
class FreeList {
 public:
  size_t take(size_t bytes, size_t* top) {
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

// A block of the arena: a request and the requests that took its memory over in turn, live
// from the first one's definition to the last one's last read.
struct Block {
  size_t bytes = 0;
  int32_t first = 0;
  int32_t last = 0;
};

bool live_together(const Block& a, const Block& b) { return a.first <= b.last && b.first <= a.last; }

// Blocks placed in step order: at each step, the blocks defined there take the best-fitting
// free memory, then the blocks whose last reader it is give theirs back.
std::vector<size_t> place_in_step_order(const std::vector<Block>& blocks, int32_t steps, size_t* top) {
  std::vector<std::vector<int32_t>> starts(steps), ends(steps);
  for (size_t b = 0; b < blocks.size(); ++b) {
    starts[blocks[b].first].push_back(static_cast<int32_t>(b));
    ends[blocks[b].last].push_back(static_cast<int32_t>(b));
  }
  std::vector<size_t> offsets(blocks.size(), 0);
  FreeList free;
  *top = 0;
  for (int32_t s = 0; s < steps; ++s) {
    for (int32_t b : starts[s]) offsets[b] = free.take(blocks[b].bytes, top);
    for (int32_t b : ends[s]) free.give(offsets[b], blocks[b].bytes);
  }
  return offsets;
}

// Blocks placed largest first, each at the lowest offset where it overlaps no block already
// placed that is live with it. Step order places a buffer before knowing what comes later and
// leaves holes that later, larger buffers cannot use; by size, the large blocks pack first and
// the small ones fill between them. Quadratic in the blocks.
std::vector<size_t> place_by_size(const std::vector<Block>& blocks, size_t* top) {
  std::vector<int32_t> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return blocks[a].bytes != blocks[b].bytes ? blocks[a].bytes > blocks[b].bytes : blocks[a].first < blocks[b].first;
  });
  std::vector<size_t> offsets(blocks.size(), 0);
  std::vector<int32_t> placed;
  std::vector<std::pair<size_t, size_t>> taken;  // [offset, end) of placed blocks live with this one
  *top = 0;
  for (int32_t b : order) {
    taken.clear();
    for (int32_t p : placed)
      if (live_together(blocks[b], blocks[p])) taken.emplace_back(offsets[p], offsets[p] + blocks[p].bytes);
    std::sort(taken.begin(), taken.end());
    size_t off = 0;
    for (const auto& [start, end] : taken) {
      if (start >= off + blocks[b].bytes) break;
      off = std::max(off, end);
    }
    offsets[b] = off;
    *top = std::max(*top, detail::bytes_add(off, blocks[b].bytes, "memory plan: the arena"));
    placed.push_back(b);
  }
  return offsets;
}

// Placing by size costs a pass over the placed blocks per block: beyond this many blocks (a
// graph of an unrolled host loop), only step order.
constexpr size_t kMostBlocksPlacedBySize = 16384;

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferRequest>& reqs) {
  MemoryPlan plan;
  plan.offsets.assign(reqs.size(), 0);
  int32_t steps = 0;
  for (const auto& r : reqs) {
    LAZYRT_ASSERT(r.last >= r.first, "request lives backwards");
    steps = std::max(steps, r.last + 1);
  }
  std::vector<std::vector<int32_t>> defined_at(steps);
  for (size_t i = 0; i < reqs.size(); ++i) defined_at[reqs[i].first].push_back(static_cast<int32_t>(i));
  // block_of[i]: the block request i's memory belongs to. A request takes over the block of
  // the operand it names when that operand's last read is its definition, nobody took it
  // first, and the sizes match.
  std::vector<int32_t> block_of(reqs.size(), -1);
  std::vector<bool> taken_over(reqs.size(), false);
  std::vector<Block> blocks;
  for (int32_t s = 0; s < steps; ++s) {
    for (int32_t i : defined_at[s]) {
      const BufferRequest& r = reqs[i];
      int32_t j = r.inplace_of;
      if (j >= 0 && reqs[j].last == s && !taken_over[j] && align(reqs[j].bytes) == align(r.bytes) &&
          reqs[j].first < s) {
        taken_over[j] = true;
        block_of[i] = block_of[j];
        Block& b = blocks[static_cast<size_t>(block_of[i])];
        b.last = std::max(b.last, r.last);
        continue;
      }
      block_of[i] = static_cast<int32_t>(blocks.size());
      blocks.push_back({align(r.bytes), r.first, r.last});
    }
  }
  size_t top = 0;
  std::vector<size_t> offsets = place_in_step_order(blocks, steps, &top);
  if (blocks.size() <= kMostBlocksPlacedBySize) {
    size_t by_size_top = 0;
    std::vector<size_t> by_size = place_by_size(blocks, &by_size_top);
    if (by_size_top < top) {
      offsets = std::move(by_size);
      top = by_size_top;
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) plan.offsets[i] = offsets[static_cast<size_t>(block_of[i])];
  plan.arena_bytes = top;
  plan.distinct_blocks = std::set<size_t>(offsets.begin(), offsets.end()).size();
  return plan;
}

}  // namespace lazyrt::backend
