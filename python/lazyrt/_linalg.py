"""Products, diagonals and distances of torch, as compositions of lazyrt's ops."""

import builtins

from lazyrt import _C
from lazyrt._args import _tensor_arg

__all__ = ["outer", "dot", "mv", "trace", "diag", "cdist"]


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


# ---- distances -------------------------------------------------------------------------------

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
