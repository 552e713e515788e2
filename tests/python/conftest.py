"""Shared helpers of the Python tests: the same random data as lazyrt and PyTorch tensors, and
comparisons of results (values, shapes and dtypes).

The tests import lazyrt from PYTHONPATH (ctest points it at build/python); run by hand from
the repository root, they fall back to build/python.
"""

import os
import sys
import zlib

try:
    import lazyrt  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))

import numpy as np
import pytest
import torch

import lazyrt as lr

TORCH_DTYPE = {
    lr.float32: torch.float32, lr.float64: torch.float64, lr.float16: torch.float16,
    lr.bfloat16: torch.bfloat16, lr.int32: torch.int32, lr.int64: torch.int64, lr.bool: torch.bool,
}
NUMPY_DTYPE = {
    lr.float32: np.float32, lr.float64: np.float64, lr.float16: np.float16,
    lr.int32: np.int32, lr.int64: np.int64, lr.bool: np.bool_,
}
TOLERANCE = {  # rtol, atol
    lr.float32: (2e-6, 1e-6), lr.float64: (1e-12, 1e-12), lr.float16: (1e-3, 1e-3),
    lr.bfloat16: (1e-2, 1e-2), lr.int32: (0, 0), lr.int64: (0, 0), lr.bool: (0, 0),
}
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def random_array(rng, shape, dtype, low=-3.0, high=3.0):
    """Random values of a lazyrt dtype, as a NumPy array (bfloat16 as float32 values that
    bfloat16 holds exactly)."""
    if dtype is lr.bool:
        return rng.random(shape) < 0.5
    if dtype in (lr.int32, lr.int64):
        return rng.integers(int(low), int(high) + 1, size=shape).astype(NUMPY_DTYPE[dtype])
    a = rng.uniform(low, high, size=shape)
    if dtype is lr.bfloat16:
        return torch.from_numpy(a).to(torch.bfloat16).float().numpy()
    return a.astype(NUMPY_DTYPE[dtype])


def pair(rng, shape, dtype, low=-3.0, high=3.0, requires_grad=False):
    """The same random values as a lazyrt tensor and a PyTorch tensor."""
    a = random_array(rng, shape, dtype, low, high)
    t = torch.from_numpy(np.array(a)).to(TORCH_DTYPE[dtype])
    x = lr.tensor(a, dtype=dtype)
    if requires_grad:
        t.requires_grad_()
        x.requires_grad_()
    return x, t


def as_numpy(x):
    if x.dtype is lr.bfloat16:
        return x.to(lr.float32).numpy()
    return x.numpy()


def assert_same(x, t, rtol=None, atol=None, what=""):
    """lazyrt tensor x equals torch tensor t: dtype, shape and values (NaNs equal)."""
    assert isinstance(x, lr.Tensor), f"{what}: not a lazyrt tensor: {type(x)}"
    assert TORCH_DTYPE[x.dtype] == t.dtype, f"{what}: dtype {x.dtype} vs torch {t.dtype}"
    assert tuple(x.shape) == tuple(t.shape), f"{what}: shape {x.shape} vs torch {tuple(t.shape)}"
    d_rtol, d_atol = TOLERANCE[x.dtype]
    expect = t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()
    np.testing.assert_allclose(as_numpy(x), expect, rtol=d_rtol if rtol is None else rtol,
                               atol=d_atol if atol is None else atol, equal_nan=True, err_msg=what)


def randomize(tmodule, rng):
    """Random values in every parameter of a torch module (uniform in [-0.5, 0.5))."""
    with torch.no_grad():
        for p in tmodule.parameters():
            p.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, size=tuple(p.shape)).astype(np.float32)))
    return tmodule


@pytest.fixture
def rng(request):
    # A seed per test, the same on every run.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _allclose(a, b, what, rtol, atol):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol, err_msg=what)


def close_to_scale(a, b, what, rtol, atol):
    """a and b (arrays or tensors) agree within rtol of each element, plus atol, plus rtol times
    b's largest magnitude: an element that is small because its terms cancel carries the
    rounding of those larger terms (a gradient summed over a batch, a momentum buffer summing
    gradients), which another order of summation changes."""
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    scale = float(np.max(np.abs(b))) if b.size and np.isfinite(b).all() else 0.0
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol + rtol * scale, err_msg=what)


def same_tree(a, b, what, rtol=1e-5, atol=1e-6, close=_allclose):
    """Two nested structures (state dicts, results) agree: tensors by close(a, b, what, rtol,
    atol) (dtype and shape exactly; to tolerance by default), everything else exactly."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), f"{what}: {type(a)} vs {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        close(a, b, what, rtol, atol)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{what}: keys {list(a)} vs {list(b)}"
        for k in a:
            same_tree(a[k], b[k], f"{what}[{k!r}]", rtol, atol, close)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{what}: {a!r} vs {b!r}"
        for k, (x, y) in enumerate(zip(a, b)):
            same_tree(x, y, f"{what}[{k}]", rtol, atol, close)
    else:
        assert a == b, f"{what}: {a!r} vs {b!r}"


def lowered_results(fn, inputs):
    """fn(inputs) (a list of torch tensors in, a list out) captured as lazyrt.torch captures a
    step (fake tensors, functionalized), lowered and run by lazyrt: the results as torch tensors."""
    from torch.func import functionalize

    from lazyrt.torch._capture import _fake_trace
    from lazyrt.torch._lower import LoweredGraph

    gm = _fake_trace(functionalize(_fake_trace(fn, inputs)), inputs)
    lowered = LoweredGraph(gm, list(next(n for n in gm.graph.nodes if n.op == "output").args[0]))
    got = lowered(*[lr.from_torch(t) for t in inputs], *[lr.from_torch(t) for t in lowered.constants])
    return [lr.to_torch(g) for g in got]


# ---- the accuracy rule: as accurate as eager, against a float64 run -------------------------

ACCURACY_FACTOR, ACCURACY_ROUNDING = 2.0, 1e-7
# Per tensor, a guard against gross errors (a layer's gradient 1% off) that leaves room for one
# small tensor's luck: within 10x eager's relative distance plus 1e-5.
ACCURACY_TENSOR_FACTOR, ACCURACY_TENSOR_FLOOR = 10.0, 1e-5
# A tensor eager float32 gets less than 3 digits of is rounding noise (a value zero in exact
# arithmetic: a bias right before a normalization, its Adam moments).
ACCURACY_NOISE = 1e-3


def accuracy_against_float64(tested, eager, ref, what="", floors=(ACCURACY_ROUNDING, ACCURACY_TENSOR_FLOOR)):
    """None, or a text naming how `tested` (float32 tensors by name) is less accurate than
    `eager` (the same names, float32 PyTorch eager) against `ref` (float64): the rms over
    tensors of the relative distance (2-norm of the difference over the reference's) must be at
    most 2x eager's plus 1e-7; each tensor's within 10x eager's plus 1e-5; a tensor eager has
    fewer than 3 digits of (rounding noise), within 10x eager's distance. Returns the text and
    prints nothing; (rms tested, rms eager) of the kept tensors is in the returned text. `floors`:
    the rms and per-tensor floors (float32's by default)."""
    rel_t, rel_e, dist_t, dist_e = {}, {}, {}, {}
    for n, r in ref.items():
        r = r.double()
        norm = max(r.norm().item(), 1e-300)
        dist_t[n] = (tested[n].double() - r).norm().item()
        dist_e[n] = (eager[n].double() - r).norm().item()
        rel_t[n], rel_e[n] = dist_t[n] / norm, dist_e[n] / norm
    kept = []
    for n in ref:
        if rel_e[n] >= ACCURACY_NOISE:
            if dist_t[n] > ACCURACY_TENSOR_FACTOR * dist_e[n]:
                return f"{what}{n} (rounding noise in eager): {dist_t[n]:.3g} from float64, eager {dist_e[n]:.3g}"
            continue
        kept.append(n)
        if rel_t[n] > ACCURACY_TENSOR_FACTOR * rel_e[n] + floors[1]:
            return f"{what}{n}: {rel_t[n]:.3g} (relative) from float64, eager {rel_e[n]:.3g}"
    if kept:
        rms_t = (sum(rel_t[n] ** 2 for n in kept) / len(kept)) ** 0.5
        rms_e = (sum(rel_e[n] ** 2 for n in kept) / len(kept)) ** 0.5
        if rms_t > ACCURACY_FACTOR * rms_e + floors[0]:
            return (f"{what}rms relative distance to float64 over {len(kept)} tensors: {rms_t:.3g}, eager "
                    f"{rms_e:.3g}")
    return None
