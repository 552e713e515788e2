"""Ops that change shapes, lay values out anew or change dtypes: views, reshapes, transposes,
diagonals, concatenation and splitting, copies."""

import math

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import _cast, _vjp, lowering

aten = torch.ops.aten


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


@lowering(aten.t.default)
def _t(e, x):
    return x if x.dim() < 2 else _C.t(x)


@lowering(aten.transpose.int)
def _transpose(e, x, d0, d1):
    return _C.transpose(x, d0, d1) if x.dim() else x


@lowering(aten.permute.default)
def _permute(e, x, dims):
    return _C.permute(x, tuple(dims))


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


@lowering(aten.flip.default)
def _flip(e, x, dims):
    return _C.flip(x, [d % x.dim() for d in dims])


@lowering(aten.triu.default)
def _triu(e, x, diagonal=0):
    return _C.triu(x, diagonal)


@lowering(aten.tril.default)
def _tril(e, x, diagonal=0):
    return _C.tril(x, diagonal)


@lowering(aten.cat.default)
def _cat(e, tensors, dim=0):
    return _C.cat([_cast(t, e.dtype) for t in tensors], dim)


@lowering(aten.split.Tensor, aten.unsafe_split.Tensor)
def _split(e, x, split_size, dim=0):
    return list(lazyrt.split(x, split_size, dim))


@lowering(aten.split_with_sizes.default, aten.unsafe_split_with_sizes.default)
def _split_with_sizes(e, x, split_sizes, dim=0):
    return list(lazyrt.split(x, list(split_sizes), dim))


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


@lowering(aten.repeat.default)
def _repeat(e, x, repeats):
    return _C.repeat(x, list(repeats))
