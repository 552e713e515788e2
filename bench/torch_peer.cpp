#include "torch_peer.h"

#include <chrono>
#include <memory>

#include <torch/jit.h>
#include <torch/torch.h>
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

namespace lazyrt::bench {
namespace {

struct SeedStep {
  torch::nn::Linear model{5, 3};
  std::unique_ptr<torch::optim::AdamW> opt;
  torch::Tensor x;
  SeedStep(const std::vector<float>& w, const std::vector<float>& b, const std::vector<float>& xs) {
    torch::NoGradGuard no_grad;
    model->weight.copy_(torch::tensor(w).reshape({3, 5}));
    model->bias.copy_(torch::tensor(b));
    opt = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-3));
    x = torch::tensor(xs).reshape({10, 5});
  }
  torch::Tensor step() {
    torch::Tensor loss = model->forward(x).sum();
    loss.backward();
    opt->step();
    opt->zero_grad();
    return loss;
  }
};

}  // namespace

std::vector<double> torch_seed_losses(const std::vector<float>& w, const std::vector<float>& b,
                                      const std::vector<float>& x, int steps) {
  SeedStep s(w, b, x);
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) out.push_back(s.step().item<double>());
  return out;
}

double torch_seed_step_seconds(const std::vector<float>& w, const std::vector<float>& b,
                               const std::vector<float>& x, int warmup, int iters) {
  SeedStep s(w, b, x);
  for (int i = 0; i < warmup; ++i) s.step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) s.step();
  return seconds_since(t0) / iters;
}

int torch_threads() { return torch::get_num_threads(); }

std::vector<float> torch_add_result(const std::vector<float>& a, const std::vector<float>& b) {
  torch::NoGradGuard no_grad;
  torch::Tensor c = torch::tensor(a) + torch::tensor(b);
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

double torch_add_seconds(const std::vector<float>& a, const std::vector<float>& b, int warmup, int iters) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::tensor(a), y = torch::tensor(b);
  for (int i = 0; i < warmup; ++i) torch::Tensor c = x + y;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) torch::Tensor c = x + y;
  return seconds_since(t0) / iters;
}

}  // namespace lazyrt::bench
