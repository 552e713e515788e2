"""lazyrt.torch with what PyTorch 2 programs use: torch.func.functional_call, fused and
capturable optimizers, scaled_dot_product_attention (causal, masks, dropout). PyTorch eager is
the oracle: each step runs eagerly from the same state beside the compiled one."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyrt
import lazyrt.torch

RTOL, ATOL = 1e-5, 1e-6


def close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=what)


def test_functional_call_with_parameters_passed_in_matches_eager_and_is_never_stale():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    def loss_of(params, x):
        return torch.func.functional_call(model, params, (x,)).square().sum()

    compiled = lazyrt.torch.compile(loss_of)
    x = torch.randn(5, 4)
    close(compiled(params, x), loss_of(params, x), "first call")
    doubled = {k: v * 2 for k, v in params.items()}
    close(compiled(doubled, x), loss_of(doubled, x), "other parameters, same shapes")
    params["0.weight"].mul_(-0.5)  # changed in place
    close(compiled(params, x), loss_of(params, x), "parameters changed in place")
    assert compiled.captures == 1


def _twin_steps(m_eager, o_eager, m_lazy, o_lazy, loss_of):
    """An unmodified training step (loss, backward, step, zero_grad) of each model: the eager
    one, and the other through lazyrt.torch.compile."""
    def step_of(model, opt):
        def step(*args):
            loss = loss_of(model, *args)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step
    return step_of(m_eager, o_eager), lazyrt.torch.compile(step_of(m_lazy, o_lazy))


def _train(make_opt, make_eager_opt, steps=4):
    torch.manual_seed(1)
    m_eager = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = make_eager_opt(m_eager.parameters()), make_opt(m_lazy.parameters())

    eager, lazy = _twin_steps(m_eager, o_eager, m_lazy, o_lazy, lambda model, x, y: F.mse_loss(model(x), y))
    g = torch.Generator().manual_seed(2)
    for k in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        close(lazy(x, y), eager(x, y), f"loss at step {k}")
        for (name, p1), (_, p2) in zip(m_lazy.named_parameters(), m_eager.named_parameters()):
            close(p1, p2, f"{name} after step {k}")
            assert p1.grad is None and p2.grad is None  # zero_grad's default in PyTorch 2
        for p1, p2 in zip(m_lazy.parameters(), m_eager.parameters()):
            for key in o_eager.state[p2]:
                close(o_lazy.state[p1][key], o_eager.state[p2][key], f"state {key} after step {k}")
    assert lazy.captures == 1 and lazy.traces == 1


def test_adamw_fused_trains_as_eager_with_one_capture():
    make = lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True)  # noqa: E731
    _train(make, make)


def test_adam_capturable_is_accepted_and_trains_as_the_same_update_in_eager():
    # capturable=True asks for an update whose step count stays a tensor; eager refuses it on the
    # CPU, so the reference is the same optimizer without it (the same arithmetic).
    _train(lambda p: torch.optim.Adam(p, lr=1e-2, capturable=True), lambda p: torch.optim.Adam(p, lr=1e-2))


class _Attention(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)
        self.dropout = dropout

    def forward(self, x, mask=None, causal=False):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 4).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=causal)
        return self.out(y.transpose(1, 2).reshape(b, t, 8))


@pytest.mark.parametrize("kind", ["causal", "bool_mask", "float_mask", "none"])
def test_scaled_dot_product_attention_trains_as_eager_without_a_graph_break(kind):
    torch.manual_seed(3)
    t = 5
    mask = {"bool_mask": torch.rand(t, t) > 0.3, "float_mask": torch.randn(t, t)}.get(kind)
    if kind == "bool_mask":
        mask[:, 0] = True  # no row masked whole
    m_eager = _Attention()
    m_lazy = copy.deepcopy(m_eager)
    o_eager = torch.optim.SGD(m_eager.parameters(), lr=0.1, momentum=0.9)
    o_lazy = torch.optim.SGD(m_lazy.parameters(), lr=0.1, momentum=0.9)

    eager, lazy = _twin_steps(m_eager, o_eager, m_lazy, o_lazy,
                              lambda model, x: model(x, mask, kind == "causal").square().mean())
    breaks = lazyrt.metrics.counter("GraphBreak")
    g = torch.Generator().manual_seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", lazyrt.torch.GraphBreakWarning)
        for k in range(3):
            x = torch.randn(2, t, 8, generator=g)
            close(lazy(x), eager(x), f"loss at step {k}")
            for (name, p1), (_, p2) in zip(m_lazy.named_parameters(), m_eager.named_parameters()):
                close(p1, p2, f"{name} after step {k}")
    assert lazyrt.metrics.counter("GraphBreak") == breaks and lazy.captures == 1


def test_scaled_dot_product_attention_dropout_draws_a_new_mask_every_call():
    # The dropout mask comes from lazyrt's generator: not eager's values, so checked by what a
    # mask must do: change between calls, and leave the result unchanged in eval mode.
    torch.manual_seed(5)
    model = _Attention(dropout=0.5)
    compiled = lazyrt.torch.compile(lambda x: model(x))
    x = torch.randn(2, 6, 8)
    with torch.no_grad():
        first, second = compiled(x), compiled(x)
    assert first.shape == (2, 6, 8) and torch.isfinite(first).all()
    assert not torch.equal(first, second), "the same dropout mask twice"
    model.eval()
    with torch.no_grad():
        close(compiled(x), model(x), "eval mode: no dropout")


def test_an_argument_that_requires_grad_gets_eagers_gradient_and_later_calls_compile():
    # The capture writes back the gradients of the modules' parameters; an argument that
    # requires grad runs the call in eager (counted, warned once), so its .grad is eager's and
    # accumulates as there. Calls with arguments that do not require grad compile as usual.
    torch.manual_seed(6)
    lin = nn.Linear(3, 2)

    def step(w, x):
        loss = lin(w * x).square().sum()
        loss.backward()
        return loss

    compiled = lazyrt.torch.compile(step)
    w_lazy = torch.randn(3, requires_grad=True)
    w_eager = w_lazy.detach().clone().requires_grad_(True)
    x = torch.randn(4, 3)
    before = lazyrt.metrics.counter("EagerStep")
    with pytest.warns(lazyrt.torch.GraphBreakWarning, match="requires grad"):
        got = compiled(w_lazy, x)
    lin_grads = [p.grad.clone() for p in lin.parameters()]
    for p in lin.parameters():
        p.grad = None
    close(got, step(w_eager, x), "loss")
    close(w_lazy.grad, w_eager.grad, "the argument's gradient")
    for g, p in zip(lin_grads, lin.parameters()):
        close(g, p.grad, "the module's gradients")
    compiled(w_lazy, x)
    step(w_eager, x)
    close(w_lazy.grad, w_eager.grad, "accumulated over two calls")
    assert lazyrt.metrics.counter("EagerStep") == before + 2 and compiled.captures == 0
    for p in lin.parameters():
        p.grad = None
    plain = w_eager.detach()
    compiled(plain, x)
    assert compiled.captures == 1
