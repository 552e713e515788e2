// Shape-polymorphic graphs: one executable for every size of a dynamic dim within a bucket.
//
// A graph is traced at concrete sizes. Where some parameters' dims are marked dynamic
// (lazyrt::mark_dynamic), make_polymorphic rewrites it into the bucket graph: every dim that
// derives from a marked size n is padded to the bucket of n (the next power of two), the
// padding at the end of the dim (a valid element of a padded dim of size k*B has index < k*n),
// and n itself becomes a parameter (an i64 scalar). Every op whose result would depend on the
// padding reads it masked instead: reductions over a padded dim read their identity there (or
// the line's first element, for max, min and their arg forms), a mean divides by the count n
// gives, softmax reads -inf, a product contracting a padded dim reads 0, indices read 0 (a
// valid index), checks read true. Elsewhere the padding only ever holds values nothing valid
// reads. Sizes of one bucket whose traces agree but for those dims hash alike, so they share
// one compiled executable; the run pads the inputs with zeros and crops the outputs
// (trace/sync.cpp, replay/replay.cpp).
//
// Products: a product whose dynamic dims (its first batch dim, rows, columns, contracted dim)
// all derive from one size is a gemm_view bounded by valid extents computed from it (per axis,
// n * inner valid in each block of bucket * inner): it computes only valid elements, reads
// no padding, and writes zeros there. Other products mask what they contract.
//
// Zero padding: the rewrite tracks which values hold exactly 0 in all their padding (inputs;
// f(0, .., 0) = 0 elementwise ops of such values laid out alike; such a value times, or over,
// a finite constant; views and sums of them; bounded products), and a sum or a product reads
// those unmasked. A value a product or a sum would read masked is instead zeroed where it is
// computed (its elementwise source, so the zeroing joins that kernel), in a second run of the
// rewrite: one pass where there were masks at each reader, and products keep their views.
//
// Soundness: each trace is rewritten from its own concrete graph, and every rewrite computes
// the valid elements exactly as the concrete graph does for that trace's n. A constant that
// happens to equal n, a dim that coincides with it, an op with no rule: each at worst makes
// the rewrite refuse (the graph then compiles as traced) or two sizes hash apart. Ops that
// cannot take padding (a flip or concat along a padded dim, a sort along it, a scatter of
// padded rows, loops and collectives reading padded values) refuse.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace lazyrt::compile {

/// A parameter's dim marked dynamic. A soft mark (dynamic=True marks every dim so) gives way
/// where the dim meets a static one; a hard one (mark_dynamic) makes the graph refuse there.
struct DynamicDim {
  int64_t param;
  int64_t dim;
  bool soft = false;
};

/// A dim of a bucket graph's value that derives from symbol `sym`: outer * n * inner of the
/// trace (a reshape merged static dims around it), padded to outer * bucket * inner.
struct PaddedDim {
  int64_t dim;
  int32_t sym;
  int64_t outer, inner;
};

/// A padded value's elements as a box: its traced and padded shapes with each padded dim
/// split in three (outer, n or bucket, inner), so that the valid elements are the box of
/// `traced` at the start of `padded` (exec::copy_box pads and crops with it).
struct Box {
  Shape traced, padded;
};
/// The box of a value of traced shape `s` with these padded dims.
Box box_of(const Shape& s, const std::vector<PaddedDim>& dims, const std::vector<int64_t>& buckets,
           const std::vector<int64_t>& sizes);

struct PolymorphicGraph {
  /// The bucket graph: the traced graph's parameters (padded types) in their order, then one
  /// i64 scalar per symbol holding its size.
  ir::Graph graph;
  std::vector<int64_t> sizes;    // per symbol, its size in this trace (at least 2)
  std::vector<int64_t> buckets;  // per symbol, the size it is padded to
  std::vector<std::vector<PaddedDim>> params;   // per traced parameter, its padded dims
  std::vector<std::vector<PaddedDim>> outputs;  // per output, its padded dims
  std::vector<Box> param_boxes;                 // per traced parameter (empty shapes: not padded)
  std::vector<Box> output_boxes;                // per output (empty shapes: not padded)
};

/// The bucket a dynamic size n is padded to: the next power of two.
int64_t bucket_of(int64_t n);

/// Why there is no bucket graph where no marked size is at least 2 (a size of 1 broadcasts: it
/// is never padded). Not a refusal.
inline constexpr const char* kNothingToPad = "no dynamic dim is of size 2 or more";

/// The bucket graph of `g` with `marks` dynamic; nullopt, with the reason in `why`, where no
/// marked size is at least 2 (kNothingToPad) or an op cannot take padding.
std::optional<PolymorphicGraph> make_polymorphic(const ir::Graph& g, std::span<const DynamicDim> marks,
                                                 std::string* why);

}  // namespace lazyrt::compile
