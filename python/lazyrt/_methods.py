"""Where lazyrt.Tensor's methods come from; the one place that attaches those written in Python.

Tensor is the C++ class of the extension: python/src/tensor.cpp binds its own methods (shape,
dtype, item, backward, copy_, the arithmetic operators, ...), python/src/ops.cpp binds every
op as lazyrt.<op> and, where PyTorch has one, as a Tensor method, and python/src/indexing.cpp
binds indexing. Every method written in Python is attached here, once, from the module that
defines it: lazyrt._tensor (devices, to(), the new_* factories, pickling, in-place forms, ...)
and the torch functions written in Python (lazyrt._math, _shapes, _sorting, _data_dependent).
A name the extension already binds is not attached again, unless it is listed in
REPLACES_BINDING (the Python method is the one in use); `_attach` refuses either mistake when
lazyrt imports.
"""

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt import _tensor
from lazyrt._data_dependent import argwhere, masked_select, nonzero, unique
from lazyrt._math import erfinv, floor_divide, fmod, remainder
from lazyrt._shapes import fliplr, flipud, repeat_interleave, rot90
from lazyrt._sorting import cummax, cummin, kthvalue, median, mode, nanmedian, nanquantile, quantile

# Methods the extension binds that the Python ones here replace on purpose:
#   to: PyTorch's argument forms (to(device, dtype), to(other), copy=, non_blocking=);
#   __hash__: the binding's __eq__ leaves Tensor unhashable; tensors hash by identity, as in PyTorch.
REPLACES_BINDING = frozenset({"to", "__hash__"})


def _attach(name, value):
    binds = name in vars(Tensor)
    if binds != (name in REPLACES_BINDING):
        raise ImportError(f"lazyrt._methods: Tensor.{name} " + (
            "is bound by the extension and defined in Python too: keep one, or list it in REPLACES_BINDING"
            if binds else "is listed in REPLACES_BINDING but the extension does not bind it"))
    setattr(Tensor, name, value)


_METHODS = {
    # ---- values, iteration, formatting (lazyrt._tensor)
    "tolist": _tensor._tolist,
    "__iter__": _tensor._iter,
    "__format__": _tensor._format,
    # Tensors compare elementwise (== gives a tensor), so they hash by identity, as in PyTorch.
    "__hash__": object.__hash__,
    # NumPy scalars and arrays on the left of an operator defer to the tensor's reflected operator.
    "__array_priority__": 1000,
    # ---- devices and dtypes (lazyrt._tensor)
    "device": property(lambda self: _tensor._LAZY, doc="The tensor's device: device(type='lazy', index=0)."),
    "is_cuda": property(lambda self: False, doc="False: lazyrt tensors are not CUDA tensors."),
    "to": _tensor._to,
    "new_full": _tensor._new_full,
    "new_zeros": _tensor._new_zeros,
    "new_ones": _tensor._new_ones,
    "new_empty": _tensor._new_empty,
    "new_tensor": _tensor._new_tensor,
    # ---- copying and pickling (lazyrt._tensor)
    "__reduce_ex__": _tensor._reduce_ex,
    "__deepcopy__": _tensor._deepcopy,
    # ---- more of torch.Tensor's surface (lazyrt._tensor)
    "expand_as": _tensor._expand_as,
    "view_as": _tensor._view_as,
    "type_as": _tensor._type_as,
    "square": _tensor._square,
    "clip": Tensor.clamp,
    "select": _tensor._select,
    "unbind": _tensor._unbind,
    "mT": property(_tensor._mT, doc="The transpose of the last two dims (batches of matrices)."),
    # ---- the torch functions written in Python, as torch.Tensor has them
    "cummax": cummax, "cummin": cummin, "kthvalue": kthvalue, "median": median, "nanmedian": nanmedian,
    "quantile": quantile, "nanquantile": nanquantile, "mode": mode,
    "repeat_interleave": repeat_interleave, "rot90": rot90, "fliplr": fliplr, "flipud": flipud,
    "erfinv": erfinv, "nonzero": nonzero, "argwhere": argwhere, "masked_select": masked_select, "unique": unique,
    "remainder": remainder, "fmod": fmod, "floor_divide": floor_divide,
    # Python's % and // as torch.Tensor's: remainder (the divisor's sign) and floor_divide.
    "__mod__": remainder,
    "__rmod__": lambda self, other: remainder(other, self),
    "__floordiv__": floor_divide,
    "__rfloordiv__": lambda self, other: floor_divide(other, self),
    # ---- random fills (lazyrt._tensor)
    "normal_": _tensor._normal_,
    "uniform_": _tensor._uniform_,
}

# In-place forms: the tensor becomes fn(itself, ...) (see lazyrt._tensor._assign).
_INPLACE = {
    "exp_": _C.exp, "sqrt_": _C.sqrt, "relu_": _C.relu, "sigmoid_": _C.sigmoid, "tanh_": _C.tanh,
    "neg_": _C.neg, "abs_": _C.abs, "clamp_": _C.clamp, "clip_": _C.clamp, "pow_": _C.pow, "lerp_": _C.lerp,
    "addcmul_": _C.addcmul, "addcdiv_": _C.addcdiv, "square_": _tensor._square,
}


def _erfinv_(self):
    return self.copy_(erfinv(self))


for _name, _value in _METHODS.items():
    _attach(_name, _value)
for _name, _fn in _INPLACE.items():
    _attach(_name, _tensor._inplace(_name, _fn))
_attach("erfinv_", _erfinv_)
del _name, _value, _fn
