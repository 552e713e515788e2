"""The PyTorch spellings written in Python (nn.functional activations, losses and distances,
their modules, Tensor methods and in-place forms, lazyrt's torch-level functions), against
PyTorch: values, dtypes, shapes and float64 gradients."""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import lazyrt as lr
import lazyrt.nn.functional as F
from conftest import assert_same, pair


def _grads_match(lr_fn, torch_fn, inputs, rtol=1e-10, atol=1e-12):
    """lr_fn and torch_fn agree on float64 inputs (list of arrays): value and every gradient."""
    xs = [lr.tensor(a, dtype=lr.float64, requires_grad=True) for a in inputs]
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in inputs]
    y, t = lr_fn(*xs), torch_fn(*ts)
    assert_same(y, t, rtol=rtol, atol=atol, what="value")
    y.sum().backward()
    t.sum().backward()
    for i, (x, tt) in enumerate(zip(xs, ts)):
        assert_same(x.grad, tt.grad, rtol=rtol, atol=atol, what=f"grad {i}")


def _away_from(a, points, gap=0.05):
    # Kinks (relu6 at 0 and 6, ...) are where the two libraries may pick different subgradients.
    for p in points:
        a = np.where(np.abs(a - p) < gap, p + gap, a)
    return a


# ---- activations ---------------------------------------------------------------------------

ACTIVATIONS = [
    ("relu6", F.relu6, TF.relu6, (0, 6)),
    ("elu", lambda x: F.elu(x, 0.7), lambda x: TF.elu(x, 0.7), (0,)),
    ("selu", F.selu, TF.selu, (0,)),
    ("celu", lambda x: F.celu(x, 1.5), lambda x: TF.celu(x, 1.5), (0,)),
    ("hardtanh", lambda x: F.hardtanh(x, -2.0, 3.0), lambda x: TF.hardtanh(x, -2.0, 3.0), (-2, 3)),
    ("hardswish", F.hardswish, TF.hardswish, (-3, 3)),
    ("hardsigmoid", F.hardsigmoid, TF.hardsigmoid, (-3, 3)),
    ("logsigmoid", F.logsigmoid, TF.logsigmoid, ()),
    ("softsign", F.softsign, TF.softsign, (0,)),
    ("softmin", lambda x: F.softmin(x, 1), lambda x: TF.softmin(x, 1), ()),
    ("normalize", F.normalize, TF.normalize, ()),
    ("normalize_p1", lambda x: F.normalize(x, 1.0, 0), lambda x: TF.normalize(x, 1.0, 0), ()),
]


@pytest.mark.parametrize("name,fn,tfn,kinks", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_values_and_grads(rng, name, fn, tfn, kinks):
    a = _away_from(rng.uniform(-8, 8, size=(3, 5)), kinks)
    # torch's hardsigmoid backward multiplies by a float32 1/6, even in float64.
    _grads_match(fn, tfn, [a], rtol=1e-7 if name == "hardsigmoid" else 1e-10)
    x, t = pair(rng, (4, 3), lr.float32)
    assert_same(fn(x), tfn(t), rtol=1e-5, atol=1e-6, what=f"{name} float32")


def test_activation_extremes():
    a = np.array([-800.0, -40.0, -1e-3, 0.0, 1e-3, 40.0, 800.0])
    for fn, tfn in [(F.logsigmoid, TF.logsigmoid), (F.elu, TF.elu), (F.selu, TF.selu), (F.celu, TF.celu)]:
        assert_same(fn(lr.tensor(a, dtype=lr.float64)), tfn(torch.tensor(a)))
    # Gradients stay finite where exp(x) overflows.
    _grads_match(F.elu, TF.elu, [np.array([800.0, -800.0, 2.0])])


def test_activation_modules(rng):
    a = _away_from(rng.uniform(-8, 8, size=(2, 3, 4)), (-3, -2, -1, 0, 1, 3, 6))
    x, t = lr.tensor(a, dtype=lr.float64), torch.tensor(a)
    cases = [
        (lr.nn.ReLU6(inplace=True), torch.nn.ReLU6()), (lr.nn.ELU(0.5), torch.nn.ELU(0.5)),
        (lr.nn.SELU(), torch.nn.SELU()), (lr.nn.CELU(2.0), torch.nn.CELU(2.0)),
        (lr.nn.Hardtanh(), torch.nn.Hardtanh()), (lr.nn.Hardtanh(-2.0, 3.0, True), torch.nn.Hardtanh(-2.0, 3.0)),
        (lr.nn.Hardswish(), torch.nn.Hardswish()), (lr.nn.Hardsigmoid(), torch.nn.Hardsigmoid()),
        (lr.nn.LogSigmoid(), torch.nn.LogSigmoid()), (lr.nn.Softsign(), torch.nn.Softsign()),
        (lr.nn.Softmin(dim=2), torch.nn.Softmin(dim=2)),
    ]
    for m, tm in cases:
        assert_same(m(x), tm(t), what=type(m).__name__)
    assert_same(x, torch.tensor(a), what="inplace=True left the input as it was")
    assert "inplace=True" in repr(lr.nn.ReLU6(inplace=True))
    with pytest.raises(lr.Error, match="Hardtanh"):
        lr.nn.Hardtanh(1.0, -1.0)


def test_softmin_implicit_dim_warns(rng):
    x, t = pair(rng, (2, 3), lr.float64)
    with pytest.warns(UserWarning, match="softmin"):
        y = F.softmin(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(y, TF.softmin(t))
    assert_same(F.softmin(x, 0, dtype=lr.float32), TF.softmin(t, 0, dtype=torch.float32), rtol=1e-6)


@pytest.mark.parametrize("num", [1, 3])
def test_prelu(rng, num):
    a = _away_from(rng.uniform(-3, 3, size=(2, 3, 4)), (0,))
    m, tm = lr.nn.PReLU(num, init=0.3), torch.nn.PReLU(num, init=0.3)
    m.double()
    tm.double()
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert tuple(m.weight.shape) == tuple(tm.weight.shape)
    with torch.no_grad():
        tm.weight.copy_(torch.linspace(0.1, 0.5, num, dtype=torch.float64))
    with lr.no_grad():
        m.weight.copy_(lr.tensor(tm.weight.detach().numpy()))
    x = lr.tensor(a, dtype=lr.float64, requires_grad=True)
    t = torch.tensor(a, requires_grad=True)
    y, ty = m(x), tm(t)
    assert_same(y, ty)
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    assert_same(x.grad, t.grad, what="input grad")
    assert_same(m.weight.grad, tm.weight.grad, what="weight grad")
    with pytest.raises(lr.Error, match="prelu"):
        lr.nn.PReLU(4)(x)


# ---- distances -----------------------------------------------------------------------------

def test_cosine_similarity_and_pairwise_distance(rng):
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    _grads_match(F.cosine_similarity, TF.cosine_similarity, [a, b])
    _grads_match(lambda x, y: F.cosine_similarity(x, y, dim=0), lambda x, y: TF.cosine_similarity(x, y, dim=0),
                 [a, b])
    _grads_match(F.pairwise_distance, TF.pairwise_distance, [a, b])
    _grads_match(lambda x, y: F.pairwise_distance(x, y, 1.0, keepdim=True),
                 lambda x, y: TF.pairwise_distance(x, y, 1.0, keepdim=True), [a, b])
    x, y = lr.tensor(a, dtype=lr.float64), lr.tensor(b[:1], dtype=lr.float64)
    t, u = torch.tensor(a), torch.tensor(b[:1])
    assert_same(lr.nn.CosineSimilarity()(x, y), torch.nn.CosineSimilarity()(t, u), what="broadcast")
    assert_same(lr.nn.PairwiseDistance(p=3.0, eps=1e-3)(x, y), torch.nn.PairwiseDistance(p=3.0, eps=1e-3)(t, u))


# ---- losses --------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(rng, reduction):
    a, b = rng.normal(size=(3, 4)) * 2, rng.normal(size=(3, 4)) * 2
    _grads_match(lambda x, y: F.l1_loss(x, y, reduction=reduction),
                 lambda x, y: TF.l1_loss(x, y, reduction=reduction), [a, b])
    for beta in (0.0, 0.5, 2.0):
        _grads_match(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=beta),
                     lambda x, y: TF.smooth_l1_loss(x, y, reduction=reduction, beta=beta), [a, b])
    for delta in (0.5, 2.0):
        _grads_match(lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=delta),
                     lambda x, y: TF.huber_loss(x, y, reduction=reduction, delta=delta), [a, b])
    x, y, t, u = lr.tensor(a), lr.tensor(b), torch.tensor(a), torch.tensor(b)
    assert_same(lr.nn.L1Loss(reduction=reduction)(x, y), torch.nn.L1Loss(reduction=reduction)(t, u))
    assert_same(lr.nn.SmoothL1Loss(reduction=reduction, beta=0.3)(x, y),
                torch.nn.SmoothL1Loss(reduction=reduction, beta=0.3)(t, u))
    assert_same(lr.nn.HuberLoss(reduction=reduction, delta=1.5)(x, y),
                torch.nn.HuberLoss(reduction=reduction, delta=1.5)(t, u))


def test_legacy_reduction_flags(rng):
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(lr.nn.L1Loss(size_average=False)(lr.tensor(a), lr.tensor(b)),
                    torch.nn.L1Loss(size_average=False)(torch.tensor(a), torch.tensor(b)))
        assert_same(lr.nn.SmoothL1Loss(reduce=False)(lr.tensor(a), lr.tensor(b)),
                    torch.nn.SmoothL1Loss(reduce=False)(torch.tensor(a), torch.tensor(b)))
    with pytest.raises(ValueError, match="l1_loss"):
        F.l1_loss(lr.tensor(a), lr.tensor(b), reduction="average")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2, 3)], ids=["NC", "NCd"])
def test_nll_loss(rng, reduction, shape):
    logits = rng.normal(size=shape)
    target = rng.integers(0, shape[1], size=(shape[0],) + shape[2:])
    target.flat[::3] = -100
    lp = torch.log_softmax(torch.tensor(logits), 1).numpy()

    def run(f, log_softmax_module):
        return lambda x: f(x, target, reduction)
    xs = lr.tensor(lp, dtype=lr.float64, requires_grad=True)
    ts = torch.tensor(lp, requires_grad=True)
    y = F.nll_loss(xs, lr.tensor(target), reduction=reduction)
    t = TF.nll_loss(ts, torch.tensor(target), reduction=reduction)
    assert_same(y, t)
    y.sum().backward()
    t.sum().backward()
    assert_same(xs.grad, ts.grad, what="grad")
    # Another ignore_index, through the module.
    m = lr.nn.NLLLoss(ignore_index=1, reduction=reduction)
    tm = torch.nn.NLLLoss(ignore_index=1, reduction=reduction)
    t2 = np.abs(target)
    t2[t2 >= shape[1]] = 0
    assert_same(m(lr.tensor(lp), lr.tensor(t2)), tm(torch.tensor(lp), torch.tensor(t2)))


def test_nll_loss_edges(rng):
    lp = torch.log_softmax(torch.tensor(rng.normal(size=(3, 4))), 1).numpy()
    # 1-D input and 0-D target.
    for reduction in ("mean", "sum", "none"):
        assert_same(F.nll_loss(lr.tensor(lp[0]), lr.tensor(2), reduction=reduction),
                    TF.nll_loss(torch.tensor(lp[0]), torch.tensor(2), reduction=reduction))
    # Every target ignored: the mean is NaN, as in torch.
    ignored = np.full(3, -100)
    assert_same(F.nll_loss(lr.tensor(lp), lr.tensor(ignored)), TF.nll_loss(torch.tensor(lp), torch.tensor(ignored)))
    with pytest.raises(lr.Error, match="nll_loss.*weight"):
        F.nll_loss(lr.tensor(lp), lr.tensor([0, 1, 2]), weight=lr.ones(4))
    with pytest.raises(lr.Error, match="NLLLoss.*weight"):
        lr.nn.NLLLoss(weight=lr.ones(4))
    with pytest.raises(ValueError, match="batch_size"):
        F.nll_loss(lr.tensor(lp), lr.tensor([0, 1]))
    with pytest.raises(lr.Error, match="int64"):
        F.nll_loss(lr.tensor(lp), lr.tensor([0, 1, 2], dtype=lr.int32))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(rng, reduction):
    p, y = rng.uniform(0.02, 0.98, size=(4, 3)), rng.uniform(0, 1, size=(4, 3))
    _grads_match(lambda x, t: F.binary_cross_entropy(x, t, reduction=reduction),
                 lambda x, t: TF.binary_cross_entropy(x, t, reduction=reduction), [p, y])
    w = rng.uniform(0.5, 2, size=(3,))
    assert_same(lr.nn.BCELoss(weight=lr.tensor(w), reduction=reduction)(lr.tensor(p), lr.tensor(y)),
                torch.nn.BCELoss(weight=torch.tensor(w), reduction=reduction)(torch.tensor(p), torch.tensor(y)))
    # log(0) is clamped at -100.
    edge, target = np.array([0.0, 1.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0, 1.0])
    assert_same(F.binary_cross_entropy(lr.tensor(edge), lr.tensor(target), reduction=reduction),
                TF.binary_cross_entropy(torch.tensor(edge), torch.tensor(target), reduction=reduction))
    with pytest.raises(ValueError, match="target size"):
        F.binary_cross_entropy(lr.tensor(p), lr.tensor(y[:1]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none", "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(rng, reduction, log_target):
    inp = torch.log_softmax(torch.tensor(rng.normal(size=(3, 5))), 1).numpy()
    tgt = torch.softmax(torch.tensor(rng.normal(size=(3, 5))), 1).numpy()
    if log_target:
        tgt = np.log(tgt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _grads_match(lambda x, t: F.kl_div(x, t, reduction=reduction, log_target=log_target),
                     lambda x, t: TF.kl_div(x, t, reduction=reduction, log_target=log_target), [inp, tgt])
        assert_same(lr.nn.KLDivLoss(reduction=reduction, log_target=log_target)(lr.tensor(inp), lr.tensor(tgt)),
                    torch.nn.KLDivLoss(reduction=reduction, log_target=log_target)(torch.tensor(inp),
                                                                                    torch.tensor(tgt)))


def test_kl_div_zero_target_and_mean_warning(rng):
    inp = torch.log_softmax(torch.tensor(rng.normal(size=(2, 4))), 1).numpy()
    tgt = np.array([[0.5, 0.0, 0.5, 0.0], [0.25, 0.25, 0.5, 0.0]])
    x = lr.tensor(inp, requires_grad=True)
    t = torch.tensor(inp, requires_grad=True)
    y, ty = F.kl_div(x, lr.tensor(tgt), reduction="sum"), TF.kl_div(t, torch.tensor(tgt), reduction="sum")
    assert_same(y, ty)
    y.backward()
    ty.backward()
    assert_same(x.grad, t.grad, what="grad")
    with pytest.warns(UserWarning, match="batchmean"):
        F.kl_div(x, lr.tensor(tgt))


# ---- reshaping and padding modules -----------------------------------------------------------

def test_unflatten_and_padding(rng):
    x, t = pair(rng, (2, 12, 3), lr.float32)
    for dim, sizes in [(1, (3, 4)), (-2, (2, -1, 3)), (2, (3,))]:
        assert_same(lr.nn.Unflatten(dim, sizes)(x), torch.nn.Unflatten(dim, sizes)(t), what=f"{dim} {sizes}")
    with pytest.raises(lr.Error, match="Unflatten"):
        lr.nn.Unflatten(1, (5, 2))(x)
    x, t = pair(rng, (2, 3, 4, 5), lr.float32)
    for padding in (1, (1, 2, 0, 3)):
        assert_same(lr.nn.ZeroPad2d(padding)(x), torch.nn.ZeroPad2d(padding)(t))
        assert_same(lr.nn.ConstantPad2d(padding, 2.5)(x), torch.nn.ConstantPad2d(padding, 2.5)(t))
    assert_same(lr.nn.ZeroPad2d(2)(x[0]), torch.nn.ZeroPad2d(2)(t[0]), what="3-D")


# ---- Tensor methods --------------------------------------------------------------------------

def test_tensor_methods(rng):
    x, t = pair(rng, (2, 3, 4), lr.float64)
    o, to = pair(rng, (4, 2, 3, 4), lr.float32)
    assert_same(x.expand_as(o), t.expand_as(to))
    assert_same(x.view_as(lr.zeros(6, 4)), t.view_as(torch.zeros(6, 4)))
    assert_same(x.type_as(o), t.type_as(to))
    assert x.type_as(x) is x
    assert_same(x.square(), t.square())
    assert_same(x.clip(-1, 0.5), t.clip(-1, 0.5))
    assert_same(x.mT, t.mT)
    for dim, index in [(0, 1), (1, -1), (-1, 2)]:
        assert_same(x.select(dim, index), t.select(dim, index), what=f"select {dim} {index}")
    for dim in (0, 1, -1):
        parts, tparts = x.unbind(dim), t.unbind(dim)
        assert isinstance(parts, tuple) and len(parts) == len(tparts)
        for p, tp in zip(parts, tparts):
            assert_same(p, tp)
    with pytest.raises(IndexError, match="select"):
        x.select(1, 3)
    with pytest.raises(IndexError):
        x.unbind(3)
    with pytest.raises(lr.Error, match="mT"):
        lr.ones(3).mT
    b, tb = pair(rng, (3,), lr.bool)
    assert_same(b.square(), tb.square())


def test_tensor_method_grads(rng):
    a = rng.normal(size=(3, 4))
    _grads_match(lambda x: x.square() + x.mT.sum(1), lambda x: x.square() + x.mT.sum(1), [a])
    _grads_match(lambda x: x.select(1, 2) * 2, lambda x: x.select(1, 2) * 2, [a])
    _grads_match(lambda x: x.unbind(0)[1] * x.unbind(0)[2], lambda x: x.unbind(0)[1] * x.unbind(0)[2], [a])


INPLACE = [
    ("exp_", (), ()), ("sqrt_", (), ()), ("relu_", (), ()), ("sigmoid_", (), ()), ("tanh_", (), ()),
    ("neg_", (), ()), ("abs_", (), ()), ("clamp_", (-0.5, 0.7), ()), ("clip_", (0.1,), ()), ("pow_", (3,), ()),
    ("square_", (), ()), ("lerp_", ("T", 0.3), ()), ("addcmul_", ("T", "T"), (("value", 0.5),)),
    ("addcdiv_", ("T", "T2"), (("value", -2.0),)),
]


@pytest.mark.parametrize("name,args,kwargs", INPLACE, ids=[c[0] for c in INPLACE])
def test_inplace_methods(rng, name, args, kwargs):
    base = rng.uniform(0.2, 2.0, size=(2, 3)) * np.where(rng.random((2, 3)) < 0.5, -1, 1)
    if name == "sqrt_":
        base = np.abs(base)
    other = rng.uniform(0.5, 1.5, size=(2, 3))

    def make_args(lib):
        conv = lr.tensor if lib == "lr" else torch.tensor
        out = []
        for a in args:
            out.append(conv(other) if a == "T" else conv(other + 1) if a == "T2" else a)
        return out, dict(kwargs)

    # Through a non-leaf: the gradient flows back through the in-place op, as in torch.
    w = lr.tensor(base, requires_grad=True)
    tw = torch.tensor(base, requires_grad=True)
    y, ty = w * 1.5, tw * 1.5
    la, lk = make_args("lr")
    ta, tk = make_args("torch")
    r, tr = getattr(y, name)(*la, **lk), getattr(ty, name)(*ta, **tk)
    assert r is y
    assert_same(y, ty, what="value")
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    assert_same(w.grad, tw.grad, what="grad")
    # On a plain tensor the value changes and the identity is kept.
    x, tx = lr.tensor(base), torch.tensor(base)
    getattr(x, name)(*la, **lk)
    getattr(tx, name)(*ta, **tk)
    assert_same(x, tx, what="plain")


def test_inplace_refusals():
    leaf = lr.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(lr.Error, match="exp_.*leaf"):
        leaf.exp_()
    with lr.no_grad():
        leaf.neg_()
    assert leaf.tolist() == [-1.0, -2.0] and leaf.requires_grad and leaf.is_leaf
    ints = lr.tensor([1, 4, 9])
    with pytest.raises(lr.Error, match="sqrt_.*can't be cast"):
        ints.sqrt_()
    with pytest.raises(RuntimeError):
        torch.tensor([1, 4, 9]).sqrt_()
    ints.neg_()
    assert ints.tolist() == [-1, -4, -9] and ints.dtype is lr.int64
    small = lr.tensor([1.0, 2.0])
    with pytest.raises(lr.Error, match="addcmul_.*shape"):
        small.addcmul_(lr.ones(3, 2), lr.ones(3, 2))


def test_normal_and_uniform():
    lr.manual_seed(0)
    x = lr.zeros(20000, dtype=lr.float64)
    assert x.normal_(2.0, 0.5) is x
    v = x.numpy()
    assert abs(v.mean() - 2.0) < 0.02 and abs(v.std() - 0.5) < 0.02
    y = lr.zeros(20000)
    assert y.uniform_(-1.0, 3.0) is y and y.dtype is lr.float32
    v = y.numpy()
    assert v.min() >= -1.0 and v.max() < 3.0 and abs(v.mean() - 1.0) < 0.05
    z = lr.zeros(1000)
    z.uniform_(**{"from": 5.0, "to": 6.0})
    assert z.numpy().min() >= 5.0 and z.numpy().max() < 6.0
    leaf = lr.zeros(3, requires_grad=True)
    with pytest.raises(lr.Error, match="normal_"):
        leaf.normal_()
    with lr.no_grad():
        leaf.uniform_()
    assert leaf.requires_grad and leaf.is_leaf
    with pytest.raises(lr.Error, match="uniform_"):
        lr.zeros(3, dtype=lr.int64).uniform_()
    # A non-leaf: its gradient to what it came from is zero after the fill, as in torch.
    w = lr.ones(3, requires_grad=True)
    tw = torch.ones(3, requires_grad=True)
    h, th = w * 2, tw * 2
    h.normal_()
    th.normal_()
    (h * w).sum().backward()
    (th * tw).sum().backward()
    assert h.requires_grad == th.requires_grad
    np.testing.assert_allclose(w.grad.numpy(), h.detach().numpy(), rtol=1e-6)


# ---- torch-level functions written in Python (lazyrt._math, _linalg, ...) -----------------------

PYTHON_FUNCTION_MODULES = ("_math", "_linalg", "_factories", "_shapes", "_sorting", "_data_dependent",
                           "_serialization")


@pytest.mark.parametrize("module", PYTHON_FUNCTION_MODULES)
def test_python_function_exports(module):
    import importlib
    m = importlib.import_module(f"lazyrt.{module}")
    for name in m.__all__:
        assert getattr(lr, name) is getattr(m, name), name
        assert hasattr(torch, name), name


UNARY = [
    ("square", lr.square, torch.square, (-3, 3)), ("log2", lr.log2, torch.log2, (0.1, 5)),
    ("log10", lr.log10, torch.log10, (0.1, 5)), ("exp2", lr.exp2, torch.exp2, (-3, 3)),
    ("tan", lr.tan, torch.tan, (-1.4, 1.4)), ("frac", lr.frac, torch.frac, (-5, 5)),
]


@pytest.mark.parametrize("name,fn,tfn,bounds", UNARY, ids=[u[0] for u in UNARY])
def test_unary(rng, name, fn, tfn, bounds):
    a = rng.uniform(*bounds, size=(3, 4))
    _grads_match(fn, tfn, [a])
    x, t = pair(rng, (5,), lr.float32, *bounds)
    assert_same(fn(x), tfn(t), rtol=1e-5, atol=1e-6, what="float32")
    if name != "frac":
        i, ti = pair(rng, (5,), lr.int64, 1, 4)
        assert_same(fn(i), tfn(ti), rtol=1e-5, atol=1e-6, what="int64")


def test_trunc(rng):
    a = np.array([-2.5, -1.0, -0.4, 0.0, 0.4, 1.0, 2.7])
    assert_same(lr.trunc(lr.tensor(a)), torch.trunc(torch.tensor(a)))
    _grads_match(lr.trunc, torch.trunc, [a])
    i = np.array([-3, 0, 4])
    assert_same(lr.trunc(lr.tensor(i)), torch.trunc(torch.tensor(i)))


def test_atan2(rng):
    y, x = rng.normal(size=(4, 5)) * 3, rng.normal(size=(4, 5)) * 3
    _grads_match(lr.atan2, torch.atan2, [y, x], rtol=1e-12, atol=1e-14)
    big = np.array([1e-8, 1e8, -1e8, 1.0, 0.5]), np.array([1.0, 1.0, -3.0, -1e-9, -2.0])
    _grads_match(lr.atan2, torch.atan2, list(big), rtol=1e-12, atol=1e-14)
    axes = np.array([0.0, 1.0, -1.0, 0.0, 2.0, -2.0]), np.array([0.0, 0.0, 0.0, -1.0, 2.0, -2.0])
    assert_same(lr.atan2(lr.tensor(axes[0]), lr.tensor(axes[1])), torch.atan2(torch.tensor(axes[0]),
                                                                              torch.tensor(axes[1])))
    i, ti = pair(rng, (5,), lr.int64)
    assert_same(lr.atan2(i, i + 5), torch.atan2(ti, ti + 5), rtol=1e-5, atol=1e-6)


INT_A = np.array([7, -7, 7, -7, 0, 9, -9, 1, 100, -3])
INT_B = np.array([2, 2, -2, -2, 3, -3, -3, 5, 7, 4])


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "fmod"])
def test_integer_division(name):
    fn, tfn = getattr(lr, name), getattr(torch, name)
    for dtype, tdtype in [(lr.int64, torch.int64), (lr.int32, torch.int32)]:
        a, b = lr.tensor(INT_A, dtype=dtype), lr.tensor(INT_B, dtype=dtype)
        ta, tb = torch.tensor(INT_A, dtype=tdtype), torch.tensor(INT_B, dtype=tdtype)
        assert_same(fn(a, b), tfn(ta, tb))
        assert_same(fn(a, 3), tfn(ta, 3), what="scalar divisor")
        assert_same(fn(a, -3), tfn(ta, -3), what="negative scalar divisor")
    large = np.array([2 ** 62 + 1, -(2 ** 62) - 3, 2 ** 53 + 1])
    div = np.array([3, 7, -2])
    assert_same(fn(lr.tensor(large), lr.tensor(div)), tfn(torch.tensor(large), torch.tensor(div)), what="large")


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "fmod"])
def test_float_division(rng, name):
    fn, tfn = getattr(lr, name), getattr(torch, name)
    a = np.array([7.5, -7.5, 7.5, -7.5, 0.3, -0.3, 5.0, 1e3, -2.25])
    b = np.array([2.0, 2.0, -2.0, -2.0, -0.1, 0.1, -2.5, 0.7, 0.5])
    assert_same(fn(lr.tensor(a), lr.tensor(b)), tfn(torch.tensor(a), torch.tensor(b)), atol=1e-12)
    assert_same(fn(lr.tensor(a), 1.5), tfn(torch.tensor(a), 1.5), atol=1e-12)
    i = lr.tensor(INT_A)
    assert_same(fn(i, 2.5), tfn(torch.tensor(INT_A), 2.5), rtol=1e-6, atol=1e-6, what="int by float")
    if name != "floor_divide":
        x, y = rng.uniform(-5, 5, size=(6,)), rng.uniform(0.5, 2, size=(6,)) * np.array([1, -1] * 3)
        _grads_match(fn, tfn, [x, y])


def test_mod_and_floordiv_operators_are_torchs():
    # Float divisors that are exact in binary: the operators, not fmod's precision, under test.
    for a, b in [(INT_A, INT_B), (np.array([7.5, -7.5, 0.3, -2.25]), np.array([2.0, -2.0, -0.25, 0.5]))]:
        x, y, tx, ty = lr.tensor(a), lr.tensor(b), torch.tensor(a), torch.tensor(b)
        assert_same(x % y, tx % ty, atol=1e-12)
        assert_same(x // y, tx // ty)
        assert_same(x % 3, tx % 3, atol=1e-12, what="scalar divisor")
        assert_same(x // -3, tx // -3, what="negative scalar divisor")
        assert_same(17 % y, 17 % ty, atol=1e-12, what="scalar dividend")
        assert_same(-17 // y, -17 // ty, what="scalar dividend")
        assert_same(x.remainder(y), tx.remainder(ty), atol=1e-12, what="method")
        assert_same(x.fmod(y), tx.fmod(ty), atol=1e-12, what="method")


def test_binary_elementwise(rng):
    a, b = rng.normal(size=(3, 4)) * 3, rng.normal(size=(4,)) * 3
    _grads_match(lr.hypot, torch.hypot, [a, b])
    _grads_match(lr.logaddexp, torch.logaddexp, [a, b])
    ext = np.array([-np.inf, np.inf, 800.0, -800.0, 1.0]), np.array([-np.inf, np.inf, 799.0, -800.5, 1.0])
    assert_same(lr.logaddexp(lr.tensor(ext[0]), lr.tensor(ext[1])),
                torch.logaddexp(torch.tensor(ext[0]), torch.tensor(ext[1])))
    ia, ib = np.array([0, 1, 2, 0]), np.array([0, 0, 3, 5])
    assert_same(lr.logical_xor(lr.tensor(ia), lr.tensor(ib)), torch.logical_xor(torch.tensor(ia), torch.tensor(ib)))
    ba = np.array([True, False, True, False])
    assert_same(lr.logical_xor(lr.tensor(ba), lr.tensor(ia)), torch.logical_xor(torch.tensor(ba), torch.tensor(ia)))


def test_comparisons():
    a = np.array([1.0, 1.0 + 1e-6, np.inf, -np.inf, np.nan, 2.0, 0.0])
    b = np.array([1.0, 1.0, np.inf, np.inf, np.nan, 2.1, 1e-9])
    x, y, t, u = lr.tensor(a), lr.tensor(b), torch.tensor(a), torch.tensor(b)
    for kw in [{}, {"equal_nan": True}, {"rtol": 0.1}, {"rtol": 0, "atol": 0}, {"atol": 0.2}]:
        assert_same(lr.isclose(x, y, **kw), torch.isclose(t, u, **kw), what=str(kw))
        assert lr.allclose(x, y, **kw) == torch.allclose(t, u, **kw)
    assert lr.allclose(x[:2], y[:2]) and torch.allclose(t[:2], u[:2])
    ia, ib = np.array([1, 5, 10]), np.array([1, 6, 10])
    assert_same(lr.isclose(lr.tensor(ia), lr.tensor(ib), atol=1), torch.isclose(torch.tensor(ia), torch.tensor(ib), atol=1))
    with pytest.raises(lr.Error, match="isclose"):
        lr.isclose(x, lr.tensor(a, dtype=lr.float32))
    for p, q in [(a[:2], a[:2]), (a[:2], b[:2]), (a[:2], a[:3]), (ia, ia)]:
        assert lr.equal(lr.tensor(p), lr.tensor(q)) == torch.equal(torch.tensor(p), torch.tensor(q))
    m = np.array([[0, 1, 2], [0, 0, 3]])
    for dim in (None, 0, 1):
        assert_same(lr.count_nonzero(lr.tensor(m), dim), torch.count_nonzero(torch.tensor(m), dim), what=str(dim))


def test_products_and_diagonals(rng):
    v, w = rng.normal(size=(4,)), rng.normal(size=(5,))
    m = rng.normal(size=(3, 4))
    _grads_match(lr.outer, torch.outer, [v, w])
    _grads_match(lr.dot, torch.dot, [v, v[::-1].copy()])
    _grads_match(lr.mv, torch.mv, [m, v])
    _grads_match(lr.trace, torch.trace, [m])
    i, ti = pair(rng, (4,), lr.int32)
    assert_same(lr.dot(i, i), torch.dot(ti, ti))
    im, tim = pair(rng, (3, 3), lr.int32)
    assert_same(lr.trace(im), torch.trace(tim))
    for k in (0, 1, -2, 5):
        _grads_match(lambda x: lr.diag(x, k), lambda x: torch.diag(x, k), [v])
    for k in (0, 1, -2, 3, -3):  # torch 1.13 fails on diagonals further out
        _grads_match(lambda x: lr.diag(x, k), lambda x: torch.diag(x, k), [m])
    assert_same(lr.diag(i, 1), torch.diag(ti, 1), what="int vector")
    with pytest.raises(lr.Error, match="dot"):
        lr.dot(lr.tensor(v), lr.tensor(w))
    with pytest.raises(lr.Error, match="dot"):
        lr.dot(lr.tensor(v), lr.tensor(v, dtype=lr.float32))
    with pytest.raises(lr.Error, match="mv"):
        lr.mv(lr.tensor(m), lr.tensor(w))
    with pytest.raises(lr.Error, match="diag"):
        lr.diag(lr.zeros(2, 2, 2))


def test_diff(rng):
    a = rng.normal(size=(3, 6))
    for n, dim in [(1, -1), (2, 1), (1, 0), (3, -1), (0, 1)]:
        _grads_match(lambda x: lr.diff(x, n, dim), lambda x: torch.diff(x, n, dim), [a])
    p, q = rng.normal(size=(3, 2)), rng.normal(size=(3, 1))
    _grads_match(lambda x, y, z: lr.diff(x, 2, 1, prepend=y, append=z),
                 lambda x, y, z: torch.diff(x, 2, 1, prepend=y, append=z), [a, p, q])
    b = np.array([True, True, False, True])
    assert_same(lr.diff(lr.tensor(b)), torch.diff(torch.tensor(b)))
    i = np.array([1, 4, 9, 16, 25])
    assert_same(lr.diff(lr.tensor(i), 2), torch.diff(torch.tensor(i), 2))


def test_factories(rng):
    for args, kw in [((3,), {}), ((2, 4), {}), ((3,), {"dtype": lr.int64}), ((0,), {})]:
        tkw = {"dtype": torch.int64} if kw else {}
        assert_same(lr.eye(*args, **kw), torch.eye(*args, **tkw), what=str(args))
    e = lr.empty(2, 3, dtype=lr.float64)
    assert tuple(e.shape) == (2, 3) and e.dtype is lr.float64 and e.numpy().sum() == 0
    assert tuple(lr.empty((4,)).shape) == (4,) and lr.empty(1).dtype is lr.float32
    x = lr.ones(2, 5, dtype=lr.float64)
    assert tuple(lr.empty_like(x).shape) == (2, 5) and lr.empty_like(x, dtype=lr.int32).dtype is lr.int32
    for fn in (lr.rand_like, lr.randn_like):
        r = fn(x)
        assert tuple(r.shape) == (2, 5) and r.dtype is lr.float64
        assert fn(x, dtype=lr.float32).dtype is lr.float32
        with pytest.raises(lr.Error):
            fn(lr.ones(2, dtype=lr.int64))
    u = lr.rand_like(lr.zeros(1000)).numpy()
    assert u.min() >= 0 and u.max() < 1
    for start, end, steps in [(0, 1, 5), (-2.5, 7, 11), (3, -3, 4), (1, 1, 1), (0, 1, 0), (0.1, 0.9, 7)]:
        assert_same(lr.linspace(start, end, steps), torch.linspace(start, end, steps), what=f"{start} {end} {steps}")
        assert_same(lr.linspace(start, end, steps, dtype=lr.float64),
                    torch.linspace(start, end, steps, dtype=torch.float64))
    assert_same(lr.linspace(0, 10, 4, dtype=lr.int64), torch.linspace(0, 10, 4, dtype=torch.int64))
    assert_same(lr.linspace(-7, 5, 5, dtype=lr.int64), torch.linspace(-7, 5, 5, dtype=torch.int64))
    with pytest.raises(lr.Error, match="eye"):
        lr.eye(2, device="cuda")


def test_shape_helpers(rng):
    x, t = pair(rng, (3, 1), lr.float32)
    y, u = pair(rng, (1, 4), lr.float64)
    z, v = pair(rng, (4,), lr.int64)
    out, tout = lr.broadcast_tensors(x, y, z), torch.broadcast_tensors(t, u, v)
    assert isinstance(out, tuple) and len(out) == 3
    for o, to in zip(out, tout):
        assert_same(o, to)
    with pytest.raises(lr.Error, match="broadcast_tensors"):
        lr.broadcast_tensors(lr.zeros(3), lr.zeros(4))
    assert_same(lr.select(y, 1, -1), torch.select(u, 1, -1))
    for p, tp in zip(lr.unbind(y, 1), torch.unbind(u, 1)):
        assert_same(p, tp)
    assert_same(lr.clip(y, -0.5, 0.5), torch.clip(u, -0.5, 0.5))
    assert lr.numel(y) == torch.numel(u) == 4
    assert lr.is_tensor(y) and not lr.is_tensor(u) and not lr.is_tensor([1.0])
    with pytest.raises(TypeError, match="numel"):
        lr.numel([1, 2])
