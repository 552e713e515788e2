"""lazyrt.torch: unmodified PyTorch training steps captured once and replayed by lazyrt.

PyTorch eager is the oracle: every test trains one copy of a model eagerly and another through
lazyrt.torch.compile from the same initial weights (copy.deepcopy before the optimizers are
made), on the same batches, and compares losses, parameters, gradients and
optimizer.state_dict() (float32, rtol 1e-5).
"""

import argparse
import copy
import types
import math
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lazyrt
import lazyrt.metrics
import lazyrt.torch
from conftest import REPO, close_to_scale, lowered_results, same_tree

RTOL, ATOL = 1e-5, 1e-6
STEPS = 5


def close(a, b, what):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL, err_msg=what)


def close_parameter(a, b, opt, what):
    """Parameters after optimizer steps. Adam's step divides the first moment by the root of
    the second plus eps, so where a gradient is a near-zero difference of larger terms, its
    last bits (which differ with the order a product sums in) move that element's step by a
    good part of lr. Such elements are few: at most 2% of a tensor may differ beyond the
    tolerance, each by less than half of lr; a stale or wrong step moves nearly every element
    by about lr."""
    a, b = np.asarray(a), np.asarray(b)
    adaptive = opt is not None and isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))
    if not adaptive:
        close(a, b, what)
        return
    lr = max(g["lr"] for g in opt.param_groups)
    off = ~np.isclose(a, b, rtol=RTOL, atol=ATOL)
    assert off.sum() <= int(0.02 * a.size), f"{what}: {off.sum()} of {a.size} elements differ: {a[off]} vs {b[off]}"
    np.testing.assert_allclose(a, b, rtol=0, atol=0.5 * lr, err_msg=what)


def same_training_state(m1, o1, m2, o2, what=""):
    for (name, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        close_parameter(p1.detach().numpy(), p2.detach().numpy(), o2, f"{what} parameter {name}")
        assert (p1.grad is None) == (p2.grad is None), f"{what} {name}.grad: {p1.grad} vs {p2.grad}"
        if p1.grad is not None:
            close(p1.grad.numpy(), p2.grad.numpy(), f"{what} {name}.grad")
    for (name, b1), (_, b2) in zip(m1.named_buffers(), m2.named_buffers()):
        close(b1.numpy(), b2.numpy(), f"{what} buffer {name}")
    if o1 is not None:  # momentum buffers sum gradients: their small elements carry that rounding
        same_tree(o1.state_dict(), o2.state_dict(), f"{what} optimizer.state_dict()", close=close_to_scale)


def mlp(act, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), act, nn.Linear(16, 16), act, nn.Linear(16, 4))


def batches(loss, n=STEPS, batch=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(batch, 6, generator=g) for _ in range(n)]
    if loss == "mse":
        return [(x, torch.randn(batch, 4, generator=g)) for x in xs]
    return [(x, torch.randint(0, 4, (batch,), generator=g)) for x in xs]


def standard_step(model, opt, loss_fn, set_to_none=True, zero_grad_first=False):
    """forward, backward, step, zero_grad (PyTorch 2's default sets the gradients to None;
    set_to_none=False keeps them as zeros, as a step that reuses gradient memory does);
    zero_grad_first: zero_grad before the forward instead, so the step leaves its gradients."""
    def step(x, y):
        if zero_grad_first:
            opt.zero_grad(set_to_none=set_to_none)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if not zero_grad_first:
            opt.zero_grad(set_to_none=set_to_none)
        return loss
    return step


def twins(make_model, make_opt):
    """An eager model/optimizer and a copy of the model (deep-copied before any optimizer
    exists) with its own optimizer."""
    m_eager = make_model()
    m_lazy = copy.deepcopy(m_eager)
    return m_eager, make_opt(m_eager.parameters()), m_lazy, make_opt(m_lazy.parameters())


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_wd_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-2, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_maximize": lambda p: torch.optim.AdamW(p, lr=1e-2, maximize=True),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
}
MODELS = {  # activation, loss
    "relu_mse": (nn.ReLU, "mse"),
    "gelu_ce": (nn.GELU, "ce"),
    "tanh_ce": (nn.Tanh, "ce"),
    "gelu_tanh_mse": (lambda: nn.GELU(approximate="tanh"), "mse"),
}
LOSSES = {"mse": nn.MSELoss, "ce": nn.CrossEntropyLoss}
CASES = [(o, m) for o in OPTIMIZERS for m in MODELS if (o == "adamw" or m in ("relu_mse", "gelu_ce"))]


@pytest.mark.parametrize("opt_name,model_name", CASES)
def test_training_matches_eager_with_one_capture(opt_name, model_name):
    act, loss = MODELS[model_name]
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(act()), OPTIMIZERS[opt_name])
    loss_fn = LOSSES[loss]()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    losses = []
    for k, (x, y) in enumerate(batches(loss)):
        got, want = step(x, y), eager(x, y)
        assert isinstance(got, torch.Tensor) and got.shape == () and got.dtype == torch.float32
        close(got.item(), want.item(), f"loss at step {k}")
        losses.append(got.item())
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 1 and step.traces == 1  # one capture, lowered and traced by lazyrt once
    assert len(set(losses)) == STEPS


def test_seed_program_linear_adamw_replayed_three_times():
    # The seed program: Linear(5, 3) + AdamW, one step captured and replayed three times.
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    eager_model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eager_optimizer = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    x = torch.randn(10, 5)

    def train_step(x):  # model and optimizer are found in the closure
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def eager_step(x):
        loss = eager_model(x).sum()
        loss.backward()
        eager_optimizer.step()
        eager_optimizer.zero_grad()
        return loss

    step = lazyrt.torch.compile(train_step)
    first = step(x)  # the capture
    replayed = [step(x).item() for _ in range(3)]
    expected = [eager_step(x).item() for _ in range(4)]
    close(first.item(), expected[0], "captured step's loss")
    assert len(set(replayed)) == 3, "losses change from replay to replay"
    close(replayed, expected[1:], "replayed losses")
    close(model.weight.detach().numpy(), eager_model.weight.detach().numpy(), "model.weight")
    same_training_state(model, optimizer, eager_model, eager_optimizer)
    assert step.captures == 1


def test_seed_example_script():
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(lazyrt.__file__))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run([sys.executable, os.path.join(REPO, "examples", "seed", "torch_cached_step.py")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout

    def value(label):
        m = re.search(rf"^{re.escape(label)}: (.*)$", out, re.MULTILINE)
        assert m, f"no '{label}' line in:\n{out}"
        return m.group(1)

    replayed = [float(value(f"replay {i}").split()[1]) for i in (1, 2, 3)]
    eager = [float(value(f"eager {i}").split()[1]) for i in (1, 2, 3)]
    assert len(set(replayed)) == 3
    close(replayed, eager, "example's losses")
    assert value("captures") == "1"
    assert value("losses equal eager's") == "True"
    assert value("weights equal eager's") == "True"


def test_large_write_backs_land_in_the_users_tensors():
    # A 300 x 300 weight and its momentum among small ones: every value lands in the user's own
    # tensors, in place, equal to eager's.
    def make():
        torch.manual_seed(4)
        return nn.Sequential(nn.Linear(6, 300), nn.ReLU(), nn.Linear(300, 300), nn.ReLU(), nn.Linear(300, 4))
    m_eager, o_eager, m_lazy, o_lazy = twins(make, OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn))
    big = m_lazy[2].weight
    place, version = big.data_ptr(), big._version
    for i, (x, y) in enumerate(batches("mse", n=3, batch=8, seed=21)):
        close(lazy(x, y).item(), eager(x, y).item(), f"loss {i}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {i}")
    assert big.data_ptr() == place and big._version > version
    assert o_lazy.state[big]["momentum_buffer"].numel() == 90000
    assert lazy.traces == 1


class _AtenLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops PyTorch runs while it is active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _written_tensors(model, opt):
    out = {}
    for name, p in model.named_parameters():
        out[name] = p
        out[name + ".grad"] = p.grad
        for k, v in opt.state[p].items():
            if isinstance(v, torch.Tensor):
                out[f"{name}.{k}"] = v
    return out


@pytest.mark.parametrize("opt_name", ["adamw", "sgd_momentum", "adam_foreach"])
def test_replays_write_into_the_users_memory_without_a_copy(opt_name):
    # After the first call, every parameter, gradient and optimizer state tensor stays where it
    # is (the same tensor, the same address) and a replay writes its new value there itself:
    # PyTorch runs no copy_ (in the same batch tensors as the call before, no aten op at all: the
    # loss comes back as a view of lazyrt's result), and each tensor's version counter moves on,
    # as eager's in-place updates move it.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.GELU(), seed=5), OPTIMIZERS[opt_name])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn, set_to_none=False)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn, set_to_none=False))
    data = batches("mse", n=10, seed=7)
    fast = lazyrt.metrics.counter("TorchFastCall")
    close(lazy(*data[0]).item(), eager(*data[0]).item(), "loss 0")
    before = _written_tensors(m_lazy, o_lazy)
    places = {k: t.data_ptr() for k, t in before.items()}
    # The batches arrive in new tensors, or in the same two tensors again (as from a reused
    # loader buffer): the second call in the same tensors hands nothing over at all.
    xb, yb = torch.empty_like(data[0][0]), torch.empty_like(data[0][1])
    kept = []  # every call's returned loss, read only at the end: later calls must not change it
    for i in range(1, len(data)):
        versions = {k: t._version for k, t in before.items()}
        x, y = data[i]
        if i % 3 == 1:
            with _AtenLog() as log:
                loss = lazy(x.clone(), y.clone())
            assert "aten.copy_" not in log.ops, f"call {i} ran {log.ops}"
        else:
            xb.copy_(x)
            yb.copy_(y)
            with _AtenLog() as log:
                loss = lazy(xb, yb)
            if i % 3 == 0:
                assert log.ops == [], f"call {i} ran {log.ops}"
        kept.append((loss, eager(x, y).item()))
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {i}")
        now = _written_tensors(m_lazy, o_lazy)
        for k, t in now.items():
            assert t is before[k] and t.data_ptr() == places[k], f"{k} moved at call {i}"
            assert t._version > versions[k], f"{k}: version not bumped at call {i}"
    for i, (loss, want) in enumerate(kept, 1):
        close(loss.item(), want, f"loss {i}, read after the last call")
    assert lazy.captures == 1 and lazy.traces == 1
    # The first call captures and the second finds gradients and state that did not exist
    # before: both take the Python path; every later call runs whole in C++ (FastCall).
    assert lazyrt.metrics.counter("TorchFastCall") - fast == len(data) - 2


class _Remembers(nn.Module):
    """Keeps its last hidden activations as an attribute (a tensor the step sets on a module)
    and the last targets in a buffer; `offset` is a buffer the step below sets as a gradient (a
    write-back whose value is an input as it was before the call)."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(6, 8), nn.Linear(8, 4)
        self.register_buffer("targets", torch.zeros(8, 4))
        self.register_buffer("offset", torch.full((4,), 0.5))
        self.seen = None

    def forward(self, x):
        h = torch.tanh(self.hidden(x))
        self.seen = h.detach()
        return self.out(h)


@pytest.mark.parametrize("kind", ["side attribute and input as written", "graph break"])
def test_calls_of_every_plan_run_whole_in_the_executor(kind):
    # Every call whose guard holds runs in C++ (_torch_C.Call): also those that set tensors on
    # modules, write back a value that is an input as it was before the call, or run pieces
    # around a graph break; each as eager leaves it.
    make = _Remembers if kind != "graph break" else DetHead
    m_eager, o_eager, m_lazy, o_lazy = twins(make, OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()

    def stepper(model, opt):
        def step(x, y):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if kind != "graph break":
                model.targets.copy_(y)
                model.out.bias.grad = model.offset
            return loss
        return step

    eager, lazy = stepper(m_eager, o_eager), lazyrt.torch.compile(stepper(m_lazy, o_lazy))
    data = batches("mse", n=6, seed=3)
    fast = lazyrt.metrics.counter("TorchFastCall")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lazyrt.torch.GraphBreakWarning)
        for k, (x, y) in enumerate(data):
            close(lazy(x, y).item(), eager(x, y).item(), f"loss at step {k}")
            same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
            if kind != "graph break":
                close(m_lazy.seen.numpy(), m_eager.seen.numpy(), f"the attribute set at step {k}")
                assert m_lazy.seen is not m_eager.seen
    assert lazy.captures == 1
    assert lazyrt.metrics.counter("TorchFastCall") - fast == len(data) - 2, "every call after the second"


def test_results_that_pass_an_input_on_are_tensors_of_their_own():
    # lazyrt returns an input's own memory for a value that only passes it on (x * 1, x + 0, a
    # clone of x), and one buffer for two equal values computed once; eager's results are new
    # tensors. Returned as views of those buffers, they changed when the caller then wrote the
    # argument (or the step its parameter); a clone of an argument as a result failed to
    # compile.
    torch.manual_seed(0)
    m_eager = nn.Linear(3, 2)
    m_lazy = copy.deepcopy(m_eager)

    def stepper(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            return loss, x * 1, x.clone(), x + 0, x * 2, x * 2, m.weight * 1
        return step

    eager, lazy = stepper(m_eager), lazyrt.torch.compile(stepper(m_lazy))
    for k in range(4):
        x = torch.randn(4, 3)
        got, want = lazy(x), eager(x.clone())
        for g, w in zip(got, want):
            close(g.detach().numpy(), w.detach().numpy(), f"call {k}")
        kept = [g.clone() for g in got]
        x.add_(100.0)  # the caller writes its argument; the next call writes the weight
        spans = sorted((g.data_ptr(), g.data_ptr() + g.numel() * g.element_size()) for g in got[1:])
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"call {k}: results share memory"
        assert all(x.data_ptr() + x.numel() * 4 <= a or b <= x.data_ptr() for a, b in spans), f"call {k}"
        z = torch.randn(4, 3)
        lazy(z)
        eager(z.clone())
        for j, (g, before) in enumerate(zip(got, kept)):
            assert torch.equal(g, before), f"call {k}: result {j} changed after the call"


def _heap_in_use():
    """Bytes the C heap has handed out and not taken back (glibc mallinfo2): torch's CPU
    tensors and lazyrt's buffers, counted exactly."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def test_the_first_steps_zero_gradients_are_let_go_once_the_gradients_exist():
    # A fresh model's first step has no gradients: the capture stands zeros in for them, so
    # that one graph serves the first step and the later ones. Once the step has made the
    # gradients, those zeros must not stay held: two steps of a model whose gradients were
    # missing hold as much memory as two steps of the same model whose gradients existed as
    # zeros from the start. The stand-ins, all views of one buffer, are no aliasing either:
    # every call runs in lazyrt, none in eager.
    def run(grads_first):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(2048, 2048), nn.Tanh(), nn.Linear(2048, 2048), nn.Linear(2048, 8))
        m_eager = copy.deepcopy(model)
        opt, o_eager = torch.optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(m_eager.parameters(), lr=0.05)
        eager = standard_step(m_eager, o_eager, nn.MSELoss())
        before = _heap_in_use()
        if grads_first:
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        step = lazyrt.torch.compile(standard_step(model, opt, nn.MSELoss()))
        for k, (x, y) in enumerate([(torch.randn(4, 2048), torch.randn(4, 8)) for _ in range(3)]):
            close(step(x, y).item(), eager(x, y).item(), f"loss {k}")
        same_training_state(model, opt, m_eager, o_eager, "after 3 steps:")
        return _heap_in_use() - before, sum(p.numel() * 4 for p in model.parameters())

    run(True)  # the first capture in this process imports what capturing needs
    eager_steps = lazyrt.metrics.counter("EagerStep")
    held_missing, grad_bytes = run(False)
    held_present, _ = run(True)
    assert lazyrt.metrics.counter("EagerStep") == eager_steps
    assert held_missing < held_present + grad_bytes / 4, (held_missing, held_present, grad_bytes)


def test_first_step_gradients_that_share_one_buffer_each_get_memory_of_their_own():
    # A fresh model whose step ends with zero_grad(): the compiled step's new gradients are
    # zeros, one buffer per shape, which the parameters of that shape share. Each parameter's
    # gradient must still be a tensor of its own (one of them is given the shared buffer, the
    # others copies): distinct memory, zeros, unchanged by a write into another, and later
    # steps match eager's.
    m_eager, o_eager, m_lazy, o_lazy = twins(
        lambda: (torch.manual_seed(8), nn.Sequential(nn.Linear(6, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(),
                                                     nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 4)))[1],
        OPTIMIZERS["sgd_momentum"])
    eager = standard_step(m_eager, o_eager, nn.MSELoss(), set_to_none=False)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, nn.MSELoss(), set_to_none=False))
    data = batches("mse", n=4, seed=9)
    close(lazy(*data[0]).item(), eager(*data[0]).item(), "loss 0")
    grads = [p.grad for p in m_lazy.parameters()]
    assert all(g is not None and not g.any() for g in grads)
    assert len({g.data_ptr() for g in grads}) == len(grads), "gradients share memory"
    for i, g in enumerate(grads):
        g.add_(float(i + 1))
        assert all(not h.any() for h in grads[i + 1:]), f"writing gradient {i} changed another"
        g.zero_()
    for k in range(1, len(data)):
        close(lazy(*data[k]).item(), eager(*data[k]).item(), f"loss {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {k}")


def test_a_batch_in_a_parameters_memory_runs_in_eager_on_the_fast_path_too():
    # After calls of the fast kind, a batch that is a view of a weight's memory (the step
    # writes that weight while it reads the batch): the call runs in eager, as the Python path
    # runs it, with eager's values; the next ordinary batch goes back to the fast path.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.Tanh(), seed=12), OPTIMIZERS["adamw"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn))
    data = batches("mse", n=8, seed=13)
    eager_steps, fast = lazyrt.metrics.counter("EagerStep"), lazyrt.metrics.counter("TorchFastCall")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (x, y) in enumerate(data):
            if i == 5:  # rows of the first layer's weight [16, 6]: an [8, 6] batch
                x_lazy, x_eager = m_lazy[0].weight.detach()[:8], m_eager[0].weight.detach()[:8]
                close(x_lazy, x_eager, "the weight rows")
            else:
                x_lazy = x_eager = x
            close(lazy(x_lazy, y).item(), eager(x_eager, y).item(), f"loss {i}")
            same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {i}")
    assert lazyrt.metrics.counter("EagerStep") - eager_steps == 1
    assert lazyrt.metrics.counter("TorchFastCall") - fast == len(data) - 3
    assert len([w for w in caught if "share memory" in str(w.message)]) == 1


@pytest.mark.parametrize("model", ["mlp", "graph break"])
def test_calls_from_several_threads_take_turns(model):
    # One compiled step called from three threads at once (the replay runs without the GIL):
    # calls take turns, each a whole step with its write-backs (with a graph break, every
    # update is written after the step). With the same batch every step is the same function
    # of the state, so after 3 x 20 calls the state is eager's after 60 steps.
    import threading
    make = (lambda: mlp(nn.Tanh(), seed=14)) if model == "mlp" else DetHead
    m_eager, o_eager, m_lazy, o_lazy = twins(make, OPTIMIZERS["adamw"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn, set_to_none=model == "mlp")
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn, set_to_none=model == "mlp"))
    warnings.simplefilter("ignore", lazyrt.torch.GraphBreakWarning)
    (x, y), = batches("mse", n=1, batch=512, seed=15)
    lazy(x, y)
    eager(x, y)
    errors = []

    def worker():
        try:
            for _ in range(20):
                lazy(x.clone(), y.clone())
        except BaseException as e:  # noqa: B902 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for _ in range(60):
        eager(x, y)
    same_training_state(m_lazy, o_lazy, m_eager, o_eager, "after 60 threaded steps")
    assert o_lazy.state[next(m_lazy.parameters())]["step"].item() == 61


_CHANGES = ("new batch", "same buffers", "lr", "rebind weight", "relaid weight", "load state", "grads to none",
            "eval and back", "weight decay")


@pytest.mark.parametrize("seed", range(8))
def test_random_changes_between_calls_give_eager_values(seed):
    # Between calls, random changes a training loop makes (new batch tensors or the same
    # buffers refilled, a new learning rate, a weight rebound to a new tensor or to a
    # non-contiguous one, the optimizer's state loaded, gradients set to None, eval() and back,
    # a hyperparameter): each call, fast or not, must leave eager's values and return eager's
    # loss. Both paths are seen (the counters move).
    rng = np.random.default_rng(seed)
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.GELU(), seed=20 + seed), OPTIMIZERS["adamw"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn))
    data = batches("mse", n=14, seed=30 + seed)
    xb, yb = torch.empty_like(data[0][0]), torch.empty_like(data[0][1])
    fast = lazyrt.metrics.counter("TorchFastCall")
    done = []
    for i, (x, y) in enumerate(data):
        change = _CHANGES[rng.integers(len(_CHANGES))] if i > 2 else "new batch"
        done.append(change)
        args = (x, y)
        if change == "same buffers":
            xb.copy_(x)
            yb.copy_(y)
            args = (xb, yb)
        elif change == "lr":
            lr = float(rng.uniform(1e-4, 1e-2))
            for o in (o_eager, o_lazy):
                o.param_groups[0]["lr"] = lr
        elif change == "rebind weight":
            for m in (m_eager, m_lazy):
                m[2].weight.data = m[2].weight.data.clone()
        elif change == "relaid weight":
            for m in (m_eager, m_lazy):
                m[2].weight.data = m[2].weight.data.t().contiguous().t()
        elif change == "load state":
            o_lazy.load_state_dict(copy.deepcopy(o_eager.state_dict()))
        elif change == "grads to none":
            for o in (o_eager, o_lazy):
                o.zero_grad(set_to_none=True)
        elif change == "eval and back":
            for m in (m_eager, m_lazy):
                m.eval()
                m.train()
        elif change == "weight decay":
            decay = float(rng.choice([0.0, 1e-2]))
            for o in (o_eager, o_lazy):
                o.param_groups[0]["weight_decay"] = decay
        close(lazy(*args).item(), eager(x, y).item(), f"loss {i} after {done}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {i} after {done}")
    assert lazyrt.metrics.counter("TorchFastCall") - fast > 0, done


def test_a_graph_recorded_before_a_step_refuses_backward_as_in_eager():
    # The step changes the weights in place: autograd refuses a graph that saved them before,
    # in eager and after a compiled step alike.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.Tanh(), seed=6), OPTIMIZERS["sgd"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn))
    (x, y), (x2, y2) = batches("mse", n=2, seed=8)
    lazy(x, y)
    eager(x, y)
    for model, step in ((m_eager, eager), (m_lazy, lazy)):
        out = model(x2).sum()
        step(x, y)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward()


class _SharedStorage(nn.Module):
    """Two weights and two biases that are views into one flat storage each; with `overlap`,
    b2 starts on the last two values of b1."""

    def __init__(self, seed, overlap):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        flat_w = torch.randn(4 * 6 + 6 * 3, generator=g) * 0.3
        flat_b = torch.randn(6 + 3, generator=g) * 0.1
        self.w1 = nn.Parameter(flat_w[:24].view(6, 4))
        self.w2 = nn.Parameter(flat_w[24:].view(3, 6))
        self.b1 = nn.Parameter(flat_b[:6])
        self.b2 = nn.Parameter(flat_b[4:7] if overlap else flat_b[6:9])

    def forward(self, x):
        return torch.tanh(x @ self.w1.t() + self.b1) @ self.w2.t() + self.b2


@pytest.mark.parametrize("overlap", [False, True])
def test_parameters_that_share_memory_are_updated_as_in_eager(overlap):
    # w1 and w2 are disjoint slices of one storage: written in place like any parameter. b1
    # and b2 overlap (with overlap): eager's second update starts from the first one's result
    # where they overlap, which a capture of separate values cannot express: those calls run
    # in eager, with one warning, counted as EagerStep. Either way the values are eager's.
    m_eager, m_lazy = _SharedStorage(3, overlap), _SharedStorage(3, overlap)
    o_eager = torch.optim.SGD(m_eager.parameters(), lr=0.1, momentum=0.9)
    o_lazy = torch.optim.SGD(m_lazy.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn))
    eager_steps = lazyrt.metrics.counter("EagerStep")
    place = m_lazy.w2.data_ptr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (x, y) in enumerate(batches("mse", n=4, seed=9)):
            x, y = x[:, :4], y[:, :3]
            close(lazy(x, y).item(), eager(x, y).item(), f"loss {i}")
            same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {i}")
    shared = [w for w in caught if "share memory" in str(w.message)]
    assert len(shared) == (1 if overlap else 0), [str(w.message) for w in caught]
    assert lazyrt.metrics.counter("EagerStep") - eager_steps == (4 if overlap else 0)
    assert m_lazy.w2.data_ptr() == place


class _Swapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("a", torch.tensor([1.0, 2.0, 3.0]))
        self.register_buffer("b", torch.tensor([-4.0, 5.0, -6.0]))

    def forward(self, x):
        a_new, b_new = self.b * 1, self.a * 1
        self.a.copy_(a_new)
        self.b.copy_(b_new)
        return self.lin(x + self.a)


def test_buffers_swapped_in_place_through_identities_end_swapped():
    # Each new value is the other buffer's old value (the compiler may reduce b * 1 to b
    # itself): writing one in place must not change what the other reads.
    torch.manual_seed(2)
    m_eager = _Swapper()
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = OPTIMIZERS["sgd"](m_eager.parameters()), OPTIMIZERS["sgd"](m_lazy.parameters())
    eager = standard_step(m_eager, o_eager, nn.MSELoss())
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, nn.MSELoss()))
    for i, (x, y) in enumerate(batches("mse", n=4, seed=10)):
        x, y = x[:, :3], y[:, :3]
        close(lazy(x, y).item(), eager(x, y).item(), f"loss {i}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {i}")
        np.testing.assert_array_equal(m_lazy.a.numpy(), m_eager.a.numpy())


def test_batch_size_change_recaptures_and_returning_reuses():
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), OPTIMIZERS["adamw"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    captures = []
    for k, batch in enumerate([8, 8, 5, 5, 8]):
        (x, y), = batches("mse", n=1, batch=batch, seed=10 + k)
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k} (batch {batch})")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        captures.append(step.captures)
    assert captures == [1, 1, 2, 2, 2]


def test_lr_schedule_changes_lr_without_recapture():
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.Tanh()), OPTIMIZERS["sgd_momentum"])
    s_eager = torch.optim.lr_scheduler.StepLR(o_eager, step_size=2, gamma=0.1)
    s_lazy = torch.optim.lr_scheduler.StepLR(o_lazy, step_size=2, gamma=0.1)
    loss_fn = nn.CrossEntropyLoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    lrs = []
    for k, (x, y) in enumerate(batches("ce", n=6)):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        lrs.append(o_lazy.param_groups[0]["lr"])
        s_eager.step()
        s_lazy.step()
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    np.testing.assert_allclose(lrs, [0.05, 0.05, 0.005, 0.005, 0.0005, 0.0005])
    assert step.captures == 1


def test_adam_lr_changed_by_hand_no_recapture():
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), OPTIMIZERS["adam"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse")):
        for o in (o_eager, o_lazy):
            o.param_groups[0]["lr"] = 1e-2 / (k + 1)
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 1


def test_hyperparameter_change_recaptures():
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    captures = []
    for k, (x, y) in enumerate(batches("mse")):
        if k == 2:
            for o in (o_eager, o_lazy):
                o.param_groups[0]["momentum"] = 0.5
                o.param_groups[0]["weight_decay"] = 0.1
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        captures.append(step.captures)
    assert captures == [1, 1, 2, 2, 2]


class TrainingDependent(nn.Module):
    """Scales its input by 2 in training and by 0.5 in eval (as a stand-in for dropout-like
    layers): train() / eval() must change the captured graph."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x):
        return self.lin(x) * (2.0 if self.training else 0.5)


def test_train_eval_change_recaptures():
    m_eager, o_eager, m_lazy, o_lazy = twins(TrainingDependent, OPTIMIZERS["adamw"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    captures = []
    for k, (x, y) in enumerate(batches("mse")):
        if k in (2, 4):
            for m in (m_eager, m_lazy):
                m.train(k == 4)
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        captures.append(step.captures)
    assert captures == [1, 1, 2, 2, 2]  # back in training mode: the first capture again


def test_calling_under_autocast_recaptures():
    # The same step called inside and outside torch.autocast: matmuls in bfloat16 or float32, as eager.
    torch.manual_seed(0)
    lin = nn.Linear(6, 4)
    f = lazyrt.torch.compile(lambda x: lin(x), model=lin)
    x = torch.randn(3, 6)
    results = []
    for autocast in (False, True, False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.no_grad():
            got, want = f(x), lin(x)
        assert got.dtype == want.dtype == (torch.bfloat16 if autocast else torch.float32)
        np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=1e-2 if autocast else RTOL,
                                   atol=1e-2 if autocast else ATOL)
        results.append(f.captures)
    assert results == [1, 2, 2, 2]


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_under_bf16_autocast_has_eager_gradients(affine):
    # A Linear before a batch norm under bf16 autocast: the norm's statistics and the saved mean
    # and inverse deviation are float32, as in ATen's CPU kernel, so the backward sums to zero
    # over the batch as eager's does (the bias's gradient, zero in exact arithmetic, was 80x
    # eager's rounding noise when the saved statistics were rounded to bf16).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4, affine=affine), nn.Linear(4, 2))
    m_eager = copy.deepcopy(model)

    def make(m):
        def step(x, y):
            for p in m.parameters():
                p.grad = None
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(m(x), y)
            loss.backward()
            return loss
        return step
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 6, generator=g) * 3, torch.randn(3, 2, generator=g)
    got, want = lazyrt.torch.compile(make(model))(x, y), make(m_eager)(x, y)
    close(got.item(), want.item(), "loss")
    for (name, p), q in zip(model.named_parameters(), m_eager.parameters()):
        scale = max(float(q.grad.abs().max()), 1e-3)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=0, atol=1e-2 * scale, err_msg=name)
    same_tree(dict(model[1].named_buffers()), dict(m_eager[1].named_buffers()), "running statistics")


@pytest.mark.parametrize("norm", ["layer", "layer_no_affine", "layer_bf16_weight", "group"])
def test_layer_and_group_norm_of_bf16_values_as_atens_cpu_kernels(norm):
    # ATen's CPU kernels normalize bf16 values in float32, keep float32 statistics where the
    # norm's parameters are float32 (autocast's case: PyTorch's fake kernel says bf16 there),
    # and round each result once. Lowered op by op in bf16 with the fake kernel's dtypes, every
    # intermediate and the saved statistics were rounded to bf16: the gradients before a norm
    # came out 2-3x further from float64 than eager's (a fuzzed program's RMSprop then took
    # other steps). Each result: eager's dtype, and at most eager's distance from the same
    # computation in float64 on the same inputs.
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(16, 8, generator=g) * 2 + 1).bfloat16()
    dy = torch.randn(16, 8, generator=g).bfloat16()
    w = torch.randn(8, generator=g) if norm != "layer_no_affine" else None
    b = torch.randn(8, generator=g) if norm != "layer_no_affine" else None
    if norm == "layer_bf16_weight":
        w, b = w.bfloat16(), b.bfloat16()

    def forward_backward(x, dy, w, b):
        if norm == "group":
            out, mean, rstd = torch.ops.aten.native_group_norm(x, w, b, 16, 8, 1, 2, 1e-5)
            grads = torch.ops.aten.native_group_norm_backward(dy, x, mean, rstd, w, 16, 8, 1, 2, [True, True, True])
        else:
            out, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
            grads = torch.ops.aten.native_layer_norm_backward(dy, x, [8], mean, rstd, w, b,
                                                              [True, w is not None, b is not None])
        return (out, mean, rstd) + tuple(grads)
    eager = forward_backward(x, dy, w, b)
    got = lazyrt.torch.compile(forward_backward)(x, dy, w, b)
    ref = forward_backward(*(t.double() if t is not None else None for t in (x, dy, w, b)))
    for k, (lz, ea, r) in enumerate(zip(got, eager, ref)):
        if ea is None:
            assert lz is None, k
            continue
        assert lz.dtype == ea.dtype, (k, lz.dtype, ea.dtype)
        lazy_err, eager_err = float((lz.double() - r).norm()), float((ea.double() - r).norm())
        # A bf16 result may round an element to the other neighbour where eager's float32 sum and
        # lazyrt's differ in their last bits: one bf16 rounding (2^-8 relative) on top.
        slack = 2.0 ** -8 if ea.dtype == torch.bfloat16 else 1e-6
        assert lazy_err <= 1.05 * eager_err + slack * float(r.norm()), (k, lazy_err, eager_err)


def test_every_aten_op_the_op_table_names_has_a_lowering():
    # lazyrt/ops.def names, per op, the ATen overloads lazyrt.torch lowers to it: each must exist in
    # this PyTorch and have a lowering (or a decomposition the capture applies), else a step
    # using it breaks its graph for want of one.
    from lazyrt.torch._capture import _decompositions
    from lazyrt.torch._lower import LOWERINGS
    table = lazyrt._C._debug.op_table()
    decomposed = _decompositions()
    unknown, missing = [], []
    for row in table:
        name = row["name"]
        for overload in row["aten"].split():
            packet, _, variant = overload.partition(".")
            op = getattr(getattr(torch.ops.aten, packet, None), variant, None)
            if op is None:
                unknown.append(f"{name}: aten.{overload}")
            elif op not in LOWERINGS and op not in decomposed:
                missing.append(f"{name}: aten.{overload}")
    assert not unknown, f"ops.def names ATen overloads this PyTorch lacks: {unknown}"
    assert not missing, f"ops.def names ATen overloads lazyrt.torch does not lower: {missing}"
    assert sum(bool(row["aten"]) for row in table) >= 70  # the column is filled


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_amin_index_select_scatter_add_and_index_add_in_a_step_equal_eager(dtype):
    # Ops the op table names whose lowerings came with the check above: values and gradients
    # against eager, repeated indices included (index_add and scatter_add accumulate them),
    # with ties for amin (its gradient splits evenly among them).
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(5, 4, generator=g, dtype=dtype)
    w0[1, 2] = w0[1, 0]  # a tie along dim 1 in row 1

    def make(holder):
        def step(idx, src_idx, x):
            w = holder.w
            a = torch.amin(w, dim=1) * 2
            b = torch.index_select(w, 0, idx).sum(1)
            c = torch.zeros(5, 4, dtype=w.dtype).scatter_add(0, src_idx, w * x)
            d = torch.zeros(7, 4, dtype=w.dtype).index_add(0, idx, torch.index_select(w, 0, idx), alpha=0.5)
            loss = a.sum() + (b * b).sum() + (c * c).sum() + d.pow(2).sum()
            holder.w.grad = None
            loss.backward()
            return loss.detach(), a.detach(), c.detach(), d.detach()
        return step
    idx = torch.tensor([4, 0, 4, 2, 1, 0])
    src_idx = torch.tensor([[0, 1, 0, 3], [4, 4, 2, 0], [1, 1, 1, 1], [0, 2, 3, 4], [2, 0, 0, 1]])
    x = torch.randn(5, 4, generator=g, dtype=dtype)
    hl, he = nn.Module(), nn.Module()
    hl.w, he.w = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    compiled, eager = lazyrt.torch.compile(make(hl), model=hl), make(he)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    breaks = lazyrt.metrics.counter("GraphBreak")
    for call in range(2):
        got, want = compiled(idx, src_idx, x + call), eager(idx, src_idx, x + call)
        assert compiled.captures == 1 and lazyrt.metrics.counter("GraphBreak") == breaks
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.numpy(), b.numpy(), **tol)
        np.testing.assert_allclose(hl.w.grad.numpy(), he.w.grad.numpy(), **tol)
    assert compiled.captures == 1


class Bessel(nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x)  # PyTorch 1.13: no gradient flows through it


class ScaledBessel(nn.Module):
    def forward(self, x):
        return torch.special.i0e(x)  # its gradient needs i1e: a break in the backward too


@pytest.mark.parametrize("layer,breaks_per_step", [(Bessel, 1), (ScaledBessel, 2)])
def test_an_op_without_a_lowering_runs_in_eager_at_a_graph_break(layer, breaks_per_step):
    from lazyrt.torch._lower import _WARNED_BREAKS

    names = {Bessel: ["aten.special_bessel_j0.default"],
             ScaledBessel: ["aten.special_i0e.default", "aten.special_i1e.default"]}[layer]
    _WARNED_BREAKS.difference_update(names)  # the warning is once per op and process
    make = lambda: nn.Sequential(nn.Linear(6, 8), layer(), nn.Linear(8, 4))
    m_eager, o_eager, m_lazy, o_lazy = twins(make, OPTIMIZERS["adam"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    before = lazyrt.metrics.counter("GraphBreak")
    for k, (x, y) in enumerate(batches("mse")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = step(x, y)
        breaks = [str(w.message) for w in caught if issubclass(w.category, lazyrt.torch.GraphBreakWarning)]
        if k == 0:  # the capture warns, naming each op once
            assert len(breaks) == len(names) and all(any(n in b for b in breaks) for n in names), breaks
        else:
            assert not breaks
        close(got.item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        assert lazyrt.metrics.counter("GraphBreak") - before == breaks_per_step * (k + 1)
    assert step.captures == 1
    assert step.traces == breaks_per_step + 1, "one compiled piece before, between and after the breaks"
    if layer is Bessel:
        assert m_lazy[0].weight.grad is None and not o_lazy.state.get(m_lazy[0].weight)  # as in eager
    assert not set(names) & set(lazyrt.torch.supported_ops())
    assert "aten.addmm.default" in lazyrt.torch.supported_ops()


class DetHead(nn.Module):
    """A regression net whose output adds the determinants of 2x2 blocks of its hidden layer:
    linalg_det has no lowering, so forward and backward break the graph around it."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.hidden(x))
        return self.out(h) + 0.5 * torch.linalg.det(h[:, :4].reshape(-1, 2, 2)).unsqueeze(1)


def test_an_eager_op_at_a_graph_break_sees_the_strides_it_was_traced_with():
    # linalg_det factors A, or A's transpose when A is contiguous, and the captured backward
    # solves with that factorization as traced (here A is a strided view): an input handed to
    # the eager op contiguous made every step's gradient of the hidden layer wrong.
    m_eager, o_eager, m_lazy, o_lazy = twins(DetHead, OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    before = lazyrt.metrics.counter("GraphBreak")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lazyrt.torch.GraphBreakWarning)
        for k, (x, y) in enumerate(batches("mse")):
            close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
            same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert lazyrt.metrics.counter("GraphBreak") > before and step.captures == 1


@pytest.mark.parametrize("shape,stride", [((4, 3), (1, 4)), ((2, 3, 4), (12, 1, 3)), ((3, 4), (0, 1)),
                                          ((5, 2, 2), (8, 2, 1)), ((3, 4), (4, 1))])
def test_traced_layout_keeps_values_and_takes_the_traced_strides(shape, stride):
    from lazyrt.torch._lower import _traced_layout

    extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    traced = torch.arange(float(extent)).as_strided(shape, stride)
    t = torch.randn(shape) if 0 not in stride else torch.randn(shape[1]).expand(shape).contiguous()
    node = types.SimpleNamespace(meta={"val": traced})  # a graph node: its traced value
    out = _traced_layout(t, node)
    assert out.stride() == stride
    assert _traced_layout(t, node).stride() == stride, "again, from the strides kept on the node"
    torch.testing.assert_close(out, t, rtol=0, atol=0)


@pytest.mark.parametrize("dims", [1, 2])
def test_batch_norm_with_a_cumulative_average_trains_as_eager(dims):
    # momentum=None: PyTorch's forward reads float(num_batches_tracked) for the factor, which
    # failed the capture (a value read); the factor changes every step, so it must not be a
    # constant of the capture either.
    torch.manual_seed(0)
    if dims == 1:
        make = lambda: nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8, momentum=None), nn.ReLU(),  # noqa: E731
                                     nn.Linear(8, 4))
        data = [(x, y) for x, y in batches("mse")]
    else:
        make = lambda: nn.Sequential(nn.Unflatten(1, (1, 2, 3)), nn.Conv2d(1, 3, 2, padding=1),  # noqa: E731
                                     nn.BatchNorm2d(3, momentum=None), nn.ReLU(), nn.Flatten(), nn.Linear(36, 4))
        data = [(x, y) for x, y in batches("mse")]
    # SGD: the bias before the batch norm has a gradient that is rounding noise (the norm
    # removes the mean), which Adam would scale up to whole steps.
    m_eager, o_eager, m_lazy, o_lazy = twins(make, OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(data):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        same_tree(m_lazy.state_dict(), m_eager.state_dict(), f"buffers after step {k}")
    assert int(m_lazy[1 if dims == 1 else 2].num_batches_tracked) == len(data)
    assert step.captures == 1


def test_arange_of_a_float_bound_without_dtype_is_float_as_in_eager():
    # torch.arange(-1, 1.5) and torch.arange(2.5): a float bound and no dtype give the default
    # float dtype (an int64 arange would give [-1, 0, 1] and [0, 1, 2] and integer products).
    x = torch.full((3,), 0.5)
    f = lazyrt.torch.compile(lambda x: (x * torch.arange(-1, 1.5), x + torch.arange(2.5)))
    got, want = f(x), (x * torch.arange(-1, 1.5), x + torch.arange(2.5))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.float32
        torch.testing.assert_close(g, w)
    g = lazyrt.torch.compile(lambda x: x * torch.arange(-1, 1.5, dtype=torch.float64))
    torch.testing.assert_close(g(x), x * torch.arange(-1, 1.5, dtype=torch.float64))


@pytest.mark.parametrize("read", ["item", "mask"])
def test_a_step_that_reads_a_value_runs_in_eager(read):
    # A value read (loss.item()) or a shape made from values (x[x > 0]) cannot be replayed: the
    # call runs in PyTorch eager, warned once and counted, with eager's results and state; the
    # capture's patches are undone. Later calls run in eager without a new capture.
    torch.manual_seed(0)
    model, model_e = nn.Linear(3, 2), nn.Linear(3, 2)
    model_e.load_state_dict(model.state_dict())
    opt, opt_e = torch.optim.Adam(model.parameters(), lr=0.1), torch.optim.Adam(model_e.parameters(), lr=0.1)

    def make(model, opt):
        def step(x):
            out = model(x)
            loss = out.pow(2).sum() if read == "item" else out[out > 0].sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item() if read == "item" else loss
        return step

    originals = (torch._foreach_zero_, sys.modules["torch.optim.adam"].adam)
    compiled, eager = lazyrt.torch.compile(make(model, opt)), make(model_e, opt_e)
    steps = lazyrt.metrics.counter("EagerStep")
    with pytest.warns(lazyrt.torch.GraphBreakWarning, match="run in PyTorch eager"):
        got = [compiled(torch.full((4, 3), float(k) - 1)) for k in range(3)]
    want = [eager(torch.full((4, 3), float(k) - 1)) for k in range(3)]
    same_tree(got, want, "results")
    same_tree(model.state_dict(), model_e.state_dict(), "parameters")
    same_tree(opt.state_dict(), opt_e.state_dict(), "optimizer state")
    assert lazyrt.metrics.counter("EagerStep") == steps + 3 and compiled.captures == 0
    assert (torch._foreach_zero_, sys.modules["torch.optim.adam"].adam) == originals  # patches undone


def test_freezing_a_layer_recaptures():
    # requires_grad is guarded: frozen after two steps, the first layer gets no new gradient,
    # but (as in eager) its zeroed gradient still goes through Adam's update.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), OPTIMIZERS["adam"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    captures = []
    for k, (x, y) in enumerate(batches("mse")):
        if k == 2:
            m_eager[0].requires_grad_(False)
            m_lazy[0].requires_grad_(False)
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        captures.append(step.captures)
    assert captures == [1, 1, 2, 2, 2]


def step_with_zero_grad(model, opt, loss_fn, where, set_to_none):
    def step(x, y):
        if where == "start":
            opt.zero_grad(set_to_none=set_to_none)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if where == "end":
            opt.zero_grad(set_to_none=set_to_none)
        return loss
    return step


@pytest.mark.parametrize("where,set_to_none", [("end", True), ("start", False), ("start", True), ("never", False)])
def test_zero_grad_placement_matches_eager(where, set_to_none):
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), OPTIMIZERS["adam"])
    loss_fn = nn.MSELoss()
    eager = step_with_zero_grad(m_eager, o_eager, loss_fn, where, set_to_none)
    step = lazyrt.torch.compile(step_with_zero_grad(m_lazy, o_lazy, loss_fn, where, set_to_none),
                                model=m_lazy, optimizer=o_lazy)
    fast = lazyrt.metrics.counter("TorchFastCall")
    for k, (x, y) in enumerate(batches("mse")):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 1
    # Gradients zeroed or accumulated in place, set to None at the end, or made anew by each
    # call (None at its start): every call after the first two runs whole in C++.
    assert lazyrt.metrics.counter("TorchFastCall") - fast == STEPS - 2


def test_gradients_zeroed_alike_are_written_without_a_copy_aside():
    # zero_grad(set_to_none=False) at the end writes zeros into every gradient: gradients of one
    # shape get one value, which the replay writes into one of them and copies from there into
    # the others. Nothing is copied aside for that (the copies write over no source): a call's
    # lazyrt memory never rises above what it holds between calls.
    def make():
        torch.manual_seed(21)
        return nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256))
    m_eager, o_eager, m_lazy, o_lazy = twins(make, OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()
    eager = step_with_zero_grad(m_eager, o_eager, loss_fn, "end", False)
    step = lazyrt.torch.compile(step_with_zero_grad(m_lazy, o_lazy, loss_fn, "end", False))
    g = torch.Generator().manual_seed(22)
    data = [(torch.randn(16, 256, generator=g), torch.randn(16, 256, generator=g)) for _ in range(6)]
    for k, (x, y) in enumerate(data):
        if k == 3:
            lazyrt.debug.reset_peak_memory()
            held = lazyrt.debug.live_memory_bytes()
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        if k >= 3:
            # One weight is 256 KiB; a copy aside of the two zeroed like the first was 512 KiB.
            assert lazyrt.debug.peak_memory_bytes() - held < 64 * 1024, f"step {k}"
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert all(float(p.grad.abs().max()) == 0 for p in m_lazy.parameters())
    assert step.captures == 1


def test_gradients_made_anew_each_call_are_new_tensors_that_keep_their_values():
    # zero_grad(set_to_none=True) first, so every call makes new gradients: each call's .grad
    # tensors are new ones (as eager's are), and a later call leaves earlier ones as they were.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.GELU(), seed=18), OPTIMIZERS["adamw"])
    loss_fn = nn.MSELoss()
    eager = step_with_zero_grad(m_eager, o_eager, loss_fn, "start", True)
    step = lazyrt.torch.compile(step_with_zero_grad(m_lazy, o_lazy, loss_fn, "start", True))
    kept = []
    for k, (x, y) in enumerate(batches("mse", n=6, seed=19)):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        kept.append(([p.grad for p in m_lazy.parameters()], [p.grad.clone() for p in m_eager.parameters()]))
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    for k, (grads, want) in enumerate(kept):
        for g, w in zip(grads, want):
            close(g.numpy(), w.numpy(), f"gradient of step {k}, read after the last step")
    ids = [id(g) for grads, _ in kept for g in grads]
    assert len(set(ids)) == len(ids)


def test_gradients_made_between_calls_are_left_none_as_the_step_leaves_them():
    # The step ends with zero_grad(set_to_none=True); between calls the loop computes other
    # gradients (a backward pass of its own). Every call, fast or not, must read those as the
    # step's starting gradients and leave .grad None, as eager does.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.Tanh(), seed=16), OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()
    eager = step_with_zero_grad(m_eager, o_eager, loss_fn, "end", True)
    step = lazyrt.torch.compile(step_with_zero_grad(m_lazy, o_lazy, loss_fn, "end", True))
    fast = lazyrt.metrics.counter("TorchFastCall")
    for k, (x, y) in enumerate(batches("mse", n=6, seed=17)):
        for m in (m_eager, m_lazy):
            (m(x) ** 2).mean().backward()
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        assert all(p.grad is None for p in m_lazy.parameters()), k
    assert lazyrt.metrics.counter("TorchFastCall") - fast == 4


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(6, 4)
        self.unused = nn.Linear(6, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.used(x))


@pytest.mark.parametrize("opt_name", ["adamw", "sgd_momentum"])
def test_unused_and_frozen_parameters_keep_none_grads_and_no_state(opt_name):
    # Eager skips parameters without a gradient: no update (not even AdamW's weight decay) and
    # no state. The capture must not stand zeros in for their gradients.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: (torch.manual_seed(0), WithUnused())[1], OPTIMIZERS[opt_name])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse")):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert m_lazy.unused.weight.grad is None and m_lazy.frozen.weight.grad is None
    assert len(o_lazy.state) == 2  # used.weight, used.bias
    assert step.captures == 1


def test_zeroing_a_missing_grad_leaves_it_missing():
    # Module.zero_grad() skips gradients that are None: a parameter outside the optimizer that
    # the loss does not use keeps grad None, and the one the loss uses gets its gradient.
    def make(model, opt):
        def step(x, y):
            model.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return step

    m_eager = (torch.manual_seed(0), WithUnused())[1]
    m_lazy = copy.deepcopy(m_eager)
    o_eager = torch.optim.Adam(m_eager.used.parameters(), lr=1e-2)
    o_lazy = torch.optim.Adam(m_lazy.used.parameters(), lr=1e-2)
    eager = make(m_eager, o_eager)
    step = lazyrt.torch.compile(make(m_lazy, o_lazy), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse", n=3)):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert m_lazy.unused.weight.grad is None and m_lazy.used.weight.grad is not None
    assert step.captures == 1


@pytest.mark.parametrize("variant", ["weight_ignore_index", "sum", "none", "unbatched"])
def test_cross_entropy_variants_match_eager(variant):
    weight = torch.tensor([1.0, 2.0, 0.5, 1.5])
    loss_fn = {
        # a plain tensor from the closure (a constant of the graph, read on every call)
        "weight_ignore_index": lambda out, y: nn.functional.cross_entropy(out, y, weight=weight, ignore_index=2),
        "sum": nn.CrossEntropyLoss(reduction="sum"),
        "none": nn.CrossEntropyLoss(reduction="none"),
        "unbatched": nn.CrossEntropyLoss(weight=weight),  # a buffer of the loss module (found in the closure)
    }[variant]
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.GELU()), OPTIMIZERS["sgd_momentum"])

    def make(model, opt):
        def step(x, y):
            if variant == "unbatched":
                x, y = x[0], y[0]
            losses = loss_fn(model(x), y)
            loss = losses.sum() * 0.5 if variant == "none" else losses
            loss.backward()
            opt.step()
            opt.zero_grad()
            return losses
        return step

    eager = make(m_eager, o_eager)
    step = lazyrt.torch.compile(make(m_lazy, o_lazy), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("ce")):
        if k == 3:  # the class weights (a tensor outside the model) are read on every call, not frozen
            weight.mul_(2.0).add_(torch.tensor([0.0, 0.0, 0.0, 1.0]))
        same_tree(step(x, y), eager(x, y), f"losses at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 1


def test_sgd_dampening_first_step_captured_apart():
    # With dampening the first step's momentum buffer is the gradient itself, later steps'
    # are not: the first step cannot share the later steps' graph.
    m_eager, o_eager, m_lazy, o_lazy = twins(
        lambda: mlp(nn.ReLU()), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.3))
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse")):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 2


def test_other_optimizer_runs_its_own_code_with_constants_guarded():
    # Rprop has no replacement: its step runs as written (its masked assignments a graph
    # break) and its lr is a constant of the capture, guarded; the first step (no state yet) and
    # the later ones (state, its step count a tensor) are two captures, never stale.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), lambda p: torch.optim.Rprop(p, lr=1e-3))
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse", n=3)):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 2


class Zoo(nn.Module):
    """A model whose forward and backward use ops beyond the MLP's."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6, padding_idx=0)
        self.lin = nn.Linear(6, 6)
        self.out = nn.Linear(12, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, tokens):
        h = self.emb(tokens).mean(dim=1)                                         # embedding, mean.dim
        a = torch.sigmoid(self.lin(h)) * torch.nn.functional.silu(h)             # sigmoid, silu
        b = torch.where(h > 0, torch.sqrt(h.abs() + 1.0), torch.rsqrt(h * h + 1.0))  # where, gt, sqrt, rsqrt
        c = torch.cat([a.clamp(-0.5, 0.5), b.pow(2).transpose(0, 1).t()], dim=1)  # clamp, pow, cat, t
        logits = self.out(torch.maximum(c, c.exp() - 1.5)) * self.scale           # maximum, exp
        return torch.softmax(logits, dim=-1)                                     # softmax


def test_op_zoo_matches_eager():
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: (torch.manual_seed(3), Zoo())[1], OPTIMIZERS["adamw"])

    def make(model, opt):
        def step(tokens, target):
            probs = model(tokens)
            loss = -(probs.log() * target).sum(dim=1).mean() + 0.1 * (probs - target).abs().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss, probs.detach()
        return step

    eager = make(m_eager, o_eager)
    step = lazyrt.torch.compile(make(m_lazy, o_lazy), model=m_lazy, optimizer=o_lazy)
    g = torch.Generator().manual_seed(7)
    for k in range(STEPS):
        tokens = torch.randint(0, 10, (4, 5), generator=g)
        target = torch.softmax(torch.randn(4, 3, generator=g), dim=1)
        got, want = step(tokens, target), eager(tokens, target)
        same_tree(got, want, f"results at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 1


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_gradient_clipping_matches_eager(norm_type):
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.Tanh()), OPTIMIZERS["adamw"])

    def make(model, opt):
        def step(x, y):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            total = nn.utils.clip_grad_norm_(model.parameters(), 0.05, norm_type=norm_type)
            opt.step()
            opt.zero_grad()
            return loss, total
        return step

    eager = make(m_eager, o_eager)
    step = lazyrt.torch.compile(make(m_lazy, o_lazy), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("ce")):
        got, want = step(x, y), eager(x, y)
        assert want[1] > 0.05, "the clipping must bite"
        same_tree(got, want, f"loss and gradient norm at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 1


def test_results_keep_their_structure():
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), OPTIMIZERS["sgd"])

    def make(model, opt):
        def step(x, y, scale=1.0):
            out = model(x)
            loss = ((out - y) ** 2).mean() * scale
            loss.backward()
            opt.step()
            opt.zero_grad()
            return {"loss": loss, "outputs": [out.detach(), out.argmax(dim=1)]}, "done", scale
        return step

    eager = make(m_eager, o_eager)
    step = lazyrt.torch.compile(make(m_lazy, o_lazy), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse", n=3)):
        scale = 1.0 if k < 2 else 3.0  # a Python argument: a new value is a new capture
        same_tree(step(x, y, scale=scale), eager(x, y, scale=scale), f"results at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 2


def test_a_parameter_of_an_unknown_module_is_refused():
    # A module out of discovery's reach (a default argument) is not found; its parameters would
    # get gradients in eager that a capture would not write back: refused, naming the remedy.
    # Passed as model=, its gradients accumulate over the calls (no optimizer zeroes them), as in
    # eager.
    def make():
        torch.manual_seed(0)
        model = nn.Linear(3, 3)
        hidden = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x, head=hidden):
            loss = head(model(x)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step, nn.ModuleDict({"model": model, "head": hidden})

    step, modules = make()
    with pytest.raises(lazyrt.torch.CaptureError, match="requires grad.*model="):
        lazyrt.torch.compile(step)(torch.ones(2, 3))
    assert all(p.grad is None for p in modules.parameters())

    eager, eager_modules = make()
    compiled = lazyrt.torch.compile(step, model=modules["head"])
    for k, (x, _) in enumerate(batches("mse", n=3)):
        x = x[:, :3]
        close(compiled(x).item(), eager(x).item(), f"loss at step {k}")
        same_training_state(modules, None, eager_modules, None, f"after step {k}:")
    assert modules["head"].weight.grad.abs().sum() > 0 and compiled.captures == 1


def test_rebinding_the_optimizer_or_a_parameter_recaptures():
    # The step's closure is read on every call: a new optimizer (or a replaced parameter) is a
    # new signature, never the old capture's state.
    def trainer(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        def switch(k):
            nonlocal opt
            if k == 2:
                opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            if k == 4:
                with torch.no_grad():
                    model[0].weight = nn.Parameter(model[0].weight * 0.5)
                opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            return opt
        return step, switch

    m_eager = mlp(nn.ReLU())
    m_lazy = copy.deepcopy(m_eager)
    eager, switch_eager = trainer(m_eager)
    step, switch_lazy = trainer(m_lazy)
    step = lazyrt.torch.compile(step)
    captures = []
    for k, (x, y) in enumerate(batches("mse", n=6)):
        o_eager, o_lazy = switch_eager(k), switch_lazy(k)
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        captures.append(step.captures)
    assert captures == [1, 1, 2, 2, 3, 3]


def test_lazyrt_torch_does_not_shadow_pytorch():
    # A subpackage named torch inside lazyrt: lazyrt's own modules still import PyTorch.
    assert sys.modules["torch"] is torch and lazyrt.torch is not torch
    assert lazyrt.torch.__name__ == "lazyrt.torch"
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    np.testing.assert_array_equal(lazyrt.from_torch(t).numpy(), t.numpy())
    np.testing.assert_array_equal(lazyrt.to_torch(lazyrt.tensor(t) * 2).numpy(), (t * 2).numpy())


def test_discovers_model_and_optimizer_from_globals_and_closure():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    assert lazyrt.torch.discover(step) == ([model], [opt])
    # Through a method that calls the step: found through the function it calls (its closure).
    m_eager = copy.deepcopy(model)
    o_eager = torch.optim.SGD(m_eager.parameters(), lr=0.1)
    bound = type("Trainer", (), {"step": lambda self, x: step(x)})()
    compiled = lazyrt.torch.compile(bound.step)
    for k in range(3):
        x = torch.full((1, 3), float(k + 1))
        want = m_eager(x).pow(2).sum()
        want.backward()
        o_eager.step()
        o_eager.zero_grad()
        close(compiled(x).item(), want.item(), f"loss at step {k}")
        same_tree(model.state_dict(), m_eager.state_dict(), f"parameters after step {k}")
    assert compiled.captures == 1


def test_values_changed_between_calls_are_read():
    # The replay reads the torch tensors without a copy: changing a parameter between calls (as
    # load_state_dict does) is seen by the next call.
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.ReLU()), OPTIMIZERS["adamw"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse")):
        if k == 2:
            state = copy.deepcopy(m_eager.state_dict())
            state["0.weight"].mul_(0.5)
            m_eager.load_state_dict(state)
            m_lazy.load_state_dict(state)
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures == 1


def test_tensors_rebound_or_relaid_between_calls_are_read_and_written_anew():
    # A call reuses what it handed to lazyrt on the last call only for a tensor still at the same
    # address and contiguous. Each change below happens to both twins between two calls: new
    # memory behind the same parameter, the same memory seen transposed (same address and
    # shape, other strides), a state tensor replaced, a gradient set by hand. Every call must
    # read and write the tensors as they are then, without a new capture.
    torch.manual_seed(3)
    m_eager = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = OPTIMIZERS["adamw"](m_eager.parameters()), OPTIMIZERS["adamw"](m_lazy.parameters())
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)) for _ in range(7)]

    def change(k, m, o):
        w = m[0].weight
        if k == 2:
            w.data = w.data.clone() * 0.5
        elif k == 3:
            w.data = w.data.t()
        elif k == 4:
            o.state[w]["exp_avg"] = o.state[w]["exp_avg"].clone() + 0.1
        elif k == 5:
            m[2].bias.grad = torch.ones_like(m[2].bias)

    for k, (x, y) in enumerate(data):
        change(k, m_eager, o_eager)
        change(k, m_lazy, o_lazy)
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        if k == 3:
            assert not m_lazy[0].weight.is_contiguous()  # written in place, as eager's update does
    assert step.captures == 1


# ---- lowerings, op by op ----------------------------------------------------------------------
# Each case traces a small torch function to aten (as a capture does), checks the graph holds the
# ops the case is for, lowers it to lazyrt and compares the result with eager PyTorch.

A = torch.tensor([[0.5, -1.25, 2.0, 0.0], [-0.75, 1.5, -2.5, 3.0], [1.0, 0.25, -0.5, -3.5]])
B = torch.tensor([[1.5, 0.5, -1.0, 2.0], [0.25, -2.0, 1.0, -0.5], [3.0, -1.5, 0.75, 1.25]])
IDX = torch.tensor([[2, 0, 1, 3], [1, 1, 0, 2], [3, 2, 2, 0]])

LOWERING_CASES = {  # name: (function of (a, b, i), aten ops it must contain)
    "rsub": (lambda a, b, i: (2.0 - a, torch.rsub(a, b, alpha=2)), ["aten.rsub.Scalar", "aten.rsub.Tensor"]),
    "split": (lambda a, b, i: (*a.split(3, dim=1), *torch.split(b, [1, 2], dim=0), *a.unsafe_split(2, 0)),
              ["aten.split.Tensor", "aten.split_with_sizes.default", "aten.unsafe_split.Tensor"]),
    "scalar_arith": (lambda a, b, i: (a - 1.5) * 3 / 4 + 0.5, ["aten.sub.Tensor", "aten.div.Tensor"]),
    "add_alpha": (lambda a, b, i: torch.add(a, b, alpha=-0.5) - torch.sub(b, a, alpha=3), ["aten.add.Tensor"]),
    "min_max": (lambda a, b, i: torch.minimum(a, b) + torch.maximum(a, b) * 2,
                ["aten.minimum.default", "aten.maximum.default"]),
    "addcdiv_addcmul": (lambda a, b, i: torch.addcdiv(a, b, a.abs() + 1, value=0.5) + torch.addcmul(a, a, b, value=2),
                        ["aten.addcdiv.default", "aten.addcmul.default"]),
    "lerp": (lambda a, b, i: torch.lerp(a, b, 0.3) + torch.lerp(a, b, torch.sigmoid(b)),
             ["aten.lerp.Scalar", "aten.lerp.Tensor", "aten.sigmoid.default"]),
    "unary": (lambda a, b, i: (a.sign(), a.reciprocal(), (a.abs() + 1).log(), a.exp(), torch.erf(a), a.neg(),
                               (a.abs() + 1).rsqrt(), (a.abs() + 1).sqrt(), a.tanh(), a.relu(), a.abs()),
              ["aten.sign.default", "aten.reciprocal.default", "aten.log.default", "aten.erf.default",
               "aten.rsqrt.default", "aten.abs.default"]),
    "activations": (lambda a, b, i: (nn.functional.gelu(a, approximate="tanh"), nn.functional.gelu(a),
                                     nn.functional.silu(a)), ["aten.gelu.default", "aten.silu.default"]),
    "pow": (lambda a, b, i: ((a.abs() + 0.5) ** b, 2.0 ** a, torch.pow(0.9, b), a ** 3, torch.pow(a, 0.5)),
            ["aten.pow.Tensor_Tensor", "aten.pow.Scalar", "aten.pow.Tensor_Scalar"]),
    "clamp": (lambda a, b, i: (a.clamp(-1, 1), torch.clamp_min(a, 0.1), torch.clamp_max(a, 0.2), a.clamp(min=b)),
              ["aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default"]),
    "compare_where": (lambda a, b, i: (torch.where(a > 0, a, 0.0), torch.where(a < b, a, b), a.masked_fill(a >= 1, -1.0),
                                       (a <= b).float() + (a == 0).float() + (a != b).float(),
                                       torch.logical_and(a > 0, b > 0) | torch.logical_not(a < -1) & (b < 1)),
                      ["aten.where.self", "aten.masked_fill.Scalar", "aten.le.Tensor", "aten.eq.Scalar",
                       "aten.logical_not.default", "aten.bitwise_or.Tensor", "aten.bitwise_and.Tensor"]),
    "matmul": (lambda a, b, i: (a @ b.t(), torch.bmm(a.unsqueeze(0), b.t().unsqueeze(0)), torch.addmm(b[:, :3], a, b.t(),
                                                                                                    beta=0.5, alpha=2)),
               ["aten.mm.default", "aten.bmm.default", "aten.addmm.default"]),
    "baddbmm": (lambda a, b, i: (torch.baddbmm(a[:, :3].unsqueeze(0), a.unsqueeze(0), b.t().unsqueeze(0)),
                                 torch.baddbmm(a[0, :3], a.unsqueeze(0), b.t().unsqueeze(0), beta=0.5, alpha=-2)),
                ["aten.baddbmm.default"]),
    "arange": (lambda a, b, i: (torch.arange(4) + i, torch.arange(1, 4), torch.arange(1, 8, 3) * a[:, :3],
                                torch.arange(0.5, 2.0, 0.25), torch.arange(5, dtype=torch.float64), torch.arange(0, 3, 0.5),
                                torch.arange(-1.5, 1, dtype=torch.float32)),
               ["aten.arange.default", "aten.arange.start", "aten.arange.start_step"]),
    "reductions": (lambda a, b, i: (a.sum(), a.sum(dim=1, keepdim=True), a.mean(), a.mean(dim=0),
                                    a.amax(dim=1), a.argmax(dim=1), a.argmin(), i.sum(), a.max(), i.min(),
                                    a.norm(), torch.linalg.vector_norm(a, 3.0, dim=1), a.norm(p=1, dim=0, keepdim=True),
                                    torch.stack([a, b], dim=1)),
                   ["aten.sum.default", "aten.sum.dim_IntList", "aten.mean.default", "aten.mean.dim",
                    "aten.amax.default", "aten.argmax.default", "aten.argmin.default", "aten.max.default",
                    "aten.min.default", "aten.linalg_vector_norm.default", "aten.stack.default"]),
    "shapes": (lambda a, b, i: (a.permute(1, 0), a.transpose(0, 1), a[:, 1:3], a[1], a[-1, ::2], a.unsqueeze(1),
                                a.reshape(2, 6), a.view(-1), a[None].squeeze(0), a[:1].expand(3, 4),
                                torch.cat([a, b], dim=1), a.t().contiguous(), a.clone()),
               ["aten.permute.default", "aten.transpose.int", "aten.slice.Tensor", "aten.select.int",
                "aten.cat.default", "aten.expand.default"]),
    "factories": (lambda a, b, i: (torch.zeros_like(a) + 1, torch.ones(2, 3), torch.full((2,), 1.5) * a[0, :2],
                                   torch.full_like(a, 7.0), a.new_zeros(3), torch.scalar_tensor(2.5) * a),
                  ["aten.zeros_like.default", "aten.ones.default", "aten.full.default", "aten.full_like.default",
                   "aten.scalar_tensor.default"]),
    "promotion": (lambda a, b, i: (i + 1.5, i / 2, i * a, (i > 1) * a, a.double() * 2, (a * 1000).long(),
                                   i.float().sum(dim=0)),
                  ["aten._to_copy.default"]),
    "softmax": (lambda a, b, i: (torch.softmax(a, dim=1), torch.log_softmax(a, dim=0)),
                ["aten._softmax.default", "aten._log_softmax.default"]),
    "embedding": (lambda a, b, i: nn.functional.embedding(i, b.t()), ["aten.embedding.default"]),
    "fill_and_new": (lambda a, b, i: (a.clone().fill_(2.0), torch.empty_like(a).zero_() + a, a.new_ones(2),
                                      a.new_full((2,), 3.0), torch.where(a > 0, 0.0, a), a.masked_fill(b > 0, b[0, 0]),
                                      a.clone().fill_(b[1, 1])),
                     ["aten.fill.Scalar", "aten.fill.Tensor", "aten.zero.default", "aten.new_ones.default",
                      "aten.new_full.default", "aten.masked_fill.Tensor", "aten.empty_like.default"]),
    "more_shapes_factories": (lambda a, b, i: (a.unsqueeze(0) @ b.t(), a.t().reshape(12), a[None, :, None].squeeze(),
                                               torch.zeros(2, 2) + a[:2, :2], torch.empty(3).fill_(2.0) - 1,
                                               a.new_empty(2).zero_(), torch.zeros(3, 4).copy_(b[0]), torch.zeros(3, 4).copy_(i),
                                               torch.clamp_min(a, b), torch.clamp_max(a, b),
                                               (a >= b) | (i != 2), torch.logical_or(a > 1, b > 1)),
                              ["aten._unsafe_view.default", "aten.squeeze.default", "aten.zeros.default",
                               "aten.empty.memory_format", "aten.new_empty.default", "aten.copy.default",
                               "aten.clamp_min.Tensor", "aten.clamp_max.Tensor", "aten.ge.Tensor", "aten.ne.Scalar",
                               "aten.logical_or.default"]),
    "in_place": (lambda a, b, i: _in_place(a, b), ["aten.select_scatter.default", "aten.slice_scatter.default"]),
    "loss_grads": (lambda a, b, i: _grads(a, lambda x: (nn.functional.mse_loss(x, b, reduction="sum")
                                                         + nn.functional.mse_loss(x, b, reduction="none")[0].sum()
                                                         + (x[:, 1:3] * b[:, :2]).sum() + x[::2, ::3].sum()
                                                         + nn.functional.nll_loss(x.log_softmax(1), i[:, 0],
                                                                                  reduction="sum"))),
                   ["aten.mse_loss_backward.default", "aten.nll_loss_backward.default",
                    "aten._log_softmax_backward_data.default", "aten.select_backward.default",
                    "aten.slice_backward.default"]),
    "activation_grads": (lambda a, b, i: _grads(a, lambda x: (nn.functional.gelu(x) * b).sum()
                                                + (nn.functional.gelu(x, approximate="tanh") * b).sum()
                                                + (torch.tanh(x) * b).sum() + (torch.sigmoid(x) * b).sum()
                                                + (nn.functional.silu(x) * b).sum() + (x.relu() * b).sum()),
                         ["aten.gelu_backward.default", "aten.tanh_backward.default",
                          "aten.sigmoid_backward.default", "aten.threshold_backward.default"]),
}


def _in_place(a, b):
    """In-place updates of a fresh tensor and of a view of it (functionalized to copies)."""
    c = a.clone()
    c[1] = b[0]
    c[:, 0].mul_(2.0)
    c[::2, 1:].sub_(b[::2, :3])
    c.add_(1.0)
    return c


def _grads(a, f):
    """The gradient of f at a, with outputs of a traced function (the backward as aten ops)."""
    x = a.detach().requires_grad_()
    with torch.enable_grad():
        loss = f(x)
        return loss.detach(), torch.autograd.grad(loss, x)[0]


@pytest.mark.parametrize("name", sorted(LOWERING_CASES))
def test_lowering_matches_eager(name):
    from lazyrt.torch._capture import _fake_trace
    from lazyrt.torch._lower import LoweredGraph, op_name

    fn, ops = LOWERING_CASES[name]

    def flat(inputs):
        out = fn(*inputs)
        return list(out) if isinstance(out, tuple) else [out]

    from torch.func import functionalize
    gm = _fake_trace(functionalize(_fake_trace(flat, [A, B, IDX])), [A, B, IDX])  # as a capture: pure
    present = {op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert set(ops) <= present, f"the graph lacks {sorted(set(ops) - present)}; it has {sorted(present)}"
    roots = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])
    lowered = LoweredGraph(gm, roots)
    inputs = [lazyrt.from_torch(t) for t in (A, B, IDX)] + [lazyrt.from_torch(t) for t in lowered.constants]
    got = lowered(*inputs)
    want = flat([A, B, IDX])
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = lazyrt.to_torch(g)
        assert g.dtype == w.dtype and g.shape == w.shape, f"result {k}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}"
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{name}: result {k}")


def test_star_import_of_lazyrt_never_binds_torch_to_the_frontend():
    import lazyrt.torch  # noqa: F401  (now an attribute of lazyrt)

    ns = {}
    exec("from lazyrt import *", ns)
    assert "torch" not in ns and "tensor" in ns and "compile_step" in ns


def test_a_function_of_its_arguments_alone_compiles_and_a_hidden_module_is_named():
    f = lazyrt.torch.compile(lambda x, y: (x * y).sum(dim=0) + 1)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(2):
        torch.testing.assert_close(f(x, y), (x * y).sum(dim=0) + 1)
    hidden = torch.nn.Linear(4, 2)

    def uses_hidden(x, lin=hidden):  # the module is out of discover()'s reach: a default argument
        return lin(x).sum()

    with pytest.raises(lazyrt.torch.CaptureError, match="model="):
        lazyrt.torch.compile(uses_hidden)(x)


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", [
    (2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, 3, 0, 2, True), ((3, 2), (1, 2), (1, 0), (1, 2), False),
])
def test_max_pool_indices_and_gradient_equal_torchs(kernel, stride, padding, dilation, ceil_mode):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 7, 8, generator=g)
    gy = torch.randn(2, 3, 7, 8, generator=g)  # sliced to the output's shape below

    def pool(inputs):
        x, gy = inputs
        xr = x.detach().requires_grad_()
        with torch.enable_grad():
            out, idx = torch.nn.functional.max_pool2d(xr, kernel, stride, padding, dilation, ceil_mode, True)
            (dx,) = torch.autograd.grad(out, xr, gy[..., :out.shape[2], :out.shape[3]])
        return [out, idx, dx]

    want = pool([x, gy])
    got = lowered_results(pool, [x, gy])
    assert torch.equal(got[1], want[1]), "indices"
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-7)


def test_max_pool_with_indices_of_empty_and_unbatched_inputs_equal_torchs():
    f = lazyrt.torch.compile(lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True))
    for shape in [(0, 3, 6, 6), (3, 6, 6), (2, 3, 7, 5)]:
        x = torch.randn(*shape)
        got, want = f(x), torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), shape


def small_cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=1, padding=1, groups=2), nn.ReLU(), nn.AvgPool2d(2, ceil_mode=True),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, 4))


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adamw", "adam_foreach"])
def test_a_cnn_with_batchnorm_and_layernorm_trains_as_in_eager(opt_name):
    m_eager, o_eager, m_lazy, o_lazy = twins(small_cnn, OPTIMIZERS[opt_name])
    loss_fn = nn.CrossEntropyLoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    lazy = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn))
    g = torch.Generator().manual_seed(5)
    for i in range(STEPS):
        x, y = torch.randn(4, 3, 9, 9, generator=g), torch.randint(0, 4, (4,), generator=g)
        close(lazy(x, y).item(), eager(x, y).item(), f"loss {i}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"step {i}")
    assert lazy.traces == 1
    # Eval mode: the running statistics, as captured by the training steps.
    m_eager.eval()
    m_lazy.eval()
    predict = lazyrt.torch.compile(lambda x: m_lazy(x), model=m_lazy)
    x = torch.randn(4, 3, 9, 9, generator=g)
    with torch.no_grad():
        want = m_eager(x)
    close(predict(x).numpy(), want.numpy(), "eval")


def test_dropout_draws_a_new_mask_every_replay_and_its_gradient_is_exact():
    # lazyrt draws from its own generator (replayed state), not torch's stream: the masks are
    # compared by statistics, and each step against eager PyTorch given the mask lazyrt drew.
    p = 0.25
    torch.manual_seed(0)
    lazy_model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 4))
    ref_model = copy.deepcopy(lazy_model)
    o_lazy = torch.optim.SGD(lazy_model.parameters(), lr=0.1)
    o_ref = torch.optim.SGD(ref_model.parameters(), lr=0.1)

    def step(x, y):
        h = lazy_model[1](lazy_model[0](x))
        d = lazy_model[2](h)
        loss = nn.functional.cross_entropy(lazy_model[3](d), y)
        loss.backward()
        o_lazy.step()
        o_lazy.zero_grad()
        return loss, h.detach(), d.detach()

    compiled = lazyrt.torch.compile(step)
    g = torch.Generator().manual_seed(2)
    masks = []
    for i in range(4):
        x, y = torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g)
        loss, h, d = compiled(x, y)
        live = h != 0
        kept = (d != 0) & live
        assert abs(kept.sum().item() / live.sum().item() - (1 - p)) < 0.02
        torch.testing.assert_close(d[kept], h[kept] / (1 - p))
        mask = kept.float() / (1 - p)
        masks.append(kept)
        ref_loss = nn.functional.cross_entropy(ref_model[3](ref_model[1](ref_model[0](x)) * mask), y)
        ref_loss.backward()
        o_ref.step()
        o_ref.zero_grad()
        close(loss.item(), ref_loss.item(), f"loss {i}")
        same_training_state(lazy_model, o_lazy, ref_model, o_ref, f"step {i}")
    assert compiled.traces == 1
    assert not torch.equal(masks[0], masks[1]), "a new mask every call"


# ---- the call guard ---------------------------------------------------------------------------
# A call is checked against the last one by a guard in C++ (_torch_C.Guard, the facts _step._guard
# defines); where it fails, the full lookup decides: the call's signature (World.signature)
# and the capture's acceptance. The guard must never pass where the lookup would not find the
# last call's capture; it may be stricter, but not on the changes a training loop makes every
# step (new batch values, a new learning rate).

def _lookup_finds(compiled, world, entry, new_args):
    """Whether the full lookup, the path of a call without a guard, finds `entry` (the capture
    of `world`) for a call with new_args."""
    signature = next(s for s, entries in compiled._entries.items() if entry in entries)
    try:
        modules, optimizers, _ = compiled._discovery(new_args, {})
        now = compiled._world(new_args, {}, (modules, optimizers))
        return now.signature() == signature and entry.accepts(now.facts())
    except Exception:  # a change the lookup itself cannot take is a different call
        return False

def _guarded_world():
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 4))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "weight_decay": 0.1},
                             {"params": list(model[1].parameters()) + list(model[3].parameters())}],
                            lr=1e-2, betas=(0.9, 0.99))
    model.cfg = argparse.Namespace(scale=1.0)  # a Python value the step reads (guarded)

    def step(x, y):
        loss = nn.functional.mse_loss(model(x), y) * model.cfg.scale
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # gradients stay, so changing them is a change to guard
        return loss

    def rebind(new_model):
        nonlocal model
        model = new_model
    return model, opt, step, rebind


def _swap_param(m):
    m[0].weight = nn.Parameter(m[0].weight.detach().clone())


def _state_of(opt, p):
    return opt.state[p]


GUARD_CHANGES = {  # name: (change(model, opt, args, rebind) -> new args, the same key expected)
    "nothing": (lambda m, o, a, r: a, True),
    "new batch values": (lambda m, o, a, r: (a[0] + 1, a[1] * 2), True),
    "learning rate": (lambda m, o, a, r: o.param_groups[0].__setitem__("lr", 0.5) or a, True),
    "gradient values": (lambda m, o, a, r: (m[0].weight.grad.fill_(3.0), a)[1], True),
    "batch size": (lambda m, o, a, r: (a[0][:5], a[1][:5]), False),
    "argument dtype": (lambda m, o, a, r: (a[0].double(), a[1]), False),
    "argument requires grad": (lambda m, o, a, r: (a[0].clone().requires_grad_(), a[1]), False),
    "a parameter as argument": (lambda m, o, a, r: (a[0], m[3].bias), False),
    "one argument more": (lambda m, o, a, r: a + (a[0],), False),
    "eval mode": (lambda m, o, a, r: m.eval() and a, False),
    "a submodule's mode": (lambda m, o, a, r: m[1].eval() and a, False),
    "parameter replaced": (lambda m, o, a, r: _swap_param(m) or a, False),
    "parameter frozen": (lambda m, o, a, r: (m[3].bias.requires_grad_(False), a)[1], False),
    "parameter reshaped": (lambda m, o, a, r: setattr(m[3].bias, "data", torch.zeros(2, 2)) or a, False),
    "gradient removed": (lambda m, o, a, r: setattr(m[3].bias, "grad", None) or a, False),
    "buffer replaced": (lambda m, o, a, r: setattr(m[1], "running_mean", torch.zeros(8)) or a, False),
    "submodule added": (lambda m, o, a, r: m.add_module("extra", nn.Identity()) or a, False),
    "weight decay": (lambda m, o, a, r: o.param_groups[1].__setitem__("weight_decay", 0.3) or a, False),
    "betas": (lambda m, o, a, r: o.param_groups[0].__setitem__("betas", (0.8, 0.99)) or a, False),
    "amsgrad flag": (lambda m, o, a, r: o.param_groups[0].__setitem__("amsgrad", True) or a, False),
    "a new hyperparameter": (lambda m, o, a, r: o.param_groups[0].__setitem__("extra", 1) or a, False),
    "state tensor dtype": (lambda m, o, a, r: _state_of(o, m[3].bias).__setitem__(
        "exp_avg", _state_of(o, m[3].bias)["exp_avg"].double()) or a, False),
    "state entry a number": (lambda m, o, a, r: _state_of(o, m[3].bias).__setitem__("step", 3.0) or a, False),
    "state cleared": (lambda m, o, a, r: o.state.pop(m[3].bias) and a, False),
    "model rebound": (lambda m, o, a, r: r(copy.deepcopy(m)) or a, False),
    "a value the step reads": (lambda m, o, a, r: setattr(m.cfg, "scale", 0.5) or a, False),
    "the same value again": (lambda m, o, a, r: setattr(m.cfg, "scale", float("1.0")) or a, True),
    "a value the step reads, retyped": (lambda m, o, a, r: setattr(m.cfg, "scale", 1) or a, False),
    "a value no code reads": (lambda m, o, a, r: setattr(m.cfg, "epochs", 3) or a, True),
    "the object read replaced": (lambda m, o, a, r: setattr(m, "cfg", argparse.Namespace(scale=1.0)) or a, False),
    "a module hyperparameter forward reads": (lambda m, o, a, r: setattr(m[1], "momentum", 0.2) or a, False),
    "a module attribute no code reads": (lambda m, o, a, r: setattr(m[0], "note", "x") or a, True),
}


@pytest.mark.parametrize("change", list(GUARD_CHANGES))
def test_the_call_guard_passes_only_where_the_lookup_finds_the_same_capture(change):
    model, opt, step, rebind = _guarded_world()
    compiled = lazyrt.torch.compile(step)
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(10, 6, generator=g), torch.randn(10, 4, generator=g))
    compiled(*args)
    compiled(*args)
    compiled(*args)
    world, entry, guard, _ = compiled._recent[0]
    assert guard is not None
    make, same = GUARD_CHANGES[change]
    new_args = make(model, opt, args, rebind)
    passes = guard.check(new_args)
    finds = _lookup_finds(compiled, world, entry, new_args)
    assert passes == same, f"{change}: the guard {'passes' if passes else 'fails'}"
    # Never looser than the lookup; stricter only where the lookup would take the capture
    # anyway (a gradient or state the capture can make, see _Entry.accepts).
    assert finds or not passes, f"{change}: the guard passes where the lookup finds no capture"
    assert finds or not same, f"{change}: the test's change did not do what it says"


ARGUMENT_CHANGES = {  # name: (change(model, opt, args) -> new args, the same key expected)
    "nothing": (lambda m, o, a: a, True),
    "the same number again": (lambda m, o, a: a[:4] + (float("2.0"),), True),
    "another number": (lambda m, o, a: a[:4] + (3.0,), False),
    "the number retyped": (lambda m, o, a: a[:4] + (2,), False),
    "another model": (lambda m, o, a: (copy.deepcopy(m),) + a[1:], False),
    "another optimizer": (lambda m, o, a: (a[0], torch.optim.SGD(m.parameters(), lr=0.1)) + a[2:], False),
    "None for the number": (lambda m, o, a: a[:4] + (None,), False),
    "a tuple for the number": (lambda m, o, a: a[:4] + ((2.0,),), False),
}


@pytest.mark.parametrize("change", list(ARGUMENT_CHANGES))
def test_the_call_guard_takes_module_optimizer_and_number_arguments(change):
    # train(model, opt, x, y, scale): objects by identity, numbers by value; None and tuples
    # (no argument leaf of their own) leave the call to the full signature.
    torch.manual_seed(12)
    model = mlp(nn.Tanh())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(m, o, x, y, scale):
        loss = nn.functional.cross_entropy(m(x), y) * (scale if isinstance(scale, (int, float)) else 1.0)
        loss.backward()
        o.step()
        o.zero_grad()
        return loss
    compiled = lazyrt.torch.compile(step)
    (x, y), = batches("ce", n=1)
    args = (model, opt, x, y, 2.0)
    for _ in range(3):
        compiled(*args)
    world, entry, guard, _ = compiled._recent[0]
    assert guard is not None
    make, same = ARGUMENT_CHANGES[change]
    new_args = make(model, opt, args)
    assert _lookup_finds(compiled, world, entry, new_args) == same, \
        f"{change}: the test's change did not do what it says"
    assert guard.check(new_args) == same, f"{change}: the guard and the lookup disagree"


class _CallableStep:
    """A step that is an object with __call__, not a function: the guard has no code or cells
    to check, the Python values the step reads are all world.reads."""

    def __init__(self, model, opt):
        self.model, self.opt, self.scale = model, opt, 1.0

    def __call__(self, x, y):
        loss = nn.functional.mse_loss(self.model(x), y) * self.scale
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss


def test_a_step_that_is_no_function_is_guarded_like_one():
    torch.manual_seed(13)
    model_e, opt_e, model_l, opt_l = twins(lambda: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)),
                                           lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    eager, step = _CallableStep(model_e, opt_e), _CallableStep(model_l, opt_l)
    compiled = lazyrt.torch.compile(step)  # its model and optimizer found through its attributes
    g = torch.Generator().manual_seed(5)
    batches_ = [(torch.randn(10, 6, generator=g), torch.randn(10, 4, generator=g)) for _ in range(6)]
    for k, (x, y) in enumerate(batches_):
        if k == 3:  # a value the step reads: the guard fails, the lookup recaptures
            eager.scale = step.scale = 0.5
        if k == 4:
            model_e.eval(), model_l.eval()
        want, got = eager(x, y), compiled(x, y)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), k
        world, entry, guard, fast = compiled._recent[0]
        assert guard is not None, "a callable object is guarded"
    assert compiled.captures == 3  # the first call, scale 0.5, eval mode
    for pe, pl in zip(model_e.parameters(), model_l.parameters()):
        assert torch.allclose(pe, pl, rtol=1e-5, atol=1e-6)
    # The guard fails exactly where the lookup would not find the capture.
    x, y = batches_[0]
    assert guard.check((x, y)) and _lookup_finds(compiled, world, entry, (x, y))
    step.scale = 2.0
    assert not guard.check((x, y)) and not _lookup_finds(compiled, world, entry, (x, y))


@pytest.mark.parametrize("mode", ["no_grad", "autocast", "default dtype"])
def test_the_call_guard_sees_the_modes(mode):
    model, opt, step, rebind = _guarded_world()
    compiled = lazyrt.torch.compile(step)
    args = (torch.randn(10, 6), torch.randn(10, 4))
    for _ in range(3):
        compiled(*args)
    world, entry, guard, _ = compiled._recent[0]
    ctx = {"no_grad": torch.no_grad, "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}.get(mode)
    if ctx is None:
        torch.set_default_dtype(torch.float64)
        try:
            assert not guard.check(args)
            assert not _lookup_finds(compiled, world, entry, args)
        finally:
            torch.set_default_dtype(torch.float32)
        return
    with ctx():
        assert not guard.check(args)
        assert not _lookup_finds(compiled, world, entry, args)
    assert guard.check(args)
    assert _lookup_finds(compiled, world, entry, args)


def _train_and_compare(make_model, make_opt, loss_fn, data, no_breaks=True):
    """Trains make_model() eagerly and a copy through lazyrt.torch.compile on `data`, comparing
    the losses and the training state after every step; with no_breaks, a graph break fails."""
    m_eager, o_eager, m_lazy, o_lazy = twins(make_model, make_opt)
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    before = lazyrt.metrics.counter("GraphBreak")
    for k, (x, y) in enumerate(data):
        with warnings.catch_warnings():
            if no_breaks:
                warnings.simplefilter("error", lazyrt.torch.GraphBreakWarning)
            got = step(x, y)
        close(got.item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    if no_breaks:
        assert lazyrt.metrics.counter("GraphBreak") == before, "no op ran in eager"
    assert step.captures == 1
    return step


def _images(channels, spatial, n=STEPS, batch=4, classes=5, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, channels, *spatial, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(n)]


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("spatial", [(6, 5), (7,)], ids=["2d", "1d"])
def test_group_norm_trains_as_eager(affine, spatial):
    # torch's native_group_norm and its backward, lowered: statistics per (sample, group) over
    # the group's channels and positions, the affine parameters' gradients over the rest.
    def make():
        torch.manual_seed(0)
        conv = nn.Conv2d(6, 8, 3, padding=1) if len(spatial) == 2 else nn.Conv1d(6, 8, 3, padding=1)
        norm = nn.GroupNorm(4, 8, affine=affine)
        if affine:
            with torch.no_grad():  # away from torch's ones and zeros, so that a mix-up shows
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
        return nn.Sequential(conv, norm, nn.SiLU(), nn.Flatten(), nn.Linear(8 * math.prod(spatial), 5))
    _train_and_compare(make, OPTIMIZERS["sgd_momentum"], nn.CrossEntropyLoss(), _images(6, spatial))


class _Recurrent(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        if kind == "lstm":
            self.rnn = nn.LSTM(6, 8, num_layers=2, batch_first=True)
        elif kind == "gru_bidirectional":
            self.rnn = nn.GRU(6, 8, batch_first=True, bidirectional=True)
        else:
            self.rnn = nn.RNN(6, 8, nonlinearity="relu")
        self.batch_first = kind != "rnn"
        self.head = nn.Linear(self.rnn.hidden_size * (2 if self.rnn.bidirectional else 1), 4)

    def forward(self, tokens):
        x = self.emb(tokens if self.batch_first else tokens.t())
        h, _ = self.rnn(x)
        return self.head(h.mean(1 if self.batch_first else 0))


@pytest.mark.parametrize("kind", ["lstm", "gru_bidirectional", "rnn"])
def test_recurrent_modules_train_as_eager(kind):
    # nn.RNN, LSTM and GRU read their weights through a list of their own (_flat_weights), which
    # the capture must point at the tensors it swaps in, or the weights read as foreign tensors
    # that require grad.
    def make():
        torch.manual_seed(0)
        return _Recurrent(kind)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randint(0, 20, (3, 5), generator=g), torch.randint(0, 4, (3,), generator=g)) for _ in range(STEPS)]
    _train_and_compare(make, OPTIMIZERS["adam"], nn.CrossEntropyLoss(), data)


def test_a_piece_between_graph_breaks_may_pass_on_what_an_eager_op_saved(monkeypatch):
    # Group norm forced to a graph break: its forward runs in eager and autograd saves its mean
    # and rstd through detach nodes, which the lowered piece between the forward and the
    # backward only passes on (tensors it does not compute). The piece returns them all the same.
    from lazyrt.torch import _lower
    for op in (torch.ops.aten.native_group_norm.default, torch.ops.aten.native_group_norm_backward.default):
        monkeypatch.delitem(_lower.LOWERINGS, op)
        _lower._WARNED_BREAKS.discard(_lower.op_name(op))
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(6, 8, 3), nn.GroupNorm(2, 8), nn.Flatten(), nn.Linear(8 * 4 * 3, 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = _train_and_compare(make, OPTIMIZERS["sgd_momentum"], nn.CrossEntropyLoss(), _images(6, (6, 5)),
                                  no_breaks=False)
    breaks = [str(w.message) for w in caught if issubclass(w.category, lazyrt.torch.GraphBreakWarning)]
    assert sum("native_group_norm" in b for b in breaks) == 2, breaks
    assert step.traces == 3, "one compiled piece before, between and after the breaks"


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_with_label_smoothing_trains_as_eager(reduction, weighted):
    # PyTorch 1.13 averages the smoothing term over the targets not ignored through
    # masked_select, a data-dependent shape; the capture computes the same mean without it.
    torch.manual_seed(0)
    weight = torch.rand(4) + 0.5 if weighted else None
    loss_fn = nn.CrossEntropyLoss(weight=weight, reduction=reduction, label_smoothing=0.2, ignore_index=3)
    data = batches("ce")  # labels in [0, 4): class 3 is ignored wherever it is the target
    assert any((y == 3).any() for _, y in data) and all((y != 3).any() for _, y in data)
    _train_and_compare(lambda: mlp(nn.Tanh()), OPTIMIZERS["sgd_momentum"], loss_fn, data)


MORE_OPTIMIZERS = {
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=5e-2, lr_decay=1e-2, weight_decay=1e-2, initial_accumulator_value=0.1),
    "adamax": lambda p: torch.optim.Adamax(p, lr=2e-2, weight_decay=1e-2),
    "adamax_maximize": lambda p: torch.optim.Adamax(p, lr=2e-2, maximize=True),
    "nadam": lambda p: torch.optim.NAdam(p, lr=2e-2, weight_decay=1e-2),
    "radam": lambda p: torch.optim.RAdam(p, lr=2e-2, weight_decay=1e-2),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2),
    "rmsprop_centered_foreach": lambda p: torch.optim.RMSprop(p, lr=1e-2, centered=True, foreach=True),
    "adadelta": lambda p: torch.optim.Adadelta(p, lr=0.5),
    "adadelta_decay_maximize": lambda p: torch.optim.Adadelta(p, lr=0.5, rho=0.8, eps=1e-5, weight_decay=1e-2,
                                                              maximize=True),
    # ASGD: averaging starts at step t0 (mu below 1 from then on); its step reads .item().
    "asgd": lambda p: torch.optim.ASGD(p, lr=5e-2, t0=3, weight_decay=1e-2),
    "asgd_lambd_maximize_foreach": lambda p: torch.optim.ASGD(p, lr=5e-2, lambd=1e-2, t0=2, maximize=True,
                                                              foreach=True),
}


@pytest.mark.parametrize("opt_name", list(MORE_OPTIMIZERS))
def test_more_optimizers_train_as_eager_with_one_capture(opt_name):
    # Adagrad, Adamax, NAdam, RAdam and ASGD read their step count (ASGD its eta and mu too)
    # with .item(), which a capture cannot: their updates are replaced by the same arithmetic
    # over the state tensors and a learning-rate input. 8 steps: RAdam's rectified branch starts at step 6. A scheduler
    # changes the learning rate halfway without a recapture.
    torch.manual_seed(0)
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.Tanh(), seed=3), MORE_OPTIMIZERS[opt_name])
    s_eager, s_lazy = (torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5) for o in (o_eager, o_lazy))
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    for k, (x, y) in enumerate(batches("mse", n=8)):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        s_eager.step()
        s_lazy.step()
    assert step.captures == 1 and step.traces == 1


@pytest.mark.parametrize("opt_name", ["nesterov_foreach", "nesterov", "nesterov_foreach_decay"])
def test_gradients_after_the_step_are_eager_s_with_zero_grad_first(opt_name):
    # zero_grad() first: the gradients the step leaves are visible after it. Eager's for-each
    # nesterov SGD adds the momentum into them (they are its working list); the single-tensor
    # step and a for-each step with weight decay (which works on a copy) leave them as the
    # backward made them. Found by the frontend fuzzer (seed 1807).
    make_opt = {"nesterov_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, foreach=True),
                "nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
                "nesterov_foreach_decay": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                                    weight_decay=1e-2, foreach=True)}[opt_name]
    m_eager, o_eager, m_lazy, o_lazy = twins(lambda: mlp(nn.Tanh()), make_opt)
    eager = standard_step(m_eager, o_eager, nn.MSELoss(), zero_grad_first=True)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, nn.MSELoss(), zero_grad_first=True))
    for k, (x, y) in enumerate(batches("mse")):
        close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert step.captures <= 2


class _ExactGradients(nn.Module):
    """A loss whose gradients are the batch itself (w * x summed), so that lazyrt's and eager's
    gradients are equal bit for bit and what a comparison sees is the optimizer's arithmetic
    alone: an adaptive update divides by a running root mean square, which turns the last-bit
    differences of a near-zero gradient that an MLP's backward sums give into large ones."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.w = nn.Parameter(torch.randn(8, 6, generator=g))
        self.b = nn.Parameter(torch.randn(6, generator=g))

    def forward(self, x, y):
        return (self.w * x).sum() + (self.b * y).sum()


RMSPROP_ADADELTA = {
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2),
    "rmsprop_weight_decay": lambda p: torch.optim.RMSprop(p, lr=1e-2, alpha=0.9, weight_decay=0.1),
    "rmsprop_centered": lambda p: torch.optim.RMSprop(p, lr=1e-2, centered=True, eps=1e-4),
    "rmsprop_momentum": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.9),
    "rmsprop_all": lambda p: torch.optim.RMSprop(p, lr=1e-2, alpha=0.9, eps=1e-6, centered=True, momentum=0.8,
                                                  weight_decay=1e-2, maximize=True),
    "rmsprop_all_foreach": lambda p: torch.optim.RMSprop(p, lr=1e-2, centered=True, momentum=0.8, weight_decay=1e-2,
                                                         foreach=True),
    "adadelta": lambda p: torch.optim.Adadelta(p),
    "adadelta_weight_decay": lambda p: torch.optim.Adadelta(p, lr=0.5, rho=0.8, weight_decay=0.1),
    "adadelta_maximize": lambda p: torch.optim.Adadelta(p, lr=2.0, eps=1e-4, maximize=True),
    "adadelta_foreach": lambda p: torch.optim.Adadelta(p, lr=0.5, weight_decay=1e-2, foreach=True),
}


@pytest.mark.parametrize("opt_name", list(RMSPROP_ADADELTA))
def test_rmsprop_and_adadelta_train_as_eager_with_one_capture(opt_name):
    # RMSprop's and Adadelta's updates are replaced by their arithmetic with the learning rate
    # an input of the graph and their initial state standing in before the first step: ten
    # steps from a fresh optimizer are one capture, a scheduler stepping outside the step (every
    # other step) included, and each step leaves eager's loss, parameters and state.
    m_eager, o_eager, m_lazy, o_lazy = twins(_ExactGradients, RMSPROP_ADADELTA[opt_name])
    s_eager, s_lazy = (torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.7) for o in (o_eager, o_lazy))

    def make(model, opt):
        def step(x, y):
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step
    eager = make(m_eager, o_eager)
    step = lazyrt.torch.compile(make(m_lazy, o_lazy), model=m_lazy, optimizer=o_lazy)
    g = torch.Generator().manual_seed(6)
    for k in range(10):
        x, y = torch.randn(8, 6, generator=g), torch.randn(6, generator=g)
        # The loss sums 54 products of magnitude about 1 in an order of lazyrt's own.
        np.testing.assert_allclose(step(x, y).item(), eager(x, y).item(), rtol=RTOL, atol=1e-5,
                                   err_msg=f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
        s_eager.step()
        s_lazy.step()
    assert o_lazy.param_groups[0]["lr"] < 0.2 * o_lazy.param_groups[0]["initial_lr"]
    assert step.captures == 1 and step.traces == 1


@pytest.mark.parametrize("with_closure", [True, False], ids=["closure", "no_closure"])
def test_lbfgs_step_runs_in_eager_and_trains_as_eager(with_closure):
    # LBFGS's step reads the closure's loss with float() and decides by values how many
    # evaluations to run: no capture can replay it. The call runs in PyTorch eager instead (it
    # used to be refused), warned once and counted as EagerStep, with no capture attempted
    # again; without a closure it fails as eager fails. torch.compile with lazyrt's backend,
    # which breaks the graph at the reads, trains as eager too.
    def make(model):
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)

        def step(x, y):
            def closure():
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss
            return opt.step(closure if with_closure else None)
        return opt, step
    torch.manual_seed(0)
    model = nn.Linear(6, 4)
    m_eager, m_dynamo = copy.deepcopy(model), copy.deepcopy(model)
    opt, step = make(model)
    _, eager = make(m_eager)
    compiled = lazyrt.torch.compile(step, model=model, optimizer=opt)
    if not with_closure:
        x, y = batches("mse", n=1)[0]
        with pytest.raises(TypeError):
            eager(x, y)
        with pytest.warns(lazyrt.torch.GraphBreakWarning, match=r"LBFGS's step\(\) cannot be captured"), \
                pytest.raises(TypeError):
            compiled(x, y)
        return
    eager_steps = lazyrt.metrics.counter("EagerStep")
    for k, (x, y) in enumerate(batches("mse", n=3)):
        close(compiled(x, y).item(), eager(x, y).item(), f"loss at step {k}")
        same_training_state(model, None, m_eager, None, f"after step {k}:")
    assert compiled.captures == 0 and lazyrt.metrics.counter("EagerStep") - eager_steps == 3
    assert torch.optim.LBFGS.step is not None and "_refuse" not in torch.optim.LBFGS.step.__name__
    _, dynamo_step = make(m_dynamo)
    dynamo = torch.compile(dynamo_step, backend="lazyrt")
    m_eager2 = copy.deepcopy(model)
    m_dynamo.load_state_dict(model.state_dict())
    _, eager2 = make(m_eager2)
    for k, (x, y) in enumerate(batches("mse", n=3)):
        close(dynamo(x, y).item(), eager2(x, y).item(), f"loss at step {k}")
        same_training_state(m_dynamo, None, m_eager2, None, f"after step {k}:")


class _Apply(nn.Module):
    """Linear layers around fn, on [batch, 6] inputs ([batch, 2, 5, 6] images for 'image' cases)."""

    def __init__(self, fn, image):
        super().__init__()
        self.fn, self.image = fn, image
        self.pre = nn.Conv2d(2, 3, 3, padding=1) if image else nn.Linear(6, 12)
        with torch.no_grad():
            width = torch.flatten(fn(self.pre(torch.zeros((1, 2, 5, 6) if image else (1, 6)))), 1).shape[1]
        self.post = nn.Linear(width, 4)

    def forward(self, x):
        return self.post(torch.flatten(self.fn(self.pre(x)), 1))


_SCATTER_INDEX = torch.tensor([[5, 0, 9]])


class _Layer:
    """A layer with parameters of its own, made for each model (a part of the model)."""

    def __init__(self, make):
        self.make = make


def _prelu_channels():
    layer = nn.PReLU(3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([0.1, -0.2, 0.5]))
    return layer

_LOWERED_OPS = {  # name -> (fn, image input)
    "elu": (lambda t: F.elu(t, alpha=0.7), False),
    "celu": (lambda t: F.celu(t, alpha=1.3), False),
    "selu": (F.selu, False),
    "hardtanh": (lambda t: F.hardtanh(t, -0.5, 0.8), False),
    "relu6": (F.relu6, False),
    "hardsigmoid": (lambda t: F.hardsigmoid(t * 4), False),
    "hardswish": (lambda t: F.hardswish(t * 4), False),
    "logsigmoid": (lambda t: F.logsigmoid(t * 3), False),
    "glu": (F.glu, False),
    "xlogy": (lambda t: torch.xlogy(t.relu(), t.sigmoid()), False),
    "cumsum_flip": (lambda t: t.cumsum(1).flip(1) - t.flip(-1), False),
    "logsumexp_std": (lambda t: torch.logsumexp(t, 1, keepdim=True) * t.std(1, keepdim=True) + t, False),
    "triu_tril": (lambda t: t * torch.triu(torch.ones(12, 12), 1).mean(0) + torch.tril(t.reshape(-1, 3, 4)).flatten(1),
                  False),
    "constant_pad": (lambda t: F.pad(t, (1, 2, 0, 1), value=0.5), True),
    "reflection_pad2d": (lambda t: F.pad(t, (2, 1, 1, 2), mode="reflect"), True),
    "reflection_pad1d": (lambda t: F.pad(t.flatten(2), (3, 2), mode="reflect"), True),
    "replication_pad2d": (lambda t: F.pad(t, (1, 2, 2, 1), mode="replicate"), True),
    "replication_pad1d": (lambda t: F.pad(t.flatten(2), (2, 3), mode="replicate"), True),
    "bilinear_size": (lambda t: F.interpolate(t, size=(7, 11), mode="bilinear", align_corners=False), True),
    "bilinear_scale": (lambda t: F.interpolate(t, scale_factor=1.5, mode="bilinear", align_corners=False), True),
    "bilinear_corners": (lambda t: F.interpolate(t, scale_factor=2, mode="bilinear", align_corners=True), True),
    "prelu_one": (_Layer(lambda: nn.PReLU(init=0.3)), True),
    "prelu_channels": (_Layer(_prelu_channels), True),
    "sort_topk": (lambda t: torch.cat([t.sort(1, descending=True).values[:, :4], t.sort(1).values[:, :2],
                                       t.topk(3, 1).values, t.topk(2, 1, largest=False).values], 1), False),
    "scatter": (lambda t: t.scatter(1, _SCATTER_INDEX.expand(t.shape[0], 3), t[:, :3] * 2), False),
    "leaky_relu": (lambda t: F.leaky_relu(t, 0.2), False),
    "softplus": (lambda t: F.softplus(t * 3, beta=2, threshold=4), False),
    "log1p_expm1": (lambda t: torch.log1p(t.abs()) + torch.expm1(t * 0.5), False),
    "sin_cos_atan": (lambda t: torch.sin(t) * torch.cos(t) + torch.atan(t) + torch.atan2(t, t.flip(1) + 0.5), False),
    "cumprod_prod": (lambda t: torch.cumprod(t.tanh() + 1.5, 1) + t.prod(1, keepdim=True), False),
    "smooth_l1": (lambda t: F.smooth_l1_loss(t, t.flip(1) * 2, reduction="none", beta=0.5), False),
    "index": (lambda t: torch.cat([t[torch.arange(t.shape[0] - 1, -1, -1)], t[:, _INDEX_COLUMNS] * 2,
                                   t[:, _INDEX_GRID].flatten(1)], 1), False),
    # rows 5 (twice), 0 and 11 of t's transpose get t's first four columns added
    "index_put_accumulate": (lambda t: t.t().index_put((_INDEX_COLUMNS,), t[:, :4].t() * 3, accumulate=True).t(),
                             False),
    "repeat": (lambda t: t.repeat(1, 3) + t.repeat(1, 3).flip(1), False),
    "pixel_shuffle": (lambda t: F.pixel_shuffle(torch.cat([t, t.flip(2), -t, t * 2], 1), 2), True),
    "pixel_unshuffle": (lambda t: F.pixel_unshuffle(t[..., :4, :], 2), True),
    "nearest_scale": (lambda t: F.interpolate(t, scale_factor=2, mode="nearest"), True),
    "nearest_size": (lambda t: F.interpolate(t, size=(7, 9), mode="nearest"), True),
    "diagonal_diag_embed": (lambda t: torch.diag_embed(t[:, :4], 1).flatten(1) + torch.diagonal(
        t.reshape(-1, 3, 4), -1, 1, 2).sum(1, keepdim=True), False),
    "noise_times_zero": (lambda t: t + 0 * torch.randn_like(t) + 0 * torch.empty_like(t).normal_(), False),
}
_INDEX_COLUMNS = torch.tensor([5, 0, -1, 5])
_INDEX_GRID = torch.tensor([[1, 2], [0, -3]])


def _plain_row(name, operands):
    """A plain elementwise row of lazyrt's op table applied by its torch name (the lowering is
    generated from the row): on values in (0.25, 1.25), inside every such op's domain, with a
    bool result taken as 0 and 1, added to t so that the step trains through it."""
    fn = getattr(torch, name)

    def apply(t):
        x = torch.sigmoid(t) + 0.25
        out = fn(x) if operands == 1 else fn(x, x.flip(1))
        return t + 0.1 * (out if out.is_floating_point() else out.to(t.dtype))
    return apply


for _row in lazyrt._C._debug.op_table():
    if _row["api"] in ("Unary", "UnaryFloat", "Arith", "ArithFloat"):
        _LOWERED_OPS["row_" + _row["name"]] = (_plain_row(_row["name"], _row["operands"]), False)


@pytest.mark.parametrize("name", list(_LOWERED_OPS))
def test_more_ops_are_lowered_forward_and_backward(name):
    # Activations, reductions, padding modes and bilinear resizing that used to be graph breaks:
    # each trains inside a step against eager with no op left to PyTorch.
    fn, image = _LOWERED_OPS[name]
    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(3, 2, 5, 6, generator=g) if image else torch.randn(3, 6, generator=g),
             torch.randn(3, 4, generator=g)) for _ in range(STEPS)]

    def make():
        torch.manual_seed(0)
        return _Apply(fn.make() if isinstance(fn, _Layer) else fn, image)
    _train_and_compare(make, OPTIMIZERS["sgd_momentum"], nn.MSELoss(), data)


_BCE_WEIGHT = torch.linspace(0.5, 2, 4)
_COLUMN = torch.arange(4, dtype=torch.float32)
_LOSSES = {  # name -> loss of (output [8, 4], target [8, 4])
    "bce_mean": lambda o, y: F.binary_cross_entropy(torch.sigmoid(o), y),
    "bce_weighted_sum": lambda o, y: F.binary_cross_entropy(torch.sigmoid(o), y, weight=_BCE_WEIGHT, reduction="sum"),
    "bce_none": lambda o, y: (F.binary_cross_entropy(torch.sigmoid(o), y, reduction="none") * _COLUMN).mean(),
    "huber_mean": lambda o, y: F.huber_loss(o, y * 3, delta=0.5),
    "huber_sum": lambda o, y: F.huber_loss(o, y * 2, reduction="sum", delta=1.5) / 8,
    "huber_none": lambda o, y: (F.huber_loss(o, y * 3, reduction="none") * _COLUMN).sum(),
}


@pytest.mark.parametrize("name", list(_LOSSES))
def test_more_losses_train_as_eager(name):
    # Binary cross-entropy and the Huber loss, forward and backward, with their reductions. The
    # Huber loss's backward used to fail the capture (PyTorch 1.13's fake tensors reach an
    # out= decomposition that takes the wrong keyword).
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(8, 6, generator=g), (torch.rand(8, 4, generator=g) > 0.5).float()) for _ in range(STEPS)]
    _train_and_compare(lambda: mlp(nn.Tanh(), seed=9), OPTIMIZERS["sgd_momentum"], _LOSSES[name], data)


def test_binary_cross_entropy_clamps_its_logs_as_torch():
    # Probabilities of exactly 0 and 1 (log gives -inf): each log is clamped at -100, and the
    # gradient's denominator x (1 - x) at 1e-12.
    x = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.3, 1e-30, 1 - 1e-7])
    y = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5, 1.0, 0.0])
    g = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    ops = torch.ops.aten
    got = lowered_results(lambda t: [ops.binary_cross_entropy(t[0], t[1], None, 0),
                                     ops.binary_cross_entropy_backward(t[2], t[0], t[1], None, 0)], [x, y, g])
    want = [F.binary_cross_entropy(x, y, reduction="none"), ops.binary_cross_entropy_backward(g, x, y, None, 0)]
    for a, b, what in zip(got, want, ("loss", "gradient")):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=what)


def test_one_hot_with_a_number_of_classes_compiles():
    # one_hot with num_classes given compiles with no value read (soft targets made from labels,
    # a common recipe): PyTorch traces it as a comparison with an arange.
    loss_fn = lambda o, y: F.cross_entropy(o, F.one_hot(y, 4).float() * 0.9 + 0.025)  # noqa: E731
    step = _train_and_compare(lambda: mlp(nn.ReLU(), seed=2), OPTIMIZERS["adam"], loss_fn, batches("ce"))
    assert step.traces == 1


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(4, 5), (6,)], ids=["2d", "1d"])
def test_cross_entropy_over_positions_trains_as_eager(reduction, shape):
    # Class scores per position ([N, C, H, W] or [N, C, L]): nll_loss2d, forward and backward,
    # with class weights and an ignored class.
    weight = torch.tensor([1.0, 0.5, 2.0])
    loss_fn = lambda o, y: F.cross_entropy(o, y, weight=weight, ignore_index=1, reduction=reduction).sum()  # noqa: E731

    def make():
        torch.manual_seed(0)
        conv = nn.Conv2d(2, 3, 3, padding=1) if len(shape) == 2 else nn.Conv1d(2, 3, 3, padding=1)
        return nn.Sequential(conv, nn.Tanh())
    g = torch.Generator().manual_seed(6)
    data = [(torch.randn(2, 2, *shape, generator=g), torch.randint(0, 3, (2, *shape), generator=g))
            for _ in range(STEPS)]
    _train_and_compare(make, OPTIMIZERS["sgd_momentum"], loss_fn, data)


def test_a_step_that_changes_python_state_runs_first_in_eager_then_is_refused_and_the_state_put_back():
    # Gradient accumulation written with a counter the step keeps in a closure: a replay runs no
    # Python, so the counter would never move and the optimizer would step on every call or on
    # none. The first call's capture changes the counter: undone, and that call runs in eager
    # (state a first call sets up is set up for real that way); the next capture changes it
    # again and is refused, naming the variable, leaving the counter, the list the step appends
    # to and the model as the eager call left them.
    torch.manual_seed(0)
    model = mlp(nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    calls = [0]
    seen = []

    def step(x, y):
        loss = nn.functional.cross_entropy(model(x), y) / 4
        loss.backward()
        calls[0] += 1
        seen.append(loss)
        if calls[0] % 4 == 0:
            opt.step()
            opt.zero_grad()
        return loss
    compiled = lazyrt.torch.compile(step, model=model, optimizer=opt)
    (x, y), = batches("ce", n=1)
    eager_steps = lazyrt.metrics.counter("EagerStep")
    with pytest.warns(lazyrt.torch.GraphBreakWarning, match="changed Python state"):
        compiled(x, y)
    assert calls == [1] and len(seen) == 1 and lazyrt.metrics.counter("EagerStep") == eager_steps + 1
    before = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(lazyrt.torch.CaptureError, match=r"changes Python state.*closure variable 'calls'"):
        compiled(x, y)
    assert calls == [1] and len(seen) == 1
    same_tree(model.state_dict(), before, "parameters after the refused capture")
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)


class _MaskCache(nn.Module):
    """Caches a mask on itself on its first call, as the word language model's transformer
    does: the capture must not leave its stand-in tensor there."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)
        self.mask = None

    def forward(self, x):
        if self.mask is None:
            self.mask = torch.triu(torch.ones(4, 4))
        return self.lin(x) @ self.mask


def test_a_module_that_caches_a_tensor_on_its_first_call_trains_as_eager():
    # The first capture made the cached mask a fake tensor: the next call failed, and any eager
    # use of the module after it raised. Now that call runs in eager and the next is captured.
    m_eager, o_eager, m_lazy, o_lazy = twins(_MaskCache, OPTIMIZERS["sgd_momentum"])
    loss_fn = nn.MSELoss()
    eager = standard_step(m_eager, o_eager, loss_fn)
    step = lazyrt.torch.compile(standard_step(m_lazy, o_lazy, loss_fn), model=m_lazy, optimizer=o_lazy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lazyrt.torch.GraphBreakWarning)
        for k, (x, y) in enumerate(batches("mse")):
            close(step(x, y).item(), eager(x, y).item(), f"loss at step {k}")
            same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
            assert type(m_lazy.mask) is torch.Tensor
    # The first capture makes the mask (a result the call sets on the module), the second
    # reads it (the Python value `mask is None` changed).
    assert step.captures == 2


def test_a_step_that_steps_a_scheduler_is_refused():
    # A learning-rate scheduler stepped inside the step changes the optimizer's groups in
    # Python, which replays would not: refused, and the groups are left as they were.
    torch.manual_seed(0)
    model = mlp(nn.ReLU())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20)
    groups = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss
    compiled = lazyrt.torch.compile(step, model=model, optimizer=opt)
    (x, y), = batches("ce", n=1)
    with pytest.raises(lazyrt.torch.CaptureError, match=r"changes '(betas|lr)' of AdamW's param group 0"):
        compiled(x, y)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups


_SPECIAL = torch.tensor([0.0, -0.0, 1e-8, -1e-8, 3.0, -3.0, 2.9999998, -2.9999998, 1.0, -1.0, 0.5, -0.5, 0.8, -0.8,
                         6.0, 88.0, -88.0, -104.0, 20.0, -20.0, float("inf"), float("-inf"), float("nan")])
_ATEN = torch.ops.aten
_ACTIVATIONS_AT_SPECIAL_VALUES = {  # name -> (fn of [x, g], rtol)
    "elu": (lambda t: [_ATEN.elu(t[0], 0.7, 1.0, 1.0)], 1e-6),
    "selu": (lambda t: [_ATEN.elu(t[0], 1.6732632423543772, 1.0507009873554805, 1.0)], 1e-6),
    "celu": (lambda t: [_ATEN.celu(t[0], 1.3)], 1e-6),
    "elu_backward_of_input": (lambda t: [_ATEN.elu_backward(t[1], 0.7, 1.2, 0.9, False, t[0])], 1e-6),
    # y + alpha * scale cancels near x = -3: an ulp of y (lazyrt's exp against torch's) is 1e-6 there
    "elu_backward_of_result": (lambda t: [_ATEN.elu_backward(t[1], 0.7, 1.2, 0.9, True, _ATEN.elu(t[0], 0.7, 1.2, 0.9))],
                               1e-5),
    "hardtanh": (lambda t: [_ATEN.hardtanh(t[0], -0.5, 0.8), _ATEN.hardtanh_backward(t[1], t[0], -0.5, 0.8)], 1e-6),
    "hardsigmoid": (lambda t: [_ATEN.hardsigmoid(t[0]), _ATEN.hardsigmoid_backward(t[1], t[0])], 1e-6),
    "hardswish": (lambda t: [_ATEN.hardswish(t[0]), _ATEN.hardswish_backward(t[1], t[0])], 1e-6),
    "log_sigmoid": (lambda t: [_ATEN.log_sigmoid_forward(t[0])[0],
                               _ATEN.log_sigmoid_backward(t[1], t[0], _ATEN.log_sigmoid_forward(t[0])[1])], 1e-6),
    "xlogy": (lambda t: [_ATEN.xlogy(t[0], t[1].abs()), _ATEN.xlogy(torch.zeros_like(t[0]), t[0])], 1e-6),
    "huber": (lambda t: [_ATEN.huber_loss(t[0], t[1], 0, 0.5)], 1e-6),
    "smooth_l1": (lambda t: [_ATEN.smooth_l1_loss(t[0], t[1], 0, 0.5), _ATEN.smooth_l1_loss(t[0], t[1], 0, 0.0)], 1e-6),
    "leaky_relu": (lambda t: [_ATEN.leaky_relu(t[0], 0.2), _ATEN.leaky_relu_backward(t[1], t[0], 0.2, False)], 1e-6),
    "softplus": (lambda t: [_ATEN.softplus(t[0], 1.0, 20.0), _ATEN.softplus(t[0], 2.0, 3.0),
                            _ATEN.softplus_backward(t[1], t[0], 2.0, 3.0)], 1e-6),
    "log1p_expm1": (lambda t: [torch.log1p(t[0]), torch.expm1(t[0])], 1e-6),
    "rounding": (lambda t: [torch.floor(t[0]), torch.ceil(t[0]), torch.round(t[0]), torch.round(t[0] * 7, decimals=1),
                            torch.isnan(t[0]), torch.isinf(t[0])], 1e-6),
}


@pytest.mark.parametrize("name", list(_ACTIVATIONS_AT_SPECIAL_VALUES))
def test_lowered_activations_at_special_values_match_torch(name):
    # At the ends of each piece (x = 0, -0, +-3, the hardtanh bounds), near them, at large
    # magnitudes, infinities and nan: lowered and run by lazyrt against ATen's kernels. Found
    # this way: ELU's exp(x) - 1 (not expm1: x = -1e-8 gives 0) and hardswish's backward taking
    # its middle branch on [-3, 3), not [-3, 3].
    fn, rtol = _ACTIVATIONS_AT_SPECIAL_VALUES[name]
    inputs = [_SPECIAL, torch.linspace(-2, 2, _SPECIAL.numel())]
    for k, (got, want) in enumerate(zip(lowered_results(fn, inputs), fn(inputs))):
        same = torch.isclose(got, want, rtol=rtol, atol=0, equal_nan=True) | (got == want)
        # lazyrt's kernels flush denormals to zero (lazyrt.set_flush_denormal, as XLA's CPU backend)
        same |= (got == 0) & (want.abs() < torch.finfo(want.dtype).tiny) if want.is_floating_point() else False
        assert bool(same.all()), (f"result {k} at x = {_SPECIAL[~same].tolist()}: lazyrt {got[~same].tolist()}, "
                                  f"torch {want[~same].tolist()}")


_STEPS_BOUND = 0


class _CountingTrainer:
    def __init__(self, model):
        self.model, self.count = model, 0

    def step(self, x):
        self.count += 1
        return self.model(x).sum()


def _step_binding_a_global(model):
    def step(x):
        global _STEPS_BOUND
        _STEPS_BOUND += 1
        return model(x).sum()
    return step


@pytest.mark.parametrize("kind", ["global", "bound_self"])
def test_a_step_that_changes_a_global_or_its_own_attribute_is_refused(kind):
    # The other places a step reaches: a global its code names, an attribute of its bound self.
    # The first call runs in eager (its capture changed them), the second is refused.
    model = mlp(nn.ReLU())
    if kind == "global":
        fn, what, value = _step_binding_a_global(model), "global '_STEPS_BOUND'", lambda: _STEPS_BOUND
    else:
        trainer = _CountingTrainer(model)
        fn, what, value = trainer.step, "attribute 'count' of the step's _CountingTrainer", lambda: trainer.count
    compiled = lazyrt.torch.compile(fn, model=model)
    start = value()
    with pytest.warns(lazyrt.torch.GraphBreakWarning, match="changed Python state"):
        compiled(torch.randn(3, 6))
    assert value() != start
    after_eager = value()
    with pytest.raises(lazyrt.torch.CaptureError, match=re.escape(what)):
        compiled(torch.randn(3, 6))
    assert value() == after_eager


@pytest.mark.parametrize("where", ["argument", "closure"])
def test_a_sparse_tensor_runs_the_step_in_eager(where):
    # A graph network's sparse adjacency (torch.sparse.mm): lazyrt has no sparse form, so the
    # call runs in PyTorch eager (warned, counted) with eager's results and training state,
    # never a crash; a dense adjacency argument of the same shape compiles, and a sparse one
    # after it is not taken for it by the guard.
    torch.manual_seed(0)
    m_lazy = nn.Linear(5, 3)
    m_eager = copy.deepcopy(m_lazy)
    o_lazy, o_eager = torch.optim.SGD(m_lazy.parameters(), lr=0.1), torch.optim.SGD(m_eager.parameters(), lr=0.1)
    dense = torch.eye(6) * 0.5 + torch.ones(6, 6).triu() * 0.1
    holder = {"adj": dense.to_sparse()}

    def make(model, opt):
        def step(x, adj=None):
            opt.zero_grad()
            a = holder["adj"] if adj is None else adj
            h = torch.sparse.mm(a, model(x)) if a.is_sparse else a @ model(x)
            loss = h.pow(2).sum()
            loss.backward()
            opt.step()
            return loss
        return step
    compiled, eager = lazyrt.torch.compile(make(m_lazy, o_lazy)), make(m_eager, o_eager)
    steps = lazyrt.metrics.counter("EagerStep")
    g = torch.Generator().manual_seed(2)
    for k in range(5):
        x = torch.randn(6, 5, generator=g)
        sparse = k in (0, 1, 4)
        if where == "argument":
            args = (x, dense.to_sparse() if sparse else dense)
        else:
            holder["adj"] = dense.to_sparse() if sparse else dense
            args = (x,)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", lazyrt.torch.GraphBreakWarning)
            got = compiled(*args)
        close(got.item(), eager(*args).item(), f"loss at call {k}")
        same_tree(m_lazy.state_dict(), m_eager.state_dict(), f"parameters after call {k}")
    # A sparse argument is seen per call; a sparse tensor read from a closure makes the step's
    # calls run in eager from then on (a tensor it reads is no part of the call's structure).
    assert lazyrt.metrics.counter("EagerStep") - steps == (3 if where == "argument" else 5)
    assert compiled.captures == (1 if where == "argument" else 0)


def test_a_capture_leaves_other_threads_running_pytorch_own_code():
    # While the main thread captures steps (which swap optimizer updates, LBFGS's step, batch
    # norm's forward and Optimizer.__init__ for lazyrt's), another thread trains in eager with
    # LBFGS, Adam and a cumulative batch norm: it runs PyTorch's own code throughout (before, it
    # got LBFGS refused mid-step and lazyrt's updates), bit for bit as when run alone.
    import threading

    def eager_program():
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=None), nn.Tanh(), nn.Linear(6, 1))
        lbfgs = torch.optim.LBFGS(model[0].parameters(), lr=0.5, max_iter=3)
        adam = torch.optim.Adam(model[3].parameters(), lr=1e-2)
        x, y = torch.randn(16, 4), torch.randn(16, 1)

        def closure():
            lbfgs.zero_grad()
            adam.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        def step():
            loss = lbfgs.step(closure)
            adam.step()
            return loss
        return step, model

    done, errors, steps_run = threading.Event(), [], []
    step_b, model_b = eager_program()

    def other_thread():
        try:
            while not done.is_set():
                step_b()
                steps_run.append(1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=other_thread)
    t.start()
    try:
        for seed in range(3):  # three captures, each of a new step with its own optimizers
            torch.manual_seed(seed)
            m = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=None), nn.ReLU(), nn.Linear(6, 2))
            o = torch.optim.Adam(m.parameters(), lr=1e-3)
            compiled = lazyrt.torch.compile(standard_step(m, o, nn.MSELoss()))
            compiled(torch.randn(8, 4), torch.randn(8, 2))
            assert compiled.captures == 1
    finally:
        done.set()
        t.join()
    assert not errors, f"the other thread failed: {errors[0]!r}"
    assert steps_run, "the other thread ran during the captures"
    step_a, model_a = eager_program()
    for _ in steps_run:
        step_a()
    same_tree(model_b.state_dict(), model_a.state_dict(), "the other thread's model against a run alone", 0, 0)


def test_attention_heads_are_read_where_they_lie():
    """Causal self-attention as nanoGPT writes it (qkv split three ways, the heads moved in
    front of the tokens for the products, moved back after): the products read the heads from
    the qkv value and write the result moved back (gemm_view), so no slice or permute is
    copied; the values are eager's."""
    torch.manual_seed(0)
    qkv, proj = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)
    mask = torch.tril(torch.ones(5, 5)).view(1, 1, 5, 5)

    def attention(x):
        with torch.no_grad():
            b, t, c = x.shape
            q, k, v = qkv(x).split(32, dim=2)
            q, k, v = (z.view(b, t, 4, 8).transpose(1, 2) for z in (q, k, v))
            w = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(8))
            w = torch.softmax(w.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")), dim=-1)
            return proj((w @ v).transpose(1, 2).contiguous().view(b, t, c))

    x = torch.randn(2, 5, 32)
    step = lazyrt.torch.compile(attention)
    torch.testing.assert_close(step(x), attention(x), rtol=1e-5, atol=1e-6)
    lazyrt.metrics.reset()
    lazyrt.metrics.set_kernel_timings(True)
    try:
        step(x)
    finally:
        lazyrt.metrics.set_kernel_timings(False)
    ops = [r["op"] for r in lazyrt.metrics.step_timings()]
    assert "permute" not in ops and "slice" not in ops, ops
    assert ops.count("gemm_view") >= 2, ops
