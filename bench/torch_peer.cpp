#include "torch_peer.h"

#include <chrono>
#include <memory>

#include <torch/jit.h>
#include <torch/script.h>
#include <torch/version.h>

namespace lazyrt::bench {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

torch::jit::CompilationUnit& script() {
  static std::shared_ptr<torch::jit::CompilationUnit> cu = torch::jit::compile(R"JIT(
def scalar_loop(n: int, c, x):
    while bool(c < n):
        c = c + 1
        x = x + 1
    return c, x
)JIT");
  return *cu;
}

}  // namespace

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

TorchLoopResult torch_eager_while(int64_t n) {
  c10::InferenceMode guard;
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor c = torch::zeros({}, torch::kLong);
  torch::Tensor x = torch::zeros({}, torch::kFloat);
  while ((c < n).item<bool>()) {
    c = c + 1;
    x = x + 1;
  }
  const double s = seconds_since(t0);
  return {s, c.item<int64_t>(), x.item<double>()};
}

TorchLoopResult torch_eager_for(int64_t n) {
  c10::InferenceMode guard;
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor x = torch::zeros({}, torch::kFloat);
  int64_t c = 0;
  for (; c < n; ++c) x = x + 1;
  const double s = seconds_since(t0);
  return {s, c, x.item<double>()};
}

TorchLoopResult torch_script_while(int64_t n) {
  c10::InferenceMode guard;
  torch::jit::CompilationUnit& cu = script();
  const auto t0 = std::chrono::steady_clock::now();
  c10::IValue r = cu.run_method("scalar_loop", n, torch::zeros({}, torch::kLong),
                                torch::zeros({}, torch::kFloat));
  const double s = seconds_since(t0);
  const auto& out = r.toTupleRef().elements();
  return {s, out[0].toTensor().item<int64_t>(), out[1].toTensor().item<double>()};
}

}  // namespace lazyrt::bench
