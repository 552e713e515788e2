"""Shared helpers of the public-example programs: build a program twice from one seed, run its
step eagerly and through lazyrt.torch.compile on the same inputs, and compare everything a
training step changes.

Each program test builds its models, optimizers and schedulers twice from the same seed (one
copy for PyTorch eager, the oracle; one for lazyrt.torch.compile), runs the step written as the
public example writes its training-loop body on both, with the same batches, and after every
step compares: what the step returns (the loss), every parameter, every ``.grad`` (and whether
it is None), every buffer (BatchNorm running statistics), every optimizer's ``state_dict()``
and every scheduler's learning rate.

Tolerance: float32 sums in another order (lazyrt's kernels, OpenBLAS, oneDNN) and no more:
each element within rtol 1e-5 of its own magnitude, plus 1e-6 absolute, plus rtol times the
largest magnitude in its tensor (an element that is small because its terms cancel carries the
rounding of those larger terms: a gradient summed over a batch, a loss summed over pixels), unless
a program says why it needs otherwise.

Dropout: lazyrt draws its masks from its own generator, so they cannot equal eager torch's.
Programs with ``nn.Dropout`` modules swap them, in the lazyrt copy, for ``SeenDropout`` (the
same module that also keeps what it saw and gave) and, in the eager copy, for ``ReplayDropout``
(which multiplies by the mask lazyrt drew); the step returns what the dropouts saw
(``seen(model)``) beside its loss, and the eager step runs with those masks.
"""

import os
import sys

import numpy as np
import torch
from torch import nn

try:
    import lazyrt  # noqa: F401
except ImportError:  # run by hand from the repository root: the build tree's package
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "build", "python"))

import lazyrt.torch  # noqa: E402,F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import conftest  # noqa: E402  (tests/python's: same_tree)

RTOL, ATOL = 1e-5, 1e-6


def seeded(make, seed=0):
    """make() with torch's global generator seeded: the same initial weights on every call."""
    torch.manual_seed(seed)
    return make()


def close(a, b, what, rtol=RTOL, atol=ATOL):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    if a.dtype != b.dtype:
        raise AssertionError(f"{what}: dtype {a.dtype} vs {b.dtype}")
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs {b.shape}"
    conftest.close_to_scale(a, b, what, rtol, atol)


def same_tree(a, b, what, rtol=RTOL, atol=ATOL):
    """Two nested structures (state dicts, results) agree: tensors by close() (dtype and shape
    exactly), everything else exactly."""
    conftest.same_tree(a, b, what, rtol, atol, close=close)


class AdamNoise:
    """The elements of a module's parameters whose gradient, at some step so far, was at the
    rounding level of its tensor (eager's: nonzero and at most REL times the tensor's largest
    gradient, 2^4 float32 units of it). Adam divides a gradient by its own size, so where the
    gradient is rounding noise its step is about lr either way, in eager as in lazyrt, and the two
    move apart by up to lr a step from then on: same_module compares those elements within lr per
    step so far, and every other element as usual. Call update() after each eager step."""

    REL = 2.0 ** -19

    def __init__(self, lr):
        self.lr, self.steps, self.masks = lr, 0, {}

    def update(self, module):
        self.steps += 1
        for name, q in module.named_parameters():
            if q.grad is None or not q.grad.numel():
                continue
            g = q.grad.detach().abs()
            m = (g > 0) & (g <= self.REL * g.max())
            self.masks[name] = m | self.masks[name] if name in self.masks else m

    def close(self, name, p, q, what, rtol, atol):
        """p and q (parameter `name`) agree: noise elements within lr per step, the rest by close()."""
        m = self.masks.get(name)
        if m is None or not m.any():
            return close(p, q, what, rtol, atol)
        a, b = p.detach().numpy(), q.detach().numpy()
        keep = ~m.numpy()
        conftest.close_to_scale(a[keep], b[keep], what, rtol, atol)
        np.testing.assert_allclose(a[~keep], b[~keep], rtol=0, atol=self.lr * self.steps,
                                   err_msg=f"{what} ({int((~keep).sum())} elements of rounding-level gradient)")


def same_module(a, b, what, rtol=RTOL, atol=ATOL, noise=(), noise_atol=0.0, adam_noise=None):
    """Parameters (values, .grad and its None-ness), buffers and the training flag. noise: names
    of parameters whose gradient is zero in exact arithmetic (a convolution's bias right before
    an instance norm, which removes any per-channel constant): what backward gives there is
    rounding noise in eager as in lazyrt, and Adam turns noise into steps of about lr, so their
    gradients are only checked to be noise (below rtol times the largest gradient of the module,
    on both sides) and their values to agree within noise_atol. adam_noise: an AdamNoise of this
    module's elements."""
    pa = list(a.named_parameters(remove_duplicate=False))
    pb = list(b.named_parameters(remove_duplicate=False))
    assert [n for n, _ in pa] == [n for n, _ in pb], f"{what}: parameter names differ"
    assert set(noise) <= {n for n, _ in pb}, f"{what}: unknown noise parameters"
    grads = [q.grad.abs().max().item() for _, q in pb if q.grad is not None and q.grad.numel()]
    gmax = max(grads, default=0.0)
    for (name, p), (_, q) in zip(pa, pb):
        assert (p.grad is None) == (q.grad is None), f"{what} {name}.grad: {p.grad} vs {q.grad}"
        if name in noise:
            close(p, q, f"{what} parameter {name} (moved by noise)", 0.0, noise_atol)
            for side, g in (("lazyrt", p.grad), ("eager", q.grad)):
                if g is not None:
                    assert g.abs().max().item() <= rtol * gmax, f"{what} {name}.grad ({side}) is not noise"
            continue
        if adam_noise is not None:
            adam_noise.close(name, p, q, f"{what} parameter {name}", rtol, atol)
        else:
            close(p, q, f"{what} parameter {name}", rtol, atol)
        if q.grad is not None:
            close(p.grad, q.grad, f"{what} {name}.grad", rtol, atol)
    ba, bb = list(a.named_buffers()), list(b.named_buffers())
    assert [n for n, _ in ba] == [n for n, _ in bb], f"{what}: buffer names differ"
    for (name, x), (_, y) in zip(ba, bb):
        assert x.dtype == y.dtype, f"{what} buffer {name}: {x.dtype} vs {y.dtype}"
        close(x, y, f"{what} buffer {name}", rtol, atol)
    for (name, m), (_, n) in zip(a.named_modules(), b.named_modules()):
        assert m.training == n.training, f"{what} {name}.training"


def same_state(lazy, eager, what, rtol=RTOL, atol=ATOL, noise=None, noise_atol=0.0, adam_noise=None):
    """Two programs' state agrees: dicts name -> module, optimizer, scheduler, tensor or value.
    noise: {module key: parameter names} (see same_module); their optimizer state is not
    compared beyond its layout. adam_noise: {module key: AdamNoise}."""
    assert list(lazy) == list(eager)
    noise = noise or {}
    noisy = {id(p) for key, names in noise.items() for n, p in eager[key].named_parameters() if n in names}
    for name in eager:
        a, b = lazy[name], eager[name]
        where = f"{what} {name}"
        if isinstance(b, nn.Module):
            same_module(a, b, where, rtol, atol, noise.get(name, ()), noise_atol, (adam_noise or {}).get(name))
        elif isinstance(b, torch.optim.Optimizer):
            sa, sb = a.state_dict(), b.state_dict()
            same_tree(sa["param_groups"], sb["param_groups"], f"{where}.state_dict() param_groups")
            params = [p for g in b.param_groups for p in g["params"]]
            assert list(sa["state"]) == list(sb["state"]), f"{where}: state of params {list(sa['state'])} vs {list(sb['state'])}"
            for i in sb["state"]:
                if id(params[i]) in noisy:
                    assert list(sa["state"][i]) == list(sb["state"][i])
                    continue
                same_tree(sa["state"][i], sb["state"][i], f"{where}.state_dict()['state'][{i}]", rtol, atol)
        elif isinstance(b, torch.optim.lr_scheduler.LRScheduler):
            assert a.get_last_lr() == b.get_last_lr(), f"{where} lr {a.get_last_lr()} vs {b.get_last_lr()}"
            assert a.last_epoch == b.last_epoch
        else:
            same_tree(a, b, where, rtol, atol)


def same_results(got, want, what, rtol=RTOL, atol=ATOL):
    """What the compiled step returned equals what the eager step returned (tensors detached)."""
    same_tree(got, want, f"{what} result", rtol, atol)


def clone_args(args):
    """A fresh copy of a step's tensor arguments (for steps that write into their inputs)."""
    if isinstance(args, torch.Tensor):
        return args.clone()
    if isinstance(args, (list, tuple)):
        return type(args)(clone_args(a) for a in args)
    if isinstance(args, dict):
        return {k: clone_args(v) for k, v in args.items()}
    return args


# ---- dropout masks --------------------------------------------------------------------------

class _Seen:
    def forward(self, x):
        out = super().forward(x)
        if self.training:
            self.__dict__.setdefault("seen", []).append((x.detach(), out.detach()))
        return out


def _seen_class(cls):
    return type(f"Seen{cls.__name__}", (_Seen, cls), {})


class ReplayDropout(nn.Module):
    """The eager oracle's dropout: multiplies by the mask lazyrt drew (kept / (1 - p)). Where
    the input was zero the mask is unknown and taken as zero: every program here feeds dropout
    from a ReLU (or pooling of one), whose backward gives those positions no gradient anyway."""

    def __init__(self, p):
        super().__init__()
        self.p, self.masks = p, []

    def forward(self, x):
        return x * self.masks.pop(0) if self.training else x


def _dropouts(model):
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) or isinstance(m, ReplayDropout)]


def _replace(model, name, new):
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def observe_dropouts(lazy_model, eager_model):
    """Swaps the dropout modules: lazy_model's for ones that keep what they saw and gave,
    eager_model's for ReplayDropout. Returns the names."""
    names = []
    for name, m in _dropouts(lazy_model):
        new = _seen_class(type(m))(m.p)
        new.train(m.training)
        _replace(lazy_model, name, new)
        _replace(eager_model, name, ReplayDropout(m.p))
        names.append(name)
    return names


def seen(model):
    """{name: [(input, output) of each call]} of every dropout module of model since the last
    seen() (for the step to return; a module called twice in a forward has two entries). In
    the eager oracle's model (ReplayDropout): {}."""
    out = {}
    for name, m in _dropouts(model):
        if m.__dict__.get("seen"):
            out[name] = m.__dict__.pop("seen")
    return out


def replay_masks(eager_model, dropped, kept_stats=None):
    """Gives eager_model's ReplayDropout modules the masks lazyrt drew (dropped: what the compiled
    step returned from seen()); kept_stats, a list, collects (kept, live) counts per module."""
    for name, calls in dropped.items():
        m = eager_model.get_submodule(name)
        assert not m.masks, f"{name}: masks left from the last step"
        for before, after in calls:
            kept = after != 0
            live = before != 0
            torch.testing.assert_close(after[kept], before[kept] / (1 - m.p), rtol=RTOL, atol=ATOL)
            if kept_stats is not None:
                kept_stats.append(((kept & live).sum().item(), live.sum().item(), m.p))
            m.masks.append(kept.float() / (1 - m.p))


def kept_fraction_ok(kept_stats, slack=0.05):
    """The masks kept about 1 - p of the live values, over all calls (per p)."""
    for p in {p for _, _, p in kept_stats}:
        kept = sum(k for k, _, q in kept_stats if q == p)
        live = sum(n for _, n, q in kept_stats if q == p)
        assert abs(kept / live - (1 - p)) < slack, f"p={p}: kept {kept}/{live}"
