"""Lowering: the functionalized aten graph of a captured step, run as lazyrt ops.

`LoweredGraph` interprets the FX graph node by node: each aten op maps to a composition of
lazyrt ops (`LOWERINGS`), so calling it inside ``lazyrt.compile_step`` records one lazyrt graph.
Every node carries PyTorch's answer for its result (``node.meta['val']``, a fake tensor): the
lowering takes the result dtype from it (elementwise operands are cast to PyTorch's promoted
dtype first, as PyTorch computes in it), factories take their shapes from it, and every result
is checked against it — a shape that differs is an error naming the op, never a silent wrong
value.

Only the nodes the outputs and write-backs need are lowered (the graph also holds dead ops,
such as the profiler's ``record_function`` buffers). A live op without a lowering (or one
lowered for some attributes only, `REFUSALS`, given others: a 3-d convolution) raises
`UnsupportedOperatorError` naming it, when the step is captured and before anything runs —
unless graph breaks are allowed (a captured step, not a loop body): then each such op runs in
PyTorch eager between compiled pieces of the graph (`LoweredGraph.run`), counted by the
``GraphBreak`` counter of `lazyrt.metrics` and named by a `GraphBreakWarning` the first time.
"""

import math
import operator
import warnings

import torch
import torch.fx

import lazyrt
from lazyrt import _C

aten = torch.ops.aten


class UnsupportedOperatorError(NotImplementedError):
    """The captured step uses an aten op lazyrt.torch has no lowering for (named in the message)."""


class GraphBreakWarning(UserWarning):
    """An aten op without a lowering runs in PyTorch eager between compiled pieces of a step
    (warned once per op)."""


_WARNED_BREAKS = set()


_DTYPES = {
    torch.float32: _C.float32, torch.float64: _C.float64, torch.float16: _C.float16,
    torch.bfloat16: _C.bfloat16, torch.int32: _C.int32, torch.int64: _C.int64, torch.bool: _C.bool,
}


_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


def lazy_dtype(dtype, what="a tensor"):
    d = _DTYPES.get(dtype)
    if d is None:
        raise UnsupportedOperatorError(f"lazyrt.torch: {what} has dtype {dtype}, which lazyrt does not have")
    return d


class Expect:
    """PyTorch's shape and dtype for a node's (first) result."""

    __slots__ = ("shape", "dtype", "val")

    def __init__(self, node):
        val = node.meta.get("val")
        self.val = val
        first = val[0] if isinstance(val, (tuple, list)) else val
        if isinstance(first, torch.Tensor):
            self.shape = tuple(int(s) for s in first.shape)
            self.dtype = lazy_dtype(first.dtype, f"the result of {node.target}")
        else:
            self.shape = self.dtype = None


LOWERINGS = {}


def lowering(*ops):
    def register(fn):
        for op in ops:
            LOWERINGS[op] = fn
        return fn
    return register


def _is_tensor(x):
    return isinstance(x, _C.Tensor)


def _cast(x, dtype):
    if _is_tensor(x) and x.dtype is not dtype:
        return _C.cast(x, dtype)
    return x


def _full(shape, value, dtype):
    return _C.full(tuple(shape), value, dtype=dtype)


def _reduce_dims(dim, ndim):
    """aten's dim list for reductions: None or [] means every dim."""
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return [d % max(ndim, 1) for d in dim] if dim else list(range(ndim))


# ---- elementwise arithmetic: operands in PyTorch's result dtype -------------------------------

def _elementwise(fn):
    def lower(e, *args, **kwargs):
        args = [_cast(a, e.dtype) for a in args]
        return fn(*args, **kwargs)
    return lower


# A graph that Dynamo specialized from a symbolic float may hold the number first (1.5 - x).
lowering(aten.add.Tensor, aten.add.Scalar)(_elementwise(
    lambda a, b, alpha=1: _C.add(a, b, alpha=alpha) if _is_tensor(a) else _C.add(_C.mul(b, alpha), a)))
lowering(aten.sub.Tensor, aten.sub.Scalar)(_elementwise(
    lambda a, b, alpha=1: _C.sub(a, b, alpha=alpha) if _is_tensor(a) else _C.add(_C.mul(b, -alpha), a)))
lowering(aten.rsub.Tensor, aten.rsub.Scalar)(
    _elementwise(lambda a, b, alpha=1: _C.sub(b, a, alpha=alpha) if _is_tensor(b)
                 else _C.add(_C.mul(a, -alpha), b)))
lowering(aten.mul.Tensor, aten.mul.Scalar)(_elementwise(lambda a, b: _C.mul(a, b) if _is_tensor(a) else _C.mul(b, a)))
lowering(aten.div.Tensor, aten.div.Scalar)(_elementwise(_C.div))
lowering(aten.maximum.default)(_elementwise(_C.maximum))
lowering(aten.minimum.default)(_elementwise(_C.minimum))
lowering(aten.addcmul.default)(_elementwise(lambda s, a, b, value=1: _C.addcmul(s, a, b, value=value)))
lowering(aten.addcdiv.default)(_elementwise(lambda s, a, b, value=1: _C.addcdiv(s, a, b, value=value)))
lowering(aten.lerp.Scalar, aten.lerp.Tensor)(_elementwise(_C.lerp))
lowering(aten.neg.default)(_elementwise(_C.neg))
lowering(aten.abs.default)(_elementwise(_C.abs))
lowering(aten.sign.default, aten.sgn.default)(_elementwise(_C.sign))  # sgn: sign of a real tensor
lowering(aten.sqrt.default)(_elementwise(_C.sqrt))
lowering(aten.rsqrt.default)(_elementwise(_C.rsqrt))
lowering(aten.reciprocal.default)(_elementwise(_C.reciprocal))
lowering(aten.exp.default)(_elementwise(_C.exp))
lowering(aten.log.default)(_elementwise(_C.log))
lowering(aten.tanh.default)(_elementwise(_C.tanh))
lowering(aten.sigmoid.default)(_elementwise(_C.sigmoid))
lowering(aten.relu.default)(_elementwise(_C.relu))
lowering(aten.silu.default)(_elementwise(_C.silu))
lowering(aten.erf.default)(_elementwise(_C.erf))
lowering(aten.log1p.default)(_elementwise(_C.log1p))
lowering(aten.expm1.default)(_elementwise(_C.expm1))
lowering(aten.sin.default)(_elementwise(_C.sin))
lowering(aten.cos.default)(_elementwise(_C.cos))
lowering(aten.atan.default)(_elementwise(_C.atan))
lowering(aten.atan2.default)(_elementwise(_C.atan2))
lowering(aten.floor.default)(_elementwise(_C.floor))
lowering(aten.ceil.default)(_elementwise(_C.ceil))
lowering(aten.round.default)(_elementwise(_C.round))
lowering(aten.round.decimals)(_elementwise(lambda x, decimals=0: _C.round(x, decimals=decimals)))


@lowering(aten.isnan.default)
def _isnan(e, x):
    return _C.isnan(x)


@lowering(aten.isinf.default)
def _isinf(e, x):
    return _C.isinf(x)


@lowering(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(e, base, exponent):
    return _C.pow(_cast(base, e.dtype), _cast(exponent, e.dtype))


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(e, x, min=None, max=None):
    return _C.clamp(_cast(x, e.dtype), _cast(min, e.dtype), _cast(max, e.dtype))


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(e, x, min):
    return _C.clamp(_cast(x, e.dtype), min=_cast(min, e.dtype))


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(e, x, max):
    return _C.clamp(_cast(x, e.dtype), max=_cast(max, e.dtype))


@lowering(aten.gelu.default)
def _gelu(e, x, approximate="none"):
    return _C.gelu(_cast(x, e.dtype), approximate=approximate)


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(e, cond, a, b):
    return _C.where(cond, _cast(a, e.dtype), _cast(b, e.dtype))


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(e, x, mask, value):
    return _C.masked_fill(_cast(x, e.dtype), mask, _cast(value, e.dtype))


def _comparison(fn):
    def lower(e, a, b):
        common = _common_dtype(a, b)
        return fn(_cast(a, common), _cast(b, common))
    return lower


def _common_dtype(a, b):
    """PyTorch's promoted dtype of two operands (lazyrt tensors or Python numbers)."""
    def probe(x):
        if _is_tensor(x):
            td = _TORCH_DTYPES[x.dtype]
            return torch.empty((1,) * x.dim(), dtype=td) if x.dim() else torch.empty((), dtype=td)
        return x
    return lazy_dtype(torch.result_type(probe(a), probe(b)))


for _op, _fn in ((aten.lt, _C.lt), (aten.le, _C.le), (aten.gt, _C.gt), (aten.ge, _C.ge), (aten.eq, _C.eq),
                 (aten.ne, _C.ne)):
    lowering(_op.Tensor, _op.Scalar)(_comparison(_fn))
del _op, _fn


@lowering(aten.logical_not.default)
def _logical_not(e, x):
    return _C.logical_not(x)


@lowering(aten.bitwise_not.default)  # of bool only (REFUSALS): logical not
def _bitwise_not(e, x):
    return _C.logical_not(x)


@lowering(aten.gather.default)
def _gather(e, x, dim, index, sparse_grad=False):
    return _C.gather(x, dim, index)


@lowering(aten.logical_and.default)
def _logical_and(e, a, b):
    return _C.logical_and(a, b)


@lowering(aten.logical_or.default)
def _logical_or(e, a, b):
    return _C.logical_or(a, b)


def _bool_only(name, fn):
    def lower(e, a, b):
        if e.dtype is not _C.bool:
            raise UnsupportedOperatorError(f"lazyrt.torch: {name} of {e.dtype} tensors (only bool is lowered)")
        return fn(_cast(a, _C.bool), _cast(b, _C.bool))
    return lower


lowering(aten.bitwise_and.Tensor)(_bool_only("bitwise_and", _C.logical_and))  # a & b on masks
lowering(aten.bitwise_or.Tensor)(_bool_only("bitwise_or", _C.logical_or))


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


# ---- more reductions and reorderings ----------------------------------------------------------

@lowering(aten.cumsum.default)
def _cumsum(e, x, dim, dtype=None):
    return _C.cumsum(_cast(x, e.dtype), dim)


@lowering(aten.cumprod.default)
def _cumprod(e, x, dim, dtype=None):
    return _C.cumprod(_cast(x, e.dtype), dim)


@lowering(aten.prod.default)
def _prod(e, x, dtype=None):
    return _C.prod(_cast(x, e.dtype))


@lowering(aten.prod.dim_int)
def _prod_dim(e, x, dim, keepdim=False, dtype=None):
    return _C.prod(_cast(x, e.dtype), dim, keepdim)


@lowering(aten.logsumexp.default)
def _logsumexp(e, x, dim, keepdim=False):
    return _C.logsumexp(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.std.correction)
def _std(e, x, dim=None, correction=None, keepdim=False):
    return _C.std(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim=keepdim,
                  correction=1 if correction is None else correction)


@lowering(aten.flip.default)
def _flip(e, x, dims):
    return _C.flip(x, [d % x.dim() for d in dims])


@lowering(aten.sort.default, aten.sort.stable)
def _sort(e, x, *args, **kwargs):
    # sort.default(x, dim=-1, descending=False); sort.stable(x, *, stable, dim=-1, descending=False).
    # lazyrt's order is stable, as PyTorch's CPU sort gives it.
    dim = kwargs.get("dim", args[0] if args else -1)
    descending = kwargs.get("descending", args[1] if len(args) > 1 else False)
    values, indices = lazyrt.sort(x, dim, descending, stable=True)
    return [values, indices]


@lowering(aten.topk.default)
def _topk(e, x, k, dim=-1, largest=True, sorted=True):
    # Ties may come in another order than PyTorch's, which leaves theirs unspecified.
    values, indices = lazyrt.topk(x, k, dim, largest, sorted)
    return [values, indices]


@lowering(aten.scatter.src, aten.scatter.value)
def _scatter(e, x, dim, index, src):
    return _C.scatter(_cast(x, e.dtype), dim, index, _cast(src, e.dtype))


@lowering(aten.scatter_add.default)
def _scatter_add(e, x, dim, index, src):
    return _C.scatter_add(_cast(x, e.dtype), dim, index, _cast(src, e.dtype))


@lowering(aten.index_select.default)
def _index_select(e, x, dim, index):
    return _C.index_select(x, dim, index)


@lowering(aten.index_add.default)
def _index_add(e, x, dim, index, source, alpha=1):
    return _C.index_add(_cast(x, e.dtype), dim, index, _cast(source, e.dtype), alpha=alpha)


@lowering(aten.triu.default)
def _triu(e, x, diagonal=0):
    return _C.triu(x, diagonal)


@lowering(aten.tril.default)
def _tril(e, x, diagonal=0):
    return _C.tril(x, diagonal)


# ---- padding and resizing: forward by lazyrt.nn.functional, backward its vector-Jacobian product

@lowering(aten.constant_pad_nd.default)
def _constant_pad_nd(e, x, pad, value=0):
    return lazyrt.nn.functional.pad(x, list(pad), mode="constant", value=value)


def _pad_mode(mode):
    def forward(e, x, padding):
        return lazyrt.nn.functional.pad(x, list(padding), mode=mode)

    def backward(e, grad, x, padding):
        return _vjp(lambda t: lazyrt.nn.functional.pad(t, list(padding), mode=mode), [x], grad, [True])[0]
    return forward, backward


for _n, _mode in ((1, "reflect"), (2, "reflect"), (1, "replicate"), (2, "replicate")):
    _fw, _bw = _pad_mode(_mode)
    _name = {"reflect": "reflection", "replicate": "replication"}[_mode]
    lowering(getattr(aten, f"{_name}_pad{_n}d").default)(_fw)
    lowering(getattr(aten, f"{_name}_pad{_n}d_backward").default)(_bw)
del _n, _mode, _fw, _bw, _name


def _bilinear(size, scale_factors, align_corners):
    # With scale factors torch maps coordinates by them (not by the sizes' ratio): so does lazyrt.
    if scale_factors:
        return lambda t: lazyrt.nn.functional.interpolate(t, scale_factor=list(scale_factors), mode="bilinear",
                                                          align_corners=align_corners)
    return lambda t: lazyrt.nn.functional.interpolate(t, size=list(size), mode="bilinear", align_corners=align_corners)


@lowering(aten.upsample_bilinear2d.vec)
def _upsample_bilinear2d_vec(e, x, output_size, align_corners, scale_factors):
    return _bilinear(output_size, scale_factors, align_corners)(x)


def _scales(scales_h, scales_w):
    return None if scales_h is None or scales_w is None else [scales_h, scales_w]


@lowering(aten.upsample_bilinear2d.default)
def _upsample_bilinear2d(e, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _bilinear(output_size, _scales(scales_h, scales_w), align_corners)(x)


@lowering(aten.upsample_bilinear2d_backward.default)
def _upsample_bilinear2d_backward(e, grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    x = _C.zeros(tuple(input_size), dtype=grad.dtype)  # the map is linear: any input stands in
    return _vjp(_bilinear(output_size, _scales(scales_h, scales_w), align_corners), [x], grad, [True])[0]


def _nearest(size, scale_factors):
    if scale_factors:
        return lambda t: lazyrt.nn.functional.interpolate(t, scale_factor=list(scale_factors), mode="nearest")
    return lambda t: lazyrt.nn.functional.interpolate(t, size=list(size), mode="nearest")


@lowering(aten.upsample_nearest2d.vec)
def _upsample_nearest2d_vec(e, x, output_size, scale_factors):
    return _nearest(output_size, scale_factors)(x)


@lowering(aten.upsample_nearest2d.default)
def _upsample_nearest2d(e, x, output_size, scales_h=None, scales_w=None):
    return _nearest(output_size, _scales(scales_h, scales_w))(x)


@lowering(aten.upsample_nearest2d_backward.default)
def _upsample_nearest2d_backward(e, grad, output_size, input_size, scales_h=None, scales_w=None):
    x = _C.zeros(tuple(input_size), dtype=grad.dtype)  # the map is linear: any input stands in
    return _vjp(_nearest(output_size, _scales(scales_h, scales_w)), [x], grad, [True])[0]


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


_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _nll_parts(x, target, weight, ignore_index):
    """(log-probability picked per sample, per-sample weight, one-hot of the targets) for [N, C]
    input and [N] targets; ignored samples weigh 0."""
    classes = x.shape[1]
    valid = _C.ne(target, ignore_index)
    safe = _C.where(valid, target, 0)
    hot = _C.eq(_C.unsqueeze(safe, 1), _C.unsqueeze(lazyrt.arange(classes), 0))  # [N, C] bool
    picked = _C.sum(_C.where(hot, x, 0.0), [1])
    if weight is None:
        w = _C.cast(valid, x.dtype)
    else:
        w = _C.where(valid, _C.index_select(_cast(weight, x.dtype), 0, safe), 0.0)
    return picked, w, hot


@lowering(aten.nll_loss_forward.default)
def _nll_loss_forward(e, x, target, weight, reduction, ignore_index):
    batched = x.dim() == 2
    if not batched:  # one sample, no batch dim
        x, target = _C.unsqueeze(x, 0), _C.reshape(target, (1,))
    picked, w, _ = _nll_parts(x, target, weight, ignore_index)
    losses = _C.neg(_C.mul(picked, w))
    total = _C.sum(w)
    if reduction == _REDUCTION_NONE:
        return (losses if batched else _C.reshape(losses, ())), _C.zeros((), dtype=x.dtype)
    out = _C.sum(losses)
    if reduction == _REDUCTION_MEAN:
        out = _C.div(out, total)
    return out, total


@lowering(aten.nll_loss_backward.default)
def _nll_loss_backward(e, grad_out, x, target, weight, reduction, ignore_index, total_weight):
    batched = x.dim() == 2
    if not batched:
        x, target = _C.unsqueeze(x, 0), _C.reshape(target, (1,))
        if reduction == _REDUCTION_NONE:
            grad_out = _C.reshape(grad_out, (1,))
    _, w, hot = _nll_parts(x, target, weight, ignore_index)
    if reduction == _REDUCTION_NONE:
        scale = _C.mul(w, grad_out)
    elif reduction == _REDUCTION_MEAN:
        scale = _C.mul(w, _C.div(grad_out, total_weight))
    else:
        scale = _C.mul(w, grad_out)
    g = _C.where(hot, _C.unsqueeze(_C.neg(scale), 1), 0.0)
    return g if batched else _C.reshape(g, e.shape)


def _classes_last(x):
    """[N, C, *] -> [N * prod(*), C]: the rows nll_loss takes."""
    perm = [0] + list(range(2, x.dim())) + [1]
    return _C.reshape(_C.permute(x, perm), (-1, x.shape[1]))


@lowering(aten.nll_loss2d_forward.default)
def _nll_loss2d_forward(e, x, target, weight, reduction, ignore_index):
    # nll_loss over every position: class scores [N, C, H, W], targets [N, H, W]
    out, total = _nll_loss_forward(None, _classes_last(x), _C.reshape(target, (-1,)), weight, reduction,
                                   ignore_index)
    return [_C.reshape(out, tuple(target.shape)) if reduction == _REDUCTION_NONE else out, total]


@lowering(aten.nll_loss2d_backward.default)
def _nll_loss2d_backward(e, grad_out, x, target, weight, reduction, ignore_index, total_weight):
    if reduction == _REDUCTION_NONE:
        grad_out = _C.reshape(grad_out, (-1,))
    g = _nll_loss_backward(None, grad_out, _classes_last(x), _C.reshape(target, (-1,)), weight, reduction,
                           ignore_index, total_weight)
    n, c = x.shape[0], x.shape[1]
    g = _C.reshape(g, (n,) + tuple(x.shape[2:]) + (c,))
    return _C.permute(g, [0, x.dim() - 1] + list(range(1, x.dim() - 1)))


def _reduce(x, reduction):
    if reduction == _REDUCTION_MEAN:
        return _C.mean(x)
    if reduction == _REDUCTION_SUM:
        return _C.sum(x)
    return x


@lowering(aten.mse_loss.default)
def _mse_loss(e, x, target, reduction=_REDUCTION_MEAN):
    d = _C.sub(_cast(x, e.dtype), _cast(target, e.dtype))
    return _reduce(_C.mul(d, d), reduction)


@lowering(aten.binary_cross_entropy.default)
def _binary_cross_entropy(e, x, target, weight=None, reduction=_REDUCTION_MEAN):
    # (target - 1) * max(log1p(-x), -100) - target * max(log(x), -100), as ATen's kernel
    x, t = _cast(x, e.dtype), _cast(target, e.dtype)
    log_1mx = _C.clamp(_C.log1p(_C.neg(x)), min=-100.0)
    log_x = _C.clamp(_C.log(x), min=-100.0)
    loss = _C.sub(_C.mul(_C.sub(t, 1.0), log_1mx), _C.mul(t, log_x))
    if weight is not None:
        loss = _C.mul(loss, _cast(weight, e.dtype))
    return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_backward.default)
def _binary_cross_entropy_backward(e, grad, x, target, weight=None, reduction=_REDUCTION_MEAN):
    # grad * (x - target) / max((1 - x) * x, 1e-12), times the weight, over the count for a mean
    x, t = _cast(x, e.dtype), _cast(target, e.dtype)
    denom = _C.clamp(_C.mul(_C.add(_C.neg(x), 1.0), x), min=1e-12)
    g = _C.div(_C.mul(_cast(grad, e.dtype), _C.sub(x, t)), denom)
    if weight is not None:
        g = _C.mul(g, _cast(weight, e.dtype))
    return _C.div(g, float(max(x.numel(), 1))) if reduction == _REDUCTION_MEAN else g


@lowering(aten.smooth_l1_loss.default)
def _smooth_l1_loss(e, x, target, reduction=_REDUCTION_MEAN, beta=1.0):
    # |d| < beta: d^2 / 2 / beta; else |d| - beta / 2, as ATen's kernel (beta 0: the L1 loss; its
    # backward is PyTorch's decomposition, captured as plain ops)
    z = _C.abs(_C.sub(_cast(x, e.dtype), _cast(target, e.dtype)))
    if beta == 0:
        return _reduce(z, reduction)
    quadratic = _C.div(_C.mul(_C.mul(z, 0.5), z), beta)
    return _reduce(_C.where(_C.lt(z, beta), quadratic, _C.sub(z, 0.5 * beta)), reduction)


@lowering(aten.huber_loss.default)
def _huber_loss(e, x, target, reduction=_REDUCTION_MEAN, delta=1.0):
    # |d| < delta: d^2 / 2; else delta * (|d| - delta / 2), as ATen's kernel (its backward is
    # PyTorch's decomposition, captured as plain ops)
    z = _C.abs(_C.sub(_cast(x, e.dtype), _cast(target, e.dtype)))
    quadratic = _C.mul(_C.mul(z, 0.5), z)
    return _reduce(_C.where(_C.lt(z, delta), quadratic, _C.mul(_C.sub(z, 0.5 * delta), delta)), reduction)


@lowering(aten.mse_loss_backward.default)
def _mse_loss_backward(e, grad_out, x, target, reduction):
    d = _C.sub(_cast(x, e.dtype), _cast(target, e.dtype))
    scale = 2.0 / max(x.numel(), 1) if reduction == _REDUCTION_MEAN else 2.0
    return _C.mul(_C.mul(d, scale), grad_out)


# ---- linear algebra, reductions ---------------------------------------------------------------

@lowering(aten.mm.default)
def _mm(e, a, b):
    return _C.mm(_cast(a, e.dtype), _cast(b, e.dtype))


@lowering(aten.bmm.default)
def _bmm(e, a, b):
    return _C.bmm(_cast(a, e.dtype), _cast(b, e.dtype))


@lowering(aten.addmm.default)
def _addmm(e, bias, a, b, beta=1, alpha=1):
    return _C.addmm(_cast(bias, e.dtype), _cast(a, e.dtype), _cast(b, e.dtype), beta=beta, alpha=alpha)


@lowering(aten.baddbmm.default)
def _baddbmm(e, bias, a, b, beta=1, alpha=1):
    # Attention scores with an additive mask (multi_head_attention_forward's attn_mask).
    return _C.baddbmm(_cast(bias, e.dtype), _cast(a, e.dtype), _cast(b, e.dtype), beta=beta, alpha=alpha)


@lowering(aten.sum.default, aten.sum.dim_IntList)
def _sum(e, x, dim=None, keepdim=False, dtype=None):
    return _C.sum(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.mean.default, aten.mean.dim)
def _mean(e, x, dim=None, keepdim=False, dtype=None):
    return _C.mean(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.amax.default)
def _amax(e, x, dim=(), keepdim=False):
    return _C.amax(x, _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.amin.default)
def _amin(e, x, dim=(), keepdim=False):
    return _C.amin(x, _reduce_dims(dim, x.dim()), keepdim)


def _norm(x, p, dim, keepdim):
    dims = _reduce_dims(dim, x.dim())
    if p is None or p == 2:
        return _C.sqrt(_C.sum(_C.mul(x, x), dims, keepdim))
    if p == math.inf:
        return _C.amax(_C.abs(x), dims, keepdim)
    if p == 1:
        return _C.sum(_C.abs(x), dims, keepdim)
    if p == 0 or p == -math.inf:
        raise UnsupportedOperatorError(f"lazyrt.torch: norm with p={p}")
    return _C.pow(_C.sum(_C.pow(_C.abs(x), float(p)), dims, keepdim), 1.0 / p)


@lowering(aten.norm.ScalarOpt_dim, aten.norm.Scalar, aten.norm.ScalarOpt_dim_dtype)
def _norm_op(e, x, p=2, dim=None, keepdim=False, dtype=None):
    return _norm(_cast(x, e.dtype), p, dim, keepdim)


@lowering(aten.linalg_vector_norm.default)
def _vector_norm(e, x, ord=2, dim=None, keepdim=False, dtype=None):
    return _norm(_cast(x, e.dtype), ord, dim, keepdim)


@lowering(aten.max.default)
def _max_all(e, x):
    return _C.amax(x, list(range(x.dim())), False)


@lowering(aten.min.default)
def _min_all(e, x):
    return _C.amin(x, list(range(x.dim())), False)


@lowering(aten.argmax.default)
def _argmax(e, x, dim=None, keepdim=False):
    return _C.argmax(x, dim, keepdim)


@lowering(aten.argmin.default)
def _argmin(e, x, dim=None, keepdim=False):
    return _C.argmin(x, dim, keepdim)


# ---- shapes, copies, dtypes --------------------------------------------------------------------

@lowering(aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
          aten.expand.default, aten.expand_copy.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
          aten.unsqueeze.default)
def _to_shape(e, x, *args, **kwargs):
    """Ops that only change the shape (PyTorch's result shape, from the fake result)."""
    if tuple(x.shape) == e.shape:
        return x
    if x.numel() == math.prod(e.shape):
        return _C.reshape(x, e.shape)
    return _C.expand(x, e.shape)


@lowering(aten.copy.default)
def _copy(e, dst, src, non_blocking=False):
    """The functional form of dst.copy_(src): src cast to dst's dtype and broadcast to its shape."""
    x = _cast(src, e.dtype)
    return x if tuple(x.shape) == e.shape else _C.expand(x, e.shape)


@lowering(aten._foreach_zero.default)
def _foreach_zero(e, tensors):
    # zero_grad(set_to_none=False) of a for-each optimizer: zeros of each gradient's shape.
    return [_full(tuple(t.shape), 0, t.dtype) for t in tensors]


@lowering(aten.t.default)
def _t(e, x):
    return x if x.dim() < 2 else _C.t(x)


@lowering(aten.transpose.int)
def _transpose(e, x, d0, d1):
    return _C.transpose(x, d0, d1) if x.dim() else x


@lowering(aten.permute.default)
def _permute(e, x, dims):
    return _C.permute(x, tuple(dims))


@lowering(aten.slice.Tensor)
def _slice(e, x, dim=0, start=None, end=None, step=1):
    dim %= x.dim()
    return _C.slice(x, dim, *_norm_slice(x.shape[dim], start, end, step))


@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(e, x, offset=0, dim1=0, dim2=1):
    # dim1 and dim2 moved last, flattened: the diagonal is every (m + 1)-th element from the
    # offset's start (last in the result)
    nd = x.dim()
    dim1, dim2 = dim1 % nd, dim2 % nd
    rest = [d for d in range(nd) if d not in (dim1, dim2)]
    n, m = x.shape[dim1], x.shape[dim2]
    t = _C.reshape(_C.permute(x, tuple(rest + [dim1, dim2])), tuple(x.shape[d] for d in rest) + (n * m,))
    length = max(min(n, m - offset) if offset >= 0 else min(n + offset, m), 0)
    start = offset if offset >= 0 else -offset * m
    return _C.slice(t, len(rest), start, start + length * (m + 1) - m if length else start, m + 1)


@lowering(aten.diagonal_backward.default)
def _diagonal_backward(e, grad, input_sizes, offset, dim1, dim2):
    x = _C.zeros(tuple(input_sizes), dtype=grad.dtype)  # the map is linear: any input stands in
    return _vjp(lambda t: _diagonal(None, t, offset, dim1, dim2), [x], grad, [True])[0]


@lowering(aten.diag_embed.default)
def _diag_embed(e, x, offset=0, dim1=-2, dim2=-1):
    # x's last dim laid along a diagonal of two new dims (size n + |offset|), zeros elsewhere;
    # built as the last two dims, then moved to dim1 and dim2
    x = _cast(x, e.dtype)
    n = x.shape[-1]
    size = n + abs(offset)
    if size > n:
        x = _C.cat([x, _C.zeros(tuple(x.shape[:-1]) + (size - n,), dtype=x.dtype)], x.dim() - 1)
    i = _C.unsqueeze(lazyrt.arange(size, dtype=_C.int64), 1)
    j = _C.unsqueeze(lazyrt.arange(size, dtype=_C.int64), 0)
    on = _C.eq(_C.sub(j, i), offset)  # [size, size]
    values = _C.unsqueeze(x, x.dim()) if offset >= 0 else _C.unsqueeze(x, x.dim() - 1)
    out = _C.where(on, values, 0.0)  # [..., size, size]
    nd = out.dim()
    dim1, dim2 = dim1 % nd, dim2 % nd
    order = [None] * nd
    order[dim1], order[dim2] = nd - 2, nd - 1
    rest = iter(range(nd - 2))
    return _C.permute(out, tuple(next(rest) if o is None else o for o in order))


@lowering(aten.select.int)
def _select(e, x, dim, index):
    if _is_tensor(index):  # a position read when the graph runs (see _local_scalar_dense)
        return lazyrt.select(x, dim, index)
    size = x.shape[dim]
    return _C.squeeze(_C.narrow(x, dim, index % size, 1), dim)


# A value read from a 0-d integer tensor inside a loop body captured symbolically (`positions`
# in _capture._fake_trace: ``x.select(0, it)`` with `it` the integer carry): an integer symbol
# whose only uses are as positions of select and select_scatter, which lazyrt reads when the
# graph runs (out of range: an error then). The lowering keeps the tensor itself.
_POSITION_USERS = {aten.select.int: 2, aten.select_scatter.default: 3}


def _position_refusal(node):
    src = node.args[0]
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if not (isinstance(val, torch.Tensor) and val.dim() == 0 and not val.dtype.is_floating_point
            and val.dtype != torch.bool):
        return "of a tensor other than a 0-d integer one"
    for user in node.users:
        k = _POSITION_USERS.get(user.target)
        args = list(user.args) + [None] * 4
        if k is None or args[k] is not node or any(a is node for i, a in enumerate(user.args) if i != k):
            return f"used by {op_name(user.target)}: lowered as a position of select only"
    return None


@lowering(aten._local_scalar_dense.default)
def _local_scalar_dense(e, x):
    return x


def _norm_slice(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(min(start + size if start < 0 else start, size), 0)
    end = max(min(end + size if end < 0 else end, size), start)
    return start, end, step


def _scatter_rows(base, src, dim, start, end, step):
    """base with the positions start:end:step along dim replaced by src (whose dim holds one row
    per position): a where over a mask of the positions, with src's rows gathered into place."""
    dim %= base.dim()
    size = base.shape[dim]
    count = src.shape[dim]
    pos = _C.cast(lazyrt.arange(size), _C.float64) - float(start)
    row = _C.floor(_C.div(pos, float(step)))
    hit = _C.logical_and(_C.logical_and(_C.ge(row, 0.0), _C.lt(row, float(count))), _C.eq(_C.mul(row, float(step)), pos))
    rows = _C.cast(_C.clamp(row, 0.0, float(max(count - 1, 0))), _C.int64)
    shape = [1] * base.dim()
    shape[dim] = size
    placed = _C.index_select(src, dim, rows) if count else _C.zeros(tuple(base.shape), dtype=base.dtype)
    return _C.where(_C.reshape(hit, tuple(shape)), placed, base)


@lowering(aten.slice_scatter.default)
def _slice_scatter(e, x, src, dim=0, start=None, end=None, step=1):
    dim %= x.dim()
    start, end, step = _norm_slice(x.shape[dim], start, end, step)
    return _scatter_rows(_cast(x, e.dtype), _cast(src, e.dtype), dim, start, end, step)


@lowering(aten.select_scatter.default)
def _select_scatter(e, x, src, dim, index):
    if _is_tensor(index):  # a position read when the graph runs: written through a view of a copy
        out = _cast(x, e.dtype).clone()
        lazyrt.select(out, dim, index).copy_(_cast(src, e.dtype))
        return out
    dim %= x.dim()
    index %= x.shape[dim]
    return _scatter_rows(_cast(x, e.dtype), _C.unsqueeze(_cast(src, e.dtype), dim), dim, index, index + 1, 1)


@lowering(aten.slice_backward.default)
def _slice_backward(e, grad, input_sizes, dim, start, end, step):
    dim %= len(input_sizes)
    start, end, step = _norm_slice(input_sizes[dim], start, end, step)
    return _scatter_rows(_full(e.shape, 0, e.dtype), _cast(grad, e.dtype), dim, start, end, step)


@lowering(aten.select_backward.default)
def _select_backward(e, grad, input_sizes, dim, index):
    dim %= len(input_sizes)
    index %= input_sizes[dim]
    return _scatter_rows(_full(e.shape, 0, e.dtype), _C.unsqueeze(_cast(grad, e.dtype), dim), dim, index, index + 1, 1)


@lowering(aten.cat.default)
def _cat(e, tensors, dim=0):
    return _C.cat([_cast(t, e.dtype) for t in tensors], dim)


@lowering(aten.split.Tensor, aten.unsafe_split.Tensor)
def _split(e, x, split_size, dim=0):
    return list(lazyrt.split(x, split_size, dim))


@lowering(aten.split_with_sizes.default, aten.unsafe_split_with_sizes.default)
def _split_with_sizes(e, x, split_sizes, dim=0):
    return list(lazyrt.split(x, list(split_sizes), dim))


@lowering(aten.unbind.int)
def _unbind(e, x, dim=0):
    return [_select(None, x, dim, i) for i in range(x.shape[dim])]


@lowering(aten.stack.default)
def _stack(e, tensors, dim=0):
    return _C.stack([_cast(t, e.dtype) for t in tensors], dim)


@lowering(aten.detach.default, aten.alias.default, aten.clone.default, aten.lift_fresh_copy.default,
          aten.lift_fresh.default)
def _identity(e, x, *args, **kwargs):
    return x


@lowering(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _to_copy(e, x, *args, **kwargs):
    return _cast(x, e.dtype)


# ---- factories: PyTorch's shape and dtype, a value ---------------------------------------------

@lowering(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.zero.default,
          aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
          aten.new_empty_strided.default, aten.empty_strided.default)
def _zeros(e, *args, **kwargs):
    # lazyrt has no uninitialized memory: empty is zeros (PyTorch promises nothing about it).
    return _full(e.shape, 0, e.dtype)


@lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(e, *args, **kwargs):
    return _full(e.shape, 1, e.dtype)


@lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(e, *bounds, dtype=None, **kwargs):
    # Position ids (torch.arange(T) in a GPT's forward): lazyrt's arange, in PyTorch's dtype
    # (a float bound without a dtype gives the default float dtype, as in eager).
    return lazyrt.arange(*bounds, dtype=e.dtype)


# ---- random numbers: lazyrt's generator (its state is replayed state), not torch's stream ----

# functionalize leaves bernoulli_ (no functional variant in 1.13) on a fresh empty tensor that
# nothing else reads; LoweredGraph checks that, so the in-place op can be lowered as a new value.
FRESH_IN_PLACE = {aten.bernoulli_.float}


@lowering(aten.bernoulli.p, aten.bernoulli_.float)
def _bernoulli_p(e, x, p=0.5, generator=None):
    if generator is not None:
        raise UnsupportedOperatorError("lazyrt.torch: bernoulli with a torch.Generator")
    draws = lazyrt.rand(e.shape, dtype=_C.float32 if e.dtype in (_C.float16, _C.bfloat16) else e.dtype)
    return _C.cast(_C.lt(draws, float(p)), e.dtype)


@lowering(aten.rand_like.default, aten.rand.default)
def _rand(e, *args, generator=None, **kwargs):
    if generator is not None:
        raise UnsupportedOperatorError("lazyrt.torch: rand with a torch.Generator")
    return lazyrt.rand(e.shape, dtype=e.dtype)


@lowering(aten.randn_like.default, aten.randn.default)
def _randn(e, *args, generator=None, **kwargs):
    return _standard_normal(e, generator)


def _standard_normal(e, generator):
    if generator is not None:
        raise UnsupportedOperatorError("lazyrt.torch: a normal draw with a torch.Generator")
    if e.dtype in (_C.float16, _C.bfloat16):  # drawn in float32, as a half draw would lose its tails
        return _C.cast(lazyrt.randn(e.shape, dtype=_C.float32), e.dtype)
    return lazyrt.randn(e.shape, dtype=e.dtype)


def _scaled_normal(e, mean, std, generator):
    return _C.add(_C.mul(_standard_normal(e, generator), _cast(std, e.dtype)), _cast(mean, e.dtype))


@lowering(aten.normal_functional.default)  # x.normal_(mean, std), functionalized
def _normal_functional(e, x, mean=0.0, std=1.0, generator=None):
    return _scaled_normal(e, mean, std, generator)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def _normal(e, mean, std=1.0, generator=None):
    return _scaled_normal(e, mean, std, generator)


@lowering(aten.normal.float_float)
def _normal_of_size(e, mean, std, size, generator=None, **kwargs):
    return _scaled_normal(e, mean, std, generator)


@lowering(aten.full.default)
def _full_op(e, size, value, **kwargs):
    return _full(e.shape, value, e.dtype)


@lowering(aten.full_like.default)
def _full_like(e, x, value, *args, **kwargs):
    return _full(e.shape, value, e.dtype)


@lowering(aten.new_full.default)
def _new_full(e, x, size, value, *args, **kwargs):
    return _full(e.shape, value, e.dtype)


@lowering(aten.fill.Scalar)
def _fill(e, x, value):
    return _full(e.shape, value, e.dtype)


@lowering(aten.fill.Tensor)
def _fill_tensor(e, x, value):
    return _C.expand(_cast(value, e.dtype), e.shape)


@lowering(aten.scalar_tensor.default)
def _scalar_tensor(e, value, **kwargs):
    return _full((), value, e.dtype)


@lowering(aten.var.correction)
def _var(e, x, dim=None, correction=None, keepdim=False):
    return lazyrt.var(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), correction=1 if correction is None else correction,
                      keepdim=keepdim)


@lowering(aten.var_mean.correction)
def _var_mean(e, x, dim=None, correction=None, keepdim=False):
    x, dims = _cast(x, e.dtype), _reduce_dims(dim, x.dim())
    return [lazyrt.var(x, dims, correction=1 if correction is None else correction, keepdim=keepdim),
            _C.mean(x, dims, keepdim)]


# ---- layer norm: (out, mean, rstd) as torch's kernel gives them; the backward by lazyrt's autograd
#
# Over bfloat16 or float16 values, ATen's CPU normalization kernels compute in float32 (their
# statistics, the normalization, weight and bias) and round each result once; so do these (a
# norm computed in bfloat16 op by op rounds every intermediate, and the gradients through it
# came out 2-3x further from float64 than eager's under autocast).

_HALF_FLOATS = (_C.bfloat16, _C.float16)


def _in_float32(*xs):
    """The tensors among xs of a 16-bit float dtype in float32; the others as they are."""
    return [_cast(x, _C.float32) if _is_tensor(x) and x.dtype in _HALF_FLOATS else x for x in xs]


def _stats_dtype(x, weight, bias):
    """The dtype of the saved mean and inverse deviation, as ATen's CPU kernels make them: the
    input's, but float32 for a 16-bit input with a float32 weight or bias (mixed types, as under
    autocast, where the norm's parameters stay float32). PyTorch's fake kernels say the input's
    dtype there; lazyrt gives the CPU kernel's values, so it follows the CPU kernel."""
    mixed = x.dtype in _HALF_FLOATS and any(_is_tensor(t) and t.dtype is _C.float32 for t in (weight, bias))
    return _C.float32 if mixed else x.dtype


class _KernelDtypes(list):
    """The results of a lowering in the dtypes ATen's CPU kernel gives them, where PyTorch's fake
    kernel (the captured graph's dtypes) says others: getitem reads them as they are, not cast
    to the captured dtype."""


class _KeepDtype:
    """A lowered result that `_checked` keeps in its own dtype (see _KernelDtypes)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _norm_forward(lower, x, weight, bias):
    """[out, mean, rstd] of lower(x, weight, bias), run in float32 where they are 16-bit; each
    rounded once to the dtype ATen's CPU kernel gives it."""
    out_dtype, stats = x.dtype, _stats_dtype(x, weight, bias)
    out, mean, rstd = lower(*_in_float32(x, weight, bias))
    return _KernelDtypes([_cast(out, out_dtype), _cast(mean, stats), _cast(rstd, stats)])


def _norm_backward(lower, grad, x, mean, rstd, weight, bias_dtype):
    """[dx, dweight, dbias] of lower(grad, x, mean, rstd, weight), run in float32 where they are
    16-bit; dx in x's dtype, dweight in the weight's, dbias in bias_dtype, each rounded once."""
    dtypes = (x.dtype, weight.dtype if _is_tensor(weight) else None, bias_dtype)
    grads = lower(*_in_float32(grad, x, mean, rstd, weight))
    return _KernelDtypes(_cast(g, d) if d is not None else g for g, d in zip(grads, dtypes))


def _layer_norm_parts(x, normalized_shape, weight, bias, eps):
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    mean = _C.mean(x, dims, True)
    centered = x - mean
    rstd = _C.rsqrt(_C.mean(centered * centered, dims, True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lowering(aten.native_layer_norm.default)
def _native_layer_norm(e, x, normalized_shape, weight, bias, eps):
    return _norm_forward(lambda x, w, b: _layer_norm_parts(x, normalized_shape, w, b, eps), x, weight, bias)


@lowering(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(e, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    # From the saved statistics, as torch's kernel: with xhat = (x - mean) * rstd and g the
    # gradient times the weight, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over the
    # normalized dims; the weight's and bias's gradients sum over the others.
    def lower(grad, x, mean, rstd, weight):
        dims = list(range(x.dim() - len(normalized_shape), x.dim()))
        lead = list(range(x.dim() - len(normalized_shape)))
        xhat = (x - mean) * rstd
        g = grad * weight if weight is not None else grad
        dx = dw = db = None
        if output_mask[0]:
            dx = rstd * (g - _C.mean(g, dims, True) - xhat * _C.mean(g * xhat, dims, True))
        if output_mask[1] and weight is not None:
            dw = _C.sum(grad * xhat, lead, False) if lead else grad * xhat
        if output_mask[2] and bias is not None:
            db = _C.sum(grad, lead, False) if lead else grad
        return dx, dw, db
    return _norm_backward(lower, grad, x, mean, rstd, weight, bias.dtype if _is_tensor(bias) else None)


# ---- group norm: (out, mean, rstd) over [N, group, C / group * HxW], as torch's kernel ---------

def _per_channel(w, dim):
    """A [C] tensor shaped to broadcast over the channels of a [N, C, *] tensor of `dim` dims."""
    return _C.reshape(w, (1, -1) + (1,) * (dim - 2))


@lowering(aten.native_group_norm.default)
def _native_group_norm(e, x, weight, bias, N, C, HxW, group, eps):
    def lower(x, weight, bias):
        g = _C.reshape(x, (N, group, -1))
        mean = _C.mean(g, [2], True)
        centered = g - mean
        rstd = _C.rsqrt(_C.mean(centered * centered, [2], True) + eps)
        out = _C.reshape(centered * rstd, tuple(x.shape))
        if weight is not None:
            out = out * _per_channel(weight, x.dim())
        if bias is not None:
            out = out + _per_channel(bias, x.dim())
        return out, _C.reshape(mean, (N, group)), _C.reshape(rstd, (N, group))
    return _norm_forward(lower, x, weight, bias)


@lowering(aten.native_group_norm_backward.default)
def _native_group_norm_backward(e, grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    # As layer norm's, per group: with xhat = (x - mean) * rstd and g the gradient times the
    # weight, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over each group's elements; the
    # weight's and bias's gradients sum over all but the channels.
    def lower(grad, x, mean, rstd, weight):
        shape, grouped = tuple(x.shape), (N, group, -1)
        mean3, rstd3 = _C.reshape(mean, (N, group, 1)), _C.reshape(rstd, (N, group, 1))
        xhat = (_C.reshape(x, grouped) - mean3) * rstd3
        dx = dw = db = None
        if output_mask[0]:
            g = _C.reshape(grad * _per_channel(weight, x.dim()) if weight is not None else grad, grouped)
            dx = _C.reshape(rstd3 * (g - _C.mean(g, [2], True) - xhat * _C.mean(g * xhat, [2], True)), shape)
        others = [0] + list(range(2, x.dim()))
        if output_mask[1]:
            dw = _C.sum(grad * _C.reshape(xhat, shape), others, False)
        if output_mask[2]:
            db = _C.sum(grad, others, False)
        return dx, dw, db
    return _norm_backward(lower, grad, x, mean, rstd, weight, weight.dtype if _is_tensor(weight) else x.dtype)


# ---- convolution and pooling -------------------------------------------------------------------
# Forward ops map to lazyrt's; most backward ops are the vector-Jacobian product of that
# forward by lazyrt's own autograd (`_vjp`: the recomputed forward is the same graph, which
# CSE merges with the forward's), so the gradients are lazyrt's gradient rules. 1-d
# convolutions are 2-d ones over a unit height; a transposed convolution, forward and
# backward, is made of the direct one's (see `_Conv`). max_pool2d's backward scatters through
# the indices, as torch's does.

def _vjp(forward, inputs, grad, wanted):
    """The gradients of forward(*inputs) for grad, for the inputs `wanted` marks (None else)."""
    with lazyrt.enable_grad():
        leaves = [x.detach() for x in inputs]
        for x, w in zip(leaves, wanted):
            if w:
                x.requires_grad_()
        forward(*leaves).backward(grad)
    return [x.grad if w else None for x, w in zip(leaves, wanted)]


def _autograd_records():
    """Whether lazyrt's autograd records here: not while a loop body is traced (a loop's
    gradient is taken of its whole body)."""
    with lazyrt.enable_grad():
        return _C.neg(_C.zeros((), dtype=_C.float32).requires_grad_()).requires_grad


def _pair(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _single(v):
    return v[0] if isinstance(v, (list, tuple)) else v


def _conv_refusal(node):
    """Why a convolution node is not lowered (None when it is): its input has neither 1 nor 2
    spatial dims."""
    x = node.args[0] if node.target is aten.convolution.default else node.args[1]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dim() not in (3, 4):
        return f"a {val.dim() - 2}-d convolution; lazyrt lowers 1-d and 2-d ones"
    return None


class _Conv:
    """aten.convolution's attributes, for computing a 1-d or 2-d convolution as a 2-d one: a
    1-d convolution's tensors ([N, C, L] input, [O, C / groups, K] weight, their gradients)
    gain a unit height dim (`lift`) and lose it again (`drop`).

    `direct(a, w)` is lazyrt's conv2d. A transposed convolution is the vector-Jacobian product
    of the direct one with respect to its input (`transposed`): lazyrt's input-gradient kernel
    of conv2d. Its backward is made of the direct one's too: the input's gradient is the direct
    convolution of the output gradient, the weight's is the direct one's weight gradient at
    input = output gradient and output gradient = the transposed one's input."""

    def __init__(self, x, stride, padding, dilation, output_padding, groups):
        if x.dim() not in (3, 4):
            raise UnsupportedOperatorError(f"lazyrt.torch: convolution of a {x.dim()}-d input: lazyrt lowers 1-d "
                                           "and 2-d convolutions")
        self.one_d = x.dim() == 3
        if self.one_d:
            self.stride, self.padding = (1, _single(stride)), (0, _single(padding))
            self.dilation, self.output_padding = (1, _single(dilation)), (0, _single(output_padding))
        else:
            self.stride, self.padding = _pair(stride), _pair(padding)
            self.dilation, self.output_padding = _pair(dilation), _pair(output_padding)
        self.groups = groups

    def lift(self, t):
        return _C.unsqueeze(t, 2) if self.one_d else t

    def drop(self, t):
        return _C.squeeze(t, 2) if self.one_d and t is not None else t

    def lift_shape(self, shape):
        return tuple(shape[:2]) + (1,) + tuple(shape[2:]) if self.one_d else tuple(shape)

    def direct(self, a, w, bias=None):
        return lazyrt.nn.functional.conv2d(a, w, bias, self.stride, self.padding, self.dilation, self.groups)

    def cotangent(self, x, w, shape):
        """x (a transposed convolution's input) zero-padded at the bottom and right to the size
        of the direct convolution's output for an input of `shape`: larger than x where
        output_padding >= stride (allowed when the dilation is larger still), and those last rows
        and columns reach no output."""
        extra = []
        for d in (1, 0):  # pad's order: the last dim first
            n, k = shape[2 + d], w.shape[2 + d]
            s, p, dl = self.stride[d], self.padding[d], self.dilation[d]
            extra += [0, (n + 2 * p - dl * (k - 1) - 1) // s + 1 - x.shape[2 + d]]
        return _C.pad(x, extra) if any(extra) else x

    def transposed(self, x, w, shape):
        """The transposed convolution of x (lifted) to an output of `shape` (lifted)."""
        if not _autograd_records():
            # A loop body: the same map as lazyrt.nn.functional's composition (stride - 1 zeros
            # between the input's values, a stride-1 convolution with the flipped weight: stride^2
            # times the multiply-adds of the input-gradient kernel).
            return lazyrt.nn.functional.conv_transpose2d(x, w, None, self.stride, self.padding, self.output_padding,
                                                         self.groups, self.dilation)
        primal = _full(shape, 0, x.dtype)
        return _vjp(lambda a: self.direct(a, w), [primal], self.cotangent(x, w, shape), [True])[0]


@lowering(aten.convolution.default)
def _convolution(e, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    c = _Conv(x, stride, padding, dilation, output_padding, groups)
    x, w = c.lift(x), c.lift(w)
    if not transposed:
        return c.drop(c.direct(x, w, bias))
    y = c.transposed(x, w, c.lift_shape(e.shape))
    if bias is not None:
        y = _C.add(y, _C.reshape(bias, (1, -1, 1, 1)))
    return c.drop(y)


@lowering(aten.convolution_backward.default)
def _convolution_backward(e, grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    c = _Conv(x, stride, padding, dilation, output_padding, groups)
    grad, x, w = c.lift(grad), c.lift(x), c.lift(w)
    gx = gw = None
    if transposed:
        if output_mask[0]:  # the direct output's last rows and columns (cotangent's padding) dropped
            gx = c.direct(grad, w)[:, :, :x.shape[2], :x.shape[3]]
        if output_mask[1]:
            gw = _vjp(c.direct, [grad, w], c.cotangent(x, w, tuple(grad.shape)), [False, True])[1]
    elif output_mask[0] or output_mask[1]:
        gx, gw = _vjp(c.direct, [x, w], grad, list(output_mask[:2]))
    gb = _C.sum(grad, [0, 2, 3]) if output_mask[2] else None
    return [c.drop(gx), c.drop(gw), gb]


# Ops lowered for some of their attributes only: op -> fn(node) giving why that node is not
# lowered (None when it is). LoweredGraph treats such a node as an op without a lowering: a
# graph break where breaks are allowed, UnsupportedOperatorError elsewhere.
def _bitwise_not_refusal(node):
    dtype = node.meta["val"].dtype
    return None if dtype == torch.bool else f"of {dtype}: lowered for bool only"


REFUSALS = {aten.convolution.default: _conv_refusal, aten.convolution_backward.default: _conv_refusal,
            aten.bitwise_not.default: _bitwise_not_refusal,
            aten._local_scalar_dense.default: _position_refusal}  # and the indexing ops' (below)


def _pool_window(kernel_size, stride, padding, dilation):
    k = _pair(kernel_size)
    return k, (_pair(stride) if stride else k), _pair(padding), _pair(dilation)


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(e, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _pool_window(kernel_size, stride, padding, dilation)
    return list(lazyrt.nn.functional.max_pool2d(x, k, s, p, d, ceil_mode, return_indices=True))


@lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(e, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    h, w = x.shape[-2:]
    planes = 1
    for d in x.shape[:-2]:
        planes *= d
    g = _C.reshape(_cast(grad, e.dtype), (planes, -1))
    i = _C.reshape(indices, (planes, -1))
    return _C.reshape(lazyrt.scatter_add(_full((planes, h * w), 0, e.dtype), 1, i, g), e.shape)


@lowering(aten.avg_pool2d.default)
def _avg_pool2d(e, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    k, s, p, _ = _pool_window(kernel_size, stride, padding, 1)
    return lazyrt.nn.functional.avg_pool2d(x, k, s, p, ceil_mode, count_include_pad, divisor_override)


@lowering(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(e, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _ = _pool_window(kernel_size, stride, padding, 1)
    pool = lambda a: lazyrt.nn.functional.avg_pool2d(a, k, s, p, ceil_mode, count_include_pad, divisor_override)
    return _vjp(pool, [x], grad, [True])[0]


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(e, x, output_size):
    return lazyrt.nn.functional.adaptive_avg_pool2d(x, tuple(output_size))


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(e, grad, x):
    size = tuple(grad.shape[-2:])
    return _vjp(lambda a: lazyrt.nn.functional.adaptive_avg_pool2d(a, size), [x], grad, [True])[0]


# ---- embeddings ------------------------------------------------------------------------------

@lowering(aten.embedding.default)
def _embedding(e, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    flat = _C.reshape(indices, (-1,))
    return _C.reshape(_C.index_select(weight, 0, flat), e.shape)


@lowering(aten.embedding_dense_backward.default)
def _embedding_backward(e, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise UnsupportedOperatorError("lazyrt.torch: embedding_dense_backward with scale_grad_by_freq=True")
    flat = _C.reshape(indices, (-1,))
    rows = _C.reshape(_cast(grad, e.dtype), (-1, e.shape[1]))
    if padding_idx >= 0:
        rows = _C.where(_C.unsqueeze(_C.eq(flat, padding_idx), 1), 0.0, rows)
    return _C.index_add(_full(e.shape, 0, e.dtype), 0, flat, rows)


# ---- advanced indexing: x[i, :, j] and its writes -------------------------------------------

def _index_key(indices, what):
    """aten's index list (a tensor or None per leading dim) as lazyrt's indexing key."""
    key = []
    for i in indices:
        if i is None:
            key.append(slice(None))
        elif i.dtype is _C.bool:
            # a mask selects as many elements as it has true values: a shape only its values give
            raise UnsupportedOperatorError(f"lazyrt.torch: {what} with a boolean mask")
        else:
            key.append(_cast(i, _C.int64))
    return tuple(key)


@lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(e, x, indices):
    return x[_index_key(indices, "index")]


def _masked_put(indices, values, accumulate):
    """Whether index_put is x[mask] = v: one boolean mask over x's leading dims and one value."""
    return (len(indices) == 1 and indices[0] is not None and _val_dtype(indices[0]) == torch.bool
            and _numel(values) == 1 and not accumulate)


def _val_dtype(x):
    """The torch dtype of a graph node's value (when refusing) or of a lowered value."""
    if _is_tensor(x):
        return _TORCH_DTYPES[x.dtype]
    v = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    return v.dtype if isinstance(v, torch.Tensor) else None


def _numel(x):
    if _is_tensor(x):
        return math.prod(x.shape)
    v = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    return v.numel() if isinstance(v, torch.Tensor) else 1


def _index_refusal(node):
    indices = node.args[1]
    if not any(i is not None and _val_dtype(i) in (torch.bool, torch.uint8) for i in indices):
        return None
    if node.target in (aten.index_put.default, aten._unsafe_index_put.default) and \
            _masked_put(indices, node.args[2], node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate")):
        return None
    return "with a boolean mask (a shape only its values give)"


REFUSALS.update(dict.fromkeys((aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default,
                                aten._unsafe_index_put.default), _index_refusal))


@lowering(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(e, x, indices, values, accumulate=False):
    if _masked_put(indices, values, accumulate):
        # x[mask] = v (Rprop's grad[sign == etaminus] = 0): v where the mask is set
        mask = indices[0]
        for _ in range(x.dim() - mask.dim()):
            mask = _C.unsqueeze(mask, -1)
        return _C.where(mask, _C.reshape(_cast(values, e.dtype), ()), _cast(x, e.dtype))
    key = _index_key(indices, "index_put")
    return _C.index_put(_cast(x, e.dtype), tuple(None if isinstance(k, slice) else k for k in key),
                        _cast(values, e.dtype), accumulate)


@lowering(aten.repeat.default)
def _repeat(e, x, repeats):
    return _C.repeat(x, list(repeats))


@lowering(operator.getitem)
def _getitem(e, values, index):
    return _KeepDtype(values[index]) if isinstance(values, _KernelDtypes) else values[index]


# ---- the interpreter ---------------------------------------------------------------------------

def _view_copies():
    """functionalize writes views inside loop bodies as their copying forms (t_copy,
    view_copy, select_copy, ...): the same values, lowered as the views are."""
    for op in list(LOWERINGS):
        if not isinstance(op, torch._ops.OpOverload):
            continue
        packet = getattr(aten, op._schema.name.split("::")[1] + "_copy", None)
        overload = getattr(packet, op._overloadname, None) if packet is not None else None
        if overload is not None and overload not in LOWERINGS and torch.Tag.view_copy in overload.tags:
            LOWERINGS[overload] = LOWERINGS[op]


_view_copies()


# ---- PyTorch's structured loops (torch._higher_order_ops) -----------------------------------

def _body_function(gm, outer):
    """A traced body (a graph module whose placeholders are the carries, then `outer`: the
    values the loop passes in from outside) as a function of the carries' lazyrt values."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0]
    single = not isinstance(results, (tuple, list))
    lowered = LoweredGraph(gm, [results] if single else list(results))
    constants = [lazyrt.from_torch(c) for c in lowered.constants]

    def run(*carries):
        out = lowered(*carries, *outer, *constants)
        return out[0] if single else tuple(out)
    return run


@lowering(torch.ops.higher_order.while_loop)
def _while_loop(e, cond_gm, body_gm, carried, additional=()):
    # torch._higher_order_ops.while_loop: one lazyrt loop node, compiled once for any trip count.
    outer = list(additional)
    return list(lazyrt.while_loop(_body_function(cond_gm, outer), _body_function(body_gm, outer), tuple(carried)))


@lowering(torch.ops.higher_order.scan)
def _scan(e, combine_gm, init, xs, additional=()):
    # torch._higher_order_ops.scan: one lazyrt scan node. The combine graph takes the carries,
    # one row of each stacked input, then the outer values; it gives the next carries, then
    # the rows of the stacked outputs.
    step, n = _body_function(combine_gm, list(additional)), len(init)

    def body(carry, x):
        out = step(*carry, *x)
        out = out if isinstance(out, tuple) else (out,)
        return tuple(out[:n]), tuple(out[n:])
    carry, ys = lazyrt.scan(body, tuple(init), tuple(xs))
    return list(carry) + list(ys)


def live_nodes(graph, roots):
    """The nodes `roots` depend on, in graph order."""
    live = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    return [n for n in graph.nodes if n in live]


def op_name(target):
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


class LoweredGraph:
    """The part of an FX graph module that computes `roots`, ready to run on lazyrt tensors.

    Its inputs are one lazyrt tensor per placeholder (in graph order) followed by one per
    constant (`constants`: the torch tensors the graph's get_attr nodes hold — tensors the
    step read from outside its inputs, or made itself); calling it returns the lazyrt values of
    the roots. Constants are inputs rather than values frozen at capture, so a tensor the step
    reads from a closure and that changes in place between calls is read anew. Raises
    UnsupportedOperatorError at construction for an op without a lowering, unless
    `graph_breaks`: then such ops (`eager`) run in PyTorch eager, and `run` compiles the lowered
    pieces between them with lazyrt.compile_step.
    """

    def __init__(self, graph_module, roots, graph_breaks=False):
        self.graph_module = graph_module
        self.roots = list(roots)
        self.placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        self.nodes = live_nodes(graph_module.graph, self.roots)
        self.constants, self.constant_index = [], {}  # unique torch tensors; get_attr node -> index
        seen = {}
        missing = []
        why = {}  # op name -> why its node is not lowered, for ops lowered for some attributes only
        for n in self.nodes:
            if n.op == "call_function" and n.target not in LOWERINGS:
                missing.append(n)
            elif n.op == "call_function" and n.target in REFUSALS and REFUSALS[n.target](n):
                missing.append(n)
                why.setdefault(op_name(n.target), REFUSALS[n.target](n))
            elif n.op == "call_function" and n.target in FRESH_IN_PLACE:
                target = n.args[0]
                if not (isinstance(target, torch.fx.Node) and len(target.users) == 1 and
                        target.target in (aten.empty_like.default, aten.empty.memory_format)):
                    raise UnsupportedOperatorError(f"lazyrt.torch: {op_name(n.target)} (node '{n.name}') changes a "
                                                   "tensor that other ops read; only its functional form is lowered")
            elif n.op == "get_attr":
                value = getattr(graph_module, n.target)
                if isinstance(value, torch.fx.GraphModule):
                    continue  # a loop's body, read by its higher-order op's lowering
                if not isinstance(value, torch.Tensor):
                    raise UnsupportedOperatorError(f"lazyrt.torch: the graph reads a constant of type "
                                                   f"{type(value).__name__} ({n.target})")
                if value.dtype not in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bool):
                    raise UnsupportedOperatorError(f"lazyrt.torch: the step reads a tensor of dtype {value.dtype} "
                                                   f"from outside its inputs ({n.target})")
                if id(value) not in seen:
                    seen[id(value)] = len(self.constants)
                    self.constants.append(value)
                self.constant_index[n] = seen[id(value)]
            elif n.op in ("call_method", "call_module"):
                missing.append(n)
        if missing and (not graph_breaks or any(n.op != "call_function" for n in missing)):
            names = sorted({op_name(n.target) for n in missing})
            first = missing[0]
            raise UnsupportedOperatorError(
                f"lazyrt.torch: no lowering to lazyrt for "
                f"{', '.join(name + (f' ({why[name]})' if name in why else '') for name in names)} "
                f"(first use: node '{first.name}'"
                f"{_stack_hint(first)}); a graph break cannot run it here, so this cannot be compiled")
        self.expect = {n: Expect(n) for n in self.nodes if n.op == "call_function"}
        # Ops run by PyTorch eager: those without a lowering, and the items taken of their results.
        self.eager = set()
        missing_set = set(missing)
        for n in self.nodes:
            if n in missing_set or (n.target is operator.getitem and n.args[0] in self.eager):
                self.eager.add(n)
        for name in sorted({op_name(n.target) for n in missing} - _WARNED_BREAKS):
            _WARNED_BREAKS.add(name)
            first = next(n for n in missing if op_name(n.target) == name)
            reason = f" ({why[name]})" if name in why else ""
            warnings.warn(f"lazyrt.torch: graph break: {name}{reason} has no lowering to lazyrt and runs in PyTorch "
                          f"eager between compiled pieces of the step (node '{first.name}'{_stack_hint(first)})",
                          GraphBreakWarning, stacklevel=2)
        self.pieces = _pieces(self.nodes, self.eager, self.roots) if self.eager else None
        self.compiled = []  # per lowered piece: its lazyrt.compile_step, made by the first run

    def _inputs_env(self, inputs):
        count = len(self.placeholders) + len(self.constants)
        if len(inputs) != count:
            raise TypeError(f"LoweredGraph: expected {count} inputs, got {len(inputs)}")
        env = dict(zip(self.placeholders, inputs))
        for n, k in self.constant_index.items():
            env[n] = inputs[len(self.placeholders) + k]
        for n in self.nodes:
            if _subgraph(n) is not None:
                env[n] = _subgraph(n)
        return env

    def __call__(self, *inputs):
        """The roots' values, every op interpreted now (eager ones through torch)."""
        env = self._inputs_env(inputs)
        torch_env = {}
        for n in self.nodes:
            if n in env:
                continue
            if n in self.eager:
                _run_eager(n, self.expect[n], env, torch_env)
            else:
                _lower_node(n, self.expect[n], env)
        return [env[r] for r in self.roots]

    def run(self, inputs):
        """The roots' values: the whole graph as one lazyrt.compile_step or, with graph breaks,
        each lowered piece as its own compile_step and the eager ops between them in torch."""
        if self.pieces is None:
            if not self.compiled:
                self.compiled.append(lazyrt.compile_step(self, list(inputs), guard_reads=False))
            outs = self.compiled[0](*inputs)
            return [outs] if isinstance(outs, lazyrt.Tensor) else list(outs)
        env = self._inputs_env(inputs)
        torch_env = {}
        k = 0

        def lazy_value(n):  # an eager op's result is made a lazyrt tensor where a piece reads it
            v = env.get(n, _MISSING)
            if v is _MISSING:
                v = env[n] = lazyrt.from_torch(torch_env[n].contiguous())
            return v
        for kind, nodes, needs, gives in self.pieces:
            if kind == "eager":
                for n in nodes:
                    _run_eager(n, self.expect[n], env, torch_env, convert=False)
                _C._metrics._increment("GraphBreak", sum(n.target is not operator.getitem for n in nodes))
                continue
            args = [lazy_value(n) for n in needs]
            if k == len(self.compiled):
                self.compiled.append(lazyrt.compile_step(_Piece(nodes, needs, gives, self.expect), args, guard_reads=False))
            outs = self.compiled[k](*args)
            k += 1
            env.update(zip(gives, [outs] if isinstance(outs, lazyrt.Tensor) else outs))
        return [lazy_value(r) if isinstance(r, torch.fx.Node) else r for r in self.roots]

    @property
    def traces(self):
        """How many times lazyrt traced the compiled pieces."""
        return sum(c.traces for c in self.compiled)


def _subgraph(node):
    """The graph module a get_attr node names (a higher-order op's body), else None."""
    if node.op != "get_attr":
        return None
    value = getattr(node.graph.owning_module, node.target, None)
    return value if isinstance(value, torch.fx.GraphModule) else None


def _lower_node(n, e, env):
    def value(a):
        return env[a] if a in env or _subgraph(a) is None else _subgraph(a)
    args = torch.fx.node.map_arg(n.args, value)
    kwargs = dict(torch.fx.node.map_arg(n.kwargs, value))
    kwargs.pop("device", None)
    try:
        result = LOWERINGS[n.target](e, *args, **kwargs)
    except UnsupportedOperatorError:
        raise
    except Exception as exc:
        raise lazyrt.Error(f"lazyrt.torch: lowering {op_name(n.target)} (node '{n.name}') failed: "
                           f"{type(exc).__name__}: {exc}") from exc
    env[n] = _checked(n, e, result)


_MISSING = object()


def _run_eager(n, e, env, torch_env, convert=True):
    """Runs node n in PyTorch eager on the torch values of its inputs (a graph break). Its
    result goes to torch_env and, with convert, to env as a lazyrt tensor (else the caller
    converts it where a lowered op reads it)."""
    def torch_value(a):
        v = torch_env.get(a, _MISSING)
        if v is _MISSING:
            v = env[a]
            v = torch_env[a] = _traced_layout(lazyrt.to_torch(v), a) if _is_tensor(v) else v
        return v

    args = torch.fx.node.map_arg(n.args, torch_value)
    kwargs = torch.fx.node.map_arg(n.kwargs, torch_value)
    try:
        with torch.no_grad():
            result = n.target(*args, **kwargs)
    except Exception as exc:
        raise lazyrt.Error(f"lazyrt.torch: {op_name(n.target)} (node '{n.name}'), run in PyTorch eager at a graph "
                           f"break, failed: {type(exc).__name__}: {exc}") from exc
    torch_env[n] = result
    if isinstance(result, torch.Tensor):
        if e.shape is not None and (tuple(result.shape) != e.shape or lazy_dtype(result.dtype) is not e.dtype):
            raise lazyrt.Error(f"lazyrt.torch: {op_name(n.target)} (node '{n.name}') gave {result.dtype}"
                               f"{list(result.shape)} in eager, the captured graph has {list(e.shape)}")
        if convert:
            env[n] = lazyrt.from_torch(result.contiguous())
    else:
        env[n] = result  # a tuple: its items are taken by eager getitem nodes


def _traced_layout(t, node):
    """`t` laid out in memory as the traced value of `node` was: an op run at a graph break sees the
    strides it saw while the step was traced. Some ops' results depend on them, not only on the
    values (linalg_det factors the transpose of a contiguous matrix, and the captured backward
    solves with that factorization), so an input that arrives contiguous where the trace had a
    view would make the eager op disagree with the rest of the graph."""
    stride = node.meta.get("lazyrt_stride", _MISSING)
    if stride is _MISSING:  # the traced value's shape and strides, read once per node
        val = node.meta.get("val")
        stride = node.meta["lazyrt_stride"] = (
            (tuple(val.shape), tuple(int(s) for s in val.stride())) if isinstance(val, torch.Tensor) else None)
    if stride is None or t.shape != stride[0] or t.numel() <= 1:
        return t
    stride = stride[1]
    if t.stride() == stride:
        return t
    shape = tuple(int(s) for s in t.shape)
    # Expanded dims (stride 0) are filled once and expanded again.
    small = [1 if st == 0 else s for s, st in zip(shape, stride)]
    src = t
    for d, (s, st) in enumerate(zip(shape, stride)):
        if st == 0 and s > 1:
            src = src.narrow(d, 0, 1)
    reach = 0  # the furthest element the dims of smaller strides reach
    for st, s in sorted((st, s) for s, st in zip(small, stride) if s > 1):
        if st <= reach:
            return t  # overlapping windows (unfold) cannot be written one element per place
        reach += (s - 1) * st
    out = torch.empty(reach + 1, dtype=t.dtype).as_strided(small, stride)
    out.copy_(src)
    return out.expand(shape)


class _Piece:
    """Lowered nodes between graph breaks, as a function of the values they read from outside
    (`needs`) returning those that later pieces or the roots read (`gives`)."""

    def __init__(self, nodes, needs, gives, expect):
        self.nodes, self.needs, self.gives, self.expect = nodes, needs, gives, expect

    def __call__(self, *values):
        env = dict(zip(self.needs, values))
        for n in self.nodes:
            _lower_node(n, self.expect[n], env)
        # A compiled step returns what it computes: a value the piece only passes on (an input,
        # or the detach of one, such as statistics an eager op saved for its backward) leaves
        # through an identity op (x * 1 keeps every value's bits; x | x for bool).
        return [_computed(env[n]) for n in self.gives]


def _computed(v):
    if not _is_tensor(v) or v.is_pending():
        return v
    return v | v if v.dtype == _C.bool else v * 1


def _pieces(nodes, eager, roots):
    """The live call nodes in runs of lowered and eager ones: [(kind, nodes, needs, gives)].
    Items taken of a multi-result op (getitem) go right after it, so no list crosses pieces."""
    items = {}
    for n in nodes:
        if n.target is operator.getitem and n.op == "call_function":
            items.setdefault(n.args[0], []).append(n)
    order = []
    for n in nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        order.append(n)
        order.extend(items.get(n, []))
    runs = []
    for n in order:
        kind = "eager" if n in eager else "lazy"
        if not runs or runs[-1][0] != kind:
            runs.append((kind, []))
        runs[-1][1].append(n)
    piece_of = {n: k for k, (_, run) in enumerate(runs) for n in run}
    root_set = set(roots)
    pieces = []
    for k, (kind, run) in enumerate(runs):
        inside = set(run)
        needs = []
        for n in run:
            for a in n.all_input_nodes:
                if a not in inside and a not in needs and _subgraph(a) is None:
                    needs.append(a)
        gives = [n for n in run if n in root_set or any(piece_of.get(u, k) != k for u in n.users)]
        pieces.append((kind, run, needs, gives))
    return pieces


def _checked(node, e, result):
    """The result in PyTorch's dtype (or its own, see _KeepDtype), after checking its shape
    against PyTorch's."""
    keep = isinstance(result, _KeepDtype)
    if keep:
        result = result.value
    if not _is_tensor(result) or e.shape is None:
        return result
    if tuple(result.shape) != e.shape:
        raise lazyrt.Error(f"lazyrt.torch: lowering {op_name(node.target)} (node '{node.name}') gave shape "
                           f"{list(result.shape)}, PyTorch's is {list(e.shape)}")
    return result if keep else _cast(result, e.dtype)


def _stack_hint(node):
    trace = node.meta.get("stack_trace")
    if not trace:
        return ""
    last = [line.strip() for line in trace.strip().splitlines() if line.strip()][-2:]
    return "; from " + " / ".join(last)
