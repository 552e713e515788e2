"""The lazyrt device (lazyrt.torch._device): torch tensors on torch.device("lazyrt") are lazy,
and everything done with them equals PyTorch eager on the CPU (the oracle) — factories, views
and in-place ops, autograd, torch.optim training with sync() per step, ops that run on the CPU,
and PyTorch's while_loop as one lazyrt loop."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lazyrt
import lazyrt.torch
from lazyrt.torch import GraphBreakWarning

DEV = lazyrt.torch.device()


def close(a, b, tol=1e-5):
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_the_device_is_pytorchs_and_values_come_back():
    assert DEV == torch.device("lazyrt:0") and torch.device("lazyrt").type == "lazyrt"
    x = torch.arange(6.0).reshape(2, 3)
    d = x.to(DEV)
    assert d.device == DEV and d.is_lazyrt and d.shape == (2, 3) and d.dtype == torch.float32
    x.add_(100)  # the device copy is a copy
    assert d.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert (d * 2).sum().item() == 30.0
    assert "device='lazyrt:0'" in repr(d) and "30." in repr((d * 2).sum())
    assert d.to(torch.float64).cpu().dtype == torch.float64
    m = nn.Linear(3, 2).lazyrt()
    assert m.weight.device == DEV and isinstance(m.weight, nn.Parameter)


def test_factories_make_device_tensors():
    t = torch.tensor(3, device=DEV)
    assert t.device == DEV and (t + 10).item() == 13 and t.dtype == torch.int64
    assert torch.zeros(2, 3, device=DEV).cpu().eq(0).all()
    assert torch.ones(4, device="lazyrt", dtype=torch.float64).sum().item() == 4.0
    assert torch.arange(5, device=DEV).cpu().tolist() == [0, 1, 2, 3, 4]
    assert torch.full((2,), 7.0, device=DEV).cpu().tolist() == [7.0, 7.0]
    torch.manual_seed(3)
    r = torch.randn(4, 5, device=DEV)
    torch.manual_seed(3)
    assert torch.equal(r.cpu(), torch.randn(4, 5))  # drawn as on the CPU, from PyTorch's generator
    e = torch.empty(3, 2, device=DEV)
    assert e.shape == (3, 2) and e.device == DEV
    assert torch.zeros_like(r).device == DEV


def _views_and_in_place(dev):
    x = torch.arange(12.0, device=dev).reshape(3, 4)
    y = x * 2
    y[0].add_(10)  # a write through a view shows in its base
    t = y.t()
    t[1, 2] = -1.0  # and through a transposed view
    z = y[:, 1:3]
    z.mul_(3)
    y.clamp_(max=50)
    x.relu_()
    w = y.view(-1)
    w[5] = 0.5
    return y, z, t, w, x


def test_views_and_in_place_ops_as_eager():
    for got, want in zip(_views_and_in_place(DEV), _views_and_in_place("cpu")):
        close(got, want)


def test_autograd_through_the_device_equals_eager():
    torch.manual_seed(0)
    m0 = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    grads = []
    for dev in ("cpu", DEV):
        m = copy.deepcopy(m0).to(dev)
        xi = x.to(dev).detach().requires_grad_()
        loss = F.cross_entropy(m(xi), y.to(dev))
        loss.backward()
        grads.append([loss] + [p.grad for p in m.parameters()] + [xi.grad])
    for a, b in zip(*grads):
        close(b, a)


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        # no bias before the batch norm: its gradient would be rounding noise (zero in exact
        # arithmetic), which Adam-like optimizers divide by its own size
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(F.dropout(h.flatten(1), 0.0, self.training))


def _mlp():
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 10))


def _train(model, dev, make_opt, batches):
    """PyTorch/XLA-style training: everything on `dev`, sync() after each step."""
    m = copy.deepcopy(model).to(dev)
    opt = make_opt(m.parameters())
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(m(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dev != "cpu":
            lazyrt.torch.sync()
        losses.append(loss.detach())
    return losses, m, opt


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw-amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-1),
}


# float64, where a float32 gradient's rounding divided by its own size (RMSprop, Adagrad) cannot
# hide a difference; float32 once (Adam, MLP).
@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS) + ["adam-float32"])
def test_training_on_the_device_equals_eager(model, opt):
    dtype, tol = (torch.float32, 1e-4) if opt.endswith("float32") else (torch.float64, 1e-9)
    make = OPTIMIZERS[opt.replace("-float32", "")]
    torch.manual_seed(1)
    if model == "mlp":
        net = _mlp()
        batches = [(torch.randn(8, 10, dtype=dtype), torch.randint(0, 10, (8,))) for _ in range(4)]
    else:
        net = _CNN()
        batches = [(torch.randn(4, 3, 8, 8, dtype=dtype), torch.randint(0, 10, (4,))) for _ in range(4)]
    net = net.to(dtype)
    want = _train(net, "cpu", make, batches)
    lazyrt.metrics.reset()
    got = _train(net, DEV, make, batches)
    for a, b in zip(want[0], got[0]):
        close(b, a, tol)
    for (n, a), b in zip(want[1].state_dict().items(), got[1].state_dict().values()):
        close(b, a, tol)  # parameters and batch norm's running statistics
    assert len(want[2].state) == len(got[2].state)
    for sa, sb in zip(want[2].state.values(), got[2].state.values()):
        for k in sa:
            if isinstance(sa[k], torch.Tensor):
                close(sb[k], sa[k], tol)
    assert lazyrt.metrics.counter("GraphBreak") == 0


@pytest.mark.parametrize("opt", ["sgd-momentum", "adam", "adamw-cosine"])
def test_one_compile_per_step_shape(opt):
    # Adam's bias corrections and a scheduled learning rate change every step: they enter the
    # graph as data, not as constants, so the steps share one executable.
    torch.manual_seed(2)
    m = _mlp().to(DEV)
    o = OPTIMIZERS[opt.replace("-cosine", "-amsgrad")](m.parameters())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(o, 10) if opt.endswith("cosine") else None
    compiles = []
    for _ in range(5):
        lazyrt.metrics.reset()
        x, y = torch.randn(8, 10), torch.randint(0, 10, (8,))
        F.cross_entropy(m(x.to(DEV)), y.to(DEV)).backward()
        o.step()
        o.zero_grad()
        if sched is not None:
            sched.step()
        lazyrt.torch.sync()
        compiles.append(lazyrt.metrics.counter("UncachedCompile"))
        assert lazyrt.metrics.counter("ExecuteGraph") >= 1
    # the first step (no optimizer state yet) and the second are graphs of their own; then
    # every step runs the second's executable
    assert compiles[2:] == [0, 0, 0], compiles


def test_python_numbers_enter_as_data_with_eagers_values():
    x = torch.randn(6, dtype=torch.float32)
    d = x.to(DEV)
    cases = [lambda t: t * 0.3, lambda t: t / 7.0, lambda t: t.add(t, alpha=0.25), lambda t: t - 1.5,
             lambda t: torch.addcdiv(t, t, t.abs() + 1, value=-0.01), lambda t: torch.addcmul(t, t, t, value=0.5),
             lambda t: torch.lerp(t, t * 2, 0.1), lambda t: torch.arange(6, device=t.device) * 0.5]
    for f in cases:
        close(f(d), f(x), 1e-6)
        close(f(d.double()), f(x.double()), 1e-12)  # the number in float64, unrounded


def test_ops_on_bool_and_int_numbers_keep_pytorchs_result_dtype():
    # An op's result dtype for a number depends on the number's type: True and 1 are equal (and
    # hash alike) in Python, but bool + True is bool, bool + 1 is int64, in either order of calls.
    x = torch.tensor([True, False])
    d = x.to(DEV)
    for numbers in ((1, True), (True, 1)):
        for n in numbers:
            for op in (torch.ops.aten.add.Scalar, torch.ops.aten.mul.Scalar):
                close(op(d, n), op(x, n))


def test_an_op_without_a_lowering_runs_on_the_cpu_and_comes_back(monkeypatch):
    from lazyrt.torch import _lower
    monkeypatch.setattr(_lower.interpreter, "_WARNED_BREAKS", set())  # warned once per process: not yet here
    torch.manual_seed(4)
    a = torch.randn(3, 2, 2)
    lazyrt.metrics.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = []
        for dev in ("cpu", DEV):
            x = a.to(dev).detach().requires_grad_()
            y = torch.linalg.det(x * 2).sum() + torch.special.i0e(x).sum()
            y.backward()
            outs.append((y, x.grad))
    close(outs[1][0], outs[0][0])
    close(outs[1][1], outs[0][1])
    assert lazyrt.metrics.counter("GraphBreak") > 0
    assert any(issubclass(w.category, GraphBreakWarning) for w in caught)


def test_a_compiled_step_reads_device_tensors_from_its_places_on_every_call():
    # A device tensor kept in a global, a namespace's attribute or a dict or tuple there is read
    # from its place on every call, as a CPU tensor there is (and as Dynamo reads a global): a
    # new tensor put there is what the next call reads, and an in-place change inside the step
    # is written back into it. Checked against the same program in eager on the CPU.
    import types

    def program(device, compile):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3).to(device)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        ns = types.SimpleNamespace(scale=torch.full((3,), 0.5).to(device), count=torch.zeros(()).to(device))
        g = {"pair": (torch.tensor([1.0, 2.0, 3.0]).to(device), 7), "d": {"w": torch.ones(3).to(device)}}

        def step(x):
            out = lin(x) * ns.scale + g["pair"][0] * g["d"]["w"]
            ns.count.add_(1)
            loss = out.square().mean() * (1 + ns.count)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        f = lazyrt.torch.compile(step) if compile else step
        xs = torch.randn(7, 2, 4, generator=torch.Generator().manual_seed(1))
        losses = []
        for i in range(7):
            if i == 2:
                ns.scale = torch.full((3,), 2.0).to(device)
            if i == 3:
                g["d"]["w"] = torch.full((3,), -1.0).to(device)
            if i == 4:
                g["pair"] = (torch.tensor([0.0, 1.0, 0.0]).to(device), 7)
            if i == 5:
                ns.scale.mul_(3)
            if i == 6:
                ns.scale = torch.full((1,), 0.25).to(device)  # another shape: captured anew
            losses.append(f(xs[i].to(device)).cpu().item())
        return losses, lin.weight.detach().cpu(), ns.count.cpu().item(), getattr(f, "captures", None)

    want, got = program("cpu", False), program(DEV, True)
    assert got[0] == pytest.approx(want[0], rel=1e-4)
    close(got[1], want[1], 1e-4)
    assert got[2] == want[2] == 7.0  # the step's add_ into the namespace's tensor, every call
    assert got[3] == 2


def test_a_device_tensor_a_compiled_step_cannot_find_is_refused_clearly():
    lin = torch.nn.Linear(3, 3).to(DEV)
    scale = torch.ones(3).to(DEV)

    def step(x, s=scale):  # a default argument's value: no place a capture reads
        return (lin(x) * s).sum()
    with pytest.raises(lazyrt.torch.CaptureError, match="found in none of the places a capture looks"):
        lazyrt.torch.compile(step)(torch.ones(2, 3).to(DEV))
    want = torch.nn.functional.linear(torch.ones(2, 3), lin.weight.cpu(), lin.bias.cpu()).sum().item()
    got = lazyrt.torch.compile(lambda x, s: (lin(x) * s).sum())(torch.ones(2, 3).to(DEV), scale)  # as an argument
    assert got.cpu().item() == pytest.approx(want, rel=1e-5)


def test_mixing_devices_is_refused_as_in_pytorch():
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device=DEV) + torch.ones(3)
    assert (torch.ones(3, device=DEV) + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]  # a CPU scalar mixes


def test_seed_while_loop_on_the_device_is_one_loop_compiled_once():
    # The first seed program with only its device changed (examples/seed/torch_while_loop.py).
    from torch._higher_order_ops.while_loop import while_loop

    def cond_fn(iteri, x):
        return iteri > 0

    def body_fn(iteri, x):
        return iteri - 1, torch.add(x, 1)

    init_val = torch.tensor(3, dtype=torch.int32, device=DEV)
    _, res = while_loop(cond_fn, body_fn, (torch.tensor(10, device=DEV), init_val))
    assert res.device == DEV and res.dtype == torch.int32 and res.item() == 13
    lazyrt.metrics.reset()
    for n in (1000, 100000):
        _, res = while_loop(cond_fn, body_fn, (torch.tensor(n, device=DEV), init_val))
        assert res.item() == n + 3
    assert lazyrt.metrics.counter("UncachedCompile") == 0  # any trip count: the same executable
    x = torch.tensor(1, device=DEV)
    for _ in range(50):  # the host loop it replaces
        x = x + 1
    assert x.item() == 51


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_layers_on_the_device_equal_eager(cls, bias):
    # On a device PyTorch steps these layers with fused cell ops (CUDA's); the device computes them.
    torch.manual_seed(5)
    m0 = cls(3, 4, batch_first=True, num_layers=2, bias=bias).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    results = []
    for dev in ("cpu", DEV):
        m = copy.deepcopy(m0).to(dev)
        xi = x.to(dev).detach().requires_grad_()
        out = m(xi)[0]
        (out * out.tanh()).sum().backward()
        results.append([out] + [p.grad for p in m.parameters()] + [xi.grad])
    for a, b in zip(*results):
        close(b, a, 1e-10)


def test_gpt_trains_on_the_device_as_in_eager():
    # examples/models/gpt.py: causal attention, tied embedding and head (kept tied by the move:
    # no re-tying, which PyTorch/XLA needs), AdamW with two param groups, gradient clipping.
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models"))
    from gpt import GPT, GPTConfig

    torch.manual_seed(6)
    m0 = GPT(GPTConfig()).double()
    batches = [torch.randint(0, 96, (4, 33)) for _ in range(4)]
    runs = []
    for dev in ("cpu", DEV):
        m = copy.deepcopy(m0).to(dev)
        assert m.transformer.wte.weight is m.lm_head.weight
        opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
        losses = []
        lazyrt.metrics.reset()
        for d in batches:
            _, loss = m(d[:, :-1].contiguous().to(dev), d[:, 1:].contiguous().to(dev))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if dev != "cpu":
                lazyrt.torch.sync()
            losses.append(loss.detach())
        runs.append((losses, list(m.parameters()), opt))
    for a, b in zip(runs[0][0], runs[1][0]):
        close(b, a, 1e-10)
    for a, b in zip(runs[0][1], runs[1][1]):
        close(b, a, 1e-10)
    assert lazyrt.metrics.counter("GraphBreak") == 0


class _Tied(nn.Module):
    """A tied embedding and head, a submodule shared by two parents, a shared buffer and an LSTM
    whose input weight is tied to a Linear's."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight
        shared = nn.Linear(4, 4)
        self.a, self.b = nn.Sequential(shared, nn.Tanh()), nn.Sequential(shared)
        self.rnn = nn.LSTM(4, 4, batch_first=True)
        self.proj = nn.Linear(4, 16, bias=False)
        self.proj.weight = self.rnn.weight_ih_l0
        self.register_buffer("scale", torch.tensor(0.5, dtype=torch.float64))
        self.a.register_buffer("scale", self.scale)

    def forward(self, idx):
        h = self.b(self.a(self.emb(idx))) * self.scale
        h = self.rnn(h)[0] + self.proj(h)[..., :4] * self.a.scale
        return self.head(h).flatten(0, 1)


def test_moving_a_module_to_the_device_keeps_its_tied_parameters_tied():
    # PyTorch/XLA unties them (each module gets a copy; its users re-tie after the move): a
    # silently different model. Here the move keeps one Parameter per tie, so the model trains
    # as on the CPU, and moving back to the CPU keeps the ties too.
    torch.manual_seed(4)
    m0 = _Tied().double()
    idx = torch.randint(0, 7, (3, 5))
    runs = []
    for dev in ("cpu", DEV):
        losses, m, _ = _train(m0, dev, lambda ps: torch.optim.Adam(ps, lr=0.05), [(idx, idx.flatten())] * 3)
        assert m.head.weight is m.emb.weight and m.a[0] is m.b[0] and m.proj.weight is m.rnn.weight_ih_l0
        assert m.a.scale is m.scale and m.scale.device == torch.device(dev)
        assert len(list(m.parameters())) == len(list(m0.parameters())) == 7
        assert m.rnn._flat_weights[0] is m.rnn.weight_ih_l0
        runs.append((losses, list(m.parameters()), m))
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        close(b, a, 1e-10)
    back = runs[1][2].cpu()
    assert back.head.weight is back.emb.weight and back.head.weight.device.type == "cpu"
    assert back.proj.weight is back.rnn.weight_ih_l0 and back.rnn._flat_weights[0] is back.rnn.weight_ih_l0
    close(back.head.weight, runs[0][2].head.weight, 1e-10)


def test_an_optimizer_made_before_the_move_is_refused_not_run_on_the_tensors_left_behind():
    # Moving to the device gives the module new tensors (as on PyTorch/XLA): an optimizer made
    # before holds the CPU tensors the module no longer uses, and stepping it would train nothing.
    for towards in (DEV, "cpu"):
        m = nn.Linear(3, 2) if towards == DEV else nn.Linear(3, 2).to(DEV)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m.to(towards)
        before = m.weight.detach().cpu().clone()
        m(torch.ones(1, 3, device=towards)).sum().backward()
        with pytest.raises(RuntimeError, match="Make the optimizer after moving the model"):
            opt.step()
        assert torch.equal(m.weight.detach().cpu(), before)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)  # made after the move: trains the module
        opt.step()
        assert not torch.equal(m.weight.detach().cpu(), before)
    m = nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m.double().float()  # a move on the CPU keeps the parameters themselves, and the optimizer works
    m(torch.ones(1, 3)).sum().backward()
    opt.step()


@pytest.mark.parametrize("causal", [True, False])
def test_scaled_dot_product_attention_on_the_device(causal):
    x = torch.randn(2, 4, 8, 16, dtype=torch.float64)
    mask = torch.rand(8, 8) > 0.3
    runs = []
    for dev in ("cpu", DEV):
        q = x.to(dev).detach().requires_grad_()
        o = F.scaled_dot_product_attention(q, q * 2, q.sin(), is_causal=causal,
                                           attn_mask=None if causal else mask.to(dev))
        (o * o).sum().backward()
        runs.append((o, q.grad))
    for a, b in zip(*runs):
        close(b, a, 1e-10)


def test_a_backward_before_lazyrt_torch_is_imported_does_not_break_the_device():
    # PyTorch's autograd engine sizes its per-device queues at its first backward.
    import subprocess
    import sys
    code = ("import torch\n"
            "torch.nn.Linear(3, 2)(torch.randn(4, 3)).sum().backward()\n"
            "import lazyrt.torch\n"
            "m = torch.nn.Linear(3, 2).to(lazyrt.torch.device())\n"
            "m(torch.ones(4, 3, device='lazyrt')).sum().backward()\n"
            "print(m.weight.grad.cpu().sum().item())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) == 24.0  # d(sum of 4 rows of W @ ones)/dW: 4 per element, 6 elements


# ---- the second seed: PyTorch/XLA's cached-graph calls on device tensors -------------------------

def _replay_setup(model, optimizer, x, warm=0):
    """After `warm` plain steps, traces one step of model/optimizer on x (device tensors) and
    prepares its replay as PyTorch/XLA's dynamo bridge does. Returns a function running one
    replay."""
    L = lazyrt.torch
    _eager_steps(model, optimizer, x, warm)
    L.sync()
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    outputs = [loss] + list(model.parameters())
    graph_hash = L._get_graph_hash(outputs)
    L._xla_warm_up_cache(outputs, [])
    ids, values = L._get_tensors_xla_device_data_node(outputs)
    x_id = L._xla_get_tensor_id(x)
    matcher = L.GraphInputMatcher({x_id: 0}, ids, values, {x_id})
    return lambda: L._run_cached_graph(graph_hash, matcher([x]))


def _eager_steps(model, optimizer, x, n):
    losses = []
    for _ in range(n):
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _replay_program(seed):
    """A random small training program for the replay's differential test: layer widths,
    depth, activation, optimizer and its settings, dtype, replays."""
    import random
    r = random.Random(seed)
    widths = [r.randint(1, 6) for _ in range(r.randint(2, 4))]
    act = r.choice([nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid])
    # float64: the replay is tested, not float32's rounding, which centered RMSprop amplifies
    # (the float32 seed program is in test_seed_programs.py)
    dtype = torch.float64
    kind = r.choice(["sgd", "sgd-momentum", "adam", "adamw", "rmsprop"])
    settings = {"lr": r.choice([1e-3, 1e-2, 0.1]), "weight_decay": r.choice([0.0, 0.01, 0.1])}
    if kind == "sgd-momentum":
        settings.update(momentum=0.9, nesterov=r.random() < 0.5)
    if kind in ("adam", "adamw"):
        settings.update(amsgrad=r.random() < 0.3, capturable=True)
    if kind == "rmsprop":
        settings.update(momentum=r.choice([0.0, 0.5]), centered=r.random() < 0.5, capturable=True)
    # SGD's first step makes its momentum buffer from the gradient: a step to replay is a later one
    warm = r.randint(1, 2) if kind == "sgd-momentum" else r.randint(0, 1)
    return dict(widths=widths, act=act, dtype=dtype, kind=kind, settings=settings, batch=r.randint(1, 5),
                replays=r.randint(2, 5), warm=warm)


_OPT_CLASSES = {"sgd": torch.optim.SGD, "sgd-momentum": torch.optim.SGD, "adam": torch.optim.Adam,
                "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}


@pytest.mark.parametrize("seed", range(16))
def test_random_steps_replayed_on_the_device_equal_eager_steps(seed):
    # Replay by PyTorch/XLA's low-level calls against the same steps in PyTorch eager on the
    # CPU: after every replay the loss, the parameters and the optimizer state agree to 1e-9.
    # The programs run with float64 as the default dtype, which is the dtype of the step
    # counts that capturable optimizers compute their bias corrections in (eager's are
    # Python floats).
    p = _replay_program(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(p["dtype"])
    try:
        _replayed_program(seed, p)
    finally:
        torch.set_default_dtype(default)


def _replayed_program(seed, p):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(p["widths"], p["widths"][1:]):
        layers += [nn.Linear(a, b), p["act"]()]
    cpu = nn.Sequential(*layers[:-1]).to(p["dtype"])
    dev = copy.deepcopy(cpu).to(DEV)
    cls, settings = _OPT_CLASSES[p["kind"]], p["settings"]
    cpu_opt = cls(cpu.parameters(), **{k: v for k, v in settings.items() if k != "capturable"})
    dev_opt = cls(dev.parameters(), **settings)
    x = torch.randn(p["batch"], p["widths"][0], dtype=p["dtype"])
    tol = 1e-4 if p["dtype"] == torch.float32 else 1e-9
    replay = _replay_setup(dev, dev_opt, x.to(DEV), p["warm"])
    want = _eager_steps(cpu, cpu_opt, x, p["warm"] + p["replays"])[p["warm"]:]
    lazyrt.metrics.reset()
    for k in range(p["replays"]):
        got = replay()
        close(got[0], torch.tensor(want[k], dtype=p["dtype"]), tol)
    assert lazyrt.metrics.counter("UncachedCompile") == 0
    assert lazyrt.metrics.counter("ReplayGraph") == p["replays"]
    for a, b in zip(cpu.parameters(), dev.parameters()):
        close(b, a, tol)
    for sa, sb in zip(cpu_opt.state.values(), dev_opt.state.values()):
        for key, value in sa.items():
            if isinstance(value, torch.Tensor):
                close(sb[key].to(value.dtype), value, tol)


def test_replay_refuses_cpu_optimizer_state_and_changed_hyperparameters():
    torch.manual_seed(0)
    m = nn.Linear(5, 3).to(DEV)
    x = torch.randn(10, 5).to(DEV)
    # AdamW's default (capturable=False) computes its bias corrections from a step count on the
    # CPU: a replay would repeat the traced step's, so it is refused, not replayed stale.
    with pytest.raises(RuntimeError, match="capturable=True"):
        _replay_setup(m, torch.optim.AdamW(m.parameters(), lr=1e-2), x)
    # SGD's first step makes its momentum buffer from the gradient, where later steps update
    # it in place: replaying the first would restart the momentum every time, so it is refused.
    with pytest.raises(RuntimeError, match="momentum_buffer"):
        _replay_setup(m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), x)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)
    replay = _replay_setup(m, opt, x)
    first = replay()[0].item()
    assert replay()[0].item() != first
    opt.param_groups[0]["lr"] = 0.5  # the graph holds the traced learning rate
    weight = m.weight.cpu()
    with pytest.raises(RuntimeError, match="lr changed since the step was traced"):
        replay()
    close(m.weight, weight, 0)  # nothing ran


def test_device_tensors_alias_as_in_pytorch():
    # A device tensor's lazyrt tensor is its identity: detach() and .data share it, clone()
    # does not, in-place ops that change a shape, out= ops and set_ work as on the CPU.
    def program(dev):
        p = nn.Parameter(torch.ones(3, device=dev))
        p.data.mul_(3)
        d = p.detach()
        c = p.clone()
        with torch.no_grad():
            p.add_(1)
        q = torch.arange(3.0, device=dev)
        p.data = q
        q.add_(1)
        x = torch.arange(6.0, device=dev).reshape(2, 3)
        y = x.view(6)
        x.t_()
        x[0, 1] = 100
        z = torch.arange(4.0, device=dev)
        z.unsqueeze_(0)
        o = torch.empty(0, device=dev)
        torch.add(x, 1, out=o)
        s = torch.zeros(2, device=dev)
        s.set_(q)
        g = torch.zeros(3, 3, device=dev)
        g.diagonal().add_(5)
        return p, d, c, q, x, y, z, o, s, g
    for got, want in zip(program(DEV), program("cpu")):
        close(got, want, 0)
    with pytest.raises(RuntimeError, match="as_strided.*is a copy"):
        torch.arange(6.0, device=DEV).as_strided((2, 2), (1, 1)).add_(1)


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("zero", ["first", "last"])
def test_compiled_step_of_device_tensors_equals_eager(opt, zero):
    # lazyrt.torch.compile of a step on device tensors: captured once, replayed, its results on
    # the device, and the parameters, gradients (left set, or cleared) and optimizer state equal
    # eager's on the CPU after every call.
    torch.manual_seed(3)
    cpu = _mlp().double()
    dev = copy.deepcopy(cpu).to(DEV)
    cpu_opt, dev_opt = OPTIMIZERS[opt](cpu.parameters()), OPTIMIZERS[opt](dev.parameters())

    def body(model, o, x, y):
        if zero == "first":
            o.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        o.step()
        if zero == "last":
            o.zero_grad()
        return loss

    step = lazyrt.torch.compile(lambda x, y: body(dev, dev_opt, x, y), model=dev, optimizer=dev_opt)
    for _ in range(4):
        x, y = torch.randn(8, 10, dtype=torch.float64), torch.randint(0, 10, (8,))
        got = step(x.to(DEV), y.to(DEV))
        want = body(cpu, cpu_opt, x, y)
        assert got.device == DEV
        close(got, want, 1e-9)
        for a, b in zip(cpu.parameters(), dev.parameters()):
            close(b, a, 1e-9)
            assert (a.grad is None) == (b.grad is None)
            if a.grad is not None:
                assert b.grad.device == DEV
                close(b.grad, a.grad, 1e-9)
        for sa, sb in zip(cpu_opt.state.values(), dev_opt.state.values()):
            for k, v in sa.items():
                if isinstance(v, torch.Tensor):
                    close(sb[k].to(v.dtype).cpu(), v, 1e-9)
    assert step.captures == 1


def test_autocast_on_the_device_follows_pytorchs_device_policy():
    # torch.autocast("lazyrt") uses PyTorch's autocast lists for devices (documented in
    # torch.amp as CUDA's: matrix products and convolutions in the lower precision; exp,
    # layer_norm, softmax, log_softmax, sum and the losses in float32; mixed inputs promoted).
    # Each result is checked against eager on the CPU computing the same casts by hand.
    torch.manual_seed(0)
    x, w, img, k = torch.randn(4, 8), torch.randn(3, 8), torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    y = torch.randint(0, 3, (4,))
    bf = torch.bfloat16
    lin = F.linear(x.to(bf), w.to(bf))
    cases = {
        "linear": (lambda x, w, img, k, y: F.linear(x, w), lin),
        "conv2d": (lambda x, w, img, k, y: F.conv2d(img, k), F.conv2d(img.to(bf), k.to(bf))),
        "softmax": (lambda x, w, img, k, y: F.softmax(F.linear(x, w), -1), F.softmax(lin.float(), -1)),
        "layer_norm": (lambda x, w, img, k, y: F.layer_norm(F.linear(x, w), (3,)), F.layer_norm(lin.float(), (3,))),
        "sum": (lambda x, w, img, k, y: F.linear(x, w).sum(), lin.float().sum()),
        "exp": (lambda x, w, img, k, y: torch.exp(F.linear(x, w)), torch.exp(lin.float())),
        "cross_entropy": (lambda x, w, img, k, y: F.cross_entropy(F.linear(x, w), y), F.cross_entropy(lin.float(), y)),
        "promote": (lambda x, w, img, k, y: F.linear(x, w) + x[:, :3], lin.float() + x[:, :3]),
    }
    for name, (f, want) in cases.items():
        with torch.autocast(DEV.type, dtype=bf):
            got = f(*(t.to(DEV) for t in (x, w, img, k, y)))
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        close(got, want, 1e-2)
    # and a training step under it: the gradients reach the float32 parameters
    m = nn.Linear(8, 3).to(DEV)
    with torch.autocast(DEV.type, dtype=bf):
        loss = F.cross_entropy(m(x.to(DEV)), y.to(DEV))
    loss.backward()
    ref = nn.Linear(8, 3)
    ref.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    F.cross_entropy(F.linear(x.to(bf), ref.weight.to(bf), ref.bias.to(bf)).float(), y).backward()
    assert m.weight.grad.dtype == torch.float32
    close(m.weight.grad, ref.weight.grad, 1e-2)


@pytest.mark.parametrize("make", [lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
                                  lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, fused=True),
                                  lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True)])
def test_fused_optimizers_on_the_device_equal_eager(make):
    # PyTorch's fused optimizer kernels exist for the CPU only: on the device the step runs
    # there (a graph break) and every list it updates in place (parameters, moments) comes back.
    torch.manual_seed(4)
    net = _mlp().double()
    batches = [(torch.randn(8, 10, dtype=torch.float64), torch.randint(0, 10, (8,))) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphBreakWarning)
        want, got = _train(net, "cpu", make, batches), _train(net, DEV, make, batches)
    for a, b in zip(want[0], got[0]):
        close(b, a, 1e-9)
    for a, b in zip(want[1].parameters(), got[1].parameters()):
        close(b, a, 1e-9)
    for sa, sb in zip(want[2].state.values(), got[2].state.values()):
        for k, v in sa.items():
            if isinstance(v, torch.Tensor) and v.dim():
                close(sb[k], v, 1e-9)


def test_replay_refuses_random_values_drawn_on_the_host_and_redraws_the_devices():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 16), nn.Dropout(0.5), nn.Linear(16, 1)).to(DEV)
    x = torch.randn(10, 5).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    # dropout draws from lazyrt's generator, whose state every replay advances: new masks
    replay = _replay_setup(m, opt, x)
    losses = [replay()[0].item() for _ in range(3)]
    assert len(set(losses)) == 3, losses
    # torch.randn(..., device=) draws on the host, from PyTorch's generator: a replay would
    # repeat that draw, so it is refused
    lazyrt.torch.sync()
    noisy = m(x + torch.randn(10, 5, device=DEV)).sum()
    with pytest.raises(RuntimeError, match="drew random values on the host"):
        lazyrt.torch._xla_warm_up_cache([noisy], [])


def test_replay_refuses_steps_with_graph_breaks_or_reads():
    # An op run on the CPU (no lowering) computes its result once, at the trace; a value read in
    # the step (.item()) computes part of the step and may steer its Python: neither replays.
    torch.manual_seed(0)
    m = nn.Linear(3, 3).to(DEV)
    lazyrt.torch.sync()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphBreakWarning)
        out = torch.linalg.det(m.weight) * m(torch.ones(1, 3, device=DEV)).sum()
    with pytest.raises(RuntimeError, match="aten._linalg_det.default on the CPU"):
        lazyrt.torch._xla_warm_up_cache([out], [])
    lazyrt.torch.sync()
    out = m(torch.ones(1, 3, device=DEV)).sum()
    scale = 2.0 if out.item() > 0 else 3.0
    with pytest.raises(RuntimeError, match=r"read device values \(.item\(\)\)"):
        lazyrt.torch._xla_warm_up_cache([out * scale], [])


def test_views_computed_as_copies_see_their_inputs_changes():
    # unfold, as_strided and view(dtype) are copies in lazyrt: each is computed again from its
    # input when the input (or a view of it) was changed in place since, as a view would show.
    def program(dev):
        x = torch.arange(8.0, device=dev)
        u, s, v = x.unfold(0, 3, 2), x.as_strided((3, 2), (2, 1)), x.view(torch.int32)
        x.add_(1)
        before = (u * 1, s + 0, v.clone())
        x[0] = 100
        x.view(2, 4)[1].mul_(2)
        return (*before, u + 0, s.sum(), v.cpu())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphBreakWarning)
        for got, want in zip(program(DEV), program("cpu")):
            assert torch.equal(got.cpu(), want)
