"""lazyrt.torch's convolutions beyond the 2-d direct one: 1-d convolutions and transposed 1-d
and 2-d ones (stride, padding, output_padding, dilation, groups, bias), forward and backward,
in captured steps and loop bodies; 3-d convolutions are graph breaks.

PyTorch eager is the oracle: the attribute grid compares the lowered aten.convolution and
aten.convolution_backward with eager's (float64, tight), and the models train through
lazyrt.torch.compile beside an eager copy from the same weights on the same batches, comparing
losses, parameters, gradients and optimizer.state_dict() after every step (float32, rtol 1e-5).
"""

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lazyrt
import lazyrt.metrics
import lazyrt.torch
from conftest import lowered_results, same_tree

RTOL, ATOL = 1e-5, 1e-6
STEPS = 4

# ---- the lowered ops against eager's, over a grid of attributes -------------------------------

CONV = {(1, False): F.conv1d, (2, False): F.conv2d, (1, True): F.conv_transpose1d, (2, True): F.conv_transpose2d}

# (spatial dims, transposed, input size, in, out, kernel, attributes); attributes are
# F.conv*'s keywords (output_padding only where transposed).
GRID = [
    (1, False, 11, 4, 6, 3, dict()),
    (1, False, 11, 4, 6, 3, dict(stride=2, padding=1, bias=False)),
    (1, False, 12, 4, 6, 4, dict(stride=3, padding=2, dilation=2, groups=2)),
    (1, False, 9, 6, 3, 1, dict(groups=3)),
    (1, True, 7, 4, 6, 3, dict()),
    (1, True, 7, 4, 6, 3, dict(stride=2, padding=1, output_padding=1)),
    (1, True, 6, 4, 6, 4, dict(stride=3, padding=2, output_padding=2, groups=2, bias=False)),
    (1, True, 6, 4, 2, 3, dict(stride=2, dilation=2, output_padding=1, groups=2)),
    (1, True, 6, 2, 4, 3, dict(stride=1, dilation=2, output_padding=1)),  # output_padding >= stride
    (2, True, (5, 6), 4, 6, 3, dict()),
    (2, True, (5, 6), 4, 6, 3, dict(stride=2, padding=1, output_padding=1)),
    (2, True, (5, 6), 4, 6, 3, dict(stride=2, padding=1, output_padding=1, groups=2, bias=False)),
    (2, True, (4, 5), 4, 4, (2, 3), dict(stride=(2, 1), padding=(0, 1), output_padding=(1, 0), groups=4)),
    (2, True, (4, 5), 2, 6, 3, dict(stride=(1, 3), padding=(2, 1), output_padding=(0, 2), dilation=(2, 1))),
    (2, True, (4, 4), 4, 6, 2, dict(stride=2, dilation=3, output_padding=2, groups=2)),  # output_padding >= stride
    (2, True, (3, 3), 6, 4, 3, dict(stride=3, padding=1, groups=2)),
    (2, False, (7, 8), 4, 6, 3, dict(stride=2, padding=1, dilation=2, groups=2)),  # the 2-d direct one, as before
]


def _grid_id(case):
    dims, transposed, size, cin, cout, k, kw = case
    return f"{dims}d{'T' if transposed else ''}-{cin}to{cout}-k{k}-" + "-".join(f"{a}{v}" for a, v in kw.items())


def _conv_inputs(case, dtype=torch.float64, seed=0):
    dims, transposed, size, cin, cout, k, kw = case
    kw = dict(kw)
    bias = kw.pop("bias", True)
    groups = kw.get("groups", 1)
    size = (size,) * dims if isinstance(size, int) else size
    k = (k,) * dims if isinstance(k, int) else k
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cin, *size, dtype=dtype, generator=g)
    wshape = (cin, cout // groups) + k if transposed else (cout, cin // groups) + k
    w = torch.randn(*wshape, dtype=dtype, generator=g)
    b = torch.randn(cout, dtype=dtype, generator=g) if bias else None
    return x, w, b, kw


@pytest.mark.parametrize("wrt", ["all", "weight", "input", "forward"])
@pytest.mark.parametrize("case", GRID, ids=_grid_id)
def test_lowered_convolution_and_its_backward_equal_eager(case, wrt):
    dims, transposed = case[0], case[1]
    conv = CONV[dims, transposed]
    x, w, b, kw = _conv_inputs(case)
    gy = torch.randn(conv(x, w, b, **kw).shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    leaves = {"all": (True, True), "weight": (False, True), "input": (True, False), "forward": (False, False)}[wrt]

    def fn(inputs):
        x, w, gy = inputs[:3]
        b = inputs[3] if len(inputs) > 3 else None
        x, w = x.detach().requires_grad_(leaves[0]), w.detach().requires_grad_(leaves[1])
        wanted = [t for t, on in zip((x, w), leaves) if on]
        if wanted and b is not None:
            b = b.detach().requires_grad_()
            wanted.append(b)
        with torch.enable_grad():
            y = conv(x, w, b, **kw)
            grads = torch.autograd.grad(y, wanted, gy) if wanted else []
        return [y.detach(), *grads]

    inputs = [x, w, gy] + ([b] if b is not None else [])
    want = fn(inputs)
    got = lowered_results(fn, inputs)
    assert len(got) == len(want)
    for k, (g, t) in enumerate(zip(got, want)):
        assert g.dtype == t.dtype and g.shape == t.shape, \
            f"result {k}: {g.dtype}{list(g.shape)} vs {t.dtype}{list(t.shape)}"
        torch.testing.assert_close(g, t, rtol=1e-12, atol=1e-12, msg=lambda m: f"result {k}: {m}")


def test_an_unbatched_1d_convolution_is_lowered():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 10, dtype=torch.float64, generator=g), torch.randn(5, 3, 3, dtype=torch.float64, generator=g)
    wt = torch.randn(3, 4, 3, dtype=torch.float64, generator=g)
    fn = lambda i: [F.conv1d(i[0], i[1], padding="same", dilation=2), F.conv_transpose1d(i[0], i[2], stride=2)]
    for got, want in zip(lowered_results(fn, [x, w, wt]), fn([x, w, wt])):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ---- models trained through lazyrt.torch.compile beside eager PyTorch --------------------------

OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=3e-3),
}


def conv1d_classifier():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(3, 8, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(8, 8, 3, padding=2, dilation=2, groups=2, bias=False), nn.Tanh(),
        nn.Flatten(), nn.Linear(8 * 8, 4))


def conv_transpose2d_decoder():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.ConvTranspose2d(6, 8, 3, stride=2, padding=1, output_padding=1, groups=2), nn.ReLU(),
        nn.ConvTranspose2d(8, 4, 3, stride=1, padding=1, groups=2, bias=False), nn.Tanh(),
        nn.ConvTranspose2d(4, 2, 2, stride=2, dilation=2, output_padding=1))


def conv1d_autoencoder():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(2, 6, 4, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose1d(6, 4, 4, stride=2, padding=1, groups=2), nn.Tanh(),
        nn.ConvTranspose1d(4, 2, 3, padding=1, bias=False))


def classifier_batches(g):
    return torch.randn(4, 3, 16, generator=g), torch.randint(0, 4, (4,), generator=g)


def decoder_batches(g):  # [4, 6, 4, 4] -> [4, 2, 18, 18]
    return torch.randn(4, 6, 4, 4, generator=g), torch.randn(4, 2, 18, 18, generator=g)


def autoencoder_batches(g):
    x = torch.randn(4, 2, 12, generator=g)
    return x, x


MODELS = {
    "conv1d": (conv1d_classifier, classifier_batches, nn.CrossEntropyLoss()),
    "conv_transpose2d": (conv_transpose2d_decoder, decoder_batches, nn.MSELoss()),
    "conv1d_conv_transpose1d": (conv1d_autoencoder, autoencoder_batches, nn.MSELoss()),
}


def close(a, b, what):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL, err_msg=what)


def same_training_state(m_lazy, o_lazy, m_eager, o_eager, what):
    for (name, p1), (_, p2) in zip(m_lazy.named_parameters(), m_eager.named_parameters()):
        close(p1.detach().numpy(), p2.detach().numpy(), f"{what} parameter {name}")
        assert (p1.grad is None) == (p2.grad is None), f"{what} {name}.grad: {p1.grad} vs {p2.grad}"
        if p1.grad is not None:
            close(p1.grad.numpy(), p2.grad.numpy(), f"{what} {name}.grad")
    same_tree(o_lazy.state_dict(), o_eager.state_dict(), f"{what} optimizer.state_dict()")


def step_of(model, opt, loss_fn, keep_grads=False):
    def step(x, y):  # an unmodified PyTorch training step
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if not keep_grads:
            opt.zero_grad()
        return loss
    return step


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_a_convolution_model_trains_as_in_eager_without_graph_breaks(model_name, opt_name):
    make_model, make_batch, loss_fn = MODELS[model_name]
    m_eager = make_model()
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = OPTIMIZERS[opt_name](m_eager.parameters()), OPTIMIZERS[opt_name](m_lazy.parameters())
    # The gradients stay after the step (no zero_grad), so they are compared as well.
    eager = step_of(m_eager, o_eager, loss_fn, keep_grads=True)
    lazy = lazyrt.torch.compile(step_of(m_lazy, o_lazy, loss_fn, keep_grads=True))
    g = torch.Generator().manual_seed(5)
    before = lazyrt.metrics.counter("GraphBreak")
    losses = []
    for k in range(STEPS):
        x, y = make_batch(g)
        with warnings.catch_warnings():
            warnings.simplefilter("error", lazyrt.torch.GraphBreakWarning)
            got = lazy(x, y)
        want = eager(x, y)
        close(got.item(), want.item(), f"loss at step {k}")
        losses.append(got.item())
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        for p in m_eager.parameters():  # the next step starts from zero gradients, in both
            p.grad.zero_()
        for p in m_lazy.parameters():
            p.grad.zero_()
    assert lazyrt.metrics.counter("GraphBreak") == before, "no op ran in eager"
    assert lazy.captures == 1 and lazy.traces == 1
    assert len(set(losses)) == len(losses), "the model trains: every step's loss differs"


def test_a_3d_convolution_is_a_graph_break_and_trains_as_in_eager():
    from lazyrt.torch._lower import _WARNED_BREAKS

    names = ["aten.convolution.default", "aten.convolution_backward.default"]
    _WARNED_BREAKS.difference_update(names)  # the warning is once per op and process

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv3d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 27, 3))

    m_eager = make()
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = OPTIMIZERS["adam"](m_eager.parameters()), OPTIMIZERS["adam"](m_lazy.parameters())
    loss_fn = nn.CrossEntropyLoss()
    eager = step_of(m_eager, o_eager, loss_fn)
    lazy = lazyrt.torch.compile(step_of(m_lazy, o_lazy, loss_fn))
    g = torch.Generator().manual_seed(6)
    before = lazyrt.metrics.counter("GraphBreak")
    for k in range(3):
        x, y = torch.randn(2, 2, 3, 3, 3, generator=g), torch.randint(0, 3, (2,), generator=g)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = lazy(x, y)
        breaks = [str(w.message) for w in caught if issubclass(w.category, lazyrt.torch.GraphBreakWarning)]
        if k == 0:
            assert len(breaks) == 2, breaks
            assert all(any(n in b and "3-d convolution" in b for b in breaks) for n in names), breaks
        else:
            assert not breaks
        close(got.item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        assert lazyrt.metrics.counter("GraphBreak") - before == 2 * (k + 1), "forward and backward, every step"
    assert lazy.captures == 1


def test_a_3d_convolution_in_a_loop_body_is_refused_naming_it():
    conv = nn.Conv3d(2, 2, 3, padding=1)
    refused = r"aten\.convolution\.default \(a 3-d convolution"
    with pytest.raises(lazyrt.torch.UnsupportedOperatorError, match=refused):
        lazyrt.torch.fori_loop(0, 2, lambda i, c: conv(c), torch.zeros(1, 2, 3, 3, 3))


def test_transposed_and_1d_convolutions_in_a_loop_body_match_the_eager_loop():
    torch.manual_seed(3)
    up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    down = nn.Conv2d(6, 4, 3, stride=2, padding=1)
    up1 = nn.ConvTranspose1d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2, bias=False)
    down1 = nn.Conv1d(4, 4, 2, stride=2)

    def body(i, carry):
        x, s = carry
        return torch.tanh(down(up(x))), torch.tanh(down1(up1(s)))

    init = (torch.randn(2, 4, 5, 5), torch.randn(2, 4, 7))
    got = lazyrt.torch.fori_loop(0, 3, body, init)
    want = init
    with torch.no_grad():
        for i in range(3):
            want = body(torch.tensor(i), want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
