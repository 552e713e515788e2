// A randomized differential test of replay in C++: seeded random programs of user actions
// (calls of a training step, mark_step, reads, learning-rate and option changes, train/eval,
// in-place edits, load_state_dict, zero_grad between calls, other batch sizes, steps whose
// gradients are not finite under autocast + GradScaler) run once with the step compiled by
// compile_step and once with plain traced steps, comparing every loss and every state tensor
// at every read and at the end. A failure prints the seed and the shortest failing program.
//
// ctest runs a fixed slice; LAZYRT_REPLAY_FUZZ_PROGRAMS=N (and LAZYRT_REPLAY_FUZZ_SEED) run more
// (make fuzz-replay).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include <lazyrt/lazyrt.h>

#include "support/env.h"

namespace lazyrt {
namespace {

enum class Act { Call, MarkStep, Read, SetLr, Train, Eval, Edit, Load, ZeroGrad, ZeroGradNone, Batch, Poison, Decay };
const char* const kActNames[] = {"call", "mark_step", "read", "set_lr", "train", "eval", "edit",
                                 "load_state_dict", "zero_grad", "zero_grad(set_to_none)", "other_batch",
                                 "call_with_inf_gradient", "set_weight_decay"};

struct Config {
  int opt = 0;  // 0 SGD momentum, 1 Adam, 2 AdamW
  bool dropout = false;
  bool amp = false;
  int zero_grad = 0;  // 0 at the end of the step, 1 at the start, 2 never (the user's)
  bool sync_after_init = false;
};

struct Action {
  Act act;
  double value = 0;
};

struct Program {
  uint64_t seed;
  Config config;
  std::vector<Action> actions;
  std::string str() const {
    std::ostringstream os;
    os << "seed " << seed << ": opt " << config.opt << ", dropout " << config.dropout << ", amp "
       << config.amp << ", zero_grad " << config.zero_grad << ", sync_after_init " << config.sync_after_init << "\n";
    for (const Action& a : actions) os << "  " << kActNames[static_cast<int>(a.act)] << " " << a.value << "\n";
    return os.str();
  }
};

Program generate(uint64_t seed, int length) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Program p{seed, {pick(3), pick(3) == 0, pick(3) == 0, pick(3), pick(2) == 0}, {}};
  for (int i = 0; i < length; ++i) {
    // Calls dominate; everything else between them.
    const int r = pick(20);
    Act a = r < 7 ? Act::Call : static_cast<Act>(1 + pick(12));
    p.actions.push_back({a, 0.01 * (1 + pick(30))});
  }
  return p;
}

Tensor batch(int rows, double shift) {
  std::vector<float> v(static_cast<size_t>(rows) * 6);
  for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(std::sin(0.7 * k + shift));
  return tensor(v, {rows, 6});
}

struct World {
  Config c;
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<nn::Linear> l1, l2;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::GradScaler> scaler;

  explicit World(const Config& config) : c(config) {
    manual_seed(7);
    model = std::make_shared<nn::Sequential>();
    l1 = std::make_shared<nn::Linear>(6, 8);
    l2 = std::make_shared<nn::Linear>(8, 2);
    model->push_back(l1);
    model->push_back(std::make_shared<nn::Tanh>());
    if (c.dropout) model->push_back(std::make_shared<nn::Dropout>(0.3));
    model->push_back(l2);
    std::vector<Tensor> ps = model->parameters();
    if (c.opt == 0) opt = std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.05, 0.9, 0, 0.01, false});
    else if (c.opt == 1) opt = std::make_unique<optim::Adam>(ps, optim::AdamOptions{0.05, 0.9, 0.999, 1e-8, 0.01});
    else opt = std::make_unique<optim::AdamW>(ps, optim::AdamOptions{0.05, 0.9, 0.999, 1e-8, 0.01});
    if (c.amp) scaler = std::make_unique<amp::GradScaler>(amp::GradScalerOptions{1024.0, 2.0, 0.5, 2});
    if (c.sync_after_init) mark_step();
  }

  // args: the batch, and a scalar added to the loss (0, or inf for a non-finite step).
  std::vector<Tensor> step(const std::vector<Tensor>& a) {
    if (c.zero_grad == 1) opt->zero_grad();
    Tensor loss;
    {
      std::optional<amp::AutocastGuard> autocast;
      if (c.amp) autocast.emplace(DType::bf16);
      loss = pow(model->forward(a[0]), 2.0).mean() + a[1];
    }
    if (c.amp) {
      scaler->scale(loss).backward();
      scaler->step(*opt);
      scaler->update();
    } else {
      loss.backward();
      opt->step();
    }
    if (c.zero_grad == 0) opt->zero_grad();
    return {loss};
  }

  std::vector<std::vector<float>> state() {
    std::vector<std::vector<float>> out;
    auto add = [&](const Tensor& t) { out.push_back(cast(t, DType::f32).to_vector<float>()); };
    for (const Tensor& p : model->parameters()) {
      add(p);
      if (p.grad().defined()) add(p.grad());
      else out.push_back({-12345.0f});  // no gradient
    }
    for (const Tensor& t : opt->state()) add(t);
    if (scaler)
      for (const Tensor& t : scaler->state()) add(t);
    auto [seed, offset] = random_state();
    add(seed);
    add(offset);
    return out;
  }

  void set_decay(double v) {
    if (auto* s = dynamic_cast<optim::SGD*>(opt.get())) {
      optim::SGDOptions o = s->options();
      o.weight_decay = v;
      s->set_options(o);
    } else {
      auto* a = static_cast<optim::Adam*>(opt.get());
      optim::AdamOptions o = a->options();
      o.weight_decay = v;
      a->set_options(o);
    }
  }
};

// What one world saw: the losses of every call and the state at every read and at the end.
struct Record {
  std::vector<std::vector<std::vector<float>>> snapshots;
  std::string error;
};

Record run(const Program& p, bool replayed) {
  Record rec;
  try {
    World w(p.config);
    std::optional<CompiledStep> compiled;
    std::vector<float> losses;
    int rows = 4;
    double shift = 0;
    auto call = [&](double poison) {
      Tensor x = batch(rows, shift);
      Tensor bump = scalar_tensor(poison, DType::f32);
      shift += 0.37;
      Tensor loss;
      if (replayed) {
        auto fn = [&w](const std::vector<Tensor>& a) { return w.step(a); };
        if (!compiled) compiled = compile_step(fn, {x, bump});
        loss = (*compiled)({x, bump})[0];
      } else {
        loss = w.step({x, bump})[0];
      }
      losses.push_back(static_cast<float>(cast(loss, DType::f32).item()));
    };
    auto snapshot = [&] {
      rec.snapshots.push_back(w.state());
      rec.snapshots.push_back({losses});
      losses.clear();
    };
    for (const Action& a : p.actions) {
      switch (a.act) {
        case Act::Call: call(0); break;
        case Act::MarkStep: mark_step(); break;
        case Act::Read: snapshot(); break;
        case Act::SetLr: w.opt->set_lr(a.value); break;
        case Act::Train: w.model->train(); break;
        case Act::Eval: w.model->eval(); break;
        case Act::Edit: {
          NoGradGuard ng;
          w.l1->weight.mul_(full({}, 1.0 - a.value));
          break;
        }
        case Act::Load: {
          nn::StateDict sd;
          for (auto& [n, t] : w.model->state_dict()) sd.emplace_back(n, t * (1.0 + a.value));
          w.model->load_state_dict(sd);
          break;
        }
        case Act::ZeroGrad: w.opt->zero_grad(false); break;
        case Act::ZeroGradNone: w.opt->zero_grad(true); break;
        case Act::Batch: rows = rows == 4 ? 3 : 4; break;
        case Act::Poison: call(p.config.amp ? INFINITY : 0.0); break;
        case Act::Decay: w.set_decay(a.value); break;
      }
    }
    snapshot();
  } catch (const std::exception& e) {
    rec.error = e.what();
  }
  return rec;
}

// Empty when the two worlds agree; otherwise what differs first.
std::string difference(const Program& p) {
  Record a = run(p, true), b = run(p, false);
  if (!a.error.empty() || !b.error.empty()) return "replayed raised '" + a.error + "', plain raised '" + b.error + "'";
  if (a.snapshots.size() != b.snapshots.size()) return "different numbers of snapshots";
  for (size_t s = 0; s < a.snapshots.size(); ++s) {
    const auto &x = a.snapshots[s], &y = b.snapshots[s];
    if (x.size() != y.size()) return "snapshot " + std::to_string(s) + ": different tensor counts";
    for (size_t t = 0; t < x.size(); ++t) {
      if (x[t].size() != y[t].size()) return "snapshot " + std::to_string(s) + " tensor " + std::to_string(t) + ": sizes";
      for (size_t k = 0; k < x[t].size(); ++k) {
        const float u = x[t][k], v = y[t][k];
        const bool same = (std::isnan(u) && std::isnan(v)) || u == v || std::abs(u - v) <= 1e-5f + 1e-5f * std::abs(v);
        if (!same) {
          std::ostringstream os;
          os << "snapshot " << s << " tensor " << t << " element " << k << ": replayed " << u << ", plain " << v;
          return os.str();
        }
      }
    }
  }
  return "";
}

// The shortest program found by dropping actions one at a time while it still fails.
Program shrink(Program p) {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < p.actions.size(); ++i) {
      Program q = p;
      q.actions.erase(q.actions.begin() + static_cast<std::ptrdiff_t>(i));
      if (!difference(q).empty()) {
        p = std::move(q);
        changed = true;
        break;
      }
    }
  }
  return p;
}

using testing::env_int;

}  // namespace

TEST(ReplayFuzz, RandomProgramsReplayLikePlainSteps) {
  const int64_t programs = env_int("LAZYRT_REPLAY_FUZZ_PROGRAMS", 150);
  const int64_t first = env_int("LAZYRT_REPLAY_FUZZ_SEED", 1);
  int64_t actions = 0, failures = 0;
  for (int64_t seed = first; seed < first + programs; ++seed) {
    Program p = generate(static_cast<uint64_t>(seed), 6 + static_cast<int>(seed % 19));
    actions += static_cast<int64_t>(p.actions.size());
    if (difference(p).empty()) continue;
    Program small = shrink(p);
    ADD_FAILURE() << "replay differs from plain steps: " << difference(small) << "\nshortest program, "
                  << small.str();
    if (++failures >= 3) break;
  }
  std::printf("replay fuzz: %lld programs, %lld actions, %lld failing\n", static_cast<long long>(programs),
              static_cast<long long>(actions), static_cast<long long>(failures));
}

// The harness can fail: a world that skips one call differs from one that does not.
TEST(ReplayFuzz, TheComparisonSeesADifference) {
  Program p = generate(3, 8);
  p.actions = {{Act::Call}, {Act::Call}, {Act::Read}};
  ASSERT_EQ(difference(p), "");
  Program q = p;
  q.actions.erase(q.actions.begin());
  Record a = run(p, true), b = run(q, false);
  bool differs = a.snapshots.size() != b.snapshots.size();
  for (size_t s = 0; !differs && s < a.snapshots.size(); ++s) differs = a.snapshots[s] != b.snapshots[s];
  EXPECT_TRUE(differs);
}

}  // namespace lazyrt
