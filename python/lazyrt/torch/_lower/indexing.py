"""Indexing: gather and scatter, slices and selects with their writes and backward ops, advanced
indexing (x[i, :, j] and its writes), and the items of a multi-result op."""

import math
import operator

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import (UnsupportedOperatorError, _KeepDtype, _KernelDtypes, _TORCH_DTYPES, _cast,
                                       _full, _is_tensor, lowering, op_name, refusal)

aten = torch.ops.aten


# ---- gather and scatter ------------------------------------------------------------------------

@lowering(aten.gather.default)
def _gather(e, x, dim, index, sparse_grad=False):
    return _C.gather(x, dim, index)


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


# ---- slices and selects -------------------------------------------------------------------------

@lowering(aten.slice.Tensor)
def _slice(e, x, dim=0, start=None, end=None, step=1):
    dim %= x.dim()
    return _C.slice(x, dim, *_norm_slice(x.shape[dim], start, end, step))


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


@refusal(aten._local_scalar_dense.default)
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


@lowering(aten.unbind.int)
def _unbind(e, x, dim=0):
    return [_select(None, x, dim, i) for i in range(x.shape[dim])]


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


@refusal(aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten._unsafe_index_put.default)
def _index_refusal(node):
    indices = node.args[1]
    if not any(i is not None and _val_dtype(i) in (torch.bool, torch.uint8) for i in indices):
        return None
    if node.target in (aten.index_put.default, aten._unsafe_index_put.default) and \
            _masked_put(indices, node.args[2], node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate")):
        return None
    return "with a boolean mask (a shape only its values give)"


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


# ---- the items of a multi-result op ------------------------------------------------------------

@lowering(operator.getitem)
def _getitem(e, values, index):
    return _KeepDtype(values[index]) if isinstance(values, _KernelDtypes) else values[index]
