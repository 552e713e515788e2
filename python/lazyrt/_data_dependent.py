"""Functions of torch whose result's shape depends on the values: nonzero, argwhere,
masked_select, unique (repeat_interleave with a tensor of repeats is in lazyrt._shapes).

The number of results is known only from the values: they are read on the host. A pending
tensor is computed for that (a sync), counted as DynamicShapeSync, as boolean-mask indexing
counts its reads; a compiled step refuses it while traced (lazyrt.Error).
"""

import numpy as np

from lazyrt import _C
from lazyrt._args import _host_values, _tensor_arg
from lazyrt._tensor import _dim_index, tensor

__all__ = ["nonzero", "argwhere", "masked_select", "unique"]


def nonzero(input, *, out=None, as_tuple=False):
    """The positions of input's nonzero values (NaN counts), int64 [count, input.dim()] in
    row-major order, or with as_tuple one 1-D tensor per dim (a 0-d input counts as 1-D).
    Reads input's values on the host (see above)."""
    if out is not None:
        raise _C.Error("nonzero: out= is not supported (use the returned tensor)")
    values = _host_values(input, "nonzero")
    if as_tuple:
        return tuple(tensor(p.astype(np.int64)) for p in np.nonzero(np.atleast_1d(values)))
    return tensor(np.argwhere(values).astype(np.int64))


def argwhere(input):
    """nonzero(input): int64 [count, input.dim()] (reads the values on the host)."""
    return nonzero(input)


def masked_select(input, mask):
    """The values of input where the bool mask is True (both broadcast together), 1-D in
    row-major order. Reads the mask on the host (see above); the gradient reaches the
    selected values."""
    _tensor_arg(input, "masked_select")
    _tensor_arg(mask, "masked_select", "mask")
    if mask.dtype is not _C.bool:
        raise _C.Error(f"masked_select: expected BoolTensor or ByteTensor for mask, got {mask.dtype}")
    try:
        shape = np.broadcast_shapes(tuple(input.shape), tuple(mask.shape))
    except ValueError:
        raise _C.Error(f"masked_select: the shape of the mask {tuple(mask.shape)} must be broadcastable with the "
                       f"shape of the input {tuple(input.shape)}") from None
    where = np.flatnonzero(np.broadcast_to(_host_values(mask, "masked_select"), shape))
    flat = _C.reshape(_C.broadcast_to(input, shape), (-1,))
    return _C.index_select(flat, 0, tensor(where.astype(np.int64)))


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct values of input (dim=None: flattened) or its distinct slices along dim, in
    ascending (lexicographic) order; with return_inverse each element's (slice's) index into
    them, shaped as input (as dim's size), with return_counts how often each occurs. Reads
    input's values on the host (see above); the results do not record a gradient. sorted=False
    also sorts (PyTorch leaves the order unspecified). NaN: all NaN are one value, last
    (PyTorch 1.13 keeps each NaN apart)."""
    values = _host_values(input, "unique")
    if dim is not None:
        if input.dim() == 0:
            raise IndexError(f"unique(): dimension out of range (expected to be in range of [-1, 0], but got {dim})")
        dim = _dim_index(dim, input.dim(), "unique()")
    kept, inverse, counts = np.unique(values, return_inverse=True, return_counts=True, axis=dim)
    out = [tensor(kept, dtype=input.dtype)]
    if return_inverse:
        out.append(tensor(inverse.astype(np.int64).reshape(values.shape if dim is None else (-1,))))
    if return_counts:
        out.append(tensor(counts.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)
