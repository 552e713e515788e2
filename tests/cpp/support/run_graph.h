// Running a compiled graph on host buffers with seeded random inputs, and comparing two runs'
// results bit for bit: shared by the tests that run one program two ways (two backends, the
// interpreter and generated code).
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ir/graph.h"
#include "backend/cpu/jit/jit.h"
#include "runtime/executable.h"
#include "util/dtype_dispatch.h"

namespace lazyrt::testing {

/// Generated kernels in mode m (jit::set_mode) for the scope, whatever LAZYRT_JIT says.
struct JitMode {
  jit::Mode saved = jit::mode();
  explicit JitMode(jit::Mode m) { jit::set_mode(m); }
  ~JitMode() { jit::set_mode(saved); }
  JitMode(const JitMode&) = delete;
  JitMode& operator=(const JitMode&) = delete;
};

/// The graph's inputs, one buffer per parameter: floating values in [-3, 3) with a few zeros,
/// infinities and NaNs; integers in [-20, 20] with a few zeros; booleans half true.
inline std::vector<std::vector<char>> random_inputs(const ir::Graph& g, std::mt19937& rng) {
  std::vector<std::vector<char>> in;
  for (const auto& n : g.nodes) {
    if (n.op != ir::OpKind::Parameter) continue;
    const ir::TensorType& t = n.results[0];
    in.emplace_back(t.bytes());
    visit_dtype(t.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* p = reinterpret_cast<T*>(in.back().data());
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int r = static_cast<int>(rng() % 200);
        double v;
        if (t.dtype == DType::b8) v = static_cast<double>(rng() % 2);
        else if (!is_floating(t.dtype)) v = r == 0 ? 0.0 : static_cast<double>(static_cast<int>(rng() % 41) - 20);
        else v = r == 0 ? 0.0 : r == 1 ? INFINITY : r == 2 ? NAN : std::uniform_real_distribution<double>(-3, 3)(rng);
        p[i] = convert<T>(v);
      }
    });
  }
  return in;
}

/// Runs `exe` on copies of `in`; returns its results. donations[k] = p: output k was offered
/// parameter p's buffer (compile's donations); where the executable took it, the result is
/// written there, as a replay writes it.
inline std::vector<std::vector<char>> run_graph(runtime::Executable& exe, std::vector<std::vector<char>> in,
                                                const std::vector<int32_t>& donations = {}) {
  std::vector<const void*> ip;
  for (auto& b : in) ip.push_back(b.data());
  std::vector<std::vector<char>> out;
  for (const auto& t : exe.output_types()) out.emplace_back(t.bytes());
  std::vector<void*> op;
  auto donated = [&](size_t k) {
    return k < donations.size() && donations[k] >= 0 && exe.donation_accepted(k) &&
           exe.outputs()[k].kind == runtime::OutputSource::Kind::Computed;
  };
  for (size_t k = 0; k < out.size(); ++k) op.push_back(donated(k) ? in[static_cast<size_t>(donations[k])].data() : out[k].data());
  exe.run(ip.data(), op.data());
  for (size_t k = 0; k < out.size(); ++k) {
    const auto& src = exe.outputs()[k];
    if (donated(k)) out[k] = in[static_cast<size_t>(donations[k])];
    else if (src.kind == runtime::OutputSource::Kind::Alias) out[k] = out[src.index];
    else if (src.kind == runtime::OutputSource::Kind::Param) out[k] = in[src.index];
  }
  return out;
}

/// Elements of a and b (of dtype `dtype`) whose bits differ, NaN against NaN aside.
inline int64_t mismatches(DType dtype, const std::vector<char>& a, const std::vector<char>& b) {
  int64_t bad = 0;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t n = a.size() / sizeof(T);
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(a.data() + i * sizeof(T), b.data() + i * sizeof(T), sizeof(T)) == 0) continue;
      T x, y;
      std::memcpy(&x, a.data() + i * sizeof(T), sizeof(T));
      std::memcpy(&y, b.data() + i * sizeof(T), sizeof(T));
      const auto fx = convert<double>(x), fy = convert<double>(y);
      if (!(fx != fx && fy != fy)) ++bad;
    }
  });
  return bad;
}

}  // namespace lazyrt::testing
