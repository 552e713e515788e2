// Binary (de)serialization of graphs, for the persistent compile cache.
//
// Format (all integers little-endian):
//   u32 kGraphFormatVersion, then a graph:
//   graph  := i64 num_params, u32 #nodes, node*, u32 #outputs, (i32 node, i32 index)*
//   node   := u8 len + op name, u32 #operands, (i32 node, i32 index)*, u32 #attrs, attr*,
//             u32 #results, type*, u32 #regions, graph*
//   attr   := u8 kind (AttrKind), then i64 | f64 | u8 (0 or 1) | u8 dtype | u32 n + i64 * n
//   type   := u8 dtype, u32 rank, i64 dim * rank
// Ops are written by name, so reordering or extending ops.def does not invalidate files; a
// name this build does not know is an error. DType values are the enum's (append-only).
//
// deserialize_graph is total: any byte string either yields a graph that passes ir::verify or
// throws lazyrt::Error. It never crashes, never allocates more than a small multiple of its
// input, and bounds region nesting and tensor sizes so that later code cannot overflow.
#pragma once

#include <string>
#include <string_view>

#include "ir/graph.h"

namespace lazyrt::ir {

/// Bumped whenever the byte layout above changes. Readers accept exactly this version.
inline constexpr uint32_t kGraphFormatVersion = 1;

/// Limits of the format: deeper region nesting, more parameters, or a tensor with more
/// elements is refused by the writer and rejected by the reader.
inline constexpr int kMaxRegionDepth = 64;
inline constexpr int64_t kMaxParams = int64_t{1} << 20;
inline constexpr int64_t kMaxElements = int64_t{1} << 56;

/// Throws lazyrt::Error when the graph exceeds the limits above.
std::string serialize_graph(const Graph& g);

/// Parses and verifies; throws lazyrt::Error saying what is wrong and where.
Graph deserialize_graph(std::string_view bytes);

/// Structural equality: same nodes (ops, operands, attributes, result types, regions
/// compared recursively), outputs and parameter count. Float attributes compare by bit
/// pattern, so a graph holding a NaN constant equals its own copy.
bool same_graph(const Graph& a, const Graph& b);

}  // namespace lazyrt::ir
