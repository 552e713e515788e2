// The kernel of a fusion node with reduced dims (ops.def): elementwise ops over `shape`,
// reductions over its rows (the last `reduced` dims) and ops over one value per row, run row
// by row, so that a row's values are produced, reduced and used while they are in cache
// instead of being stored by one kernel and read back by the next. A layer norm's mean,
// variance and normalization are one kernel, a bias-add and the sum of its result another.
//
// Each row is made in passes: pass p computes the elementwise values that need only what
// passes before p made, folds those its reductions read, and the last pass stores the results
// of `shape`. Between passes, the ops over one value per row run on the reductions' results
// (one value each). A value two passes need is kept by the first in a row buffer (rows of up
// to kKeepRow elements, up to kMaxKept values) or else computed again: elementwise work is
// cheap against a trip to memory. Variance takes two passes, as its kernel does (the mean,
// then the squared deviations).
//
// Values are those of the unfused kernels, bit for bit: the elementwise parts run the fusion
// interpreter (fused_program.h), or its generated loops once the graph's module is compiled;
// reductions fold a row in chunks of kChunk elements (a multiple of sums::kLanes) into the
// partial sums that the reduction kernels add over the whole row (sums.h), and round as they
// do.
//
// Results of `shape` are stored in the last pass, after every earlier pass has read the row's
// operands, so result 0 may be written over operand 0 as in the elementwise fusion.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "scalar/elementwise_fns.h"
#include "backend/cpu/kernels/fused_program.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/kernels/parallel.h"
#include "backend/cpu/kernels/sums.h"
#include "backend/cpu/jit/jit.h"

namespace lazyrt::kernels {

using namespace lazyrt::scalar;  // the ops' scalar functions (scalar/elementwise_fns.h, vmath.h)
namespace {

using ir::OpKind;

constexpr int64_t kChunk = 256;  // elements of a row folded at once
static_assert(kChunk % sums::kLanes == 0);
constexpr int kMaxValues = 160;  // region nodes
constexpr int kMaxBindings = 32;
// Values two passes need are kept in a row buffer by the first (not computed again) where a
// row has at most kKeepRow elements; at most kMaxKept of them.
constexpr int64_t kKeepRow = 2048;
constexpr int kMaxKept = 4;

enum class Fold { Sum, Max, Min, Squares };

// A reduction's running state over one row.
struct Acc {
  sums::Lanes lanes;
  double value = 0;
  double mean = 0;  // variance: the mean its squared deviations are taken from
  bool first = true;
};

// Folds n values of x (storage type T) into acc; `last`: the row's last piece (any length;
// others are multiples of kLanes).
using FoldFn = void (*)(Fold f, Acc& acc, const void* x, int64_t n, bool last);
template <class T>
void fold(Fold f, Acc& acc, const void* xv, int64_t n, bool last) {
  using C = compute_t<T>;
  const T* x = static_cast<const T*>(xv);
  switch (f) {
    case Fold::Sum:
    case Fold::Squares: {
      const bool squares = f == Fold::Squares;
      if (last) acc.value = acc.lanes.finish<C>(x, n, acc.mean, squares);
      else acc.lanes.add<C>(x, n, acc.mean, squares);
      return;
    }
    case Fold::Max:
    case Fold::Min:
      if (n == 0) return;
      acc.value = f == Fold::Max ? sums::fold_extreme<true>(acc.value, sums::run_extreme<true, C>(x, n), acc.first)
                                 : sums::fold_extreme<false>(acc.value, sums::run_extreme<false, C>(x, n), acc.first);
      acc.first = false;
      return;
  }
}

// A reduction's value, rounded to T as its kernel rounds it, stored at `dst`.
using FinishFn = void (*)(OpKind op, const Acc& acc, double count, double correction, void* dst);
template <class T>
void finish(OpKind op, const Acc& acc, double count, double correction, void* dst) {
  using C = compute_t<T>;
  T* o = static_cast<T*>(dst);
  switch (op) {
    case OpKind::Sum: *o = convert<T>(static_cast<C>(0.0 + acc.value)); return;
    case OpKind::Mean: *o = convert<T>(static_cast<C>((0.0 + acc.value) / count)); return;
    case OpKind::Var:
    case OpKind::Std: {
      const double v = (0.0 + acc.value) / std::max(count - correction, 0.0);
      *o = convert<T>(op == OpKind::Std ? std::sqrt(v) : v);
      return;
    }
    default: *o = convert<T>(static_cast<C>(acc.value)); return;  // amax, amin
  }
}

// Where a program parameter is read: operand `operand` of the fusion, its element for row r
// at sum over the lead dims of index * lead_strides; or the row's value in slot `slot`.
struct Binding {
  int operand = -1;
  int slot = -1;
  std::vector<int64_t> lead_strides;
  // Where the offset is r * row_stride (every lead dim of more than one element strides alike:
  // an operand of the whole shape, or one broadcast over every row), else -1.
  int64_t row_stride = 0;
  int layout_index = -1;  // passes: the operand's place in the row's layout
  int kept = -1;          // or a value an earlier pass kept: its row buffer
};

// A reduction: the region node it computes, its input and how it folds it.
struct Sink {
  int node;
  OpKind op;
  Fold fold;
  int pass;           // the pass that folds it
  int output = -1;    // its values: output `output` of the pass's program
  int operand = -1;   // or this fusion operand, of `shape`, read in place
  bool completes;     // the reduction's value is known after this sink
  int acc;            // its state (a variance's two sinks share one)
  int input;          // the region value it folds
  int same_as = -1;   // the state of an earlier sink of the pass with the same fold of the
                      // same value (a mean and a variance of one row): copied, not folded again
  int64_t elem_bytes;
  FoldFn fold_fn;
  FinishFn finish_fn;
  double correction = 0;
};

// An elementwise program over the row (a pass) or over one value per row.
struct Part {
  std::unique_ptr<ElementwiseProgram> program;
  std::vector<Binding> params;
  // Pass outputs: a sink's scratch (scratch >= 0) or fusion result `result`; row programs
  // write every output into slot `slot`.
  struct Out {
    int scratch = -1, result = -1, slot = -1;
    int64_t elem_bytes = 0;
    int kept = -1;  // passes: a value later passes read, into its row buffer
  };
  std::vector<Out> outs;
  std::unique_ptr<BroadcastLayout> layout;  // passes: the row against the operands
  int generated = -1;
  bool folds = false;  // passes: some outputs are folded (walked in chunks of kChunk)

  // A parameter's stride along dim d of the layout (0 for a value per row).
  int64_t stride(const Binding& b, size_t d) const {
    return b.layout_index >= 0 ? layout->strides[static_cast<size_t>(b.layout_index)][d] : 0;
  }
};

struct RowKernel {
  Shape lead;  // the dims that number the rows
  int64_t rows = 0, row = 0;
  std::vector<Part> passes;              // empty programs where a pass only folds operands
  std::vector<std::vector<Sink>> sinks;  // per pass
  std::vector<Part> row_programs;        // per level 0..passes.size(), possibly empty
  int num_accs = 0;
  std::vector<std::pair<int, int64_t>> slot_results;  // (slot, elem bytes) per result of one value per row, or -1
  std::vector<int> result_slot;                        // per result: its slot, or -1 (of `shape`)
  std::vector<int64_t> result_bytes;
  int num_scratch = 0;
  std::shared_ptr<jit::Module> generated;
  int64_t work = 0;  // element-ops per run, for the module's tiers

  void run(const void* const* in, void* const* out) const;
  // The module index of the first pass or row program the generator took, or -1.
  int first_generated() const {
    for (const auto* parts : {&passes, &row_programs})
      for (const Part& p : *parts)
        if (p.program && p.generated >= 0) return p.generated;
    return -1;
  }
  void run_row(int64_t r, const void* const* in, void* const* out, unsigned char (*slots)[8],
               unsigned char (*scratch)[kChunk * 8], unsigned char (*kept)[kKeepRow * 8], Acc* accs,
               bool compiled) const;
};

// The offsets of every binding of `part` for row r.
void lead_offsets(const Part& part, const Shape& lead, int64_t r, int64_t* off) {
  bool strided = false;
  for (size_t b = 0; b < part.params.size(); ++b) {
    const int64_t st = part.params[b].row_stride;
    off[b] = st >= 0 ? r * st : 0;
    strided |= st < 0;
  }
  if (!strided) return;
  for (size_t d = lead.size(); d-- > 0;) {
    const int64_t i = r % lead[d];
    r /= lead[d];
    if (i == 0) continue;
    for (size_t b = 0; b < part.params.size(); ++b)
      if (part.params[b].row_stride < 0) off[b] += i * part.params[b].lead_strides[d];
  }
}

// A binding's row_stride for lead dims `lead`.
int64_t row_stride_of(const std::vector<int64_t>& lead_strides, const Shape& lead) {
  if (lead_strides.empty()) return 0;
  const int64_t st = lead_strides.back();
  int64_t rows_inside = 1;  // rows within one step along dim d
  for (size_t d = lead.size(); d-- > 0;) {
    if (lead[d] != 1 && lead_strides[d] != st * rows_inside) return -1;
    rows_inside *= lead[d];
  }
  return st;
}

void RowKernel::run_row(int64_t r, const void* const* in, void* const* out, unsigned char (*slots)[8],
                        unsigned char (*scratch)[kChunk * 8], unsigned char (*kept)[kKeepRow * 8], Acc* accs,
                        bool compiled) const {
  const void* base[kMaxBindings];
  int64_t off[kMaxBindings];
  void* dst[kMaxBindings];
  auto bind = [&](const Part& part) {
    lead_offsets(part, lead, r, off);
    for (size_t b = 0; b < part.params.size(); ++b) {
      const Binding& bd = part.params[b];
      base[b] = bd.operand >= 0 ? in[bd.operand]
                : bd.kept >= 0  ? static_cast<const void*>(kept[bd.kept])
                                : static_cast<const void*>(slots[bd.slot]);
    }
  };
  static constexpr int64_t zero[kMaxBindings] = {};
  for (size_t level = 0; level <= passes.size(); ++level) {
    const Part& rp = row_programs[level];
    if (rp.program) {
      bind(rp);
      for (size_t j = 0; j < rp.outs.size(); ++j) dst[j] = slots[rp.outs[j].slot];
      const jit::FusedFn fn = compiled && rp.generated >= 0 ? generated->fn(rp.generated) : nullptr;
      if (fn) fn(base, off, dst, 0, 1);
      else rp.program->run(base, off, zero, 1, dst, 0);
    }
    if (level == passes.size()) break;
    const Part& pass = passes[level];
    const std::vector<Sink>& ss = sinks[level];
    for (const Sink& s : ss) {
      Acc& a = accs[s.acc];
      a.lanes.reset();
      a.first = true;
      if (s.fold != Fold::Squares) a.value = 0;
    }
    if (pass.program) {
      bind(pass);
      // A pass the generator did not take (index -1) stays interpreted.
      const jit::FusedFn fn = compiled && pass.generated >= 0 ? generated->fn(pass.generated) : nullptr;
      const BroadcastLayout& L = *pass.layout;
      const size_t rank = L.shape.size(), nb = pass.params.size();
      const int64_t run = L.shape[rank - 1];
      int64_t st[kMaxBindings], idx[kMaxRank];
      std::fill(idx, idx + rank, int64_t{0});
      for (size_t b = 0; b < nb; ++b) st[b] = pass.params[b].kept >= 0 ? 1 : pass.stride(pass.params[b], rank - 1);
      int64_t fill = 0;
      for (int64_t pos = 0; pos < row;) {
        // The run starting at pos: the offsets of its first element.
        int64_t at[kMaxBindings];
        for (size_t b = 0; b < nb; ++b) {
          at[b] = off[b];
          if (pass.params[b].kept >= 0) at[b] = pos;  // a kept value's buffer is in row order
          else
            for (size_t d = 0; d + 1 < rank; ++d) at[b] += idx[d] * pass.stride(pass.params[b], d);
        }
        for (int64_t done = 0; done < run;) {
          const int64_t take = pass.folds ? std::min(run - done, kChunk - fill) : run - done;
          int64_t o[kMaxBindings];
          if (done == 0) std::copy(at, at + nb, o);  // a run within one chunk: the common case
          else
            for (size_t b = 0; b < nb; ++b) o[b] = at[b] + done * st[b];
          for (size_t j = 0; j < pass.outs.size(); ++j) {
            const Part::Out& t = pass.outs[j];
            dst[j] = t.scratch >= 0 ? static_cast<void*>(scratch[t.scratch] + fill * t.elem_bytes)
                     : t.kept >= 0  ? static_cast<void*>(kept[t.kept] + (pos + done) * t.elem_bytes)
                                    : static_cast<char*>(out[t.result]) + (r * row + pos + done) * t.elem_bytes;
          }
          if (fn) fn(base, o, dst, 0, take);
          else pass.program->run(base, o, st, take, dst, 0);
          fill += take;
          done += take;
          if (pass.folds && fill == kChunk && pos + done < row) {
            for (const Sink& s : ss)
              if (s.output >= 0) s.fold_fn(s.fold, accs[s.acc], scratch[pass.outs[s.output].scratch], fill, false);
            fill = 0;
          }
        }
        pos += run;
        for (size_t d = rank - 1; d-- > 0;) {
          if (++idx[d] < L.shape[d]) break;
          idx[d] = 0;
        }
      }
      for (const Sink& s : ss)
        if (s.output >= 0) s.fold_fn(s.fold, accs[s.acc], scratch[pass.outs[s.output].scratch], fill, true);
    }
    for (const Sink& s : ss) {
      if (s.same_as >= 0) accs[s.acc].value = accs[s.same_as].value;
      else if (s.operand >= 0)
        s.fold_fn(s.fold, accs[s.acc], static_cast<const char*>(in[s.operand]) + r * row * s.elem_bytes, row, true);
      Acc& a = accs[s.acc];
      if (s.completes) s.finish_fn(s.op, a, static_cast<double>(row), s.correction, slots[s.node]);
      else a.mean = (0.0 + a.value) / static_cast<double>(row);  // a variance's first pass
    }
  }
  for (size_t j = 0; j < result_slot.size(); ++j)
    if (result_slot[j] >= 0)
      std::memcpy(static_cast<char*>(out[j]) + r * result_bytes[j], slots[result_slot[j]],
                  static_cast<size_t>(result_bytes[j]));
}

void RowKernel::run(const void* const* in, void* const* out) const {
  bool compiled = false;
  if (generated) {
    // The module's loops arrive together; the first generated part tells.
    const int first = first_generated();
    compiled = generated->fn(first) != nullptr;
    if (!compiled) generated->ran_interpreted(generated, first, work);
  }
  const int64_t per_row = std::max<int64_t>(1, row * static_cast<int64_t>(std::max<size_t>(passes.size(), 1)));
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / per_row), [&](int64_t b, int64_t e) {
    alignas(64) unsigned char slots[kMaxValues][8];
    alignas(64) unsigned char scratch[kMaxFusedOps][kChunk * 8];
    alignas(64) unsigned char kept[kMaxKept][kKeepRow * 8];
    Acc accs[kMaxFusedOps];
    for (int64_t r = b; r < e; ++r) run_row(r, in, out, slots, scratch, kept, accs, compiled);
  });
}

// The strides of an operand of shape `s`, right-aligned against `target`, over target's
// first `lead` dims (0 where it is broadcast).
std::vector<int64_t> lead_strides_of(const Shape& s, const Shape& target, size_t lead) {
  std::vector<int64_t> out(lead, 0);
  Shape padded(target.size() - s.size(), 1);
  padded.insert(padded.end(), s.begin(), s.end());
  int64_t stride = 1;
  for (size_t d = padded.size(); d-- > 0;) {
    if (d < lead && padded[d] != 1) out[d] = stride;
    stride *= padded[d];
  }
  return out;
}

// The form of a region value: of `shape` (0), or one value per row.
enum Form { kFull = 0, kPerRow = 1 };

class Builder {
 public:
  Builder(const ir::Graph& region, const std::vector<ir::TensorType>& inputs, const ir::NodeAttrs& a)
      : region_(region), inputs_(inputs), shape_(a.ints<"shape">()), reduced_(a.i<"reduced">()),
        rows_(ir::fusion_rows(shape_, reduced_)), lead_rank_(shape_.size() - static_cast<size_t>(reduced_)) {}

  std::shared_ptr<RowKernel> build(const std::vector<ir::TensorType>& outputs,
                                   const std::shared_ptr<jit::Module>& module) {
    const size_t n = region_.nodes.size();
    LAZYRT_ASSERT(n <= static_cast<size_t>(kMaxValues), "fused reduction of ", n, " nodes");
    kind_.assign(n, Kind::Param);
    level_.assign(n, 0);
    int max_sink_pass = -1;
    for (size_t i = 0; i < n; ++i) {
      const ir::Node& nd = region_.nodes[i];
      int level = 0;
      for (ir::ValueRef v : nd.operands) level = std::max(level, level_[v.node]);
      if (nd.op == OpKind::Parameter) kind_[i] = Kind::Param;
      else if (nd.op == OpKind::Full) kind_[i] = Kind::Const;
      else if (ir::row_reduction_dims(region_, nd) == reduced_ && region_.type(nd.operands[0]).shape == shape_) {
        kind_[i] = Kind::Reduce;
        const bool var = nd.op == OpKind::Var || nd.op == OpKind::Std;
        max_sink_pass = std::max(max_sink_pass, level + (var ? 1 : 0));
        level += var ? 2 : 1;
      } else {
        kind_[i] = nd.results[0].shape == shape_ ? Kind::Elem : Kind::Row;
      }
      level_[i] = level;
    }
    int num_passes = max_sink_pass + 1;
    for (ir::ValueRef v : region_.outputs)
      if (kind_[v.node] == Kind::Elem) num_passes = std::max(num_passes, level_[v.node] + 1);

    auto k = std::make_shared<RowKernel>();
    k->lead = Shape(shape_.begin(), shape_.begin() + static_cast<std::ptrdiff_t>(lead_rank_));
    k->rows = shape_numel(k->lead);
    k->row = rows_.row;
    k->passes.resize(static_cast<size_t>(num_passes));
    k->sinks.resize(static_cast<size_t>(num_passes));
    k->row_programs.resize(static_cast<size_t>(num_passes) + 1);

    // Reductions: their sinks and states.
    std::vector<std::vector<int32_t>> pass_targets(static_cast<size_t>(num_passes));
    for (size_t i = 0; i < n; ++i) {
      if (kind_[i] != Kind::Reduce) continue;
      const ir::Node& nd = region_.nodes[i];
      const ir::ValueRef in = nd.operands[0];
      const int p = level_[in.node];
      Sink s;
      s.node = static_cast<int>(i);
      s.op = nd.op;
      s.acc = k->num_accs++;
      visit_dtype(region_.type(in).dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<compute_t<T>>) {
          s.fold_fn = &fold<T>;
          s.finish_fn = &finish<T>;
          s.elem_bytes = sizeof(T);
        }
      });
      LAZYRT_ASSERT(s.fold_fn, "fused reduction over ", dtype_name(region_.type(in).dtype));
      if (nd.op == OpKind::Var || nd.op == OpKind::Std)
        s.correction = ir::NodeAttrs(nd.op, nd.attrs).f<"correction">();
      auto add_sink = [&](Fold f, int pass, bool completes) {
        Sink t = s;
        t.fold = f;
        t.pass = pass;
        t.completes = completes;
        t.input = in.node;
        for (const Sink& e : k->sinks[static_cast<size_t>(pass)])
          if (e.input == in.node && e.fold == f && f == Fold::Sum && e.same_as < 0) t.same_as = e.acc;
        if (t.same_as >= 0) {
          // Folded by the earlier sink.
        } else if (kind_[in.node] == Kind::Param) {
          t.operand = static_cast<int>(ir::NodeAttrs(OpKind::Parameter, region_.nodes[in.node].attrs).i<"index">());
        } else {
          auto& targets = pass_targets[static_cast<size_t>(pass)];
          auto it = std::find(targets.begin(), targets.end(), in.node);
          t.output = static_cast<int>(it - targets.begin());
          if (it == targets.end()) targets.push_back(in.node);
        }
        k->sinks[static_cast<size_t>(pass)].push_back(t);
      };
      switch (nd.op) {
        case OpKind::Sum:
        case OpKind::Mean: add_sink(Fold::Sum, p, true); break;
        case OpKind::Amax: add_sink(Fold::Max, p, true); break;
        case OpKind::Amin: add_sink(Fold::Min, p, true); break;
        default:
          add_sink(Fold::Sum, p, false);
          add_sink(Fold::Squares, p + 1, true);
      }
    }
    LAZYRT_ASSERT(k->num_accs <= kMaxFusedOps, "fused reduction of ", k->num_accs, " reductions");

    // Passes: their sinks' values, and in the last one the results of `shape`.
    std::vector<int32_t> full_results;
    for (ir::ValueRef v : region_.outputs)
      if (kind_[v.node] == Kind::Elem && std::find(full_results.begin(), full_results.end(), v.node) == full_results.end())
        full_results.push_back(v.node);
    auto pass_targets_of = [&](int p) {
      std::vector<int32_t> targets = pass_targets[static_cast<size_t>(p)];
      if (p == num_passes - 1) targets.insert(targets.end(), full_results.begin(), full_results.end());
      return targets;
    };
    // Values two passes would compute: kept by the first, where rows are short enough.
    std::vector<int> kept_pass(n, -1);
    kept_index_.assign(n, -1);
    if (rows_.row <= kKeepRow) {
      std::vector<int> first(n, -1);
      int kept = 0;
      for (int p = 0; p < num_passes; ++p) {
        const std::vector<char> in_pass =
            closure(pass_targets_of(p), [&](int32_t v) { return kind_[v] == Kind::Row || kind_[v] == Kind::Reduce; });
        for (size_t v = 0; v < n; ++v) {
          if (!in_pass[v] || kind_[v] != Kind::Elem) continue;
          if (first[v] < 0) first[v] = p;
          else if (kept_pass[v] < 0 && kept < kMaxKept &&
                   std::none_of(region_.outputs.begin(), region_.outputs.end(),
                                [&](ir::ValueRef o) { return o.node == static_cast<int32_t>(v); })) {
            kept_pass[v] = first[v];
            kept_index_[v] = kept++;
          }
        }
      }
    }
    for (int p = 0; p < num_passes; ++p) {
      std::vector<int32_t> targets = pass_targets_of(p);
      const size_t scratch_outputs = pass_targets[static_cast<size_t>(p)].size();
      for (size_t v = 0; v < n; ++v)
        if (kept_pass[v] == p) targets.push_back(static_cast<int32_t>(v));
      if (targets.empty()) continue;
      Part& part = k->passes[static_cast<size_t>(p)];
      extract(part, targets, [&](int32_t v) {
        return kind_[v] == Kind::Row || kind_[v] == Kind::Reduce || (kept_pass[v] >= 0 && kept_pass[v] < p);
      }, kFull);
      for (size_t j = 0; j < targets.size(); ++j) {
        Part::Out o;
        o.elem_bytes = static_cast<int64_t>(dtype_size(region_.type({targets[j], 0}).dtype));
        if (j < scratch_outputs) {
          o.scratch = static_cast<int>(j);
        } else if (kept_pass[targets[j]] == p) {
          o.kept = kept_index_[targets[j]];
        } else {
          for (size_t r = 0; r < region_.outputs.size(); ++r)
            if (region_.outputs[r].node == targets[j]) o.result = static_cast<int>(r);
        }
        part.outs.push_back(o);
      }
      part.folds = scratch_outputs > 0;
      LAZYRT_ASSERT(scratch_outputs <= static_cast<size_t>(kMaxFusedOps), "fused reduction pass of ",
                    scratch_outputs, " folded values");
      // The row against the operands; values per row stay put along it.
      std::vector<Shape> shapes;
      for (Binding& b : part.params)
        if (b.operand >= 0) {
          b.layout_index = static_cast<int>(shapes.size());
          shapes.push_back(row_part(inputs_[static_cast<size_t>(b.operand)].shape));
        }
      part.layout = std::make_unique<BroadcastLayout>(Shape(shape_.begin() + static_cast<std::ptrdiff_t>(lead_rank_), shape_.end()), shapes);
      k->work += shape_numel(shape_) * static_cast<int64_t>(part.program->num_ops());
      if (module) {
        jit::FusedRegion fr{*part_regions_.back(), {}, std::nullopt};
        for (const Binding& b : part.params)
          fr.inner_strides.push_back(b.kept >= 0 ? 1 : part.stride(b, part.layout->shape.size() - 1));
        part.generated = module->add(std::move(fr));
      }
    }
    // Ops over one value per row, by level.
    for (size_t level = 0; level <= static_cast<size_t>(num_passes); ++level) {
      std::vector<int32_t> targets;
      for (size_t i = 0; i < n; ++i)
        if (kind_[i] == Kind::Row && static_cast<size_t>(level_[i]) == level) targets.push_back(static_cast<int32_t>(i));
      if (targets.empty()) continue;
      Part& part = k->row_programs[level];
      extract(part, targets, [&](int32_t v) {
        return kind_[v] == Kind::Reduce || (kind_[v] == Kind::Row && static_cast<size_t>(level_[v]) < level);
      }, kPerRow);
      for (int32_t t : targets) part.outs.push_back({-1, -1, static_cast<int>(t), 0});
      if (module) part.generated = module->add({*part_regions_.back(), std::vector<int64_t>(part.params.size(), 0), std::nullopt});
    }
    k->result_slot.assign(outputs.size(), -1);
    k->result_bytes.assign(outputs.size(), 0);
    for (size_t r = 0; r < region_.outputs.size(); ++r) {
      const int32_t v = region_.outputs[r].node;
      k->result_bytes[r] = static_cast<int64_t>(dtype_size(outputs[r].dtype));
      if (kind_[v] != Kind::Elem) k->result_slot[r] = v;
    }
    if (module && k->first_generated() >= 0) k->generated = module;
    return k;
  }

 private:
  enum class Kind { Param, Const, Elem, Reduce, Row };

  // The row's dims of an operand right-aligned against `shape`.
  Shape row_part(const Shape& s) const {
    Shape padded(shape_.size() - s.size(), 1);
    padded.insert(padded.end(), s.begin(), s.end());
    return Shape(padded.begin() + static_cast<std::ptrdiff_t>(lead_rank_), padded.end());
  }

  // Makes part's program: the region's nodes that `targets` need, with the values `leaf`
  // takes (and the region's parameters) as its parameters, bound to their slots (or
  // operands), and the targets as its outputs. `form`: the nodes read parameters of the
  // region as values of `shape` (kFull) or one per row, against their own shape (kPerRow).
  // The region values `targets` need, down to the region's parameters and the values `leaf`
  // takes.
  template <class Leaf>
  std::vector<char> closure(const std::vector<int32_t>& targets, Leaf&& leaf) const {
    std::vector<char> needed(region_.nodes.size(), 0);
    std::vector<int32_t> stack(targets.begin(), targets.end());
    while (!stack.empty()) {
      const int32_t v = stack.back();
      stack.pop_back();
      if (needed[v]) continue;
      needed[v] = 1;
      if (kind_[v] == Kind::Param || leaf(v)) continue;
      for (ir::ValueRef o : region_.nodes[v].operands) stack.push_back(o.node);
    }
    return needed;
  }

  template <class Leaf>
  void extract(Part& part, const std::vector<int32_t>& targets, Leaf&& leaf, Form form) {
    const size_t n = region_.nodes.size();
    const std::vector<char> needed = closure(targets, leaf);
    auto g = std::make_shared<ir::Graph>();
    std::vector<ir::ValueRef> local(n, ir::ValueRef{-1, 0});
    // Parameters per (value, shape read against): the same operand may be read per row in
    // both per-row forms.
    std::vector<std::pair<std::pair<int32_t, Shape>, ir::ValueRef>> params;
    auto param = [&](int32_t v, const Shape& against) {
      const Shape key = kind_[v] == Kind::Param ? against : Shape{};
      for (const auto& [k, p] : params)
        if (k.first == v && k.second == key) return p;
      const ir::ValueRef p = g->add_parameter(region_.type({v, 0}));
      Binding b;
      if (kind_[v] == Kind::Param) {
        b.operand = static_cast<int>(ir::NodeAttrs(OpKind::Parameter, region_.nodes[v].attrs).i<"index">());
        b.lead_strides = lead_strides_of(inputs_[static_cast<size_t>(b.operand)].shape, against, lead_rank_);
        b.row_stride = row_stride_of(b.lead_strides, Shape(shape_.begin(), shape_.begin() + static_cast<std::ptrdiff_t>(lead_rank_)));
      } else if (form == kFull && kept_index_[v] >= 0) {
        b.kept = kept_index_[v];
      } else {
        b.slot = v;
      }
      part.params.push_back(std::move(b));
      params.push_back({{v, key}, p});
      return p;
    };
    for (size_t i = 0; i < n; ++i) {
      if (!needed[i] || kind_[i] == Kind::Param || leaf(static_cast<int32_t>(i))) continue;
      const ir::Node& nd = region_.nodes[i];
      if (nd.op == OpKind::Full) {
        local[i] = g->add(OpKind::Full, {}, nd.attrs);
        continue;
      }
      const Shape& against = form == kFull ? shape_ : nd.results[0].shape;
      std::vector<ir::ValueRef> ops;
      for (ir::ValueRef o : nd.operands) {
        const bool is_param = kind_[o.node] == Kind::Param || leaf(o.node);
        ops.push_back(is_param ? param(o.node, against) : local[o.node]);
      }
      local[i] = g->add(nd.op, std::move(ops), nd.attrs);
    }
    // A target a later pass reads where an earlier one kept it (a sink's input) is its buffer,
    // copied out.
    for (int32_t t : targets) g->outputs.push_back(local[t].node >= 0 ? local[t] : param(t, shape_));
    LAZYRT_ASSERT(part.params.size() <= static_cast<size_t>(kMaxBindings), "fused reduction program of ",
                  part.params.size(), " parameters");
    part.program = std::make_unique<ElementwiseProgram>(*g);
    part_regions_.push_back(std::move(g));
  }

  const ir::Graph& region_;
  const std::vector<ir::TensorType>& inputs_;
  const Shape& shape_;
  const int64_t reduced_;
  const ir::FusionRows rows_;
  const size_t lead_rank_;
  std::vector<Kind> kind_;
  std::vector<int> level_;
  std::vector<int> kept_index_;  // per region value: its row buffer, if a pass keeps it
  std::vector<std::shared_ptr<ir::Graph>> part_regions_;
};

}  // namespace

Kernel make_fused_rows(const ir::Graph& region, const std::vector<ir::TensorType>& inputs,
                       const std::vector<ir::TensorType>& outputs, const ir::Attrs& attrs,
                       const std::shared_ptr<jit::Module>& module) {
  const ir::NodeAttrs a(OpKind::Fusion, attrs);
  std::shared_ptr<const RowKernel> k = Builder(region, inputs, a).build(outputs, module);
  return {[k](const void* const* in, void* const* out) { k->run(in, out); }};
}

}  // namespace lazyrt::kernels
