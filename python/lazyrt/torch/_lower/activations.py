"""Activations and softmax, forward and backward, as ATen's CPU kernels compute them."""

import math

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import UnsupportedOperatorError, _cast, lowering

aten = torch.ops.aten


# ---- backward formulas of activations and losses ---------------------------------------------

@lowering(aten.threshold_backward.default)
def _threshold_backward(e, grad, x, threshold):
    return _C.where(_C.le(x, threshold), 0.0, _cast(grad, e.dtype))


@lowering(aten.tanh_backward.default)
def _tanh_backward(e, grad, y):
    return _C.mul(_cast(grad, e.dtype), _C.add(_C.neg(_C.mul(y, y)), 1.0))  # grad * (1 - y^2)


@lowering(aten.sigmoid_backward.default)
def _sigmoid_backward(e, grad, y):
    return _C.mul(_C.mul(_cast(grad, e.dtype), y), _C.add(_C.neg(y), 1.0))  # grad * y * (1 - y)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@lowering(aten.gelu_backward.default)
def _gelu_backward(e, grad, x, approximate="none"):
    grad = _cast(grad, e.dtype)
    if approximate == "tanh":
        # y = x/2 * (1 + tanh(u)), u = c * (x + k x^3): y' = (1 + th)/2 + x/2 * (1 - th^2) * c * (1 + 3k x^2)
        k = 0.044715
        x2 = _C.mul(x, x)
        u = _C.mul(_C.add(x, _C.mul(_C.mul(x2, x), k)), _SQRT_2_OVER_PI)
        th = _C.tanh(u)
        left = _C.mul(_C.add(th, 1.0), 0.5)
        du = _C.mul(_C.add(_C.mul(x2, 3.0 * k), 1.0), _SQRT_2_OVER_PI)
        right = _C.mul(_C.mul(_C.mul(x, 0.5), _C.add(_C.neg(_C.mul(th, th)), 1.0)), du)
        return _C.mul(grad, _C.add(left, right))
    if approximate != "none":
        raise UnsupportedOperatorError(f"lazyrt.torch: gelu_backward with approximate='{approximate}'")
    # y = x * Phi(x): y' = Phi(x) + x * phi(x)
    cdf = _C.mul(_C.add(_C.erf(_C.mul(x, 1.0 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = _C.mul(_C.exp(_C.mul(_C.mul(x, x), -0.5)), _INV_SQRT_2PI)
    return _C.mul(grad, _C.add(cdf, _C.mul(x, pdf)))


# ---- more activations, forward and backward, as ATen's CPU kernels compute them -----------

@lowering(aten.elu.default)
def _elu(e, x, alpha=1, scale=1, input_scale=1):
    # scale * x where x > 0, else alpha * scale * expm1(x * input_scale), as ATen's kernel
    # computes it (tiny negative x give tiny negative values, not 0)
    x = _cast(x, e.dtype)
    negative = _C.mul(_C.expm1(_C.mul(x, input_scale)), alpha * scale)
    return _C.where(_C.gt(x, 0.0), _C.mul(x, scale), negative)


@lowering(aten.celu.default)
def _celu(e, x, alpha=1.0):
    return _elu(e, x, alpha, 1.0, 1.0 / alpha)


@lowering(aten.elu_backward.default)
def _elu_backward(e, grad, alpha, scale, input_scale, is_result, self_or_result):
    # In ATen's order: below 0, grad * input_scale * (y + alpha * scale) from the result y, or
    # grad * input_scale * alpha * scale * exp(x * input_scale) from the input x
    grad, v = _cast(grad, e.dtype), self_or_result
    scaled = _C.mul(grad, input_scale)
    if is_result:
        below = _C.mul(scaled, _C.add(v, alpha * scale))
    else:
        below = _C.mul(_C.mul(scaled, alpha * scale), _C.exp(_C.mul(v, input_scale)))
    return _C.where(_C.le(v, 0.0), below, _C.mul(grad, scale))


@lowering(aten.hardtanh.default)
def _hardtanh(e, x, min_val=-1, max_val=1):
    return _C.clamp(_cast(x, e.dtype), min_val, max_val)


@lowering(aten.hardtanh_backward.default)
def _hardtanh_backward(e, grad, x, min_val, max_val):
    outside = _C.logical_or(_C.le(x, min_val), _C.ge(x, max_val))
    return _C.where(outside, 0.0, _cast(grad, e.dtype))


@lowering(aten.hardsigmoid.default)
def _hardsigmoid(e, x):
    return _C.div(_C.clamp(_C.add(_cast(x, e.dtype), 3.0), 0.0, 6.0), 6.0)


@lowering(aten.hardsigmoid_backward.default)
def _hardsigmoid_backward(e, grad, x):
    inside = _C.logical_and(_C.gt(x, -3.0), _C.lt(x, 3.0))
    return _C.where(inside, _C.div(_cast(grad, e.dtype), 6.0), 0.0)


@lowering(aten.hardswish.default)
def _hardswish(e, x):
    x = _cast(x, e.dtype)
    return _C.div(_C.mul(x, _C.clamp(_C.add(x, 3.0), 0.0, 6.0)), 6.0)


@lowering(aten.hardswish_backward.default)
def _hardswish_backward(e, grad, x):
    grad = _cast(grad, e.dtype)
    middle = _C.mul(grad, _C.add(_C.div(x, 3.0), 0.5))  # on (-3, 3), as ATen's kernel
    return _C.where(_C.le(x, -3.0), 0.0, _C.where(_C.lt(x, 3.0), middle, grad))


@lowering(aten.leaky_relu.default)
def _leaky_relu(e, x, negative_slope=0.01):
    return _C.leaky_relu(_cast(x, e.dtype), negative_slope)


@lowering(aten.leaky_relu_backward.default)
def _leaky_relu_backward(e, grad, x, negative_slope, self_is_result):
    # x > 0: grad, else grad * slope (x may be the result: same sign for a positive slope)
    grad = _cast(grad, e.dtype)
    return _C.where(_C.gt(x, 0.0), grad, _C.mul(grad, negative_slope))


@lowering(aten.softplus.default)
def _softplus(e, x, beta=1, threshold=20):
    # x where x * beta > threshold, else log1p(exp(x * beta)) / beta, as ATen's kernel
    x = _cast(x, e.dtype)
    xb = _C.mul(x, beta)
    return _C.where(_C.gt(xb, threshold), x, _C.div(_C.log1p(_C.exp(xb)), beta))


@lowering(aten.softplus_backward.default)
def _softplus_backward(e, grad, x, beta, threshold):
    # grad where x * beta > threshold, else grad * z / (z + 1), z = exp(x * beta)
    grad = _cast(grad, e.dtype)
    xb = _C.mul(x, beta)
    z = _C.exp(xb)
    return _C.where(_C.gt(xb, threshold), grad, _C.div(_C.mul(grad, z), _C.add(z, 1.0)))


@lowering(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(e, x):
    # min(x, 0) - log1p(exp(-|x|)); the buffer (exp(-|x|), what torch's kernel keeps) is not read
    z = _C.exp(_C.neg(_C.abs(x)))
    return [_C.sub(_C.clamp(x, max=0.0), _C.log1p(z)), z]


@lowering(aten.log_sigmoid_backward.default)
def _log_sigmoid_backward(e, grad, x, buffer):
    return _C.mul(_cast(grad, e.dtype), _C.sigmoid(_C.neg(x)))  # d/dx log sigmoid(x) = sigmoid(-x)


@lowering(aten._prelu_kernel.default)
def _prelu(e, x, weight):
    # torch.prelu reshapes the weight to broadcast over x's channels, then calls this kernel.
    return _C.where(_C.gt(x, 0.0), x, _C.mul(weight, x))


@lowering(aten._prelu_kernel_backward.default)
def _prelu_backward(e, grad, x, weight):
    # input > 0: grad, else weight * grad; the weight's: input * grad where input <= 0, in the
    # broadcast shape (autograd sums it to the weight's shape after).
    positive = _C.gt(x, 0.0)
    return [_C.where(positive, grad, _C.mul(weight, grad)), _C.where(positive, 0.0, _C.mul(x, grad))]


@lowering(aten.glu.default)
def _glu(e, x, dim=-1):
    a, b = lazyrt.split(x, x.shape[dim] // 2, dim)
    return _C.mul(a, _C.sigmoid(b))


@lowering(aten.glu_backward.default)
def _glu_backward(e, grad, x, dim):
    a, b = lazyrt.split(x, x.shape[dim] // 2, dim)
    sb = _C.sigmoid(b)
    return _C.cat([_C.mul(grad, sb), _C.mul(_C.mul(_C.mul(grad, a), sb), _C.add(_C.neg(sb), 1.0))], dim % x.dim())


@lowering(aten.xlogy.Tensor)
def _xlogy(e, x, y):
    x, y = _cast(x, e.dtype), _cast(y, e.dtype)
    # 0 where x is 0 (unless y is nan), x * log(y) elsewhere
    keep = _C.logical_or(_C.ne(x, 0.0), _C.ne(y, y))
    return _C.where(keep, _C.mul(x, _C.log(y)), 0.0)


# ---- softmax ---------------------------------------------------------------------------------

@lowering(aten._log_softmax.default)
def _log_softmax(e, x, dim, half_to_float=False):
    return _C.log_softmax(_cast(x, e.dtype), dim)


@lowering(aten._log_softmax_backward_data.default)
def _log_softmax_backward(e, grad, out, dim, input_dtype):
    # d/dx log_softmax: grad - softmax * sum(grad)
    return _C.sub(grad, _C.mul(_C.exp(out), _C.sum(grad, [dim], True)))


@lowering(aten._softmax.default)
def _softmax(e, x, dim, half_to_float=False):
    return _C.softmax(_cast(x, e.dtype), dim)


@lowering(aten._safe_softmax.default)
def _safe_softmax(e, x, dim, dtype=None):
    # softmax, with 0 (not NaN) on lines that are -inf throughout (attention rows masked whole)
    x = _cast(x, e.dtype)
    masked = _C.all(_C.eq(x, float("-inf")), [dim], True)
    return _C.where(masked, 0.0, _C.softmax(x, dim))


@lowering(aten._softmax_backward_data.default)
def _softmax_backward(e, grad, out, dim, input_dtype):
    return _C.mul(out, _C.sub(grad, _C.sum(_C.mul(grad, out), [dim], True)))
