"""Elementwise math, comparisons and differences of torch, as compositions of lazyrt's ops.

Integer dtypes follow PyTorch exactly (floor_divide rounds toward -inf, remainder takes the
divisor's sign, fmod the dividend's); division of integers by zero is not checked (PyTorch
raises). Floating fmod / remainder / floor_divide agree with PyTorch up to rounding.
"""

import builtins
import math
import numbers

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt._args import _INTEGRAL, _scalar_dtype, _tensor_arg
from lazyrt._tensor import _square

__all__ = ["square", "clip", "log2", "log10", "exp2", "tan", "trunc", "frac", "fmod", "remainder", "floor_divide",
           "logical_xor", "hypot", "logaddexp", "isclose", "allclose", "equal", "count_nonzero", "diff", "erfinv"]


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


# ---- aliases -------------------------------------------------------------------------------

def square(input):
    """input * input."""
    return _square(_tensor_arg(input, "square"))


def clip(input, min=None, max=None):
    """An alias of clamp."""
    return _C.clamp(input, min, max)


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


# ---- special functions -----------------------------------------------------------------------

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
