// Little-endian byte encoding for the on-disk formats (serialized graphs, cache entries).
//
// ByteReader is the only way those formats are read, and it is total: every read is bounds
// checked and every count is checked against the bytes left before anything is allocated for
// it, so no input, however corrupt, can make a reader run off the end, allocate more than a
// small multiple of its input, or hit undefined behaviour. A bad input throws lazyrt::Error
// naming what was being read and at which byte.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "lazyrt/types.h"
#include "util/check.h"

namespace lazyrt::detail {

class ByteWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v) {
    uint64_t w;
    std::memcpy(&w, &v, sizeof w);
    u64(w);
  }
  void bytes(std::string_view b) { out_.append(b); }
  /// A string of at most 255 bytes, length first.
  void short_string(std::string_view s) {
    LAZYRT_ASSERT(s.size() <= 255, "string too long for the format: ", s.size(), " bytes");
    u8(static_cast<uint8_t>(s.size()));
    bytes(s);
  }
  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

class ByteReader {
 public:
  /// `what` names the input in errors ("graph", "cache entry body").
  ByteReader(std::string_view bytes, std::string_view what) : in_(bytes), what_(what) {}

  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  double f64() {
    uint64_t w = u64();
    double v;
    std::memcpy(&v, &w, sizeof v);
    return v;
  }
  std::string_view bytes(size_t n) {
    need(n);
    std::string_view b = in_.substr(pos_, n);
    pos_ += n;
    return b;
  }
  std::string_view short_string() { return bytes(u8()); }
  /// Reads a 32-bit count of items that take at least `min_item_bytes` each, and rejects a
  /// count the rest of the input cannot hold. Callers may then reserve that many items.
  size_t count(size_t min_item_bytes, std::string_view of) {
    const size_t at = pos_;
    const uint32_t n = u32();
    if (min_item_bytes && n > remaining() / min_item_bytes)
      fail_at(at, str_cat(n, " ", of, " cannot fit in the ", remaining(), " bytes left"));
    return n;
  }
  size_t remaining() const { return in_.size() - pos_; }
  size_t position() const { return pos_; }
  void expect_end() {
    if (remaining() != 0) fail(str_cat(remaining(), " unexpected bytes after the end"));
  }
  [[noreturn]] void fail(std::string_view why) const { fail_at(pos_, why); }
  [[noreturn]] void fail_at(size_t at, std::string_view why) const {
    throw Error(str_cat(what_, ": ", why, " (at byte ", at, " of ", in_.size(), ")"));
  }

 private:
  void need(size_t n) const {
    if (n > remaining()) fail(str_cat("truncated: ", n, " bytes needed, ", remaining(), " left"));
  }
  uint64_t get(int n) {
    need(static_cast<size_t>(n));
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += static_cast<size_t>(n);
    return v;
  }
  std::string_view in_;
  std::string_view what_;
  size_t pos_ = 0;
};

}  // namespace lazyrt::detail
