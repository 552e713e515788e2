// View semantics, as PyTorch has them, by functionalization: the views of a tensor (reshape,
// view, permute, transpose, expand, slicing and basic indexing, narrow, select, split, chunk,
// squeeze, unsqueeze, flatten, detach) alias it. Nothing shares a buffer for writing: a view
// holds a value of its own, derived from its base's value by a chain of view steps
// (trace::ViewOf), and
//   - an in-place op on a view gives the base a new value, each step's inverse scattering the
//     new value back (reshape back, the inverse permutation, a scatter into the sliced
//     positions), and re-derives the base's other views;
//   - an in-place op on a base, or a replay writing it back, re-derives the base's views.
// Every value stays an ordinary node of a pure graph, so compiled steps write bases (and views
// the trace saw change) back like any other state.
//
// The layout (strides, storage offset) is PyTorch's, so that reshape() aliases exactly where
// PyTorch's does (and copies otherwise), view() refuses where PyTorch's does, and
// is_contiguous(), stride() and contiguous() answer as PyTorch's.
//
// Defined in views.cpp; nothing here is public API.
#pragma once

#include <optional>
#include <vector>

#include "lazyrt/tensor.h"
#include "trace/lazy_tensor.h"

namespace lazyrt::detail {

/// A tensor's strides: its own for a view (or a former view), row-major ones otherwise.
std::vector<int64_t> strides_of(const trace::TensorImpl& t);
/// PyTorch's rule for viewing a tensor of this shape and these strides as `shape`: the new
/// strides, or none when some new dim would span two runs of memory (reshape then copies).
std::optional<std::vector<int64_t>> view_strides(const Shape& from, const std::vector<int64_t>& strides,
                                                 const Shape& to);
bool is_contiguous(const trace::TensorImpl& t);

/// Makes `result`, just computed from `src` by the view `step` (a tensor of its own, made by
/// apply()), a view of src's base, with this layout.
void make_view(const Tensor& src, const Tensor& result, trace::ViewStep step, std::vector<int64_t> strides,
               int64_t storage_offset);

/// Makes `t` (a tensor of its own whose value is base's through `chain`) a view of `base` by
/// the steps of `chain`, with this layout.
void attach_view(const Tensor& t, trace::TensorImpl& base, trace::ViewOf chain, std::vector<int64_t> strides,
                 int64_t storage_offset);

/// The old detach(): a tensor with t's value that shares nothing with t but its buffer, and
/// records no gradient. The runtime uses it where a value is kept (a gradient, a parameter):
/// a view there would tie later in-place updates to the tensor it came from.
Tensor detached_value(const Tensor& t);

/// Before an in-place op changes `self`: throws, changing nothing, where the write cannot go
/// through (an expanded view, a view of a leaf that requires grad while gradients are recorded,
/// a view whose base lives outside the loop body being traced).
void check_view_write(const trace::TensorImpl& self, const char* op);
/// After an in-place op gave `self` a new value: writes it through to its base, and re-derives
/// the base's other views (or, for a base, its views).
void propagate_write(trace::TensorImpl& self);
/// After a replay wrote a new value into `base` (not through an op): re-derives its live views,
/// except those in `written` (the replay wrote them too).
void rederive_views(trace::TensorImpl& base, const std::vector<const trace::TensorImpl*>& written);
/// Whether `t` has views that still live.
bool has_live_views(trace::TensorImpl& t);

}  // namespace lazyrt::detail
