"""lazyrt.nn.init: filling parameters in place, as torch.nn.init.

Every function writes into the tensor it is given, without recording gradients, and returns
it: the tensor keeps its identity (a Parameter stays the module's parameter, a leaf that
requires grad stays one). Values come from lazyrt's own generator (lazyrt.manual_seed), so they
follow PyTorch's distributions but are not PyTorch's numbers. The fans and gains are
PyTorch's, to the last bit.
"""

import math
import warnings

from lazyrt import _C
from lazyrt._autograd import no_grad
from lazyrt._C import Tensor

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
]


def _check(tensor, call, floating=True):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{call}: expected a lazyrt.Tensor, got {type(tensor).__name__}")
    if floating and not tensor.is_floating_point():
        raise _C.Error(f"{call}: expected a floating-point tensor, got {tensor.dtype}")


def _fill(tensor, values):
    """Writes `values` into `tensor` in place (cast to its dtype), unrecorded."""
    with no_grad():
        tensor.copy_(values)
    return tensor


def _draw(tensor, kind):
    """Random numbers of the tensor's shape: uniform in [0, 1) or standard normal. float64
    tensors draw in float64; the other floating dtypes draw in float32 and are cast on writing."""
    dtype = _C.float64 if tensor.dtype is _C.float64 else _C.float32
    shape = tuple(tensor.shape)
    return _C.rand(*shape, dtype=dtype) if kind == "uniform" else _C.randn(*shape, dtype=dtype)


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity, as torch.nn.init.calculate_gain: 1 for linear,
    conv and sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope^2)) for leaky_relu
    (slope `param`, 0.01 by default), 3/4 for selu."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                        "conv_transpose3d", "sigmoid"):
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"calculate_gain: negative_slope {param} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    """(fan_in, fan_out) as PyTorch counts them: dim 1 and dim 0 times the receptive field
    (the product of the dims after the first two)."""
    if tensor.dim() < 2:
        raise ValueError("fan in and fan out can not be computed for a tensor with fewer than 2 dimensions, "
                         f"got shape {tuple(tensor.shape)}")
    receptive = 1
    for d in tensor.shape[2:]:
        receptive *= d
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0):
    """Fills the tensor with values uniform in [a, b)."""
    _check(tensor, "uniform_")
    if a > b:
        raise _C.Error(f"uniform_: expected a <= b, got a={a} > b={b}")
    return _fill(tensor, _draw(tensor, "uniform") * (b - a) + a)


def normal_(tensor, mean=0.0, std=1.0):
    """Fills the tensor with values from N(mean, std^2)."""
    _check(tensor, "normal_")
    if std < 0:
        raise _C.Error(f"normal_: expected std >= 0, got {std}")
    return _fill(tensor, _draw(tensor, "normal") * std + mean)


def _erfinv(y):
    """The inverse error function on (-1, 1), elementwise, from M. Giles' single-precision
    polynomials ("Approximating the erfinv function", 2010): a few float32 ulps, enough for
    sampling (-1 and 1 give -inf and inf)."""
    w = -_C.log((1 - y) * (1 + y))
    # Central region (w < 5).
    c = w - 2.5
    central = 2.81022636e-08
    for k in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        central = central * c + k
    # Tails (w >= 5).
    t = _C.sqrt(w) - 3
    tail = -0.000200214257
    for k in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        tail = tail * t + k
    return _C.where(w < 5, central, tail) * y


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    """Fills the tensor with values from N(mean, std^2) truncated to [a, b] (a and b are
    values, not numbers of std), by the inverse CDF as PyTorch draws them. Every value lies
    in [a, b]."""
    _check(tensor, "trunc_normal_")
    if std < 0:
        raise _C.Error(f"trunc_normal_: expected std >= 0, got {std}")
    if a > b:
        raise _C.Error(f"trunc_normal_: expected a <= b, got a={a} > b={b}")
    if std == 0 or a == b:
        with no_grad():
            tensor.fill_(min(max(mean, a), b))
        return tensor
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)

    def cdf(x):  # the standard normal's
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    low, high = cdf((a - mean) / std), cdf((b - mean) / std)
    # Uniform in [2 low - 1, 2 high - 1], mapped through the normal's inverse CDF.
    u = _draw(tensor, "uniform") * (2 * (high - low)) + (2 * low - 1)
    x = _erfinv(u) * (std * math.sqrt(2.0)) + mean
    return _fill(tensor, _C.clamp(x, a, b))


def constant_(tensor, val):
    """Fills the tensor with `val`."""
    _check(tensor, "constant_", floating=False)
    with no_grad():
        tensor.fill_(val)
    return tensor


def ones_(tensor):
    """Fills the tensor with ones."""
    return constant_(tensor, 1)


def zeros_(tensor):
    """Fills the tensor with zeros."""
    _check(tensor, "zeros_", floating=False)
    with no_grad():
        tensor.zero_()
    return tensor


def eye_(tensor):
    """Fills a 2-D tensor with the identity matrix (ones on the diagonal, for any shape)."""
    _check(tensor, "eye_", floating=False)
    if tensor.dim() != 2:
        raise ValueError(f"eye_: only tensors with 2 dimensions are supported, got shape {tuple(tensor.shape)}")
    rows, cols = tensor.shape
    eye = _C.triu(_C.tril(_C.ones(rows, cols, dtype=tensor.dtype)))
    return _fill(tensor, eye)


def xavier_uniform_(tensor, gain=1.0):
    """Glorot uniform: U(-bound, bound) with bound = gain * sqrt(6 / (fan_in + fan_out))."""
    _check(tensor, "xavier_uniform_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain=1.0):
    """Glorot normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    _check(tensor, "xavier_normal_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std)


def _kaiming_std(tensor, a, mode, nonlinearity, call):
    _check(tensor, call)
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    """He uniform: U(-bound, bound) with bound = gain * sqrt(3 / fan), the gain of
    `nonlinearity` (with negative slope `a` for leaky_relu), fan the fan_in or fan_out."""
    _check(tensor, "kaiming_uniform_")
    if tensor.numel() == 0:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    """He normal: N(0, std^2) with std = gain / sqrt(fan) (see kaiming_uniform_)."""
    _check(tensor, "kaiming_normal_")
    if tensor.numel() == 0:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_"))
