"""lazyrt.nn from Python: Module registration and state as in torch.nn, layers that draw the
same initial weights as the C++ layers, losses against PyTorch, and an MLP trained side by side
with PyTorch from the same initial weights."""

from collections import OrderedDict

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn
import lazyrt.nn.functional as F
from conftest import assert_same, pair


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.scale = nn.Parameter(lr.ones(4))
        self.register_buffer("count", lr.zeros(1))
        self.register_buffer("scratch", lr.zeros(2), persistent=False)
        self.plain = lr.zeros(3)  # not registered: does not require grad

    def forward(self, x):
        return self.fc(x) * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))
        self.w = lr.randn(2).requires_grad_()  # a leaf that requires grad is a parameter

    def forward(self, x):
        return self.head(self.block(x)) + self.w


def test_attribute_assignment_registers_parameters_buffers_and_submodules():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["w", "block.scale", "block.fc.weight", "block.fc.bias", "head.1.weight", "head.1.bias"]
    assert [n for n, _ in net.named_buffers()] == ["block.count", "block.scratch"]
    # PyTorch's order: each module's parameters, then its buffers, then its children.
    assert list(net.state_dict()) == ["w", "block.scale", "block.count", "block.fc.weight", "block.fc.bias",
                                      "head.1.weight", "head.1.bias"]
    assert len(list(net.parameters())) == 6
    assert len(list(net.parameters(recurse=False))) == 1
    assert [type(m).__name__ for m in net.children()] == ["Block", "Sequential"]
    assert [n for n, _ in net.named_modules()] == ["", "block", "block.fc", "head", "head.0", "head.1"]
    assert isinstance(net.block.scale, nn.Parameter) and isinstance(net.block.scale, lr.Tensor)
    assert net.block.scale.requires_grad and net.block.scale.is_leaf
    assert "plain" not in dict(net.block.named_parameters())
    out = net(lr.ones(5, 3))
    assert out.shape == (5, 2)


def test_shared_parameters_are_listed_once_and_reassignment_replaces():
    a = nn.Linear(2, 2)
    s = nn.Sequential(a, a)
    assert len(list(s.parameters())) == 2
    m = nn.Module()
    m.p = nn.Parameter(lr.ones(2))
    m.p = nn.Parameter(lr.zeros(3))
    assert [tuple(p.shape) for p in m.parameters()] == [(3,)]
    m.p = None
    assert list(m.parameters()) == [] and m.p is None
    with pytest.raises(TypeError):
        m.p = lr.ones(2)  # a parameter slot takes parameters
    m.sub = nn.Linear(1, 1)
    del m.sub
    assert list(m.children()) == []
    with pytest.raises(AttributeError):
        m.missing


def test_state_dict_and_load_state_dict():
    lr.manual_seed(0)
    a = Net()
    lr.manual_seed(1)
    b = Net()
    ids = {n: lr.tensor_id(p) for n, p in b.named_parameters()}
    result = b.load_state_dict(a.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert p.tolist() == q.tolist(), n
    assert {n: lr.tensor_id(p) for n, p in b.named_parameters()} == ids, "loaded in place"
    assert all(p.requires_grad for p in b.parameters())


def test_load_state_dict_is_all_or_nothing():
    a = Net()
    before = {n: t.tolist() for n, t in a.state_dict().items()}
    bad = OrderedDict((n, lr.zeros_like(t)) for n, t in a.state_dict().items())
    bad["head.1.bias"] = lr.zeros(7)
    with pytest.raises(lr.Error, match="head.1.bias"):
        a.load_state_dict(bad)
    missing = OrderedDict((n, lr.zeros_like(t)) for n, t in a.state_dict().items() if n != "w")
    with pytest.raises(lr.Error, match="missing key 'w'"):
        a.load_state_dict(missing)
    extra = OrderedDict((n, lr.zeros_like(t)) for n, t in a.state_dict().items())
    extra["nope"] = lr.zeros(1)
    with pytest.raises(lr.Error, match="unexpected key 'nope'"):
        a.load_state_dict(extra)
    assert {n: t.tolist() for n, t in a.state_dict().items()} == before, "nothing changed"
    r = a.load_state_dict(missing, strict=False)
    assert r.missing_keys == ["w"] and a.w.tolist() == before["w"]
    assert a.block.fc.weight.tolist() == np.zeros((4, 3)).tolist()


def test_load_state_dict_from_torch_and_numpy():
    m = nn.Linear(3, 2)
    t = torch.nn.Linear(3, 2).double()
    m.load_state_dict(t.state_dict())
    assert_same(m.weight, t.weight.detach().float())
    m.load_state_dict({"weight": np.ones((2, 3)), "bias": np.zeros(2)})
    assert m.weight.tolist() == [[1.0] * 3] * 2


def test_train_eval_zero_grad_repr():
    net = Net()
    assert net.training and net.block.fc.training
    assert net.eval() is net and not net.training and not net.head[1].training
    net.train()
    assert net.head[1].training
    net(lr.ones(2, 3)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(p.grad.tolist() == np.zeros(tuple(p.shape)).tolist() for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    assert repr(nn.Linear(3, 2)) == "Linear(in_features=3, out_features=2, bias=True)"
    assert "(0): ReLU()" in repr(net.head)
    assert net.to("cpu") is net


def test_linear_draws_the_same_weights_as_the_cpp_layer():
    for shape in [(5, 3), (1, 1), (16, 8)]:
        lr.manual_seed(123)
        py_layer = nn.Linear(*shape)
        lr.manual_seed(123)
        cpp_layer = lr._C._nn.Linear(*shape)
        assert py_layer.weight.tolist() == cpp_layer.weight.tolist()
        assert py_layer.bias.tolist() == cpp_layer.bias.tolist()
        x = lr.rand(4, shape[0])
        assert py_layer(x).tolist() == cpp_layer(x).tolist()
    lr.manual_seed(5)
    no_bias = nn.Linear(4, 2, bias=False)
    lr.manual_seed(5)
    assert no_bias.bias is None and no_bias.weight.tolist() == lr._C._nn.Linear(4, 2, False).weight.tolist()


def test_cpp_modules_are_bound():
    lr.manual_seed(3)
    seq = lr._C._nn.Sequential(lr._C._nn.Linear(3, 4), lr._C._nn.ReLU(), lr._C._nn.Linear(4, 1))
    assert len(seq) == 3 and [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert seq(lr.ones(2, 3)).shape == (2, 1)
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    seq.eval()
    assert not seq.training
    d = lr._C._nn.Dropout(0.3)
    assert d.p == 0.3 and d.type_name == "Dropout"


def test_layers_and_losses_match_torch(rng):
    x, t = pair(rng, (6, 4), lr.float32, -2, 2)
    for m, tm in [(nn.ReLU(), torch.nn.ReLU()), (nn.Tanh(), torch.nn.Tanh()), (nn.Sigmoid(), torch.nn.Sigmoid()),
                  (nn.Identity(), torch.nn.Identity()), (nn.Flatten(0), torch.nn.Flatten(0)),
                  (nn.LogSoftmax(1), torch.nn.LogSoftmax(1))]:
        assert_same(m(x), tm(t), rtol=1e-6, atol=1e-6, what=type(m).__name__)
    d = nn.Dropout(0.5)
    d.eval()
    assert d(x).tolist() == x.tolist()
    y, u = pair(rng, (6, 4), lr.float32, -2, 2)
    labels = rng.integers(0, 4, size=6)
    for reduction in ["mean", "sum", "none"]:
        assert_same(nn.MSELoss(reduction)(x, y), torch.nn.MSELoss(reduction=reduction)(t, u), rtol=1e-6)
        assert_same(nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.2)(x, lr.tensor(labels)),
                    torch.nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.2)(t, torch.tensor(labels)),
                    rtol=1e-6, atol=1e-6)
        assert_same(nn.BCEWithLogitsLoss(reduction)(x, (y > 0).float()),
                    torch.nn.BCEWithLogitsLoss(reduction=reduction)(t, (u > 0).float()), rtol=1e-6, atol=1e-6)
    with pytest.raises(lr.Error):
        F.mse_loss(x, lr.zeros(3))


def test_subclassing_with_custom_forward_arguments():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x, y, scale=1.0):
            return (self.a(x) + y) * scale

    m = TwoInputs()
    assert m(lr.ones(1, 2), lr.ones(1, 2), scale=2.0).shape == (1, 2)
    with pytest.raises(AttributeError, match="before Module.__init__"):
        class Broken(nn.Module):
            def __init__(self):
                self.x = 1
        Broken()


# ---- training side by side with PyTorch -------------------------------------------------------

def make_mlp(lib):
    n = lib.nn
    return n.Sequential(n.Linear(8, 16), n.Tanh(), n.Linear(16, 16), n.ReLU(), n.Linear(16, 3))


def copy_to_torch(model, tmodel):
    tmodel.load_state_dict({k: lr.to_torch(v).clone() for k, v in model.state_dict().items()})


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW"])
def test_mlp_trains_like_torch(optimizer, rng):
    lr.manual_seed(42)
    model = make_mlp(lr)
    tmodel = make_mlp(torch)
    copy_to_torch(model, tmodel)
    kwargs = {"SGD": dict(lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True),
              "Adam": dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=1e-3),
              "AdamW": dict(lr=1e-2, weight_decay=0.05)}[optimizer]
    opt = getattr(lr.optim, optimizer)(model.parameters(), **kwargs)
    topt = getattr(torch.optim, optimizer)(tmodel.parameters(), **kwargs)
    xs = [pair(rng, (32, 8), lr.float32, -1, 1) for _ in range(4)]
    labels = [rng.integers(0, 3, size=32) for _ in range(4)]
    losses, tlosses = [], []
    for step in range(12):
        (x, t), y = xs[step % 4], labels[step % 4]
        loss = F.cross_entropy(model(x), lr.tensor(y), label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lr.mark_step()
        losses.append(loss.item())
        tloss = torch.nn.functional.cross_entropy(tmodel(t), torch.tensor(y), label_smoothing=0.1)
        tloss.backward()
        topt.step()
        topt.zero_grad()
        tlosses.append(tloss.item())
    np.testing.assert_allclose(losses, tlosses, rtol=1e-5)
    assert len(set(losses)) == len(losses), "every step changed the model"
    for (n, p), tp in zip(model.named_parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=n)


def test_regression_with_mse_trains_like_torch(rng):
    lr.manual_seed(9)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.Linear(8, 1))
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 1))
    copy_to_torch(model, tmodel)
    opt = lr.optim.SGD(model.parameters(), lr=0.05)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.05)
    x, t = pair(rng, (16, 4), lr.float32, -1, 1)
    y, u = pair(rng, (16, 1), lr.float32, -1, 1)
    for _ in range(10):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lr.mark_step()
        tloss = torch.nn.functional.mse_loss(tmodel(t), u)
        tloss.backward()
        topt.step()
        topt.zero_grad()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)


def test_load_state_dict_copies_pytorch_tensors_at_once():
    # The module must not read PyTorch's memory later, when its copy is computed: PyTorch may
    # have changed it by then (an optimizer step on the source model).
    tm = torch.nn.Linear(2, 2)
    lm = nn.Linear(2, 2)
    lm.load_state_dict(tm.state_dict())
    want = tm.bias.tolist()
    with torch.no_grad():
        tm.bias.add_(100.0)
        tm.weight.zero_()
    assert lm.bias.tolist() == want
    assert lm.weight.abs().sum().item() > 0
