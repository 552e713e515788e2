"""Sorting, selection and scans of torch, as compositions of lazyrt's ops: cummax / cummin,
searchsorted / bucketize, kthvalue, median, quantile, mode.

Index results on ties follow PyTorch where it defines them (cummax / cummin, mode);
kthvalue's and median's tie indices come from a stable sort (PyTorch's from its selection
algorithm).
"""

import builtins
import collections
import math
import numbers

import numpy as np

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt._args import _along, _scalar_dtype, _tensor_arg
from lazyrt._math import floor_divide

__all__ = ["cummax", "cummin", "searchsorted", "bucketize", "kthvalue", "median", "nanmedian", "quantile",
           "nanquantile", "mode"]


# ---- (values, indices) results -------------------------------------------------------------
# Named tuples as torch.return_types: r.values, r.indices, or unpacked. Each type is a module
# attribute (_return_type_<name>), so results pickle.

def _return_type(name):
    attr = f"_return_type_{name}"
    cls = globals().get(attr)
    if cls is None:
        cls = collections.namedtuple(name, ["values", "indices"])
        cls.__module__, cls.__qualname__ = __name__, attr
        globals()[attr] = cls
    return cls


def _values_indices(name, values, indices):
    return _return_type(name)(values, indices)


def _positions(n, d, ndim):
    """0, 1, ..., n - 1 (int64) along dim d of an ndim-dim tensor (size 1 in the other dims)."""
    shape = [1] * ndim
    shape[d] = n
    return _C.reshape(_C._arange(n, _C.int64), shape)


def _to_last(x, d):
    """x with dim d moved last."""
    if d == x.dim() - 1:
        return x
    return _C.permute(x, [i for i in range(x.dim()) if i != d] + [d])


def _from_last(x, d):
    """The inverse of _to_last: the last dim of x moved back to d."""
    last = x.dim() - 1
    if d == last:
        return x
    order = list(range(last))
    order.insert(d, last)
    return _C.permute(x, order)


def _key(x):
    """x's values, unrecorded, in a dtype the comparisons take (bool as int32)."""
    x = x.detach()
    return _C.cast(x, _C.int32) if x.dtype is _C.bool else x


def _finish(name, x, d, index, keepdim, scalar):
    """(x's values at index along d, index): index keeps d (size 1) and is reduced unless keepdim.
    The values are gathered from x, so the gradient reaches the chosen elements only."""
    values = _C.gather(x, d, index)
    if scalar or not keepdim:
        values, index = _C.squeeze(values, d), _C.squeeze(index, d)
    return _values_indices(name, values, index)


# ---- scans ---------------------------------------------------------------------------------

def _cumulative_extreme(input, dim, call, largest):
    x, d, scalar = _along(input, dim, call)
    n = x.shape[d]
    pos = _C.broadcast_to(_positions(n, d, x.dim()), tuple(x.shape))
    best, best_at = _key(x), pos
    floating = best.is_floating_point()
    # A doubling scan over (value, position), NaN above everything: after the step of width s,
    # each element holds the best of the s elements ending at it. A candidate from earlier
    # wins only when strictly better, so ties go to the later position, as PyTorch's do.
    step = 1
    while step < n:
        earlier = _C.cat([_C.narrow(best, d, 0, step), _C.narrow(best, d, 0, n - step)], d)
        earlier_at = _C.cat([_C.narrow(best_at, d, 0, step), _C.narrow(best_at, d, 0, n - step)], d)
        wins = earlier > best if largest else earlier < best
        if floating:
            wins = wins | (_C.isnan(earlier) & _C.logical_not(_C.isnan(best)))
        wins = wins & (pos >= step)
        best, best_at = _C.where(wins, earlier, best), _C.where(wins, earlier_at, best_at)
        step *= 2
    values = _C.gather(x, d, best_at)
    if scalar:
        values, best_at = _C.squeeze(values, 0), _C.squeeze(best_at, 0)
    return _values_indices(call, values, best_at)


def cummax(input, dim):
    """(values, indices): the running maximum along dim and where it was taken. As PyTorch: on
    ties the latest position, NaN is larger than everything (the latest NaN). O(n log n) work
    (a doubling scan); the gradient reaches the chosen elements."""
    return _cumulative_extreme(input, dim, "cummax", True)


def cummin(input, dim):
    """(values, indices): the running minimum along dim and where it was taken. As PyTorch: on
    ties the latest position, NaN wins over everything (the latest NaN)."""
    return _cumulative_extreme(input, dim, "cummin", False)


# ---- searching sorted values -----------------------------------------------------------------

def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None, out=None):
    """Where input's values would be inserted into sorted_sequence (sorted along its last dim)
    to keep it sorted: the first such position (right=False, side='left') or the last. A 1-D
    sequence serves every value; an N-D one must share input's leading dims. input may be a
    Python number (a 0-d result). sorter: int64 indices that sort the sequence. int64 result,
    int32 with out_int32. Computed by comparing each value with the whole row (O(m n) work
    and memory, no loop), which matches PyTorch's binary search, NaN values included (they go
    last); a sequence holding NaN is not sorted and its results may differ."""
    call = "torch.searchsorted()"
    if out is not None:
        raise _C.Error("searchsorted: out= is not supported (use the returned tensor)")
    _tensor_arg(sorted_sequence, "searchsorted", "sorted_sequence")
    if side is not None:
        if side not in ("left", "right"):
            raise _C.Error(f"{call}: side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise _C.Error(f"{call}: side and right can't be set to opposites, got side of left while right was True")
        right = side == "right"
    seq = sorted_sequence
    if seq.dim() == 0:
        raise _C.Error(f"{call}: boundaries tensor should have at least 1 dimension, got a 0-d tensor")
    if sorter is not None:
        _tensor_arg(sorter, "searchsorted", "sorter")
        if sorter.dtype is not _C.int64 or tuple(sorter.shape) != tuple(seq.shape):
            raise _C.Error(f"{call}: sorter must be an int64 tensor of the boundaries' shape {tuple(seq.shape)}, got "
                           f"{sorter.dtype}{tuple(sorter.shape)}")
        seq = _C.gather(seq, -1, sorter)
    if not isinstance(input, Tensor):
        if seq.dim() != 1:
            raise _C.Error(f"{call}: input value can be a scalar only when boundaries tensor dimension is 1, but we "
                           f"got boundaries tensor dim({seq.dim()}) and input value's dim(0) numel(1)")
        values = _C.scalar_tensor(input, dtype=_scalar_dtype(input, seq))
    else:
        values = input
    seq, values = seq.detach(), values.detach()
    if seq.dim() == 1:
        rows, vals = seq, _C.unsqueeze(values, -1)
    else:
        if values.dim() != seq.dim() or tuple(values.shape[:-1]) != tuple(seq.shape[:-1]):
            raise _C.Error(f"{call}: boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries "
                           f"tensor and input value tensor must match, but we got boundaries tensor "
                           f"{list(seq.shape)} and input value tensor {list(values.shape)}")
        rows, vals = _C.unsqueeze(seq, -2), _C.unsqueeze(values, -1)
    # Left: the count of entries not >= the value; right: not > (NaN values count everything).
    before = _C.logical_not(rows > vals if right else rows >= vals)
    count = _C.sum(before, -1)
    return _C.cast(count, _C.int32) if out_int32 else count


def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    """The bucket index of each value of input among the 1-D sorted boundaries (PyTorch's
    rule: right=False gives i with boundaries[i-1] < x <= boundaries[i]); searchsorted with
    the arguments swapped."""
    _tensor_arg(boundaries, "bucketize", "boundaries")
    if boundaries.dim() != 1:
        raise _C.Error(f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right, out=out)


# ---- order statistics ------------------------------------------------------------------------

def kthvalue(input, k, dim=-1, keepdim=False):
    """(values, indices): the k-th smallest value along dim (k from 1) and its position; NaN is
    larger than everything. On ties PyTorch's index depends on its selection algorithm;
    lazyrt's is the k-th in a stable sort (one of the tied positions, maybe another one)."""
    x, d, scalar = _along(input, dim, "kthvalue")
    n = x.shape[d]
    if isinstance(k, builtins.bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"kthvalue(): argument 'k' must be int, not {type(k).__name__}")
    if not 1 <= k <= n:
        raise _C.Error(f"kthvalue(): selected number k out of range for dimension {d}")
    order = _C.argsort(_key(x), d, stable=True)
    return _finish("kthvalue", x, d, _C.narrow(order, d, k - 1, 1), keepdim, scalar)


def _median_index(x, d, ignore_nan, call):
    """Where the lower median of x along d is (int64, d kept with size 1)."""
    n = x.shape[d]
    if n == 0:
        raise IndexError(f"{call}(): Expected reduction dim {d} to have non-zero size.")
    key = _key(x)
    order = _C.argsort(key, d, stable=True)  # NaN last, in their order
    if not key.is_floating_point():
        return _C.narrow(order, d, (n - 1) // 2, 1)
    valid = _C.sum(_C.logical_not(_C.isnan(key)), d, True)
    if ignore_nan:
        # The lower median of the non-NaN values (a row of NaN only gives its first NaN).
        pos = _C.clamp_min(floor_divide(valid - 1, 2), 0)
    else:
        # A row holding NaN gives NaN: its first NaN, which follows the valid values.
        pos = _C.where(valid < n, valid, (n - 1) // 2)
    return _C.gather(order, d, pos)


def _median(input, dim, keepdim, ignore_nan, call):
    _tensor_arg(input, call)
    if dim is None:
        x = _C.reshape(input, (-1,))
        if x.shape[0] == 0:
            if not x.is_floating_point():
                raise _C.Error(f"{call}(): an empty input has no median")
            return _C.full((), math.nan, dtype=x.dtype)
        return _C.squeeze(_C.gather(x, 0, _median_index(x, 0, ignore_nan, call)), 0)
    x, d, scalar = _along(input, dim, call)
    return _finish(call, x, d, _median_index(x, d, ignore_nan, call), keepdim, scalar)


def median(input, dim=None, keepdim=False):
    """Without dim: the lower median of all values (the smaller middle one of an even count), NaN
    when any value is NaN, NaN for an empty input. With dim: (values, indices) along dim; a
    row holding NaN gives NaN and the position of its first NaN. On ties PyTorch's index
    depends on its selection algorithm; lazyrt's is the median's position in a stable sort.
    The gradient reaches the chosen element."""
    return _median(input, dim, keepdim, False, "median")


def nanmedian(input, dim=None, keepdim=False):
    """median ignoring NaN: the lower median of the non-NaN values (NaN, at the first position,
    for a row of NaN only)."""
    return _median(input, dim, keepdim, True, "nanmedian")


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(input, q, dim, keepdim, interpolation, ignore_nan, call):
    _tensor_arg(input, call)
    if input.dtype not in (_C.float32, _C.float64):
        raise _C.Error(f"{call}() input tensor must be either float or double dtype")
    if interpolation not in _INTERPOLATIONS:
        raise _C.Error(f"{call}() interpolation must be one of linear, lower, higher, midpoint or nearest, but got "
                       f"{interpolation}")
    if isinstance(q, Tensor):
        if q.dim() > 1:
            raise _C.Error(f"{call}() q must be a scalar or 1D tensor")
        if q.dtype is not input.dtype:
            raise _C.Error(f"{call}() q tensor must be same dtype as the input tensor")
        if not q.is_pending():  # device data: checked without a sync, as PyTorch checks it
            values = q.numpy()
            if not np.all((values >= 0) & (values <= 1)):
                raise _C.Error(f"{call}() q values must be in the range [0, 1]")
        one_q, qs = q.dim() == 0, _C.reshape(q.detach(), (-1,))
    else:
        if not 0 <= q <= 1:
            raise _C.Error(f"{call}() q must be in the range [0, 1] but got {q}")
        one_q, qs = True, _C.full((1,), float(q), dtype=input.dtype)
    if input.numel() == 0:
        raise _C.Error(f"{call}() input tensor must be non-empty")
    if dim is None:
        x, d = _C.reshape(input, (-1,)), 0
    else:
        x, d, _ = _along(input, dim, call)
    x = _to_last(x, d)
    n = x.shape[-1]
    s = _C.gather(x, -1, _C.argsort(x.detach(), -1, stable=True))  # sorted, NaN last
    nan = _C.isnan(s.detach())
    if ignore_nan:
        count = _C.cast(_C.sum(_C.logical_not(nan), -1, True), x.dtype)
        rank = _C.clamp_min(qs * (count - 1), 0)
    else:
        rank = _C.where(_C.any(nan, -1, True), float(n - 1), qs * (n - 1))
    if interpolation in ("lower", "higher", "nearest"):
        pick = {"lower": _C.floor, "higher": _C.ceil, "nearest": _C.round}[interpolation]
        out = _C.gather(s, -1, _C.cast(pick(rank), _C.int64))
    else:
        below = _C.floor(rank)
        low = _C.gather(s, -1, _C.cast(below, _C.int64))
        high = _C.gather(s, -1, _C.cast(_C.ceil(rank), _C.int64))
        out = _C.lerp(low, high, 0.5 if interpolation == "midpoint" else rank - below)
    out = _from_last(out, 0)  # the quantiles first
    if keepdim:
        if dim is None:
            out = _C.reshape(out, (out.shape[0],) + (1,) * input.dim())
        elif input.dim() > 0:
            out = _C.unsqueeze(out, d + 1)
    return _C.squeeze(out, 0) if one_q else out


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """The q-th quantiles (q a number or a 1-D tensor in [0, 1], which then leads the result's
    dims) of input's values (dim=None) or along dim, with PyTorch's interpolations between the
    sorted values at floor and ceil of q * (n - 1): linear, lower, higher, midpoint, nearest
    (half to even). A row holding NaN gives NaN. float32 / float64 only, q of input's dtype. A
    pending q tensor is not range-checked (reading it would sync). The gradient reaches the
    sorted values used."""
    return _quantile(input, q, dim, keepdim, interpolation, False, "quantile")


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """quantile ignoring NaN (a row of NaN only gives NaN)."""
    return _quantile(input, q, dim, keepdim, interpolation, True, "nanquantile")


def mode(input, dim=-1, keepdim=False):
    """(values, indices): the most frequent value along dim (the smallest of equally frequent
    ones) and its last position, as PyTorch. Sorts, then counts the runs (no loop). NaN are
    all distinct here (PyTorch counts them as equal)."""
    x, d, scalar = _along(input, dim, "mode")
    if x.shape[d] == 0:
        raise IndexError(f"mode(): Expected reduction dim {d} to have non-zero size.")
    key = _to_last(_key(x), d)
    order = _C.argsort(key, -1, stable=True)
    s = _C.gather(key, -1, order)
    n = s.shape[-1]
    starts = _C.cat([_C.ones(tuple(s.shape[:-1]) + (1,), dtype=_C.bool),
                     _C.ne(_C.narrow(s, -1, 1, n - 1), _C.narrow(s, -1, 0, n - 1))], -1)
    run = _C.cumsum(_C.cast(starts, _C.int64), -1) - 1           # run number of each sorted value
    ones = _C.ones_like(run)
    length = _C.gather(_C.scatter_add(_C.zeros_like(run), -1, run, ones), -1, run)
    first = _C.argmax(length, -1, True)                          # the first of the smallest longest run
    last = first + _C.gather(length, -1, first) - 1              # its last, the latest in input's order
    index = _from_last(_C.gather(order, -1, last), d)
    return _finish("mode", x, d, index, keepdim, scalar)
