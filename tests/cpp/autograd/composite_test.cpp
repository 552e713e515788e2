// Losses and gradients of small composite models against torch.autograd (fixtures written by
// tests/fixtures/gen_grad_fixtures.py).
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <cmath>
#include <functional>
#include <optional>
#include <map>

#include "ops/op_fixture.h"

namespace lazyrt {
namespace {

using fixtures::FixtureTensor;
using fixtures::OpCase;
using V = std::vector<Tensor>;

const std::map<std::string, std::function<Tensor(const V&)>>& models() {
  static const std::map<std::string, std::function<Tensor(const V&)>> m = {
      {"mlp",
       [](const V& x) {
         Tensor h = relu(matmul(x[0], x[1]) + x[2]);
         Tensor o = tanh(matmul(h, x[3]) + x[4]);
         Tensor d = o - x[5];
         return mean(d * d);
       }},
      {"log_softmax_nll",
       [](const V& x) {
         Tensor z = matmul(x[0], x[1]);
         Tensor m = amax(z, {1}, true);
         Tensor lse = log(sum(exp(z - m), {1}, true)) + m;
         return -mean(z - lse);
       }},
      {"elementwise_zoo",
       [](const V& x) {
         const Tensor& a = x[0];
         const Tensor& b = x[1];
         Tensor out = sqrt(a * a + 1) / (b + 2) + pow(abs(a) + 0.5, b) * rsqrt(b + 1) +
                      maximum(a, b) - minimum(a, 0.5 * b) +
                      where(a > b, sigmoid(a), abs(a) * b) - exp(-a) * log(b + 3);
         return sum(out);
       }},
      {"shapes_and_batches",
       [](const V& x) {
         Tensor p = matmul(x[0], x[1]);
         Tensor q = reshape(permute(p, {0, 3, 1, 2}), {4, 15});
         Tensor r = expand(sum(q, {1}, true), {4, 3});
         Tensor s = amin(r * x[2], {0}) + sum(mean(q, {0}));
         return sum(s) + mean(q * q);
       }},
      {"tiny_cnn",
       [](const V& x) {
         Tensor h = relu(conv2d(x[0], x[1], x[2], {1}, {1}));
         h = max_pool2d(h, {2});
         h = tanh(conv2d(h, x[3], Tensor(), {1, 2}, {1}, {1}, 2));
         h = avg_pool2d(h, {2, 1});
         Tensor o = matmul(flatten(h, 1), x[4]) + x[5];
         Tensor d = o - x[6];
         return mean(d * d);
       }},
      {"embedding_gather",
       [](const V& x) {
         auto i64 = [](std::vector<int64_t> v, Shape s) { return tensor(v, std::move(s)); };
         Tensor e = embedding(x[0], i64({0, 2, 4, 2, 2, 1}, {2, 3}), 2);
         Tensor g = gather(e, 2, i64({1, 0, 2, 2, 0, 1, 2, 1, 0, 0, 1, 2}, {2, 3, 2}));
         Tensor s = index_select(x[1], 0, i64({1, 0, 1}, {3}));
         Tensor h = pad(cat({g * s, flip(g, {1})}, 2), {1, -1});
         Tensor t = scatter_add(zeros({2, 5}, DType::f64), 1, i64({0, 4, 4, 1, 3, 3, 2, 0}, {2, 4}),
                                sum(h, {1}));
         Tensor z = index_add(zeros({4, 2}, DType::f64), 0, i64({3, 1, 3}, {3}), s, 0.5);
         Tensor u = slice(slice(h, 1, 1), 2, 0, std::nullopt, 2);
         Tensor st = stack(split(h, 2, 2), 0);
         return sum(pow(tanh(t), 2)) + mean(u * u) + sum(tanh(z)) + mean(st * slice(st, 2, 0, 1));
       }},
      {"layer_norm_gelu_nll",
       [](const V& x) {
         Tensor h = layer_norm(matmul(x[0], x[1]), {5}, x[2], x[3]);
         Tensor z = matmul(gelu(h), x[4]);
         return -mean(sum(log_softmax(z, 1) * x[5], {1}));
       }},
      {"math_zoo",
       [](const V& x) {
         const Tensor& a = x[0];
         const Tensor& b = x[1];
         const Tensor& c = x[2];
         Tensor e = sin(a) * cos(b) + log1p(c) - expm1(0.5 * a) + erf(b) + silu(a) +
                    softplus(b, 2, 1) + gelu(a, "tanh") + leaky_relu(b, 0.2) + reciprocal(c + 1) +
                    clamp(a, std::optional<Tensor>(b - 0.5), std::optional<Tensor>(c)) +
                    clamp(b, -0.3, 0.4) + lerp(a, b, c * 0.5) + addcmul(a, b, c, 0.7) +
                    addcdiv(b, a, c + 1, -1.5) + round(a * 4) * b + sign(b) * a;
         return sum(var(e, {1})) + sum(lazyrt::std(e, {0}, 0)) + sum(logsumexp(e, {1})) +
                sum(prod(c + 0.5, 1)) + norm(e, 1) + sum(norm(e, 2, {1})) +
                sum(norm(e, INFINITY, {0})) + sum(softmax(e, 0) * a) + sum(nan_to_num(log(c - 0.5)));
       }},
  };
  return m;
}

Tensor make(const FixtureTensor& t) { return tensor(t.reals, t.shape); }

class Composite : public ::testing::TestWithParam<OpCase> {};

TEST_P(Composite, LossAndGradientsMatchTorchAutograd) {
  const OpCase& c = GetParam();
  V inputs;
  for (const FixtureTensor& t : c.inputs) inputs.push_back(make(t).requires_grad_());
  Tensor loss = models().at(c.op)(inputs);
  loss.backward();
  const std::string result = c.attrs.at("result").at(0);
  Tensor got = result == "loss" ? loss : inputs.at(std::stoul(result.substr(4))).grad();
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.shape(), c.expected.shape);
  std::vector<double> v = got.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_NEAR(v[i], c.expected.reals[i], 1e-10 * (1 + std::abs(c.expected.reals[i]))) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Torch, Composite, ::testing::ValuesIn(fixtures::load_op_cases(LAZYRT_GRAD_FIXTURES)),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace lazyrt
