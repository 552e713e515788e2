// Generated kernels against the fused interpreter: every elementwise op of the table, every
// cast, where, on every dtype the type rules accept, must give the interpreter's bits (NaN
// against NaN, whatever its payload), over random values and the special ones (signed zeros,
// infinities, NaN, subnormals, the integer extremes), with contiguous and broadcast operands,
// and a result written over its own operand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include "scalar/elementwise_fns.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/jit/jit.h"
#include "support/elementwise_ops.h"
#include "support/graphs.h"
#include "support/run_graph.h"
#include "lazyrt/metrics.h"

namespace lazyrt {
namespace {

using ir::OpKind;
using testing::attr_variants;
using testing::table_ops;

constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::b8};
constexpr int64_t kN = 1000;  // not a multiple of the generated loop's block: a partial block

// n elements of dtype d: the special values first, then random ones.
std::vector<char> values(DType d, int64_t n, std::mt19937_64& rng) {
  std::vector<char> out(static_cast<size_t>(n) * dtype_size(d));
  std::normal_distribution<double> normal(0.0, 3.0);
  std::uniform_int_distribution<int> pick(0, 9);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> special_f = {0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.5, inf, -inf, nan, 1e-40, -1e-42, 1e30,
                                         -1e30, 88.7, -104.5, 20.0, -20.0, 0.625, 1e-5, 4.0, 700.0};
  const std::vector<double> special_i = {0, 1, -1, 2, -2, 7, 31, 63, 100, -100, 2147483647.0, -2147483648.0};
  visit_dtype(d, [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(out.data());
    for (int64_t i = 0; i < n; ++i) {
      double v;
      if (is_floating(d)) v = i < static_cast<int64_t>(special_f.size()) ? special_f[i] : normal(rng) * (pick(rng) == 0 ? 50 : 1);
      else if (d == DType::b8) v = pick(rng) < 5;
      else v = i < static_cast<int64_t>(special_i.size()) ? special_i[i] : std::round(normal(rng) * 10);
      if constexpr (std::is_same_v<T, int64_t>) {
        if (i == 12) { p[i] = std::numeric_limits<int64_t>::max(); continue; }
        if (i == 13) { p[i] = std::numeric_limits<int64_t>::min(); continue; }
      }
      p[i] = convert<T>(v);
    }
  });
  return out;
}

// Element i of two result buffers: the same bits, or NaN in both.
bool same_element(DType d, const char* a, const char* b, int64_t i) {
  return visit_dtype(d, [&](auto tag) {
    using T = decltype(tag);
    const size_t s = sizeof(T);
    if (std::memcmp(a + i * s, b + i * s, s) == 0) return true;
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      T x, y;
      std::memcpy(&x, a + i * s, s);
      std::memcpy(&y, b + i * s, s);
      const auto fx = convert<compute_t<T>>(x), fy = convert<compute_t<T>>(y);
      return fx != fx && fy != fy;
    }
    return false;
  });
}

struct Case {
  ir::Graph region;
  std::vector<ir::TensorType> inputs, outputs;
  std::string name;
};

// Runs the interpreter and the generated loop on the same operands; returns the mismatches as
// text (empty: agreement). With `in_place`, result 0 is written over operand 0's buffer.
std::string compare(const Case& c, std::mt19937_64& rng, bool in_place = false) {
  std::vector<std::vector<char>> in;
  for (const auto& t : c.inputs) {
    in.push_back(values(t.dtype, t.numel(), rng));
    // Each operand's special values meet the others' at other positions.
    const size_t shift = (in.size() - 1) * 5 * dtype_size(t.dtype);
    if (shift < in.back().size()) std::rotate(in.back().begin(), in.back().begin() + static_cast<std::ptrdiff_t>(shift), in.back().end());
  }
  auto module = jit::new_module();
  if (!module) return "generation is off";
  kernels::Kernel interp = kernels::make_fused(c.region, c.inputs, c.outputs, testing::plain_fusion(c.outputs));
  kernels::Kernel gen = kernels::make_fused(c.region, c.inputs, c.outputs, testing::plain_fusion(c.outputs), module);
  if (module->empty()) return "the generator did not take the region";
  jit::compile_now(*module);
  if (!module->fn(0)) return "no generated loop";

  auto run = [&](kernels::Kernel& k, std::vector<std::vector<char>>& ins, std::vector<std::vector<char>>& outs) {
    std::vector<const void*> ip;
    std::vector<void*> op;
    for (auto& b : ins) ip.push_back(b.data());
    for (size_t j = 0; j < c.outputs.size(); ++j) {
      if (in_place && j == 0) {
        op.push_back(ins[0].data());
      } else {
        outs.emplace_back(c.outputs[j].bytes());
        op.push_back(outs.back().data());
      }
    }
    k.run(ip.data(), op.data());
  };
  auto in_a = in, in_b = in;
  std::vector<std::vector<char>> out_a, out_b;
  out_a.reserve(c.outputs.size());
  out_b.reserve(c.outputs.size());
  run(interp, in_a, out_a);
  run(gen, in_b, out_b);
  std::string bad;
  for (size_t j = 0; j < c.outputs.size(); ++j) {
    const char* a = in_place && j == 0 ? in_a[0].data() : out_a[j - (in_place ? 1 : 0)].data();
    const char* b = in_place && j == 0 ? in_b[0].data() : out_b[j - (in_place ? 1 : 0)].data();
    for (int64_t i = 0; i < c.outputs[j].numel(); ++i) {
      if (same_element(c.outputs[j].dtype, a, b, i)) continue;
      bad += c.name + ": result " + std::to_string(j) + " element " + std::to_string(i) + " differs\n";
      break;
    }
  }
  return bad;
}

int arity(OpKind op) { return ir::op_info(op).operands; }

// One op over operands of dtype d; operand k > 0 broadcast from shape [1] when `broadcast`.
std::optional<Case> single_op(OpKind op, const ir::Attrs& attrs, DType d, bool broadcast) {
  Case c;
  std::vector<ir::ValueRef> operands;
  const int n = arity(op);
  for (int k = 0; k < n; ++k) {
    ir::TensorType t{d, {broadcast && k > 0 ? 1 : kN}};
    c.inputs.push_back(t);
    operands.push_back(c.region.add_parameter(t));
  }
  try {
    c.region.outputs.push_back(c.region.add(op, operands, attrs));
  } catch (const Error&) {
    return std::nullopt;  // the type rules reject the op on this dtype
  }
  c.outputs.push_back(c.region.type(c.region.outputs[0]));
  c.name = std::string(ir::op_name(op)) + " on " + dtype_name(d) + (broadcast ? " (broadcast)" : "");
  return c;
}

// Generation on for the test, whatever LAZYRT_JIT says.
struct GenerationOn : testing::JitMode {
  GenerationOn() : JitMode(jit::Mode::Tiered) {}
};

TEST(Generated, EveryElementwiseOpOnEveryDtypeGivesTheInterpretersBits) {
  GenerationOn on;
  std::mt19937_64 rng(7);
  int ran = 0;
  std::string bad;
  for (OpKind op : table_ops())
    for (const ir::Attrs& attrs : attr_variants(op))
      for (DType d : kDTypes)
        for (bool broadcast : {false, true}) {
          if (broadcast && arity(op) == 1) continue;
          auto c = single_op(op, attrs, d, broadcast);
          if (!c) continue;
          bad += compare(*c, rng);
          ++ran;
        }
  EXPECT_EQ(bad, "");
  // 41 ops of the table; most on several dtypes.
  EXPECT_GT(ran, 250);
}

TEST(Generated, EveryCastAndWhereGivesTheInterpretersBits) {
  GenerationOn on;
  std::mt19937_64 rng(11);
  std::string bad;
  for (DType from : kDTypes)
    for (DType to : kDTypes) {
      Case c;
      ir::TensorType t{from, {kN}};
      c.inputs.push_back(t);
      auto p = c.region.add_parameter(t);
      c.region.outputs.push_back(c.region.add(OpKind::Cast, {p}, {to}));
      c.outputs.push_back(c.region.type(c.region.outputs[0]));
      c.name = std::string("cast ") + dtype_name(from) + " to " + dtype_name(to);
      bad += compare(c, rng);
    }
  for (DType d : kDTypes) {
    Case c;
    c.inputs = {{DType::b8, {kN}}, {d, {kN}}, {d, {1}}};
    std::vector<ir::ValueRef> ps;
    for (const auto& t : c.inputs) ps.push_back(c.region.add_parameter(t));
    c.region.outputs.push_back(c.region.add(OpKind::Where, ps));
    c.outputs.push_back(c.region.type(c.region.outputs[0]));
    c.name = std::string("where on ") + dtype_name(d);
    bad += compare(c, rng);
  }
  EXPECT_EQ(bad, "");
}

// An AdamW-like chain with constants and two results, one written over its operand, in f32 and
// bf16.
TEST(Generated, ChainsWithConstantsAndResultsInPlaceGiveTheInterpretersBits) {
  GenerationOn on;
  std::mt19937_64 rng(3);
  for (DType d : {DType::f32, DType::bf16, DType::f64}) {
    Case c;
    c.inputs = {{d, {kN}}, {d, {kN}}, {d, {kN}}};
    auto p = c.region.add_parameter(c.inputs[0]);
    auto g = c.region.add_parameter(c.inputs[1]);
    auto m = c.region.add_parameter(c.inputs[2]);
    auto b1 = c.region.add_full(0.9, {}, d);
    auto lr = c.region.add_full(1e-3, {}, d);
    auto m2 = c.region.add(OpKind::Add, {c.region.add(OpKind::Mul, {m, b1}), c.region.add(OpKind::Mul, {g, c.region.add_full(0.1, {}, d)})});
    auto denom = c.region.add(OpKind::Add, {c.region.add(OpKind::Sqrt, {c.region.add(OpKind::Mul, {m2, m2})}), c.region.add_full(1e-8, {}, d)});
    auto step = c.region.add(OpKind::Mul, {lr, c.region.add(OpKind::Div, {m2, denom})});
    auto p2 = c.region.add(OpKind::Sub, {p, c.region.add(OpKind::Tanh, {step})});
    c.region.outputs = {p2, m2};
    for (auto v : c.region.outputs) c.outputs.push_back(c.region.type(v));
    c.name = std::string("adamw-like chain on ") + dtype_name(d);
    EXPECT_EQ(compare(c, rng, /*in_place=*/false), "");
    EXPECT_EQ(compare(c, rng, /*in_place=*/true), "");
  }
}

}  // namespace
}  // namespace lazyrt
