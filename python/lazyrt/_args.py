"""Argument handling shared by the torch functions written in Python (_math, _linalg,
_factories, _shapes, _sorting, _data_dependent): type checks, PyTorch's dtype of a Python
number beside a tensor, a dim taken along, and reading values on the host."""

import numbers

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt._tensor import _dim_index

_INTEGRAL = (_C.int32, _C.int64)


def _tensor_arg(x, call, what="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{call}(): argument '{what}' must be a lazyrt.Tensor, not {type(x).__name__}")
    return x


def _scalar_dtype(number, other):
    # A Python number takes the tensor's dtype unless it is of a higher kind (PyTorch's rule).
    if isinstance(number, bool):
        return other.dtype
    if isinstance(number, numbers.Integral):
        return other.dtype if other.dtype is not _C.bool else _C.int64
    return other.dtype if other.is_floating_point() else _C.float32


def _along(input, dim, call):
    """(x, d, scalar): input as a tensor of at least one dim, dim in range, and whether the
    input was 0-d (then the results lose the added dim again)."""
    _tensor_arg(input, call)
    d = _dim_index(dim, input.dim(), f"{call}()")
    if input.dim() == 0:
        return _C.unsqueeze(input, 0), 0, True
    return input, d, False


def _host_values(t, call):
    """t's values as a NumPy array. A pending t is computed first: a sync, counted as
    DynamicShapeSync (the counter of boolean-mask indexing); device data is read without one.
    Inside a traced compile_step the read raises lazyrt.Error."""
    _tensor_arg(t, call)
    pending = t.is_pending()
    values = (_C.cast(t, _C.float32) if t.dtype is _C.bfloat16 else t).numpy()
    if pending:
        _C._metrics._increment("DynamicShapeSync")
    return values
