"""Every bound op against PyTorch on random inputs: values, shapes and dtypes, with
broadcasting shapes and PyTorch's type promotion (tensors, 0-dim tensors, Python numbers).
Where PyTorch refuses an input, lazyrt must refuse it too (with lazyrt.Error)."""

import itertools

import numpy as np
import pytest
import torch

import lazyrt as lr
from conftest import TORCH_DTYPE, assert_same, pair

FLOATS = [lr.float32, lr.float64]
INTS = [lr.int32, lr.int64]
NUMERIC = FLOATS + INTS
ALL = NUMERIC + [lr.bool]


def same_or_both_fail(f_lr, f_torch, what, rtol=None, atol=None):
    """Both compute the same tensor, or both raise."""
    try:
        expect = f_torch()
    except (RuntimeError, TypeError):
        with pytest.raises(RuntimeError):
            f_lr()
        return
    assert_same(f_lr(), expect, rtol=rtol, atol=atol, what=what)


# ---- unary ---------------------------------------------------------------------------------

UNARY = {  # name: (dtypes, value range)
    "neg": (NUMERIC, (-3, 3)), "negative": (NUMERIC, (-3, 3)), "abs": (NUMERIC, (-3, 3)),
    "exp": (ALL, (-3, 3)), "log": (FLOATS + INTS, (0.1, 5)), "sqrt": (FLOATS + INTS, (0.1, 5)),
    "rsqrt": (FLOATS, (0.1, 5)), "relu": (NUMERIC, (-3, 3)), "sigmoid": (ALL, (-4, 4)),
    "tanh": (ALL, (-3, 3)), "isnan": (ALL, (-3, 3)), "logical_not": (ALL, (-2, 2)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4)])
def test_unary(name, shape, rng):
    dtypes, (low, high) = UNARY[name]
    for dtype in dtypes:
        x, t = pair(rng, shape, dtype, low, high)
        same_or_both_fail(lambda: getattr(lr, name)(x), lambda: getattr(torch, name)(t), f"{name} {dtype}")
        same_or_both_fail(lambda: getattr(x, name)(), lambda: getattr(t, name)(), f"{name} method {dtype}")


def test_isnan_sees_nans():
    t = torch.tensor([1.0, float("nan"), float("inf")])
    assert_same(lr.isnan(lr.from_torch(t)), torch.isnan(t))


def test_refusals_match_torch():
    x, t = lr.tensor([True, False]), torch.tensor([True, False])
    for f in [lambda a: -a, lambda a: a - a]:
        with pytest.raises(RuntimeError):
            f(t)
        with pytest.raises(lr.Error):
            f(x)


# ---- binary, with broadcasting and type promotion -----------------------------------------

SHAPES = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((5,), ()), ((), (2, 3)), ((2, 1, 3), (4, 1)),
          ((), ())]
DTYPE_PAIRS = [(lr.float32, lr.float32), (lr.float32, lr.float64), (lr.int32, lr.int64), (lr.int64, lr.float32),
               (lr.bool, lr.int32), (lr.int32, lr.float32), (lr.float64, lr.int32), (lr.bool, lr.bool),
               (lr.int64, lr.int64), (lr.bool, lr.float64)]
BINARY = ["add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "maximum", "minimum",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_binary(name, shapes, rng):
    for da, db in DTYPE_PAIRS:
        x, t = pair(rng, shapes[0], da, -3, 3)
        # Divisors away from zero; integer division by zero is undefined.
        y, u = pair(rng, shapes[1], db, 1, 4)
        same_or_both_fail(lambda: getattr(lr, name)(x, y), lambda: getattr(torch, name)(t, u),
                          f"{name} {da} {db} {shapes}", rtol=1e-6)
        same_or_both_fail(lambda: getattr(x, name)(y), lambda: getattr(t, name)(u),
                          f"{name} method {da} {db}", rtol=1e-6)


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_pow(shapes, rng):
    for da, db in [(lr.float32, lr.float32), (lr.float64, lr.float32), (lr.int64, lr.int64), (lr.int32, lr.float32),
                   (lr.float32, lr.int64)]:
        x, t = pair(rng, shapes[0], da, 1, 3)
        y, u = pair(rng, shapes[1], db, 0, 3)
        same_or_both_fail(lambda: lr.pow(x, y), lambda: torch.pow(t, u), f"pow {da} {db}", rtol=1e-5)
        same_or_both_fail(lambda: x ** y, lambda: t ** u, f"** {da} {db}", rtol=1e-5)


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("number", [2, -1, 0.5, True, 2.0])
def test_binary_with_python_numbers(dtype, number, rng):
    x, t = pair(rng, (3, 4), dtype, 1, 4)
    for name in ["add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "pow"]:
        same_or_both_fail(lambda: getattr(lr, name)(x, number), lambda: getattr(torch, name)(t, number),
                          f"{name}({dtype}, {number!r})", rtol=1e-6)
    if dtype is not lr.bool:
        same_or_both_fail(lambda: lr.pow(number, x), lambda: torch.pow(number, t), f"pow({number!r}, {dtype})",
                          rtol=1e-5)


@pytest.mark.parametrize("alpha", [2, 0.5, -1])
def test_add_sub_alpha(alpha, rng):
    for da, db in [(lr.float32, lr.float32), (lr.int64, lr.int32), (lr.float64, lr.int64)]:
        x, t = pair(rng, (2, 3), da)
        y, u = pair(rng, (3,), db)
        same_or_both_fail(lambda: lr.add(x, y, alpha=alpha), lambda: torch.add(t, u, alpha=alpha), f"add {alpha}")
        same_or_both_fail(lambda: lr.sub(x, y, alpha=alpha), lambda: torch.sub(t, u, alpha=alpha), f"sub {alpha}")
        same_or_both_fail(lambda: x.add(3, alpha=alpha), lambda: t.add(3, alpha=alpha), f"add number {alpha}")


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), ()), ((4,), (3, 4), (3, 1))],
                         ids=str)
def test_where(shapes, rng):
    for da, db in [(lr.float32, lr.float32), (lr.int32, lr.float64), (lr.int64, lr.int32), (lr.bool, lr.bool)]:
        c, tc = pair(rng, shapes[0], lr.bool)
        x, t = pair(rng, shapes[1], da)
        y, u = pair(rng, shapes[2], db)
        assert_same(lr.where(c, x, y), torch.where(tc, t, u), what=f"where {da} {db}")
        assert_same(x.where(c, y), t.where(tc, u), what="where method")
    c, tc = pair(rng, (3, 4), lr.bool)
    x, t = pair(rng, (3, 4), lr.float32)
    assert_same(lr.where(c, x, 0.0), torch.where(tc, t, 0.0))
    assert_same(lr.where(c, 1.5, x), torch.where(tc, 1.5, t))


# ---- reductions ------------------------------------------------------------------------------

DIMS = [None, 0, 1, -1, (0, 2), (-1, 0), ()]


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("dim", DIMS, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(name, dim, keepdim, rng):
    for dtype in ALL:
        x, t = pair(rng, (2, 3, 4), dtype)
        kwargs = {"keepdim": keepdim}
        if dim is not None:
            kwargs["dim"] = dim
        elif name in ("amax", "amin"):
            kwargs["dim"] = ()
        torch_kwargs = dict(kwargs)
        if dim is None and name in ("sum", "mean"):
            # PyTorch takes keepdim only with dims.
            torch_kwargs = {"dim": (0, 1, 2), "keepdim": True} if keepdim else {}
        if name == "sum" and dim == ():
            continue  # PyTorch 1.13 reads an empty dim list of sum as "every dim" only sometimes
        same_or_both_fail(lambda: getattr(lr, name)(x, **kwargs), lambda: getattr(torch, name)(t, **torch_kwargs),
                          f"{name} {dtype} {kwargs}", rtol=1e-5)
        same_or_both_fail(lambda: getattr(x, name)(**kwargs), lambda: getattr(t, name)(**torch_kwargs),
                          f"{name} method {dtype} {kwargs}", rtol=1e-5)


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("shape,dim", [((7, 600), 0), ((3, 5, 600), (0, 1)), ((4, 9, 1, 300), 1),
                                       ((2, 70, 3, 130), (1, 3)), ((5, 1, 257), (0, 1)), ((3, 1000, 2), 1)],
                         ids=str)
def test_reductions_keeping_the_inner_dims(name, shape, dim, rng):
    """Kept dims after the reduced ones (row sums, bias gradients): outputs in chunks of up to 256
    neighbours accumulated row by row; sizes across chunk boundaries, kept dims before the
    reduced ones, and nans (amax and amin take them, as torch)."""
    for dtype in [lr.float32, lr.float64, lr.bfloat16, lr.int64, lr.bool]:
        if name == "mean" and dtype in (lr.int64, lr.bool):
            continue
        x, t = pair(rng, shape, dtype)
        if dtype in (lr.float32, lr.float64):
            a = np.array(t.numpy())
            a.reshape(-1)[rng.integers(0, a.size, size=5)] = np.nan
            t = torch.from_numpy(a)
            x = lr.tensor(a, dtype=dtype)
        want = lambda: getattr(torch, name)(t, dim=dim)  # noqa: E731
        if dtype is lr.bfloat16:
            # lazyrt sums bf16 in double and rounds once; torch 1.13 rounds along the way (a sum
            # of 9100 values off by 4%). The oracle is torch's f64 result, rounded to bf16.
            want = lambda: getattr(torch, name)(t.double(), dim=dim).to(torch.bfloat16)  # noqa: E731
        same_or_both_fail(lambda: getattr(lr, name)(x, dim=dim), want, f"{name} {dtype} {shape} dim {dim}",
                          rtol=1e-5 if dtype in (lr.float32, lr.float64) else None)


def test_reduction_dtype_argument_and_max_min(rng):
    x, t = pair(rng, (3, 4), lr.int32)
    assert_same(lr.sum(x, dtype=lr.float64), torch.sum(t, dtype=torch.float64))
    assert_same(x.mean(1, dtype=lr.float32), t.mean(1, dtype=torch.float32))
    y, u = pair(rng, (3, 4), lr.float32)
    assert_same(lr.max(y), torch.max(u))
    assert_same(y.min(), u.min())
    assert_same(lr.max(x, y.long()), torch.max(t, u.long()))
    assert_same(lr.min(y, y * 2), torch.min(u, u * 2))
    assert_same(lr.sum(lr.tensor(3.0)), torch.sum(torch.tensor(3.0)))


# ---- matmul ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)),
                                    ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3)),
                                    ((2, 3, 4), (4,))], ids=str)
def test_matmul(shapes, rng):
    for dtype in [lr.float32, lr.float64, lr.int64]:
        x, t = pair(rng, shapes[0], dtype)
        y, u = pair(rng, shapes[1], dtype)
        assert_same(lr.matmul(x, y), torch.matmul(t, u), rtol=1e-5, atol=1e-5, what=f"matmul {dtype}")
        assert_same(x @ y, t @ u, rtol=1e-5, atol=1e-5)
        assert_same(x.matmul(y), t.matmul(u), rtol=1e-5, atol=1e-5)
    x, t = pair(rng, (3, 4), lr.float32)
    y, u = pair(rng, (4, 2), lr.float32)
    assert_same(lr.mm(x, y), torch.mm(t, u), rtol=1e-5, atol=1e-5)
    with pytest.raises(lr.Error):
        lr.matmul(x, x)


@pytest.mark.parametrize("shapes", [((2, 5, 4), (2, 4, 6)), ((2, 3, 5, 4), (3, 4, 6)), ((2, 1, 4, 5), (3, 5, 6)),
                                    ((4, 5), (2, 5, 6)), ((2, 4, 40), (40, 33)), ((40, 41), (3, 41, 42))], ids=str)
@pytest.mark.parametrize("tx,ty", [(False, True), (True, False), (True, True)])
def test_batched_matmul_of_transposed_matrices(shapes, tx, ty, rng):
    # A @ B with A (tx) and/or B (ty) given as the transpose of a tensor, and the transpose of
    # the product: the compiler reads the untransposed tensors (gemm); broadcast batch dims;
    # small products (a loop) and large ones (BLAS).
    def operand(shape, transposed, dtype):
        if not transposed:
            return pair(rng, shape, dtype)
        x, t = pair(rng, shape[:-2] + (shape[-1], shape[-2]), dtype)
        return x.transpose(-1, -2), t.transpose(-1, -2)

    for dtype in [lr.float32, lr.float64, lr.bfloat16, lr.int64]:
        a, ta = operand(shapes[0], tx, dtype)
        b, tb = operand(shapes[1], ty, dtype)
        want = torch.matmul(ta.double(), tb.double())
        tol = {lr.bfloat16: 2e-2, lr.float32: 1e-5}.get(dtype, 1e-12)
        what = f"{dtype} {shapes} tx={tx} ty={ty}"
        assert_same(lr.matmul(a, b) + 0, want.to(TORCH_DTYPE[dtype]), rtol=tol, atol=tol * 10, what=what)
        assert_same(lr.matmul(a, b).transpose(-1, -2) * 1, want.transpose(-1, -2).to(TORCH_DTYPE[dtype]),
                    rtol=tol, atol=tol * 10, what=what + ", the product transposed")


def test_log_softmax(rng):
    for dtype in FLOATS:
        x, t = pair(rng, (3, 5), dtype, -5, 5)
        for dim in [0, 1, -1]:
            assert_same(lr.log_softmax(x, dim), torch.log_softmax(t, dim), rtol=1e-5, atol=1e-6)
            assert_same(x.log_softmax(dim), t.log_softmax(dim), rtol=1e-5, atol=1e-6)


# ---- shape -----------------------------------------------------------------------------------

def test_shape_ops(rng):
    for dtype in ALL:
        x, t = pair(rng, (2, 3, 4), dtype)
        cases = [
            (lambda a: a.reshape(6, 4), lambda a: a.reshape(6, 4)),
            (lambda a: a.reshape(-1), lambda a: a.reshape(-1)),
            (lambda a: a.view(4, -1), lambda a: a.view(4, -1)),
            (lambda a: a.transpose(0, 2), lambda a: a.transpose(0, 2)),
            (lambda a: a.swapaxes(0, 1), lambda a: a.swapaxes(0, 1)),
            (lambda a: a.permute(2, 0, 1), lambda a: a.permute(2, 0, 1)),
            (lambda a: a.permute((1, 2, 0)), lambda a: a.permute((1, 2, 0))),
            (lambda a: a.unsqueeze(1), lambda a: a.unsqueeze(1)),
            (lambda a: a.unsqueeze(-1), lambda a: a.unsqueeze(-1)),
            (lambda a: a.unsqueeze(0).squeeze(0), lambda a: a.unsqueeze(0).squeeze(0)),
            (lambda a: a.unsqueeze(2).unsqueeze(0).squeeze(), lambda a: a.unsqueeze(2).unsqueeze(0).squeeze()),
            (lambda a: a.squeeze(1), lambda a: a.squeeze(1)),
            (lambda a: a.flatten(), lambda a: a.flatten()),
            (lambda a: a.flatten(1), lambda a: a.flatten(1)),
            (lambda a: a.flatten(0, 1), lambda a: a.flatten(0, 1)),
            (lambda a: a.unsqueeze(0).expand(5, -1, -1, -1), lambda a: a.unsqueeze(0).expand(5, -1, -1, -1)),
            (lambda a: a.reshape(2, 1, 12).expand(2, 3, 12),
             lambda a: a.reshape(2, 1, 12).expand(2, 3, 12)),
            (lambda a: a.reshape(6, 4).T, lambda a: a.reshape(6, 4).T),
            (lambda a: a.reshape(6, 4).t(), lambda a: a.reshape(6, 4).t()),
        ]
        for i, (f, g) in enumerate(cases):
            assert_same(f(x), g(t), what=f"shape case {i} {dtype}")
    x, t = pair(rng, (3, 1), lr.float32)
    assert_same(lr.reshape(x, (1, 3)), torch.reshape(t, (1, 3)))
    assert_same(lr.transpose(x, 0, 1), torch.transpose(t, 0, 1))
    assert_same(lr.permute(x, (1, 0)), torch.permute(t, (1, 0)))
    assert_same(lr.expand(x, (2, 3, 4)), t.expand(2, 3, 4))
    assert_same(lr.broadcast_to(x, (3, 5)), torch.broadcast_to(t, (3, 5)))
    assert_same(lr.unsqueeze(x, 0), torch.unsqueeze(t, 0))
    assert_same(lr.squeeze(x), torch.squeeze(t))
    assert_same(lr.squeeze(x, 1), torch.squeeze(t, 1))
    assert_same(lr.flatten(x), torch.flatten(t))
    assert_same(lr.t(x), torch.t(t))
    with pytest.raises(lr.Error):
        x.reshape(4)
    with pytest.raises(lr.Error):
        x.transpose(0, 5)


# ---- casts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("src,dst", list(itertools.product(ALL + [lr.float16, lr.bfloat16], repeat=2)), ids=str)
def test_casts(src, dst, rng):
    x, t = pair(rng, (4, 5), src, -5, 5)
    rtol, atol = (1e-2, 1e-2) if {src, dst} & {lr.float16, lr.bfloat16} else (None, None)
    assert_same(lr.cast(x, dst), t.to(TORCH_DTYPE[dst]), rtol=rtol, atol=atol, what=f"{src}->{dst}")
    assert_same(x.to(dst), t.to(TORCH_DTYPE[dst]), rtol=rtol, atol=atol)


def test_half_precision_arithmetic(rng):
    for dtype in [lr.float16, lr.bfloat16]:
        x, t = pair(rng, (3, 4), dtype)
        y, u = pair(rng, (4,), dtype)
        assert_same(x + y, t + u, rtol=1e-2, atol=1e-2)
        assert_same(x * 0.5, t * 0.5, rtol=1e-2, atol=1e-2)
        assert_same(x + y.to(lr.float32), t + u.to(torch.float32), rtol=1e-2, atol=1e-2)
        assert_same((x * y).sum(1), (t * u).sum(1), rtol=2e-2, atol=2e-2)


# ---- random ops: shapes and dtypes (PyTorch's generator differs, so no values) ----------------

def test_random_ops_shapes_dtypes_and_dropout(rng):
    assert lr.rand(2, 3).shape == (2, 3) and lr.rand(2, dtype=lr.float64).dtype is lr.float64
    assert lr.randn((4,)).shape == (4,)
    x = lr.ones(10000)
    y = lr.dropout(x, 0.25)
    kept = y.numpy()
    assert np.all((kept == 0) | np.isclose(kept, 1 / 0.75))
    assert 0.2 < (kept == 0).mean() < 0.3
    assert lr.dropout(x, 0.25, training=False).tolist() == x.tolist()
    m = lr.dropout_mask((1000,), 0.5).numpy()
    assert np.all((m == 0) | (m == 2))
