"""lazyrt.torch: the Python values a step reads are constants of its capture, guarded.

A replay runs no Python, so a global learning rate, a loss weight in a closure, ``args.clip``
or a module's non-tensor attribute is the value it had when the step was captured. Each test
changes such a value between calls of a training loop and compares every call with PyTorch
eager from the same initial state (losses, parameters, gradients): the compiled step captures
again exactly when a value it reads changed, and replays otherwise.
"""

import argparse
import copy
import types
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lazyrt
import lazyrt.metrics
import lazyrt.torch

RTOL, ATOL = 1e-5, 1e-6


def close(a, b, what):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL, err_msg=what)


def same_state(m1, m2, what):
    for (name, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        close(p1.detach().numpy(), p2.detach().numpy(), f"{what}: parameter {name}")
        assert (p1.grad is None) == (p2.grad is None), f"{what}: {name}.grad"
        if p1.grad is not None:
            close(p1.grad.numpy(), p2.grad.numpy(), f"{what}: {name}.grad")


def batches(n, seed=0, shape=(8, 6), out=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g), torch.randn(shape[0], out, generator=g)) for _ in range(n)]


def run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, data):
    """Calls both steps on `data`; before call k, schedule(k) changes the value(s) (returns
    True where it changed one the step reads, None where it changed only others, else False).
    Compares every call with eager, counts that the compiled step captured once at the start
    and once per change of a value it reads, and that a call with no change after a call with
    no capture is a fast call (the guard in C++ holds with the values it checks)."""
    schedule_changed_last = [True]
    expected = 0
    for k, (x, y) in enumerate(data):
        changed = schedule(k)
        if k == 0 or changed is True:
            expected += 1
        ref = eager_step(x, y)
        fast = lazyrt.metrics.counter("TorchFastCall")
        got = compiled(x, y)
        if k > 0 and changed is False and schedule_changed_last[0] is not True:
            assert lazyrt.metrics.counter("TorchFastCall") == fast + 1, f"call {k} is no fast call"
        schedule_changed_last[0] = True if k == 0 else changed
        close(got.item(), ref.item(), f"loss of call {k}")
        same_state(lazy_model, eager_model, f"call {k}")
        assert compiled.captures == expected, f"call {k}: {compiled.captures} captures, expected {expected}"


def pair(make):
    torch.manual_seed(0)
    eager = make()
    return eager, copy.deepcopy(eager)


# ---- a global: hand-written SGD with a learning rate divided when validation stalls -----------

lr = 0.5


def _hand_sgd(model):
    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
            p.grad = None
        return loss
    return step


def test_a_global_learning_rate_of_hand_written_sgd():
    global lr
    eager_model, lazy_model = pair(lambda: nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)))
    compiled = lazyrt.torch.compile(_hand_sgd(lazy_model))
    fast = lazyrt.metrics.counter("TorchFastCall")

    def schedule(k):
        global lr
        if k in (3, 6):
            lr = lr / 4
            return True
        return False
    lr = 0.5
    try:
        run_schedule(_hand_sgd(eager_model), compiled, eager_model, lazy_model, schedule, batches(9))
    finally:
        lr = 0.5
    assert lazyrt.metrics.counter("TorchFastCall") > fast, "the calls between changes are fast calls"


# ---- a closure variable rebound with nonlocal -------------------------------------------------

def _weighted(model, opt):
    weight = 1.0

    def step(x, y):
        loss = weight * F.mse_loss(model(x), y) + (1 - weight) * model(x).abs().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def set_weight(w):
        nonlocal weight
        weight = w
    return step, set_weight


def test_a_loss_weight_in_a_closure_rebound_with_nonlocal():
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step, eager_set = _weighted(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9))
    lazy_step, lazy_set = _weighted(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1, momentum=0.9))
    compiled = lazyrt.torch.compile(lazy_step)
    weights = {2: 0.25, 5: 0.75}

    def schedule(k):
        if k in weights:
            eager_set(weights[k])
            lazy_set(weights[k])
            return True
        return False
    run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(8))


# ---- an attribute of an object the step reads: args.clip --------------------------------------

def _clipped(model, opt, args):
    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.grad.clamp_(-args.clip, args.clip)
        opt.step()
        opt.zero_grad()
        return loss
    return step


def test_args_clip_on_a_namespace_changed_between_calls():
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_args, lazy_args = argparse.Namespace(clip=0.05), argparse.Namespace(clip=0.05)
    eager_step = _clipped(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.5), eager_args)
    compiled = lazyrt.torch.compile(_clipped(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.5), lazy_args))

    def schedule(k):
        if k in (2, 4):
            eager_args.clip = lazy_args.clip = eager_args.clip * 3
            return True
        if k == 6:  # another attribute, which the step does not read: no capture
            eager_args.epochs = lazy_args.epochs = 7
            return None
        return False
    run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(8))


def test_a_namespace_in_a_global_read_by_a_called_function():
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.3)
    lazy_opt = torch.optim.SGD(lazy_model.parameters(), lr=0.3)

    def make(model, opt):
        def step(x, y):
            loss = _config_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step
    compiled = lazyrt.torch.compile(make(lazy_model, lazy_opt))

    def schedule(k):
        if k == 3:
            CONFIG.smooth = 0.5
            return True
        if k == 5:  # a new object in the global
            globals()["CONFIG"] = types.SimpleNamespace(smooth=2.0)
            return True
        return False
    try:
        run_schedule(make(eager_model, eager_opt), compiled, eager_model, lazy_model, schedule, batches(7))
    finally:
        globals()["CONFIG"] = types.SimpleNamespace(smooth=1.0)


CONFIG = types.SimpleNamespace(smooth=1.0)


def _config_loss(out, y):
    return F.mse_loss(out * CONFIG.smooth, y)


# ---- a module's attribute that is not a tensor -------------------------------------------------

class _Scaled(nn.Module):
    shift = 0.0  # a class attribute, until an instance sets its own

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.scale = 2.0

    def forward(self, x):
        return self._scaled(self.lin(x)) + self.shift

    def _scaled(self, h):  # a method forward calls: its reads are the module's too
        return h * self.scale


def _sgd_step(model, opt):
    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def test_a_module_attribute_changed_between_calls():
    eager_model, lazy_model = pair(_Scaled)
    eager_step = _sgd_step(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.05))
    compiled = lazyrt.torch.compile(_sgd_step(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.05)))

    def schedule(k):
        if k == 2:
            eager_model.scale = lazy_model.scale = 0.5
            return True
        if k == 4:  # the instance's own value hides the class's
            eager_model.shift = lazy_model.shift = 0.25
            return True
        if k == 6:  # an attribute no code reads: no capture
            eager_model.note = lazy_model.note = "x"
            return None
        return False
    run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(8))


def test_a_torch_module_hyperparameter_changed_between_calls():
    eager_model, lazy_model = pair(lambda: nn.Sequential(nn.Linear(6, 8), nn.ELU(alpha=1.0), nn.Linear(8, 3)))
    eager_step = _sgd_step(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.05))
    compiled = lazyrt.torch.compile(_sgd_step(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.05)))

    def schedule(k):
        if k == 3:
            eager_model[1].alpha = lazy_model[1].alpha = 0.5
            return True
        return False
    run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(6, shape=(16, 6)))


def test_a_class_attribute_changed_between_calls():
    eager_model, lazy_model = pair(_Scaled)
    eager_step = _sgd_step(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.05))
    compiled = lazyrt.torch.compile(_sgd_step(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.05)))

    def schedule(k):
        if k == 3:
            _Scaled.shift = 1.5
            return True
        return False
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(6))
    finally:
        _Scaled.shift = 0.0


# ---- the step's bound self ---------------------------------------------------------------------

class _Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.loss_scale = 1.0
        self.calls = 0  # changed by the loop every call, read by no step code

    def train_step(self, x, y):
        loss = self.loss_scale * F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss


def test_an_attribute_of_the_bound_self_changed_between_calls():
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager, lazy = _Trainer(eager_model), _Trainer(lazy_model)
    compiled = lazyrt.torch.compile(lazy.train_step, model=lazy_model, optimizer=lazy.opt)

    def schedule(k):
        eager.calls = lazy.calls = k
        if k in (2, 5):
            eager.loss_scale = lazy.loss_scale = eager.loss_scale * 0.5
            return True
        return False
    run_schedule(eager.train_step, compiled, eager_model, lazy_model, schedule, batches(7))


# ---- a value that changes every call ----------------------------------------------------------

def test_a_value_changed_every_call_recaptures_every_call_and_warns_once():
    global lr
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    compiled = lazyrt.torch.compile(_hand_sgd(lazy_model))

    def schedule(k):
        global lr
        lr = 0.5 / (k + 1)  # a schedule computed in Python: a new value every call
        return True
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_schedule(_hand_sgd(eager_model), compiled, eager_model, lazy_model, schedule, batches(10))
    finally:
        lr = 0.5
    said = [w for w in caught if "captured 8 times" in str(w.message)]
    assert len(said) == 1 and "global 'lr'" in str(said[0].message), [str(w.message) for w in caught]


# ---- what the walk cannot look at --------------------------------------------------------------

class _Gone:
    pass


_gone = _Gone()
_dead = weakref.proxy(_gone)
del _gone


def _names_a_dead_proxy(x):
    if x is None:
        print(_dead)  # never run; named all the same
    return x


def test_a_value_that_cannot_be_looked_at_is_passed_over():
    from lazyrt._reads import python_reads
    assert python_reads(_names_a_dead_proxy) == []


# ---- a NumPy scalar ------------------------------------------------------------------------------

np_weight = np.float32(1.0)


def _np_weighted(model, opt):
    def step(x, y):
        loss = F.mse_loss(model(x), y) * np_weight
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def test_a_numpy_scalar_read_from_a_global_changed_between_calls():
    global np_weight
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step = _np_weighted(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1))
    compiled = lazyrt.torch.compile(_np_weighted(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1)))

    def schedule(k):
        global np_weight
        if k == 3:
            np_weight = np.float32(0.25)
            return True
        return False
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(6))
    finally:
        np_weight = np.float32(1.0)


# ---- tensors a step reads from places ------------------------------------------------------------
# A tensor a step reads from a global, a closure cell, an attribute, a dict or a list is read
# from that place on every call (as Dynamo does), so rebinding the place to another tensor of
# the same shape and dtype (a new mask every call) is what the next call reads, without a
# capture; another shape or dtype is another capture.

mask = torch.ones(3)


def _reads_a_tensor(model, opt, where):
    """A training step that scales its model's output by a tensor it reads from `where`, and a
    function that puts another tensor there."""
    holder = types.SimpleNamespace(t=torch.ones(3))
    cfg = {"t": torch.ones(3)}
    masks = [torch.ones(3)]
    t = torch.ones(3)

    def read():
        if where == "global":
            return mask
        if where == "closure":
            return t
        if where == "attribute":
            return holder.t
        if where == "dict":
            return cfg["t"]
        return masks[0]

    def step(x, y):
        loss = F.mse_loss(model(x) * read(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def put(v):
        global mask
        nonlocal t
        if where == "global":
            mask = v
        elif where == "closure":
            t = v
        elif where == "attribute":
            holder.t = v
        elif where == "dict":
            cfg["t"] = v
        else:
            masks[0] = v
    return step, put


@pytest.mark.parametrize("where", ["global", "closure", "attribute", "dict", "list"])
def test_a_tensor_rebound_every_call_is_read_anew_and_another_shape_recaptures(where):
    global mask
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step, eager_put = _reads_a_tensor(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1), where)
    lazy_step, lazy_put = _reads_a_tensor(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1), where)
    compiled = lazyrt.torch.compile(lazy_step)
    g = torch.Generator().manual_seed(1)

    def schedule(k):
        if k == 6:  # another shape (broadcast): another capture
            v = torch.full((1,), 0.5)
        else:  # a new mask of the same shape every call: read anew, no capture
            v = (torch.rand(3, generator=g) > 0.4).float()
        eager_put(v)
        lazy_put(v.clone())
        return k == 6
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(9))
    finally:
        mask = torch.ones(3)


def test_a_tensor_changed_in_place_between_calls_is_read_anew():
    global mask
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step, _ = _reads_a_tensor(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1), "global")
    lazy_step, _ = _reads_a_tensor(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1), "global")
    compiled = lazyrt.torch.compile(lazy_step)

    def schedule(k):
        mask.mul_(0.5)  # one tensor read by both steps
        return False
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(5))
    finally:
        mask = torch.ones(3)


scale_a = scale_b = torch.ones(3)


def _two_places(model, opt):
    def step(x, y):
        loss = F.mse_loss(model(x) * scale_a + scale_b, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def test_one_tensor_read_from_two_places_then_two():
    global scale_a, scale_b
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step = _two_places(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1))
    compiled = lazyrt.torch.compile(_two_places(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1)))

    def schedule(k):
        global scale_a, scale_b
        if k == 3:  # the places part: each is an input read from its own place (no new capture)
            scale_a = torch.full((3,), 2.0)
            return None
        if k == 5:  # one tensor again, another one: read anew
            scale_a = scale_b = torch.full((3,), 0.5)
            return None
        return False
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(8))
    finally:
        scale_a = scale_b = torch.ones(3)


def test_a_tensor_read_from_a_place_and_changed_in_place_by_the_step():
    # A counter and a decay kept as tensors in a namespace's attribute and a dict, changed in
    # place by the step (a tensor of no module: no buffer): each call reads what the last one
    # left and writes its change back into the same tensor, as eager does; a tensor put there
    # between calls is what the next call reads and changes.
    import types

    def make(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ns = types.SimpleNamespace(count=torch.zeros(()))
        cfg = {"decay": (torch.ones(3), "unused")}

        def step(x, y):
            ns.count.add_(1)
            cfg["decay"][0].mul_(0.5)
            loss = F.mse_loss(model(x) * cfg["decay"][0] + ns.count, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step, ns, cfg
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step, eager_ns, eager_cfg = make(eager_model)
    lazy_step, lazy_ns, lazy_cfg = make(lazy_model)
    compiled = lazyrt.torch.compile(lazy_step)

    def schedule(k):
        if k == 3:
            eager_ns.count, lazy_ns.count = torch.full((), 10.0), torch.full((), 10.0)
            return None
        return False
    run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(6))
    assert lazy_ns.count.item() == eager_ns.count.item() == 13.0
    close(lazy_cfg["decay"][0].numpy(), eager_cfg["decay"][0].numpy(), "the decay after the calls")


class _Accumulating(nn.Module):
    """A module that keeps what it saw in a plain tensor attribute, set by its forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.seen = torch.zeros(3)

    def forward(self, x):
        h = self.lin(x) + self.seen
        self.seen = h.detach().mean(0)
        return h


def test_a_module_state_kept_in_a_plain_attribute_and_set_by_its_forward():
    eager_model, lazy_model = pair(_Accumulating)

    def make(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the first call runs in eager: it sets the attribute)
        run_schedule(make(eager_model), lazyrt.torch.compile(make(lazy_model)), eager_model, lazy_model,
                     lambda k: None, batches(6))  # (no fast call: the step sets an attribute)
        close(lazy_model.seen.numpy(), eager_model.seen.numpy(), "the state after the calls")


# ---- functions a step calls from places ---------------------------------------------------------

act = torch.tanh


def _softer(v):
    return v / (1 + v.abs())


def _activated(model, opt):
    def step(x, y):
        loss = F.mse_loss(act(model(x)), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def test_a_global_function_rebound_between_calls():
    global act
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step = _activated(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1))
    compiled = lazyrt.torch.compile(_activated(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1)))

    def schedule(k):
        global act
        if k == 2:
            act = torch.relu  # a library function
            return True
        if k == 4:
            act = _softer  # a function of the program
            return True
        if k == 6:
            act = torch.relu  # back to one captured before
            return None
        return False
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(8))
    finally:
        act = torch.tanh


cfg = {"weight": 1.0}


def _dict_weighted(model, opt):
    def step(x, y):
        loss = F.mse_loss(model(x), y) * cfg["weight"]
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def test_a_number_in_a_dict_changed_between_calls():
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step = _dict_weighted(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1))
    compiled = lazyrt.torch.compile(_dict_weighted(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1)))

    def schedule(k):
        if k == 3:
            cfg["weight"] = 0.25
            return True
        return False
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(6))
    finally:
        cfg["weight"] = 1.0


own_mask = torch.ones(3)


def _reads_its_own_global(model, opt):
    def step(x, y):  # the step's own code names the global (the C++ guard's names, by metadata)
        loss = F.mse_loss(model(x) * own_mask, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def test_a_tensor_in_a_global_the_step_names_itself_is_read_anew_in_fast_calls():
    global own_mask
    eager_model, lazy_model = pair(lambda: nn.Linear(6, 3))
    eager_step = _reads_its_own_global(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1))
    compiled = lazyrt.torch.compile(_reads_its_own_global(lazy_model, torch.optim.SGD(lazy_model.parameters(), lr=0.1)))
    g = torch.Generator().manual_seed(2)

    def schedule(k):
        global own_mask
        own_mask = torch.rand(3, generator=g) + 0.5  # rebound every call, same metadata
        return False
    fast = lazyrt.metrics.counter("TorchFastCall")
    try:
        run_schedule(eager_step, compiled, eager_model, lazy_model, schedule, batches(6))
    finally:
        own_mask = torch.ones(3)
    assert lazyrt.metrics.counter("TorchFastCall") - fast >= 4
