"""The accuracy rule on the programs suite: a compiled step is as accurate as eager. Every
program whose step draws nothing random runs three times from one initial state on the same
batches: in PyTorch eager in float32, through lazyrt.torch.compile in float32, and in eager in
float64 (its modules, tensors and inputs converted), the reference. After every call, for each
tensor the programs keep (parameters, gradients, buffers, optimizer state) and each result,
lazyrt's distance to the float64 run must be no worse than eager float32's (conftest's
accuracy_against_float64: the rms over tensors of the relative distances at most twice eager's,
each tensor within ten times eager's).

This holds the compiled step to eager's own accuracy rather than to eager's rounding: two float32
runs that sum in different orders differ by their rounding, and an optimizer that divides a
gradient by its own size (Adam's first steps, Rprop) turns a rounding-level gradient into a
step of about lr either way, in eager as much as in lazyrt; against float64 such an element
counts as the error it is on both sides."""

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

import lazyrt.torch
import conftest
from _compare import clone_args, seeded
from _suite import programs

DETERMINISTIC = [p for p in programs() if not p.random]


def _double(t):
    return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def to_float64(step, state):
    """The program in float64: its modules (with tensors they keep as plain attributes, such as
    a loss module's target), the tensors of its state, and the tensors (or lists of tensors)
    its step function and the functions it closes over keep in their closures."""
    for v in state.values():
        if isinstance(v, nn.Module):
            v.double()
            for m in v.modules():
                for k, a in list(vars(m).items()):
                    if isinstance(a, torch.Tensor) and a.is_floating_point():
                        setattr(m, k, a.double())
        elif isinstance(v, torch.Tensor) and v.is_floating_point():
            v.data = v.data.double()
    seen, todo = set(), [step]
    while todo:
        fn = todo.pop()
        if id(fn) in seen or not callable(fn) or not getattr(fn, "__closure__", None):
            continue
        seen.add(id(fn))
        for cell in fn.__closure__:
            value = cell.cell_contents
            if isinstance(value, torch.Tensor):
                if value.is_floating_point() and not value.requires_grad:
                    cell.cell_contents = value.double()
            elif isinstance(value, list) and all(isinstance(t, torch.Tensor) for t in value):
                value[:] = [_double(t) for t in value]
            elif callable(value):
                todo.append(value)


def _float64(args):
    return pytree.tree_map(lambda a: a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a, args)


def tensors(state, results):
    """{name: tensor} of everything a step changes, and its results."""
    out = {}
    for key, v in state.items():
        if isinstance(v, nn.Module):
            for n, p in v.named_parameters():
                out[f"{key}.{n}"] = p
                if p.grad is not None:
                    out[f"{key}.{n}.grad"] = p.grad
            for n, b in v.named_buffers():
                out[f"{key}.{n}"] = b
        elif isinstance(v, torch.optim.Optimizer):
            for i, s in v.state_dict()["state"].items():
                for k, t in s.items():
                    if isinstance(t, torch.Tensor):
                        out[f"{key}.state[{i}].{k}"] = t
        elif isinstance(v, torch.Tensor):
            out[key] = v
            if v.grad is not None:
                out[f"{key}.grad"] = v.grad
    for i, r in enumerate(pytree.tree_leaves(results)):
        if isinstance(r, torch.Tensor):
            out[f"result {i}"] = r
    return {k: t.detach() for k, t in out.items() if t.is_floating_point()}


@pytest.mark.parametrize("program", DETERMINISTIC, ids=[p.name.split(" (")[0] for p in DETERMINISTIC])
def test_compiled_is_as_accurate_as_eager_against_float64(program):
    eager, s_eager = seeded(program.make)
    lazy_fn, s_lazy = seeded(program.make)
    ref_fn, s_ref = seeded(program.make)
    to_float64(ref_fn, s_ref)
    lazy = lazyrt.torch.compile(lazy_fn)
    for k, args in enumerate(program.batches()):
        r_lazy, r_eager = lazy(*clone_args(args)), eager(*clone_args(args))
        r_ref = ref_fn(*_float64(clone_args(args)))
        ref = tensors(s_ref, r_ref)
        assert tensors(s_lazy, r_lazy).keys() == ref.keys() == tensors(s_eager, r_eager).keys()
        bad = conftest.accuracy_against_float64(tensors(s_lazy, r_lazy), tensors(s_eager, r_eager), ref,
                                                f"after call {k}: ")
        assert bad is None, bad
