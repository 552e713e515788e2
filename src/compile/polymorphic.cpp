#include "compile/polymorphic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "compile/passes.h"
#include "util/check.h"

namespace lazyrt::compile {

int64_t bucket_of(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

namespace {

using ir::Attrs;
using ir::Graph;
using ir::Node;
using ir::NodeAttrs;
using ir::OpKind;
using ir::ValueRef;

// A dim of a traced value: static, or k times symbol `sym`'s size.
struct Dim {
  int32_t sym = -1;
  int64_t k = 0;
  // A dim an expand or a constant made of the size n (not read from a dynamic value), and
  // the dims that take it from there: node `origin`'s dim `origin_dim`. Taken as dynamic
  // until it meets a static dim; the rewrite then starts again with that one static.
  int32_t origin = -1;
  int64_t origin_dim = 0;
  bool free() const { return origin >= 0; }
  bool dyn() const { return sym >= 0; }
  bool operator==(const Dim& o) const { return sym == o.sym && k == o.k; }
  bool operator!=(const Dim& o) const { return !(*this == o); }
};
using Dims = std::vector<Dim>;

struct Refused {
  std::string why;
};
// A free dim met a static one: the rewrite starts again with it static.
struct Retry {
  std::pair<int32_t, int64_t> origin;
};
using Forced = std::set<std::pair<int32_t, int64_t>>;

[[noreturn]] void refuse(const Node& n, const std::string& what) {
  throw Refused{detail::str_cat(ir::op_name(n.op), ": ", what)};
}


// What the padding of a value reads as where an op must not see it.
enum class Fill { Zero, One, NegInf, True, First };

class Rewrite {
 public:
  Rewrite(const Graph& g, std::span<const DynamicDim> marks, const Forced& forced)
      : g_(g), forced_(forced), rw_(g), dims_(g.nodes.size()) {
    std::vector<int32_t> param_node(static_cast<size_t>(g.num_params), -1);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (g.nodes[i].op == OpKind::Parameter)
        param_node.at(static_cast<size_t>(NodeAttrs(OpKind::Parameter, g.nodes[i].attrs).i<"index">())) =
            static_cast<int32_t>(i);
    marks_.resize(static_cast<size_t>(g.num_params));
    divisor_.assign(g.nodes.size(), false);
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
      Dims& d = marks_[m.param];
      d.resize(s.size());
      d[m.dim] = {symbol_of(n), 1};
    }
  }

  bool any_symbol() const { return !sizes_.empty(); }

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
    return pg;
  }

 private:
  const Graph& g_;
  const Forced& forced_;
  GraphRewriter rw_;
  std::vector<std::vector<Dims>> dims_;  // per traced node, per result
  std::vector<Dims> marks_;              // per parameter
  std::vector<bool> divisor_;            // per traced node: a scalar constant some div divides by
  std::vector<int64_t> sizes_;           // per symbol
  std::vector<ValueRef> size_param_;     // per symbol
  std::map<std::tuple<int32_t, int64_t, size_t, size_t>, ValueRef> masks_;

  int32_t symbol_of(int64_t n) {
    for (size_t s = 0; s < sizes_.size(); ++s)
      if (sizes_[s] == n) return static_cast<int32_t>(s);
    sizes_.push_back(n);
    return static_cast<int32_t>(sizes_.size() - 1);
  }
  // The symbol of size n, where a new dim of that size (a constant's, an expand's) is taken
  // to be one: sound for this trace either way.
  Dim dim_of_size(int64_t n, int32_t node, int64_t dim) const {
    if (n >= 2 && !forced_.count({node, dim}))
      for (size_t s = 0; s < sizes_.size(); ++s)
        if (sizes_[s] == n) return {static_cast<int32_t>(s), 1, node, dim};
    return {};
  }
  int64_t bucket(int32_t sym) const { return bucket_of(sizes_[sym]); }
  int64_t padded(int64_t concrete, Dim d) const { return d.dyn() ? d.k * bucket(d.sym) : concrete; }
  Shape padded_shape(const Shape& s, const Dims& d) const {
    Shape out = s;
    for (size_t i = 0; i < s.size(); ++i) out[i] = padded(s[i], d[i]);
    return out;
  }
  static std::vector<PaddedDim> padded_dims(const Dims& d) {
    std::vector<PaddedDim> out;
    for (size_t i = 0; i < d.size(); ++i)
      if (d[i].dyn()) out.push_back({static_cast<int64_t>(i), d[i].sym, d[i].k});
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
  void done(int32_t i, ValueRef v, Dims d) {
    const Node& n = g_.nodes[i];
    const Shape want = padded_shape(n.results.at(0).shape, d);
    if (out().type(v).shape != want || out().type(v).dtype != n.results[0].dtype)
      refuse(n, detail::str_cat("padded to ", ir::type_str(out().type(v)), ", not ",
                                ir::type_str({n.results[0].dtype, want})));
    rw_.set(i, 0, v);
    dims_[i] = {std::move(d)};
  }

  // valid(index along `axis`) as a b8 value of `rank` dims, every other dim 1.
  ValueRef mask(const Node& n, Dim d, size_t rank, size_t axis) {
    auto key = std::make_tuple(d.sym, d.k, rank, axis);
    if (auto it = masks_.find(key); it != masks_.end()) return it->second;
    const int64_t len = d.k * bucket(d.sym);
    ValueRef limit = size_param_[d.sym];
    if (d.k != 1) limit = emit(n, OpKind::Mul, {limit, full(n, static_cast<double>(d.k), DType::i64)}, {});
    ValueRef m = emit(n, OpKind::Lt, {emit(n, OpKind::Iota, {}, {Shape{len}, DType::i64}), limit}, {});
    Shape s(rank, 1);
    s[axis] = len;
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
    for (int64_t a : axes) fixed *= d[a].dyn() ? d[a].k : s[a];
    ValueRef c = full(n, static_cast<double>(fixed), DType::i64);
    for (int64_t a : axes)
      if (d[a].dyn()) c = emit(n, OpKind::Mul, {c, size_param_[d[a].sym]}, {});
    return emit(n, OpKind::Cast, {c}, {dtype});
  }

  // Broadcasting: the result dims of operands broadcast to a result of `rank` dims
  // (right-aligned). A dynamic dim read from a value wins over a free one; a free one that
  // meets a static dim of its size starts the rewrite again with it static.
  Dims broadcast(const Node& n, std::span<const ValueRef> operands, size_t rank) const {
    Dims r(rank);
    std::vector<int> stat(rank, 0);
    for (ValueRef v : operands) {
      const Shape& s = shape(v);
      const Dims& d = dims(v);
      for (size_t e = 0; e < s.size(); ++e) {
        const size_t at = rank - s.size() + e;
        if (s[e] == 1) continue;
        if (!d[e].dyn()) {
          stat[at] = 1;
          continue;
        }
        Dim& to = r[at];
        if (to.dyn() && to != d[e]) refuse(n, "two different dynamic sizes meet");
        if (!to.dyn() || (to.free() && !d[e].free())) to = d[e];
      }
    }
    for (size_t at = 0; at < rank; ++at)
      if (stat[at] && r[at].dyn()) meets_static(n, operands, rank, at);
    return r;
  }
  // A static dim meets a dynamic one at result dim `at`: a free one is retried static.
  [[noreturn]] void meets_static(const Node& n, std::span<const ValueRef> operands, size_t rank, size_t at) const {
    for (ValueRef v : operands) {
      const Shape& s = shape(v);
      if (at + s.size() < rank) continue;
      const Dim& d = dims(v)[at + s.size() - rank];
      if (d.free()) {
        throw Retry{{d.origin, d.origin_dim}};
      }
    }
    refuse(n, "a dim that is not dynamic meets a dynamic one");
  }

  // A dim an op cannot take padded: a free one is retried static.
  static void must_be_static(const Node& n, const Dim& d, const char* what) {
    if (!d.dyn()) return;
    if (d.free()) throw Retry{{d.origin, d.origin_dim}};
    refuse(n, what);
  }
  static void all_static(const Node& n, const Dims& d, const char* what) {
    for (const Dim& x : d) must_be_static(n, x, what);
  }
  // Two dims that must be padded alike.
  static void same(const Node& n, const Dim& a, const Dim& b) {
    if (a == b) return;
    if (a.free() && !b.dyn()) throw Retry{{a.origin, a.origin_dim}};
    if (b.free() && !a.dyn()) throw Retry{{b.origin, b.origin_dim}};
    refuse(n, "operands padded differently");
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
      return;
    }
    if (ir::has_flag(n.op, ir::kElementwise) || n.op == OpKind::StopGradient) {
      Dims d = broadcast(n, n.operands, rank);
      done(i, emit(n, n.op, mapped(n), n.attrs), std::move(d));
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
        for (size_t e = 0; e < rank; ++e) d[e] = dim_of_size(n.results[0].shape[e], i, static_cast<int64_t>(e));
        done(i, emit(n, n.op, {}, {a.f<"value">(), padded_shape(n.results[0].shape, d), a.dtype<"dtype">()}), d);
        return;
      }
      case OpKind::Iota: {
        Dims d{dim_of_size(n.results[0].shape[0], i, 0)};
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
            d[e] = dim_of_size(s[e], i, static_cast<int64_t>(e));
            break;
          }
        done(i, emit(n, n.op, mapped(n), {a.i<"distribution">(), padded_shape(s, d), a.dtype<"dtype">()}), d);
        return;
      }
      case OpKind::Sum:
      case OpKind::Mean:
      case OpKind::Amax:
      case OpKind::Amin:
      case OpKind::Prod:
      case OpKind::Var:
      case OpKind::Std:
      case OpKind::Norm:
        reduction(i);
        return;
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
          else d[e] = dim_of_size(to[e], i, static_cast<int64_t>(e));
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
          } else if (starts[e] == 0 && steps[e] == 1 && ends[e] < s[e]) {
            // The first n of a longer static dim (a causal mask's rows): as long as the bucket fits.
            const Dim k = dim_of_size(ends[e], i, static_cast<int64_t>(e));
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
        if (n.op == OpKind::ScatterAdd) {
          same(n, dims(idx), dims(src));
          vs = fill_all(n, vs, dims(src), Fill::Zero);
        } else {
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
    switch (n.op) {
      case OpKind::Sum:
      case OpKind::Norm: done(i, emit(n, n.op, {fill_axes(v, Fill::Zero)}, n.attrs), d); return;
      case OpKind::Prod: done(i, emit(n, n.op, {fill_axes(v, Fill::One)}, n.attrs), d); return;
      case OpKind::Amax:
      case OpKind::Amin: done(i, emit(n, n.op, {fill_axes(v, Fill::First)}, n.attrs), d); return;
      default: break;
    }
    // Mean, var, std: over the count the sizes give, in at least f32 (a 16-bit result is
    // rounded once, as its kernel does).
    const DType dtype = n.results[0].dtype;
    const DType wide = dtype == DType::bf16 || dtype == DType::f16 ? DType::f32 : dtype;
    if (wide != dtype) v = emit(n, OpKind::Cast, {v}, {wide});
    const ValueRef c = count(n, shape(x), dx, axes, wide);
    const bool keep_mean = n.op != OpKind::Mean || keepdim;
    ValueRef mean = emit(n, OpKind::Div, {emit(n, OpKind::Sum, {fill_axes(v, Fill::Zero)}, {axes, keep_mean}), c}, {});
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
    Dims d(rank);
    auto batch = [&](const Shape& s, const Dims& ds) {
      for (size_t e = 0; e + 2 < s.size(); ++e) {
        Dim& to = d[rank - s.size() + e];
        if (ds[e].dyn()) {
          if (to.dyn() && to != ds[e]) refuse(n, "two different dynamic sizes meet");
          to = ds[e];
        }
      }
    };
    batch(sx, dx);
    batch(sy, dy);
    for (auto [s, ds] : {std::pair{&sx, &dx}, std::pair{&sy, &dy}})
      for (size_t e = 0; e + 2 < s->size(); ++e)
        if ((*s)[e] != 1) same(n, (*ds)[e], d[rank - s->size() + e]);
    same(n, dx[sx.size() - 1], dy[sy.size() - 2]);
    d[rank - 2] = dx[sx.size() - 2];
    d[rank - 1] = dy[sy.size() - 1];
    const ValueRef vx = fill(n, map(x), dx, sx.size() - 1, Fill::Zero);
    const ValueRef vy = fill(n, map(y), dy, sy.size() - 2, Fill::Zero);
    done(i, emit(n, n.op, {vx, vy}, n.attrs), d);
  }

  // Reshape: dims grouped into runs of equal element counts. A run holding a dynamic dim keeps
  // its padding at the end only where that dim is the run's outermost (not 1) on both sides.
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
      Dim dyn;
      size_t first = a0;
      while (first < a && s[first] == 1) ++first;
      for (size_t e = a0; e < a; ++e)
        if (dx[e].dyn()) {
          if (e != first) must_be_static(n, dx[e], "a dynamic dim is merged under another dim");
          dyn = dx[e];
        }
      if (!dyn.dyn()) continue;
      size_t outer = b0;
      while (outer < b && to[outer] == 1) ++outer;
      if (outer == b) must_be_static(n, dyn, "a dynamic dim becomes size 1");
      int64_t inner = 1;
      for (size_t e = outer + 1; e < b; ++e) inner *= to[e];
      const int64_t n_sym = sizes_[dyn.sym];
      if (to[outer] % n_sym != 0 || to[outer] / n_sym * inner != pa / n_sym)
        must_be_static(n, dyn, "a dynamic dim is split under another dim");
      d[outer] = {dyn.sym, to[outer] / n_sym};
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
    if (n.op == OpKind::Conv2dBackwardWeight) {
      ops[0] = fill(n, ops[0], dims(n.operands[0]), 0, Fill::Zero);
      ops[1] = fill(n, ops[1], dims(n.operands[1]), 0, Fill::Zero);
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
  for (;;) {
    Rewrite r(g, marks, forced);
    if (!r.any_symbol()) {
      if (why) *why = "no dynamic dim is of size 2 or more";
      return std::nullopt;
    }
    try {
      return r.run();
    } catch (const Refused& e) {
      if (why) *why = e.why;
      return std::nullopt;
    } catch (const Retry& e) {
      // Each retry makes one more free dim static: at most as many as there are.
      LAZYRT_ASSERT(forced.insert(e.origin).second, "a free dim retried twice");
    }
  }
}

}  // namespace lazyrt::compile
