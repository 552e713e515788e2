"""More of torch's factories, as compositions of lazyrt's ops (device= takes lazyrt's device, or
'cpu', as in lazyrt.zeros)."""

import builtins
import numbers

import numpy as np

from lazyrt import _C
from lazyrt._args import _INTEGRAL, _tensor_arg
from lazyrt._tensor import _check_device, _new_shape, tensor

__all__ = ["eye", "empty", "empty_like", "rand_like", "randn_like", "linspace"]


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False):
    """The n x m identity (m = n by default), float32 unless dtype is given."""
    _check_device(device, "eye")
    m = n if m is None else m
    if n < 0 or m < 0:
        raise _C.Error(f"eye: n and m must be non-negative, got {n} and {m}")
    ones = _C.eq(_C.unsqueeze(_C._arange(n, _C.int64), 1), _C.unsqueeze(_C._arange(m, _C.int64), 0))
    out = _C.cast(ones, dtype or _C.float32)
    if requires_grad:
        out.requires_grad_()
    return out


def empty(*size, dtype=None, device=None, requires_grad=False, **kwargs):
    """A new tensor of `size`. lazyrt has no uninitialized memory: it holds zeros."""
    _check_device(device, "empty")
    return _C.zeros(_new_shape(size, "empty"), dtype=dtype, requires_grad=requires_grad)


def empty_like(input, *, dtype=None, device=None, requires_grad=False, **kwargs):
    """A new tensor of input's shape (and dtype unless given). It holds zeros."""
    _check_device(device, "empty_like")
    return _C.zeros_like(input, dtype=dtype, requires_grad=requires_grad)


def _random_like(input, draw, call, dtype, requires_grad):
    dtype = dtype or _tensor_arg(input, call).dtype
    if dtype not in (_C.float32, _C.float64, _C.float16, _C.bfloat16):
        raise _C.Error(f"{call}: expects a floating-point dtype, got {dtype}")
    return draw(tuple(input.shape), dtype=dtype, requires_grad=requires_grad)


def rand_like(input, *, dtype=None, device=None, requires_grad=False, **kwargs):
    """Uniform values in [0, 1) of input's shape (and dtype unless given)."""
    _check_device(device, "rand_like")
    return _random_like(input, _C.rand, "rand_like", dtype, requires_grad)


def randn_like(input, *, dtype=None, device=None, requires_grad=False, **kwargs):
    """Standard normal values of input's shape (and dtype unless given)."""
    _check_device(device, "randn_like")
    return _random_like(input, _C.randn, "randn_like", dtype, requires_grad)


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    """steps values evenly from start to end, inclusive, float32 unless dtype is given. As
    PyTorch computes them: start + i * step for the first half, end - (steps - 1 - i) * step
    for the rest, in the result's dtype (integers from the float64 values, truncated)."""
    _check_device(device, "linspace")
    if isinstance(steps, builtins.bool) or not isinstance(steps, numbers.Integral):
        raise TypeError(f"linspace(): argument 'steps' must be int, not {type(steps).__name__}")
    if steps < 0:
        raise _C.Error(f"linspace: number of steps must be non-negative, got {steps}")
    dtype = dtype or _C.float32
    work = np.float32 if dtype in (_C.float32, _C.float16, _C.bfloat16) else np.float64
    i = np.arange(steps)
    if steps == 1:
        values = np.array([start], dtype=work)
    else:
        s, e = work(start), work(end)
        step = (e - s) / work(steps - 1)
        values = np.where(i < steps // 2, s + step * i.astype(work),
                          e - step * (steps - 1 - i).astype(work)).astype(work)
    if dtype in _INTEGRAL:
        values = np.trunc(values.astype(np.float64)).astype(np.int64)
    return tensor(values, dtype=dtype, requires_grad=requires_grad)
