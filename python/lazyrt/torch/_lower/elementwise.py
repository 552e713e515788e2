"""Elementwise arithmetic, comparisons and logical ops: operands in PyTorch's result dtype."""

import torch

from lazyrt import _C
from lazyrt.torch._lower.table import (LOWERINGS, UnsupportedOperatorError, _TORCH_DTYPES, _cast, _is_tensor,
                                       lazy_dtype, lowering, refusal)

aten = torch.ops.aten


def _elementwise(fn):
    def lower(e, *args, **kwargs):
        args = [_cast(a, e.dtype) for a in args]
        return fn(*args, **kwargs)
    return lower


def _plain(fn):
    """The lowering of a plain elementwise op of the op table (lazyrt/ops.def's api column): its
    operands in the result's dtype, or for a bool result of two operands (a comparison) in their
    common dtype. A number first (a graph that Dynamo specialized from a symbolic float holds
    1.5 - x) becomes a constant of that dtype."""
    def lower(e, *args):
        dtype = e.dtype
        if dtype is _C.bool:
            if len(args) == 1:
                return fn(*args)
            dtype = _common_dtype(*args)
        args = [_cast(a, dtype) for a in args]
        if not _is_tensor(args[0]):
            args[0] = _C.full((), args[0], dtype=dtype)
        return fn(*args)
    return lower


def _lower_plain_rows():
    for row in _C._debug.op_table():
        if row["api"] not in ("Unary", "UnaryFloat", "Arith", "ArithFloat"):
            continue
        for overload in row["aten"].split():
            packet, _, variant = overload.partition(".")
            op = getattr(getattr(aten, packet), variant)
            assert op not in LOWERINGS, f"{op} is lowered twice"
            lowering(op)(_plain(getattr(_C, row["name"])))


# A graph that Dynamo specialized from a symbolic float may hold the number first (1.5 - x).
lowering(aten.add.Tensor, aten.add.Scalar)(_elementwise(
    lambda a, b, alpha=1: _C.add(a, b, alpha=alpha) if _is_tensor(a) else _C.add(_C.mul(b, alpha), a)))
lowering(aten.sub.Tensor, aten.sub.Scalar)(_elementwise(
    lambda a, b, alpha=1: _C.sub(a, b, alpha=alpha) if _is_tensor(a) else _C.add(_C.mul(b, -alpha), a)))
lowering(aten.rsub.Tensor, aten.rsub.Scalar)(
    _elementwise(lambda a, b, alpha=1: _C.sub(b, a, alpha=alpha) if _is_tensor(b)
                 else _C.add(_C.mul(a, -alpha), b)))
lowering(aten.addcmul.default)(_elementwise(lambda s, a, b, value=1: _C.addcmul(s, a, b, value=value)))
lowering(aten.addcdiv.default)(_elementwise(lambda s, a, b, value=1: _C.addcdiv(s, a, b, value=value)))
lowering(aten.lerp.Scalar, aten.lerp.Tensor)(_elementwise(_C.lerp))
lowering(aten.reciprocal.default)(_elementwise(_C.reciprocal))
lowering(aten.silu.default)(_elementwise(_C.silu))
lowering(aten.round.decimals)(_elementwise(lambda x, decimals=0: _C.round(x, decimals=decimals)))


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


def _common_dtype(a, b):
    """PyTorch's promoted dtype of two operands (lazyrt tensors or Python numbers)."""
    def probe(x):
        if _is_tensor(x):
            td = _TORCH_DTYPES[x.dtype]
            return torch.empty((1,) * x.dim(), dtype=td) if x.dim() else torch.empty((), dtype=td)
        return x
    return lazy_dtype(torch.result_type(probe(a), probe(b)))


@lowering(aten.bitwise_not.default)  # of bool only (REFUSALS): logical not
def _bitwise_not(e, x):
    return _C.logical_not(x)


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


_lower_plain_rows()
