// libtorch versions of the scalar loop of while_loop_bench, in their own translation unit so
// that lazyrt code never sees torch headers. Built only when CMake finds Torch.
//
// Every variant computes, on 0-dim tensors, c = 0 (i64), x = 0 (f32);
// while c < n: c = c + 1; x = x + 1.  It returns the final values and the seconds the loop
// took (tensor creation included, nothing else).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lazyrt::bench {

struct TorchLoopResult {
  double seconds = 0;
  int64_t counter = 0;
  double x = 0;
};

/// "1.13.0".
std::string torch_version();
/// Eager ops under InferenceMode; the condition is read back with item() every iteration.
TorchLoopResult torch_eager_while(int64_t n);
/// Eager ops under InferenceMode with a host counter: only x = x + 1 is a tensor op.
TorchLoopResult torch_eager_for(int64_t n);
/// A TorchScript function with the while loop, compiled on the first call (which is slower
/// while the profiling executor specializes it).
TorchLoopResult torch_script_while(int64_t n);

}  // namespace lazyrt::bench

namespace lazyrt::bench {

/// The seed training step in libtorch eager mode: Linear(5, 3) with the given weight [3, 5]
/// and bias [3], loss = model(x).sum() on x [10, 5], backward, AdamW (PyTorch's defaults),
/// zero_grad. Returns the losses of `steps` steps.
std::vector<double> torch_seed_losses(const std::vector<float>& weight, const std::vector<float>& bias,
                                      const std::vector<float>& x, int steps);
/// Seconds per step of the same step, over `iters` steps after `warmup` untimed ones.
double torch_seed_step_seconds(const std::vector<float>& weight, const std::vector<float>& bias,
                               const std::vector<float>& x, int warmup, int iters);
int torch_threads();

/// One op of libtorch eager: a + b on f32[4] tensors holding `a` and `b`, under NoGradGuard.
/// Its result, and seconds per op over `iters` ops after `warmup` untimed ones.
std::vector<float> torch_add_result(const std::vector<float>& a, const std::vector<float>& b);
double torch_add_seconds(const std::vector<float>& a, const std::vector<float>& b, int warmup, int iters);

}  // namespace lazyrt::bench
