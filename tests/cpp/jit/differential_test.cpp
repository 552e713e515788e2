// Generated kernels against the interpreter on seeded random programs, compiled whole: the
// fusion pass groups their ops (elementwise regions, and fused rows where a reduction over
// trailing dims meets them), the memory plan places the results (over operands that die
// there, over parameters offered as donations: the generated loop's blocked path), lowering
// lays out each region's operands (broadcast along any dims, so runs of every length, one per
// row or merged across rows), and each program runs once with generation off and once with
// every region the generator takes compiled before the first run (jit::Mode::Sync). Every
// result must be the same bits, NaN payloads aside. Programs mix every op of the elementwise
// table on f32, f64, bf16 and f16 with integer and boolean values, constants, casts,
// reductions with kept dims, permuted parameters, flips and expands, over shapes of one to
// four dims whose sizes straddle the vector widths. A failing program is shrunk (outputs and
// steps dropped while it still fails) and printed with its compiled graph and its seed.
//
// ctest runs programs from seeds 1..120; LAZYRT_JIT_FUZZ_PROGRAMS=N and LAZYRT_JIT_FUZZ_SEED=S run
// N from seed S (make fuzz-jit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "compile/compile.h"
#include "backend/cpu/jit/jit.h"
#include "lazyrt/metrics.h"
#include "support/elementwise_ops.h"
#include "support/env.h"
#include "support/run_graph.h"

namespace lazyrt::compile {
namespace {

using ir::Graph;
using ir::OpKind;
using ir::TensorType;
using ir::ValueRef;

// A program as steps over earlier values, which the shrinker can cut.
struct Recipe {
  struct Param {
    TensorType type;            // as the program reads it
    std::vector<int64_t> perm;  // non-empty: stored with its dims in this order, read through a permute
  };
  struct Step {
    OpKind op;
    std::vector<int> operands;  // values: the parameters, then the steps
    ir::Attrs attrs;
  };
  std::vector<Param> params;
  std::vector<Step> steps;
  std::vector<int> outputs;
  std::vector<int32_t> donations;  // per output: the parameter it is offered, or -1
};

// The graph of a recipe, and each value's place in it; throws lazyrt::Error where a type rule
// rejects a step.
struct Built {
  Graph g;
  std::vector<ValueRef> values;
};
ValueRef add_step(Built& b, const Recipe::Step& s) {
  std::vector<ValueRef> ops;
  for (int v : s.operands) ops.push_back(b.values.at(static_cast<size_t>(v)));
  return b.g.add(s.op, std::move(ops), s.attrs);
}
Built build(const Recipe& r) {
  Built b;
  for (const Recipe::Param& p : r.params) {
    if (p.perm.empty()) {
      b.values.push_back(b.g.add_parameter(p.type));
      continue;
    }
    Shape stored;
    std::vector<int64_t> inverse(p.perm.size());
    for (size_t d = 0; d < p.perm.size(); ++d) {
      stored.push_back(p.type.shape[static_cast<size_t>(p.perm[d])]);
      inverse[static_cast<size_t>(p.perm[d])] = static_cast<int64_t>(d);
    }
    const ValueRef stored_param = b.g.add_parameter({p.type.dtype, stored});
    b.values.push_back(b.g.add(OpKind::Permute, {stored_param}, {inverse}));
  }
  for (const Recipe::Step& s : r.steps) b.values.push_back(add_step(b, s));
  for (int v : r.outputs) b.g.outputs.push_back(b.values.at(static_cast<size_t>(v)));
  return b;
}

constexpr DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

// Appends steps to a recipe where the type rules take them (each returns its value, or -1).
struct Steps {
  Recipe& r;
  Built b;
  explicit Steps(Recipe& recipe) : r(recipe), b(build(recipe)) {}
  TensorType type_of(int v) const { return b.g.type(b.values[static_cast<size_t>(v)]); }
  int count() const { return static_cast<int>(b.values.size()); }
  // An operand: the newest value half the time (chains, which fuse), else any.
  int pick(std::mt19937& rng) const { return static_cast<int>(rng() % 2 ? b.values.size() - 1 : rng() % b.values.size()); }
  int add(OpKind op, std::vector<int> operands, ir::Attrs attrs = {}) {
    Recipe::Step s{op, std::move(operands), std::move(attrs)};
    try {
      b.values.push_back(add_step(b, s));
    } catch (const Error&) {
      return -1;
    }
    r.steps.push_back(std::move(s));
    return count() - 1;
  }
  // v as dtype d: v itself, or a cast of it.
  int as(int v, DType d) { return type_of(v).dtype == d ? v : add(OpKind::Cast, {v}, {d}); }
  // A random op of the elementwise table on a and values picked (cast to a's dtype); where's
  // condition a comparison of a with another value.
  int table_op(std::mt19937& rng, int a) {
    static const std::vector<OpKind> table = testing::table_ops();
    const OpKind op = table[rng() % table.size()];
    const std::vector<ir::Attrs> variants = testing::attr_variants(op);
    std::vector<int> operands{a};
    for (int k = 1; k < ir::op_info(op).operands; ++k) operands.push_back(as(pick(rng), type_of(a).dtype));
    if (op == OpKind::Where) {
      const int c = add(rng() % 2 ? OpKind::Gt : OpKind::Le, {a, operands[1]});
      if (c < 0) return -1;
      operands = {c, operands[1], operands[2]};
    }
    if (std::find(operands.begin(), operands.end(), -1) != operands.end()) return -1;
    return add(op, operands, variants[rng() % variants.size()]);
  }
};

Recipe generate(std::mt19937& rng) {
  const int64_t sizes[] = {1, 2, 3, 5, 7, 16, 17, 64, 100, 257};
  Shape target;
  const int rank = 1 + static_cast<int>(rng() % 4);
  while (static_cast<int>(target.size()) < rank) {
    const int64_t s = sizes[rng() % std::size(sizes)];
    if (shape_numel(target) * s <= (int64_t{1} << 14)) target.push_back(s);
  }
  const DType real = kFloats[rng() % std::size(kFloats)];
  const DType others[] = {DType::i32, DType::i64, DType::b8, kFloats[rng() % std::size(kFloats)]};

  Recipe r;
  const int num_params = 2 + static_cast<int>(rng() % 3);
  for (int k = 0; k < num_params; ++k) {
    Recipe::Param p;
    p.type.dtype = rng() % 8 < 5 ? real : others[rng() % std::size(others)];
    // Each dim of the target kept, or 1 (broadcast); some parameters lack the leading dims.
    const size_t from = rng() % 4 == 0 ? rng() % target.size() : 0;
    for (size_t d = from; d < target.size(); ++d) p.type.shape.push_back(rng() % 4 ? target[d] : 1);
    if (p.type.shape.size() >= 2 && rng() % 4 == 0) {
      p.perm.resize(p.type.shape.size());
      std::iota(p.perm.begin(), p.perm.end(), 0);
      std::shuffle(p.perm.begin(), p.perm.end(), rng);
    }
    r.params.push_back(std::move(p));
  }

  Steps st(r);
  const int num_steps = 6 + static_cast<int>(rng() % 19);
  for (int step = 0; step < num_steps; ++step) {
    const int kind = static_cast<int>(rng() % 12);
    const int a = st.pick(rng);
    const TensorType ta = st.type_of(a);
    if (kind <= 6) {
      st.table_op(rng, a);
    } else if (kind == 7) {
      const DType to[] = {real, others[3], DType::i32, DType::b8};
      st.add(OpKind::Cast, {a}, {to[rng() % std::size(to)]});
    } else if (kind == 8 && !ta.shape.empty()) {
      // A reduction over trailing or leading dims, dims kept (a fused row or a reduction kernel).
      const OpKind ops[] = {OpKind::Sum, OpKind::Amax, OpKind::Mean};
      const int64_t d = static_cast<int64_t>(rng() % ta.shape.size());
      std::vector<int64_t> dims{d};
      if (d + 1 < static_cast<int64_t>(ta.shape.size()) && rng() % 2) dims.push_back(d + 1);
      st.add(ops[rng() % std::size(ops)], {a}, {dims, true});
    } else if (kind == 9 && !ta.shape.empty()) {
      st.add(OpKind::Flip, {a}, {std::vector<int64_t>{static_cast<int64_t>(rng() % ta.shape.size())}});
    } else if (kind == 10) {
      st.add(OpKind::Expand, {a}, {target});
    } else {
      // With a constant of a's dtype, on either side.
      const double values[] = {0.5, -2.0, 3.0, 1e-3, 100.0, 0.1};
      const OpKind ops[] = {OpKind::Add, OpKind::Mul, OpKind::Sub, OpKind::Div, OpKind::Maximum, OpKind::Pow};
      const int c = st.add(OpKind::Full, {}, {values[rng() % std::size(values)], Shape{}, ta.dtype});
      if (c < 0) continue;
      const bool left = rng() % 2;
      st.add(ops[rng() % std::size(ops)], {left ? c : a, left ? a : c});
    }
  }
  if (r.steps.empty()) st.add(OpKind::Neg, {static_cast<int>(rng() % r.params.size())});
  if (r.steps.empty()) st.add(OpKind::LogicalNot, {0});

  // Outputs: the last step and two more; some offered a parameter of their type to write over.
  const int first_step = static_cast<int>(r.params.size());
  const int last = st.count() - 1;
  r.outputs.push_back(last);
  for (int k = 0; k < 2; ++k) {
    const int v = first_step + static_cast<int>(rng() % r.steps.size());
    if (std::find(r.outputs.begin(), r.outputs.end(), v) == r.outputs.end()) r.outputs.push_back(v);
  }
  std::vector<bool> offered(r.params.size(), false);
  for (int v : r.outputs) {
    int32_t donate = -1;
    for (size_t p = 0; p < r.params.size() && donate < 0; ++p)
      if (!offered[p] && r.params[p].perm.empty() && r.params[p].type == st.type_of(v) && rng() % 2) {
        donate = static_cast<int32_t>(p);
        offered[p] = true;
      }
    r.donations.push_back(donate);
  }
  return r;
}

struct Outcome {
  std::string differs;  // empty: every result the same bits
  int fusions = 0;      // fusion nodes of the compiled graph
  int donated = 0;      // outputs written over their offered parameters
};

// Runs the recipe with generation off and on, on inputs from `input_seed`.
Outcome run_both(const Recipe& r, uint32_t input_seed) {
  Outcome o;
  Graph g;
  try {
    g = build(r).g;
  } catch (const Error&) {
    o.differs = "";  // a shrunk recipe the type rules reject: not this failure
    return o;
  }
  const backend::Backend& cpu = backend::get("cpu");
  std::mt19937 rng(input_seed);
  const auto in = testing::random_inputs(g, rng);
  std::shared_ptr<runtime::Executable> off, on;
  {
    testing::JitMode m(jit::Mode::Off);
    off = compile(g, r.donations, cpu);
  }
  {
    testing::JitMode m(jit::Mode::Sync);
    on = compile(g, r.donations, cpu);
  }
  for (const auto& n : on->graph().nodes) o.fusions += n.op == OpKind::Fusion;
  for (size_t k = 0; k < r.donations.size(); ++k) o.donated += r.donations[k] >= 0 && on->donation_accepted(k);
  const auto want = testing::run_graph(*off, in, r.donations), got = testing::run_graph(*on, in, r.donations);
  for (size_t k = 0; k < want.size(); ++k) {
    const int64_t bad = testing::mismatches(on->output_types()[k].dtype, got[k], want[k]);
    if (bad) {
      o.differs = "output " + std::to_string(k) + ": " + std::to_string(bad) + " of " +
                  std::to_string(on->output_types()[k].numel()) + " elements differ";
      return o;
    }
  }
  return o;
}

// The recipe without step i: later reads of its value read an earlier value of the same type
// instead (its first such operand, else any); nullopt where it is read and there is none.
std::optional<Recipe> without_step(const Recipe& r, size_t i) {
  const Built b = build(r);
  const int v = static_cast<int>(r.params.size() + i);
  bool read = std::find(r.outputs.begin(), r.outputs.end(), v) != r.outputs.end();
  for (const Recipe::Step& s : r.steps) read |= std::find(s.operands.begin(), s.operands.end(), v) != s.operands.end();
  const TensorType t = b.g.type(b.values[static_cast<size_t>(v)]);
  int with = -1;
  for (int u : r.steps[i].operands)
    if (with < 0 && b.g.type(b.values[static_cast<size_t>(u)]) == t) with = u;
  for (int u = 0; u < v && with < 0; ++u)
    if (b.g.type(b.values[static_cast<size_t>(u)]) == t) with = u;
  if (read && with < 0) return std::nullopt;
  Recipe c = r;
  c.steps.erase(c.steps.begin() + static_cast<std::ptrdiff_t>(i));
  auto remap = [&](int& u) { u = u == v ? with : u > v ? u - 1 : u; };
  for (Recipe::Step& s : c.steps)
    for (int& u : s.operands) remap(u);
  for (int& u : c.outputs) remap(u);
  return c;
}

// The smallest recipe reached by cutting r while run_both still tells a difference.
Recipe shrink(Recipe r, uint32_t input_seed) {
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t k = r.outputs.size(); k-- > 0 && r.outputs.size() > 1;) {
      Recipe c = r;
      c.outputs.erase(c.outputs.begin() + static_cast<std::ptrdiff_t>(k));
      c.donations.erase(c.donations.begin() + static_cast<std::ptrdiff_t>(k));
      if (!run_both(c, input_seed).differs.empty()) {
        r = std::move(c);
        progress = true;
      }
    }
    for (size_t i = r.steps.size(); i-- > 0;) {
      std::optional<Recipe> c = without_step(r, i);
      if (c && !run_both(*c, input_seed).differs.empty()) {
        r = std::move(*c);
        progress = true;
      }
    }
  }
  return r;
}

TEST(Generated, RandomProgramsGiveTheInterpretersBits) {
  {
    testing::JitMode on(jit::Mode::Sync);
    ASSERT_NE(jit::generator(), nullptr) << "lazyrt-jitc cannot be run";
  }
  const int64_t kernels = metrics::counter("JitKernels"), failures = metrics::counter("JitFailures");
  const int64_t programs = testing::env_int("LAZYRT_JIT_FUZZ_PROGRAMS", 120);
  const int64_t first = testing::env_int("LAZYRT_JIT_FUZZ_SEED", 1);
  int64_t fusions = 0, donated = 0;
  for (int64_t seed = first; seed < first + programs; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const Recipe r = generate(rng);
    const uint32_t input_seed = static_cast<uint32_t>(rng());
    const Outcome o = run_both(r, input_seed);
    fusions += o.fusions;
    donated += o.donated;
    if (o.differs.empty()) continue;
    const Recipe small = shrink(r, input_seed);
    const Graph g = build(small).g;
    testing::JitMode m(jit::Mode::Off);
    FAIL() << "seed " << seed << " (LAZYRT_JIT_FUZZ_SEED=" << seed << " LAZYRT_JIT_FUZZ_PROGRAMS=1): " << o.differs << "; shrunk to (" << run_both(small, input_seed).differs
           << ", inputs from seed " << input_seed << ", donations " << ::testing::PrintToString(small.donations)
           << "):\n"
           << ir::to_text(g) << "compiled:\n"
           << ir::to_text(compile(g, small.donations, backend::get("cpu"))->graph());
  }
  EXPECT_EQ(metrics::counter("JitFailures"), failures);
  // The comparison means something: most programs fused, their regions generated, and some
  // results written over their donated parameters (over enough programs to tell; one rerun
  // alone may have none).
  if (programs < 100) return;
  EXPECT_GT(fusions, programs);
  EXPECT_GT(metrics::counter("JitKernels") - kernels, programs);
  EXPECT_GT(donated, programs / 10);
}

// ---- whole loops --------------------------------------------------------------------------
// A while loop over one-element values runs as one generated function (control_flow.cpp):
// seeded random loops, run with generation off (the cond and body sub-executables) and as
// the generated loop, must give the same bits. Carry 0 is an i64 counter from 0; the loop
// stops when it reaches the capture n (0..300) or earlier, where a random comparison of two
// values of one dtype is part of the cond. The body is a random program (as above, over
// scalars: table ops, casts, constants, where) over the carries and 1-2 captures; each other
// carry (1-3, random dtypes) takes a random value of the body cast to its dtype.

struct LoopRecipe {
  Recipe body;  // params: the carries, then the captures; step 0 and 1 are counter + 1
  size_t carries = 0;
  int cmp = -1;  // the cond's extra comparison, or -1
  int cmp_a = 0, cmp_b = 0;
};

ir::Graph build_loop(const LoopRecipe& l) {
  Graph body = build(l.body).g;
  auto cond = std::make_shared<Graph>();
  std::vector<ValueRef> p;
  for (const Recipe::Param& q : l.body.params) p.push_back(cond->add_parameter(q.type));
  ValueRef pred = cond->add(OpKind::Lt, {p[0], p[l.carries]});
  if (l.cmp >= 0) {
    const OpKind ops[] = {OpKind::Lt, OpKind::Gt, OpKind::Ne};
    pred = cond->add(OpKind::LogicalAnd, {pred, cond->add(ops[l.cmp], {p[static_cast<size_t>(l.cmp_a)], p[static_cast<size_t>(l.cmp_b)]})});
  }
  cond->outputs = {pred};
  Graph g;
  std::vector<ValueRef> in;
  for (const Recipe::Param& q : l.body.params) in.push_back(g.add_parameter(q.type));
  const ValueRef w = g.add(OpKind::While, in, {static_cast<int64_t>(l.carries)});
  g.nodes[static_cast<size_t>(w.node)].regions = {cond, std::make_shared<Graph>(std::move(body))};
  for (size_t k = 0; k < l.carries; ++k) g.outputs.push_back({w.node, static_cast<int32_t>(k)});
  ir::verify(g);
  return g;
}

LoopRecipe generate_loop(std::mt19937& rng) {
  LoopRecipe l;
  Recipe& r = l.body;
  const DType kinds[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::b8};
  l.carries = 2 + rng() % 3;
  const size_t captures = 1 + rng() % 2;
  r.params.push_back({{DType::i64, {}}, {}});
  for (size_t k = 1; k < l.carries; ++k) r.params.push_back({{kinds[rng() % std::size(kinds)], {}}, {}});
  r.params.push_back({{DType::i64, {}}, {}});  // n
  for (size_t k = 1; k < captures; ++k) r.params.push_back({{kinds[rng() % std::size(kinds)], {}}, {}});
  Steps st(r);
  const int one = st.add(OpKind::Full, {}, {1.0, Shape{}, DType::i64});
  const int counter = st.add(OpKind::Add, {0, one});
  const int num_steps = 3 + static_cast<int>(rng() % 12);
  for (int step = 0; step < num_steps; ++step) {
    const int kind = static_cast<int>(rng() % 10);
    const int a = st.pick(rng);
    const DType da = st.type_of(a).dtype;
    if (kind <= 5) {
      st.table_op(rng, a);
    } else if (kind <= 7) {
      st.add(OpKind::Cast, {a}, {kinds[rng() % std::size(kinds)]});
    } else {
      const double values[] = {0.5, -2.0, 3.0, 1e-3, 0.99, 1.01};
      const OpKind ops[] = {OpKind::Add, OpKind::Mul, OpKind::Sub, OpKind::Div, OpKind::Maximum, OpKind::Minimum};
      const int c = st.add(OpKind::Full, {}, {values[rng() % std::size(values)], Shape{}, da});
      if (c >= 0) st.add(ops[rng() % std::size(ops)], rng() % 2 ? std::vector<int>{c, a} : std::vector<int>{a, c});
    }
  }
  r.outputs.push_back(counter);
  for (size_t k = 1; k < l.carries; ++k) {
    const int v = st.as(rng() % 3 ? st.count() - 1 - static_cast<int>(rng() % 3) : st.pick(rng), r.params[k].type.dtype);
    r.outputs.push_back(v < 0 ? static_cast<int>(k) : v);
  }
  r.donations.assign(r.outputs.size(), -1);
  if (rng() % 2) {
    // Two values the cond compares: a carry and another operand of its dtype, if any.
    const int a = 1 + static_cast<int>(rng() % (l.carries - 1));
    for (size_t o = 0; o < r.params.size(); ++o)
      if (static_cast<int>(o) != a && r.params[o].type.dtype == r.params[static_cast<size_t>(a)].type.dtype && o != l.carries) {
        l.cmp = static_cast<int>(rng() % 3);
        l.cmp_a = a;
        l.cmp_b = static_cast<int>(o);
        break;
      }
  }
  return l;
}

// Runs the loop with generation off and as the generated loop: a difference, or "" (also
// for a shrunk recipe the type rules reject). `generated` counts the runs that used it.
std::string run_loop_both(const LoopRecipe& l, uint32_t input_seed, int64_t& generated) {
  Graph g;
  try {
    g = build_loop(l);
  } catch (const Error&) {
    return "";
  }
  const backend::Backend& cpu = backend::get("cpu");
  std::mt19937 rng(input_seed);
  auto in = testing::random_inputs(g, rng);
  const int64_t zero = 0, n = static_cast<int64_t>(rng() % 301);
  std::memcpy(in[0].data(), &zero, sizeof zero);
  std::memcpy(in[l.carries].data(), &n, sizeof n);
  std::shared_ptr<runtime::Executable> off, on;
  {
    testing::JitMode m(jit::Mode::Off);
    off = compile(g, {}, cpu);
  }
  {
    testing::JitMode m(jit::Mode::Sync);
    on = compile(g, {}, cpu);
  }
  const int64_t before = metrics::counter("GeneratedLoopRuns");
  const auto want = testing::run_graph(*off, in), got = testing::run_graph(*on, in);
  generated += metrics::counter("GeneratedLoopRuns") - before;
  for (size_t k = 0; k < want.size(); ++k)
    if (const int64_t bad = testing::mismatches(on->output_types()[k].dtype, got[k], want[k]))
      return "carry " + std::to_string(k) + " differs (" + std::to_string(bad) + " element)";
  return "";
}

TEST(Generated, RandomScalarLoopsGiveTheInterpretersBits) {
  {
    testing::JitMode on(jit::Mode::Sync);
    ASSERT_NE(jit::generator(), nullptr) << "lazyrt-jitc cannot be run";
  }
  const int64_t programs = testing::env_int("LAZYRT_JIT_FUZZ_PROGRAMS", 120);
  const int64_t first = testing::env_int("LAZYRT_JIT_FUZZ_SEED", 1);
  int64_t generated = 0;
  for (int64_t seed = first; seed < first + programs; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed) * 7919u + 17u);
    LoopRecipe l = generate_loop(rng);
    const uint32_t input_seed = static_cast<uint32_t>(rng());
    const std::string differs = run_loop_both(l, input_seed, generated);
    if (differs.empty()) continue;
    // Shrunk: body steps after the counter's dropped while it still differs.
    int64_t ignored = 0;
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t i = l.body.steps.size(); i-- > 2;) {
        std::optional<Recipe> c = without_step(l.body, i);
        if (!c) continue;
        LoopRecipe t = l;
        t.body = std::move(*c);
        if (!run_loop_both(t, input_seed, ignored).empty()) {
          l = std::move(t);
          progress = true;
        }
      }
    }
    FAIL() << "loop seed " << seed << " (LAZYRT_JIT_FUZZ_SEED=" << seed << " LAZYRT_JIT_FUZZ_PROGRAMS=1): " << differs
           << "; shrunk to (" << run_loop_both(l, input_seed, ignored) << ", inputs from seed " << input_seed << "):\n"
           << ir::to_text(build_loop(l));
  }
  // The comparison means something: nearly every loop ran as generated code.
  EXPECT_GE(generated, programs * 9 / 10);
}

}  // namespace
}  // namespace lazyrt::compile
