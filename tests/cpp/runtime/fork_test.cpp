// fork(): a child process has none of its parent's threads. One forked after lazyrt's kernels
// ran on the thread pool and on oneDNN's OpenMP team (as a data loader's workers are forked
// from a training process) must still run kernels, with the values its parent computed, instead
// of waiting forever for threads that do not exist there.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lazyrt/lazyrt.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "backend/cpu/kernels/parallel.h"

namespace lazyrt {
namespace {

std::vector<float> wave(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * std::sin(0.01f * static_cast<float>(i));
  return v;
}

// Large enough for several chunks of the pool and for oneDNN to split the convolution.
std::vector<float> elementwise(const std::vector<float>& xs) {
  return exp(tensor(xs, {static_cast<int64_t>(xs.size())}) * 0.5 + 1.0).to_vector<float>();
}
std::vector<float> convolution(const std::vector<float>& image, const std::vector<float>& weight) {
  return conv2d(tensor(image, {8, 16, 32, 32}), tensor(weight, {32, 16, 3, 3}), Tensor(), {1, 1}, {1, 1})
      .to_vector<float>();
}

TEST(Fork, AChildForkedAfterParallelKernelsRunsKernelsOfItsOwn) {
  // On the cpu backend (its pool and oneDNN's convolutions), with two threads however many
  // the machine has; both as they were afterwards.
  struct Restore {
    std::string backend = current_backend();
    int threads = kernels::num_threads();
    ~Restore() {
      set_backend(backend);
      kernels::set_num_threads(threads);
    }
  } restore;
  set_backend("cpu");
  kernels::set_num_threads(2);
  const std::vector<float> xs = wave(1 << 20, 3.0f), image = wave(8 * 16 * 32 * 32, 1.0f),
                           weight = wave(32 * 16 * 3 * 3, 0.25f);
  const std::vector<float> ew = elementwise(xs), conv = convolution(image, weight);
  // What the parent computed is what a plain loop gives (so the child's results, compared with
  // these, are checked too).
  for (size_t i = 0; i < xs.size(); i += 4099) ASSERT_NEAR(ew[i], std::exp(xs[i] * 0.5f + 1.0f), 1e-5f * ew[i]) << i;

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: the same programs on new tensors (the parent's executables, from the cache),
    // and a program of its own.
    bool ok = elementwise(xs) == ew && convolution(image, weight) == conv;
    const std::vector<float> twice = (tensor(xs, {static_cast<int64_t>(xs.size())}) * 2.0).to_vector<float>();
    for (size_t i = 0; ok && i < xs.size(); ++i) ok = twice[i] == xs[i] * 2.0f;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  bool exited = false;
  for (int waited_ms = 0; waited_ms < 120000 && !exited; waited_ms += 20) {
    exited = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the forked child did not finish its kernels within 120 s";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's values differ from its parent's";
}

}  // namespace
}  // namespace lazyrt
