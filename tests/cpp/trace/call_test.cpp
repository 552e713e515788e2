// Functions recorded as call nodes (loops/call.h): the values against the same function run op
// by op, the regions kept, what is refused, and the optimizers' updates recorded so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "support/error_of.h"
#include "loops/call.h"

namespace lazyrt {
namespace {
using ::testing::HasSubstr;
using testing_support::error_of;

// Two results from two operands, with a constant and a unary op.
Carry scale_shift(const Carry& in) { return {in[0] * 2.5 + in[1], exp(in[0]) - in[1]}; }

int64_t count(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

template <class T>
void expect_same_bits(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  const std::vector<T> x = a.to_vector<T>(), y = b.to_vector<T>();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(std::memcmp(&x[i], &y[i], sizeof(T)), 0) << "element " << i;
}

}  // namespace

TEST(TracedFunction, RecordsOneNodePerUseAndTracesOncePerOperandTypes) {
  manual_seed(3);
  detail::TracedFunction f("scale_shift", scale_shift);
  const Carry ins[] = {{randn({4, 3}), randn({3})}, {randn({4, 3}), randn({4, 3})}, {randn({4, 3}), randn({3})},
                       {randn({5}, DType::f64), randn({5}, DType::f64)}};
  std::vector<Tensor> called, direct;
  for (const Carry& in : ins) {
    const Carry c = f(in), d = scale_shift(in);
    called.insert(called.end(), c.begin(), c.end());
    direct.insert(direct.end(), d.begin(), d.end());
  }
  EXPECT_EQ(f.regions(), 3u) << "f32[4, 3] with f32[3] twice, f32[4, 3] with f32[4, 3], f64[5] with f64[5]";
  const std::string text = debug::graph_text(called);
  EXPECT_EQ(count(text, "= call("), 4) << text;
  // The ops are in the regions (printed indented under each call), none at the top level.
  int64_t top_level_exps = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    if (line.rfind('%', 0) == 0 && line.find("= exp(") != std::string::npos) ++top_level_exps;
    at = end + 1;
  }
  EXPECT_EQ(top_level_exps, 0) << text;
  sync(called);
  sync(direct);
  for (size_t k = 0; k < called.size(); ++k) {
    if (called[k].dtype() == DType::f64) expect_same_bits<double>(called[k], direct[k]);
    else expect_same_bits<float>(called[k], direct[k]);
  }
}

TEST(TracedFunction, HalfPrecisionOperandsGiveTheBitsOfTheOpsRunOneByOne) {
  manual_seed(5);
  detail::TracedFunction f("scale_shift", scale_shift);
  for (DType d : {DType::bf16, DType::f16}) {
    const Carry in{randn({64}).to(d), randn({64}).to(d)};
    const Carry c = f(in), e = scale_shift(in);
    // Widened to f32, which holds every bf16 and f16 value exactly.
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(c[k].dtype(), d);
      expect_same_bits<float>(c[k].to(DType::f32), e[k].to(DType::f32));
    }
  }
}

TEST(TracedFunction, RefusesAFunctionThatReadsATensorItWasNotGiven) {
  Tensor outside = ones({3});
  detail::TracedFunction reads("reads", [&](const Carry& in) { return Carry{in[0] + outside}; });
  EXPECT_THAT(error_of([&] { reads({zeros({3})}); }),
              HasSubstr("reads: the function reads 1 tensor(s) it was not given"));
  EXPECT_EQ(reads.regions(), 0u);
  detail::TracedFunction draws("draws", [](const Carry& in) { return Carry{in[0] + rand({3})}; });
  EXPECT_THAT(error_of([&] { draws({zeros({3})}); }),
              HasSubstr("draws: the function updates a tensor from outside it in place (a random draw"));
  EXPECT_EQ(draws.regions(), 0u);
  // Nothing was left behind: the next draw outside gives what it would have.
  manual_seed(11);
  const std::vector<float> first = rand({3}).to_vector<float>();
  manual_seed(11);
  EXPECT_ANY_THROW(draws({zeros({3})}));
  EXPECT_EQ(rand({3}).to_vector<float>(), first);
  detail::TracedFunction undefined("undefined", [](const Carry&) { return Carry{Tensor()}; });
  EXPECT_THAT(error_of([&] { undefined({zeros({3})}); }), HasSubstr("undefined: result 0 is undefined"));
}

TEST(TracedFunction, RunsAsItselfWhereAGradientIsRecorded) {
  detail::TracedFunction f("scale_shift", scale_shift);
  Tensor a = tensor({0.5f, -1.0f, 2.0f}, {3}).requires_grad_(true);
  Tensor b = tensor({1.0f, 2.0f, 3.0f}, {3});
  const Carry out = f({a, b});
  EXPECT_EQ(count(debug::graph_text(out), "call("), 0);
  EXPECT_EQ(f.regions(), 0u);
  (out[0] + out[1]).sum().backward();
  const std::vector<float> g = a.grad().to_vector<float>();
  const std::vector<float> x{0.5f, -1.0f, 2.0f};
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(g[i], 2.5f + std::exp(x[i]));
  // Under no_grad the same operands are called.
  NoGradGuard no_grad;
  EXPECT_EQ(count(debug::graph_text(f({a, b})), "call("), 1);
}

TEST(TracedFunction, ACallInsideALoopBodyComputesWhatTheHostLoopDoes) {
  manual_seed(7);
  detail::TracedFunction f("scale_shift", scale_shift);
  const Tensor x0 = randn({6}) * 0.1, b = randn({6}) * 0.1;
  auto loop = [&] {
    return fori_loop(0, 5, [&](const Tensor&, const Carry& c) { return Carry{f({c[0], b})[1] * 0.5}; }, {x0})[0];
  };
  Tensor host = x0;
  for (int i = 0; i < 5; ++i) host = scale_shift({host, b})[1] * 0.5;
  // With grad mode on the body may be differentiated as a whole: the function runs as itself.
  expect_same_bits<float>(loop(), host);
  EXPECT_EQ(f.regions(), 0u);
  NoGradGuard no_grad;
  const Tensor looped = loop();
  EXPECT_EQ(f.regions(), 1u);
  EXPECT_EQ(count(debug::graph_text({looped}), "= call("), 1);
  expect_same_bits<float>(looped, host);
}

TEST(OptimizerUpdate, EachParameterIsOneCallAndAnOptionChangeRetracesIt) {
  manual_seed(0);
  nn::Linear model(5, 3);
  optim::AdamW opt(model.parameters());
  Tensor x = randn({10, 5});
  auto step = [&] {
    Tensor loss = model.forward(x).sum();
    loss.backward();
    opt.step();
    std::vector<Tensor> state = model.parameters();
    for (const Tensor& s : opt.state()) state.push_back(s);
    const std::string text = debug::graph_text(state);
    opt.zero_grad();
    mark_step();
    return text;
  };
  const std::string first = step();
  EXPECT_EQ(count(first, "= call("), 2) << first;
  EXPECT_GT(count(first, "value=0.9,"), 0) << "beta1 is a constant of the region:\n" << first;
  optim::AdamOptions o = opt.options();
  o.beta1 = 0.625;
  opt.set_options(o);
  const std::string second = step();
  EXPECT_EQ(count(second, "= call("), 2);
  EXPECT_EQ(count(second, "value=0.9,"), 0) << "the region of the old beta1 is not reused:\n" << second;
  EXPECT_GT(count(second, "value=0.625,"), 0) << second;
}

}  // namespace lazyrt
