"""The torch.nn surface that plain PyTorch model code uses, against PyTorch: nn.init (fans and
gains exactly, distributions statistically), the containers ModuleDict / ParameterList /
ParameterDict (names as PyTorch gives them), activation and dropout modules, buffers,
copy.deepcopy and pickle of tensors and modules, devices and Tensor.to / new_*, Module.to and
module traversal."""

import copy
import math
import pickle
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn
from conftest import TORCH_DTYPE, assert_same, pair, random_array


def raises_like(torch_call, lazyrt_call):
    """Both calls raise, with the same exception type (lazyrt.Error where PyTorch raises a
    plain RuntimeError); returns lazyrt's exception."""
    with pytest.raises(Exception) as expected:
        torch_call()
    kind = expected.type
    with pytest.raises(kind) as got:
        lazyrt_call()
    return got.value


def lazy_params_from(torch_module, lazy_module):
    """Copies a PyTorch module's state into the lazyrt module of the same structure."""
    lazy_module.load_state_dict(torch_module.state_dict())


# ---- nn.init -------------------------------------------------------------------------------

FAN_SHAPES = [(7, 3), (16, 8, 5), (32, 4, 3, 3), (6, 5, 2, 3, 4), (1, 9), (4, 1, 1, 1)]


@pytest.mark.parametrize("shape", FAN_SHAPES, ids=str)
def test_fans_equal_pytorch(shape):
    got = nn.init._calculate_fan_in_and_fan_out(lr.zeros(*shape))
    assert got == torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(*shape))
    for mode in ("fan_in", "fan_out", "FAN_IN"):
        assert nn.init._calculate_correct_fan(lr.zeros(*shape), mode) == \
            torch.nn.init._calculate_correct_fan(torch.zeros(*shape), mode)


def test_fan_errors_as_pytorch():
    raises_like(lambda: torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(5)),
                lambda: nn.init._calculate_fan_in_and_fan_out(lr.zeros(5)))
    raises_like(lambda: torch.nn.init.xavier_uniform_(torch.zeros(5)), lambda: nn.init.xavier_uniform_(lr.zeros(5)))
    raises_like(lambda: torch.nn.init.kaiming_normal_(torch.zeros(3, 3), mode="fan_avg"),
                lambda: nn.init.kaiming_normal_(lr.zeros(3, 3), mode="fan_avg"))


@pytest.mark.parametrize("args", [("linear",), ("conv2d",), ("sigmoid",), ("tanh",), ("relu",), ("leaky_relu",),
                                  ("leaky_relu", 0.2), ("leaky_relu", 3), ("leaky_relu", math.sqrt(5)), ("selu",)],
                         ids=str)
def test_calculate_gain_equals_pytorch(args):
    assert nn.init.calculate_gain(*args) == torch.nn.init.calculate_gain(*args)


def test_calculate_gain_errors_as_pytorch():
    raises_like(lambda: torch.nn.init.calculate_gain("swish"), lambda: nn.init.calculate_gain("swish"))
    raises_like(lambda: torch.nn.init.calculate_gain("leaky_relu", True),
                lambda: nn.init.calculate_gain("leaky_relu", True))


SHAPE = (128, 64, 4, 4)  # 131072 values: fan_in 1024, fan_out 2048


def stats(values):
    v = np.asarray(values, dtype=np.float64).ravel()
    return v.mean(), v.std(), v.min(), v.max()


def check_same_distribution(lazy, ref, what):
    """Sample mean and std of lazyrt's values agree with PyTorch's sample of the same init."""
    lm, ls, _, _ = stats(lazy.numpy())
    tm, ts, _, _ = stats(ref.detach().numpy())
    n = lazy.numel()
    # Both means have standard error ts / sqrt(n); the sample std's relative error is ~1/sqrt(2n).
    assert abs(lm - tm) < 8 * ts * math.sqrt(2.0 / n) + 1e-12, f"{what}: mean {lm} vs PyTorch {tm}"
    assert abs(ls / ts - 1) < 0.02, f"{what}: std {ls} vs PyTorch {ts}"


INITS = [
    ("uniform_", dict(a=-0.5, b=2.0)),
    ("normal_", dict(mean=0.3, std=0.7)),
    ("xavier_uniform_", dict(gain=2.0)),
    ("xavier_normal_", dict()),
    ("kaiming_uniform_", dict(a=math.sqrt(5))),
    ("kaiming_uniform_", dict(mode="fan_out", nonlinearity="relu")),
    ("kaiming_normal_", dict()),
    ("kaiming_normal_", dict(a=0.1, mode="fan_out", nonlinearity="leaky_relu")),
    ("kaiming_normal_", dict(nonlinearity="tanh")),
    ("trunc_normal_", dict()),
    ("trunc_normal_", dict(mean=0.0, std=0.02, a=-0.04, b=0.04)),
    ("trunc_normal_", dict(mean=1.0, std=2.0, a=0.0, b=3.0)),
]


@pytest.mark.parametrize("name,kwargs", INITS, ids=lambda v: v if isinstance(v, str) else str(v))
def test_random_init_distribution_and_identity(name, kwargs):
    lr.manual_seed(1)
    torch.manual_seed(1)
    p = nn.Parameter(lr.zeros(*SHAPE))
    before = lr.tensor_id(p)
    out = getattr(nn.init, name)(p, **kwargs)
    assert out is p and lr.tensor_id(p) == before
    assert isinstance(p, nn.Parameter) and p.is_leaf and p.requires_grad
    assert p.dtype is lr.float32 and tuple(p.shape) == SHAPE
    ref = getattr(torch.nn.init, name)(torch.zeros(*SHAPE), **kwargs)
    check_same_distribution(p, ref, name)
    _, _, lo, hi = stats(p.numpy())
    if name.endswith("uniform_"):
        # The bound from PyTorch's own gain and fan.
        if name == "uniform_":
            a, b = kwargs["a"], kwargs["b"]
        else:
            if name == "xavier_uniform_":
                fi, fo = torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(*SHAPE))
                bound = kwargs["gain"] * math.sqrt(6.0 / (fi + fo))
            else:
                fan = torch.nn.init._calculate_correct_fan(torch.zeros(*SHAPE), kwargs.get("mode", "fan_in"))
                gain = torch.nn.init.calculate_gain(kwargs.get("nonlinearity", "leaky_relu"), kwargs.get("a", 0))
                bound = gain * math.sqrt(3.0 / fan)
            a, b = -bound, bound
        assert a <= lo and hi <= b, f"{name}: values in [{lo}, {hi}], expected within [{a}, {b}]"
        # The whole interval is used.
        assert lo < a + 0.01 * (b - a) and hi > b - 0.01 * (b - a)
    if name == "trunc_normal_":
        a, b = kwargs.get("a", -2.0), kwargs.get("b", 2.0)
        assert a <= lo and hi <= b, f"trunc_normal_: values in [{lo}, {hi}], outside [{a}, {b}]"
        ref_lo, ref_hi = ref.min().item(), ref.max().item()
        assert abs(lo - ref_lo) < 0.01 * (b - a) and abs(hi - ref_hi) < 0.01 * (b - a)


@pytest.mark.parametrize("dtype", [lr.float64, lr.float16, lr.bfloat16], ids=str)
def test_random_init_keeps_the_dtype(dtype):
    lr.manual_seed(2)
    torch.manual_seed(2)
    x = lr.zeros(256, 256, dtype=dtype)
    assert nn.init.normal_(x, 0.0, 3.0) is x and x.dtype is dtype
    ref = torch.nn.init.normal_(torch.zeros(256, 256, dtype=TORCH_DTYPE[dtype]), 0.0, 3.0)
    check_same_distribution(x.to(lr.float32), ref.float(), str(dtype))
    y = lr.zeros(256, 256, dtype=dtype)
    nn.init.trunc_normal_(y, std=1.0, a=-0.5, b=1.5)
    _, _, lo, hi = stats(y.to(lr.float32).numpy())
    assert -0.5 <= lo and hi <= 1.5


def test_trunc_normal_never_leaves_the_interval_on_extreme_settings():
    lr.manual_seed(3)
    cases = [(0.0, 1.0, -1e-3, 1e-3), (0.0, 1.0, 3.5, 6.0), (0.0, 1.0, -6.0, -3.0), (5.0, 0.1, 4.99, 5.0),
             (0.0, 1.0, -100.0, 100.0)]
    for mean, std, a, b in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # both warn when the mean is far from [a, b]
            x = nn.init.trunc_normal_(lr.zeros(64, 1024), mean, std, a, b)
            ref = torch.nn.init.trunc_normal_(torch.zeros(64, 1024), mean, std, a, b)
        v = x.numpy()
        assert np.isfinite(v).all() and v.min() >= a and v.max() <= b, (mean, std, a, b, v.min(), v.max())
        assert abs(v.mean() - ref.mean().item()) < 0.05 * (b - a) + 0.02 * std, (mean, std, a, b)


def test_deterministic_inits_equal_pytorch(rng):
    for shape, dtype in [((3, 5), lr.float32), ((4, 2, 3), lr.float64), ((6,), lr.int64)]:
        x, t = pair(rng, shape, dtype)
        assert nn.init.constant_(x, 3) is x
        assert_same(x, torch.nn.init.constant_(t, 3))
        assert nn.init.zeros_(x) is x
        assert_same(x, torch.nn.init.zeros_(t))
        assert nn.init.ones_(x) is x
        assert_same(x, torch.nn.init.ones_(t))
    for shape in [(4, 4), (3, 5), (5, 2)]:
        x, t = pair(rng, shape, lr.float32)
        assert nn.init.eye_(x) is x
        assert_same(x, torch.nn.init.eye_(t))
    raises_like(lambda: torch.nn.init.eye_(torch.zeros(2, 2, 2)), lambda: nn.init.eye_(lr.zeros(2, 2, 2)))


def test_init_of_a_layer_keeps_it_trainable(rng):
    layer = nn.Linear(6, 4)
    params = list(layer.parameters())
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5))
    nn.init.zeros_(layer.bias)
    assert list(layer.parameters()) == params and [n for n, _ in layer.named_parameters()] == ["weight", "bias"]
    ref = torch.nn.Linear(6, 4)
    with torch.no_grad():
        ref.weight.copy_(lr.to_torch(layer.weight))
        ref.bias.copy_(lr.to_torch(layer.bias))
    x, t = pair(rng, (3, 6), lr.float32)
    layer(x).pow(2).sum().backward()
    ref(t).pow(2).sum().backward()
    assert_same(layer.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)
    assert_same(layer.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-5)


def test_init_errors():
    with pytest.raises(lr.Error, match="normal_"):
        nn.init.normal_(lr.zeros(3, dtype=lr.int64))
    raises_like(lambda: torch.nn.init.normal_(torch.zeros(3), std=-1.0), lambda: nn.init.normal_(lr.zeros(3), std=-1.0))
    with pytest.raises(TypeError, match="uniform_"):
        nn.init.uniform_(np.zeros(3))
    with pytest.warns(UserWarning):
        torch.nn.init.kaiming_uniform_(torch.zeros(0, 3))
    with pytest.warns(UserWarning, match="zero-element"):
        nn.init.kaiming_uniform_(lr.zeros(0, 3))


# ---- containers ----------------------------------------------------------------------------

def build(lib, *, dict_order):
    """The same structure from torch.nn or lazyrt.nn (whose tensors come from `lib`)."""
    tensor = torch.ones if lib is torch.nn else lr.ones

    class Model(lib.Module):
        def __init__(self):
            super().__init__()
            self.heads = lib.ModuleDict(dict_order([("proj", lib.Linear(3, 4)),
                                                    ("act", lib.ReLU()),
                                                    ("out", lib.Sequential(lib.Linear(4, 2), lib.Tanh()))]))
            self.scales = lib.ParameterList([tensor(2), lib.Parameter(tensor(3, 1))])
            self.extra = lib.ParameterDict(dict_order([("zeta", tensor(1)), ("alpha", tensor(2, 2))]))
            self.register_buffer("steps", tensor(1))

        def forward(self, x):
            h = self.heads["act"](self.heads["proj"](x))
            return self.heads["out"](h) * self.scales[0].sum() + self.extra["zeta"]

    return Model()


@pytest.mark.parametrize("dict_order", [dict, OrderedDict, list], ids=["dict", "OrderedDict", "pairs"])
def test_container_names_match_pytorch(dict_order, rng):
    ref = build(torch.nn, dict_order=dict_order)
    model = build(nn, dict_order=dict_order)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(model.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in model.named_modules()] == [n for n, _ in ref.named_modules()]
    assert [n for n, _ in model.named_buffers()] == [n for n, _ in ref.named_buffers()]
    assert [tuple(p.shape) for p in model.parameters()] == [tuple(p.shape) for p in ref.parameters()]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    lazy_params_from(ref, model)
    x, t = pair(rng, (5, 3), lr.float32)
    assert_same(model(x), ref(t), rtol=1e-5, atol=1e-6)


def test_module_dict_methods_as_pytorch():
    ref = torch.nn.ModuleDict({"b": torch.nn.ReLU(), "a": torch.nn.Tanh()})
    md = nn.ModuleDict({"b": nn.ReLU(), "a": nn.Tanh()})
    assert list(md.keys()) == list(ref.keys()) and len(md) == len(ref) and list(md) == list(ref)
    assert [type(m).__name__ for m in md.values()] == [type(m).__name__ for m in ref.values()]
    assert [k for k, _ in md.items()] == [k for k, _ in ref.items()]
    assert ("a" in md) == ("a" in ref) and ("z" in md) == ("z" in ref)
    for d in (md, ref):
        d.update([("c", (nn if d is md else torch.nn).Sigmoid())])
        d["b"] = (nn if d is md else torch.nn).Identity()
        d.pop("a")
    assert list(md.keys()) == list(ref.keys())
    assert type(md["b"]).__name__ == type(ref["b"]).__name__
    del md["c"], ref["c"]
    assert list(md) == list(ref)
    md.clear()
    ref.clear()
    assert len(md) == len(ref) == 0
    raises_like(lambda: torch.nn.ModuleDict({"a.b": torch.nn.ReLU()}), lambda: nn.ModuleDict({"a.b": nn.ReLU()}))
    raises_like(lambda: torch.nn.ModuleDict({"keys": torch.nn.ReLU()}), lambda: nn.ModuleDict({"keys": nn.ReLU()}))
    raises_like(lambda: torch.nn.ModuleDict().update(3), lambda: nn.ModuleDict().update(3))
    raises_like(lambda: torch.nn.ModuleDict().update([("a", torch.nn.ReLU(), 1)]),
                lambda: nn.ModuleDict().update([("a", nn.ReLU(), 1)]))
    raises_like(lambda: torch.nn.ModuleDict({"a": 3}), lambda: nn.ModuleDict({"a": 3}))
    raises_like(lambda: torch.nn.ModuleDict()["missing"], lambda: nn.ModuleDict()["missing"])


def test_parameter_list_methods_as_pytorch(rng):
    arrays = [random_array(rng, (2, i + 1), lr.float32) for i in range(4)]
    ref = torch.nn.ParameterList([torch.from_numpy(arrays[0])])
    pl = nn.ParameterList([lr.tensor(arrays[0])])
    ref.append(torch.from_numpy(arrays[1]))
    pl.append(lr.tensor(arrays[1]))
    ref.extend([torch.from_numpy(a) for a in arrays[2:]])
    pl.extend([lr.tensor(a) for a in arrays[2:]])
    assert len(pl) == len(ref) == 4
    assert [n for n, _ in pl.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(pl.state_dict()) == list(ref.state_dict())
    for got, want in zip(pl, ref):
        assert isinstance(got, nn.Parameter) and got.requires_grad and got.is_leaf
        assert_same(got, want)
    assert_same(pl[-1], ref[-1])
    assert_same(pl[1], ref[1])
    sub, ref_sub = pl[1:4:2], ref[1:4:2]
    assert type(sub) is nn.ParameterList and len(sub) == len(ref_sub)
    assert sub[0] is pl[1] and sub[1] is pl[3]
    pl[0] = lr.zeros(3)
    ref[0] = torch.zeros(3)
    assert isinstance(pl[0], nn.Parameter)
    assert_same(pl[0], ref[0])
    pl += [lr.ones(1)]
    ref += [torch.ones(1)]
    assert [n for n, _ in pl.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert not [k for k in dir(pl) if k.isdigit()]
    raises_like(lambda: ref[7], lambda: pl[7])
    raises_like(lambda: ref[-8], lambda: pl[-8])
    raises_like(lambda: ref.extend(torch.ones(2)), lambda: pl.extend(lr.ones(2)))
    raises_like(lambda: ref(), lambda: pl())


def test_parameter_dict_methods_as_pytorch():
    def make(lib, tensor):
        d = lib.ParameterDict({"w": tensor(2), "b": tensor(3)})  # a plain dict: keys sorted, as PyTorch
        d.update(OrderedDict([("z", tensor(1)), ("c", tensor(4))]))
        d["m"] = tensor(2, 2)
        return d

    ref, pd = make(torch.nn, torch.ones), make(nn, lr.ones)
    assert list(pd.keys()) == list(ref.keys()) and list(pd) == list(ref) and len(pd) == len(ref)
    assert [n for n, _ in pd.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(pd.state_dict()) == list(ref.state_dict())
    assert list(reversed(pd)) == list(reversed(ref))
    assert [tuple(v.shape) for v in pd.values()] == [tuple(v.shape) for v in ref.values()]
    assert [k for k, _ in pd.items()] == [k for k, _ in ref.items()]
    assert ("c" in pd) == ("c" in ref) and ("q" in pd) == ("q" in ref)
    assert pd.get("q") is None and ref.get("q") is None
    assert tuple(pd.get("c").shape) == tuple(ref.get("c").shape)
    k, v = pd.popitem()
    rk, rv = ref.popitem()
    assert k == rk and tuple(v.shape) == tuple(rv.shape)
    assert tuple(pd.pop("b").shape) == tuple(ref.pop("b").shape)
    assert tuple(pd.setdefault("s", lr.zeros(5)).shape) == tuple(ref.setdefault("s", torch.zeros(5)).shape)
    assert list(pd.keys()) == list(ref.keys())
    c = pd.copy()
    assert list(c.keys()) == list(ref.copy().keys()) and all(c[k] is pd[k] for k in pd)
    merged, ref_merged = pd | nn.ParameterDict({"a": lr.ones(1)}), ref | torch.nn.ParameterDict({"a": torch.ones(1)})
    assert list(merged.keys()) == list(ref_merged.keys())
    fk, ref_fk = pd.fromkeys(["x", "y"]), ref.fromkeys(["x", "y"])
    assert list(fk.keys()) == list(ref_fk.keys()) and fk["x"] is None and list(fk.parameters()) == []
    del pd["s"], ref["s"]
    assert list(pd) == list(ref)
    pd.clear()
    ref.clear()
    assert len(pd) == len(ref) == 0 and list(pd.parameters()) == []
    raises_like(lambda: torch.nn.ParameterDict({1: torch.ones(1)}), lambda: nn.ParameterDict({1: lr.ones(1)}))
    raises_like(lambda: torch.nn.ParameterDict()["missing"], lambda: nn.ParameterDict()["missing"])
    raises_like(lambda: torch.nn.ParameterDict({"keys": torch.ones(1)}), lambda: nn.ParameterDict({"keys": lr.ones(1)}))
    raises_like(lambda: torch.nn.ParameterDict()(1), lambda: nn.ParameterDict()(1))


# ---- activation and dropout modules ---------------------------------------------------------

ACTIVATIONS = [
    ("Softmax", dict(dim=1)), ("Softmax", dict(dim=-1)), ("SiLU", {}), ("Mish", {}), ("Tanh", {}),
    ("ReLU", {}), ("ReLU", dict(inplace=True)), ("LeakyReLU", {}), ("LeakyReLU", dict(negative_slope=0.2)),
    ("GELU", {}), ("GELU", dict(approximate="tanh")), ("Softplus", {}), ("Softplus", dict(beta=2, threshold=5)),
    ("Sigmoid", {}), ("SiLU", dict(inplace=True)), ("Mish", dict(inplace=True)),
]


@pytest.mark.parametrize("name,kwargs", ACTIVATIONS, ids=lambda v: v if isinstance(v, str) else str(v))
def test_activation_modules_equal_pytorch(name, kwargs, rng):
    m, ref = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    assert repr(m) == repr(ref)
    x, t = pair(rng, (4, 6), lr.float32, low=-25, high=25, requires_grad=True)
    y = m(x)
    # PyTorch's in-place forms need a non-leaf input.
    ref_y = ref(t * 1)
    assert_same(y, ref_y, rtol=1e-5, atol=1e-6, what=name)
    g, tg = pair(rng, (4, 6), lr.float32)
    y.backward(g)
    ref_y.backward(tg)
    assert_same(x.grad, t.grad, rtol=1e-4, atol=1e-5, what=name + " grad")


def test_functional_mish_and_softmax_implicit_dim(rng):
    x, t = pair(rng, (3, 4, 5), lr.float32)
    assert_same(nn.functional.mish(x), torch.nn.functional.mish(t), rtol=1e-5, atol=1e-6)
    for shape in [(5,), (3, 4), (3, 4, 5), (2, 3, 4, 5)]:
        x, t = pair(rng, shape, lr.float32)
        with pytest.warns(UserWarning):
            ref = torch.nn.Softmax()(t)
        with pytest.warns(UserWarning, match="Implicit dimension"):
            got = nn.Softmax()(x)
        assert_same(got, ref, rtol=1e-5, atol=1e-6, what=str(shape))


@pytest.mark.parametrize("shape", [(16, 32, 3, 4), (16, 32, 7)], ids=str)
def test_dropout2d_zeroes_whole_channels_as_pytorch(shape, rng):
    p = 0.3
    lr.manual_seed(4)
    torch.manual_seed(4)
    a = random_array(rng, shape, lr.float32, low=1.0, high=2.0)  # no zeros of its own
    x, t = lr.tensor(a), torch.from_numpy(a)
    m, ref = nn.Dropout2d(p), torch.nn.Dropout2d(p)
    assert repr(m) == repr(ref)
    with warnings.catch_warnings(record=True) as ref_warned:
        warnings.simplefilter("always")
        want = ref(t).numpy()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        got = m(x).numpy()
    assert bool(warned) == bool(ref_warned)  # PyTorch 1.13 warns on 3-D inputs, and so does lazyrt
    kept, ref_kept = got != 0, want != 0
    per_channel = kept.reshape(shape[0], shape[1], -1)
    # A channel (everything after dim 1, as PyTorch's feature dropout) is dropped or kept whole.
    assert (per_channel.all(axis=2) | ~per_channel.any(axis=2)).all()
    ref_channel = ref_kept.reshape(shape[0], shape[1], -1)
    assert (ref_channel.all(axis=2) | ~ref_channel.any(axis=2)).all()
    # Kept values are scaled as PyTorch scales them.
    np.testing.assert_allclose(got[kept], (t * (1 / (1 - p))).numpy()[kept], rtol=1e-6)
    n = shape[0] * shape[1]
    dropped, ref_dropped = 1 - per_channel[..., 0].mean(), 1 - ref_channel[..., 0].mean()
    assert abs(dropped - ref_dropped) < 6 * math.sqrt(2 * p * (1 - p) / n)
    # Eval mode, p = 0 and p = 1 as PyTorch.
    m.eval()
    ref.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(m(x), ref(t))
        assert_same(nn.Dropout2d(0.0)(x), torch.nn.Dropout2d(0.0)(t))
        assert_same(nn.Dropout2d(1.0)(x), torch.nn.Dropout2d(1.0)(t))


def test_dropout2d_errors_as_pytorch():
    raises_like(lambda: torch.nn.Dropout2d(1.5), lambda: nn.Dropout2d(1.5))
    raises_like(lambda: torch.nn.functional.dropout2d(torch.ones(2, 2), -0.1),
                lambda: nn.functional.dropout2d(lr.ones(2, 2), -0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raises_like(lambda: torch.nn.functional.dropout2d(torch.ones(3)), lambda: nn.functional.dropout2d(lr.ones(3)))


# ---- buffers and registration ---------------------------------------------------------------

def with_buffers(lib, tensor):
    m = lib.Module()
    m.register_buffer("mean", tensor(3))
    m.register_buffer("cache", tensor(2), persistent=False)
    m.register_buffer("empty", None)
    m.child = lib.Module()
    m.child.register_buffer("hidden", tensor(1), persistent=False)
    m.child.register_buffer("count", tensor(1))
    return m


def test_non_persistent_buffers_as_pytorch():
    ref, m = with_buffers(torch.nn, torch.zeros), with_buffers(nn, lr.zeros)
    assert list(m.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in ref.named_buffers()]
    assert len(list(m.buffers())) == len(list(ref.buffers()))
    # Registering again as persistent puts it in the state dict.
    m.register_buffer("cache", lr.ones(2))
    ref.register_buffer("cache", torch.ones(2))
    assert list(m.state_dict()) == list(ref.state_dict())
    # Assigning to a non-persistent buffer keeps it one.
    m.child.hidden = lr.ones(1)
    ref.child.hidden = torch.ones(1)
    assert list(m.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in ref.named_buffers()]


def test_registration_errors_as_pytorch():
    ref, m = with_buffers(torch.nn, torch.zeros), with_buffers(nn, lr.zeros)
    for call in (lambda mod, lib, t: mod.register_buffer("a.b", t(1)),
                 lambda mod, lib, t: mod.register_buffer("", t(1)),
                 lambda mod, lib, t: mod.register_buffer("training", t(1)),
                 lambda mod, lib, t: mod.register_buffer("child", t(1)),
                 lambda mod, lib, t: mod.register_buffer("x", 3),
                 lambda mod, lib, t: mod.register_parameter("mean", lib.Parameter(t(1))),
                 lambda mod, lib, t: mod.register_parameter("p.q", lib.Parameter(t(1))),
                 lambda mod, lib, t: mod.add_module("mean", lib.ReLU()),
                 lambda mod, lib, t: mod.add_module("", lib.ReLU()),
                 lambda mod, lib, t: mod.add_module(3, lib.ReLU())):
        raises_like(lambda: call(ref, torch.nn, torch.zeros), lambda: call(m, nn, lr.zeros))


# ---- copy.deepcopy and pickle -----------------------------------------------------------------

DTYPES = [lr.float32, lr.float64, lr.float16, lr.bfloat16, lr.int32, lr.int64, lr.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_tensor_copies_keep_values_and_dtype(dtype, how, rng):
    x, t = pair(rng, (3, 4), dtype)
    copied = pickle.loads(pickle.dumps(x)) if how == "pickle" else copy.deepcopy(x)
    assert type(copied) is lr.Tensor and copied is not x
    assert_same(copied, t)
    assert not copied.requires_grad
    # The copy is independent of the original.
    copied.zero_()
    assert_same(x, t)


def duplicate(v, how):
    return pickle.loads(pickle.dumps(v)) if how == "pickle" else copy.deepcopy(v)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_parameters_and_leaves_stay_what_they_are(how, rng):
    x, t = pair(rng, (2, 3), lr.float32, requires_grad=True)
    a = random_array(rng, (4,), lr.float32)
    cases = [(x, t), (nn.Parameter(x), torch.nn.Parameter(t.detach())),
             (nn.Parameter(lr.tensor(a), requires_grad=False), torch.nn.Parameter(torch.from_numpy(a), False))]
    for value, ref in cases:
        got, want = duplicate(value, how), duplicate(ref, how)
        assert isinstance(got, nn.Parameter) == isinstance(want, torch.nn.Parameter)
        assert got.requires_grad == want.requires_grad and got.is_leaf == want.is_leaf
        assert_same(got, want)


def test_deepcopy_keeps_gradients_and_refuses_non_leaves(rng):
    x, t = pair(rng, (3,), lr.float32, requires_grad=True)
    (x * x).sum().backward()
    (t * t).sum().backward()
    c, tc = copy.deepcopy(x), copy.deepcopy(t)
    assert_same(c.grad, tc.grad)
    # Gradients do not travel through pickle (neither in PyTorch).
    assert pickle.loads(pickle.dumps(x)).grad is None and pickle.loads(pickle.dumps(t)).grad is None
    err = raises_like(lambda: copy.deepcopy(t * 2), lambda: copy.deepcopy(x * 2))
    assert "deepcopy" in str(err)


def test_dtype_and_device_copies_are_themselves():
    for dt in DTYPES:
        assert pickle.loads(pickle.dumps(dt)) is dt and copy.deepcopy(dt) is dt
    d = lr.device("lazy", 0)
    assert pickle.loads(pickle.dumps(d)) == d and copy.deepcopy(d) == d


def tied_init(self, lib, ns):
    lib.Module.__init__(self)
    self.embed = lib.Linear(4, 3)
    self.body = lib.Sequential(lib.Linear(3, 3), lib.Tanh())
    self.head = lib.Linear(3, 3)
    self.head.weight = self.body[0].weight  # tied
    self.register_buffer("count", ns.zeros(1))
    self.register_buffer("scratch", ns.ones(2), persistent=False)
    self.shared = self.body  # the same module under two names


def tied_forward(self, x):
    return self.head(self.body(self.embed(x)))


# Module-level classes, so that pickle finds them.
class Tied(nn.Module):
    def __init__(self):
        tied_init(self, nn, lr)

    forward = tied_forward


class TorchTied(torch.nn.Module):
    def __init__(self):
        tied_init(self, torch.nn, torch)

    forward = tied_forward


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_module_copies_are_independent_and_train_alone(how, rng):
    lr.manual_seed(5)
    model, ref = Tied(), TorchTied()
    lazy_params_from(ref, model)
    original = {n: p.numpy().copy() for n, p in model.named_parameters()}
    clone = pickle.loads(pickle.dumps(model)) if how == "pickle" else copy.deepcopy(model)
    ref_clone = pickle.loads(pickle.dumps(ref)) if how == "pickle" else copy.deepcopy(ref)
    assert [n for n, _ in clone.named_parameters()] == [n for n, _ in ref_clone.named_parameters()]
    assert [n for n, _ in clone.named_buffers()] == [n for n, _ in ref_clone.named_buffers()]
    assert list(clone.state_dict()) == list(ref_clone.state_dict())
    assert [n for n, _ in clone.named_modules()] == [n for n, _ in ref_clone.named_modules()]
    assert (clone.shared is clone.body) == (ref_clone.shared is ref_clone.body)
    for (n, p), (_, tp) in zip(clone.named_parameters(), ref_clone.named_parameters()):
        assert isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf
        assert all(p is not q for q in model.parameters()), n
        assert_same(p, tp, what=n)
    # Training the copy leaves the original as it was.
    opt, ref_opt = lr.optim.SGD(clone.parameters(), lr=0.1), torch.optim.SGD(ref_clone.parameters(), lr=0.1)
    x, t = pair(rng, (5, 4), lr.float32)
    for _ in range(2):
        opt.zero_grad()
        ref_opt.zero_grad()
        clone(x).pow(2).mean().backward()
        ref_clone(t).pow(2).mean().backward()
        opt.step()
        ref_opt.step()
    for (n, p), (_, tp) in zip(clone.named_parameters(), ref_clone.named_parameters()):
        assert_same(p, tp, rtol=1e-5, atol=1e-6, what=n)
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(p.numpy(), original[n], err_msg=n)
        assert p.grad is None


# ---- devices, Tensor.to and new_* -------------------------------------------------------------

def test_device_reads_like_pytorch():
    x = lr.ones(2)
    assert repr(x.device) == repr(torch.device("lazy", 0))
    assert str(x.device) == str(torch.device("lazy", 0))
    assert x.device.type == "lazy" and x.device.index == 0 and not x.is_cuda
    for spec in ["lazy", "lazy:0", "cpu", "cuda:1"]:
        d, td = lr.device(spec), torch.device(spec)
        assert (repr(d), str(d), d.type, d.index) == (repr(td), str(td), td.type, td.index)
    assert (lr.device("lazy") == lr.device("lazy", 0)) == (torch.device("lazy") == torch.device("lazy", 0))
    assert (lr.device("lazy:0") == x.device) and hash(lr.device("lazy:0")) == hash(x.device)
    assert (lr.device("cpu") == "cpu") == (torch.device("cpu") == "cpu")
    raises_like(lambda: torch.device("lazy:x"), lambda: lr.device("lazy:x"))


@pytest.mark.parametrize("src", DTYPES, ids=str)
def test_to_dtype_forms_equal_pytorch(src, rng):
    x, t = pair(rng, (2, 5), src)
    for dst in DTYPES:
        td = TORCH_DTYPE[dst]
        assert_same(x.to(dst), t.to(td))
        assert_same(x.to(dtype=dst), t.to(dtype=td))
        assert_same(x.to("cpu", dst), t.to("cpu", td))
        assert_same(x.to(x.device, dst), t.to(t.device, td))
        assert_same(x.to(device="lazy", dtype=dst), t.to(device="cpu", dtype=td))
        assert_same(x.to(lr.zeros(1, dtype=dst)), t.to(torch.zeros(1, dtype=td)))
        assert_same(x.to(dst, copy=True), t.to(td, copy=True))
    # Nothing to change: the tensor itself, unless a copy is asked for.
    assert (x.to(src) is x) == (t.to(t.dtype) is t) is True
    assert (x.to(src, copy=True) is x) == (t.to(t.dtype, copy=True) is t) is False
    assert x.to("cpu") is x and x.to(x.device) is x and x.to(torch.device("cpu")) is x


def test_to_keeps_autograd(rng):
    x, t = pair(rng, (3,), lr.float32, requires_grad=True)
    y, ty = x.to(lr.float64), t.to(torch.float64)
    assert y.requires_grad and not y.is_leaf
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    assert_same(x.grad, t.grad)


def test_to_errors():
    x = lr.ones(2)
    with pytest.raises(lr.Error, match="cuda"):
        x.to("cuda")
    with pytest.raises(lr.Error, match="lazy:1"):
        x.to("lazy:1")
    raises_like(lambda: torch.ones(2).to([1]), lambda: x.to([1]))
    raises_like(lambda: torch.ones(2).to(object()), lambda: x.to(object()))
    raises_like(lambda: torch.ones(2).to("float32"), lambda: x.to("float32"))
    raises_like(lambda: torch.ones(2).to(torch.float32, bogus=True), lambda: x.to(lr.float32, bogus=True))


@pytest.mark.parametrize("dtype", [lr.float32, lr.float64, lr.int64, lr.bool], ids=str)
def test_new_factories_equal_pytorch(dtype, rng):
    x, t = pair(rng, (2, 2), dtype)
    assert_same(x.new_zeros(3, 4), t.new_zeros(3, 4))
    assert_same(x.new_zeros((3, 4)), t.new_zeros((3, 4)))
    assert_same(x.new_ones([2, 1, 3]), t.new_ones([2, 1, 3]))
    assert_same(x.new_ones(5, dtype=lr.float16), t.new_ones(5, dtype=torch.float16))
    assert_same(x.new_full((2, 3), 1), t.new_full((2, 3), 1))
    assert_same(x.new_full((2,), 0), t.new_full((2,), 0))
    assert_same(x.new_empty(0, 3), t.new_empty(0, 3))
    assert x.new_empty(2, 3).shape == (2, 3) and x.new_empty(2, 3).dtype is dtype
    data = [[1.5, -2.0], [0.0, 3.0]]
    assert_same(x.new_tensor(data), t.new_tensor(data))
    assert_same(x.new_tensor(data, dtype=lr.float64), t.new_tensor(data, dtype=torch.float64))
    assert_same(x.new_zeros(2, device=x.device), t.new_zeros(2, device=t.device))
    if dtype.is_floating_point:
        z, tz = x.new_zeros(2, requires_grad=True), t.new_zeros(2, requires_grad=True)
        assert z.requires_grad == tz.requires_grad and z.is_leaf == tz.is_leaf


# ---- Module.to and traversal --------------------------------------------------------------------

def int_buffer_init(self, lib, ns):
    lib.Module.__init__(self)
    self.a = lib.Linear(3, 4)
    self.b = lib.Linear(4, 2)
    self.register_buffer("steps", ns.zeros(1, dtype=ns.int64))  # integer: never cast
    self.register_buffer("scale", ns.ones(2))


def int_buffer_forward(self, x):
    return self.b(self.a(x)) * self.scale


class WithIntBuffer(nn.Module):
    def __init__(self):
        int_buffer_init(self, nn, lr)

    forward = int_buffer_forward


class TorchWithIntBuffer(torch.nn.Module):
    def __init__(self):
        int_buffer_init(self, torch.nn, torch)

    forward = int_buffer_forward


@pytest.mark.parametrize("form", ["to", "double", "to_tensor", "to_device_dtype"])
def test_module_to_dtype_as_pytorch(form, rng):
    model, ref = WithIntBuffer(), TorchWithIntBuffer()
    lazy_params_from(ref, model)
    calls = {"to": (lambda m, lib, ns: m.to(ns.float64)),
             "double": (lambda m, lib, ns: m.double()),
             "to_tensor": (lambda m, lib, ns: m.to(ns.zeros(1, dtype=ns.float64))),
             "to_device_dtype": (lambda m, lib, ns: m.to("cpu", ns.float64))}
    assert calls[form](model, nn, lr) is model
    assert calls[form](ref, torch.nn, torch) is ref
    assert [(n, TORCH_DTYPE[p.dtype]) for n, p in model.named_parameters()] == \
        [(n, p.dtype) for n, p in ref.named_parameters()]
    assert [(n, TORCH_DTYPE[b.dtype]) for n, b in model.named_buffers()] == \
        [(n, b.dtype) for n, b in ref.named_buffers()]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf for p in model.parameters())
    x, t = pair(rng, (5, 3), lr.float64)
    out, ref_out = model(x), ref(t)
    assert_same(out, ref_out, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    ref_out.sum().backward()
    for (n, p), (_, tp) in zip(model.named_parameters(), ref.named_parameters()):
        assert_same(p.grad, tp.grad, rtol=1e-12, atol=1e-12, what=n)


def test_module_to_casts_gradients_keeps_ties_and_refuses_integer_dtypes(rng):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].weight = model[0].weight
    ref = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    ref[1].weight = ref[0].weight
    x, t = pair(rng, (3, 2), lr.float32)
    model(x).sum().backward()
    ref(t).sum().backward()
    model.half()
    ref.half()
    assert len(list(model.parameters())) == len(list(ref.parameters()))
    assert model[1].weight is model[0].weight
    assert [TORCH_DTYPE[p.grad.dtype] for p in model.parameters()] == [p.grad.dtype for p in ref.parameters()]
    raises_like(lambda: ref.to(torch.int64), lambda: model.to(lr.int64))
    with pytest.raises(lr.Error, match="cuda"):
        model.to("cuda")
    assert model.to("cpu") is model and model.to(device="lazy") is model and model.to(lr.device("lazy", 0)) is model


def make_tree(lib):
    shared = lib.ReLU()
    inner = lib.Sequential(lib.Linear(2, 2), shared)
    return lib.Sequential(OrderedDict([("first", inner), ("act", shared),
                                       ("dict", lib.ModuleDict({"x": lib.Tanh(), "y": inner}))]))


def test_traversal_as_pytorch():
    tree, ref = make_tree(nn), make_tree(torch.nn)
    names = lambda it: [n for n, _ in it]  # noqa: E731
    kinds = lambda it: [type(m).__name__ for m in it]  # noqa: E731
    assert names(tree.named_modules()) == names(ref.named_modules())
    assert names(tree.named_modules(remove_duplicate=False)) == names(ref.named_modules(remove_duplicate=False))
    assert names(tree.named_modules(prefix="net")) == names(ref.named_modules(prefix="net"))
    assert kinds(tree.modules()) == kinds(ref.modules())
    assert names(tree.named_children()) == names(ref.named_children())
    assert kinds(tree.children()) == kinds(ref.children())
    assert names(tree.named_parameters()) == names(ref.named_parameters())
    visited, ref_visited = [], []
    assert tree.apply(lambda m: visited.append(type(m).__name__)) is tree
    ref.apply(lambda m: ref_visited.append(type(m).__name__))
    assert visited == ref_visited
    assert type(tree.get_submodule("dict.y.0")).__name__ == type(ref.get_submodule("dict.y.0")).__name__
    assert tree.get_submodule("") is tree
    raises_like(lambda: ref.get_submodule("first.9"), lambda: tree.get_submodule("first.9"))


def test_apply_initializes_like_pytorch_code():
    def init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.constant_(m.bias, 0.25)

    lr.manual_seed(6)
    tree = make_tree(nn)
    params = list(tree.parameters())
    tree.apply(init_weights)
    assert list(tree.parameters()) == params
    ref = make_tree(torch.nn)
    lin = tree.get_submodule("first.0")
    assert_same(lin.bias, torch.full((2,), 0.25))
    bound = math.sqrt(6.0 / sum(torch.nn.init._calculate_fan_in_and_fan_out(ref.get_submodule("first.0").weight)))
    w = lin.weight.numpy()
    assert (np.abs(w) <= bound).all()


def test_replacing_an_entry_keeps_its_place_as_pytorch():
    def make(lib, ns):
        m = lib.Module()
        m.first = lib.Linear(2, 2)
        m.w = lib.Parameter(ns.ones(2))
        m.register_buffer("buf", ns.zeros(1))
        m.last = lib.Linear(2, 2)
        m.v = lib.Parameter(ns.ones(1))
        m.first = lib.Linear(2, 3)           # a module replaced
        m.w = lib.Parameter(ns.zeros(3))     # a parameter replaced
        m.register_buffer("buf", ns.ones(2))  # a buffer registered again
        return m

    m, ref = make(nn, lr), make(torch.nn, torch)
    assert list(m.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in m.named_children()] == [n for n, _ in ref.named_children()]
