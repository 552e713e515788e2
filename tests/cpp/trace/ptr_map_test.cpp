// util::PtrMap, the flat pointer-keyed table graph extraction uses, against std::unordered_map.
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

#include "util/ptr_map.h"

namespace lazyrt {

TEST(PtrMap, MatchesAnUnorderedMapThroughGrowthAndClear) {
  std::vector<int> storage(5000);
  std::mt19937 rng(3);
  util::PtrMap<int32_t> map;
  std::unordered_map<const void*, int32_t> want;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4000; ++i) {
      const void* key = &storage[rng() % storage.size()];
      auto [value, fresh] = map.emplace(key, i);
      auto [it, want_fresh] = want.emplace(key, i);
      ASSERT_EQ(fresh, want_fresh);
      ASSERT_EQ(*value, it->second);
    }
    ASSERT_EQ(map.size(), want.size());
    for (const int& x : storage) {
      const int32_t* got = map.find(&x);
      auto it = want.find(&x);
      ASSERT_EQ(got != nullptr, it != want.end());
      if (got) ASSERT_EQ(*got, it->second);
    }
    map.clear();
    want.clear();
    ASSERT_EQ(map.size(), 0u);
    ASSERT_FALSE(map.contains(&storage[0]));
  }
}

}  // namespace lazyrt
