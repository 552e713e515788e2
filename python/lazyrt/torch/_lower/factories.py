"""Factories: PyTorch's shape and dtype, a value."""

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import _cast, _full, lowering

aten = torch.ops.aten


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


@lowering(aten._foreach_zero.default)
def _foreach_zero(e, tensors):
    # zero_grad(set_to_none=False) of a for-each optimizer: zeros of each gradient's shape.
    return [_full(tuple(t.shape), 0, t.dtype) for t in tensors]
