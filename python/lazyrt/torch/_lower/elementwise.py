"""Elementwise arithmetic, comparisons and logical ops: operands in PyTorch's result dtype."""

import torch

from lazyrt import _C
from lazyrt.torch._lower.table import (UnsupportedOperatorError, _TORCH_DTYPES, _cast, _is_tensor, lazy_dtype,
                                       lowering, refusal)

aten = torch.ops.aten


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


@refusal(aten.bitwise_not.default)
def _bitwise_not_refusal(node):
    dtype = node.meta["val"].dtype
    return None if dtype == torch.bool else f"of {dtype}: lowered for bool only"
