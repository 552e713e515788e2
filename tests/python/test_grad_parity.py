"""The gradient of every differentiable op against torch.autograd: the same float64 inputs,
loss = sum(op(inputs) * weights) with random weights, and every input's .grad compared."""

import pytest
import torch

import lazyrt as lr
import lazyrt.nn.functional as F
from conftest import assert_same, pair

# name: (lazyrt fn, torch fn, [(shape, low, high) per input])
CASES = {
    "neg": (lambda x: -x, lambda x: -x, [((3, 4), -2, 2)]),
    "abs": (lr.abs, torch.abs, [((3, 4), 0.5, 2)]),
    "abs_negative": (lambda x: lr.abs(-x), lambda x: torch.abs(-x), [((3, 4), 0.5, 2)]),
    "exp": (lr.exp, torch.exp, [((3, 4), -2, 2)]),
    "log": (lr.log, torch.log, [((3, 4), 0.2, 3)]),
    "sqrt": (lr.sqrt, torch.sqrt, [((3, 4), 0.2, 3)]),
    "rsqrt": (lr.rsqrt, torch.rsqrt, [((3, 4), 0.2, 3)]),
    "relu": (lr.relu, torch.relu, [((4, 5), -2, 2)]),
    "sigmoid": (lr.sigmoid, torch.sigmoid, [((3, 4), -3, 3)]),
    "tanh": (lr.tanh, torch.tanh, [((3, 4), -2, 2)]),
    "add": (lambda x, y: x + y, lambda x, y: x + y, [((3, 4), -2, 2), ((4,), -2, 2)]),
    "add_alpha": (lambda x, y: lr.add(x, y, alpha=2.5), lambda x, y: torch.add(x, y, alpha=2.5),
                  [((3, 1), -2, 2), ((1, 4), -2, 2)]),
    "sub": (lambda x, y: x - y, lambda x, y: x - y, [((2, 3, 4), -2, 2), ((3, 1), -2, 2)]),
    "sub_alpha": (lambda x, y: lr.sub(x, y, alpha=-0.5), lambda x, y: torch.sub(x, y, alpha=-0.5),
                  [((3, 4), -2, 2), ((), -2, 2)]),
    "mul": (lambda x, y: x * y, lambda x, y: x * y, [((3, 4), -2, 2), ((3, 1), -2, 2)]),
    "div": (lambda x, y: x / y, lambda x, y: x / y, [((3, 4), -2, 2), ((4,), 0.5, 2)]),
    "pow": (lr.pow, torch.pow, [((3, 4), 0.5, 2), ((3, 4), -2, 2)]),
    "pow_broadcast": (lr.pow, torch.pow, [((3, 1), 0.5, 2), ((4,), -2, 2)]),
    "maximum": (lr.maximum, torch.maximum, [((3, 4), -2, 2), ((4,), -2, 2)]),
    "minimum": (lr.minimum, torch.minimum, [((3, 4), -2, 2), ((3, 1), -2, 2)]),
    "where": (lambda x, y: lr.where(x > 0, x, y), lambda x, y: torch.where(x > 0, x, y),
              [((3, 4), -2, 2), ((4,), -2, 2)]),
    "scalar_ops": (lambda x: (x * 2.5 - 1) / 3 + 0.5, lambda x: (x * 2.5 - 1) / 3 + 0.5, [((5,), -2, 2)]),
    "reflected_scalar_ops": (lambda x: 2 / x + 3 - x, lambda x: 2 / x + 3 - x, [((5,), 0.5, 2)]),
    "pow_scalar": (lambda x: x ** 3 + x ** 0.5, lambda x: x ** 3 + x ** 0.5, [((5,), 0.5, 2)]),
    "rpow_scalar": (lambda x: 2 ** x, lambda x: 2 ** x, [((5,), -1, 2)]),
    "sum": (lambda x: x.sum(), lambda x: x.sum(), [((3, 4), -2, 2)]),
    "sum_dims": (lambda x: x.sum((0, 2)), lambda x: x.sum((0, 2)), [((2, 3, 4), -2, 2)]),
    "sum_keepdim": (lambda x: x.sum(1, keepdim=True), lambda x: x.sum(1, keepdim=True), [((2, 3, 4), -2, 2)]),
    "mean": (lambda x: x.mean(), lambda x: x.mean(), [((3, 4), -2, 2)]),
    "mean_dim": (lambda x: x.mean(-1, keepdim=True), lambda x: x.mean(-1, keepdim=True), [((2, 3, 4), -2, 2)]),
    "amax": (lambda x: x.amax(1), lambda x: x.amax(1), [((3, 4), -2, 2)]),
    "amin": (lambda x: x.amin((0, 1), keepdim=True), lambda x: x.amin((0, 1), keepdim=True), [((2, 3, 4), -2, 2)]),
    "max_all": (lambda x: x.max(), lambda x: x.max(), [((3, 4), -2, 2)]),
    "matmul_2d": (lr.matmul, torch.matmul, [((3, 4), -1, 1), ((4, 5), -1, 1)]),
    "matmul_1d": (lr.matmul, torch.matmul, [((4,), -1, 1), ((4,), -1, 1)]),
    "matmul_mv": (lr.matmul, torch.matmul, [((3, 4), -1, 1), ((4,), -1, 1)]),
    "matmul_vm": (lr.matmul, torch.matmul, [((4,), -1, 1), ((4, 2), -1, 1)]),
    "matmul_batched": (lr.matmul, torch.matmul, [((2, 1, 3, 4), -1, 1), ((5, 4, 2), -1, 1)]),
    "reshape": (lambda x: x.reshape(4, 3), lambda x: x.reshape(4, 3), [((3, 4), -2, 2)]),
    "view": (lambda x: x.view(-1), lambda x: x.view(-1), [((3, 4), -2, 2)]),
    "transpose": (lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2), [((2, 3, 4), -2, 2)]),
    "permute": (lambda x: x.permute(1, 2, 0), lambda x: x.permute(1, 2, 0), [((2, 3, 4), -2, 2)]),
    "expand": (lambda x: x.expand(2, 3, 4), lambda x: x.expand(2, 3, 4), [((3, 1), -2, 2)]),
    "unsqueeze_squeeze": (lambda x: x.unsqueeze(1).squeeze(2), lambda x: x.unsqueeze(1).squeeze(2),
                          [((3, 1, 4), -2, 2)]),
    "flatten": (lambda x: x.flatten(1), lambda x: x.flatten(1), [((2, 3, 4), -2, 2)]),
    "t": (lambda x: x.t(), lambda x: x.t(), [((3, 4), -2, 2)]),
    "cast": (lambda x: x.to(lr.float32).to(lr.float64) * x, lambda x: x.to(torch.float32).to(torch.float64) * x,
             [((3, 4), -2, 2)]),
    "clone": (lambda x: x.clone() * x, lambda x: x.clone() * x, [((3,), -2, 2)]),
    "log_softmax": (lambda x: lr.log_softmax(x, 1), lambda x: torch.log_softmax(x, 1), [((3, 5), -3, 3)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), torch.nn.functional.linear,
               [((4, 3), -1, 1), ((2, 3), -1, 1), ((2,), -1, 1)]),
    "mlp_chain": (lambda x, w: lr.tanh(x @ w).sigmoid().sum(1), lambda x, w: torch.tanh(x @ w).sigmoid().sum(1),
                  [((4, 3), -1, 1), ((3, 5), -1, 1)]),
    # Ops along a dim, sorting, and the compositions real models use.
    "cumsum": (lambda x: x.cumsum(1), lambda x: x.cumsum(1), [((3, 5), -2, 2)]),
    "cumsum_dim0": (lambda x: lr.cumsum(x, 0), lambda x: torch.cumsum(x, 0), [((4, 2, 3), -2, 2)]),
    "cumprod": (lambda x: x.cumprod(1), lambda x: x.cumprod(1), [((3, 5), 0.5, 1.5)]),
    "cumprod_negative": (lambda x: lr.cumprod(-x, 0), lambda x: torch.cumprod(-x, 0), [((5, 2), 0.5, 1.5)]),
    "sort_values": (lambda x: x.sort(1).values * lr.arange(5).double(),
                    lambda x: x.sort(1).values * torch.arange(5).double(), [((3, 5), -2, 2)]),
    "topk_values": (lambda x: x.topk(2, 0, largest=False).values, lambda x: x.topk(2, 0, largest=False).values,
                    [((5, 3), -2, 2)]),
    "roll": (lambda x: x.roll((1, -2), (0, 1)), lambda x: x.roll((1, -2), (0, 1)), [((3, 4), -2, 2)]),
    "tile": (lambda x: x.tile((2, 1, 3)), lambda x: x.tile((2, 1, 3)), [((2, 3), -2, 2)]),
    "baddbmm": (lambda i, a, b: lr.baddbmm(i, a, b, beta=0.5, alpha=2), lambda i, a, b: torch.baddbmm(i, a, b, beta=0.5, alpha=2),
                [((1, 4), -1, 1), ((2, 3, 5), -1, 1), ((2, 5, 4), -1, 1)]),
    "einsum_contract": (lambda a, b: lr.einsum("bij,bjk->bik", a, b), lambda a, b: torch.einsum("bij,bjk->bik", a, b),
                        [((2, 3, 4), -1, 1), ((2, 4, 5), -1, 1)]),
    "einsum_diagonal_and_broadcast": (lambda a, b: lr.einsum("ii,...i->...", a, b),
                                      lambda a, b: torch.einsum("ii,...i->...", a, b),
                                      [((3, 3), -1, 1), ((2, 3), -1, 1)]),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                         lambda x, w, b: torch.nn.functional.batch_norm(x, None, None, w, b, training=True),
                         [((4, 3, 2, 2), -2, 2), ((3,), 0.5, 1.5), ((3,), -1, 1)]),
    "batch_norm_eval": (lambda x, w: F.batch_norm(x, lr.tensor([0.5, -1.0, 0.25], dtype=lr.float64),
                                                  lr.tensor([2.0, 0.5, 1.0], dtype=lr.float64), w, training=False),
                        lambda x, w: torch.nn.functional.batch_norm(x, torch.tensor([0.5, -1.0, 0.25], dtype=torch.float64),
                                                                    torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64), w,
                                                                    training=False),
                        [((4, 3), -2, 2), ((3,), 0.5, 1.5)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), lambda x, w, b: torch.nn.functional.group_norm(x, 2, w, b),
                   [((2, 4, 3), -2, 2), ((4,), 0.5, 1.5), ((4,), -1, 1)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
                            lambda x: torch.nn.functional.adaptive_avg_pool2d(x, (2, 3)), [((1, 2, 5, 7), -2, 2)]),
    "interpolate_bilinear": (lambda x: F.interpolate(x, size=(5, 3), mode="bilinear"),
                             lambda x: torch.nn.functional.interpolate(x, size=(5, 3), mode="bilinear"),
                             [((1, 2, 3, 4), -2, 2)]),
    "interpolate_nearest": (lambda x: F.interpolate(x, scale_factor=2), lambda x: torch.nn.functional.interpolate(x, scale_factor=2),
                            [((1, 2, 3, 2), -2, 2)]),
    "attention_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                         lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1) / 2.0).masked_fill(
                             ~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf")), -1) @ v,
                         [((2, 4, 4), -1, 1), ((2, 4, 4), -1, 1), ((2, 4, 3), -1, 1)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_torch_autograd(name, rng):
    f_lr, f_torch, specs = CASES[name]
    inputs = [pair(rng, shape, lr.float64, low, high, requires_grad=True) for shape, low, high in specs]
    xs = [x for x, _ in inputs]
    ts = [t for _, t in inputs]
    expect = f_torch(*ts)
    got = f_lr(*xs)
    assert_same(got, expect, rtol=1e-10, atol=1e-12, what=f"{name} forward")
    w, tw = pair(rng, tuple(expect.shape), lr.float64, -1, 1)
    (got * w).sum().backward()
    (expect * tw).sum().backward()
    for i, (x, t) in enumerate(inputs):
        assert x.grad is not None, f"{name}: input {i} got no gradient"
        assert_same(x.grad, t.grad, rtol=1e-9, atol=1e-12, what=f"{name} grad of input {i}")


def test_ties_split_the_gradient_like_torch():
    for f_lr, f_torch in [(lambda a, b: lr.maximum(a, b), torch.maximum), (lambda a, b: lr.minimum(a, b), torch.minimum),
                          (lambda a, b: (a + b).amax(), lambda a, b: (a + b).amax())]:
        x, y = lr.tensor([1.0, 2.0, 3.0], requires_grad=True), lr.tensor([1.0, 5.0, 3.0], requires_grad=True)
        t, u = torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor([1.0, 5.0, 3.0], requires_grad=True)
        f_lr(x, y).sum().backward()
        f_torch(t, u).sum().backward()
        assert_same(x.grad, t.grad)
        assert_same(y.grad, u.grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_gradients(reduction, rng):
    x, t = pair(rng, (6, 4), lr.float64, -2, 2, requires_grad=True)
    y, u = pair(rng, (6, 4), lr.float64, -2, 2)
    cases = [
        (lambda: F.mse_loss(x, y, reduction=reduction),
         lambda: torch.nn.functional.mse_loss(t, u, reduction=reduction)),
        (lambda: F.binary_cross_entropy_with_logits(x, (y > 0).double(), reduction=reduction),
         lambda: torch.nn.functional.binary_cross_entropy_with_logits(t, (u > 0).double(), reduction=reduction)),
    ]
    labels = rng.integers(0, 4, size=6)
    ignored = labels.copy()
    ignored[[1, 4]] = -100
    for smoothing in [0.0, 0.1]:
        for target in (labels, ignored):
            cases.append((lambda s=smoothing, y=target: F.cross_entropy(x, lr.tensor(y), reduction=reduction,
                                                                        label_smoothing=s),
                          lambda s=smoothing, y=target: torch.nn.functional.cross_entropy(
                              t, torch.tensor(y), reduction=reduction, label_smoothing=s)))
    for i, (f_lr, f_torch) in enumerate(cases):
        x.grad = None
        t.grad = None
        got, expect = f_lr(), f_torch()
        assert_same(got, expect, rtol=1e-10, atol=1e-12, what=f"loss {i} {reduction}")
        w, tw = pair(rng, tuple(expect.shape), lr.float64, 0.5, 1.5)
        (got * w).sum().backward()
        (expect * tw).sum().backward()
        assert_same(x.grad, t.grad, rtol=1e-9, atol=1e-12, what=f"loss {i} {reduction} grad")


def test_in_place_update_of_a_non_leaf_is_differentiable(rng):
    x, t = pair(rng, (4,), lr.float64, -1, 1, requires_grad=True)
    y = x * 2
    y.mul_(x)
    y.add_(x, alpha=3)
    u = t * 2
    u.mul_(t)
    u.add_(t, alpha=3)
    y.sum().backward()
    u.sum().backward()
    assert_same(x.grad, t.grad, rtol=1e-12)
