"""Making tensors from Python data, NumPy and PyTorch, and Tensor methods written in Python.

lazyrt.tensor copies, with PyTorch's dtype inference (Python floats -> float32, ints -> int64,
bools -> bool; an ndarray keeps its dtype). from_numpy / as_tensor / from_torch share memory
where the layout allows, and lazyrt never writes into shared memory. t.numpy() and to_torch(t)
view the tensor's data without a copy; the NumPy view is read-only, and a PyTorch tensor from
to_torch must not be written into (PyTorch has no read-only tensors; clone() it to modify).

The Tensor methods below (attached to Tensor by lazyrt._methods) add PyTorch's device surface
(Tensor.device, lazyrt.device, to(), new_zeros and the other new_* factories), copy.deepcopy /
pickle support, in-place forms and more of torch.Tensor's surface.
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


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data` (a number, nested lists, an ndarray, a tensor).

    Without a dtype: Python floats give float32, ints int64, bools bool; an ndarray or a
    tensor keeps its dtype.
    """
    _check_device(device, "tensor")
    if isinstance(data, Tensor):
        t = data.detach().clone()  # a copy, not a view
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


def as_tensor(data, dtype=None, device=None):
    """`data` as a tensor, sharing memory where it can (an ndarray, a PyTorch tensor, a tensor)."""
    _check_device(device, "as_tensor")
    if isinstance(data, Tensor):
        return data if dtype is None or data.dtype is dtype else data.to(dtype)
    if isinstance(data, np.ndarray) and (dtype is None or _NUMPY_NAMES.get(dtype) == data.dtype.name):
        return _C.from_numpy(data)
    if _is_torch_tensor(data) and dtype is None:
        return from_torch(data)
    return tensor(data, dtype=dtype)


def arange(start=0, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    """Values from start (0 when only one bound is given) to end, exclusive, by step."""
    _check_device(device, "arange")
    if end is None:
        start, end = 0, start
    integral = all(isinstance(v, builtins.int) and not isinstance(v, builtins.bool)
                   for v in (start, end, step))
    if dtype is None:
        dtype = _C.int64 if integral else _C.float32
    import math
    for v in (start, end, step):
        if not math.isfinite(v):
            raise _C.Error(f"arange: unsupported range: {start} -> {end} (step {step})")
    if step == 0:
        raise _C.Error("arange: step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise _C.Error(f"arange: upper bound and larger bound inconsistent with step sign "
                       f"(start {start}, end {end}, step {step})")
    # As torch.arange: the values, made lazily, are start + i * step computed in float64 for a
    # floating dtype, and in int64 for the others, from start and step truncated to integers
    # (end too, for the count of an int64 arange).
    n = -((start - end) // step) if integral else math.ceil((end - start) / step)
    if not dtype.is_floating_point:
        start, end, step = (builtins.int(v) for v in (start, end, step))
        if step == 0:
            raise _C.Error("arange: step must be nonzero (step truncated to an integer for "
                           f"dtype {dtype})")
        if dtype == _C.int64:
            num = end - start + step - (1 if step > 0 else -1)
            n = abs(num) // abs(step) if (num > 0) == (step > 0) else 0
    n = builtins.max(n, 0)
    if n >= 2 ** 63:
        raise _C.Error(f"arange: {start} -> {end} (step {step}) has {n} elements, more than a "
                       f"64-bit count can hold")
    if start == 0 and step == 1:
        t = _C._arange(n, dtype)
    elif dtype.is_floating_point:
        t = (_C._arange(n, _C.float64) * float(step) + float(start)).to(dtype)
    else:
        t = (_C._arange(n, _C.int64) * step + start).to(dtype)
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


# ---- devices -------------------------------------------------------------------------------
# lazyrt has one device: tensors live in host memory and run where lazyrt runs, as PyTorch's
# own lazy backend reads it: Tensor.device is device(type='lazy', index=0). 'cpu' names the same
# place (t.cpu() is t, DLPack reports CPU memory), so .to('cpu') is a no-op too; any other
# device ('cuda', 'meta', ...) is refused, since lazyrt cannot put a tensor there.

_DEVICE_TYPES = ("lazy", "cpu")


class device:
    """A device, read as torch.device reads: ``device('lazy')``, ``device('lazy:0')``,
    ``device('cpu')``, ``device('lazy', 0)``. ``type`` and ``index`` as in PyTorch (the index is
    None unless given); devices compare equal by type and index, so as in PyTorch
    device('lazy') != device('lazy', 0). Tensor.device is device('lazy', 0)."""

    __slots__ = ("type", "index")

    def __init__(self, type, index=None):
        if isinstance(type, device):
            if index is not None:
                raise TypeError("device: an index cannot be given with a device")
            type, index = type.type, type.index
        if not isinstance(type, str):
            raise TypeError(f"device: expected a device string such as 'lazy' or 'lazy:0', got {type!r}")
        name, sep, number = type.partition(":")
        if sep:
            if index is not None:
                raise TypeError(f"device: '{type}' has an index, and index={index} was given too")
            if not number.isdigit():
                raise _C.Error(f"device: invalid device string '{type}' (expected 'type' or 'type:index')")
            index = builtins.int(number)
        if not name or not name.isidentifier():
            raise _C.Error(f"device: invalid device string '{type}' (expected 'type' or 'type:index')")
        if index is not None and (not isinstance(index, builtins.int) or isinstance(index, builtins.bool)
                                  or index < 0):
            raise _C.Error(f"device: the index must be a non-negative int, got {index!r}")
        object.__setattr__(self, "type", name)
        object.__setattr__(self, "index", index)

    def __setattr__(self, name, value):
        raise AttributeError("device objects are immutable")

    def __eq__(self, other):
        if not isinstance(other, device):
            return NotImplemented
        return (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __repr__(self):
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __reduce__(self):
        return (device, (self.type, self.index))


_LAZY = device("lazy", 0)


def _check_device(dev, call):
    """`dev` (a device, a string, or a torch.device) if lazyrt can hold tensors there, else raises."""
    if dev is None:
        return None
    if not isinstance(dev, (str, device)):
        if not (hasattr(dev, "type") and hasattr(dev, "index")):
            raise TypeError(f"{call}: expected a device (lazyrt.device, a string such as 'lazy' or 'cpu', or a "
                            f"torch.device), got {type(dev).__name__}")
        dev = device(dev.type, dev.index)
    dev = device(dev)
    if dev.type not in _DEVICE_TYPES or (dev.index or 0) != 0:
        raise _C.Error(f"{call}: lazyrt tensors live on device 'lazy' (also reachable as 'cpu'); "
                       f"cannot move to '{dev}'")
    return dev


def _parse_to(args, kwargs, call):
    """(device, dtype, non_blocking, copy) from the argument forms of torch.Tensor.to:
    to(dtype), to(device, dtype=None), to(other_tensor), with non_blocking, copy and
    memory_format accepted (the last two only as PyTorch takes them)."""
    kwargs = dict(kwargs)
    unknown = set(kwargs) - {"device", "dtype", "non_blocking", "copy", "memory_format"}
    if unknown:
        raise TypeError(f"{call}: unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    kwargs.pop("memory_format", None)  # lazyrt has one layout
    args = list(args)
    dev = dtype = None
    if args and isinstance(args[0], Tensor):
        other = args.pop(0)
        dev, dtype = other.device, other.dtype
    elif args and isinstance(args[0], _C.dtype):
        dtype = args.pop(0)
    elif args and (args[0] is None or isinstance(args[0], (str, device)) or hasattr(args[0], "type")):
        dev = args.pop(0)
        if args and isinstance(args[0], _C.dtype):
            dtype = args.pop(0)
    if args and not isinstance(args[0], builtins.bool):
        raise TypeError(f"{call}: invalid arguments; expected to(dtype), to(device, dtype=None) or "
                        f"to(tensor), got {type(args[0]).__name__}")
    flags = dict(zip(("non_blocking", "copy"), args))
    if len(args) > 2:
        raise TypeError(f"{call}: too many positional arguments")
    for name in ("device", "dtype"):
        if name in kwargs:
            if (dev if name == "device" else dtype) is not None:
                raise TypeError(f"{call}: {name} given twice")
            if name == "device":
                dev = kwargs.pop(name)
            else:
                dtype = kwargs.pop(name)
    flags.update(kwargs)
    if dtype is not None and not isinstance(dtype, _C.dtype):
        raise TypeError(f"{call}: dtype must be a lazyrt dtype, got {type(dtype).__name__}")
    return _check_device(dev, call), dtype, builtins.bool(flags.get("non_blocking", False)), \
        builtins.bool(flags.get("copy", False))


def _to(self, *args, **kwargs):
    """The tensor in another dtype, as torch.Tensor.to: to(dtype), to(device, dtype=None),
    to(other) (other's dtype), non_blocking and copy keywords. Returns the tensor itself when
    nothing changes (unless copy=True); devices must be lazyrt's ('lazy' or 'cpu')."""
    _, dtype, _, copy = _parse_to(args, kwargs, "to")
    if dtype is None or dtype is self.dtype:
        return self.clone() if copy else self
    return _C.cast(self, dtype)


def _new_shape(size, call):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    shape = tuple(size)
    for d in shape:
        if not isinstance(d, (builtins.int, np.integer)) or isinstance(d, builtins.bool):
            raise TypeError(f"{call}: the size must be ints, got {shape!r}")
    return tuple(builtins.int(d) for d in shape)


def _new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    """A new tensor of `size` filled with `fill_value`, in this tensor's dtype unless given."""
    _check_device(device, "new_full")
    return _C.full(_new_shape((size,), "new_full"), fill_value, dtype=dtype or self.dtype,
                   requires_grad=requires_grad)


def _new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
    """A new tensor of zeros, in this tensor's dtype unless given."""
    _check_device(device, "new_zeros")
    return _C.zeros(_new_shape(size, "new_zeros"), dtype=dtype or self.dtype, requires_grad=requires_grad)


def _new_ones(self, *size, dtype=None, device=None, requires_grad=False):
    """A new tensor of ones, in this tensor's dtype unless given."""
    _check_device(device, "new_ones")
    return _C.ones(_new_shape(size, "new_ones"), dtype=dtype or self.dtype, requires_grad=requires_grad)


def _new_empty(self, *size, dtype=None, device=None, requires_grad=False):
    """A new tensor of `size`. lazyrt has no uninitialized memory: it holds zeros."""
    _check_device(device, "new_empty")
    return _C.zeros(_new_shape(size, "new_empty"), dtype=dtype or self.dtype, requires_grad=requires_grad)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    """A copy of `data` in this tensor's dtype unless given (PyTorch's rule: the dtype is not
    inferred from `data`)."""
    _check_device(device, "new_tensor")
    return tensor(data, dtype=dtype or self.dtype, requires_grad=requires_grad)


# ---- copying and pickling ------------------------------------------------------------------
# A tensor pickles as its values (a NumPy array), dtype, requires_grad, class (a Parameter
# stays a Parameter) and any attributes of a subclass; the gradient is not kept, as in
# PyTorch. copy.deepcopy makes a new leaf with the same value, requires_grad and a deep copy
# of the gradient, without reading the value: lazyrt values are immutable, so the copy shares
# the value until either tensor is changed in place.

def _dtype_named(name):
    return getattr(_C, name)


_C.dtype.__reduce__ = lambda self: (_dtype_named, (str(self).rpartition(".")[2],))
_C.dtype.__copy__ = lambda self: self
_C.dtype.__deepcopy__ = lambda self, memo: self


def _of_class(cls, value, requires_grad):
    """A tensor of class `cls` (Tensor or a subclass) holding `value`, a fresh handle."""
    if cls is Tensor:
        t = value
    else:
        t = Tensor.__new__(cls)
        Tensor.__init__(t, value)
    t.requires_grad_(requires_grad)
    return t


def _rebuild_tensor(cls, values, dtype, requires_grad, state):
    t = _of_class(cls, tensor(values, dtype=dtype), requires_grad)
    if state:
        t.__dict__.update(state)
    return t


def _reduce_ex(self, protocol):
    # NumPy has no bfloat16: its values travel as float32, which holds them exactly.
    values = (_C.cast(self, _C.float32) if self.dtype is _C.bfloat16 else self).numpy()
    state = getattr(self, "__dict__", None) or None
    return (_rebuild_tensor, (type(self), values, self.dtype, self.requires_grad, state))


def _deepcopy(self, memo):
    if not self.is_leaf:
        raise _C.Error("deepcopy: only tensors created by the user (graph leaves) can be deep-copied; "
                       "this one is the result of an op that records gradients (detach() it first)")
    new = _of_class(type(self), self.detach().clone(), self.requires_grad)
    memo[id(self)] = new
    if self.grad is not None:
        new.grad = self.grad.detach().clone()
    state = getattr(self, "__dict__", None)
    if state:
        import copy
        new.__dict__.update(copy.deepcopy(state, memo))
    return new


# ---- device= on the factories ------------------------------------------------------------------
# PyTorch code passes device= to every factory (torch.zeros(n, device=x.device)); lazyrt's own
# device, and 'cpu', are accepted, anything else is refused as in Tensor.to.

def _with_device(fn, name):
    def factory(*args, device=None, **kwargs):
        _check_device(device, name)
        return fn(*args, **kwargs)
    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = fn.__doc__
    return factory


FACTORIES = {name: _with_device(getattr(_C, name), name)
             for name in ("zeros", "ones", "full", "rand", "randn", "randint", "zeros_like", "ones_like", "full_like",
                          "scalar_tensor")}


# ---- more of torch.Tensor's surface, as compositions of lazyrt's ops -----------------------------

def _expand_as(self, other):
    """The tensor broadcast to other's shape."""
    return _C.expand(self, tuple(other.shape))


def _view_as(self, other):
    """The tensor viewed with other's shape."""
    return _C.view(self, tuple(other.shape))


def _type_as(self, other):
    """The tensor in other's dtype (itself when the dtype is the same)."""
    return _to(self, other.dtype)


def _square(self):
    """x * x (a bool tensor gives int64, as PyTorch's pow(x, 2))."""
    if self.dtype is _C.bool:
        self = _C.cast(self, _C.int64)
    return self * self


def _dim_index(dim, ndim, call):
    if not -builtins.max(ndim, 1) <= dim < builtins.max(ndim, 1):
        raise IndexError(f"{call}: dimension out of range (expected to be in range of "
                         f"[{-builtins.max(ndim, 1)}, {builtins.max(ndim, 1) - 1}], but got {dim})")
    return dim + ndim if dim < 0 else dim


def _select(self, dim, index):
    """The slice at `index` along `dim`, that dim removed (as t[..., index, ...]). `index` may be
    a one-element integer tensor, read when the graph runs (a loop body's counter)."""
    if self.dim() == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    if isinstance(index, _C.Tensor):
        return _C._select_at(self, dim, index)
    d = _dim_index(dim, self.dim(), "select()")
    size = self.shape[d]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(self.shape)} "
                         f"at dimension {dim}")
    return _C.squeeze(_C.narrow(self, d, index % size, 1), d)


def _unbind(self, dim=0):
    """The slices along `dim`, that dim removed, as a tuple."""
    if self.dim() == 0:
        raise IndexError("unbind(): dimension specified as 0 but tensor has no dimensions")
    d = _dim_index(dim, self.dim(), "unbind()")
    return tuple(_select(self, d, i) for i in range(self.shape[d]))


def _mT(self):
    if self.dim() < 2:
        raise _C.Error(f"tensor.mT is only supported on matrices or batches of matrices. Got {self.dim()}-D tensor.")
    return _C.transpose(self, -2, -1)


# ---- in-place forms --------------------------------------------------------------------------
# lazyrt values are immutable: an in-place method computes the new value and rebinds the tensor
# to it with copy_, so the tensor keeps its identity (a module's attribute, a name bound to it)
# and, while gradients are recorded, the gradient flows through the new value to what the old
# one came from, as in PyTorch. As in PyTorch, a leaf that requires grad cannot be changed
# while gradients are recorded, and a result that the tensor's dtype cannot hold (a float
# result into an integer tensor, a number into a bool one) is refused rather than cast.
# Views do not share memory in lazyrt: changing t[0] in place leaves t as it was.

def _assign(self, value, call):
    if self.requires_grad and self.is_leaf and _C.is_grad_enabled():
        raise _C.Error(f"{call}: a leaf tensor that requires grad cannot be modified in place while gradients "
                       "are recorded (use lazyrt.no_grad())")
    if (value.is_floating_point() and not self.is_floating_point()) or \
            (self.dtype is _C.bool and value.dtype is not _C.bool):
        raise _C.Error(f"{call}: result type {value.dtype} can't be cast to the desired output type {self.dtype}")
    if tuple(value.shape) != tuple(self.shape):
        raise _C.Error(f"{call}: output with shape {list(self.shape)} doesn't match the broadcast shape "
                       f"{list(value.shape)}")
    self.copy_(value)
    return self


def _inplace(name, compute):
    def method(self, *args, **kwargs):
        return _assign(self, compute(self, *args, **kwargs), name)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"In place: the tensor becomes {name[:-1]}(...) of itself and is returned."
    return method


def _check_random_fill(self, call):
    if not self.is_floating_point():
        raise _C.Error(f"{call}: expected a floating-point tensor, got {self.dtype}")
    if self.requires_grad and self.is_leaf and _C.is_grad_enabled():
        raise _C.Error(f"{call}: a leaf tensor that requires grad cannot be modified in place while gradients "
                       "are recorded (use lazyrt.no_grad())")


def _random_fill(self, fill):
    """Fills the tensor with `fill` (an nn.init function, which writes unrecorded). A tensor
    whose gradient is recorded keeps its place in the graph, with a zero gradient to what it
    came from, as in PyTorch."""
    if not (self.requires_grad and _C.is_grad_enabled()):
        fill(self)
        return self
    values = fill(_C.zeros(tuple(self.shape), dtype=self.dtype))
    self.copy_(_C.where(_C.zeros(tuple(self.shape), dtype=_C.bool), self, values))
    return self


def _normal_(self, mean=0.0, std=1.0, *, generator=None):
    """In place: values from N(mean, std^2) (lazyrt's generator: lazyrt.manual_seed)."""
    from lazyrt.nn import init
    _check_random_fill(self, "normal_")
    if std < 0:
        raise _C.Error(f"normal_: expects std >= 0.0, but found std {std}")
    if generator is not None:
        raise _C.Error("normal_: generator= is not supported (lazyrt has one generator: lazyrt.manual_seed)")
    return _random_fill(self, lambda t: init.normal_(t, mean, std))


def _uniform_(self, a=0.0, b=1.0, *, generator=None, **kwargs):
    """In place: values uniform in [a, b) (PyTorch's from= and to= are accepted too)."""
    from lazyrt.nn import init
    unknown = set(kwargs) - {"from", "to"}
    if unknown:
        raise TypeError(f"uniform_: unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    a, b = kwargs.get("from", a), kwargs.get("to", b)
    _check_random_fill(self, "uniform_")
    if a > b:
        raise _C.Error(f"uniform_: expects to return a [from, to) range, but found from={a} > to={b}")
    if generator is not None:
        raise _C.Error("uniform_: generator= is not supported (lazyrt has one generator: lazyrt.manual_seed)")
    return _random_fill(self, lambda t: init.uniform_(t, a, b))
