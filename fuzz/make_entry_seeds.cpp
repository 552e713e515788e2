// Writes the seed corpus of entry_parser_fuzz into a directory: real cache entries, written
// by the persistent cache itself while it runs a few programs (an MLP training step, a loop,
// integer and boolean ops), plus one entry whose graph uses every op and attribute kind.
#include <lazyrt/lazyrt.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "cache/persistent_cache.h"
#include "support/graphs.h"

using namespace lazyrt;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  cache::set_persistent_dir(dir);

  // An MLP training step with hand-written gradients and in-place SGD updates.
  auto values = [](Shape shape) {
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 13) / 13 - 0.5f;
    return tensor(v, shape);
  };
  Tensor x = values({8, 6}), labels = tensor(std::vector<float>(8 * 3, 0.0f), {8, 3});
  Tensor w1 = values({6, 5}), b1 = tensor(std::vector<float>(5, 0.0f), {5}), w2 = values({5, 3});
  for (int step = 0; step < 2; ++step) {
    Tensor z = matmul(x, w1) + b1;
    Tensor h = relu(z);
    Tensor logits = matmul(h, w2);
    Tensor shifted = logits - amax(logits, {1}, true);
    Tensor probs = exp(shifted) / sum(exp(shifted), {1}, true);
    Tensor loss = ((probs - labels) * (probs - labels)).mean();
    Tensor dlogits = (probs - labels) * (2.0 / 24);
    Tensor dh = matmul(dlogits, transpose(w2, 0, 1)) * cast(z > 0, DType::f32);
    w2.add_(matmul(transpose(h, 0, 1), dlogits), -0.1);
    w1.add_(matmul(transpose(x, 0, 1), dh), -0.1);
    b1.add_(sum(dh, {0}), -0.1);
    loss.item();
    mark_step();
  }
  // Loops, nested and with captures.
  Tensor scale = scalar_tensor(0.5, DType::f64);
  Carry out = fori_loop(0, 4, [&](const Tensor& i, const Carry& c) {
    Carry inner = fori_loop(0, 2, [&](const Tensor&, const Carry& d) { return Carry{d[0] * scale}; }, c);
    return Carry{inner[0] + cast(i, DType::f64)};
  }, {scalar_tensor(1.0, DType::f64)});
  out[0].item();
  // Integers, booleans, shapes.
  Tensor a = arange(12).reshape({3, 4});
  Tensor picked = where(a > 5, a, a * -1);
  sync({picked, permute(a, {1, 0}), expand(unsqueeze(a, 0), {2, 3, 4}), amin(a, {0})});

  // Every op and attribute kind, written as the cache would write it.
  const ir::Graph every = testing::every_op_graph();
  const GraphHash key = ir::hash_graph(every);
  std::ofstream(dir + "/" + cache::entry_file_name(key), std::ios::binary)
      << cache::encode_entry({key, std::vector<int32_t>(every.outputs.size(), -1), every});
  std::printf("seed entries written to %s\n", dir.c_str());
  return 0;
}
