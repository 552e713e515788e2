"""More of torch's functions, as compositions of lazyrt's ops (lazyrt exports them all).

A name that the extension itself provides is not exported from here: the native op wins.
Integer dtypes follow PyTorch exactly (floor_divide rounds toward -inf, remainder takes the
divisor's sign, fmod the dividend's); division of integers by zero is not checked (PyTorch
raises). Floating fmod / remainder / floor_divide agree with PyTorch up to rounding.

Functions whose result's shape depends on values (nonzero, argwhere, masked_select, unique,
repeat_interleave with a tensor of repeats) read those values on the host: a pending tensor is
computed for it (a sync, counted as DynamicShapeSync, as boolean-mask indexing counts it), and
a compiled step refuses them while traced. save / load pickle; they do not read PyTorch's
files. Index results on ties follow PyTorch where it defines them (cummax / cummin, mode);
kthvalue's and median's tie indices come from a stable sort (PyTorch's from its selection
algorithm).
"""

import builtins
import collections
import math
import numbers
import os
import pickle

import numpy as np

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt._tensor import _check_device, _dim_index, _new_shape, _select, _square, _unbind, tensor

_NAMES = [
    "square", "clip", "unbind", "select", "outer", "dot", "mv", "log2", "log10", "exp2", "tan", "trunc",
    "frac", "fmod", "remainder", "floor_divide", "logical_xor", "hypot", "logaddexp", "isclose", "allclose",
    "equal", "count_nonzero", "diff", "eye", "empty", "empty_like", "rand_like", "randn_like", "linspace", "diag",
    "trace", "broadcast_tensors", "is_tensor", "numel",
    # sorting, selection and scans
    "cummax", "cummin", "searchsorted", "bucketize", "kthvalue", "median", "nanmedian", "quantile", "nanquantile",
    "mode",
    # reshaping and distances
    "repeat_interleave", "rot90", "fliplr", "flipud", "cdist", "erfinv",
    # results whose shape depends on the values (read on the host)
    "nonzero", "argwhere", "masked_select", "unique",
    # serialization
    "save", "load",
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


# ---- (values, indices) results -------------------------------------------------------------
# Named tuples as torch.return_types: r.values, r.indices, or unpacked. Each type is a module
# attribute (_return_type_<name>), so results pickle.

def _return_type(name):
    attr = f"_return_type_{name}"
    cls = globals().get(attr)
    if cls is None:
        cls = collections.namedtuple(name, ["values", "indices"])
        cls.__module__, cls.__qualname__ = __name__, attr
        globals()[attr] = cls
    return cls


def _values_indices(name, values, indices):
    return _return_type(name)(values, indices)


def _along(input, dim, call):
    """(x, d, scalar): input as a tensor of at least one dim, dim in range, and whether the
    input was 0-d (then the results lose the added dim again)."""
    _tensor_arg(input, call)
    d = _dim_index(dim, input.dim(), f"{call}()")
    if input.dim() == 0:
        return _C.unsqueeze(input, 0), 0, True
    return input, d, False


def _positions(n, d, ndim):
    """0, 1, ..., n - 1 (int64) along dim d of an ndim-dim tensor (size 1 in the other dims)."""
    shape = [1] * ndim
    shape[d] = n
    return _C.reshape(_C._arange(n, _C.int64), shape)


def _to_last(x, d):
    """x with dim d moved last."""
    if d == x.dim() - 1:
        return x
    return _C.permute(x, [i for i in range(x.dim()) if i != d] + [d])


def _from_last(x, d):
    """The inverse of _to_last: the last dim of x moved back to d."""
    last = x.dim() - 1
    if d == last:
        return x
    order = list(range(last))
    order.insert(d, last)
    return _C.permute(x, order)


def _key(x):
    """x's values, unrecorded, in a dtype the comparisons take (bool as int32)."""
    x = x.detach()
    return _C.cast(x, _C.int32) if x.dtype is _C.bool else x


def _finish(name, x, d, index, keepdim, scalar):
    """(x's values at index along d, index): index keeps d (size 1) and is reduced unless keepdim.
    The values are gathered from x, so the gradient reaches the chosen elements only."""
    values = _C.gather(x, d, index)
    if scalar or not keepdim:
        values, index = _C.squeeze(values, d), _C.squeeze(index, d)
    return _values_indices(name, values, index)


# ---- scans ---------------------------------------------------------------------------------

def _cumulative_extreme(input, dim, call, largest):
    x, d, scalar = _along(input, dim, call)
    n = x.shape[d]
    pos = _C.broadcast_to(_positions(n, d, x.dim()), tuple(x.shape))
    best, best_at = _key(x), pos
    floating = best.is_floating_point()
    # A doubling scan over (value, position), NaN above everything: after the step of width s,
    # each element holds the best of the s elements ending at it. A candidate from earlier
    # wins only when strictly better, so ties go to the later position, as PyTorch's do.
    step = 1
    while step < n:
        earlier = _C.cat([_C.narrow(best, d, 0, step), _C.narrow(best, d, 0, n - step)], d)
        earlier_at = _C.cat([_C.narrow(best_at, d, 0, step), _C.narrow(best_at, d, 0, n - step)], d)
        wins = earlier > best if largest else earlier < best
        if floating:
            wins = wins | (_C.isnan(earlier) & _C.logical_not(_C.isnan(best)))
        wins = wins & (pos >= step)
        best, best_at = _C.where(wins, earlier, best), _C.where(wins, earlier_at, best_at)
        step *= 2
    values = _C.gather(x, d, best_at)
    if scalar:
        values, best_at = _C.squeeze(values, 0), _C.squeeze(best_at, 0)
    return _values_indices(call, values, best_at)


def cummax(input, dim):
    """(values, indices): the running maximum along dim and where it was taken. As PyTorch: on
    ties the latest position, NaN is larger than everything (the latest NaN). O(n log n) work
    (a doubling scan); the gradient reaches the chosen elements."""
    return _cumulative_extreme(input, dim, "cummax", True)


def cummin(input, dim):
    """(values, indices): the running minimum along dim and where it was taken. As PyTorch: on
    ties the latest position, NaN wins over everything (the latest NaN)."""
    return _cumulative_extreme(input, dim, "cummin", False)


# ---- searching sorted values -----------------------------------------------------------------

def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None, out=None):
    """Where input's values would be inserted into sorted_sequence (sorted along its last dim)
    to keep it sorted: the first such position (right=False, side='left') or the last. A 1-D
    sequence serves every value; an N-D one must share input's leading dims. input may be a
    Python number (a 0-d result). sorter: int64 indices that sort the sequence. int64 result,
    int32 with out_int32. Computed by comparing each value with the whole row (O(m n) work
    and memory, no loop), which matches PyTorch's binary search, NaN values included (they go
    last); a sequence holding NaN is not sorted and its results may differ."""
    call = "torch.searchsorted()"
    if out is not None:
        raise _C.Error("searchsorted: out= is not supported (use the returned tensor)")
    _tensor_arg(sorted_sequence, "searchsorted", "sorted_sequence")
    if side is not None:
        if side not in ("left", "right"):
            raise _C.Error(f"{call}: side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise _C.Error(f"{call}: side and right can't be set to opposites, got side of left while right was True")
        right = side == "right"
    seq = sorted_sequence
    if seq.dim() == 0:
        raise _C.Error(f"{call}: boundaries tensor should have at least 1 dimension, got a 0-d tensor")
    if sorter is not None:
        _tensor_arg(sorter, "searchsorted", "sorter")
        if sorter.dtype is not _C.int64 or tuple(sorter.shape) != tuple(seq.shape):
            raise _C.Error(f"{call}: sorter must be an int64 tensor of the boundaries' shape {tuple(seq.shape)}, got "
                           f"{sorter.dtype}{tuple(sorter.shape)}")
        seq = _C.gather(seq, -1, sorter)
    if not isinstance(input, Tensor):
        if seq.dim() != 1:
            raise _C.Error(f"{call}: input value can be a scalar only when boundaries tensor dimension is 1, but we "
                           f"got boundaries tensor dim({seq.dim()}) and input value's dim(0) numel(1)")
        values = _C.scalar_tensor(input, dtype=_scalar_dtype(input, seq))
    else:
        values = input
    seq, values = seq.detach(), values.detach()
    if seq.dim() == 1:
        rows, vals = seq, _C.unsqueeze(values, -1)
    else:
        if values.dim() != seq.dim() or tuple(values.shape[:-1]) != tuple(seq.shape[:-1]):
            raise _C.Error(f"{call}: boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries "
                           f"tensor and input value tensor must match, but we got boundaries tensor "
                           f"{list(seq.shape)} and input value tensor {list(values.shape)}")
        rows, vals = _C.unsqueeze(seq, -2), _C.unsqueeze(values, -1)
    # Left: the count of entries not >= the value; right: not > (NaN values count everything).
    before = _C.logical_not(rows > vals if right else rows >= vals)
    count = _C.sum(before, -1)
    return _C.cast(count, _C.int32) if out_int32 else count


def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    """The bucket index of each value of input among the 1-D sorted boundaries (PyTorch's
    rule: right=False gives i with boundaries[i-1] < x <= boundaries[i]); searchsorted with
    the arguments swapped."""
    _tensor_arg(boundaries, "bucketize", "boundaries")
    if boundaries.dim() != 1:
        raise _C.Error(f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right, out=out)


# ---- order statistics ------------------------------------------------------------------------

def kthvalue(input, k, dim=-1, keepdim=False):
    """(values, indices): the k-th smallest value along dim (k from 1) and its position; NaN is
    larger than everything. On ties PyTorch's index depends on its selection algorithm;
    lazyrt's is the k-th in a stable sort (one of the tied positions, maybe another one)."""
    x, d, scalar = _along(input, dim, "kthvalue")
    n = x.shape[d]
    if isinstance(k, builtins.bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"kthvalue(): argument 'k' must be int, not {type(k).__name__}")
    if not 1 <= k <= n:
        raise _C.Error(f"kthvalue(): selected number k out of range for dimension {d}")
    order = _C.argsort(_key(x), d, stable=True)
    return _finish("kthvalue", x, d, _C.narrow(order, d, k - 1, 1), keepdim, scalar)


def _median_index(x, d, ignore_nan, call):
    """Where the lower median of x along d is (int64, d kept with size 1)."""
    n = x.shape[d]
    if n == 0:
        raise IndexError(f"{call}(): Expected reduction dim {d} to have non-zero size.")
    key = _key(x)
    order = _C.argsort(key, d, stable=True)  # NaN last, in their order
    if not key.is_floating_point():
        return _C.narrow(order, d, (n - 1) // 2, 1)
    valid = _C.sum(_C.logical_not(_C.isnan(key)), d, True)
    if ignore_nan:
        # The lower median of the non-NaN values (a row of NaN only gives its first NaN).
        pos = _C.clamp_min(floor_divide(valid - 1, 2), 0)
    else:
        # A row holding NaN gives NaN: its first NaN, which follows the valid values.
        pos = _C.where(valid < n, valid, (n - 1) // 2)
    return _C.gather(order, d, pos)


def _median(input, dim, keepdim, ignore_nan, call):
    _tensor_arg(input, call)
    if dim is None:
        x = _C.reshape(input, (-1,))
        if x.shape[0] == 0:
            if not x.is_floating_point():
                raise _C.Error(f"{call}(): an empty input has no median")
            return _C.full((), math.nan, dtype=x.dtype)
        return _C.squeeze(_C.gather(x, 0, _median_index(x, 0, ignore_nan, call)), 0)
    x, d, scalar = _along(input, dim, call)
    return _finish(call, x, d, _median_index(x, d, ignore_nan, call), keepdim, scalar)


def median(input, dim=None, keepdim=False):
    """Without dim: the lower median of all values (the smaller middle one of an even count), NaN
    when any value is NaN, NaN for an empty input. With dim: (values, indices) along dim; a
    row holding NaN gives NaN and the position of its first NaN. On ties PyTorch's index
    depends on its selection algorithm; lazyrt's is the median's position in a stable sort.
    The gradient reaches the chosen element."""
    return _median(input, dim, keepdim, False, "median")


def nanmedian(input, dim=None, keepdim=False):
    """median ignoring NaN: the lower median of the non-NaN values (NaN, at the first position,
    for a row of NaN only)."""
    return _median(input, dim, keepdim, True, "nanmedian")


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(input, q, dim, keepdim, interpolation, ignore_nan, call):
    _tensor_arg(input, call)
    if input.dtype not in (_C.float32, _C.float64):
        raise _C.Error(f"{call}() input tensor must be either float or double dtype")
    if interpolation not in _INTERPOLATIONS:
        raise _C.Error(f"{call}() interpolation must be one of linear, lower, higher, midpoint or nearest, but got "
                       f"{interpolation}")
    if isinstance(q, Tensor):
        if q.dim() > 1:
            raise _C.Error(f"{call}() q must be a scalar or 1D tensor")
        if q.dtype is not input.dtype:
            raise _C.Error(f"{call}() q tensor must be same dtype as the input tensor")
        if not q.is_pending():  # device data: checked without a sync, as PyTorch checks it
            values = q.numpy()
            if not np.all((values >= 0) & (values <= 1)):
                raise _C.Error(f"{call}() q values must be in the range [0, 1]")
        one_q, qs = q.dim() == 0, _C.reshape(q.detach(), (-1,))
    else:
        if not 0 <= q <= 1:
            raise _C.Error(f"{call}() q must be in the range [0, 1] but got {q}")
        one_q, qs = True, _C.full((1,), float(q), dtype=input.dtype)
    if input.numel() == 0:
        raise _C.Error(f"{call}() input tensor must be non-empty")
    if dim is None:
        x, d = _C.reshape(input, (-1,)), 0
    else:
        x, d, _ = _along(input, dim, call)
    x = _to_last(x, d)
    n = x.shape[-1]
    s = _C.gather(x, -1, _C.argsort(x.detach(), -1, stable=True))  # sorted, NaN last
    nan = _C.isnan(s.detach())
    if ignore_nan:
        count = _C.cast(_C.sum(_C.logical_not(nan), -1, True), x.dtype)
        rank = _C.clamp_min(qs * (count - 1), 0)
    else:
        rank = _C.where(_C.any(nan, -1, True), float(n - 1), qs * (n - 1))
    if interpolation in ("lower", "higher", "nearest"):
        pick = {"lower": _C.floor, "higher": _C.ceil, "nearest": _C.round}[interpolation]
        out = _C.gather(s, -1, _C.cast(pick(rank), _C.int64))
    else:
        below = _C.floor(rank)
        low = _C.gather(s, -1, _C.cast(below, _C.int64))
        high = _C.gather(s, -1, _C.cast(_C.ceil(rank), _C.int64))
        out = _C.lerp(low, high, 0.5 if interpolation == "midpoint" else rank - below)
    out = _from_last(out, 0)  # the quantiles first
    if keepdim:
        if dim is None:
            out = _C.reshape(out, (out.shape[0],) + (1,) * input.dim())
        elif input.dim() > 0:
            out = _C.unsqueeze(out, d + 1)
    return _C.squeeze(out, 0) if one_q else out


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """The q-th quantiles (q a number or a 1-D tensor in [0, 1], which then leads the result's
    dims) of input's values (dim=None) or along dim, with PyTorch's interpolations between the
    sorted values at floor and ceil of q * (n - 1): linear, lower, higher, midpoint, nearest
    (half to even). A row holding NaN gives NaN. float32 / float64 only, q of input's dtype. A
    pending q tensor is not range-checked (reading it would sync). The gradient reaches the
    sorted values used."""
    return _quantile(input, q, dim, keepdim, interpolation, False, "quantile")


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """quantile ignoring NaN (a row of NaN only gives NaN)."""
    return _quantile(input, q, dim, keepdim, interpolation, True, "nanquantile")


def mode(input, dim=-1, keepdim=False):
    """(values, indices): the most frequent value along dim (the smallest of equally frequent
    ones) and its last position, as PyTorch. Sorts, then counts the runs (no loop). NaN are
    all distinct here (PyTorch counts them as equal)."""
    x, d, scalar = _along(input, dim, "mode")
    if x.shape[d] == 0:
        raise IndexError(f"mode(): Expected reduction dim {d} to have non-zero size.")
    key = _to_last(_key(x), d)
    order = _C.argsort(key, -1, stable=True)
    s = _C.gather(key, -1, order)
    n = s.shape[-1]
    starts = _C.cat([_C.ones(tuple(s.shape[:-1]) + (1,), dtype=_C.bool),
                     _C.ne(_C.narrow(s, -1, 1, n - 1), _C.narrow(s, -1, 0, n - 1))], -1)
    run = _C.cumsum(_C.cast(starts, _C.int64), -1) - 1           # run number of each sorted value
    ones = _C.ones_like(run)
    length = _C.gather(_C.scatter_add(_C.zeros_like(run), -1, run, ones), -1, run)
    first = _C.argmax(length, -1, True)                          # the first of the smallest longest run
    last = first + _C.gather(length, -1, first) - 1              # its last, the latest in input's order
    index = _from_last(_C.gather(order, -1, last), d)
    return _finish("mode", x, d, index, keepdim, scalar)


# ---- reshaping -----------------------------------------------------------------------------

def _host_values(t, call):
    """t's values as a NumPy array. A pending t is computed first: a sync, counted as
    DynamicShapeSync (the counter of boolean-mask indexing); device data is read without one.
    Inside a traced compile_step the read raises lazyrt.Error."""
    _tensor_arg(t, call)
    pending = t.is_pending()
    values = (_C.cast(t, _C.float32) if t.dtype is _C.bfloat16 else t).numpy()
    if pending:
        _C._metrics._increment("DynamicShapeSync")
    return values


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each element (slice along dim; of the flattened input when dim is None) repeated. An int
    repeats is static. A tensor of repeats (one per slice, or one for all) sets the result's
    size by its values: they are read on the host (a sync when pending, counted as
    DynamicShapeSync), unless output_size is given: then the index is computed lazily from
    the cumulative repeats (no read; repeats that do not add up to output_size are then not
    checked). repeat_interleave(repeats) repeats 0, 1, ... The gradient sums over the copies."""
    _tensor_arg(input, "repeat_interleave")
    if repeats is None:
        if input.dim() != 1 or input.dtype not in _INTEGRAL:
            raise _C.Error(f"repeat_interleave: repeats must be a 1-D int32 or int64 tensor, got "
                           f"{input.dtype}{tuple(input.shape)}")
        return repeat_interleave(_C._arange(input.shape[0], input.dtype), input, 0, output_size=output_size)
    if dim is None:
        x, d = _C.reshape(input, (-1,)), 0
    else:
        x, d, _ = _along(input, dim, "repeat_interleave")
    n = x.shape[d]
    if isinstance(repeats, Tensor):
        if repeats.dim() > 1:
            raise _C.Error("repeats must be 0-dim or 1-dim tensor")
        if repeats.dtype not in _INTEGRAL:
            raise _C.Error(f"repeat_interleave: repeats must be an int32 or int64 tensor, got {repeats.dtype}")
        if repeats.numel() != 1 and repeats.numel() != n:
            raise _C.Error("repeats must have the same size as input along dim")
        if output_size is not None:
            if repeats.numel() == 1 and n > 0:
                if output_size % n:
                    raise _C.Error(f"repeat_interleave: output_size {output_size} is no multiple of {n}")
                return repeat_interleave(x, output_size // n, d)
            # The slice of output j is the count of cumulative repeats <= j (no host read).
            ends = _C.cumsum(_C.cast(_C.reshape(repeats, (-1,)), _C.int64), 0)
            j = _C.unsqueeze(_C._arange(output_size, _C.int64), 1)
            index = _C.clamp_max(_C.sum(_C.unsqueeze(ends, 0) <= j, 1), builtins.max(n - 1, 0))
            return _C.index_select(x, d, index)
        counts = np.broadcast_to(_host_values(repeats, "repeat_interleave").reshape(-1), (n,))
        if np.any(counts < 0):
            raise _C.Error("repeats can not be negative")
        index = np.repeat(np.arange(n, dtype=np.int64), counts)
        if output_size is not None and output_size != index.size:
            raise _C.Error(f"repeat_interleave: output_size {output_size} does not match the repeats' sum "
                           f"{index.size}")
        return _C.index_select(x, d, tensor(index))
    if isinstance(repeats, builtins.bool) or not isinstance(repeats, numbers.Integral):
        raise TypeError(f"repeat_interleave(): argument 'repeats' must be int or Tensor, not {type(repeats).__name__}")
    if repeats < 0:
        raise _C.Error("repeats can not be negative")
    if output_size is not None and output_size != n * repeats:
        raise _C.Error(f"repeat_interleave: output_size {output_size} does not match {n} * {repeats}")
    shape = tuple(x.shape)
    wide = shape[:d + 1] + (int(repeats),) + shape[d + 1:]
    return _C.reshape(_C.expand(_C.unsqueeze(x, d + 1), wide), shape[:d] + (n * int(repeats),) + shape[d + 1:])


def rot90(input, k=1, dims=(0, 1)):
    """input rotated by k * 90 degrees in the plane of dims, from dims[0] toward dims[1]."""
    _tensor_arg(input, "rot90")
    dims = list(dims)
    ndim = input.dim()
    if len(dims) != 2:
        raise _C.Error(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if ndim < 2:
        raise _C.Error(f"expected total dims >= 2, but got total dims = {ndim}")
    if dims[0] == dims[1] or builtins.abs(dims[0] - dims[1]) == ndim:
        raise _C.Error(f"expected rotation dims to be different, but got dim0 = {dims[0]} and dim1 = {dims[1]}")
    for i, v in enumerate(dims):
        if not -ndim <= v < ndim:
            raise _C.Error(f"Rotation dim{i} out of range, dim{i} = {v}")
    d0, d1 = (v % ndim for v in dims)
    k %= 4
    if k == 1:
        return _C.transpose(_C.flip(input, [d1]), d0, d1)
    if k == 2:
        return _C.flip(input, [d0, d1])
    if k == 3:
        return _C.transpose(_C.flip(input, [d0]), d0, d1)
    return input.clone()


def fliplr(input):
    """input with dim 1 reversed (at least 2-D)."""
    if _tensor_arg(input, "fliplr").dim() < 2:
        raise _C.Error("Input must be >= 2-d.")
    return _C.flip(input, [1])


def flipud(input):
    """input with dim 0 reversed (at least 1-D)."""
    if _tensor_arg(input, "flipud").dim() < 1:
        raise _C.Error("Input must be >= 1-d.")
    return _C.flip(input, [0])


# ---- distances and special functions ---------------------------------------------------------

_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """The p-norm distances between the rows of x1 [*, P, M] and x2 [*, R, M]: [*, P, R], batch
    dims broadcast. lazyrt always takes the norm of the differences (PyTorch switches p=2 to a
    matrix-product formula for more than 25 rows, which differs by rounding): O(P R M) memory.
    Zero distances get a zero gradient for p = 2, as in PyTorch."""
    from lazyrt.nn.functional import _vector_norm
    _tensor_arg(x1, "cdist", "x1")
    _tensor_arg(x2, "cdist", "x2")
    for name, t in (("X1", x1), ("X2", x2)):
        if t.dim() < 2:
            raise _C.Error(f"cdist only supports at least 2D tensors, {name} got: {t.dim()}D")
        if not t.is_floating_point():
            raise _C.Error(f"cdist only supports floating-point dtypes, {name} got: {t.dtype}")
    if x1.shape[-1] != x2.shape[-1]:
        raise _C.Error(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    if p < 0:
        raise _C.Error("cdist only supports non-negative p values")
    if compute_mode not in _CDIST_MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    return _vector_norm(_C.unsqueeze(x1, -2) - _C.unsqueeze(x2, -3), p, -1, False)


def _horner(w, coefficients):
    p = coefficients[0]
    for c in coefficients[1:]:
        p = p * w + c
    return p


# The single-precision approximation of erfinv(x) / x by M. Giles ("Approximating the erfinv
# function", GPU Computing Gems, 2011), in w = -log(1 - x^2): a start for the Halley steps.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erfc_scaled(x, terms=24):
    """erfc(x) * exp(x^2) * sqrt(pi) for x >= 3, from the continued fraction
    1 / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))), evaluated from the bottom (24 terms
    reach float64's rounding for x >= 3)."""
    f = x
    for k in range(terms, 0, -1):
        f = x + (k / 2) / f
    return 1 / f


def erfinv(input):
    """The inverse of erf on [-1, 1] (+-inf at +-1, NaN outside). Computed in float64 whatever
    the input dtype and rounded to the input's floating dtype (float32 for integers): Giles'
    approximation, then three steps of Halley's method on erf, or, where erfinv > 3 (|x| >
    0.99997), of Newton's method on log(erfc), with erfc from its continued fraction, since
    erf itself cannot resolve values that close to 1. Within about 1e-15 relative of the exact
    value, 1e-9 for the last few float64 values below 1 (PyTorch's own float64 erfinv is off
    by up to 1e-4 there, and its float32 one by 1e-5 near 1: lazyrt's is the more accurate).
    The gradient is sqrt(pi) / 2 * exp(erfinv(x)^2), as PyTorch's (0 rather than inf at +-1)."""
    x = _floating(_tensor_arg(input, "erfinv"))
    y = _C.cast(x.detach(), _C.float64)
    inside = _C.abs(y) < 1
    safe = _C.where(inside, y, 0.0)  # the edges and NaN are set at the end
    size = _C.abs(safe)
    w = -_C.log((1 - safe) * (1 + safe))
    r = _C.where(w < 5, _horner(w - 2.5, _ERFINV_CENTRAL), _horner(_C.sqrt(w) - 3.0, _ERFINV_TAIL)) * safe
    sign = _C.where(safe < 0, -1.0, 1.0)
    log_tail = math.log(math.sqrt(math.pi)) + _C.log(1 - size)  # log(sqrt(pi) erfc(erfinv(|x|)))
    slope_factor = 2 / math.sqrt(math.pi)
    for _ in range(3):
        # Halley on f = erf(r) - x: r - f / f' / (1 - f f'' / (2 f'^2)), with f'' = -2 r f'.
        f = _C.erf(r) - safe
        halley = r - f / (slope_factor * _C.exp(-r * r) + r * f)
        # Newton on g = log(erfc(|r|)) - log(1 - |x|) = log(K) - r^2 - log(sqrt(pi) (1 - |x|)),
        # K the scaled erfc: g' = -2 / K.
        a = _C.abs(r)
        k = _erfc_scaled(_C.clamp_min(a, 3.0))
        newton = sign * (a + (k / 2) * (_C.log(k) - a * a - log_tail))
        r = _C.where(a > 3, newton, halley)
    r = _C.where(inside, r, _C.where(y == 1, math.inf, _C.where(y == -1, -math.inf, math.nan)))
    out = _C.cast(r, x.dtype)
    if x.requires_grad and _C.is_grad_enabled():
        slope = _C.where(inside, (math.sqrt(math.pi) / 2) * _C.exp(r * r), 0.0)
        out = out + (x - x.detach()) * _C.cast(slope, x.dtype)
    return out


# ---- results whose shape depends on the values -----------------------------------------------
# The number of results is known only from the values: they are read on the host. A pending
# tensor is computed for that (a sync), counted as DynamicShapeSync, as boolean-mask indexing
# counts its reads; a compiled step refuses it while traced (lazyrt.Error).

def nonzero(input, *, out=None, as_tuple=False):
    """The positions of input's nonzero values (NaN counts), int64 [count, input.dim()] in
    row-major order, or with as_tuple one 1-D tensor per dim (a 0-d input counts as 1-D).
    Reads input's values on the host (see above)."""
    if out is not None:
        raise _C.Error("nonzero: out= is not supported (use the returned tensor)")
    values = _host_values(input, "nonzero")
    if as_tuple:
        return tuple(tensor(p.astype(np.int64)) for p in np.nonzero(np.atleast_1d(values)))
    return tensor(np.argwhere(values).astype(np.int64))


def argwhere(input):
    """nonzero(input): int64 [count, input.dim()] (reads the values on the host)."""
    return nonzero(input)


def masked_select(input, mask):
    """The values of input where the bool mask is True (both broadcast together), 1-D in
    row-major order. Reads the mask on the host (see above); the gradient reaches the
    selected values."""
    _tensor_arg(input, "masked_select")
    _tensor_arg(mask, "masked_select", "mask")
    if mask.dtype is not _C.bool:
        raise _C.Error(f"masked_select: expected BoolTensor or ByteTensor for mask, got {mask.dtype}")
    try:
        shape = np.broadcast_shapes(tuple(input.shape), tuple(mask.shape))
    except ValueError:
        raise _C.Error(f"masked_select: the shape of the mask {tuple(mask.shape)} must be broadcastable with the "
                       f"shape of the input {tuple(input.shape)}") from None
    where = np.flatnonzero(np.broadcast_to(_host_values(mask, "masked_select"), shape))
    flat = _C.reshape(_C.broadcast_to(input, shape), (-1,))
    return _C.index_select(flat, 0, tensor(where.astype(np.int64)))


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct values of input (dim=None: flattened) or its distinct slices along dim, in
    ascending (lexicographic) order; with return_inverse each element's (slice's) index into
    them, shaped as input (as dim's size), with return_counts how often each occurs. Reads
    input's values on the host (see above); the results do not record a gradient. sorted=False
    also sorts (PyTorch leaves the order unspecified). NaN: all NaN are one value, last
    (PyTorch 1.13 keeps each NaN apart)."""
    values = _host_values(input, "unique")
    if dim is not None:
        if input.dim() == 0:
            raise IndexError(f"unique(): dimension out of range (expected to be in range of [-1, 0], but got {dim})")
        dim = _dim_index(dim, input.dim(), "unique()")
    kept, inverse, counts = np.unique(values, return_inverse=True, return_counts=True, axis=dim)
    out = [tensor(kept, dtype=input.dtype)]
    if return_inverse:
        out.append(tensor(inverse.astype(np.int64).reshape(values.shape if dim is None else (-1,))))
    if return_counts:
        out.append(tensor(counts.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


# ---- serialization -------------------------------------------------------------------------
# Pickle, with lazyrt tensors pickled as their values (a NumPy array), dtype, requires_grad and
# class: not PyTorch's zip format (lazyrt cannot read files torch.save wrote, nor torch those
# of lazyrt.save).

def save(obj, f, pickle_module=pickle, pickle_protocol=2, _use_new_zipfile_serialization=True):
    """Writes obj (tensors, a state_dict, nested containers of them) to f, a path or a binary
    file, with pickle. Reads the tensors' values (a sync when pending). Tensors that are the
    same object stay one object when loaded, as in PyTorch."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            pickle_module.dump(obj, fh, protocol=pickle_protocol)
    else:
        pickle_module.dump(obj, f, protocol=pickle_protocol)


class _WeightsUnpickler(pickle.Unpickler):
    """Loads tensors, NumPy arrays and Python's containers and numbers only."""

    _ALLOWED = {
        ("collections", "OrderedDict"), ("lazyrt._tensor", "_rebuild_tensor"), ("lazyrt._tensor", "_dtype_named"),
        ("lazyrt._C", "Tensor"), ("lazyrt.nn.module", "Parameter"), ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
        ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    }

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"load(weights_only=True): {module}.{name} is not allowed; only tensors, "
                                         "NumPy arrays and Python's containers and numbers load this way")
        return super().find_class(module, name)


def load(f, map_location=None, pickle_module=None, *, weights_only=False, **pickle_load_args):
    """Reads what save wrote, from a path or a binary file. map_location may be None, 'cpu',
    'lazy' or such a device (lazyrt has one device); weights_only=True refuses anything but
    tensors, arrays and plain containers (pickle.UnpicklingError)."""
    if map_location is not None:
        if callable(map_location) or isinstance(map_location, dict):
            raise _C.Error("load: map_location must be None or a device ('cpu', 'lazy'): lazyrt has one device")
        _check_device(map_location, "load")
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return load(fh, weights_only=weights_only, pickle_module=pickle_module, **pickle_load_args)
    if weights_only:
        return _WeightsUnpickler(f, **pickle_load_args).load()
    return (pickle_module or pickle).load(f, **pickle_load_args)


# Names the extension already provides stay the extension's.
__all__ = [name for name in _NAMES if not hasattr(_C, name)]
