"""More of torch's functions, as compositions of lazyrt's ops (lazyrt exports them all).

A name that the extension itself provides is not exported from here: the native op wins.
Integer dtypes follow PyTorch exactly (floor_divide rounds toward -inf, remainder takes the
divisor's sign, fmod the dividend's); division of integers by zero is not checked (PyTorch
raises). Floating fmod / remainder / floor_divide agree with PyTorch up to rounding.
"""

import builtins
import math
import numbers

import numpy as np

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt._tensor import _check_device, _new_shape, _select, _square, _unbind, tensor

_NAMES = [
    "square", "clip", "unbind", "select", "outer", "dot", "mv", "log2", "log10", "exp2", "tan", "trunc",
    "frac", "fmod", "remainder", "floor_divide", "logical_xor", "hypot", "logaddexp", "isclose", "allclose",
    "equal", "count_nonzero", "diff", "eye", "empty", "empty_like", "rand_like", "randn_like", "linspace", "diag",
    "trace", "broadcast_tensors", "is_tensor", "numel",
]

_INTEGRAL = (_C.int32, _C.int64)


def _tensor_arg(x, call, what="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{call}(): argument '{what}' must be a lazyrt.Tensor, not {type(x).__name__}")
    return x


def _floating(x):
    """x itself when floating, else as float32 (PyTorch's default dtype for int and bool inputs)."""
    return x if x.is_floating_point() else _C.cast(x, _C.float32)


def _is_integral(x):
    if isinstance(x, Tensor):
        return x.dtype in _INTEGRAL or x.dtype is _C.bool
    return isinstance(x, numbers.Integral)


def _operands(a, b, call):
    """a and b as tensors (one of them may be a Python number), for the binary functions."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"{call}(): expected at least one lazyrt.Tensor, got {type(a).__name__} and "
                        f"{type(b).__name__}")
    if not isinstance(a, Tensor):
        a = _C.full_like(b, a, dtype=_scalar_dtype(a, b))
    elif not isinstance(b, Tensor):
        b = _C.full_like(a, b, dtype=_scalar_dtype(b, a))
    return a, b


def _scalar_dtype(number, other):
    # A Python number takes the tensor's dtype unless it is of a higher kind (PyTorch's rule).
    if isinstance(number, bool):
        return other.dtype
    if isinstance(number, numbers.Integral):
        return other.dtype if other.dtype is not _C.bool else _C.int64
    return other.dtype if other.is_floating_point() else _C.float32


# ---- aliases and slicing -------------------------------------------------------------------

def square(input):
    """input * input."""
    return _square(_tensor_arg(input, "square"))


def clip(input, min=None, max=None):
    """An alias of clamp."""
    return _C.clamp(input, min, max)


def unbind(input, dim=0):
    """The slices of input along dim, that dim removed, as a tuple."""
    return _unbind(_tensor_arg(input, "unbind"), dim)


def select(input, dim, index):
    """The slice of input at index along dim, that dim removed."""
    return _select(_tensor_arg(input, "select"), dim, index)


def numel(input):
    """The number of elements of input."""
    return _tensor_arg(input, "numel").numel()


def is_tensor(obj):
    """Whether obj is a lazyrt tensor."""
    return isinstance(obj, Tensor)


# ---- products ------------------------------------------------------------------------------

def _vector(x, call, what):
    if _tensor_arg(x, call, what).dim() != 1:
        raise _C.Error(f"{call}: {what} must be 1-D, got shape {tuple(x.shape)}")
    return x


def outer(input, vec2):
    """input[i] * vec2[j], of two 1-D tensors."""
    _vector(input, "outer", "input")
    _vector(vec2, "outer", "vec2")
    return _C.unsqueeze(input, 1) * _C.unsqueeze(vec2, 0)


def dot(input, other):
    """sum(input * other) of two 1-D tensors of the same length and dtype."""
    _vector(input, "dot", "input")
    _vector(other, "dot", "other")
    if input.dtype is not other.dtype:
        raise _C.Error(f"dot: expected both vectors to have same dtype, but found {input.dtype} and {other.dtype}")
    if input.shape[0] != other.shape[0]:
        raise _C.Error(f"dot: inconsistent tensor size, expected tensor [{input.shape[0]}] and src "
                       f"[{other.shape[0]}] to have the same number of elements, but got {input.shape[0]} and "
                       f"{other.shape[0]} elements respectively")
    # sum widens integers to int64; the product of two vectors keeps their dtype, as in PyTorch.
    return _C.cast(_C.sum(input * other), input.dtype)


def mv(input, vec):
    """The matrix input [n, m] times the vector vec [m]."""
    if _tensor_arg(input, "mv").dim() != 2:
        raise _C.Error(f"mv: input must be a matrix, got shape {tuple(input.shape)}")
    _vector(vec, "mv", "vec")
    if input.shape[1] != vec.shape[0]:
        raise _C.Error(f"mv: size mismatch, got input ({input.shape[0]}x{input.shape[1]}) and vec "
                       f"({vec.shape[0]})")
    return _C.matmul(input, vec)


def trace(input):
    """The sum of the main diagonal of a matrix (integers sum to int64, as in PyTorch)."""
    if _tensor_arg(input, "trace").dim() != 2:
        raise _C.Error(f"trace: expected a matrix, got shape {tuple(input.shape)}")
    return _C.sum(diag(input))


# ---- elementwise math ----------------------------------------------------------------------

def log2(input):
    """log(x) / log(2)."""
    return _C.log(_floating(input)) * (1 / math.log(2))


def log10(input):
    """log(x) / log(10)."""
    return _C.log(_floating(input)) * (1 / math.log(10))


def exp2(input):
    """2 ** x."""
    return _C.pow(2.0, _floating(input))


def tan(input):
    """sin(x) / cos(x)."""
    x = _floating(input)
    return _C.sin(x) / _C.cos(x)


def trunc(input):
    """x rounded toward zero (integers unchanged)."""
    if _is_integral(input):
        return input
    return _C.where(input < 0, _C.ceil(input), _C.floor(input))


def frac(input):
    """x - trunc(x)."""
    return input - trunc(input)


def _int_floor_divmod(a, b):
    """Exact floor quotient and remainder of integers. The quotient from float64 can be off by
    many units for large int64 values; the remainder it leaves is small, so a second float64
    step on it is off by at most one, which the last step corrects (the remainder then left
    [0, b) or (b, 0])."""
    dtype = _C.promote_types(a.dtype, b.dtype)
    a, b = _C.cast(a, dtype), _C.cast(b, dtype)
    bf = _C.cast(b, _C.float64)
    q = _C.cast(_C.floor(_C.cast(a, _C.float64) / bf), dtype)
    r = a - q * b
    q = q + _C.cast(_C.floor(_C.cast(r, _C.float64) / bf), dtype)
    r = a - q * b
    over = _C.where(b > 0, r >= b, r <= b)  # quotient one too small
    under = _C.where(b > 0, r < 0, r > 0)   # quotient one too large
    q = _C.where(over, q + 1, _C.where(under, q - 1, q))
    return q, a - q * b


def floor_divide(input, other):
    """input / other rounded toward -inf (PyTorch 1.13's floor_divide)."""
    a, b = _operands(input, other, "floor_divide")
    if _is_integral(a) and _is_integral(b):
        return _int_floor_divmod(a, b)[0]
    q = _C.floor(a / b)
    # Correct by one where a / b rounded onto the wrong side of an integer.
    r = a - q * b
    return _C.where((b > 0) & (r < 0) | (b < 0) & (r > 0), q - 1, q)


def remainder(input, other):
    """input - floor(input / other) * other: the sign of the divisor (Python's %)."""
    a, b = _operands(input, other, "remainder")
    if _is_integral(a) and _is_integral(b):
        return _int_floor_divmod(a, b)[1]
    r = fmod(a, b)
    return _C.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def fmod(input, other):
    """input - trunc(input / other) * other: the sign of the dividend (C's fmod)."""
    a, b = _operands(input, other, "fmod")
    if _is_integral(a) and _is_integral(b):
        q, r = _int_floor_divmod(a, b)
        return _C.where((r != 0) & ((r < 0) != (a < 0)), r - b, r)
    r = a - trunc(a / b) * b
    # A quotient rounded onto the wrong side of an integer leaves |r| >= |b| or the wrong sign.
    r = _C.where((r != 0) & ((r < 0) != (a < 0)), r + _C.where((a < 0) == (b < 0), b, -b), r)
    return r


def logical_xor(input, other):
    """Whether exactly one of input and other is nonzero."""
    a, b = _operands(input, other, "logical_xor")
    return _C.ne(_C.ne(a, 0), _C.ne(b, 0))


def hypot(input, other):
    """sqrt(input^2 + other^2)."""
    a, b = _operands(input, other, "hypot")
    return _C.sqrt(a * a + b * b)


def logaddexp(input, other):
    """log(exp(input) + exp(other)), as max + log1p(exp(-|input - other|)), which does not
    overflow; equal infinities give themselves."""
    a, b = _operands(input, other, "logaddexp")
    a, b = _floating(a), _floating(b)
    same = a == b
    d = _C.where(same, 0, a - b)
    return _C.maximum(a, b) + _C.log1p(_C.exp(-_C.abs(d)))


# ---- comparisons ---------------------------------------------------------------------------

def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|input - other| <= atol + rtol * |other| elementwise (equal values, infinities included,
    are close; NaNs are close to each other only with equal_nan)."""
    _tensor_arg(input, "isclose")
    _tensor_arg(other, "isclose", "other")
    if input.dtype is not other.dtype:
        raise _C.Error(f"isclose: {input.dtype} did not match {other.dtype}")
    if rtol < 0 or atol < 0:
        raise _C.Error(f"isclose: rtol and atol must be non-negative, got rtol={rtol} and atol={atol}")
    close = input == other
    if equal_nan and input.is_floating_point():
        close = close | (_C.isnan(input) & _C.isnan(other))
    if rtol == 0 and atol == 0:
        return close
    if input.dtype is _C.bool:
        return close
    a, b = (input, other) if input.is_floating_point() else (_C.cast(input, _C.float64), _C.cast(other, _C.float64))
    actual = _C.abs(a - b)
    allowed = atol + _C.abs(b * rtol)
    return close | (_C.isfinite(actual) & (actual <= allowed))


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether all of isclose(...) holds (a Python bool; reads the values)."""
    return builtins.bool(_C.all(isclose(input, other, rtol, atol, equal_nan)).item())


def equal(input, other):
    """Whether input and other have the same shape and the same values (a Python bool)."""
    _tensor_arg(input, "equal")
    _tensor_arg(other, "equal", "other")
    if tuple(input.shape) != tuple(other.shape):
        return False
    return builtins.bool(_C.all(input == other).item())


def count_nonzero(input, dim=None):
    """The number of nonzero values (along dim), as int64."""
    return _C.sum(_C.ne(_tensor_arg(input, "count_nonzero"), 0), dim)


# ---- differences ---------------------------------------------------------------------------

def diff(input, n=1, dim=-1, prepend=None, append=None):
    """The n-th forward difference along dim (for bool, whether neighbours differ), with
    prepend / append concatenated first."""
    _tensor_arg(input, "diff")
    if input.dim() == 0:
        raise _C.Error("diff: expects input to be at least one-dimensional")
    if n < 0:
        raise _C.Error(f"diff: order must be non-negative but got {n}")
    parts = [p for p in (prepend, input, append) if p is not None]
    x = _C.cat(parts, dim) if len(parts) > 1 else input
    d = dim + x.dim() if dim < 0 else dim
    for _ in range(n):
        length = x.shape[d]
        if length == 0:
            break
        hi, lo = _C.narrow(x, d, 1, length - 1), _C.narrow(x, d, 0, length - 1)
        x = _C.ne(hi, lo) if x.dtype is _C.bool else hi - lo
    return x


# ---- factories -----------------------------------------------------------------------------

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


def diag(input, diagonal=0):
    """A 1-D input -> the square matrix with it on the given diagonal; a matrix -> its given
    diagonal (1-D)."""
    _tensor_arg(input, "diag")
    k = diagonal
    if input.dim() == 1:
        n = input.shape[0]
        size = n + builtins.abs(k)
        rows = _C.unsqueeze(_C._arange(size, _C.int64), 1)
        cols = _C.unsqueeze(_C._arange(size, _C.int64), 0)
        on = _C.eq(cols - rows, k)
        # The vector padded to the matrix's size, laid along the rows (k >= 0) or the columns.
        v = _C.pad(input, [0, builtins.abs(k)])
        v = _C.unsqueeze(v, 1) if k >= 0 else _C.unsqueeze(v, 0)
        return _C.where(on, v, _C.zeros((), dtype=input.dtype))
    if input.dim() == 2:
        r, c = input.shape
        length = builtins.max(0, builtins.min(r, c - k) if k >= 0 else builtins.min(r + k, c))
        i = _C._arange(length, _C.int64)
        flat = (i - builtins.min(k, 0)) * c + (i + builtins.max(k, 0))
        return _C.index_select(_C.reshape(input, (r * c,)), 0, flat)
    raise _C.Error(f"diag: expected a 1-D or 2-D input, got shape {tuple(input.shape)}")


def broadcast_tensors(*tensors):
    """The tensors broadcast to their common shape, as a tuple."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    for t in tensors:
        _tensor_arg(t, "broadcast_tensors", "tensors")
    shape = ()
    for t in tensors:
        s = tuple(t.shape)
        width = builtins.max(len(shape), len(s))
        a, b = (1,) * (width - len(shape)) + shape, (1,) * (width - len(s)) + s
        out = []
        for x, y in zip(a, b):
            if x != y and 1 not in (x, y):
                raise _C.Error(f"broadcast_tensors: shapes {[tuple(t.shape) for t in tensors]} cannot be broadcast "
                               "together")
            out.append(y if x == 1 else x)
        shape = tuple(out)
    return tuple(_C.broadcast_to(t, shape) for t in tensors)


# Names the extension already provides stay the extension's.
__all__ = [name for name in _NAMES if not hasattr(_C, name)]
