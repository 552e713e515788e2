"""lazyrt.optim against torch.optim: parameter groups (own hyperparameters, defaults,
add_param_group and its errors), state_dict / load_state_dict in PyTorch's layout (both ways),
and lazyrt.optim.lr_scheduler against torch.optim.lr_scheduler, plain and under compile_step."""

import copy
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import lazyrt as lr
from conftest import pair

RTOL, ATOL = 1e-6, 1e-7  # f32 parameters after several steps


def close(x, t, what=""):
    np.testing.assert_allclose(x.numpy(), t.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=what)


class Problem:
    """Three parameters in lazyrt and PyTorch with the same values, and a loss whose gradients
    are the same in both: sum(w * g) for a random g per step, plus sum(b * b) and sum(c * c)."""

    SHAPES = [(3, 4), (4,), (2,)]

    def __init__(self, rng):
        self.rng = rng
        self.params, self.tparams = zip(*[pair(rng, s, lr.float32, -1, 1, requires_grad=True)
                                          for s in self.SHAPES])

    def groups(self, specs, torch_side):
        """Group dicts: specs is a list of (param indices, options)."""
        ps = self.tparams if torch_side else self.params
        return [dict(options, params=[ps[i] for i in idx]) for idx, options in specs]

    def backward(self):
        g, tg = pair(self.rng, self.SHAPES[0], lr.float32, -1, 1)
        w, b, c = self.params
        tw, tb, tc = self.tparams
        ((w * g).sum() + (b * b).sum() + (c * c).sum()).backward()
        ((tw * tg).sum() + (tb * tb).sum() + (tc * tc).sum()).backward()

    def steps(self, opt, topt, n, check=True):
        for step in range(n):
            self.backward()
            opt.step()
            topt.step()
            opt.zero_grad()
            topt.zero_grad()
            lr.mark_step()
            if check:
                self.check(f"step {step}")

    def check(self, what=""):
        for i, (p, tp) in enumerate(zip(self.params, self.tparams)):
            close(p, tp, f"{what} parameter {i}")


def hyper(group):
    return {k: v for k, v in group.items() if k != "params"}


GROUP_CONFIGS = [
    ("SGD", dict(lr=0.1), [([0, 1], dict(weight_decay=0.1)), ([2], dict(lr=0.3))]),
    ("SGD", dict(lr=0.1, momentum=0.9),
     [([0], dict(weight_decay=0.05, dampening=0.1)), ([1, 2], dict(nesterov=True, momentum=0.5))]),
    ("Adam", dict(lr=0.01), [([0], dict(weight_decay=0.1, betas=(0.8, 0.99))), ([1, 2], dict(eps=1e-6))]),
    ("AdamW", dict(lr=0.02), [([0], dict(weight_decay=0.1)), ([1, 2], dict(weight_decay=0.0, lr=0.05))]),
]


@pytest.mark.parametrize("name,defaults,specs", GROUP_CONFIGS, ids=lambda v: v if isinstance(v, str) else "")
def test_param_groups_match_torch(name, defaults, specs, rng):
    prob = Problem(rng)
    opt = getattr(lr.optim, name)(prob.groups(specs, False), **defaults)
    topt = getattr(torch.optim, name)(prob.groups(specs, True), **defaults)
    assert len(opt.param_groups) == 2
    for g, tg in zip(opt.param_groups, topt.param_groups):
        assert hyper(g) == hyper(tg), "every group inherits the defaults as in PyTorch"
    assert opt.defaults == topt.defaults
    prob.steps(opt, topt, 6)
    # A change through one group acts on that group only.
    opt.param_groups[1]["lr"] = topt.param_groups[1]["lr"] = 0.002
    opt.param_groups[0]["weight_decay"] = topt.param_groups[0]["weight_decay"] = 0.2
    prob.steps(opt, topt, 4)
    assert [t.item() for t in opt.state_tensors()[:1]] == [10.0]


def test_add_param_group_inherits_the_constructor_defaults(rng):
    prob = Problem(rng)
    opt = lr.optim.SGD([{"params": [prob.params[0]], "lr": 1e-4}], lr=0.1, momentum=0.9)
    topt = torch.optim.SGD([{"params": [prob.tparams[0]], "lr": 1e-4}], lr=0.1, momentum=0.9)
    assert opt.defaults["lr"] == topt.defaults["lr"] == 0.1
    prob.steps(opt, topt, 2, check=False)
    opt.add_param_group({"params": prob.params[1], "weight_decay": 0.5, "note": "head"})
    topt.add_param_group({"params": prob.tparams[1], "weight_decay": 0.5, "note": "head"})
    opt.add_param_group({"params": [prob.params[2]], "momentum": 0.3})
    topt.add_param_group({"params": [prob.tparams[2]], "momentum": 0.3})
    assert [hyper(g) for g in opt.param_groups] == [hyper(g) for g in topt.param_groups]
    assert opt.param_groups[1]["note"] == "head", "a key lazyrt does not know is kept"
    prob.steps(opt, topt, 4)


def test_group_errors_as_torch_and_nothing_changes(rng):
    prob = Problem(rng)
    w, b, c = prob.params
    tw, tb, tc = prob.tparams
    for make, tmake in [(lr.optim.SGD, torch.optim.SGD), (lr.optim.AdamW, torch.optim.AdamW)]:
        with pytest.raises(ValueError, match="more than one parameter group"):
            make([{"params": [w, b]}, {"params": [b]}], lr=0.1)
        with pytest.raises(ValueError, match="more than one parameter group"):
            tmake([{"params": [tw, tb]}, {"params": [tb]}], lr=0.1)
        with pytest.raises(TypeError, match="set"):
            make([{"params": {w}}], lr=0.1)
        with pytest.raises(TypeError):
            tmake([{"params": {tw}}], lr=0.1)
        with pytest.raises(TypeError, match="single Tensor"):
            make(w, lr=0.1)
        with pytest.raises(TypeError):
            tmake(tw, lr=0.1)
        with pytest.raises(TypeError, match="ndarray"):
            make([w, np.ones(2)], lr=0.1)
        with pytest.raises(ValueError, match="empty parameter list"):
            make([], lr=0.1)
        opt = make([{"params": [w]}], lr=0.1)
        topt = tmake([{"params": [tw]}], lr=0.1)
        with pytest.raises(ValueError, match="more than one parameter group"):
            opt.add_param_group({"params": [b, w]})
        with pytest.raises(ValueError, match="more than one parameter group"):
            topt.add_param_group({"params": [tb, tw]})
        with pytest.raises(TypeError, match="must be a dict"):
            opt.add_param_group([b])
        with pytest.raises(lr.Error):  # an invalid value in the new group
            opt.add_param_group({"params": [b], "lr": -1.0})
        assert len(opt.param_groups) == 1 and len(opt.state_tensors()) == len(make([w], lr=0.1).state_tensors())
        # An empty group is accepted, as by PyTorch, and steps nothing.
        opt.add_param_group({"params": []})
        topt.add_param_group({"params": []})
        assert [hyper(g) for g in opt.param_groups] == [hyper(g) for g in topt.param_groups]
    # lazyrt refuses what it would compute otherwise than PyTorch.
    with pytest.raises(ValueError, match="more than once"):
        lr.optim.SGD([w, w], lr=0.1)
    with pytest.raises(lr.Error, match="amsgrad"):
        lr.optim.Adam([w], amsgrad=True)
    with pytest.raises(lr.Error, match="maximize"):
        lr.optim.AdamW([{"params": [w], "maximize": True}])
    opt = lr.optim.Adam([w], foreach=True, fused=False)
    with pytest.raises(lr.Error, match="amsgrad"):
        opt.param_groups[0]["amsgrad"] = True
    assert opt.param_groups[0]["amsgrad"] is False


def test_group_hyperparameter_errors_leave_the_group(rng):
    prob = Problem(rng)
    opt = lr.optim.SGD([{"params": prob.params[:2]}, {"params": prob.params[2:], "momentum": 0.9}],
                       lr=0.1, momentum=0.5, dampening=0.1)
    with pytest.raises(lr.Error, match="nesterov"):
        opt.param_groups[1]["nesterov"] = True
    assert opt.param_groups[1]["nesterov"] is False and opt._impls[1].nesterov is False
    # Valid when applied together: dampening off, then nesterov on; and back.
    opt.param_groups[1].update(dampening=0, nesterov=True)
    assert opt._impls[1].nesterov is True and opt._impls[1].dampening == 0
    opt.param_groups[1].update(dampening=0.2, nesterov=False)
    assert opt._impls[1].nesterov is False and opt._impls[1].dampening == 0.2
    assert opt._impls[0].dampening == 0.1, "group 0 untouched"


# ---- state_dict / load_state_dict -----------------------------------------------------------

STATE_CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1)),
    ("Adam", dict(lr=0.01, weight_decay=0.1)),
    ("AdamW", dict(lr=0.02)),
]
SPECS = [([0, 1], dict(weight_decay=0.1)), ([2], dict(weight_decay=0.0))]


def assert_state_equal(sd, tsd):
    assert sd["param_groups"] == tsd["param_groups"]
    assert sd["state"].keys() == tsd["state"].keys()
    for k, entry in sd["state"].items():
        tentry = tsd["state"][k]
        assert entry.keys() == tentry.keys(), f"state of parameter {k}"
        for key, v in entry.items():
            tv = tentry[key]
            if tv is None:
                assert v is None
            else:
                assert v.dtype is lr.float32 and tuple(v.shape) == tuple(tv.shape), f"{k} {key}"
                close(v, tv, f"{k} {key}")


@pytest.mark.parametrize("name,defaults", STATE_CONFIGS, ids=str)
def test_state_dict_layout_matches_torch(name, defaults, rng):
    prob = Problem(rng)
    opt = getattr(lr.optim, name)(prob.groups(SPECS, False), **defaults)
    topt = getattr(torch.optim, name)(prob.groups(SPECS, True), **defaults)
    assert opt.state_dict() == topt.state_dict() == {"state": {}, "param_groups": topt.state_dict()["param_groups"]}
    prob.steps(opt, topt, 3)
    sd = opt.state_dict()
    assert_state_equal(sd, topt.state_dict())
    # A copy taken now: later steps do not change it.
    before = {k: {n: (v.numpy().copy() if v is not None else None) for n, v in e.items()}
              for k, e in sd["state"].items()}
    prob.steps(opt, topt, 1, check=False)
    for k, e in sd["state"].items():
        for n, v in e.items():
            if v is not None:
                np.testing.assert_array_equal(v.numpy(), before[k][n])


def to_lazyrt_state(tsd, convert):
    return {"state": {k: {n: (convert(v) if isinstance(v, torch.Tensor) else v) for n, v in e.items()}
                      for k, e in tsd["state"].items()},
            "param_groups": tsd["param_groups"]}


@pytest.mark.parametrize("convert", ["torch", "from_torch", "numpy"])
@pytest.mark.parametrize("name,defaults", STATE_CONFIGS, ids=str)
def test_loading_torch_state_then_stepping_matches_torch(name, defaults, convert, rng):
    prob = Problem(rng)
    topt = getattr(torch.optim, name)(prob.groups(SPECS, True), **defaults)
    # Train PyTorch alone, then start lazyrt from its parameters and state.
    for _ in range(3):
        prob.backward()
        topt.step()
        topt.zero_grad()
    for p in prob.params:
        p.grad = None
    with lr.no_grad():
        for p, tp in zip(prob.params, prob.tparams):
            p.copy_(lr.tensor(tp.detach().numpy()))
    # Other hyperparameters at construction: loading brings PyTorch's.
    opt = getattr(lr.optim, name)(prob.groups(SPECS, False), **dict(defaults, lr=0.5))
    tsd = topt.state_dict()
    tsd["param_groups"][1]["lr"] = topt.param_groups[1]["lr"] = 0.005
    ids = [lr.tensor_id(t) for t in opt.state_tensors()]
    fn = {"torch": lambda t: t.clone(), "from_torch": lambda t: lr.from_torch(t.clone()),
          "numpy": lambda t: t.numpy().copy()}[convert]
    opt.load_state_dict(to_lazyrt_state(tsd, fn))
    assert [lr.tensor_id(t) for t in opt.state_tensors()] == ids, "written in place"
    assert [hyper(g) for g in opt.param_groups] == [hyper(g) for g in topt.param_groups]
    assert opt._impls[1].lr == 0.005
    assert_state_equal(opt.state_dict(), topt.state_dict())
    prob.steps(opt, topt, 4)


@pytest.mark.parametrize("name,defaults", STATE_CONFIGS, ids=str)
def test_torch_loads_lazyrt_state_and_steps_the_same(name, defaults, rng):
    prob = Problem(rng)
    opt = getattr(lr.optim, name)(prob.groups(SPECS, False), **defaults)
    for _ in range(3):
        prob.backward()
        opt.step()
        opt.zero_grad()
        lr.mark_step()
    for p in prob.tparams:
        p.grad = None
    with torch.no_grad():
        for p, tp in zip(prob.params, prob.tparams):
            tp.copy_(torch.from_numpy(p.numpy().copy()))
    sd = opt.state_dict()
    tsd = {"state": {k: {n: (lr.to_torch(v).clone() if v is not None else None) for n, v in e.items()}
                     for k, e in sd["state"].items()},
           "param_groups": sd["param_groups"]}
    topt = getattr(torch.optim, name)(prob.groups(SPECS, True), lr=0.5)
    topt.load_state_dict(tsd)
    prob.steps(opt, topt, 4)


def test_lazyrt_state_round_trip_resumes_training(rng):
    prob = Problem(rng)
    opt = lr.optim.AdamW(prob.groups(SPECS, False), lr=0.01)
    topt = torch.optim.AdamW(prob.groups(SPECS, True), lr=0.01)
    prob.steps(opt, topt, 3, check=False)
    saved = opt.state_dict()
    saved_params = [lr.tensor(p.numpy()) for p in prob.params]
    tsaved = copy.deepcopy(topt.state_dict())
    tparams_saved = [tp.detach().clone() for tp in prob.tparams]
    prob.steps(opt, topt, 3, check=False)
    # Back to the checkpoint in both, and on.
    opt.load_state_dict(saved)
    topt.load_state_dict(tsaved)
    with lr.no_grad():
        for p, s in zip(prob.params, saved_params):
            p.copy_(s)
    with torch.no_grad():
        for tp, s in zip(prob.tparams, tparams_saved):
            tp.copy_(s)
    assert opt.step_count.item() == 3
    prob.steps(opt, topt, 3)


def snapshot(opt):
    return [t.numpy().copy() for t in opt.state_tensors()], [dict(g) for g in opt.param_groups]


def assert_unchanged(opt, snap):
    values, groups = snap
    now_values, now_groups = snapshot(opt)
    for a, b in zip(values, now_values):
        np.testing.assert_array_equal(a, b)
    assert now_groups == groups
    for g, impl in zip(opt.param_groups, opt._impls):
        assert impl.lr == g["lr"] and impl.weight_decay == g["weight_decay"]


def test_load_state_dict_errors_change_nothing(rng):
    prob = Problem(rng)
    topt = torch.optim.Adam(prob.groups(SPECS, True), lr=0.01)
    opt = lr.optim.Adam(prob.groups(SPECS, False), lr=0.01)
    prob.steps(opt, topt, 2, check=False)
    good = opt.state_dict()
    snap = snapshot(opt)

    def broken(change):
        sd = {"state": {k: dict(e) for k, e in good["state"].items()},
              "param_groups": copy.deepcopy(good["param_groups"])}
        change(sd)
        return sd

    cases = [
        (ValueError, "parameter groups", lambda sd: sd["param_groups"].pop()),
        (ValueError, "group 0 has 1 parameters", lambda sd: sd["param_groups"][0]["params"].pop()),
        (ValueError, "shape", lambda sd: sd["state"][1].update(exp_avg=lr.zeros(5))),
        (ValueError, "no 'exp_avg_sq'", lambda sd: sd["state"][2].pop("exp_avg_sq")),
        (lr.Error, "different step counts", lambda sd: sd["state"][0].update(step=torch.tensor(7.0))),
        (lr.Error, "different step counts", lambda sd: sd["state"].pop(1)),
        (ValueError, "no eps", lambda sd: sd["param_groups"][1].pop("eps")),
        (lr.Error, "amsgrad", lambda sd: sd["param_groups"][1].update(amsgrad=True)),
        (ValueError, "whole number", lambda sd: sd["state"][2].update(step=-1.0)),
        # Group 0's hyperparameters are valid and applied before group 1's fail: undone.
        (lr.Error, "invalid options", lambda sd: (sd["param_groups"][0].update(lr=0.3, weight_decay=0.2),
                                                  sd["param_groups"][1].update(betas=(2.0, 0.5)))),
        (ValueError, "'state' and 'param_groups'", lambda sd: sd.pop("state")),
        (ValueError, "no parameter", lambda sd: sd["state"].update({"0": sd["state"].pop(0)})),
    ]
    for error, match, change in cases:
        with pytest.raises(error, match=match):
            opt.load_state_dict(broken(change))
        assert_unchanged(opt, snap)
    # Torch raises the same errors for the cases both check.
    tsd = topt.state_dict()
    tsd["param_groups"] = tsd["param_groups"][:1]
    with pytest.raises(ValueError, match="number of parameter groups"):
        topt.load_state_dict(tsd)


def test_sgd_state_before_and_after_the_first_step(rng):
    prob = Problem(rng)
    for kwargs in [dict(lr=0.1), dict(lr=0.1, momentum=0.9)]:
        opt = lr.optim.SGD(prob.params, **kwargs)
        topt = torch.optim.SGD(prob.tparams, **kwargs)
        assert opt.state_dict()["state"] == topt.state_dict()["state"] == {}
        prob.steps(opt, topt, 1)
        assert_state_equal(opt.state_dict(), topt.state_dict())
        # A state without any step loads as "not stepped": PyTorch starts its buffers afresh.
        fresh_t = torch.optim.SGD(prob.tparams, **kwargs)
        opt.load_state_dict(fresh_t.state_dict())
        assert opt.step_count.item() == 0 and opt.state_dict()["state"] == {}
        topt.load_state_dict(fresh_t.state_dict())
        prob.steps(opt, topt, 2)


# ---- LR schedulers --------------------------------------------------------------------------

def two_group_pair(name="SGD", **kwargs):
    ps = [lr.tensor([1.0], requires_grad=True), lr.tensor([2.0], requires_grad=True)]
    tps = [torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)]
    opt = getattr(lr.optim, name)([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.03}], lr=0.1, **kwargs)
    topt = getattr(torch.optim, name)([{"params": tps[:1]}, {"params": tps[1:], "lr": 0.03}], lr=0.1, **kwargs)
    return opt, topt


class Scale:
    """A callable object (its attributes are saved by LambdaLR.state_dict)."""

    def __init__(self, k):
        self.k = k

    def __call__(self, epoch):
        return self.k ** epoch


SCHEDULES = [
    ("LambdaLR", "SGD", dict(lr_lambda=lambda e: 1.0 / (1 + e))),
    ("LambdaLR", "SGD", dict(lr_lambda=[lambda e: 0.99 ** e, Scale(0.97)])),
    ("StepLR", "SGD", dict(step_size=7, gamma=0.7)),
    ("MultiStepLR", "SGD", dict(milestones=[10, 40, 40, 200], gamma=0.3)),
    ("ExponentialLR", "AdamW", dict(gamma=0.98)),
    ("CosineAnnealingLR", "Adam", dict(T_max=45, eta_min=1e-4)),
    ("CosineAnnealingLR", "SGD", dict(T_max=300)),
    ("LinearLR", "SGD", dict(start_factor=0.1, end_factor=0.9, total_iters=30)),
    ("LinearLR", "SGD", dict()),
    ("OneCycleLR", "SGD", dict(max_lr=[0.5, 0.2], total_steps=300, cycle_momentum=False)),
    ("OneCycleLR", "SGD", dict(max_lr=0.5, epochs=30, steps_per_epoch=10, anneal_strategy="linear")),
    ("OneCycleLR", "AdamW", dict(max_lr=0.5, total_steps=300, three_phase=True, pct_start=0.25)),
    ("OneCycleLR", "Adam", dict(max_lr=0.5, total_steps=300, anneal_strategy="linear", three_phase=True,
                                base_momentum=[0.8, 0.7], max_momentum=0.9)),
]


def assert_same_schedule_state(opt, topt, sched, tsched, what):
    assert sched.get_last_lr() == tsched.get_last_lr(), what
    assert sched.last_epoch == tsched.last_epoch
    for g, tg, impl in zip(opt.param_groups, topt.param_groups, opt._impls):
        assert hyper(g) == hyper(tg), what
        assert impl.lr == g["lr"], "the rate reached the optimizer"
        if "betas" in g:
            assert impl.betas == tuple(g["betas"])
        else:
            assert impl.momentum == g["momentum"]


@pytest.mark.parametrize("sched_name,opt_name,kwargs", SCHEDULES, ids=lambda v: v if isinstance(v, str) else "")
def test_scheduler_sequence_equals_torch(sched_name, opt_name, kwargs):
    momentum = dict(momentum=0.9) if opt_name == "SGD" else {}
    opt, topt = two_group_pair(opt_name, **momentum)
    sched = getattr(lr.optim.lr_scheduler, sched_name)(opt, **kwargs)
    tsched = getattr(torch.optim.lr_scheduler, sched_name)(topt, **kwargs)
    assert sched.base_lrs == tsched.base_lrs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's "scheduler.step() before optimizer.step()"
        for i in range(300):
            assert_same_schedule_state(opt, topt, sched, tsched, f"step {i}")
            sched.step()
            tsched.step()
    if sched_name == "OneCycleLR" and min(tsched.get_last_lr()) < 0:
        # The step past the cycle: PyTorch's linear annealing overshoots below 0; lazyrt's
        # optimizers take no negative rate, so lazyrt's is 0.
        assert sched.get_last_lr() == [0.0, 0.0]
        for tg in topt.param_groups:
            tg["lr"] = max(tg["lr"], 0.0)
        tsched._last_lr = [max(v, 0.0) for v in tsched._last_lr]
    assert_same_schedule_state(opt, topt, sched, tsched, "end")
    if sched_name == "OneCycleLR":
        # Past the end: both raise; lazyrt keeps its state.
        with pytest.raises(ValueError, match="total_steps=300"):
            sched.step()
        with pytest.raises(ValueError):
            tsched.step()
        tsched.last_epoch -= 1
        assert_same_schedule_state(opt, topt, sched, tsched, "after the error")


@pytest.mark.parametrize("sched_name,opt_name,kwargs", [SCHEDULES[1], SCHEDULES[5], SCHEDULES[11], SCHEDULES[10]],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_scheduler_state_dict_from_torch_and_back(sched_name, opt_name, kwargs):
    momentum = dict(momentum=0.9) if opt_name == "SGD" else {}
    opt, topt = two_group_pair(opt_name, **momentum)
    sched = getattr(lr.optim.lr_scheduler, sched_name)(opt, **kwargs)
    tsched = getattr(torch.optim.lr_scheduler, sched_name)(topt, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(60):
            tsched.step()
        # lazyrt resumes from PyTorch's scheduler and optimizer state.
        topt_state = topt.state_dict()
        opt.load_state_dict(topt_state)
        sched.load_state_dict(tsched.state_dict())
        for i in range(100):
            sched.step()
            tsched.step()
            assert_same_schedule_state(opt, topt, sched, tsched, f"step {i}")
        # And a lazyrt state into a fresh lazyrt scheduler.
        opt2, _ = two_group_pair(opt_name, **momentum)
        opt2.load_state_dict(opt.state_dict())
        sched2 = getattr(lr.optim.lr_scheduler, sched_name)(opt2, **kwargs)
        sched2.load_state_dict(sched.state_dict())
        for _ in range(50):
            sched.step()
            sched2.step()
            assert sched2.get_last_lr() == sched.get_last_lr()


def test_lambda_lr_saves_callable_objects_only():
    opt, topt = two_group_pair()
    fns = [lambda e: 1.0, Scale(0.9)]
    sd = lr.optim.lr_scheduler.LambdaLR(opt, fns).state_dict()
    tsd = torch.optim.lr_scheduler.LambdaLR(topt, fns).state_dict()
    assert sd["lr_lambdas"] == tsd["lr_lambdas"] == [None, {"k": 0.9}]


def test_scheduler_resume_with_last_epoch_and_closed_form():
    opt, topt = two_group_pair()
    with pytest.raises(KeyError, match="initial_lr"):
        lr.optim.lr_scheduler.StepLR(opt, 5, last_epoch=10)
    for g, tg in zip(opt.param_groups, topt.param_groups):
        g["initial_lr"] = tg["initial_lr"] = g["lr"] * 2
    sched = lr.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20, last_epoch=7)
    tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=20, last_epoch=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in [None, None, 3, None, 30, None]:
            sched.step(epoch)
            tsched.step(epoch)
            assert_same_schedule_state(opt, topt, sched, tsched, f"epoch {epoch}")


def test_scheduler_errors():
    opt, topt = two_group_pair(momentum=0.0)
    S = lr.optim.lr_scheduler
    with pytest.raises(TypeError, match="not a lazyrt optimizer"):
        S.StepLR(topt, 3)
    with pytest.raises(ValueError, match="lr_lambdas"):
        S.LambdaLR(opt, [lambda e: 1.0])
    with pytest.raises(ValueError, match="start_factor"):
        S.LinearLR(opt, start_factor=2.0)
    before = [dict(g) for g in opt.param_groups]
    # lazyrt's SGD cannot switch momentum on, which cycling momentum needs.
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        S.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    with pytest.raises(ValueError, match="total_steps"):
        S.OneCycleLR(opt, max_lr=0.1, total_steps=0)
    with pytest.raises(ValueError, match="max_lr"):
        S.OneCycleLR(opt, max_lr=[0.1], total_steps=10)
    with pytest.raises(ValueError, match="anneal_strategy"):
        S.OneCycleLR(opt, max_lr=0.1, total_steps=10, anneal_strategy="step")
    assert [dict(g) for g in opt.param_groups] == before, "a refused scheduler changes no group"
    # A rate the optimizer refuses: the step raises and changes nothing.
    sched = S.LambdaLR(opt, lambda e: 1.0 - e)
    sched.step()
    with pytest.raises(lr.Error, match="learning rate"):
        sched.step()
    assert sched.last_epoch == 1 and [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    with pytest.raises(ValueError, match="base_lrs"):
        sched.load_state_dict({"base_lrs": [0.1]})


def test_lr_scheduler_import_forms():
    from lazyrt.optim import lr_scheduler
    import lazyrt.optim.lr_scheduler as by_path
    assert lr.optim.lr_scheduler is lr_scheduler is by_path
    # In a fresh interpreter, the dotted import alone.
    code = ("import lazyrt.optim.lr_scheduler\nfrom lazyrt.optim.lr_scheduler import OneCycleLR\n"
            "import lazyrt\nassert lazyrt.optim.lr_scheduler.OneCycleLR is OneCycleLR\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


# ---- compiled steps -------------------------------------------------------------------------

def make_models(rng):
    """A 4->3 linear model, lazyrt and PyTorch, with the same weights."""
    lr.manual_seed(3)
    model = lr.nn.Linear(4, 3)
    tmodel = torch.nn.Linear(4, 3)
    tmodel.load_state_dict({k: lr.to_torch(v).clone() for k, v in model.state_dict().items()})
    return model, tmodel


def decay_groups(model, wd):
    """Weights decayed, biases not: the usual two groups."""
    params = dict(model.named_parameters())
    return [{"params": [params["weight"]], "weight_decay": wd}, {"params": [params["bias"]], "weight_decay": 0.0}]


def batches(rng, n):
    return [pair(rng, (8, 4), lr.float32, -1, 1) + pair(rng, (8, 3), lr.float32, -1, 1) for _ in range(n)]


@pytest.mark.parametrize("schedule", ["onecycle", "cosine"])
def test_compiled_step_with_a_schedule_never_retraces_and_matches_torch(schedule, rng):
    model, tmodel = make_models(rng)
    opt = lr.optim.AdamW(decay_groups(model, 0.1), lr=0.01)
    topt = torch.optim.AdamW(decay_groups(tmodel, 0.1), lr=0.01)
    if schedule == "onecycle":
        make = lambda o, S: S.OneCycleLR(o, max_lr=0.05, total_steps=40, cycle_momentum=False)  # noqa: E731
    else:
        make = lambda o, S: S.CosineAnnealingLR(o, T_max=10, eta_min=1e-3)  # noqa: E731
    sched, tsched = make(opt, lr.optim.lr_scheduler), make(topt, torch.optim.lr_scheduler)

    def train_step(x, y):
        loss = lr.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    data = batches(rng, 30)
    lr.mark_step()
    step = lr.compile_step(train_step, (data[0][0], data[0][2]))
    lr.metrics.reset()
    rates = []
    for x, tx, y, ty in data:
        loss = step(x, y)
        tloss = torch.nn.functional.mse_loss(tmodel(tx), ty)
        tloss.backward()
        topt.step()
        topt.zero_grad()
        sched.step()
        tsched.step()
        rates.append(opt._impls[0].lr)
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=RTOL)
    assert all(a != b for a, b in zip(rates, rates[1:])), "the rate changed every step"
    assert step.traces == 1, "a learning-rate change never retraces"
    # Nothing compiled anew; each new rate is written by one small cached graph (the
    # scheduler's last write is still pending).
    assert lr.metrics.counter("UncachedCompile") == 0
    assert lr.metrics.counter("ReplayGraph") == len(data)
    assert lr.metrics.counter("CachedCompile") == lr.metrics.counter("ExecuteGraph") == len(data) - 1
    for (n, p), tp in zip(model.named_parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=n)
    assert [t.item() for t in (opt._impls[0].step_count, opt._impls[1].step_count)] == [30.0, 30.0]


def test_compiled_step_with_cycled_momentum_retraces_but_matches_torch(rng):
    model, tmodel = make_models(rng)
    opt = lr.optim.Adam(decay_groups(model, 0.01), lr=0.01)
    topt = torch.optim.Adam(decay_groups(tmodel, 0.01), lr=0.01)
    sched = lr.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.05, total_steps=10)

    def train_step(x, y):
        loss = lr.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    data = batches(rng, 5)
    step = lr.compile_step(train_step, (data[0][0], data[0][2]))
    for x, tx, y, ty in data:
        step(x, y)
        torch.nn.functional.mse_loss(tmodel(tx), ty).backward()
        topt.step()
        topt.zero_grad()
        sched.step()
        tsched.step()
    assert step.traces == len(data), "betas[0] changes every step: each step retraces"
    for p, tp in zip(model.parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_loading_state_between_replays_takes_effect(rng):
    model, tmodel = make_models(rng)
    opt = lr.optim.AdamW(decay_groups(model, 0.1), lr=0.01)
    topt = torch.optim.AdamW(decay_groups(tmodel, 0.1), lr=0.01)

    def train_step(x, y):
        loss = lr.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    data = batches(rng, 6)
    step = lr.compile_step(train_step, (data[0][0], data[0][2]))
    for x, tx, y, ty in data[:3]:
        step(x, y)
        torch.nn.functional.mse_loss(tmodel(tx), ty).backward()
        topt.step()
        topt.zero_grad()
    # lazyrt jumps to PyTorch's state (optimizer and weights) between replays.
    opt.load_state_dict(topt.state_dict())
    model.load_state_dict(tmodel.state_dict())
    for x, tx, y, ty in data[3:]:
        step(x, y)
        torch.nn.functional.mse_loss(tmodel(tx), ty).backward()
        topt.step()
        topt.zero_grad()
    for p, tp in zip(model.parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert step.traces == 1, "loading the state writes in place: the replay keeps running"
