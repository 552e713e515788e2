#include "ir/serialize.h"

#include <cstring>

#include "util/bytes.h"
#include "util/check.h"

namespace lazyrt::ir {
namespace {

using lazyrt::detail::ByteReader;
using lazyrt::detail::ByteWriter;
using lazyrt::detail::str_cat;

// Smallest encodings, used to bound counts by the bytes left.
constexpr size_t kMinNodeBytes = 1 + 1 + 4 + 4 + 4 + 4;  // name of one char, four counts
constexpr size_t kMinGraphBytes = 8 + 4 + 4;
constexpr size_t kMinTypeBytes = 1 + 4;
constexpr size_t kMinAttrBytes = 1 + 1;
constexpr size_t kValueRefBytes = 4 + 4;

// Element count of a shape, or -1 when a dim is negative or the count exceeds kMaxElements.
int64_t checked_elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > kMaxElements / d) return -1;
    n *= d;
  }
  return n;
}

// ---- writing ---------------------------------------------------------------------------

void write_value_ref(ByteWriter& w, ValueRef v) {
  w.i32(v.node);
  w.i32(v.index);
}

void write_type(ByteWriter& w, const TensorType& t) {
  LAZYRT_CHECK(checked_elements(t.shape) >= 0, "serialize_graph: tensor type ", type_str(t),
               " has a negative dim or more than ", kMaxElements, " elements");
  w.u8(static_cast<uint8_t>(t.dtype));
  w.u32(static_cast<uint32_t>(t.shape.size()));
  for (int64_t d : t.shape) w.i64(d);
}

void write_attr(ByteWriter& w, const AttrValue& a) {
  if (const auto* i = std::get_if<int64_t>(&a)) {
    w.u8(static_cast<uint8_t>(AttrKind::Int));
    w.i64(*i);
  } else if (const auto* f = std::get_if<double>(&a)) {
    w.u8(static_cast<uint8_t>(AttrKind::Float));
    w.f64(*f);
  } else if (const auto* b = std::get_if<bool>(&a)) {
    w.u8(static_cast<uint8_t>(AttrKind::Bool));
    w.u8(*b ? 1 : 0);
  } else if (const auto* d = std::get_if<DType>(&a)) {
    w.u8(static_cast<uint8_t>(AttrKind::DType));
    w.u8(static_cast<uint8_t>(*d));
  } else {
    const auto& xs = std::get<std::vector<int64_t>>(a);
    w.u8(static_cast<uint8_t>(AttrKind::Ints));
    w.u32(static_cast<uint32_t>(xs.size()));
    for (int64_t x : xs) w.i64(x);
  }
}

void write_graph(ByteWriter& w, const Graph& g, int depth) {
  LAZYRT_CHECK(depth < kMaxRegionDepth, "serialize_graph: regions nested deeper than ",
               kMaxRegionDepth);
  LAZYRT_CHECK(g.num_params >= 0 && g.num_params <= kMaxParams, "serialize_graph: ",
               g.num_params, " parameters, the format allows ", kMaxParams);
  w.i64(g.num_params);
  w.u32(static_cast<uint32_t>(g.nodes.size()));
  for (const Node& n : g.nodes) {
    w.short_string(op_name(n.op));
    w.u32(static_cast<uint32_t>(n.operands.size()));
    for (ValueRef v : n.operands) write_value_ref(w, v);
    w.u32(static_cast<uint32_t>(n.attrs.values.size()));
    for (const AttrValue& a : n.attrs.values) write_attr(w, a);
    w.u32(static_cast<uint32_t>(n.results.size()));
    for (const TensorType& t : n.results) write_type(w, t);
    w.u32(static_cast<uint32_t>(n.regions.size()));
    for (const auto& r : n.regions) write_graph(w, *r, depth + 1);
  }
  w.u32(static_cast<uint32_t>(g.outputs.size()));
  for (ValueRef v : g.outputs) write_value_ref(w, v);
}

// ---- reading ---------------------------------------------------------------------------

DType read_dtype(ByteReader& r) {
  const uint8_t d = r.u8();
  if (d >= kNumDTypes) r.fail(str_cat("unknown dtype ", int{d}));
  return static_cast<DType>(d);
}

ValueRef read_value_ref(ByteReader& r) {
  ValueRef v;
  v.node = r.i32();
  v.index = r.i32();
  return v;  // range checked by verify
}

TensorType read_type(ByteReader& r) {
  TensorType t;
  t.dtype = read_dtype(r);
  const size_t rank = r.count(8, "dims");
  t.shape.resize(rank);
  for (int64_t& d : t.shape) d = r.i64();
  if (checked_elements(t.shape) < 0)
    r.fail(str_cat("tensor type ", type_str(t), " has a negative dim or more than ",
                   kMaxElements, " elements"));
  return t;
}

AttrValue read_attr(ByteReader& r) {
  const uint8_t kind = r.u8();
  switch (kind) {
    case static_cast<uint8_t>(AttrKind::Int): return r.i64();
    case static_cast<uint8_t>(AttrKind::Float): return r.f64();
    case static_cast<uint8_t>(AttrKind::Bool): {
      const uint8_t b = r.u8();
      if (b > 1) r.fail(str_cat("bool attribute holds ", int{b}));
      return b == 1;
    }
    case static_cast<uint8_t>(AttrKind::DType): return read_dtype(r);
    case static_cast<uint8_t>(AttrKind::Ints): {
      std::vector<int64_t> xs(r.count(8, "ints"));
      for (int64_t& x : xs) x = r.i64();
      return xs;
    }
    default: r.fail(str_cat("unknown attribute kind ", int{kind}));
  }
}

Graph read_graph(ByteReader& r, int depth) {
  if (depth >= kMaxRegionDepth) r.fail(str_cat("regions nested deeper than ", kMaxRegionDepth));
  Graph g;
  g.num_params = r.i64();
  if (g.num_params < 0 || g.num_params > kMaxParams)
    r.fail(str_cat(g.num_params, " parameters, the format allows 0 to ", kMaxParams));
  g.nodes.resize(r.count(kMinNodeBytes, "nodes"));
  for (Node& n : g.nodes) {
    const std::string_view name = r.short_string();
    if (!op_from_name(name, &n.op)) r.fail(str_cat("unknown op '", name, "'"));
    n.operands.resize(r.count(kValueRefBytes, "operands"));
    for (ValueRef& v : n.operands) v = read_value_ref(r);
    n.attrs.values.resize(r.count(kMinAttrBytes, "attributes"));
    for (AttrValue& a : n.attrs.values) a = read_attr(r);
    n.results.resize(r.count(kMinTypeBytes, "results"));
    for (TensorType& t : n.results) t = read_type(r);
    const size_t regions = r.count(kMinGraphBytes, "regions");
    for (size_t k = 0; k < regions; ++k)
      n.regions.push_back(std::make_shared<const Graph>(read_graph(r, depth + 1)));
  }
  g.outputs.resize(r.count(kValueRefBytes, "outputs"));
  for (ValueRef& v : g.outputs) v = read_value_ref(r);
  return g;
}

bool same_attr(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const auto* x = std::get_if<double>(&a)) {
    const double y = std::get<double>(b);
    return std::memcmp(x, &y, sizeof y) == 0;
  }
  return a == b;
}

}  // namespace

std::string serialize_graph(const Graph& g) {
  ByteWriter w;
  w.u32(kGraphFormatVersion);
  write_graph(w, g, 0);
  return w.take();
}

Graph deserialize_graph(std::string_view bytes) {
  ByteReader r(bytes, "graph");
  const uint32_t version = r.u32();
  if (version != kGraphFormatVersion)
    r.fail(str_cat("format version ", version, ", this build reads version ", kGraphFormatVersion));
  Graph g = read_graph(r, 0);
  r.expect_end();
  try {
    verify(g);
  } catch (const Error& e) {
    throw Error(str_cat("graph: parsed, but invalid: ", e.what()));
  }
  return g;
}

bool same_graph(const Graph& a, const Graph& b) {
  if (a.num_params != b.num_params || a.outputs != b.outputs || a.nodes.size() != b.nodes.size())
    return false;
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& x = a.nodes[i];
    const Node& y = b.nodes[i];
    if (x.op != y.op || x.operands != y.operands || x.results != y.results ||
        x.attrs.values.size() != y.attrs.values.size() || x.regions.size() != y.regions.size())
      return false;
    for (size_t k = 0; k < x.attrs.values.size(); ++k)
      if (!same_attr(x.attrs.values[k], y.attrs.values[k])) return false;
    for (size_t k = 0; k < x.regions.size(); ++k)
      if (!same_graph(*x.regions[k], *y.regions[k])) return false;
  }
  return true;
}

}  // namespace lazyrt::ir
