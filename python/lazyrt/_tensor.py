"""Making tensors from Python data, NumPy and PyTorch, and the Tensor methods written in Python.

lazyrt.tensor copies, with PyTorch's dtype inference (Python floats -> float32, ints -> int64,
bools -> bool; an ndarray keeps its dtype). from_numpy / as_tensor / from_torch share memory
where the layout allows, and lazyrt never writes into shared memory. t.numpy() and to_torch(t)
view the tensor's data without a copy; the NumPy view is read-only, and a PyTorch tensor from
to_torch must not be written into (PyTorch has no read-only tensors; clone() it to modify).
"""

import builtins
import sys

import numpy as np

from lazyrt import _C
from lazyrt._C import Tensor

_NUMPY_NAMES = {
    _C.float32: "float32", _C.float64: "float64", _C.float16: "float16",
    _C.int32: "int32", _C.int64: "int64", _C.bool: "bool",
}


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")  # x cannot be a torch tensor unless torch is loaded
    return torch is not None and isinstance(x, torch.Tensor)


def _inferred(arr):
    """PyTorch's dtype for values given as Python data (lists, numbers)."""
    kind = arr.dtype.kind
    if kind == "f":
        return arr.astype(np.float32)
    if kind in "iu":
        return arr.astype(np.int64)
    if kind == "b":
        return arr
    raise TypeError(f"tensor: cannot make a lazyrt tensor from data of NumPy dtype {arr.dtype}")


def tensor(data, dtype=None, requires_grad=False):
    """A new tensor holding a copy of `data` (a number, nested lists, an ndarray, a tensor).

    Without a dtype: Python floats give float32, ints int64, bools bool; an ndarray or a
    tensor keeps its dtype.
    """
    if isinstance(data, Tensor):
        t = data.detach()
        if dtype is not None:
            t = t.to(dtype)
    else:
        if _is_torch_tensor(data):
            if dtype is None and data.dtype == sys.modules["torch"].bfloat16:
                dtype = _C.bfloat16
            data = data.detach().cpu()
            data = (data.float() if dtype is _C.bfloat16 else data).numpy()
        if isinstance(data, (np.ndarray, np.generic)):
            arr = np.asarray(data)
        else:
            arr = _inferred(np.array(data))
        if dtype is None:
            t = _C._tensor_from_array(arr)
        elif dtype is _C.bfloat16:
            # NumPy has no bfloat16: convert on the lazyrt side, as data.
            t = _C._tensor_from_array(arr.astype(np.float32)).to(dtype)
            _C.sync([t])
        else:
            t = _C._tensor_from_array(arr.astype(_NUMPY_NAMES[dtype]))
    if requires_grad:
        t.requires_grad_()
    return t


def as_tensor(data, dtype=None):
    """`data` as a tensor, sharing memory where it can (an ndarray, a PyTorch tensor, a tensor)."""
    if isinstance(data, Tensor):
        return data if dtype is None or data.dtype is dtype else data.to(dtype)
    if isinstance(data, np.ndarray) and (dtype is None or _NUMPY_NAMES.get(dtype) == data.dtype.name):
        return _C.from_numpy(data)
    if _is_torch_tensor(data) and dtype is None:
        return from_torch(data)
    return tensor(data, dtype=dtype)


def arange(start=0, end=None, step=1, *, dtype=None, requires_grad=False):
    """Values from start (0 when only one bound is given) to end, exclusive, by step."""
    if end is None:
        start, end = 0, start
    integral = all(isinstance(v, builtins.int) and not isinstance(v, builtins.bool)
                   for v in (start, end, step))
    if dtype is None:
        dtype = _C.int64 if integral else _C.float32
    if start == 0 and step == 1 and integral:
        t = _C._arange(builtins.max(end, 0), dtype)
    else:
        values = np.arange(start, end, step, dtype=np.int64 if integral else np.float64)
        t = tensor(values, dtype=dtype)
    if requires_grad:
        t.requires_grad_()
    return t


def from_torch(t):
    """A lazyrt tensor with the values of a PyTorch tensor, sharing its memory when it is a
    contiguous CPU tensor (values only: requires_grad is not carried over)."""
    import torch
    import torch.utils.dlpack

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"from_torch: expected a torch.Tensor, got {type(t).__name__}")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bool:
        # DLPack in PyTorch 1.13 has no bool: the bytes travel as uint8.
        return _C._from_dlpack(torch.utils.dlpack.to_dlpack(t.view(torch.uint8)), True)
    return _C._from_dlpack(torch.utils.dlpack.to_dlpack(t), False)


def to_torch(t):
    """A PyTorch tensor viewing the tensor's data, without a copy (syncs the tensor).

    lazyrt values are immutable and PyTorch has no read-only tensors: do not modify the
    result in place (clone() it first).
    """
    import torch
    import torch.utils.dlpack

    if not isinstance(t, Tensor):
        raise TypeError(f"to_torch: expected a lazyrt.Tensor, got {type(t).__name__}")
    if t.dtype is _C.bool:
        return torch.utils.dlpack.from_dlpack(_C._to_dlpack(t, True)).view(torch.bool)
    return torch.utils.dlpack.from_dlpack(_C._to_dlpack(t, False))


# ---- Tensor methods written in Python ------------------------------------------------------

def _tolist(self):
    """The values as (nested) Python numbers (syncs)."""
    if self.dtype is _C.bfloat16:
        return self.to(_C.float32).numpy().tolist()
    return self.numpy().tolist()


def _format(self, spec):
    if self.dim() == 0:
        return self.item().__format__(spec)
    return object.__format__(self, spec)


def _iter(self):
    """The sub-tensors along dim 0, as PyTorch iterates (t[0], t[1], ...)."""
    if self.dim() == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))


Tensor.tolist = _tolist
Tensor.__iter__ = _iter
Tensor.__format__ = _format
# Tensors compare elementwise (== gives a tensor), so they hash by identity, as in PyTorch.
Tensor.__hash__ = object.__hash__
# NumPy scalars and arrays on the left of an operator defer to the tensor's reflected operator.
Tensor.__array_priority__ = 1000
