"""Cases of PyTorch/XLA's test/test_while_loop.py (pytorch/xla), written for lazyrt.

Each case runs the computation the upstream test runs, through lazyrt.while_loop, and checks it
against the same computation in PyTorch eager (a plain Python loop), as upstream checks
while_loop against its `_fake_while_loop`. Weights come from lazyrt's modules and are copied
into torch's, so both sides compute from the same values.

As upstream, the "linear outside loop, change weight and bias" cases (3 iterations, and 102
with a computed layer index) build a Linear(2, 2) inside the body and replace its weight and
bias with Parameters (requires_grad=False) made from the carried tensors, with grad disabled;
lazyrt's body does the same with lr.nn.Linear and lr.nn.Parameter. Not upstream: the Linear's
initialisation draws random numbers in each iteration, so these cases also check that the
generator continues after lazyrt.while_loop exactly as after the same body in an unrolled
Python loop of lazyrt ops under the same lr.manual_seed (torch's generator is not lazyrt's, so
for the draws that loop is the reference; PyTorch eager stays the reference for the values).

The MNIST body (two convolutions with max pooling and BatchNorm2d layers in eval mode, two
Linear layers, log_softmax) runs as upstream's; not upstream, it is also differentiated through
the while loop, its weights' gradients against torch autograd.

test_fori_loop_addition (skipped upstream, as torch_xla's fori_loop was unstable, and without an
assertion there) adds 1 to an int32 carry for i in [0, 50), through lazyrt.fori_loop, against
the same additions in a PyTorch eager loop. torch_xla's fori_loop takes the bounds as tensors
and a body of the carry alone, and returns a pair whose last item is the carry; lazyrt's takes
the bounds as numbers and a body of (i, carry), and returns the carry (JAX's signature), so the
upstream bound tensors are read as numbers and the body ignores i. Not upstream: the loop is
one node whatever the bounds, and the carry keeps its int32 dtype.
"""

import numpy as np
import pytest
import torch

import lazyrt as lr


def torch_linear_like(lin):
    t = torch.nn.Linear(lin.weight.shape[1], lin.weight.shape[0])
    with torch.no_grad():
        t.weight.copy_(torch.tensor(lin.weight.numpy()))
        t.bias.copy_(torch.tensor(lin.bias.numpy()))
    return t


def fake_while_loop(cond_fn, body_fn, operands):
    while cond_fn(*operands):
        operands = body_fn(*operands)
    return operands


def test_while_loop_addition():
    out = lr.while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, lr.add(x, 1)),
                        (lr.tensor(10), lr.tensor(3, dtype=lr.int32)))
    want = fake_while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, torch.add(x, 1)),
                           (torch.tensor(10), torch.tensor(3, dtype=torch.int32)))
    assert out[1].item() == want[1].item() == 13 and out[1].dtype is lr.int32
    assert out[0].item() == want[0].item() == 0


def test_while_loop_addition_nested():
    out = lr.while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, lr.add(lr.add(x, 1), 1)),
                        (lr.tensor(10), lr.tensor(2, dtype=lr.int32)))
    want = fake_while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, torch.add(torch.add(x, 1), 1)),
                           (torch.tensor(10), torch.tensor(2, dtype=torch.int32)))
    assert out[1].item() == want[1].item() == 22


def test_while_loop_simple_linear_inside_loop():
    lr.manual_seed(0)
    linear = lr.nn.Linear(2, 2)
    x0 = np.random.default_rng(0).standard_normal((2, 2)).astype(np.float32)
    with lr.no_grad():  # upstream: torch.set_grad_enabled(False); the weights require grad
        _, res = lr.while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, linear(x)),
                               (lr.tensor(10, dtype=lr.int32), lr.tensor(x0)))
    t = torch_linear_like(linear)
    with torch.no_grad():
        _, want = fake_while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, t(x)),
                                  (torch.tensor(10, dtype=torch.int32), torch.tensor(x0)))
    np.testing.assert_allclose(res.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


WEIGHTS = [[[5.1, 6.2], [7.3, 8.4]], [[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]]]
BIAS = [[[16.0, 17.0], [0.0, 0.0]], [[1.0, 2.0], [0.0, 0.0]], [[1.0, 2.0], [0.0, 0.0]]]


def layered_linear(weights, bias, iters, pick, lib, loop=None):
    """Upstream's 'linear outside loop, change weight and bias': x carries (weight, bias, value);
    each iteration builds a Linear(2, 2) inside the body, sets its weight and bias to Parameters
    made from the carried x[0] and x[1][0] (requires_grad=False), as upstream does, applies it to
    x[2], and loads the next layer with index pick(next_i). Grad is off, as upstream's
    torch.set_grad_enabled(False). loop: lazyrt.while_loop (the default for lazyrt) or the
    Python loop (fake_while_loop, always for torch). Returns the final x."""
    T = torch if lib is torch else lr
    nn = torch.nn if lib is torch else lr.nn
    tensor = torch.tensor if lib is torch else lr.tensor
    w, b = tensor(weights), tensor(bias)
    inputs = T.stack((w[0], b[0], tensor([[1.0, 2.0], [3.0, 4.0]])))

    def body(i, weights, bias, x):
        local_linear = nn.Linear(2, 2)
        local_linear.weight = nn.Parameter(data=x[0], requires_grad=False)
        local_linear.bias = nn.Parameter(data=x[1][0], requires_grad=False)
        next_i = i - 1
        k = pick(next_i)
        return next_i, weights, bias, T.stack((weights[k], bias[k], local_linear(x[2])))

    init = (tensor(iters, dtype=T.int32), w, b, inputs)
    cond = lambda i, *rest: i >= 0  # noqa: E731
    if loop is None:
        loop = fake_while_loop if lib is torch else lr.while_loop
    with (torch.no_grad() if lib is torch else lr.no_grad()):
        return loop(cond, body, init)[3]


def check_layered_linear(weights, bias, iters, pick_lazy, pick_torch, compare):
    """lazyrt.while_loop against PyTorch eager's Python loop (the values). Not upstream: each
    body builds a Linear, whose initialisation draws random numbers (discarded when its weight
    and bias are replaced); the generator must continue after the loop exactly as after the
    same body in an unrolled Python loop of lazyrt ops under the same lr.manual_seed (torch's
    generator is not lazyrt's, so that loop is the reference for the draws)."""
    lr.manual_seed(5)
    got = layered_linear(weights, bias, iters, pick_lazy, lr)
    after = lr.rand(4).numpy()
    lr.manual_seed(5)
    unrolled = layered_linear(weights, bias, iters, pick_lazy, lr, loop=fake_while_loop)
    unrolled_after = lr.rand(4).numpy()
    lr.manual_seed(5)
    no_loop = lr.rand(4).numpy()
    want = layered_linear(weights, bias, iters, pick_torch, torch)
    compare(got.numpy(), want.numpy())
    compare(unrolled.numpy(), want.numpy())
    np.testing.assert_array_equal(after, unrolled_after)
    assert not np.array_equal(after, no_loop), "the Linears built in the body drew nothing"
    return want


def test_while_loop_simple_linear_outside_loop_change_weight_bias():
    check_layered_linear(WEIGHTS, BIAS, 2, lambda n: -n - 1, lambda n: -n - 1,
                         lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6))


def test_while_loop_102_layers_with_a_computed_layer_index():
    # Upstream's 100-layer case: 102 iterations, layer index (next_i % 3), all layers equal.
    # The values overflow to inf in float32, in both libraries alike.
    weights = [[[1.0, 2.0], [3.0, 4.0]]] * 3
    bias = [[[1.0, 2.0], [0.0, 0.0]]] * 3

    want = check_layered_linear(weights, bias, 101, lambda n: -(n % 3) - 1, lambda n: -(n % 3) - 1,
                                np.testing.assert_array_equal)
    assert np.isinf(want.numpy()[2]).any(), "the case reaches float32's overflow, as upstream's does"


def mnist_layers(lib):
    """Upstream's MNIST layers: conv(1->10, 5x5, padding 2), conv(10->20, 5x5), BatchNorm2d(10),
    BatchNorm2d(20) (eval mode), Linear(500, 50), Linear(50, 10)."""
    layers = [lib.nn.Conv2d(1, 10, kernel_size=5, stride=1, padding=2), lib.nn.Conv2d(10, 20, kernel_size=5),
              lib.nn.BatchNorm2d(10), lib.nn.BatchNorm2d(20), lib.nn.Linear(500, 50), lib.nn.Linear(50, 10)]
    for layer in layers:
        layer.eval()
    return layers


def mnist_features(lib, layers, x):
    conv1, conv2, bn1, bn2, fc1, fc2 = layers
    F = torch.nn.functional if lib is torch else lr.nn.functional
    y = bn1(F.relu(F.max_pool2d(conv1(x), 2)))
    y = bn2(F.relu(F.max_pool2d(conv2(y), 2)))
    y = F.relu(fc1(y.flatten(1)))
    return F.log_softmax(fc2(y), dim=1)


def mnist_pair():
    lr.manual_seed(0)
    lazy = mnist_layers(lr)
    eager = mnist_layers(torch)
    with torch.no_grad():
        for a, b in zip(lazy, eager):
            b.load_state_dict({k: torch.tensor(np.array(v.numpy())) for k, v in a.state_dict().items()})
    rng = np.random.default_rng(1)
    return lazy, eager, rng.standard_normal((16, 1, 28, 28)).astype(np.float32), \
        rng.standard_normal((16, 10)).astype(np.float32)


def test_while_loop_mnist_body():
    lazy, eager, x_np, y_np = mnist_pair()
    with lr.no_grad():
        _, _, res = lr.while_loop(lambda i, x, y: i > 0,
                                  lambda i, x, y: (i - 1, x * 1.0, mnist_features(lr, lazy, x)),
                                  (lr.tensor(10), lr.tensor(x_np), lr.tensor(y_np)))
    with torch.no_grad():
        want = mnist_features(torch, eager, torch.tensor(x_np))
    # The body does not depend on the iteration: the result is one application, as upstream.
    np.testing.assert_allclose(res.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("snapshots", [0, 3])
def test_while_loop_mnist_body_gradients(snapshots):
    # Not upstream: the same loop differentiated. Only the last trip's y reaches the result, so
    # torch's reference is one application; x is carried (times 1) through all ten trips.
    lazy, eager, x_np, y_np = mnist_pair()
    x = lr.tensor(x_np, requires_grad=True)
    _, xs, res = lr.while_loop(lambda i, x, y: i > 0,
                               lambda i, x, y: (i - 1, x * 1.0, mnist_features(lr, lazy, x)),
                               (lr.tensor(10), x, lr.tensor(y_np)), snapshots=snapshots)
    tx = torch.tensor(x_np, requires_grad=True)
    want = mnist_features(torch, eager, tx)
    weights = torch.tensor(np.linspace(-1, 1, 160, dtype=np.float32).reshape(16, 10))
    ((res * lr.tensor(weights.numpy())).sum() + xs.sum()).backward()
    ((want * weights).sum() + tx.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)
    for a, b in zip(lazy, eager):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=f"{type(a).__name__}.{name}")


def test_fori_loop_addition():
    lower, upper = torch.tensor(0), torch.tensor(50)  # upstream's bounds
    init_val = 1

    def run(lower, upper):
        return lr.fori_loop(lower, upper, lambda i, x: lr.add(x, 1), lr.tensor(init_val, dtype=lr.int32))

    res = run(int(lower), int(upper))
    # One loop node: the pending graph is the same size for 5 trips as for 50.
    assert lr.debug.graph_node_count([res]) == lr.debug.graph_node_count([run(0, 5)]) < 20
    want = torch.tensor(init_val, dtype=torch.int32)
    for _ in range(upper - lower):
        want = torch.add(want, 1)
    assert res.dtype is lr.int32 and want.dtype == torch.int32
    assert res.item() == want.item() == 51
