"""Random ops in steps compiled by lazyrt.torch.compile draw from lazyrt's generator, whose
state every call reads and advances: dropout draws a new mask on every call, at the asked
rate, and the backward uses the mask the forward drew. Each check runs in a fresh process,
where the step's capture is the first use of lazyrt's generator (made then, inside the trace),
as it is in a training script; the oracle is PyTorch eager on the same mask."""

import os
import subprocess
import sys

import pytest

import lazyrt

_CHECK = """
import sys
import torch, lazyrt, lazyrt.torch

ZERO_GRAD_FIRST = sys.argv[1] == "first"
P = 0.5
torch.manual_seed(0)
pre, post = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
pre_e, post_e = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
pre_e.load_state_dict(pre.state_dict())
post_e.load_state_dict(post.state_dict())
params = list(pre.parameters()) + list(post.parameters())
opt = torch.optim.SGD(params, lr=0.05)
opt_e = torch.optim.SGD(list(pre_e.parameters()) + list(post_e.parameters()), lr=0.05)


@lazyrt.torch.compile
def step(x, y):
    if ZERO_GRAD_FIRST:
        opt.zero_grad()
    h = torch.nn.functional.dropout(pre(x), P, training=True)
    loss = torch.nn.functional.mse_loss(post(h), y)
    loss.backward()
    # (the modules' parameters, which the capture swaps for its inputs: not the list above)
    grads = [p.grad.clone() for m in (pre, post) for p in m.parameters()]
    opt.step()
    if not ZERO_GRAD_FIRST:
        opt.zero_grad()
    return h, grads


g = torch.Generator().manual_seed(1)
masks = []
for k in range(40):
    x, y = torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)
    dense = pre_e(x)  # eager's value before the dropout, with the same weights
    h, grads = step(x, y)
    mask = h != 0
    masks.append(mask)
    # Eager with the same mask: the kept values scaled by 1 / (1 - p), and the gradients of
    # both layers (the first one's through the dropout's backward, which must use this mask).
    h_e = dense * mask / (1 - P)
    torch.testing.assert_close(h, h_e.detach(), rtol=1e-4, atol=1e-4, msg=lambda m: f"call {k}: {m}")
    opt_e.zero_grad()
    torch.nn.functional.mse_loss(post_e(h_e), y).backward()
    grads_e = [p.grad for p in list(pre_e.parameters()) + list(post_e.parameters())]
    for got, want in zip(grads, grads_e):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"call {k}: {m}")
    opt_e.step()
    for p, p_e in zip(params, list(pre_e.parameters()) + list(post_e.parameters())):
        torch.testing.assert_close(p.detach(), p_e.detach(), rtol=1e-4, atol=1e-5, msg=lambda m: f"call {k}: {m}")

assert step.captures == 1, step.captures
for k in range(1, len(masks)):
    assert not torch.equal(masks[k], masks[k - 1]), f"call {k} drew the mask of call {k - 1}"
    # Independent draws: two calls' masks agree at about half of the places.
    agree = (masks[k] == masks[k - 1]).float().mean().item()
    assert 0.4 < agree < 0.6, f"calls {k - 1} and {k} agree at {agree:.3f} of the places"
all_masks = torch.stack(masks).float()
# 40 * 64 * 32 = 81920 draws: the drop rate within 0.01 (about 6 standard deviations) of p.
drop = 1 - all_masks.mean().item()
assert abs(drop - P) < 0.01, f"drop rate {drop:.4f}, asked for {P}"
# Every place is dropped at about the rate over the calls (no place kept or dropped always).
per_place = 1 - all_masks.mean(0)
assert 0.1 < per_place.min().item() and per_place.max().item() < 0.9, per_place
print("ok")
"""


@pytest.mark.parametrize("order", ["last", "first"], ids=["zero_grad_last", "zero_grad_first"])
def test_dropout_masks_change_every_call_and_backward_uses_them(order):
    package_dir = os.path.dirname(os.path.dirname(lazyrt.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_dir, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", _CHECK, order], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


_NATIVE = """
import lazyrt
z = lazyrt.zeros((3,))
s = lazyrt.compile_step(lambda x: x + lazyrt.rand((3,)), [z])
calls = [s(z).tolist() for _ in range(3)]
assert calls[0] != calls[1] and calls[1] != calls[2], calls
assert int(lazyrt._C.random_state()[1].item()) == 9, "the generator advances 3 numbers a call"
print("ok")
"""


def test_native_compile_step_advances_a_generator_its_trace_made():
    # lazyrt.compile_step whose trace is the process's first draw.
    package_dir = os.path.dirname(os.path.dirname(lazyrt.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_dir, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", _NATIVE], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_normal_draws_in_a_step_are_new_every_call_and_standard():
    # torch.randn, randn_like, Tensor.normal_ and torch.normal(mean, std) inside a compiled step:
    # lowered (no graph break), drawn anew on every call from lazyrt's generator, with the
    # asked mean and standard deviation; the noise carries gradients to the mean (a VAE's
    # reparameterization).
    import warnings

    import torch

    import lazyrt.metrics
    import lazyrt.torch

    torch.manual_seed(0)
    mu = torch.nn.Linear(3, 4000)
    opt = torch.optim.SGD(mu.parameters(), lr=0.0)

    @lazyrt.torch.compile
    def step(x):
        opt.zero_grad()
        m = mu(x)
        a = torch.randn(2, 4000)
        b = torch.randn_like(m)
        c = torch.empty(2, 4000).normal_(3.0, 0.5)
        d = torch.normal(m.detach(), 2.0)
        z = m + 0.1 * b
        z.sum().backward()
        opt.step()
        return a, b, c, d - m.detach(), mu.bias.grad.clone()

    x = torch.zeros(2, 3)
    breaks = lazyrt.metrics.counter("GraphBreak")
    with warnings.catch_warnings():
        warnings.simplefilter("error", lazyrt.torch.GraphBreakWarning)
        calls = [step(x) for _ in range(3)]
    assert lazyrt.metrics.counter("GraphBreak") == breaks and step.captures == 1
    for k, (mean, std) in enumerate([(0.0, 1.0), (0.0, 1.0), (3.0, 0.5), (0.0, 2.0)]):
        draws = [c[k] for c in calls]
        for a, b in zip(draws, draws[1:]):
            assert not torch.equal(a, b), f"draw {k} repeated across calls"
        allv = torch.cat([v.flatten() for v in draws])  # 24,000 values: mean within ~5 sigma
        assert abs(allv.mean().item() - mean) < 5 * std / allv.numel() ** 0.5 + 1e-6, (k, allv.mean().item())
        assert abs(allv.std().item() - std) < 0.03 * std, (k, allv.std().item())
    for c in calls:
        torch.testing.assert_close(c[4], torch.full((4000,), 2.0))  # d(sum(m + 0.1 b))/d bias, per row 1
