// Extraction that only hashes agrees with extraction that builds the graph: on seeded random
// traced programs (shared subexpressions, one buffer read through several tensors, in-place
// updates, donations, loops with regions), the hash of the pending IR equals hash_graph of the
// built graph, and both give the same parameters, types and donations. A sync keys its cache
// with the first and compiles the second, so a difference would run the wrong executable.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <random>

#include "exec/executor.h"
#include "trace/lazy_tensor.h"

namespace lazyrt {
namespace {

std::vector<std::shared_ptr<trace::TensorImpl>> impls(const std::vector<Tensor>& ts) {
  std::vector<std::shared_ptr<trace::TensorImpl>> out;
  for (const Tensor& t : ts) out.push_back(trace::impl_of(t));
  return trace::pending_only(out);
}

void expect_same_extraction(const std::vector<Tensor>& roots, const std::string& where) {
  const auto pending = impls(roots);
  ASSERT_FALSE(pending.empty()) << where;
  // One at a time, as a sync does: donation counts who else holds a parameter's buffer.
  trace::Extracted hashed = trace::extract_graph(pending, /*hash_only=*/true);
  std::vector<const runtime::Buffer*> hashed_params;
  for (const auto& b : hashed.params) hashed_params.push_back(b.get());
  hashed.params.clear();
  const trace::Extracted built = trace::extract_graph(pending);
  std::vector<const runtime::Buffer*> built_params;
  for (const auto& b : built.params) built_params.push_back(b.get());
  EXPECT_TRUE(hashed.graph.nodes.empty()) << where;
  EXPECT_EQ(hashed.graph_hash, ir::hash_graph(built.graph)) << where << "\n" << ir::to_text(built.graph);
  EXPECT_EQ(exec::cache_key(hashed.graph_hash, hashed.donations), exec::cache_key(built.graph, built.donations))
      << where;
  EXPECT_EQ(hashed_params, built_params) << where;
  EXPECT_EQ(hashed.param_types, built.param_types) << where;
  EXPECT_EQ(hashed.param_nodes, built.param_nodes) << where;
  EXPECT_EQ(hashed.param_sources, built.param_sources) << where;
  EXPECT_EQ(hashed.donations, built.donations) << where;
  EXPECT_EQ(hashed.param_aliases.size(), built.param_aliases.size()) << where;
  for (size_t p = 0; p < built.param_types.size(); ++p)
    EXPECT_EQ(built.param_types[p], built.graph.nodes[static_cast<size_t>(built.param_nodes[p])].results[0]) << where;
}

Tensor random_tensor(std::mt19937& rng, const Shape& shape) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = u(rng);
  return tensor(v, shape);
}

TEST(Extraction, HashingAloneAgreesWithTheBuiltGraphOnRandomPrograms) {
  for (uint32_t seed = 0; seed < 150; ++seed) {
    std::mt19937 rng(seed);
    const Shape shape = {static_cast<int64_t>(1 + rng() % 4), static_cast<int64_t>(1 + rng() % 5)};
    // Data tensors; some read through a detached copy (one buffer, two tensors).
    std::vector<Tensor> pool, state;
    for (int k = 0; k < 3; ++k) {
      pool.push_back(random_tensor(rng, shape));
      state.push_back(pool.back());
    }
    pool.push_back(pool[rng() % pool.size()].detach());
    const int ops = 3 + static_cast<int>(rng() % 12);
    for (int i = 0; i < ops; ++i) {
      const Tensor& a = pool[rng() % pool.size()];
      const Tensor& b = pool[rng() % pool.size()];
      switch (rng() % 9) {
        case 0: pool.push_back(a + b); break;
        case 1: pool.push_back(a * b - 0.5); break;
        case 2: pool.push_back(exp(a)); break;
        case 3: pool.push_back(sum(a, {1}, true) * b); break;
        case 4: pool.push_back(where(a > b, a, b * 2.0)); break;
        case 5: pool.push_back(amax(a, {0}, true) + a); break;
        case 6: state[rng() % state.size()].add_(a, 0.1); break;  // an in-place update: a donation
        case 7: pool.push_back(cast(cast(a, DType::f64), DType::f32)); break;
        case 8: {
          Carry out = fori_loop(0, 3, [](const Tensor&, const Carry& c) { return Carry{c[0] * 0.5 + c[1], c[1]}; },
                                {a, b});
          pool.push_back(out[0]);
          break;
        }
      }
    }
    std::vector<Tensor> roots;
    for (size_t k = 3; k < pool.size(); ++k)
      if (rng() % 2) roots.push_back(pool[k]);
    roots.insert(roots.end(), state.begin(), state.end());
    if (impls(roots).empty()) continue;
    expect_same_extraction(roots, "seed " + std::to_string(seed));
    mark_step();
  }
}

TEST(Extraction, ASyncCompilesOnceAndThenHitsTheCacheByHashAlone) {
  metrics::reset();
  Tensor w = tensor({1, 2, 3, 4}, {2, 2});
  for (int step = 0; step < 4; ++step) {
    w.add_(exp(w) * 0.01);
    mark_step();
  }
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), 3);
  EXPECT_NEAR(w.to_vector<float>()[0], 1.0, 0.2);
}

}  // namespace
}  // namespace lazyrt
