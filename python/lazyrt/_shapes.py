"""Slicing, broadcasting and reshaping functions of torch, as compositions of lazyrt's ops.

repeat_interleave with a tensor of repeats (and no output_size) sets its result's size by the
repeats' values: they are read on the host (see lazyrt._data_dependent).
"""

import builtins
import numbers

import numpy as np

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt._args import _INTEGRAL, _along, _host_values, _tensor_arg
from lazyrt._tensor import _select, _unbind, tensor

__all__ = ["unbind", "select", "numel", "is_tensor", "broadcast_tensors", "repeat_interleave", "rot90", "fliplr",
           "flipud"]


# ---- slicing -------------------------------------------------------------------------------

def unbind(input, dim=0):
    """The slices of input along dim, that dim removed, as a tuple."""
    return _unbind(_tensor_arg(input, "unbind"), dim)


def select(input, dim, index):
    """The slice of input at index along dim, that dim removed."""
    return _select(_tensor_arg(input, "select"), dim, index)


def numel(input):
    """The number of elements of input."""
    return _tensor_arg(input, "numel").numel()


def is_tensor(obj):
    """Whether obj is a lazyrt tensor."""
    return isinstance(obj, Tensor)


# ---- broadcasting ----------------------------------------------------------------------------

def broadcast_tensors(*tensors):
    """The tensors broadcast to their common shape, as a tuple."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    for t in tensors:
        _tensor_arg(t, "broadcast_tensors", "tensors")
    shape = ()
    for t in tensors:
        s = tuple(t.shape)
        width = builtins.max(len(shape), len(s))
        a, b = (1,) * (width - len(shape)) + shape, (1,) * (width - len(s)) + s
        out = []
        for x, y in zip(a, b):
            if x != y and 1 not in (x, y):
                raise _C.Error(f"broadcast_tensors: shapes {[tuple(t.shape) for t in tensors]} cannot be broadcast "
                               "together")
            out.append(y if x == 1 else x)
        shape = tuple(out)
    return tuple(_C.broadcast_to(t, shape) for t in tensors)


# ---- reshaping -----------------------------------------------------------------------------

def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each element (slice along dim; of the flattened input when dim is None) repeated. An int
    repeats is static. A tensor of repeats (one per slice, or one for all) sets the result's
    size by its values: they are read on the host (a sync when pending, counted as
    DynamicShapeSync), unless output_size is given: then the index is computed lazily from
    the cumulative repeats (no read; repeats that do not add up to output_size are then not
    checked). repeat_interleave(repeats) repeats 0, 1, ... The gradient sums over the copies."""
    _tensor_arg(input, "repeat_interleave")
    if repeats is None:
        if input.dim() != 1 or input.dtype not in _INTEGRAL:
            raise _C.Error(f"repeat_interleave: repeats must be a 1-D int32 or int64 tensor, got "
                           f"{input.dtype}{tuple(input.shape)}")
        return repeat_interleave(_C._arange(input.shape[0], input.dtype), input, 0, output_size=output_size)
    if dim is None:
        x, d = _C.reshape(input, (-1,)), 0
    else:
        x, d, _ = _along(input, dim, "repeat_interleave")
    n = x.shape[d]
    if isinstance(repeats, Tensor):
        if repeats.dim() > 1:
            raise _C.Error("repeats must be 0-dim or 1-dim tensor")
        if repeats.dtype not in _INTEGRAL:
            raise _C.Error(f"repeat_interleave: repeats must be an int32 or int64 tensor, got {repeats.dtype}")
        if repeats.numel() != 1 and repeats.numel() != n:
            raise _C.Error("repeats must have the same size as input along dim")
        if output_size is not None:
            if repeats.numel() == 1 and n > 0:
                if output_size % n:
                    raise _C.Error(f"repeat_interleave: output_size {output_size} is no multiple of {n}")
                return repeat_interleave(x, output_size // n, d)
            # The slice of output j is the count of cumulative repeats <= j (no host read).
            ends = _C.cumsum(_C.cast(_C.reshape(repeats, (-1,)), _C.int64), 0)
            j = _C.unsqueeze(_C._arange(output_size, _C.int64), 1)
            index = _C.clamp_max(_C.sum(_C.unsqueeze(ends, 0) <= j, 1), builtins.max(n - 1, 0))
            return _C.index_select(x, d, index)
        counts = np.broadcast_to(_host_values(repeats, "repeat_interleave").reshape(-1), (n,))
        if np.any(counts < 0):
            raise _C.Error("repeats can not be negative")
        index = np.repeat(np.arange(n, dtype=np.int64), counts)
        if output_size is not None and output_size != index.size:
            raise _C.Error(f"repeat_interleave: output_size {output_size} does not match the repeats' sum "
                           f"{index.size}")
        return _C.index_select(x, d, tensor(index))
    if isinstance(repeats, builtins.bool) or not isinstance(repeats, numbers.Integral):
        raise TypeError(f"repeat_interleave(): argument 'repeats' must be int or Tensor, not {type(repeats).__name__}")
    if repeats < 0:
        raise _C.Error("repeats can not be negative")
    if output_size is not None and output_size != n * repeats:
        raise _C.Error(f"repeat_interleave: output_size {output_size} does not match {n} * {repeats}")
    shape = tuple(x.shape)
    wide = shape[:d + 1] + (int(repeats),) + shape[d + 1:]
    return _C.reshape(_C.expand(_C.unsqueeze(x, d + 1), wide), shape[:d] + (n * int(repeats),) + shape[d + 1:])


def rot90(input, k=1, dims=(0, 1)):
    """input rotated by k * 90 degrees in the plane of dims, from dims[0] toward dims[1]."""
    _tensor_arg(input, "rot90")
    dims = list(dims)
    ndim = input.dim()
    if len(dims) != 2:
        raise _C.Error(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if ndim < 2:
        raise _C.Error(f"expected total dims >= 2, but got total dims = {ndim}")
    if dims[0] == dims[1] or builtins.abs(dims[0] - dims[1]) == ndim:
        raise _C.Error(f"expected rotation dims to be different, but got dim0 = {dims[0]} and dim1 = {dims[1]}")
    for i, v in enumerate(dims):
        if not -ndim <= v < ndim:
            raise _C.Error(f"Rotation dim{i} out of range, dim{i} = {v}")
    d0, d1 = (v % ndim for v in dims)
    k %= 4
    if k == 1:
        return _C.transpose(_C.flip(input, [d1]), d0, d1)
    if k == 2:
        return _C.flip(input, [d0, d1])
    if k == 3:
        return _C.transpose(_C.flip(input, [d0]), d0, d1)
    return input.clone()


def fliplr(input):
    """input with dim 1 reversed (at least 2-D)."""
    if _tensor_arg(input, "fliplr").dim() < 2:
        raise _C.Error("Input must be >= 2-d.")
    return _C.flip(input, [1])


def flipud(input):
    """input with dim 0 reversed (at least 1-D)."""
    if _tensor_arg(input, "flipud").dim() < 1:
        raise _C.Error("Input must be >= 1-d.")
    return _C.flip(input, [0])
