// Looking at what lazyrt does: the pending graph as text and its size.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lazyrt/tensor.h"

namespace lazyrt::debug {

/// A row of the op table (lazyrt/ops.def).
struct OpRow {
  std::string name;
  std::string aten;  // the ATen overloads lazyrt.torch lowers to it, space separated
  std::string api;   // Unary, UnaryFloat, Arith, ArithFloat, Public or Internal
  int operands;      // -1: any number
  bool elementwise;
  bool differentiable;  // it has a gradient rule
};
std::vector<OpRow> op_table();

/// The graph a sync of these tensors would compile, as text (before optimization).
std::string graph_text(const std::vector<Tensor>& tensors);
/// Where the graph reads dims marked dynamic (mark_dynamic): the bucket graph a sync compiles
/// for it, as text; otherwise "not polymorphic: " and why (the op that cannot take padding).
std::string polymorphic_graph_text(const std::vector<Tensor>& tensors);
/// Why the last graph (of a sync or a compiled step) that read dims marked dynamic was compiled
/// as traced (the op that cannot take padding); empty when none was.
std::string last_polymorphic_refusal();
/// Its node count, regions included (a region that several nodes share, once).
int64_t graph_node_count(const std::vector<Tensor>& tensors);
/// Bytes of device memory (tensor data, arenas, constants) live now, and the most live at
/// once since the last reset_peak_memory().
int64_t live_memory_bytes();
int64_t peak_memory_bytes();
void reset_peak_memory();
/// Hands the pages the C heap holds free back to the system (glibc's malloc_trim). A step's
/// first call frees far more than its replays allocate; lazyrt does this itself after a
/// compiled step's first run. For front ends with work of their own after a first call.
void release_free_heap();

/// Where each graph that gets an executable (compiled, or loaded from the disk cache) is
/// written: <dir>/<key>.txt (the optimized graph, then the executable's steps) and
/// <dir>/<key>.dot. Empty: off. Starts as $LAZYRT_DUMP_GRAPH. A file that cannot be written is
/// reported once on stderr; the sync goes on.
void set_dump_graph_dir(const std::string& dir);
std::string dump_graph_dir();

}  // namespace lazyrt::debug
