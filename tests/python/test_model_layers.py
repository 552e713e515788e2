"""The ops and layers real models need, from Python, against PyTorch: sorting and top-k (named
results), cumulative ops, einsum / meshgrid / roll / tile in their Python spellings,
and the BatchNorm, GroupNorm, AdaptiveAvgPool2d and Upsample
modules, trained side by side with torch's and replayed by compile_step."""

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn
import lazyrt.nn.functional as F
from conftest import assert_same, pair


# ---- ops in their Python spellings -----------------------------------------------------------

def test_sort_and_topk_return_named_values_and_indices(rng):
    x, t = pair(rng, (4, 7), lr.float32)
    for got, expect in [(x.sort(), t.sort(stable=True)), (lr.sort(x, 0, descending=True), torch.sort(t, dim=0, descending=True, stable=True)),
                        (x.topk(3), t.topk(3)), (lr.topk(x, 2, dim=0, largest=False), torch.topk(t, 2, 0, False))]:
        values, indices = got
        assert_same(got.values, expect.values)
        assert_same(got.indices, expect.indices)
        assert values is not None and indices is not None
    assert_same(x.argsort(dim=1, descending=True), t.argsort(dim=1, descending=True))


def test_sort_is_stable_and_puts_nan_last():
    values = [3.0, float("nan"), 1.0, 3.0, 1.0, float("-inf")]
    got = lr.tensor(values).sort(stable=True)
    expect = torch.tensor(values).sort(stable=True)
    assert_same(got.values, expect.values)
    assert got.indices.tolist() == expect.indices.tolist() == [5, 2, 4, 0, 3, 1]


def test_topk_errors_name_the_call():
    with pytest.raises(lr.Error, match="topk: k \\(6\\) out of range"):
        lr.ones(2, 5).topk(6)
    with pytest.raises(lr.Error, match="sort: dim 2 out of range"):
        lr.ones(2, 5).sort(dim=2)


def test_cumulative_ops_and_dtypes(rng):
    x, t = pair(rng, (3, 5), lr.float32)
    assert_same(x.cumsum(1), t.cumsum(1))
    assert_same(lr.cumprod(x, 0), torch.cumprod(t, 0))
    i, ti = pair(rng, (6,), lr.int32)
    assert_same(i.cumsum(0), ti.cumsum(0))  # i64, as torch
    assert_same(lr.cumsum(i, 0, dtype=lr.float64), torch.cumsum(ti, 0, dtype=torch.float64))


def test_cumprod_gradient_with_zeros_matches_torch():
    values = [[2.0, 0.0, 3.0, 0.5], [0.0, 0.0, 1.5, 2.0], [1.0, 2.0, 3.0, 0.0]]
    x = lr.tensor(values, dtype=lr.float64, requires_grad=True)
    t = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    w = [[1.0, -2.0, 0.5, 3.0], [2.0, 1.0, -1.0, 0.25], [0.5, 0.5, 2.0, -1.0]]
    (x.cumprod(1) * lr.tensor(w, dtype=lr.float64)).sum().backward()
    (t.cumprod(1) * torch.tensor(w, dtype=torch.float64)).sum().backward()
    assert_same(x.grad, t.grad, rtol=1e-12, atol=1e-12)


def test_einsum_and_meshgrid_take_lists_or_varargs(rng):
    (a, ta), (b, tb) = pair(rng, (3, 4), lr.float32), pair(rng, (4, 2), lr.float32)
    assert_same(lr.einsum("ij,jk->ik", a, b), torch.einsum("ij,jk->ik", ta, tb))
    assert_same(lr.einsum("ij,jk->ik", [a, b]), torch.einsum("ij,jk->ik", [ta, tb]))
    for indexing in ("ij", "xy"):
        got = lr.meshgrid(lr.arange(3), lr.arange(4), indexing=indexing)
        expect = torch.meshgrid(torch.arange(3), torch.arange(4), indexing=indexing)
        for g, e in zip(got, expect):
            assert_same(g, e)
    for g, e in zip(lr.meshgrid([lr.arange(2), lr.arange(3)]), torch.meshgrid([torch.arange(2), torch.arange(3)], indexing="ij")):
        assert_same(g, e)
    with pytest.raises(lr.Error, match="einsum: subscript j has size 4 in operand 1 but 3"):
        lr.einsum("ij,jk", lr.ones(2, 3), lr.ones(4, 2))


def test_roll_tile_clamp_and_baddbmm_spellings(rng):
    x, t = pair(rng, (3, 4), lr.float32)
    assert_same(x.roll(1), t.roll(1))
    assert_same(x.roll(-1, 1), t.roll(-1, 1))
    assert_same(lr.roll(x, (1, 2), (0, 1)), torch.roll(t, (1, 2), (0, 1)))
    assert_same(x.tile(2, 1, 2), t.tile((2, 1, 2)))
    assert_same(lr.tile(x, (2,)), torch.tile(t, (2,)))
    assert_same(x.clamp_min(0.5), t.clamp_min(0.5))
    m, tm = pair(rng, (4,), lr.float32)
    assert_same(x.clamp_max(m), t.clamp_max(tm))
    (i, ti), (b1, tb1), (b2, tb2) = (pair(rng, (2, 3, 5), lr.float32), pair(rng, (2, 3, 4), lr.float32),
                                     pair(rng, (2, 4, 5), lr.float32))
    assert_same(i.baddbmm(b1, b2, beta=0.5, alpha=2), ti.baddbmm(tb1, tb2, beta=0.5, alpha=2), rtol=1e-5)


# ---- layers against torch's, in training and evaluation ---------------------------------------

def copy_from_torch(module, tmodule):
    module.load_state_dict({k: lr.from_torch(v.detach().clone()) for k, v in tmodule.state_dict().items()})


def assert_state_like_torch(module, tmodule, rtol=2e-6, atol=1e-6):
    got, expect = module.state_dict(), tmodule.state_dict()
    assert list(got) == list(expect)
    for k in expect:
        assert_same(got[k], expect[k], rtol=rtol, atol=atol, what=k)


@pytest.mark.parametrize("make,shape", [
    (lambda m: m.BatchNorm2d(3), (4, 3, 5, 5)),
    (lambda m: m.BatchNorm2d(3, momentum=0.3, eps=1e-3), (2, 3, 4, 4)),
    (lambda m: m.BatchNorm2d(3, affine=False), (4, 3, 2, 3)),
    (lambda m: m.BatchNorm2d(3, momentum=None), (4, 3, 2, 2)),
    (lambda m: m.BatchNorm2d(3, track_running_stats=False), (4, 3, 2, 2)),
    (lambda m: m.BatchNorm1d(4), (6, 4)),
    (lambda m: m.BatchNorm1d(4), (3, 4, 5)),
    (lambda m: m.GroupNorm(2, 4), (3, 4, 5)),
    (lambda m: m.GroupNorm(3, 6, affine=False), (2, 6, 2, 2)),
])
def test_normalization_layers_train_and_evaluate_like_torch(make, shape, rng):
    module, tmodule = make(nn), make(torch.nn)
    copy_from_torch(module, tmodule)
    assert_state_like_torch(module, tmodule)
    for step in range(3):
        x, t = pair(rng, shape, lr.float32, -2, 4, requires_grad=True)
        y, ty = module(x), tmodule(t)
        assert_same(y, ty, rtol=1e-5, atol=1e-5, what=f"train step {step}")
        w, tw = pair(rng, shape, lr.float32)
        (y * w).sum().backward()
        (ty * tw).sum().backward()
        assert_same(x.grad, t.grad, rtol=1e-4, atol=1e-5, what=f"input grad {step}")
        for (name, p), tp in zip(module.named_parameters(), tmodule.parameters()):
            assert_same(p.grad, tp.grad, rtol=1e-4, atol=1e-5, what=f"{name} grad {step}")
            p.grad = tp.grad = None
        assert_state_like_torch(module, tmodule)
    module.eval()
    tmodule.eval()
    x, t = pair(rng, shape, lr.float32, -2, 4)
    assert_same(module(x), tmodule(t), rtol=1e-5, atol=1e-5, what="eval")


def test_batch_norm_refuses_a_wrong_input():
    with pytest.raises(ValueError, match="expected 4D input"):
        nn.BatchNorm2d(3)(lr.ones(2, 3))
    with pytest.raises(lr.Error, match="expected 3 channels"):
        nn.BatchNorm2d(3)(lr.ones(2, 4, 2, 2))
    with pytest.raises(lr.Error, match="more than 1 value per channel"):
        nn.BatchNorm1d(3)(lr.ones(1, 3))


@pytest.mark.parametrize("make,shape", [
    (lambda m: m.AdaptiveAvgPool2d((1, 1)), (2, 3, 7, 5)),
    (lambda m: m.AdaptiveAvgPool2d(3), (2, 3, 7, 5)),
    (lambda m: m.AdaptiveAvgPool2d((None, 2)), (1, 2, 4, 6)),
    (lambda m: m.Upsample(scale_factor=2), (1, 2, 3, 4)),
    (lambda m: m.Upsample(size=(5, 7), mode="bilinear"), (1, 2, 3, 4)),
    (lambda m: m.Upsample(scale_factor=1.5, mode="bilinear", align_corners=True), (2, 1, 4, 4)),
])
def test_spatial_layers_like_torch(make, shape, rng):
    x, t = pair(rng, shape, lr.float32, requires_grad=True)
    y, ty = make(nn)(x), make(torch.nn)(t)
    assert_same(y, ty, rtol=1e-5, atol=1e-6)
    w, tw = pair(rng, tuple(ty.shape), lr.float32)
    (y * w).sum().backward()
    (ty * tw).sum().backward()
    assert_same(x.grad, t.grad, rtol=1e-5, atol=1e-6)


class SmallCNN:
    """conv -> BatchNorm -> relu -> adaptive pool -> linear, built for torch or lazyrt."""

    def __init__(self, m):
        self.net = m.Sequential(m.Conv2d(2, 4, 3, padding=1), m.BatchNorm2d(4), m.ReLU(), m.AdaptiveAvgPool2d(1),
                                m.Flatten(), m.Linear(4, 3))


def test_compile_step_writes_back_batch_norm_statistics_every_replay(rng):
    torch.manual_seed(0)
    tnet = SmallCNN(torch.nn).net
    net = SmallCNN(nn).net
    copy_from_torch(net, tnet)
    opt = lr.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(tnet.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    data = [(rng.standard_normal((6, 2, 5, 5)).astype(np.float32), rng.integers(0, 3, size=6)) for _ in range(5)]
    compiled = lr.compile_step(step, (lr.tensor(data[0][0]), lr.tensor(data[0][1])))
    for i, (x, y) in enumerate(data):
        loss = compiled(lr.tensor(x), lr.tensor(y))
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tnet(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5), f"step {i}"
    assert compiled.traces == 1
    assert_state_like_torch(net, tnet, rtol=1e-4, atol=1e-5)
    assert net[1].num_batches_tracked.item() == 5
    # Evaluation reads the running statistics the replays wrote.
    net.eval()
    tnet.eval()
    x = data[0][0]
    assert_same(net(lr.tensor(x)), tnet(torch.tensor(x)), rtol=1e-4, atol=1e-5)
