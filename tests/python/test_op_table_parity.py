"""One table of cases, one row per op and situation, checked three ways against PyTorch:

- values: every case in every dtype it lists, by lazyrt.<op> and (where PyTorch has one) the
  Tensor method, against torch; where torch refuses a dtype, lazyrt must refuse it too;
- gradients: every case whose op torch differentiates, in float64, loss = sum(out * w) with
  random w, and the .grad of every floating input compared with torch.autograd's;
- coverage: every function the lazyrt package exposes has a value case or a named exception
  saying where else it is checked, and every case torch differentiates is gradient-checked.

Inputs cover broadcasting shapes, empty dims, 0-dim tensors and non-contiguous inputs (strided
NumPy memory shared by both sides, or a lazy transpose on the lazyrt side against a
non-contiguous torch view)."""

import builtins
import dataclasses
import inspect
import math
import os
from typing import Callable, Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import lazyrt as lr
from conftest import NUMPY_DTYPE, TORCH_DTYPE, assert_same, random_array

FLOATS = (lr.float32, lr.float64)
INTS = (lr.int32, lr.int64)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + (lr.bool,)


# ---- inputs: each spec makes the same value as a lazyrt and a torch argument -----------------

@dataclasses.dataclass
class Made:
    lr: object           # the argument the lazyrt op gets
    torch: object        # the argument the torch op gets
    leaf_lr: object = None     # where the gradient lands (the argument unless it is a view)
    leaf_torch: object = None


@dataclasses.dataclass
class X:
    """A tensor of the case's dtype (or `dtype`), uniform in [low, high).

    grid: values rounded to multiples of grid (exact zeros, halves for round).
    special: nan, inf and -inf among the values (floating dtypes).
    layout: "strided": non-contiguous NumPy memory, shared by both sides (last two dims
            swapped); "lazy_t": lazyrt transposes a tensor lazily, torch gets a
            non-contiguous view of the same values.
    """
    shape: tuple
    low: float = -3.0
    high: float = 3.0
    dtype: object = None
    grid: Optional[float] = None
    special: bool = False
    layout: str = ""

    def make(self, rng, dtype, requires_grad):
        dtype = self.dtype or dtype
        shape = self.shape
        if self.layout:
            shape = shape[:-2] + (shape[-1], shape[-2])
        a = np.array(random_array(rng, shape, dtype, self.low, self.high))
        if self.grid:
            a = np.array(np.round(a / self.grid) * self.grid, dtype=a.dtype)
        if self.special and dtype.is_floating_point:
            a.reshape(-1)[:3] = [math.nan, math.inf, -math.inf][:a.size]
        requires_grad = requires_grad and dtype.is_floating_point
        if self.layout == "strided":
            a = np.swapaxes(a, -1, -2)
            assert not a.flags.c_contiguous
            x, t = lr.from_numpy(a), torch.from_numpy(a)
        else:
            x, t = lr.tensor(a, dtype=dtype), torch.from_numpy(a.copy())
        if requires_grad:
            x.requires_grad_()
            t.requires_grad_()
        if self.layout == "lazy_t":
            return Made(x.transpose(-1, -2), t.transpose(-1, -2), x, t)
        return Made(x, t, x, t)


@dataclasses.dataclass
class Index:
    """int64 indices in [0, high); with `distinct`, no value repeats along that dim (scatter
    writes each place once, so the result does not depend on the order of writes)."""
    shape: tuple
    high: int
    distinct: Optional[int] = None
    dtype: object = lr.int64

    def make(self, rng, dtype, requires_grad):
        if self.distinct is None:
            a = rng.integers(0, self.high, size=self.shape)
        else:
            d = self.distinct
            moved = self.shape[:d] + self.shape[d + 1:] + (self.shape[d],)
            a = np.array([rng.permutation(self.high)[:self.shape[d]]
                          for _ in range(int(np.prod(moved[:-1])))]).reshape(moved)
            a = np.moveaxis(a, -1, d)
        a = np.ascontiguousarray(a, dtype=NUMPY_DTYPE[self.dtype])
        return Made(lr.tensor(a), torch.from_numpy(a))


@dataclasses.dataclass
class Mask:
    shape: tuple

    def make(self, rng, dtype, requires_grad):
        a = np.array(rng.random(self.shape) < 0.5)
        return Made(lr.tensor(a), torch.from_numpy(a))


class DType:
    """The case's dtype itself (for creation ops and casts)."""

    def make(self, rng, dtype, requires_grad):
        return Made(dtype, TORCH_DTYPE[dtype])


# ---- the table --------------------------------------------------------------------------------

@dataclasses.dataclass
class Case:
    op: str                      # the name lazyrt exposes that this case checks
    args: tuple                  # input specs
    kw: dict                     # keywords, the same for both sides (PyTorch's names)
    lfn: Optional[Callable]      # lazyrt side; None: lazyrt.<op>, and the method where bound
    tfn: Callable                # torch side
    dtypes: tuple
    grad: bool                   # checked against torch.autograd (float64)
    tol32: Optional[tuple]       # (rtol, atol) for float32 results, when not conftest's
    refused: bool = False        # torch refuses every dtype of it, and lazyrt must too
    id: str = ""


CASES = []


def case(op, *args, kw=None, lfn=None, tfn=None, dtypes=FLOATS, grad=None, tol32=None, refused=False):
    """Adds a case. tfn defaults to torch.<op>. grad defaults to: some dtype is floating."""
    if tfn is None:
        tfn = getattr(torch, op)
    if grad is None:
        grad = not refused and any(d.is_floating_point for d in dtypes)
    CASES.append(Case(op, args, kw or {}, lfn, tfn, tuple(dtypes), grad, tol32, refused))


SHAPES = np.random.default_rng(2024)  # draws the table's random shapes, the same on every run


def broadcast_shapes(n, first_full=False):
    """n random shapes (rank 0 to 4, sizes 0 to 4) that broadcast together; with first_full the
    first is the shape they broadcast to."""
    rank = int(SHAPES.integers(0, 5))
    full = SHAPES.integers(1, 5, size=rank)
    if rank and SHAPES.random() < 0.15:
        full[SHAPES.integers(rank)] = 0
    shapes = []
    for i in range(n):
        r = rank if first_full and i == 0 else int(SHAPES.integers(0, rank + 1))
        s = full[rank - r:].copy()
        if not (first_full and i == 0):
            s[SHAPES.random(r) < 0.3] = 1
        shapes.append(tuple(int(v) for v in s))
    return shapes


def random_shapes(op, *makers, times=3, first_full=False, **kw):
    """Cases of op on random shapes that broadcast together; one maker (shape -> spec) per input."""
    for _ in range(times):
        shapes = broadcast_shapes(len(makers), first_full)
        case(op, *[make(shape) for make, shape in zip(makers, shapes)], **kw)


def unary(op, low=-3.0, high=3.0, dtypes=FLOATS, grad=None, tfn=None, kw=None, **x):
    """An elementwise op on a matrix, a 0-dim tensor, an empty tensor, non-contiguous inputs and
    random shapes."""
    for shape, layout in [((3, 4), ""), ((), ""), ((0, 5), ""), ((4, 3), "strided"), ((2, 3, 4), "lazy_t")]:
        case(op, X(shape, low, high, layout=layout, **x), kw=kw, dtypes=dtypes, grad=grad, tfn=tfn)
    random_shapes(op, lambda s: X(s, low, high, **x), times=2, kw=kw, dtypes=dtypes, grad=grad, tfn=tfn)
    if "special" not in x:  # nan, inf and -inf among ordinary values
        case(op, X((2, 5), low, high, special=True, **x), kw=kw, dtypes=FLOATS, grad=grad, tfn=tfn)


def binary(op, dtypes=NUMERIC, grad=None, low=-3.0, high=3.0, low2=-3.0, high2=3.0, tfn=None):
    """A binary op on broadcasting, empty and non-contiguous operands, and random shapes."""
    for (sa, la), (sb, lb) in [(((3, 4), ""), ((4,), "")), (((2, 1, 3), ""), ((4, 1), "")),
                               (((0, 3), ""), ((3,), "")), (((3, 4), "strided"), ((3, 4), "lazy_t")),
                               (((), ""), ((2, 3), ""))]:
        case(op, X(sa, low, high, layout=la), X(sb, low2, high2, layout=lb), dtypes=dtypes, grad=grad, tfn=tfn)
    random_shapes(op, lambda s: X(s, low, high), lambda s: X(s, low2, high2), dtypes=dtypes, grad=grad, tfn=tfn)


def listed(f):
    """f taking the inputs as one list (cat, stack)."""
    return lambda *xs, **kw: f(list(xs), **kw)


def torch_gelu(t, **kw):
    """torch's gelu, except where only its vectorized kernel gives nan: torch 2.9's vectorized
    kernel for a contiguous float32 (bf16, f16) tensor of several elements gives nan for +inf,
    while its element-by-element kernel (strided tensors, one element), its float64 kernel and
    gelu's definition x * Phi(x) give +inf, as lazyrt does."""
    out = TF.gelu(t, **kw)
    strided = TF.gelu(torch.stack([t, t], -1)[..., 0], **kw)
    return torch.where(torch.isnan(out) & ~torch.isnan(strided), strided, out)


def torch_slice(t, dim=0, start=None, end=None, step=1):
    return t[(builtins.slice(None),) * (dim % t.dim()) + (builtins.slice(start, end, step),)]


# The plain elementwise ops of the op table (lazyrt/ops.def's api column): every row is drawn
# here, in the dtypes its api takes (integers and bools where torch takes them), over the
# values below where the op's domain is narrower than [-3, 3]; rounding ops on a grid of
# halves (ties and zeros).
PLAIN_ROWS = [r for r in lr._C._debug.op_table() if r["api"] in ("Unary", "UnaryFloat", "Arith", "ArithFloat")]
DOMAIN = {"log": (0.1, 5.0), "sqrt": (0.1, 5.0), "rsqrt": (0.1, 5.0), "log1p": (-0.9, 3.0)}
DIVISOR = {"div": (0.5, 3.0)}  # operand 1's values
GRID = {"sign": 0.5, "floor": 0.5, "ceil": 0.5, "round": 0.5}
for row in PLAIN_ROWS:
    name, grad = row["name"], None if row["differentiable"] else False
    if row["operands"] == 1:
        dtypes = NUMERIC if row["api"] == "Unary" else FLOATS + INTS
        if not row["differentiable"]:  # isnan, logical_not: any dtype, with nan and infinities
            unary(name, dtypes=ALL, grad=False, special=True)
        else:
            unary(name, *DOMAIN.get(name, (-3.0, 3.0)), dtypes=dtypes, grid=GRID.get(name))
    else:
        dtypes = ALL if name.startswith("logical_") else NUMERIC
        low2, high2 = DIVISOR.get(name, (-3.0, 3.0))
        binary(name, dtypes=dtypes, grad=grad, low2=low2, high2=high2)
unary("negative", dtypes=NUMERIC)
unary("silu", tfn=TF.silu)
unary("reciprocal", 0.5, 3.0, dtypes=FLOATS + INTS)
unary("reciprocal", -3.0, -0.5)
for decimals in [1, 2, -1]:  # the values of the grid sit on halves of the rounding place
    unary("round", -300.0, 300.0, dtypes=NUMERIC, grid=0.5 * 10.0 ** -decimals, kw=dict(decimals=decimals))
unary("sign", dtypes=(lr.bool,))
for name in ["isinf", "isfinite"]:
    unary(name, dtypes=ALL, grad=False, special=True)
unary("nan_to_num", dtypes=NUMERIC, special=True)
unary("nan_to_num", special=True, kw=dict(nan=1.5, posinf=9.0, neginf=-7.0))
unary("gelu", kw=dict(approximate="none"), tfn=torch_gelu)
unary("gelu", kw=dict(approximate="tanh"), tfn=torch_gelu)
unary("softplus", -30.0, 30.0, tfn=TF.softplus)
unary("softplus", -8.0, 8.0, kw=dict(beta=2, threshold=5), tfn=TF.softplus)
unary("leaky_relu", dtypes=NUMERIC, tfn=TF.leaky_relu)
unary("leaky_relu", kw=dict(negative_slope=0.2), tfn=TF.leaky_relu)
for source in FLOATS:
    case("cast", X((3, 4), dtype=source), DType(), lfn=lr.cast, tfn=lambda t, d: t.to(d), dtypes=FLOATS)
case("cast", X((3, 4), dtype=lr.float32), DType(), lfn=lr.cast, tfn=lambda t, d: t.to(d), dtypes=INTS + (lr.bool,))

# elementwise, binary and ternary
for name in ["add", "sub", "subtract", "multiply"]:
    binary(name)
for name in ["divide", "true_divide"]:
    binary(name, low2=0.5, high2=3.0)
binary("pow", dtypes=FLOATS, low=0.5, high=2.0)
binary("pow", dtypes=INTS, low=0.0, high=3.0, low2=0.0, high2=3.0)
case("add", X((3, 4)), X((4,)), kw=dict(alpha=2.5))
case("sub", X((3, 1)), X((1, 4)), kw=dict(alpha=-0.5), dtypes=FLOATS)
case("max", X((3, 4)), X((3, 1)), dtypes=NUMERIC)
case("min", X((3, 4)), X((3, 4), layout="strided"), dtypes=NUMERIC)
case("where", Mask((3, 4)), X((4,)), X((3, 1)), dtypes=ALL, lfn=lr.where)
case("where", Mask((2, 1)), X((2, 3), layout="lazy_t"), X(()), lfn=lr.where)
case("where", Mask((3, 4)), X((3, 4)), lfn=lambda c, x: lr.where(c, x, 0.5), tfn=lambda c, t: torch.where(c, t, 0.5))
for pair in [(1.5, -2.0), (1, 0), (True, False), (1, 0.5), (True, 2)]:  # two numbers: torch's dtype
    case("where", Mask((2, 3)), lfn=lambda c, p=pair: lr.where(c, *p), tfn=lambda c, p=pair: torch.where(c, *p),
         dtypes=(None,), grad=False)
case("clamp", X((3, 4)), kw=dict(min=-1.0, max=1.5), dtypes=FLOATS)
case("clamp", X((3, 4)), kw=dict(min=-1, max=2), dtypes=INTS)
case("clamp", X((3, 4), layout="lazy_t"), kw=dict(min=0.5))
case("clamp", X((3, 4)), kw=dict(max=-0.5))
case("clamp", X((3, 4)), X((4,), -2.0, 0.0), X((3, 1), 0.0, 2.0),
     lfn=lambda x, lo, hi: lr.clamp(x, lo, hi), tfn=lambda t, lo, hi: torch.clamp(t, lo, hi), dtypes=NUMERIC)
case("clamp", X((3, 4)), X((4,)), lfn=lambda x, lo: lr.clamp(x, min=lo), tfn=lambda t, lo: torch.clamp(t, min=lo))
case("clamp", X((3, 4)), X((3, 1)), lfn=lambda x, hi: lr.clamp(x, max=hi), tfn=lambda t, hi: torch.clamp(t, max=hi))
case("lerp", X((3, 4)), X((4,)), kw=dict(weight=0.3))
case("lerp", X((3, 1)), X((2, 3, 4), layout="strided"), X((4,), 0.0, 1.0))
case("lerp", X((2, 3)), X((2, 3)), X(()))
case("addcmul", X((3, 4)), X((3, 1)), X((4,)), kw=dict(value=0.5))
case("addcmul", X((2, 3)), X((2, 3), layout="lazy_t"), X((2, 3)), dtypes=NUMERIC)
case("addcdiv", X((3, 4)), X((3, 1)), X((4,), 0.5, 2.0), kw=dict(value=-2))
case("addcdiv", X((0, 4)), X((4,)), X((1, 4), 0.5, 2.0), dtypes=NUMERIC)
random_shapes("where", Mask, X, X, lfn=lr.where, dtypes=ALL)
random_shapes("masked_fill", X, Mask, kw=dict(value=2.5))
# torch 1.13 cannot differentiate tensor bounds that broadcast the input: the input is full-sized
random_shapes("clamp", X, lambda s: X(s, -2.0, 0.0), lambda s: X(s, 0.0, 2.0), dtypes=NUMERIC, first_full=True,
              lfn=lambda x, lo, hi: lr.clamp(x, lo, hi), tfn=lambda t, lo, hi: torch.clamp(t, lo, hi))
random_shapes("lerp", X, X, lambda s: X(s, 0.0, 1.0))
random_shapes("addcmul", X, X, X, dtypes=NUMERIC)
random_shapes("addcdiv", X, X, lambda s: X(s, 0.5, 2.0))

# reductions
for name in ["sum", "mean", "amax", "amin"]:
    dt = FLOATS if name == "mean" else NUMERIC
    case(name, X((2, 3, 4)), kw=dict(dim=(0, 2)), dtypes=dt)
    case(name, X((3, 4), layout="strided"), kw=dict(dim=-1, keepdim=True), dtypes=dt)
    case(name, X((0, 3)), kw=dict(dim=1), dtypes=dt)
case("sum", X((3, 4)), dtypes=ALL)
case("sum", X((0, 3)), kw=dict(dim=0), dtypes=ALL)
case("mean", X((2, 3, 4), layout="lazy_t"))
case("max", X((3, 4), layout="lazy_t"), dtypes=NUMERIC)
case("min", X((2, 3)), dtypes=NUMERIC)
case("prod", X((3, 4), 0.5, 1.5))
case("prod", X((3, 4), -2.0, 2.0, grid=1.0), kw=dict(dim=1), dtypes=NUMERIC)  # exact zeros
case("prod", X((2, 3, 4), 0.5, 1.5, layout="lazy_t"), kw=dict(dim=-1, keepdim=True))
case("prod", X((0, 3)), kw=dict(dim=0), dtypes=NUMERIC)
for name in ["var", "std"]:
    case(name, X((3, 5)), tol32=(1e-5, 1e-6))
    case(name, X((3, 5)), kw=dict(dim=1, correction=0), tol32=(1e-5, 1e-6))
    case(name, X((2, 3, 5), layout="lazy_t"), kw=dict(dim=(0, 2), correction=2, keepdim=True), tol32=(1e-5, 1e-6))
    case(name, X((4, 6), layout="strided"), kw=dict(dim=-1, keepdim=True), tol32=(1e-5, 1e-6))
    # PyTorch's unbiased spellings: by keyword, positionally after dim, and alone.
    case(name, X((2, 3, 5)), kw=dict(dim=(0, 2), unbiased=False), tol32=(1e-5, 1e-6))
    case(name, X((3, 5)), kw=dict(unbiased=False), tol32=(1e-5, 1e-6))
    case(name, X((3, 5)), lfn=lambda x, f=getattr(lr, name): f(x, 1, False, True),
         tfn=lambda x, f=getattr(torch, name): f(x, 1, False, True), tol32=(1e-5, 1e-6))
    case(name, X((3, 5)), lfn=lambda x, f=getattr(lr, name): f(x, False),
         tfn=lambda x, f=getattr(torch, name): f(x, False), tol32=(1e-5, 1e-6))
    case(name, X((3, 5)), kw=dict(dim=1, unbiased=True, correction=0), refused=True)
case("logsumexp", X((3, 5), -50.0, 50.0), kw=dict(dim=1), tol32=(1e-6, 1e-5))
case("logsumexp", X((2, 3, 4), layout="lazy_t"), kw=dict(dim=(0, 1), keepdim=True), tol32=(1e-6, 1e-5))
case("logsumexp", X((4, 3), layout="strided"), kw=dict(dim=-1))
for name in ["argmax", "argmin"]:
    case(name, X((3, 5)), dtypes=NUMERIC, grad=False)
    case(name, X((3, 5), -2.0, 2.0), kw=dict(dim=1, keepdim=True), dtypes=NUMERIC, grad=False)  # ints tie
    case(name, X((2, 3, 4), layout="lazy_t"), kw=dict(dim=0), dtypes=NUMERIC, grad=False)
for name in ["all", "any"]:
    case(name, X((3, 4), -1.0, 1.0, grid=1.0), dtypes=ALL, grad=False)
    case(name, X((3, 4), -1.0, 1.0, grid=1.0, layout="strided"), kw=dict(dim=1, keepdim=True), dtypes=ALL,
         grad=False)
    case(name, X((0, 3)), kw=dict(dim=0), dtypes=ALL, grad=False)
for p in [1.0, 2.0, math.inf]:
    case("norm", X((3, 4)), kw=dict(p=p), tol32=(1e-5, 1e-6))
    case("norm", X((2, 3, 4), layout="lazy_t"), kw=dict(p=p, dim=(0, 2), keepdim=True), tol32=(1e-5, 1e-6))
    case("norm", X((4, 3), layout="strided"), kw=dict(p=p, dim=-1), tol32=(1e-5, 1e-6))
for name in ["softmax", "log_softmax"]:
    for dim in [0, 1, -1]:
        case(name, X((2, 3, 4), -5.0, 5.0), kw=dict(dim=dim), tol32=(1e-5, 1e-6))
    case(name, X((3, 4), layout="strided"), kw=dict(dim=0), tol32=(1e-5, 1e-6))
    case(name, X((0, 4)), kw=dict(dim=1))
    case(name, X((3, 4), dtype=lr.float32), DType(), lfn=lambda x, d, f=getattr(lr, name): f(x, 1, dtype=d),
         tfn=lambda t, d, f=getattr(torch, name): f(t, 1, dtype=d), tol32=(1e-5, 1e-6))
case("layer_norm", X((2, 3, 4)), X((4,)), X((4,)), lfn=lambda x, w, b: lr.layer_norm(x, (4,), w, b),
     tfn=lambda t, w, b: TF.layer_norm(t, (4,), w, b), tol32=(1e-5, 1e-5))
case("layer_norm", X((2, 3, 4), layout="lazy_t"), kw=dict(normalized_shape=(3, 4), eps=1e-3), tfn=TF.layer_norm,
     tol32=(1e-5, 1e-5))

# shape
for dims in [dict(shape=(4, -1)), dict(shape=(24,))]:
    case("reshape", X((2, 3, 4), layout="lazy_t"), kw=dims, dtypes=ALL)
case("reshape", X((0, 4)), kw=dict(shape=(2, 0, 5)), dtypes=ALL)
case("reshape", X((3, 4)), lfn=lambda x: x.reshape(2, 6), tfn=lambda t: t.reshape(2, 6))
case("view", X((2, 3, 4)), kw=dict(shape=(6, 4)), lfn=lr.view, tfn=lambda t, shape: t.view(shape), dtypes=ALL)
case("view", X((2, 3, 4)), kw=dict(size=(3, 8)), lfn=lambda x, size: x.view(size=size),
     tfn=lambda t, size: t.view(size=size))
case("view", X((2, 3, 4)), lfn=lambda x: x.view(-1, 2), tfn=lambda t: t.view(-1, 2))
case("transpose", X((2, 3, 4)), kw=dict(dim0=0, dim1=-1), dtypes=ALL)
case("transpose", X((3, 4), layout="strided"), kw=dict(dim0=1, dim1=0))
case("swapaxes", X((2, 3, 4), layout="lazy_t"), kw=dict(axis0=2, axis1=1), dtypes=ALL)
case("permute", X((2, 3, 4)), kw=dict(dims=(2, 0, 1)), dtypes=ALL)
case("permute", X((2, 3, 4), layout="lazy_t"), lfn=lambda x: x.permute(1, 2, 0), tfn=lambda t: t.permute(1, 2, 0))
case("expand", X((3, 1)), kw=dict(size=(2, 3, 4)), tfn=lambda t, size: t.expand(size), dtypes=ALL)
case("expand", X((3, 1), layout="lazy_t"), lfn=lambda x: x.expand(2, -1, 4), tfn=lambda t: t.expand(2, -1, 4))
case("broadcast_to", X((3, 1)), kw=dict(size=(2, 3, 5)), dtypes=ALL)
case("broadcast_to", X(()), kw=dict(size=(0, 2)))
case("unsqueeze", X((3, 4)), kw=dict(dim=-1), dtypes=ALL)
case("unsqueeze", X(()), kw=dict(dim=0))
case("squeeze", X((3, 1, 4)), kw=dict(dim=1), dtypes=ALL)
case("squeeze", X((3, 1, 4)), kw=dict(dim=0))
case("squeeze", X((1, 3, 1, 1), layout="lazy_t"))
case("flatten", X((2, 3, 4)), kw=dict(start_dim=1), dtypes=ALL)
case("flatten", X((2, 3, 4, 5), layout="lazy_t"), kw=dict(start_dim=1, end_dim=-2))
case("flatten", X(()))
case("flatten", X((2, 0, 3)), kw=dict(start_dim=0, end_dim=1))
case("t", X((3, 4), layout="strided"), dtypes=ALL)
case("t", X((4,)))
case("slice", X((4, 7)), kw=dict(dim=1, start=1, step=2), tfn=torch_slice, dtypes=ALL)
case("slice", X((4, 7), layout="lazy_t"), kw=dict(dim=-1, start=-3, end=-1), tfn=torch_slice)
case("slice", X((5, 3)), kw=dict(dim=0, start=-10, end=100, step=3), tfn=torch_slice)
case("slice", X((5, 3)), kw=dict(dim=0, start=4, end=1), tfn=torch_slice)
case("narrow", X((4, 6)), kw=dict(dim=1, start=2, length=3), dtypes=ALL)
case("narrow", X((5, 3), layout="strided"), kw=dict(dim=0, start=-3, length=2))
for name in ["cat", "concat"]:
    case(name, X((2, 3)), X((1, 3)), X((4, 3), layout="strided"), lfn=listed(getattr(lr, name)),
         tfn=listed(torch.cat), dtypes=ALL)
    case(name, X((2, 3)), X((2, 0)), X((2, 2), layout="lazy_t"), kw=dict(dim=-1), lfn=listed(getattr(lr, name)),
         tfn=listed(torch.cat))
case("cat", X((2, 3)), X((1, 3), dtype=lr.int32), lfn=listed(lr.cat), tfn=listed(torch.cat))  # promotes
case("cat", X((0,)), X((2, 3)), lfn=listed(lr.cat), tfn=listed(torch.cat))  # a 1-D empty tensor is skipped
case("stack", X((2, 3)), X((2, 3), layout="strided"), lfn=listed(lr.stack), tfn=listed(torch.stack), dtypes=ALL)
case("stack", X((2, 3)), X((2, 3), layout="lazy_t"), X((2, 3)), kw=dict(dim=-1), lfn=listed(lr.stack),
     tfn=listed(torch.stack))
case("split", X((5, 4)), kw=dict(split_size_or_sections=2), dtypes=ALL)
case("split", X((3, 5), layout="lazy_t"), kw=dict(split_size_or_sections=[1, 3, 1], dim=1))
case("split_with_sizes", X((4, 6)), kw=dict(split_sizes=[2, 0, 4], dim=-1), dtypes=ALL)
case("chunk", X((4, 5)), kw=dict(chunks=3, dim=1), dtypes=ALL)
case("chunk", X((4, 3)), kw=dict(chunks=3))
case("flip", X((2, 3, 4)), kw=dict(dims=(0, 2)), dtypes=ALL)
case("flip", X((4, 3), layout="strided"), kw=dict(dims=(-1,)))

# along one dim: running sums and products, sorting (torch asked for its stable order, lazyrt's)
for name in ["cumsum", "cumprod"]:
    case(name, X((3, 4)), kw=dict(dim=1), dtypes=NUMERIC + (lr.bool,))
    case(name, X((4, 3), layout="strided"), kw=dict(dim=0))
    case(name, X((2, 3, 4), layout="lazy_t"), kw=dict(dim=-1))
    case(name, X(()), kw=dict(dim=0))
    case(name, X((0, 3)), kw=dict(dim=0))
case("cumprod", X((3, 5), -2.0, 2.0, grid=1.0), kw=dict(dim=1))  # exact zeros: the gradient without division


def torch_stable(f):
    return lambda t, **kw: f(t, stable=True, **kw)


case("sort", X((3, 5)), kw=dict(dim=1), tfn=torch_stable(torch.sort), dtypes=ALL)
case("sort", X((4, 3), layout="strided", special=True), kw=dict(dim=0, descending=True), tfn=torch_stable(torch.sort))
case("sort", X(()), tfn=torch_stable(torch.sort))
case("argsort", X((3, 5), grid=1.0), kw=dict(descending=True), tfn=torch_stable(torch.argsort), dtypes=NUMERIC,
     grad=False)  # indices
case("topk", X((3, 6)), kw=dict(k=2))
case("topk", X((5, 3), layout="lazy_t"), kw=dict(k=3, dim=0, largest=False))
case("clamp_min", X((3, 4)), kw=dict(min=0.5), dtypes=NUMERIC)
case("clamp_max", X((4, 3), layout="strided"), kw=dict(max=-0.5))

# shape compositions and products
case("roll", X((3, 4)), kw=dict(shifts=1), dtypes=ALL)
case("roll", X((3, 4), layout="strided"), kw=dict(shifts=(1, -5), dims=(0, 1)))
case("tile", X((2, 3)), kw=dict(dims=(2, 1, 2)), dtypes=ALL)
case("tile", X((2, 3, 4), layout="lazy_t"), kw=dict(dims=(2,)))
case("meshgrid", X((3,)), X((4,)), kw=dict(indexing="xy"), dtypes=ALL)
case("meshgrid", X((2,)), X(()), X((3,)), kw=dict(indexing="ij"))
case("einsum", X((3, 4)), X((4, 5), layout="strided"), lfn=lambda a, b: lr.einsum("ij,jk->ik", a, b),
     tfn=lambda a, b: torch.einsum("ij,jk->ik", a, b))
case("einsum", X((2, 3, 4)), X((4,)), lfn=lambda a, b: lr.einsum("...ij,j->...i", [a, b]),
     tfn=lambda a, b: torch.einsum("...ij,j->...i", [a, b]))
case("einsum", X((3, 3)), lfn=lambda a: lr.einsum("ii", a), tfn=lambda a: torch.einsum("ii", a), dtypes=NUMERIC)
case("baddbmm", X((3, 5)), X((2, 3, 4)), X((2, 4, 5)), kw=dict(beta=0.5, alpha=2.0), tol32=(1e-5, 1e-5))
case("repeat", X((3, 4)), kw=dict(repeats=(2, 1, 3)), tfn=lambda t, repeats: t.repeat(repeats), dtypes=ALL)
case("repeat", X((2, 3), layout="lazy_t"), lfn=lambda x: x.repeat(2, 2), tfn=lambda t: t.repeat(2, 2))
case("pad", X((2, 3, 4)), kw=dict(pad=(1, 2, 0, 1), value=0.5), tfn=TF.pad)
case("pad", X((3, 4), layout="strided"), kw=dict(pad=(-1, 2)), tfn=TF.pad, dtypes=ALL)

# indexing
case("index_select", X((5, 4)), Index((6,), 5), lfn=lambda x, i: lr.index_select(x, 0, i),
     tfn=lambda t, i: torch.index_select(t, 0, i), dtypes=ALL)
case("index_select", X((3, 5), layout="lazy_t"), Index((3,), 5), lfn=lambda x, i: x.index_select(-1, i),
     tfn=lambda t, i: t.index_select(-1, i))
case("gather", X((3, 5)), Index((3, 4), 5), lfn=lambda x, i: lr.gather(x, 1, i), tfn=lambda t, i: torch.gather(t, 1, i),
     dtypes=ALL)
case("gather", X((3, 5), layout="strided"), Index((2, 5), 3), lfn=lambda x, i: x.gather(0, i),
     tfn=lambda t, i: t.gather(0, i))
case("scatter", X((4, 5)), Index((2, 5), 4, distinct=0), X((2, 5)), lfn=lambda x, i, s: lr.scatter(x, 0, i, s),
     tfn=lambda t, i, s: torch.scatter(t, 0, i, s), dtypes=ALL)
case("scatter", X((3, 5), layout="lazy_t"), Index((3, 2), 5, distinct=1), X((3, 2)),
     lfn=lambda x, i, s: x.scatter(1, i, s), tfn=lambda t, i, s: t.scatter(1, i, s))
case("scatter", X((4, 5)), Index((2, 3), 4), lfn=lambda x, i: lr.scatter(x, 0, i, 1.5),
     tfn=lambda t, i: torch.scatter(t, 0, i, 1.5))
case("scatter_add", X((4, 5)), Index((3, 5), 4), X((3, 5)), lfn=lambda x, i, s: lr.scatter_add(x, 0, i, s),
     tfn=lambda t, i, s: torch.scatter_add(t, 0, i, s), dtypes=NUMERIC)
case("scatter_add", X((3, 5), layout="strided"), Index((3, 4), 5), X((3, 4)),
     lfn=lambda x, i, s: x.scatter_add(1, i, s), tfn=lambda t, i, s: t.scatter_add(1, i, s))
case("index_add", X((5, 3)), Index((4,), 5), X((4, 3)), lfn=lambda x, i, s: lr.index_add(x, 0, i, s, alpha=2),
     tfn=lambda t, i, s: torch.index_add(t, 0, i, s, alpha=2), dtypes=NUMERIC)
case("index_add", X((3, 5), layout="lazy_t"), Index((3,), 5), X((3, 3)), lfn=lambda x, i, s: x.index_add(1, i, s),
     tfn=lambda t, i, s: t.index_add(1, i, s))
# Python's indexing (t[key], t[key] = v) has its own table against torch: test_indexing.py
case("index_put", X((4, 3)), Index((2,), 4, distinct=0), X((2, 3)), lfn=lambda x, i, v: lr.index_put(x, (i,), v),
     tfn=lambda t, i, v: torch.index_put(t, (i,), v), dtypes=ALL)
case("index_put", X((3, 4), layout="lazy_t"), Index((5,), 3), Index((5,), 4), X((5,)),
     lfn=lambda x, i, j, v: x.index_put((i, j), v, accumulate=True),
     tfn=lambda t, i, j, v: t.index_put((i, j), v, accumulate=True), dtypes=NUMERIC)
case("index_copy", X((5, 3)), Index((2,), 5, distinct=0), X((2, 3)), lfn=lambda x, i, s: lr.index_copy(x, 0, i, s),
     tfn=lambda t, i, s: torch.index_copy(t, 0, i, s), dtypes=ALL)
case("index_copy", X((3, 5), layout="strided"), Index((3,), 5, distinct=0), X((3, 3)),
     lfn=lambda x, i, s: x.index_copy(1, i, s), tfn=lambda t, i, s: t.index_copy(1, i, s))
case("index_fill", X((4, 3)), Index((3,), 4), lfn=lambda x, i: lr.index_fill(x, 0, i, -1.5),
     tfn=lambda t, i: torch.index_fill(t, 0, i, -1.5), dtypes=ALL)
case("index_fill", X((3, 4), layout="lazy_t"), Index((2,), 4), X(()), lfn=lambda x, i, v: x.index_fill(1, i, v),
     tfn=lambda t, i, v: t.index_fill(1, i, v))
case("masked_fill", X((3, 4)), Mask((4,)), kw=dict(value=2.5), dtypes=FLOATS)
case("masked_fill", X((3, 4), layout="strided"), Mask((3, 1)), kw=dict(value=2), dtypes=ALL)
case("masked_fill", X((2, 3)), Mask((2, 3)), X(()), lfn=lr.masked_fill, tfn=torch.masked_fill)
for name in ["tril", "triu"]:
    case(name, X((4, 5)), dtypes=ALL)
    case(name, X((2, 3, 4), layout="lazy_t"), kw=dict(diagonal=-1))
    case(name, X((3, 5)), kw=dict(diagonal=2))
    case(name, X((0, 3)))
case("embedding", Index((2, 3), 6), X((6, 4)), tfn=TF.embedding)
case("embedding", Index((5,), 6), X((6, 3)), kw=dict(padding_idx=1), tfn=TF.embedding)
case("one_hot", Index((5,), 4), lfn=lr.one_hot, tfn=TF.one_hot, dtypes=(lr.int64,))
case("one_hot", Index((2, 3), 4), kw=dict(num_classes=6), lfn=lr.one_hot, tfn=TF.one_hot, dtypes=(lr.int64,))

# linear algebra, convolution, pooling
MM = (1e-5, 1e-5)
for sa, sb in [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((0, 4), (4, 3))]:
    case("matmul", X(sa), X(sb), dtypes=FLOATS + (lr.int64,), tol32=MM)
case("matmul", X((3, 4), layout="strided"), X((4, 2), layout="lazy_t"), tol32=MM)
case("mm", X((3, 4), layout="lazy_t"), X((4, 5)), tol32=MM)
case("bmm", X((2, 3, 4)), X((2, 4, 5), layout="lazy_t"), dtypes=FLOATS + (lr.int64,), tol32=MM)
case("addmm", X((4,)), X((3, 5)), X((5, 4)), tol32=MM)
case("addmm", X((3, 1)), X((3, 5), layout="strided"), X((5, 2)), kw=dict(beta=0.5, alpha=-2), tol32=MM)
case("addmm", X((3, 2)), X((3, 0)), X((0, 2)), kw=dict(beta=2), tol32=MM)
case("conv2d", X((2, 3, 7, 6)), X((4, 3, 3, 3)), tfn=TF.conv2d, tol32=MM)
case("conv2d", X((2, 4, 8, 7)), X((6, 2, 3, 2)), X((6,)), tfn=TF.conv2d, tol32=MM,
     kw=dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2))
case("conv2d", X((3, 6, 5), layout="lazy_t"), X((2, 3, 2, 2)), kw=dict(stride=2, padding=1), tfn=TF.conv2d, tol32=MM)
case("max_pool2d", X((2, 3, 7, 6)), kw=dict(kernel_size=3, stride=2, padding=1), tfn=TF.max_pool2d)
case("max_pool2d", X((2, 7, 8), layout="lazy_t"), kw=dict(kernel_size=(2, 3), dilation=(2, 1), ceil_mode=True),
     tfn=TF.max_pool2d)
case("max_pool2d", X((1, 2, 6, 6)), kw=dict(kernel_size=2), tfn=TF.max_pool2d)
case("max_pool2d_with_indices", X((2, 3, 7, 6)), kw=dict(kernel_size=3, stride=2, padding=1),
     tfn=lambda t, **kw: TF.max_pool2d(t, return_indices=True, **kw))
case("max_pool2d_with_indices", X((2, 7, 8), layout="lazy_t"), kw=dict(kernel_size=(2, 3), dilation=(2, 1), ceil_mode=True),
     tfn=lambda t, **kw: TF.max_pool2d(t, return_indices=True, **kw))
case("avg_pool2d", X((2, 3, 7, 6)), kw=dict(kernel_size=3, stride=2, padding=1), tfn=TF.avg_pool2d)
case("avg_pool2d", X((2, 3, 7, 6)), kw=dict(kernel_size=3, stride=2, padding=1, count_include_pad=False,
                                            ceil_mode=True), tfn=TF.avg_pool2d)
case("avg_pool2d", X((2, 6, 5), layout="lazy_t"), kw=dict(kernel_size=(2, 3), divisor_override=5),
     tfn=TF.avg_pool2d)

# refusals and promotions of the bindings: torch refuses these dtypes or promotes the number
case("clamp", X((3, 4)), kw=dict(min=0.5), dtypes=INTS + (lr.bool,))
case("clamp", X((3, 4)), kw=dict(min=-1.5, max=True), dtypes=INTS)
case("masked_fill", X((3, 4)), Mask((3, 4)), kw=dict(value=2.5), dtypes=INTS + (lr.bool,))
case("masked_fill", X((4,)), Mask((3, 4)), kw=dict(value=1.0))  # the mask broadcasts the input
case("pad", X((3, 4)), kw=dict(pad=(1, 1), value=0.5), tfn=TF.pad, dtypes=INTS)
case("logsumexp", X((3, 4)), kw=dict(dim=1), dtypes=INTS + (lr.bool,))  # in float32
for name in ["var", "std", "norm", "softmax", "log_softmax", "mean"]:
    case(name, X((3, 4)), kw=dict(dim=1) if name != "norm" else {}, dtypes=INTS + (lr.bool,), refused=True)
for name in ["conv2d", "max_pool2d", "avg_pool2d"]:
    args = (X((1, 2, 4, 4)), X((3, 2, 2, 2))) if name == "conv2d" else (X((1, 2, 4, 4)),)
    # torch convolves, averages and (since 2.x) max-pools integers
    case(name, *args, kw=dict(kernel_size=2) if name != "conv2d" else {}, tfn=getattr(TF, name), dtypes=INTS)
case("max_pool2d", X((2, 3, 5, 6)), kw=dict(kernel_size=3, stride=2, padding=1), tfn=TF.max_pool2d, dtypes=INTS)
case("max_pool2d", X((1, 2, 4, 4)), kw=dict(kernel_size=2), tfn=TF.max_pool2d, dtypes=(lr.bool,), refused=True)
case("layer_norm", X((2, 3)), kw=dict(normalized_shape=(3,)), tfn=TF.layer_norm, dtypes=INTS, refused=True)
case("var", X((2, 3)), kw=dict(dim=1, correction=3))  # no degrees of freedom left
case("std", X((2, 3)), kw=dict(dim=0, correction=3))
case("argmax", X((3, 4)), kw=dict(keepdim=True), dtypes=NUMERIC, grad=False)
case("argmax", X((2, 5), special=True), kw=dict(dim=1), grad=False)  # nan counts as the largest
case("argmin", X((2, 5), special=True), kw=dict(dim=1), grad=False)
for name in ["amax", "amin", "max", "min", "sum", "prod", "logsumexp", "softmax", "norm"]:
    case(name, X((2, 5), special=True), kw=dict(dim=1) if name not in ("max", "min") else {})
for name in ["maximum", "minimum", "max", "min"]:
    case(name, X((2, 5), special=True), X((2, 5), special=True))
case("clamp", X((2, 5), special=True), kw=dict(min=-1.0, max=1.0))
case("scalar_tensor", DType(), lfn=lambda d: lr.scalar_tensor(1.5, dtype=d),
     tfn=lambda d: torch.scalar_tensor(1.5, dtype=d), dtypes=(lr.bool,), grad=False)
case("index_select", X((5, 4)), Index((3,), 5, dtype=lr.int32), lfn=lambda x, i: lr.index_select(x, 0, i),
     tfn=lambda t, i: torch.index_select(t, 0, i))
case("gather", X((3, 5)), Index((3, 2), 5, dtype=lr.int32), lfn=lambda x, i: lr.gather(x, 1, i),
     tfn=lambda t, i: torch.gather(t, 1, i))  # int32 indices: torch 2.x (1.13 refused them)
case("embedding", Index((4,), 6, dtype=lr.int32), X((6, 3)), tfn=TF.embedding)
case("one_hot", Index((3,), 4, dtype=lr.int32), lfn=lr.one_hot, tfn=TF.one_hot, dtypes=(lr.int64,), refused=True)

# creation
for name in ["zeros", "ones"]:
    case(name, DType(), lfn=lambda d, f=getattr(lr, name): f(2, 3, dtype=d),
         tfn=lambda d, f=getattr(torch, name): f(2, 3, dtype=d), dtypes=ALL, grad=False)
    case(name + "_like", X((3, 0, 2)), dtypes=ALL, grad=False)
case("full", DType(), lfn=lambda d: lr.full((2, 3), 7, dtype=d), tfn=lambda d: torch.full((2, 3), 7, dtype=d),
     dtypes=ALL, grad=False)
for value in [2.5, 3, True]:
    case("full", kw=dict(size=(2, 1), fill_value=value), dtypes=(None,), grad=False)
    case("full_like", X((2, 3)), kw=dict(fill_value=value), dtypes=ALL, grad=False)
case("scalar_tensor", DType(), lfn=lambda d: lr.scalar_tensor(1.5, dtype=d),
     tfn=lambda d: torch.scalar_tensor(1.5, dtype=d), dtypes=NUMERIC, grad=False)
case("arange", kw=dict(end=5), dtypes=(None,), grad=False)
case("arange", kw=dict(start=1, end=2, step=0.25), dtypes=(None,), grad=False)
case("arange", DType(), lfn=lambda d: lr.arange(2, 9, 3, dtype=d), tfn=lambda d: torch.arange(2, 9, 3, dtype=d),
     dtypes=NUMERIC, grad=False)


def _name_cases():
    seen = {}
    for c in CASES:
        seen[c.op] = seen.get(c.op, 0) + 1
        c.id = f"{c.op}-{seen[c.op]}"


_name_cases()

# Exposed names that are no op with a torch twin, or whose values are checked elsewhere.
ELSEWHERE = {
    # random numbers: PyTorch's generator differs; checked by shape, dtype and distribution
    "rand": "test_random_ops_draw_their_distribution", "randn": "test_random_ops_draw_their_distribution",
    "randint": "test_random_ops_draw_their_distribution", "bernoulli": "test_random_ops_draw_their_distribution",
    "dropout": "test_random_ops_draw_their_distribution",
    "dropout_mask": "test_random_ops_draw_their_distribution",
    "manual_seed": "test_random_ops_draw_their_distribution",
    "multinomial": "test_multinomial_draws_by_the_weights",
    "random_state": "test_random_ops_draw_their_distribution",
    # data in and out: the values are the data given (test_interop.py, test_tensor.py)
    "tensor": "test_interop.py", "as_tensor": "test_interop.py", "from_numpy": "test_interop.py",
    "from_dlpack": "test_interop.py", "from_torch": "test_interop.py", "to_torch": "test_interop.py",
    # sync points compute values, they are no op
    "mark_step": "test_tensor.py", "invalidate_compiled_steps": "test_replay.py", "sync": "test_metrics_cache.py",
    "mark_dynamic": "test_dynamic_shapes.py", "dynamic_dims": "test_dynamic_shapes.py",
    "maybe_mark_dynamic": "test_dynamic_shapes.py",
    # type promotion table (test_api_coverage.py)
    "promote_types": "test_api_coverage.py",
    # compositions written in Python (python/lazyrt/_math.py, _linalg.py, ...), each against torch there
    "allclose": "test_torch_surface.py",
    "broadcast_tensors": "test_torch_surface.py",
    "clip": "test_torch_surface.py",
    "count_nonzero": "test_torch_surface.py",
    "diag": "test_torch_surface.py",
    "diff": "test_torch_surface.py",
    "dot": "test_torch_surface.py",
    "empty": "test_torch_surface.py",
    "empty_like": "test_torch_surface.py",
    "equal": "test_torch_surface.py",
    "exp2": "test_torch_surface.py",
    "eye": "test_torch_surface.py",
    "floor_divide": "test_torch_surface.py",
    "fmod": "test_torch_surface.py",
    "frac": "test_torch_surface.py",
    "hypot": "test_torch_surface.py",
    "is_tensor": "test_torch_surface.py",
    "isclose": "test_torch_surface.py",
    "linspace": "test_torch_surface.py",
    "log10": "test_torch_surface.py",
    "log2": "test_torch_surface.py",
    "logaddexp": "test_torch_surface.py",
    "logical_xor": "test_torch_surface.py",
    "mv": "test_torch_surface.py",
    "numel": "test_torch_surface.py",
    "outer": "test_torch_surface.py",
    "rand_like": "test_torch_surface.py",
    "randn_like": "test_torch_surface.py",
    "remainder": "test_torch_surface.py",
    "select": "test_torch_surface.py",
    "square": "test_torch_surface.py",
    "tan": "test_torch_surface.py",
    "trace": "test_torch_surface.py",
    "trunc": "test_torch_surface.py",
    "unbind": "test_torch_surface.py",
    # more compositions (python/lazyrt/_sorting.py, _data_dependent.py, ...): scans, order statistics, host
    # reads, save / load
    "argwhere": "test_torch_surface2.py",
    "bucketize": "test_torch_surface2.py",
    "cdist": "test_torch_surface2.py",
    "cummax": "test_torch_surface2.py",
    "cummin": "test_torch_surface2.py",
    "erfinv": "test_torch_surface2.py",
    "fliplr": "test_torch_surface2.py",
    "flipud": "test_torch_surface2.py",
    "kthvalue": "test_torch_surface2.py",
    "load": "test_torch_surface2.py",
    "masked_select": "test_torch_surface2.py",
    "median": "test_torch_surface2.py",
    "mode": "test_torch_surface2.py",
    "nanmedian": "test_torch_surface2.py",
    "nanquantile": "test_torch_surface2.py",
    "nonzero": "test_torch_surface2.py",
    "quantile": "test_torch_surface2.py",
    "repeat_interleave": "test_torch_surface2.py",
    "rot90": "test_torch_surface2.py",
    "save": "test_torch_surface2.py",
    "searchsorted": "test_torch_surface2.py",
    "unique": "test_torch_surface2.py",
    # the backend choice (test_backends.py)
    "set_backend": "test_backends.py", "current_backend": "test_backends.py", "available_backends": "test_backends.py",
    "set_flush_denormal": "test_backends.py", "flush_denormal": "test_backends.py",
    # gradient mode (test_tensor.py)
    "is_grad_enabled": "test_tensor.py",
    # structured loops (test_loops.py)
    "while_loop": "test_loops.py", "fori_loop": "test_loops.py",
    "scan": "test_scan.py", "scan_layers": "test_scan.py",
    # cached-graph replay (test_replay.py)
    "graph_hash": "test_replay.py", "warm_up_cache": "test_replay.py", "graph_inputs": "test_replay.py",
    "run_cached_graph": "test_replay.py", "compile_step": "test_replay.py", "tensor_id": "test_replay.py",
}


# ---- comparing ----------------------------------------------------------------------------------

def tolerance(case, x):
    if case.tol32 and x.dtype is lr.float32:
        return case.tol32
    return None, None


def assert_results(case, got, expect, what):
    if isinstance(expect, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expect), f"{what}: {len(expect)} results expected"
        for i, (g, e) in enumerate(zip(got, expect)):
            assert_same(g, e, *tolerance(case, g), what=f"{what} result {i}")
    else:
        assert_same(got, expect, *tolerance(case, got), what=what)


def make_inputs(case, rng, dtype, requires_grad=False):
    return [a.make(rng, dtype, requires_grad) for a in case.args]


def lazy(case, inputs):
    f = case.lfn or getattr(lr, case.op)
    return f(*[m.lr for m in inputs], **case.kw)


def run(case, inputs):
    """(lazyrt result, torch result); the torch one first, so that a torch refusal shows."""
    expect = case.tfn(*[m.torch for m in inputs], **case.kw)
    return lazy(case, inputs), expect


# ---- values -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_values_match_torch(case, rng):
    compared = 0
    for dtype in case.dtypes:
        what = f"{case.id} {dtype} {case.kw}"
        inputs = make_inputs(case, rng, dtype)
        try:
            expect = case.tfn(*[m.torch for m in inputs], **case.kw)
        except (RuntimeError, TypeError):
            with pytest.raises(lr.Error):
                lazy(case, inputs).numpy()  # the error may come when the graph runs
            continue
        assert_results(case, lazy(case, inputs), expect, what)
        if case.lfn is None and inputs and hasattr(lr.Tensor, case.op):
            method = getattr(inputs[0].lr, case.op)
            assert_results(case, method(*[m.lr for m in inputs[1:]], **case.kw), expect, what + " (method)")
        compared += 1
    if case.refused:
        assert not compared, f"{case.id}: torch computes it, it is no refusal"
    else:
        assert compared, f"{case.id}: torch refuses every dtype of the case"


# ---- gradients ---------------------------------------------------------------------------------

def weighted_sum(outs, weights):
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    return builtins.sum((o * w).sum() for o, w in zip(outs, weights))


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=lambda c: c.id)
def test_gradients_match_torch_autograd(case, rng):
    inputs = make_inputs(case, rng, lr.float64, requires_grad=True)
    got, expect = run(case, inputs)
    assert_results(case, got, expect, f"{case.id} forward")
    outs = expect if isinstance(expect, (tuple, list)) else [expect]
    ws = [random_array(rng, tuple(o.shape), lr.float64, -1, 1) for o in outs]
    weighted_sum(got, [lr.tensor(w) for w in ws]).backward()
    weighted_sum(expect, [torch.from_numpy(w) for w in ws]).backward()
    leaves = [m for m in inputs if isinstance(m.leaf_torch, torch.Tensor) and m.leaf_torch.requires_grad]
    assert leaves, f"{case.id}: no input requires grad"
    for i, m in enumerate(leaves):
        assert m.leaf_lr.grad is not None, f"{case.id}: input {i} got no gradient"
        assert_same(m.leaf_lr.grad, m.leaf_torch.grad, what=f"{case.id} grad of input {i}")


# ---- coverage ----------------------------------------------------------------------------------

def exposed():
    """The public functions of the package: the extension's ops and the package's own."""
    return sorted(n for n, v in vars(lr).items()
                  if not n.startswith("_") and callable(v) and not inspect.isclass(v) and not inspect.ismodule(v))


def test_every_exposed_function_has_a_value_case_or_a_named_exception():
    names = exposed()
    assert {"add", "gelu", "conv2d", "scatter_add", "tensor", "mark_step"} <= set(names)
    cased = {c.op for c in CASES}
    missing = [n for n in names if n not in cased and n not in ELSEWHERE]
    assert not missing, f"exposed without a parity case against torch or a named exception: {missing}"
    stale = sorted((set(ELSEWHERE) | cased) - set(names))
    assert not stale, f"cases or exceptions for names lazyrt does not expose: {stale}"
    assert not cased & set(ELSEWHERE), f"both a case and an exception: {sorted(cased & set(ELSEWHERE))}"
    for name, where in ELSEWHERE.items():
        if where.endswith(".py"):
            with open(os.path.join(os.path.dirname(__file__), where)) as f:
                assert name in f.read(), f"{name}: {where} does not use it"
        else:
            assert callable(globals().get(where)), f"{name}: no test {where} here"


# Rows of the op table whose public function has another name.
ROW_FUNCTION = {"concat": "cat", "iota": "arange", "random": "rand"}


def test_every_row_of_the_op_table_has_a_parity_case():
    """Every op of the table with a public function (not Internal) is drawn here, or its public
    function is named in ELSEWHERE."""
    cased = {c.op for c in CASES}
    rows = [r for r in lr._C._debug.op_table() if r["api"] != "Internal"]
    assert len(rows) >= 60
    missing = [r["name"] for r in rows if ROW_FUNCTION.get(r["name"], r["name"]) not in cased | set(ELSEWHERE)]
    assert not missing, f"rows of lazyrt/ops.def without a parity case: {missing}"


@pytest.mark.parametrize("case", [c for c in CASES if not c.grad and not c.refused
                                  and any(d and d.is_floating_point for d in c.dtypes)],
                         ids=lambda c: c.id)
def test_cases_without_gradient_check_are_not_differentiable(case, rng):
    """A case left out of the gradient check must be one torch does not differentiate, and
    lazyrt must not record a gradient for it either."""
    inputs = make_inputs(case, rng, lr.float64, requires_grad=True)
    got, expect = run(case, inputs)
    outs = expect if isinstance(expect, (tuple, list)) else [expect]
    assert not any(o.requires_grad for o in outs), f"{case.id}: torch differentiates it: check its gradient"
    gots = got if isinstance(got, (tuple, list)) else [got]
    assert not any(g.requires_grad for g in gots), f"{case.id}: lazyrt records a gradient torch does not"


def test_every_op_with_floating_inputs_has_a_gradient_case():
    """With the test above, every op torch differentiates is gradient-checked: its cases with
    floating inputs are checked, or shown not differentiable. Ops that take no floating input
    at all are named here."""
    floating = {c.op for c in CASES if any(d and d.is_floating_point for d in c.dtypes)}
    assert {c.op for c in CASES} - floating == {"one_hot"}  # indices in, int64 out
    ungraded = {c.op for c in CASES} - {c.op for c in CASES if c.grad}
    assert ungraded == {"isnan", "isinf", "isfinite", "logical_not", "eq", "ne", "lt", "le", "gt", "ge",
                        "logical_and", "logical_or", "argmax", "argmin", "argsort", "all", "any", "one_hot", "zeros", "ones",
                        "zeros_like", "ones_like", "full", "full_like", "scalar_tensor", "arange"}


# ---- random ops: PyTorch's generator differs, so shapes, dtypes and distributions -----------

def test_random_ops_draw_their_distribution():
    lr.manual_seed(7)
    a = lr.rand(20000, dtype=lr.float64)
    lr.manual_seed(7)
    assert np.array_equal(lr.rand(20000, dtype=lr.float64).numpy(), a.numpy()), "manual_seed repeats the draws"
    seed, offset = lr.random_state()
    assert isinstance(seed, lr.Tensor) and isinstance(offset, lr.Tensor)
    u = a.numpy()
    assert a.dtype is lr.float64 and u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    n = lr.randn(4, 5000).numpy()
    assert n.shape == (4, 5000) and abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    r = lr.randint(3, 7, (20000,), dtype=lr.int32)
    assert r.dtype is lr.int32
    assert np.array_equal(np.unique(r.numpy()), [3, 4, 5, 6])
    assert lr.randint(5, (2, 3)).dtype is lr.int64 and lr.randint(5, (2, 3)).shape == (2, 3)
    b = lr.bernoulli((20000,), 0.3, dtype=lr.float64).numpy()
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.02
    p = lr.bernoulli(lr.full((20000,), 0.8)).numpy()
    assert abs(p.mean() - 0.8) < 0.02
    m = lr.dropout_mask((20000,), 0.25).numpy()
    assert set(np.unique(m)) <= {0.0, np.float32(1 / 0.75)} and abs((m == 0).mean() - 0.25) < 0.02
    x = lr.tensor(random_array(np.random.default_rng(0), (100, 50), lr.float64), requires_grad=True)
    y = lr.dropout(x, 0.5)
    y.sum().backward()
    # The gradient of dropout is its mask: 2 where kept, 0 where dropped.
    kept = y.numpy() != 0
    assert np.array_equal(x.grad.numpy(), np.where(kept, 2.0, 0.0))
    assert 0.4 < kept.mean() < 0.6


def test_multinomial_draws_by_the_weights():
    lr.manual_seed(0)
    weights = lr.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]])
    draws = lr.multinomial(weights, 20000, replacement=True).numpy()
    assert draws.shape == (2, 20000) and draws.dtype == np.int64
    for row, w in zip(draws, weights.numpy()):
        freq = np.bincount(row, minlength=4) / row.size
        p = w / w.sum()
        assert freq[p == 0].sum() == 0, "a zero weight is never drawn"
        # 5 standard deviations of a frequency estimate from 20000 draws.
        assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / row.size) + 1e-12), (freq, p)


def test_multinomial_without_replacement_draws_distinct_categories():
    lr.manual_seed(1)
    w = lr.tensor([5.0, 1.0, 0.0, 3.0, 1.0])
    firsts = []
    for _ in range(4):
        d = lr.multinomial(w.unsqueeze(0).expand(500, 5), 3).numpy()
        assert all(len(set(r)) == 3 and 2 not in r for r in d), "distinct, never the zero weight"
        firsts.append(d[:, 0])
    first = np.concatenate(firsts)
    # The first draw of each row is a draw by the weights.
    freq = np.bincount(first, minlength=5) / first.size
    p = w.numpy() / w.numpy().sum()
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / first.size) + 1e-12), (freq, p)
    with pytest.raises(lr.Error, match="cannot draw 6 samples without replacement from 5 categories"):
        lr.multinomial(w, 6)
