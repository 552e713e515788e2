// Cached-graph replay against tracing and against PyTorch eager, on the seed step.
//
// Workload (exactly): Linear(5, 3) with fixed initial weights, x = a fixed f32[10, 5];
// loss = model(x).sum(); loss.backward(); AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8,
// weight decay 1e-2).step(); zero_grad(). Paths:
//   traced   - lazyrt records the step and syncs with mark_step(): trace, hash, cache lookup,
//              execute (the path of every step without replay);
//   replayed - lazyrt compile_step(...).run(args): bind, execute, write back;
//   libtorch - PyTorch 1.13 eager in C++ (when CMake found Torch).
// The losses of the first steps are checked equal across paths before anything is timed.
// Then recording one op alone: a + b over f32[4] (and a * w with w requiring grad) recorded
// and dropped, never run, against libtorch eager computing a + b; the results are checked
// equal first.
//
//   replay_bench [--json]
// prints a markdown report, or with --json the initial values, the losses and every timed
// repetition, for bench/suite.py to set beside its Python peers.
#include <lazyrt/lazyrt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#ifdef LAZYRT_BENCH_HAVE_TORCH
#include "torch_peer.h"
using namespace lazyrt::bench;
#endif

using namespace lazyrt;
using Clock = std::chrono::steady_clock;

namespace {

// Replayed steps are ~50x shorter: a replay batch runs more steps so that every batch takes a
// comparable time. Repetitions interleave the paths (replayed, libtorch, traced), so a change
// in the machine's speed during the run (other tenants, clocks) reaches every path alike.
const int kReps = 7, kWarmup = 300, kIters = 3000, kReplayIters = 60000;
// Recording one op: ops per timed batch.
const int kOpIters = 200000;

struct Seed {
  std::shared_ptr<nn::Linear> model = std::make_shared<nn::Linear>(5, 3);
  std::unique_ptr<optim::AdamW> opt = std::make_unique<optim::AdamW>(model->parameters());
  Tensor step(const Tensor& x) {
    Tensor loss = model->forward(x).sum();
    loss.backward();
    opt->step();
    opt->zero_grad();
    return loss;
  }
};

std::vector<float> input() {
  std::vector<float> x(50);
  for (int i = 0; i < 50; ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  return x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Per-step time in us of one batch of `iters` steps.
template <class Fn>
double batch_us(Fn&& step, int iters) {
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) step();
  return 1e6 * std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::string cell(const std::vector<double>& v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.2f [%.2f, %.2f]", median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc == 2 && std::string(argv[1]) == "--json";
  if (argc > 1 && !json) {
    std::fprintf(stderr, "usage: %s [--json]\n", argv[0]);
    return 2;
  }
  manual_seed(0);
  Seed ref;
  const std::vector<float> w = ref.model->weight.to_vector<float>(), b = ref.model->bias.to_vector<float>();
  const std::vector<float> xs = input();
  Tensor x = tensor(xs, {10, 5});
  auto fresh = [&] {
    auto s = std::make_unique<Seed>();
    s->model->load_state_dict({{"weight", tensor(w, {3, 5})}, {"bias", tensor(b, {3})}});
    mark_step();
    return s;
  };

  // Equality first: three steps on each path.
  std::vector<double> traced_losses, replayed_losses;
  {
    auto s = fresh();
    for (int i = 0; i < 3; ++i) {
      Tensor l = s->step(x);
      mark_step();
      traced_losses.push_back(l.item());
    }
    auto r = fresh();
    CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{r->step(a[0])}; }, {x});
    for (int i = 0; i < 3; ++i) replayed_losses.push_back(step({x})[0].item());
  }
  bool ok = traced_losses == replayed_losses;
#ifdef LAZYRT_BENCH_HAVE_TORCH
  std::vector<double> torch_losses = torch_seed_losses(w, b, xs, 3);
  for (int i = 0; i < 3; ++i) ok = ok && std::abs(torch_losses[i] - traced_losses[i]) <= 1e-5 * std::abs(torch_losses[i]) + 1e-5;
#endif
  if (!ok) {
    std::fprintf(stderr, "replay_bench: the paths' losses differ\n");
    return 1;
  }

  auto s1 = fresh();
  auto traced_step = [&] {
    s1->step(x);
    mark_step();
  };
  auto s2 = fresh();
  CompiledStep step = compile_step([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{s2->step(a[0])}; }, {x});
  std::vector<Tensor> args{x};
  auto replayed_step = [&] { step.run(args); };
  for (int i = 0; i < kWarmup; ++i) {
    traced_step();
    replayed_step();
  }
  std::vector<double> traced, replayed, eager;
  for (int r = 0; r < kReps; ++r) {
    replayed.push_back(batch_us(replayed_step, kReplayIters));
#ifdef LAZYRT_BENCH_HAVE_TORCH
    eager.push_back(1e6 * torch_seed_step_seconds(w, b, xs, kWarmup, kIters));
#endif
    traced.push_back(batch_us(traced_step, kIters));
  }

  // Recording one op, alone: a + b over f32[4] data tensors, recorded and dropped (never run),
  // and a * w with w requiring grad (its autograd node too); libtorch computes a + b.
  const std::vector<float> av{1, 2, 3, 4}, bv{4, 3, 2, 1};
  Tensor oa = tensor(av, {4}), ob = tensor(bv, {4}), ow = tensor(bv, {4});
  ow.requires_grad_(true);
  mark_step();
#ifdef LAZYRT_BENCH_HAVE_TORCH
  if ((oa + ob).to_vector<float>() != torch_add_result(av, bv)) {
    std::fprintf(stderr, "replay_bench: a + b differs from libtorch's\n");
    return 1;
  }
#endif
  auto record_add = [&] { Tensor c = oa + ob; };
  auto record_mul_grad = [&] { Tensor c = oa * ow; };
  for (int i = 0; i < kOpIters / 10; ++i) {
    record_add();
    record_mul_grad();
  }
  std::vector<double> op_add, op_mul_grad, op_torch;
  for (int r = 0; r < kReps; ++r) {
    op_add.push_back(1e3 * batch_us(record_add, kOpIters));
    op_mul_grad.push_back(1e3 * batch_us(record_mul_grad, kOpIters));
#ifdef LAZYRT_BENCH_HAVE_TORCH
    op_torch.push_back(1e9 * torch_add_seconds(av, bv, kOpIters / 10, kOpIters));
#endif
  }

  const char* threads = std::getenv("LAZYRT_NUM_THREADS");
  if (json) {
    std::printf("{\"reps\": %d, \"iters\": %d, \"replay_iters\": %d, \"warmup\": %d, \"lazyrt_threads\": \"%s\", ",
                kReps, kIters, kReplayIters, kWarmup, threads ? threads : "default");
#ifdef LAZYRT_BENCH_HAVE_TORCH
    std::printf("\"torch_version\": \"%s\", \"torch_threads\": %d, \"torch_losses\": %s, ", torch_version().c_str(),
                torch_threads(), json_list(torch_losses).c_str());
#endif
    std::printf("\"weight\": %s, \"bias\": %s, \"x\": %s, \"traced_losses\": %s, \"replayed_losses\": %s, ",
                json_list(widen(w)).c_str(), json_list(widen(b)).c_str(), json_list(widen(xs)).c_str(),
                json_list(traced_losses).c_str(), json_list(replayed_losses).c_str());
    std::printf("\"us\": {\"replayed\": %s, \"traced\": %s, \"libtorch\": %s}, ", json_list(replayed).c_str(),
                json_list(traced).c_str(), json_list(eager).c_str());
    std::printf("\"op_iters\": %d, \"ns_per_op\": {\"add\": %s, \"mul_grad\": %s, \"libtorch_add\": %s}}\n",
                kOpIters, json_list(op_add).c_str(), json_list(op_mul_grad).c_str(), json_list(op_torch).c_str());
    return 0;
  }
  std::printf("## Cached-graph replay: the seed step\n\n");
  std::printf("Linear(5, 3), x f32[10, 5], sum, backward, AdamW, zero_grad. Per-step time in us: median "
              "[min, max] of %d repetitions of %d steps (%d replayed steps), the paths interleaved, after %d "
              "warm-up steps (not counted). lazyrt kernel threads: %s; ",
              kReps, kIters, kReplayIters, kWarmup, threads ? threads : "default");
#ifdef LAZYRT_BENCH_HAVE_TORCH
  std::printf("libtorch %s threads: %d.\n\n", torch_version().c_str(), torch_threads());
#else
  std::printf("libtorch not built in (the PyTorch column is skipped).\n\n");
#endif
  std::printf("Losses of 3 steps: traced %.6f %.6f %.6f, replayed %.6f %.6f %.6f", traced_losses[0],
              traced_losses[1], traced_losses[2], replayed_losses[0], replayed_losses[1], replayed_losses[2]);
#ifdef LAZYRT_BENCH_HAVE_TORCH
  std::printf(", libtorch %.6f %.6f %.6f", torch_losses[0], torch_losses[1], torch_losses[2]);
#endif
  std::printf(" -> equal\n\n");
  std::printf("| path | us per step | vs replayed |\n|---|---:|---:|\n");
  std::printf("| lazyrt replayed (compile_step) | %s | 1x |\n", cell(replayed).c_str());
  std::printf("| lazyrt traced (trace + hash + cached executable) | %s | %.1fx |\n", cell(traced).c_str(),
              median(traced) / median(replayed));
#ifdef LAZYRT_BENCH_HAVE_TORCH
  std::printf("| libtorch eager (C++) | %s | %.1fx |\n", cell(eager).c_str(), median(eager) / median(replayed));
#endif
  std::printf("\nTargets: replayed >= 50x faster than PyTorch eager, >= 5x faster than traced.\n");
  std::printf("\n## Recording one op (C++)\n\nns per op: median [min, max] of %d batches of %d ops.\n\n", kReps,
              kOpIters);
  std::printf("| op | ns per op |\n|---|---:|\n");
  std::printf("| lazyrt: a + b, f32[4], recorded | %s |\n", cell(op_add).c_str());
  std::printf("| lazyrt: a * w, f32[4], w requires grad, recorded | %s |\n", cell(op_mul_grad).c_str());
#ifdef LAZYRT_BENCH_HAVE_TORCH
  std::printf("| libtorch eager: a + b, f32[4], computed (no grad) | %s |\n", cell(op_torch).c_str());
#endif
  std::printf("\nTarget: <= 250 ns per recorded op.\n");
  return 0;
}
