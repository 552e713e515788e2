#include "compile/polymorphic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "compile/passes.h"
#include "ir/gemm_view.h"
#include "ir/rules.h"
#include "scalar/elementwise_fns.h"
#include "util/check.h"

namespace lazyrt::compile {

int64_t bucket_of(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

Box box_of(const Shape& s, const std::vector<PaddedDim>& dims, const std::vector<int64_t>& buckets,
           const std::vector<int64_t>& sizes) {
  Box b;
  size_t next = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (next < dims.size() && dims[next].dim == static_cast<int64_t>(i)) {
      const PaddedDim& d = dims[next++];
      b.traced.insert(b.traced.end(), {d.outer, sizes[d.sym], d.inner});
      b.padded.insert(b.padded.end(), {d.outer, buckets[d.sym], d.inner});
    } else {
      b.traced.push_back(s[i]);
      b.padded.push_back(s[i]);
    }
  }
  return b;
}

namespace {

using ir::Attrs;
using ir::Graph;
using ir::Node;
using ir::NodeAttrs;
using ir::OpKind;
using ir::ValueRef;

// A dim of a traced value: static, or of size outer * n * inner with n symbol `sym`'s size:
// the dims an reshape merged into it, outside and inside the dynamic one. Padded, it is
// outer * bucket * inner, and element i is valid where (i / inner) % bucket < n.
struct Dim {
  int32_t sym = -1;
  int64_t outer = 1, inner = 1;
  // A dim an expand or a constant made of the size n (not read from a dynamic value), and
  // the dims that take it from there: node `origin`'s dim `origin_dim`. Taken as dynamic
  // until it meets a static dim; the rewrite then starts again with that one static.
  // A static dim of such a node keeps its origin too: it may be made dynamic where it meets
  // a dynamic dim of its size. `uniform`: the value is the same all along the dim (an expand's
  // new dim, a constant's), so it may take any layout of the padding.
  int32_t origin = -1;
  int64_t origin_dim = 0;
  bool uniform = false;
  bool dyn() const { return sym >= 0; }
  bool free() const { return dyn() && origin >= 0; }
  bool promotable() const { return !dyn() && origin >= 0 && uniform; }
  int64_t k() const { return outer * inner; }
  bool operator==(const Dim& o) const { return sym == o.sym && outer == o.outer && inner == o.inner; }
  bool operator!=(const Dim& o) const { return !(*this == o); }
};
using Dims = std::vector<Dim>;

struct Refused {
  std::string why;
};
// A choice the rewrite made at an expand's or a constant's dim turned out wrong: it starts
// again with that dim static (sym < 0) or dynamic, k times symbol sym's size.
struct Retry {
  std::pair<int32_t, int64_t> origin;
  int32_t sym = -1;
  int64_t k = 0;
};
struct Forced {
  std::set<std::pair<int32_t, int64_t>> statics;
  std::map<std::pair<int32_t, int64_t>, std::pair<int32_t, int64_t>> dynamics;
  // Nodes whose padding is made zero where they are computed (a product reads them, through
  // views, contracting a padded dim): every reader then sees zeros there.
  std::set<int32_t> zeroed;
};

[[noreturn]] void refuse(const Node& n, const std::string& what) {
  throw Refused{detail::str_cat(ir::op_name(n.op), ": ", what)};
}


// A reduction over a list of dims (sum, mean, amax, amin, prod, var, std, norm), by its result
// rule in the op table.
bool reduces_dims(OpKind op) {
  const ir::ResultRule r = ir::op_info(op).rule;
  return r == &ir::rules::Reduce || r == &ir::rules::ReduceFloat || r == &ir::rules::ReduceNonEmpty ||
         r == &ir::rules::ReduceNorm;
}

// What the padding of a value reads as where an op must not see it.
enum class Fill { Zero, One, NegInf, True, First };

class Rewrite {
 public:
  Rewrite(const Graph& g, std::span<const DynamicDim> marks, const Forced& forced)
      : g_(g), forced_(forced), rw_(g), dims_(g.nodes.size()) {
    std::vector<int32_t>& param_node = param_node_;
    param_node.assign(static_cast<size_t>(g.num_params), -1);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (g.nodes[i].op == OpKind::Parameter)
        param_node.at(static_cast<size_t>(NodeAttrs(OpKind::Parameter, g.nodes[i].attrs).i<"index">())) =
            static_cast<int32_t>(i);
    marks_.resize(static_cast<size_t>(g.num_params));
    divisor_.assign(g.nodes.size(), false);
    zero_.assign(g.nodes.size(), false);
    for (const Node& n : g.nodes)
      if (n.op == OpKind::Div && g.node(n.operands[1]).op == OpKind::Full && g.type(n.operands[1]).shape.empty())
        divisor_[n.operands[1].node] = true;
    for (const DynamicDim& m : marks) {
      LAZYRT_CHECK(m.param >= 0 && m.param < g.num_params && param_node[m.param] >= 0,
                   "mark_dynamic: no parameter ", m.param);
      const Shape& s = g.nodes[param_node[m.param]].results[0].shape;
      LAZYRT_CHECK(m.dim >= 0 && m.dim < static_cast<int64_t>(s.size()), "mark_dynamic: dim ", m.dim,
                   " of a value of rank ", s.size());
      const int64_t n = s[m.dim];
      if (n < 2) continue;  // a size-1 dim broadcasts: it stays what it is
      if (m.soft && forced.statics.count({param_node[m.param], m.dim})) continue;
      Dims& d = marks_[m.param];
      d.resize(s.size());
      d[m.dim] = {symbol_of(n), 1, 1, m.soft ? param_node[m.param] : -1, m.dim};
    }
  }

  bool any_symbol() const { return !sizes_.empty(); }
  // The nodes this run found a product would rather read zero-padded (Forced::zeroed).
  const std::set<int32_t>& wanted_zero() const { return want_zero_; }
  const Shape& param_shape(int64_t p) const { return g_.nodes[param_node_[p]].results[0].shape; }

  PolymorphicGraph run() {
    // The sizes first, as the parameters after the traced ones.
    Graph& out = rw_.graph();
    for (size_t s = 0; s < sizes_.size(); ++s) {
      Node p;
      p.op = OpKind::Parameter;
      p.attrs = {static_cast<int64_t>(g_.num_params + static_cast<int64_t>(s))};
      p.results = {ir::TensorType{DType::i64, {}}};
      out.nodes.push_back(std::move(p));
      size_param_.push_back({static_cast<int32_t>(out.nodes.size() - 1), 0});
    }
    out.num_params = g_.num_params + static_cast<int64_t>(sizes_.size());
    for (size_t i = 0; i < g_.nodes.size(); ++i) node(static_cast<int32_t>(i));
    PolymorphicGraph pg;
    pg.graph = rw_.finish();
    pg.sizes = sizes_;
    for (int64_t n : sizes_) pg.buckets.push_back(bucket_of(n));
    pg.params.resize(static_cast<size_t>(g_.num_params));
    for (size_t p = 0; p < marks_.size(); ++p) pg.params[p] = padded_dims(marks_[p]);
    for (ValueRef v : g_.outputs) pg.outputs.push_back(padded_dims(dims(v)));
    for (size_t p = 0; p < pg.params.size(); ++p)
      pg.param_boxes.push_back(pg.params[p].empty() ? Box{}
                                                    : box_of(param_shape(static_cast<int64_t>(p)), pg.params[p],
                                                             pg.buckets, pg.sizes));
    for (size_t k = 0; k < g_.outputs.size(); ++k)
      pg.output_boxes.push_back(pg.outputs[k].empty() ? Box{}
                                                      : box_of(shape(g_.outputs[k]), pg.outputs[k], pg.buckets, pg.sizes));
    return pg;
  }

 private:
  const Graph& g_;
  const Forced& forced_;
  std::vector<int32_t> param_node_;  // per parameter, its node
  GraphRewriter rw_;
  std::vector<std::vector<Dims>> dims_;  // per traced node, per result
  std::vector<Dims> marks_;              // per parameter
  std::vector<bool> divisor_;            // per traced node: a scalar constant some div divides by
  // Per traced node: its result 0 (as rewritten) holds 0 in every padded element, the padding
  // of each of its dynamic dims in that dim's own layout. Inputs are padded with zeros.
  std::vector<bool> zero_;
  std::set<int32_t> want_zero_;          // nodes a product would rather read zero-padded
  std::vector<int64_t> sizes_;           // per symbol
  std::vector<ValueRef> size_param_;     // per symbol
  std::map<std::tuple<int32_t, int64_t, int64_t, size_t, size_t>, ValueRef> masks_;

  int32_t symbol_of(int64_t n) {
    for (size_t s = 0; s < sizes_.size(); ++s)
      if (sizes_[s] == n) return static_cast<int32_t>(s);
    sizes_.push_back(n);
    return static_cast<int32_t>(sizes_.size() - 1);
  }
  // The symbol of size n, where a new dim of that size (a constant's, an expand's) is taken
  // to be one: sound for this trace either way.
  // `uniform`: the node's value is the same all along the dim.
  Dim dim_of_size(int64_t n, int32_t node, int64_t dim, bool uniform) const {
    const std::pair<int32_t, int64_t> key{node, dim};
    if (auto it = forced_.dynamics.find(key); it != forced_.dynamics.end())
      return {it->second.first, it->second.second, 1, node, dim, uniform};
    if (n >= 2 && !forced_.statics.count(key))
      for (size_t s = 0; s < sizes_.size(); ++s)
        if (sizes_[s] == n) return {static_cast<int32_t>(s), 1, 1, node, dim, uniform};
    Dim d;
    if (uniform) d = {-1, 1, 1, node, dim, true};
    return d;
  }
  int64_t bucket(int32_t sym) const { return bucket_of(sizes_[sym]); }
  int64_t padded(int64_t concrete, Dim d) const { return d.dyn() ? d.k() * bucket(d.sym) : concrete; }
  Shape padded_shape(const Shape& s, const Dims& d) const {
    Shape out = s;
    for (size_t i = 0; i < s.size(); ++i) out[i] = padded(s[i], d[i]);
    return out;
  }
  static std::vector<PaddedDim> padded_dims(const Dims& d) {
    std::vector<PaddedDim> out;
    for (size_t i = 0; i < d.size(); ++i)
      if (d[i].dyn()) out.push_back({static_cast<int64_t>(i), d[i].sym, d[i].outer, d[i].inner});
    return out;
  }

  const Dims& dims(ValueRef v) const { return dims_[v.node][v.index]; }
  const Shape& shape(ValueRef v) const { return g_.type(v).shape; }
  ValueRef map(ValueRef v) const { return rw_.map(v); }
  Graph& out() { return rw_.graph(); }

  ValueRef emit(const Node& n, OpKind op, std::vector<ValueRef> operands, Attrs attrs) {
    try {
      return out().add(op, std::move(operands), std::move(attrs));
    } catch (const Error& e) {
      refuse(n, detail::str_cat("its padded form does not type: ", e.what()));
    }
  }
  ValueRef full(const Node& n, double value, DType dtype) { return emit(n, OpKind::Full, {}, {value, Shape{}, dtype}); }

  // Node i's result 0 is `v`, of dims `d`; its padded type must be what the dims say.
  // `zero`: the value is known to hold 0 in all its padding.
  void done(int32_t i, ValueRef v, Dims d, bool zero = false) {
    const Node& n = g_.nodes[i];
    const Shape want = padded_shape(n.results.at(0).shape, d);
    if (out().type(v).shape != want || out().type(v).dtype != n.results[0].dtype)
      refuse(n, detail::str_cat("padded to ", ir::type_str(out().type(v)), ", not ",
                                ir::type_str({n.results[0].dtype, want})));
    if (!keeps_uniform(n.op))
      for (Dim& x : d) {
        x.uniform = false;
        if (!x.dyn()) x.origin = -1;
      }
    zero = zero || keeps_zero(n, d);
    // Zeroed where computed, for the products reading it. Not a value uniform along a dynamic
    // dim: that one may take another layout of the padding, where zeros would be valid elements.
    if (!zero && forced_.zeroed.count(i) && std::none_of(d.begin(), d.end(), [](const Dim& x) { return x.uniform; })) {
      v = fill_all(n, v, d, Fill::Zero);
      zero = true;
    }
    zero_[i] = zero;
    rw_.set(i, 0, v);
    dims_[i] = {std::move(d)};
  }
  // Whether traced value `v`'s padding is zero in the layout of dim `want` along its dim `e`
  // (a dim read as `want`, laid out alike).
  bool zero_as(ValueRef v, size_t e, const Dim& want) const {
    return v.index == 0 && zero_[v.node] && dims(v)[e] == want;
  }
  // Whether node n's result (of dims d) holds zero in all its padding, from its operands':
  // f(0, .., 0) = 0 for an elementwise f whose operands all have each dynamic dim of the
  // result, laid out alike, and zero padding; such a value times or divided by a finite
  // constant (not 0, for a divisor); views and sums of such values; a constant 0. Not a
  // product of two values (0 times an infinity is not 0) nor anything else.
  bool keeps_zero(const Node& n, const Dims& d) const {
    if (std::none_of(d.begin(), d.end(), [](const Dim& x) { return x.dyn(); })) return true;
    const auto operand_zero = [&] { return n.operands[0].index == 0 && zero_[n.operands[0].node]; };
    const auto finite_constant = [&](ValueRef v) {
      const Node& c = g_.node(v);
      if (c.op != OpKind::Full) return false;
      const double value = NodeAttrs(c.op, c.attrs).f<"value">();
      return std::isfinite(value) && (n.op == OpKind::Mul || value != 0);
    };
    if (n.op == OpKind::Mul || n.op == OpKind::Div)
      for (size_t k = 0; k < 2; ++k) {  // operand k times (or over) constant 1 - k
        if ((n.op == OpKind::Div && k != 0) || !finite_constant(n.operands[1 - k])) continue;
        const ValueRef v = n.operands[k];
        if (shape(v).size() != d.size()) continue;
        bool zero = true;
        for (size_t e = 0; e < d.size(); ++e) zero = zero && (!d[e].dyn() || zero_as(v, e, d[e]));
        if (zero) return true;
      }
    // f(0, .., 0) = 0: read off the elementwise rows' scalar functions; cast, where (of its
    // values) and stop_gradient pass zeros on.
    if (n.op == OpKind::Cast || n.op == OpKind::Where || n.op == OpKind::StopGradient ||
        (scalar::has_elementwise_fn(n.op) && scalar::maps_zero_to_zero(n.op))) {
      for (size_t k = n.op == OpKind::Where ? 1 : 0; k < n.operands.size(); ++k) {
        const ValueRef v = n.operands[k];
        const size_t off = d.size() - shape(v).size();
        for (size_t e = 0; e < d.size(); ++e)
          if (d[e].dyn() && (e < off || shape(v)[e - off] == 1 || !zero_as(v, e - off, d[e]))) return false;
      }
      return true;
    }
    switch (n.op) {
      case OpKind::Permute: case OpKind::Reshape: case OpKind::Sum: case OpKind::Amax: case OpKind::Amin:
        return operand_zero();
      case OpKind::Slice: case OpKind::Expand: {
        // No dim made dynamic here: its padding would hold valid elements of the operand.
        const ValueRef x = n.operands[0];
        const Dims& dx = dims(x);
        const size_t off = d.size() - dx.size();
        for (size_t e = 0; e < d.size(); ++e)
          if (d[e].dyn() && (e < off || !dx[e - off].dyn() || shape(x)[e - off] == 1)) return false;
        return operand_zero();
      }
      case OpKind::Full: return NodeAttrs(n.op, n.attrs).f<"value">() == 0;
      default: return false;
    }
  }
  // A product or a sum reads traced value `v` over a padded dim, and it is not zero-padded.
  // The node to zero where computed: the value the views (permutes, reshapes, slices) `v`
  // comes through start from, where that is elementwise (the zeroing joins its kernel); else
  // `v` itself (a product may write a permute of its result itself, so the views stay as they
  // are; a view zeroed in an earlier run makes the views of it zero too).
  void want_zero(ValueRef v) {
    if (v.index != 0) return;
    ValueRef s = v;
    for (;;) {
      const Node& p = g_.node(s);
      if (p.op != OpKind::Permute && p.op != OpKind::Reshape && p.op != OpKind::Slice) break;
      if (p.op == OpKind::Slice) {
        const Dims& ds = dims(s);
        const Dims& dx = dims(p.operands[0]);
        bool fresh = false;
        for (size_t e = 0; e < ds.size(); ++e) fresh = fresh || (ds[e].dyn() && !dx[e].dyn());
        if (fresh) break;
      }
      if (p.operands[0].index != 0) break;
      s = p.operands[0];
    }
    want_zero_.insert(ir::has_flag(g_.node(s).op, ir::kElementwise) ? s.node : v.node);
  }
  // Operand `t` of a product contracting its padded dim `axis`, read as dims `m` (the
  // contracted dim in the layout both operands share): as it is where its padding is zero
  // there, else masked.
  ValueRef contracted(const Node& n, ValueRef t, const Dims& m, size_t axis) {
    if (!m[axis].dyn() || zero_as(t, axis, m[axis])) return map(t);
    want_zero(t);
    return fill(n, map(t), m, axis, Fill::Zero);
  }
  // Ops whose result is the same all along a dim where their operands are (along the dims
  // they come from).
  static bool keeps_uniform(OpKind op) {
    if (ir::has_flag(op, ir::kElementwise) || reduces_dims(op)) return true;
    switch (op) {
      case OpKind::Full: case OpKind::Expand: case OpKind::StopGradient: case OpKind::Permute: case OpKind::Matmul:
        return true;
      default: return false;
    }
  }

  // valid(index along `axis`) as a b8 value of `rank` dims, every other dim 1.
  ValueRef mask(const Node& n, Dim d, size_t rank, size_t axis) {
    auto key = std::make_tuple(d.sym, d.outer, d.inner, rank, axis);
    if (auto it = masks_.find(key); it != masks_.end()) return it->second;
    const int64_t b = bucket(d.sym);
    ValueRef m = emit(n, OpKind::Lt, {emit(n, OpKind::Iota, {}, {Shape{b}, DType::i64}), size_param_[d.sym]}, {});
    if (d.outer != 1 || d.inner != 1) {
      m = emit(n, OpKind::Reshape, {m}, {Shape{1, b, 1}});
      m = emit(n, OpKind::Expand, {m}, {Shape{d.outer, b, d.inner}});
      m = emit(n, OpKind::Reshape, {m}, {Shape{d.outer * b * d.inner}});
    }
    Shape s(rank, 1);
    s[axis] = d.k() * b;
    if (rank != 1) m = emit(n, OpKind::Reshape, {m}, {s});
    masks_.emplace(key, m);
    return m;
  }

  // `v` (new, of traced dims `d`) with its padding along `axis` reading as `fill`.
  ValueRef fill(const Node& n, ValueRef v, const Dims& d, size_t axis, Fill f) {
    if (!d[axis].dyn()) return v;
    const ir::TensorType& t = out().type(v);
    ValueRef value;
    switch (f) {
      case Fill::Zero: value = full(n, 0, t.dtype); break;
      case Fill::One: value = full(n, 1, t.dtype); break;
      case Fill::NegInf: value = full(n, -std::numeric_limits<double>::infinity(), t.dtype); break;
      case Fill::True: value = full(n, 1, DType::b8); break;
      case Fill::First: {
        // The line's first element, valid since the size is at least 2: a tie with an element
        // after it never wins, so max, min and their indices are the valid elements' own.
        std::vector<int64_t> starts(t.shape.size(), 0), ends = t.shape, steps(t.shape.size(), 1);
        ends[axis] = 1;
        value = emit(n, OpKind::Slice, {v}, {starts, ends, steps});
        break;
      }
    }
    return emit(n, OpKind::Where, {mask(n, d[axis], t.shape.size(), axis), v, value}, {});
  }
  ValueRef fill_all(const Node& n, ValueRef v, const Dims& d, Fill f) {
    for (size_t a = 0; a < d.size(); ++a) v = fill(n, v, d, a, f);
    return v;
  }

  // The product of the sizes of `axes` of a value of dims `d` (traced shape `s`), in `dtype`.
  ValueRef count(const Node& n, const Shape& s, const Dims& d, const std::vector<int64_t>& axes, DType dtype) {
    int64_t fixed = 1;
    for (int64_t a : axes) fixed *= d[a].dyn() ? d[a].k() : s[a];
    ValueRef c = full(n, static_cast<double>(fixed), DType::i64);
    for (int64_t a : axes)
      if (d[a].dyn()) c = emit(n, OpKind::Mul, {c, size_param_[d[a].sym]}, {});
    return emit(n, OpKind::Cast, {c}, {dtype});
  }

  // Two dynamic dims that may be one: the same size, laid out alike or one of them uniform
  // (it takes the other's layout).
  static bool compatible(const Dim& a, const Dim& b) {
    return a.sym == b.sym && a.k() == b.k() && (a == b || a.uniform || b.uniform);
  }
  // A static dim `st` meets dynamic `dy`: the static one is made dynamic where it is uniform
  // and chosen, else a chosen dynamic one static; else the graph is refused.
  [[noreturn]] static void conflict(const Node& n, const Dim& st, const Dim& dy) {
    if (st.promotable()) throw Retry{{st.origin, st.origin_dim}, dy.sym, dy.k()};
    if (dy.free()) throw Retry{{dy.origin, dy.origin_dim}};
    refuse(n, "a dim that is not dynamic meets a dynamic one");
  }
  // Two dynamic dims that cannot be one.
  [[noreturn]] static void mismatch(const Node& n, const Dim& a, const Dim& b) {
    if (a.free()) throw Retry{{a.origin, a.origin_dim}};
    if (b.free()) throw Retry{{b.origin, b.origin_dim}};
    refuse(n, "operands padded differently");
  }
  // The dim several operand dims (not of size 1) of one result dim make: dynamic in the layout
  // of the first that is not uniform, chosen only where all are, uniform where all are.
  static Dim join(const Node& n, const std::vector<Dim>& ds) {
    Dim r;
    const Dim* dy = nullptr;
    const Dim* st = nullptr;
    for (const Dim& x : ds) {
      if (!x.dyn()) {
        if (!st || (st->promotable() && !x.promotable())) st = &x;
        continue;
      }
      if (!dy) dy = &x;
      else if (!compatible(*dy, x)) mismatch(n, *dy, x);
      else if (dy->uniform && !x.uniform) dy = &x;
    }
    if (dy && st) conflict(n, *st, *dy);
    if (!dy) {
      if (ds.empty()) return r;
      r = *st;
      for (const Dim& x : ds) r.uniform = r.uniform && x.uniform;
      if (!r.uniform) r.origin = -1;
      return r;
    }
    r = *dy;
    for (const Dim& x : ds) {
      r.uniform = r.uniform && x.uniform;
      if (!x.free()) r.origin = -1;
    }
    return r;
  }

  // Broadcasting: the result dims of operands broadcast to a result of `rank` dims
  // (right-aligned), each the join of the operands' dims there.
  Dims broadcast(const Node& n, std::span<const ValueRef> operands, size_t rank) const {
    std::vector<std::vector<Dim>> at(rank);
    for (ValueRef v : operands) {
      const Shape& s = shape(v);
      const Dims& d = dims(v);
      for (size_t e = 0; e < s.size(); ++e)
        if (s[e] != 1) at[rank - s.size() + e].push_back(d[e]);
    }
    Dims r(rank);
    for (size_t k = 0; k < rank; ++k) r[k] = join(n, at[k]);
    return r;
  }

  // A dim an op cannot take padded: a chosen one is retried static.
  static void must_be_static(const Node& n, const Dim& d, const char* what) {
    if (!d.dyn()) return;
    if (d.free()) throw Retry{{d.origin, d.origin_dim}};
    refuse(n, what);
  }
  static void all_static(const Node& n, const Dims& d, const char* what) {
    for (const Dim& x : d) must_be_static(n, x, what);
  }
  // Two dims that must be padded alike, layout included.
  static void same(const Node& n, const Dim& a, const Dim& b) {
    if (a == b) return;
    if (!a.dyn() && !b.dyn()) return;
    if (!a.dyn()) conflict(n, a, b);
    if (!b.dyn()) conflict(n, b, a);
    mismatch(n, a, b);
  }
  static void same(const Node& n, const Dims& a, const Dims& b) {
    if (a.size() != b.size()) refuse(n, "operands padded differently");
    for (size_t e = 0; e < a.size(); ++e) same(n, a[e], b[e]);
  }

  std::vector<ValueRef> mapped(const Node& n) const {
    std::vector<ValueRef> ops;
    for (ValueRef v : n.operands) ops.push_back(map(v));
    return ops;
  }

  // A node whose result dims all stay as traced (no dynamic operand): copied as it is.
  void keep(int32_t i) {
    const Node& n = g_.nodes[i];
    rw_.copy(i);
    zero_[i] = true;  // nothing padded
    dims_[i].clear();
    for (const ir::TensorType& t : n.results) dims_[i].push_back(Dims(t.shape.size()));
  }

  void node(int32_t i) {
    const Node& n = g_.nodes[i];
    const NodeAttrs a(n.op, n.attrs);
    const size_t rank = n.results.empty() ? 0 : n.results[0].shape.size();
    if (n.op == OpKind::Parameter) {
      const int64_t p = a.i<"index">();
      Dims d = marks_[p].empty() ? Dims(rank) : marks_[p];
      Node c = n;
      c.results[0].shape = padded_shape(n.results[0].shape, d);
      out().nodes.push_back(std::move(c));
      rw_.set(i, 0, {static_cast<int32_t>(out().nodes.size() - 1), 0});
      dims_[i] = {std::move(d)};
      zero_[i] = true;  // the run pads inputs with zeros
      return;
    }
    if (ir::has_flag(n.op, ir::kElementwise) || n.op == OpKind::StopGradient) {
      Dims d = broadcast(n, n.operands, rank);
      done(i, emit(n, n.op, mapped(n), n.attrs), std::move(d));
      return;
    }
    if (reduces_dims(n.op)) {
      reduction(i);
      return;
    }
    switch (n.op) {
      case OpKind::Full: {
        if (divisor_[i]) {
          // A count a mean's gradient divides by: k * n for this trace, so k * n in every one.
          const double v = a.f<"value">();
          for (size_t sym = 0; sym < sizes_.size(); ++sym) {
            const auto n_sym = static_cast<double>(sizes_[sym]);
            if (v < n_sym || v > 9007199254740992.0 || std::fmod(v, n_sym) != 0) continue;
            ValueRef c = emit(n, OpKind::Mul, {full(n, v / n_sym, DType::i64), size_param_[sym]}, {});
            done(i, emit(n, OpKind::Cast, {c}, {a.dtype<"dtype">()}), {});
            return;
          }
        }
        Dims d(rank);
        for (size_t e = 0; e < rank; ++e) d[e] = dim_of_size(n.results[0].shape[e], i, static_cast<int64_t>(e), true);
        done(i, emit(n, n.op, {}, {a.f<"value">(), padded_shape(n.results[0].shape, d), a.dtype<"dtype">()}), d);
        return;
      }
      case OpKind::Iota: {
        Dims d{dim_of_size(n.results[0].shape[0], i, 0, false)};
        done(i, emit(n, n.op, {}, {padded_shape(n.results[0].shape, d), a.dtype<"dtype">()}), d);
        return;
      }
      case OpKind::Random: {
        // Element j is drawn from counter offset + j: padding the outermost dim that is not 1
        // keeps every valid element's counter.
        const Shape& s = n.results[0].shape;
        Dims d(rank);
        for (size_t e = 0; e < rank; ++e)
          if (s[e] != 1) {
            d[e] = dim_of_size(s[e], i, static_cast<int64_t>(e), false);
            break;
          }
        done(i, emit(n, n.op, mapped(n), {a.i<"distribution">(), padded_shape(s, d), a.dtype<"dtype">()}), d);
        return;
      }
      case OpKind::ArgMax:
      case OpKind::ArgMin: {
        const ValueRef x = n.operands[0];
        const auto axis = static_cast<size_t>(a.i<"dim">());
        const ValueRef v = fill(n, map(x), dims(x), axis, Fill::First);
        done(i, emit(n, n.op, {v}, n.attrs), reduced_dims(dims(x), {static_cast<int64_t>(axis)}, a.b<"keepdim">()));
        return;
      }
      case OpKind::Softmax:
      case OpKind::LogSoftmax: {
        const ValueRef x = n.operands[0];
        const ValueRef v = fill(n, map(x), dims(x), static_cast<size_t>(a.i<"dim">()), Fill::NegInf);
        done(i, emit(n, n.op, {v}, n.attrs), dims(x));
        return;
      }
      case OpKind::Cumsum: {
        const ValueRef x = n.operands[0];
        ValueRef v = map(x);
        if (a.b<"reverse">()) v = fill(n, v, dims(x), static_cast<size_t>(a.i<"dim">()), Fill::Zero);
        done(i, emit(n, n.op, {v}, n.attrs), dims(x));
        return;
      }
      case OpKind::Cumprod:
        done(i, emit(n, n.op, mapped(n), n.attrs), dims(n.operands[0]));
        return;
      case OpKind::CumprodBackward: {
        const ValueRef g = n.operands[0], x = n.operands[1];
        same(n, dims(g), dims(x));
        const auto axis = static_cast<size_t>(a.i<"dim">());
        done(i,
             emit(n, n.op, {fill(n, map(g), dims(g), axis, Fill::Zero), fill(n, map(x), dims(x), axis, Fill::One)},
                  n.attrs),
             dims(x));
        return;
      }
      case OpKind::Sort: {
        const ValueRef x = n.operands[0];
        const auto axis = static_cast<size_t>(a.i<"dim">());
        must_be_static(n, dims(x)[axis], "sorts along a dynamic dim");
        done(i, emit(n, n.op, {map(x)}, n.attrs), dims(x));
        return;
      }
      case OpKind::Matmul: matmul(i); return;
      case OpKind::Permute: {
        const Dims& dx = dims(n.operands[0]);
        Dims d;
        for (int64_t p : a.ints<"dims">()) d.push_back(dx[p]);
        done(i, emit(n, n.op, mapped(n), n.attrs), d);
        return;
      }
      case OpKind::Reshape: reshape(i); return;
      case OpKind::Expand: {
        const ValueRef x = n.operands[0];
        const Shape& s = shape(x);
        const Dims& dx = dims(x);
        const Shape& to = n.results[0].shape;
        Dims d(rank);
        for (size_t e = 0; e < rank; ++e) {
          const size_t off = rank - s.size();
          if (e >= off && s[e - off] != 1) d[e] = dx[e - off];
          else d[e] = dim_of_size(to[e], i, static_cast<int64_t>(e), true);
        }
        done(i, emit(n, n.op, {map(x)}, {padded_shape(to, d)}), d);
        return;
      }
      case OpKind::Slice: {
        const ValueRef x = n.operands[0];
        const Shape& s = shape(x);
        const Dims& dx = dims(x);
        std::vector<int64_t> starts = a.ints<"starts">(), ends = a.ints<"ends">();
        const std::vector<int64_t>& steps = a.ints<"steps">();
        Dims d(rank);
        for (size_t e = 0; e < rank; ++e) {
          if (dx[e].dyn()) {
            if (starts[e] != 0 || steps[e] != 1 || ends[e] != s[e]) must_be_static(n, dx[e], "slices a dynamic dim");
            d[e] = dx[e];
            ends[e] = padded(s[e], dx[e]);
          } else if (starts[e] == 0 && steps[e] == 1 && ends[e] <= s[e]) {
            // The first n of a static dim (a causal mask's rows): as long as the bucket fits.
            const Dim k = dim_of_size(ends[e], i, static_cast<int64_t>(e), false);
            if (k.dyn() && bucket(k.sym) <= s[e]) {
              d[e] = k;
              ends[e] = bucket(k.sym);
            }
          }
        }
        done(i, emit(n, n.op, {map(x)}, {starts, ends, steps}), d);
        return;
      }
      case OpKind::Pad: {
        const ValueRef x = n.operands[0];
        const Dims& dx = dims(x);
        for (size_t e = 0; e < rank; ++e)
          if (a.ints<"low">()[e] != 0 || a.ints<"high">()[e] != 0 || a.ints<"interior">()[e] != 0)
            must_be_static(n, dx[e], "pads a dynamic dim");
        done(i, emit(n, n.op, {map(x)}, n.attrs), dx);
        return;
      }
      case OpKind::Flip: {
        const Dims& dx = dims(n.operands[0]);
        for (int64_t e : a.ints<"dims">()) must_be_static(n, dx[e], "flips a dynamic dim");
        done(i, emit(n, n.op, mapped(n), n.attrs), dx);
        return;
      }
      case OpKind::Concat: {
        const auto axis = static_cast<size_t>(a.i<"dim">());
        const Dims& d0 = dims(n.operands[0]);
        for (ValueRef v : n.operands) same(n, dims(v), d0);
        for (ValueRef v : n.operands) must_be_static(n, dims(v)[axis], "concatenates along a dynamic dim");
        done(i, emit(n, n.op, mapped(n), n.attrs), d0);
        return;
      }
      case OpKind::IndexSelect: {
        const ValueRef x = n.operands[0], idx = n.operands[1];
        const auto axis = static_cast<size_t>(a.i<"dim">());
        must_be_static(n, dims(x)[axis], "indexes a dynamic dim");
        Dims d = dims(x);
        d[axis] = dims(idx).empty() ? Dim{} : dims(idx)[0];
        done(i, emit(n, n.op, {map(x), fill_all(n, map(idx), dims(idx), Fill::Zero)}, n.attrs), d);
        return;
      }
      case OpKind::Gather: {
        const ValueRef x = n.operands[0], idx = n.operands[1];
        const auto axis = static_cast<size_t>(a.i<"dim">());
        must_be_static(n, dims(x)[axis], "indexes a dynamic dim");
        done(i, emit(n, n.op, {map(x), fill_all(n, map(idx), dims(idx), Fill::Zero)}, n.attrs), dims(idx));
        return;
      }
      case OpKind::ScatterAdd:
      case OpKind::IndexAdd: {
        // Padded rows add zeros at index 0.
        const ValueRef x = n.operands[0], idx = n.operands[1], src = n.operands[2];
        const auto axis = static_cast<size_t>(a.i<"dim">());
        must_be_static(n, dims(x)[axis], "indexes a dynamic dim");
        ValueRef vi = fill_all(n, map(idx), dims(idx), Fill::Zero);
        ValueRef vs = map(src);
        const bool zero = src.index == 0 && zero_[src.node];
        if (n.op == OpKind::ScatterAdd) {
          same(n, dims(idx), dims(src));
          if (!zero) vs = fill_all(n, vs, dims(src), Fill::Zero);
        } else if (!zero) {
          vs = fill(n, vs, dims(src), axis, Fill::Zero);
        }
        done(i, emit(n, n.op, {map(x), vi, vs}, n.attrs), dims(x));
        return;
      }
      case OpKind::Check: {
        const ValueRef x = n.operands[0], ok = n.operands[1];
        done(i, emit(n, n.op, {map(x), fill_all(n, map(ok), dims(ok), Fill::True)}, n.attrs), dims(x));
        return;
      }
      case OpKind::Conv2d:
      case OpKind::MaxPool2d:
      case OpKind::MaxPool2dIndices:
      case OpKind::AvgPool2d:
      case OpKind::MaxPool2dBackward:
      case OpKind::Conv2dBackwardInput:
      case OpKind::AvgPool2dBackward:
      case OpKind::Conv2dBackwardWeight:
        batch_only(i);
        return;
      default:
        for (ValueRef v : n.operands) all_static(n, dims(v), "reads a dynamic value");
        keep(i);
        return;
    }
  }

  static Dims reduced_dims(const Dims& d, const std::vector<int64_t>& axes, bool keepdim) {
    Dims out;
    for (size_t e = 0; e < d.size(); ++e) {
      const bool reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(e)) != axes.end();
      if (!reduced) out.push_back(d[e]);
      else if (keepdim) out.push_back({});
    }
    return out;
  }

  void reduction(int32_t i) {
    const Node& n = g_.nodes[i];
    const NodeAttrs a(n.op, n.attrs);
    const ValueRef x = n.operands[0];
    const Dims& dx = dims(x);
    const std::vector<int64_t>& axes = a.ints<"dims">();
    const bool keepdim = a.b<"keepdim">();
    const Dims d = reduced_dims(dx, axes, keepdim);
    const bool padded_axis = std::any_of(axes.begin(), axes.end(), [&](int64_t e) { return dx[e].dyn(); });
    ValueRef v = map(x);
    if (!padded_axis) {
      done(i, emit(n, n.op, {v}, n.attrs), d);
      return;
    }
    auto fill_axes = [&](ValueRef w, Fill f) {
      for (int64_t e : axes) w = fill(n, w, dx, static_cast<size_t>(e), f);
      return w;
    };
    // x's own zeros in its padding, where it has them, for a sum (else asked for).
    const bool zero = x.index == 0 && zero_[x.node];
    auto zeros = [&](ValueRef w) {
      if (zero) return w;
      want_zero(x);
      return fill_axes(w, Fill::Zero);
    };
    switch (n.op) {
      case OpKind::Sum:
      case OpKind::Norm: done(i, emit(n, n.op, {zeros(v)}, n.attrs), d); return;
      case OpKind::Prod: done(i, emit(n, n.op, {fill_axes(v, Fill::One)}, n.attrs), d); return;
      case OpKind::Amax:
      case OpKind::Amin: done(i, emit(n, n.op, {fill_axes(v, Fill::First)}, n.attrs), d); return;
      default: break;
    }
    // Mean, var, std: over the count the sizes give, in f64 for f32 (as the kernels sum: a
    // line of equal values has a mean of exactly that value and a std of exactly 0, which a
    // std's gradient tells apart from a small one) and f32 for 16-bit types; the result is
    // rounded once, as the kernel's.
    const DType dtype = n.results[0].dtype;
    const DType wide = dtype == DType::bf16 || dtype == DType::f16 ? DType::f32
                       : dtype == DType::f32                      ? DType::f64
                                                                  : dtype;
    if (wide != dtype) v = emit(n, OpKind::Cast, {v}, {wide});
    const ValueRef c = count(n, shape(x), dx, axes, wide);
    const bool keep_mean = n.op != OpKind::Mean || keepdim;
    ValueRef mean = emit(n, OpKind::Div, {emit(n, OpKind::Sum, {zeros(v)}, {axes, keep_mean}), c}, {});
    ValueRef r = mean;
    if (n.op != OpKind::Mean) {
      const ValueRef dev = fill_axes(emit(n, OpKind::Sub, {v, mean}, {}), Fill::Zero);
      const ValueRef ss = emit(n, OpKind::Sum, {emit(n, OpKind::Mul, {dev, dev}, {})}, {axes, keepdim});
      const ValueRef denom = emit(
          n, OpKind::Maximum, {emit(n, OpKind::Sub, {c, full(n, a.f<"correction">(), wide)}, {}), full(n, 0, wide)}, {});
      r = emit(n, OpKind::Div, {ss, denom}, {});
      if (n.op == OpKind::Std) r = emit(n, OpKind::Sqrt, {r}, {});
    }
    if (wide != dtype) r = emit(n, OpKind::Cast, {r}, {dtype});
    done(i, r, d);
  }

  void matmul(int32_t i) {
    const Node& n = g_.nodes[i];
    const ValueRef x = n.operands[0], y = n.operands[1];
    const Shape &sx = shape(x), &sy = shape(y);
    const Dims &dx = dims(x), &dy = dims(y);
    if (sx.size() < 2 || sy.size() < 2) {
      all_static(n, dx, "a vector operand is dynamic");
      all_static(n, dy, "a vector operand is dynamic");
      keep(i);
      return;
    }
    const size_t rank = n.results[0].shape.size();
    // Batch dims broadcast as elementwise operands do.
    std::vector<std::vector<Dim>> at(rank);
    for (auto [s, ds] : {std::pair{&sx, &dx}, std::pair{&sy, &dy}})
      for (size_t e = 0; e + 2 < s->size(); ++e)
        if ((*s)[e] != 1) at[rank - s->size() + e].push_back((*ds)[e]);
    Dims d(rank);
    for (size_t e = 0; e + 2 < rank; ++e) d[e] = join(n, at[e]);
    // The contracted dim: both masked alike, in the layout of the one that is not uniform.
    const Dim kx = dx[sx.size() - 1], ky = dy[sy.size() - 2];
    Dim kmask = kx;
    if (kx.dyn() != ky.dyn()) {
      if (kx.dyn()) conflict(n, ky, kx);
      conflict(n, kx, ky);
    }
    if (kx.dyn()) {
      if (!compatible(kx, ky)) mismatch(n, kx, ky);
      if (kx.uniform) kmask = ky;
    }
    d[rank - 2] = dx[sx.size() - 2];
    d[rank - 1] = dy[sy.size() - 1];
    if (std::optional<ValueRef> ext = extents(n, d, kx.dyn() ? kmask : Dim{})) {
      // Bounded: reads no padding, writes zeros there.
      const ValueRef vx = map(x), vy = map(y);
      const std::vector<int64_t> xv = ir::StridedView::whole(out().type(vx).shape).encode();
      const std::vector<int64_t> yv = ir::StridedView::whole(out().type(vy).shape).encode();
      done(i, emit(n, OpKind::GemmView, {vx, vy, *ext}, {xv, yv, std::vector<int64_t>{}}), d, true);
      return;
    }
    Dims mx = dx, my = dy;
    mx[sx.size() - 1] = my[sy.size() - 2] = kmask;
    const ValueRef vx = contracted(n, x, mx, sx.size() - 1);
    const ValueRef vy = contracted(n, y, my, sy.size() - 2);
    done(i, emit(n, n.op, {vx, vy}, n.attrs), d);
  }

  // A product's valid extents (gemm_view's third operand: per axis, batches, rows, columns,
  // contracted elements, a valid count and a block) where its dynamic dims are all of one
  // symbol: the first batch dim, the rows, the columns, the contracted dim `k`. A dim of
  // outer * n * inner is valid in blocks of bucket * inner, n * inner at each block's start
  // (one block where outer is 1). None where another batch dim is dynamic, two symbols meet,
  // or a dynamic dim of the result is uniform (its zeros would not be).
  std::optional<ValueRef> extents(const Node& n, const Dims& d, const Dim& k) {
    const size_t rank = d.size();
    const Shape& s = n.results[0].shape;
    int32_t sym = -1;
    int64_t per[4] = {0, 0, 0, 0}, block[4] = {-1, -1, -1, -1};  // valid count per n, block
    auto take = [&](const Dim& x, size_t axis, int64_t inside) {
      if (!x.dyn()) return true;
      if (sym >= 0 && x.sym != sym) return false;
      sym = x.sym;
      per[axis] = x.inner * inside;
      if (x.outer != 1) block[axis] = bucket(x.sym) * x.inner * inside;
      return true;
    };
    for (size_t e = 0; e < rank; ++e) {
      if (!d[e].dyn()) continue;
      if (d[e].uniform || (e > 0 && e + 2 < rank)) return std::nullopt;
      int64_t inside = 1;  // the static batch dims inside the first one
      if (e + 2 < rank)
        for (size_t f = 1; f + 2 < rank; ++f) inside *= s[f];
      if (!take(d[e], e + 2 == rank ? 1 : e + 1 == rank ? 2 : 0, inside)) return std::nullopt;
    }
    if (!take(k, 3, 1) || sym < 0) return std::nullopt;
    std::vector<ValueRef> parts;
    for (size_t a = 0; a < 4; ++a) {
      ValueRef v = per[a] > 0
                       ? emit(n, OpKind::Mul, {full(n, static_cast<double>(per[a]), DType::i64), size_param_[sym]}, {})
                       : full(n, -1, DType::i64);
      parts.push_back(emit(n, OpKind::Reshape, {v}, {Shape{1}}));
      parts.push_back(emit(n, OpKind::Reshape, {full(n, static_cast<double>(block[a]), DType::i64)}, {Shape{1}}));
    }
    return emit(n, OpKind::Concat, parts, {int64_t{0}});
  }

  // Reshape: dims grouped into runs of equal element counts. A run holds at most one dynamic
  // factor n; the output dim it falls in takes it, with the dims around it in the run as its
  // outer and inner parts (so the padding keeps its place between them).
  void reshape(int32_t i) {
    const Node& n = g_.nodes[i];
    const ValueRef x = n.operands[0];
    const Shape& s = shape(x);
    const Dims& dx = dims(x);
    const Shape& to = n.results[0].shape;
    Dims d(to.size());
    size_t a = 0, b = 0;
    while (a < s.size() || b < to.size()) {
      const size_t a0 = a, b0 = b;
      int64_t pa = 1, pb = 1;
      // One run: a dim from each side, then the smaller side grows until both products meet.
      if (a < s.size()) pa = s[a++];
      if (b < to.size()) pb = to[b++];
      while (pa != pb) {
        if (pa < pb && a < s.size()) pa *= s[a++];
        else if (pb < pa && b < to.size()) pb *= to[b++];
        else refuse(n, "element counts do not match");
      }
      // The run's dynamic factor, and the static elements outside and inside it.
      int64_t dyn_at = -1;
      for (size_t e = a0; e < a; ++e)
        if (dx[e].dyn()) {
          if (dyn_at >= 0) {  // a chosen one of the two is retried static, the inner first
            const Dim& chosen = dx[e].free() ? dx[e] : dx[dyn_at];
            must_be_static(n, chosen, "two dynamic dims are merged into one");
          }
          dyn_at = static_cast<int64_t>(e);
        }
      if (dyn_at < 0) continue;
      const Dim& dyn = dx[dyn_at];
      int64_t outer = dyn.outer, inner = dyn.inner;
      for (size_t e = a0; e < static_cast<size_t>(dyn_at); ++e) outer *= s[e];
      for (size_t e = static_cast<size_t>(dyn_at) + 1; e < a; ++e) inner *= s[e];
      // The output dim holding the factor: the dims before it make up part of `outer`, the
      // dims after it part of `inner` (at most one such dim: see polymorphic.h).
      const int64_t n_sym = sizes_[dyn.sym];
      bool placed = false;
      int64_t before = 1;
      for (size_t j = b0; j < b && !placed; ++j) {
        int64_t after = 1;
        for (size_t e = j + 1; e < b; ++e) after *= to[e];
        if (outer % before == 0 && inner % after == 0 && to[j] == outer / before * n_sym * (inner / after)) {
          d[j] = dyn;
          d[j].outer = outer / before;
          d[j].inner = inner / after;
          placed = true;
        }
        before *= to[j];
      }
      if (!placed) must_be_static(n, dyn, "a dynamic dim is split across dims");
    }
    done(i, emit(n, n.op, {map(x)}, {padded_shape(to, d)}), d);
  }

  // Convolution and pooling: only the batch (dim 0) may be dynamic; the backward of the
  // weight sums over it.
  void batch_only(int32_t i) {
    const Node& n = g_.nodes[i];
    for (ValueRef v : n.operands) {
      const Dims& dv = dims(v);
      for (size_t e = 1; e < dv.size(); ++e)
        must_be_static(n, dv[e], "a dim other than the batch is dynamic");
    }
    const bool weight_operand = n.op == OpKind::Conv2d || n.op == OpKind::Conv2dBackwardInput;
    if (weight_operand) all_static(n, dims(n.operands[1]), "the weight is dynamic");
    const Dim batch = dims(n.operands[0])[0];
    if (n.op == OpKind::MaxPool2dBackward || n.op == OpKind::Conv2dBackwardWeight)
      same(n, dims(n.operands[1])[0], batch);
    Attrs attrs = n.attrs;
    std::vector<ValueRef> ops = mapped(n);
    Dims d(n.results[0].shape.size());
    if (n.op == OpKind::Conv2dBackwardWeight) {  // contracts the batch
      ops[0] = contracted(n, n.operands[0], dims(n.operands[0]), 0);
      ops[1] = contracted(n, n.operands[1], dims(n.operands[1]), 0);
    } else {
      d[0] = batch;
      if (n.op == OpKind::Conv2dBackwardInput || n.op == OpKind::AvgPool2dBackward) {
        auto size = std::get<std::vector<int64_t>>(attrs.values.at(0));  // input_size
        size[0] = padded(size[0], batch);
        attrs.values[0] = size;
      }
    }
    done(i, emit(n, n.op, ops, attrs), d);
  }
};

}  // namespace

std::optional<PolymorphicGraph> make_polymorphic(const ir::Graph& traced, std::span<const DynamicDim> marks,
                                                 std::string* why) {
  const ir::Graph g = inline_calls(traced);
  Forced forced;
  constexpr int kZeroRounds = 4;
  int zero_rounds = 0;
  for (;;) {
    Rewrite r(g, marks, forced);
    if (!r.any_symbol()) {
      if (why) *why = kNothingToPad;
      return std::nullopt;
    }
    try {
      PolymorphicGraph pg = r.run();
      // Again with the values products read zeroed where they are computed, while that finds
      // more of them (a bounded number of times: each graph is sound, only slower).
      const size_t before = forced.zeroed.size();
      forced.zeroed.insert(r.wanted_zero().begin(), r.wanted_zero().end());
      if (forced.zeroed.size() == before || ++zero_rounds > kZeroRounds) return pg;
      continue;
    } catch (const Refused& e) {
      if (why) *why = e.why;
      return std::nullopt;
    } catch (const Retry& e) {
      // Each retry settles one more chosen dim: static once and for all, or dynamic until
      // made static. A dim asked both ways refuses.
      if (e.sym < 0) {
        forced.dynamics.erase(e.origin);
        if (!forced.statics.insert(e.origin).second) {
          if (why) *why = "a dim is both static and dynamic";
          return std::nullopt;
        }
      } else if (forced.statics.count(e.origin) || !forced.dynamics.emplace(e.origin, std::pair{e.sym, e.k}).second) {
        if (why) *why = "a dim is both static and dynamic";
        return std::nullopt;
      }
    }
  }
}

}  // namespace lazyrt::compile
