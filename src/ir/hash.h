// A streaming 128-bit hasher: two 64-bit lanes with independent mixing. Deterministic across
// processes and platforms of one endianness; not cryptographic.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "lazyrt/types.h"

namespace lazyrt::ir {

class Hasher {
 public:
  // Two lanes, each an xxHash64-style round per word (multiply, rotate, multiply) with its
  // own constants; finish() mixes both fully.
  void add(uint64_t w) {
    a_ = rotl(a_ + w * 0xC2B2AE3D27D4EB4Full, 31) * 0x9E3779B97F4A7C15ull;
    b_ = rotl(b_ ^ ((w ^ 0xD6E8FEB86659FD93ull) * 0x165667B19E3779F9ull), 27) * 0xBF58476D1CE4E5B9ull;
    ++n_;
  }
  void add_double(double d) {
    uint64_t w;
    std::memcpy(&w, &d, sizeof w);
    add(w);
  }
  void add_bytes(const void* p, size_t n) {
    add(n);
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; i += 8) {
      uint64_t w = 0;
      std::memcpy(&w, c + i, n - i < 8 ? n - i : 8);
      add(w);
    }
  }
  void add_string(std::string_view s) { add_bytes(s.data(), s.size()); }
  GraphHash finish() const {
    uint64_t x = mix(a_ ^ rotl(b_, 17) ^ n_);
    uint64_t y = mix(b_ ^ rotl(a_, 41) ^ (n_ * 0x9E3779B97F4A7C15ull));
    return {x, y};
  }

 private:
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t mix(uint64_t z) {  // splitmix64 finalizer
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t a_ = 0x243F6A8885A308D3ull;
  uint64_t b_ = 0x13198A2E03707344ull;
  uint64_t n_ = 0;
};

}  // namespace lazyrt::ir
