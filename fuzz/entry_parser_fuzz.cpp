// libFuzzer target for the persistent cache's entry parser (cache::decode_entry and the
// graph reader under it), built with AddressSanitizer and UndefinedBehaviorSanitizer.
//
// The property: every input either is rejected with lazyrt::Error or parses into an entry
// whose graph verifies, survives a write-read round trip unchanged, and can be hashed,
// printed and lowered (or refused by lowering with lazyrt::Error). A crash, a sanitizer
// report, any other exception escaping, or a failed round trip is a bug.
//
// Each input is tried twice: as a whole entry file, and as an entry body sealed with a
// valid header and checksum, so that mutations of the body get past the checksum and reach
// the graph reader. The seed corpus (make_entry_seeds) holds real entries.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cache/persistent_cache.h"
#include "backend/backend.h"
#include "compile/compile.h"
#include "ir/serialize.h"

namespace {

using lazyrt::cache::CacheEntry;

// Lowering allocates the graph's constants and arena; only small graphs are lowered so that
// a valid entry describing terabytes does not count as a crash of the parser.
bool small_enough_to_lower(const lazyrt::ir::Graph& g, size_t* budget) {
  for (const auto& n : g.nodes) {
    for (const auto& t : n.results) {
      if (t.bytes() > *budget) return false;
      *budget -= t.bytes();
    }
    for (const auto& r : n.regions)
      if (!small_enough_to_lower(*r, budget)) return false;
  }
  return true;
}

void check(std::string_view file) {
  CacheEntry entry;
  try {
    entry = lazyrt::cache::decode_entry(file);
  } catch (const lazyrt::Error&) {
    return;  // rejected: fine
  }
  lazyrt::ir::verify(entry.graph);  // decode_entry promised this; throwing here is a bug
  const CacheEntry again = lazyrt::cache::decode_entry(lazyrt::cache::encode_entry(entry));
  if (again.key != entry.key || again.donations != entry.donations ||
      !lazyrt::ir::same_graph(again.graph, entry.graph))
    __builtin_trap();
  if (!lazyrt::cache::interface_mismatch(entry.graph, again.graph).empty()) __builtin_trap();
  (void)lazyrt::ir::hash_graph(entry.graph);
  (void)lazyrt::ir::to_text(entry.graph);
  size_t budget = size_t{1} << 20;
  if (small_enough_to_lower(entry.graph, &budget)) {
    try {
      (void)lazyrt::compile::lower(entry.graph, entry.donations);
    } catch (const lazyrt::Error&) {
      // A verified graph no kernel takes: the cache counts it as a bad entry.
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  check(bytes);
  namespace fmt = lazyrt::cache::entry_format;
  if (size >= fmt::kHeaderBytes) {
    const lazyrt::GraphHash key{0x0123456789abcdefull, 0xfedcba9876543210ull};
    check(lazyrt::cache::seal_entry(key, bytes.substr(fmt::kHeaderBytes)));
  }
  return 0;
}
