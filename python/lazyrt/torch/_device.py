"""The lazyrt device: torch tensors whose values are lazyrt tensors, as on PyTorch/XLA's device.

``torch.device("lazyrt")`` is PyTorch's PrivateUse1 device type, renamed (its device guard and
hooks are registered in C++ by lazyrt._torch_C). A tensor on it is a `_Value`: a tensor subclass
holding one lazyrt tensor (``_v``) for its whole life, as an XLA tensor holds its XLA data. Its
``__torch_dispatch__`` records every aten op as lazyrt ops through the lowering table every
captured step uses (``_lower.LOWERINGS``, with PyTorch's answer for the result's shape and dtype
from its meta kernel, computed once per op and argument types). PyTorch's own autograd records
on it (``backward()``, hooks and ``torch.optim`` work as on any device), and lazyrt's own
tensor semantics give PyTorch's: an in-place op updates the lazyrt tensor in place (its
functional form computes the new value), views are lazyrt views (a write through ``y[0]``
shows in ``y``), and ``detach()``/``.data`` share the lazyrt tensor. So the lazyrt tensors are
the device tensors' identities, and lazyrt's cached-graph replay (`_get_graph_hash` and the
calls after it) writes a step's updates back into them.

Nothing runs until a value is read (``.cpu()``, ``.item()``, printing) or `sync()` cuts the
graph: every live device tensor's pending value is computed as one lazyrt graph (lazyrt's
``mark_step()``), compiled once per graph hash and cached. Factories
(``torch.zeros(..., device="lazyrt")``) reach the device through its C++ kernel
(lazyrt._torch_C), which hands them to `_boxed`. An op without a lowering computes its inputs,
runs on the CPU in PyTorch and comes back as a device tensor: counted as ``GraphBreak`` in
`lazyrt.metrics` and warned once per op with `GraphBreakWarning`. Tensors on the device report
contiguous strides, as PyTorch/XLA's do.
"""

import functools
import math
import threading
import warnings
import weakref

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch import _lower
from lazyrt.torch._lower import LOWERINGS, REFUSALS, GraphBreakWarning, UnsupportedOperatorError

NAME = "lazyrt"
aten = torch.ops.aten

_LOCK = threading.RLock()
_STATE = {"registered": None}  # None: not tried; True; or the text of why the device is not there


def _ensure():
    """Registers the device with PyTorch once (the PrivateUse1 name, the device module, the
    tensor/module methods, the factory fallback, printing)."""
    state = _STATE["registered"]
    if state is True:
        return
    if state is not None:
        raise RuntimeError(state)
    with _LOCK:
        if _STATE["registered"] is not None:
            return _ensure()
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", NAME):
            _STATE["registered"] = (f"lazyrt.torch: the lazyrt device needs PyTorch's PrivateUse1 device type, which "
                                    f"this process already gave to '{current}'")
            raise RuntimeError(_STATE["registered"])
        if current != NAME:
            torch.utils.rename_privateuse1_backend(NAME)
        _DEVICE[0] = torch.device(NAME, 0)
        torch._register_device_module(NAME, _Module)
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
        _keep_ties_on_moves()
        from lazyrt import _torch_C
        _torch_C.set_device_dispatcher(_boxed)
        _patch_printing()
        _register_loops()
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        register_optimizer_step_pre_hook(_optimizer_stepped)
        # The backward of device tensors runs on the thread that calls it, as the CPU's does:
        # PyTorch's engine sizes its per-device queues once, at its first backward, which may
        # come before lazyrt.torch is imported (a queue for this device would then be missing),
        # and lazyrt records a thread's ops for that thread's sync().
        torch._C._set_multithreading_enabled(False)
        _STATE["registered"] = True


def device(index=0):
    """The lazyrt device, ``torch.device("lazyrt", 0)`` (registering it with PyTorch the first
    time). lazyrt has one device."""
    _ensure()
    if index not in (0, None):
        raise RuntimeError(f"lazyrt.torch.device: lazyrt has one device, lazyrt:0; asked for index {index}")
    return torch.device(NAME, 0)


def sync(tensors=None, wait=True):
    """Computes the pending values of every live tensor on the device (or of `tensors`) as one
    lazyrt graph: PyTorch/XLA's ``mark_step()`` (lazyrt's, which also starts the step that
    `_get_graph_hash` and the calls after it take). Compiled once per graph hash and cached."""
    if tensors is None:
        lazyrt.mark_step()
        _STEPPED.clear()
        _WRITTEN.clear()
        _HOST.clear()
        return
    pending = [_value_of(t)._v for t in tensors]
    pending = [v for v in pending if v.is_pending]
    if pending:
        _C.sync(pending)


mark_step = sync


class _Module:
    """``torch.lazyrt``: what PyTorch asks of a device's module."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def set_device(index):
        device(index)

    @staticmethod
    def _is_in_bad_fork():
        return False

    @staticmethod
    def manual_seed(seed):
        lazyrt.manual_seed(int(seed))

    manual_seed_all = manual_seed

    @staticmethod
    def synchronize(device=None):
        sync()

    @staticmethod
    def get_amp_supported_dtype():
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_initialized():
        return _STATE["registered"] is True

    @staticmethod
    def _lazy_init():
        _ensure()


# ---- the tensors -----------------------------------------------------------------------------

class _Value(torch.Tensor):
    """A device tensor: a lazyrt tensor (``_v``) with PyTorch's tensor metadata. Its aten ops go
    to `_dispatch`."""

    @staticmethod
    def __new__(cls, v, dtype=None):
        # dtype: for an empty tensor of a dtype lazyrt has not (batch norm's uint8 reserve)
        r = torch.Tensor._make_wrapper_subclass(cls, tuple(v.shape), dtype=dtype or _lower._TORCH_DTYPES[v.dtype],
                                                device=_DEVICE[0])
        r._v = v
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def data(self):
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, value):
        """``t.data = value``: t takes value's lazyrt tensor (the two share it, as PyTorch's
        share storage) and shape, keeping its autograd state."""
        from lazyrt import _torch_C
        value = _value_of(value)
        if value.dtype != self.dtype:
            raise RuntimeError(f"lazyrt.torch: t.data = value: the lazyrt device keeps a tensor's dtype, "
                               f"{self.dtype}; got a value of {value.dtype}")
        _torch_C.set_device_shape(self, list(value.shape))
        self._v = value._v

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


_DEVICE = [None]


def _value_of(t):
    """Device tensor t, checked."""
    if isinstance(t, _Value):
        return t
    raise TypeError(f"lazyrt.torch: expected a tensor on the lazyrt device, got "
                    f"{type(t).__name__}{' on ' + str(t.device) if isinstance(t, torch.Tensor) else ''}")


def from_device(t):
    """The lazyrt tensor of device tensor t: the same tensor, not a copy (an in-place op on
    either shows in both); nothing is computed."""
    return _value_of(t)._v


def to_device(v):
    """A device tensor whose lazyrt tensor is v: the same tensor, not a copy; nothing is
    computed."""
    _ensure()
    return _Value(v)


def _cpu_to_lazy(t):
    """A lazyrt tensor with the values of CPU tensor t, copied (the caller may change t later)."""
    _lower.lazy_dtype(t.dtype, "a tensor on the lazyrt device")
    return lazyrt.from_torch(t.detach().clone(memory_format=torch.contiguous_format))


def _to_cpu(v):
    """CPU tensor with lazyrt tensor v's values (computing v), owning its memory."""
    return lazyrt.to_torch(v).clone()


# ---- dispatch --------------------------------------------------------------------------------

class _Func:
    """What the dispatcher knows of one op: its own meaning on the device (`special`), its
    lifting of Python numbers (`lift`), how it is computed (`kind`) and the op whose lowering
    computes it (`op`, see _functional_of). Made on the op's first call."""

    __slots__ = ("func", "special", "indexing", "lift", "kind", "op", "lowering", "twin", "reshapes", "one_alias")

    def __init__(self, func):
        self.func = func  # (held: the table is keyed by its id)
        self.special = _SPECIAL.get(func)
        self.indexing = func in _INDEXING
        self.lift = _LIFTS.get(func)
        self.kind = _kind(func)
        self.op = _functional_of(func)
        self.lowering = LOWERINGS.get(self.op)
        # An in-place op: its functional twin, whether it changes its tensor's shape, whether it
        # returns its tensor alone.
        self.twin = _twin(func) if self.kind == "in_place" else None
        self.reshapes = torch.Tag.inplace_view in func.tags
        returns = func._schema.returns
        self.one_alias = len(returns) == 1 and returns[0].alias_info is not None


# op id -> _Func: an OpOverload hashes in Python, an id in C.
_FUNCS = {}


def _func(func):
    f = _FUNCS.get(id(func))
    if f is None:
        f = _FUNCS[id(func)] = _Func(func)
    return f


def _dispatch(func, args, kwargs):
    f = _FUNCS.get(id(func)) or _func(func)
    if _COPIED[0]:
        _refresh(args, kwargs)
    if f.special is not None:
        return f.special(*args, **kwargs)
    if f.indexing and isinstance(args[1], (list, tuple)):  # CPU indices, as PyTorch takes them
        args = (args[0], [_Value(_cpu_to_lazy(i)) if isinstance(i, torch.Tensor) and not isinstance(i, _Value)
                          else i for i in args[1]], *args[2:])
    if f.lift is not None:
        lifted = f.lift(*args, **kwargs)
        if lifted is not NotImplemented:
            return lifted
    kind = f.kind
    if kind == "op":
        return _op(func, args, kwargs, f)
    if kind == "foreach":
        return _foreach(func, args, kwargs)
    if kind == "in_place":
        return _in_place(func, args, kwargs, f)
    if kind == "view":
        return _view(func, args, kwargs)
    return _out(func, args, kwargs)


def _op(func, args, kwargs, f=None):
    f = f or _func(func)
    plan = _plan(f.op, args, kwargs)
    if plan is None:
        decomposition = _decomposition(f.op)
        if decomposition is not None:
            return decomposition(*args, **kwargs)
        return _on_cpu(func, args, kwargs)
    node, e = plan
    largs = [a._v if type(a) is _Value else _lazy_arg(a) for a in args]
    try:
        if kwargs:
            lkwargs = tree_map(_lazy_arg, kwargs)
            lkwargs.pop("device", None)
            result = f.lowering(e, *largs, **lkwargs)
        else:
            result = f.lowering(e, *largs)
    except UnsupportedOperatorError:
        return _on_cpu(func, args, kwargs)
    return _results(node, e, result)


def _view(func, args, kwargs):
    """A view op: lazyrt views of the input's lazyrt tensor where lazyrt has them (every view
    torch.nn and torch.optim make). A result that is a copy (as_strided, view(dtype), unfold)
    is marked: writing to it is refused rather than lost, and it is computed again from its
    input whenever that input (or a view of it: they share PyTorch's version counter) was
    changed in place since (`_refresh`), so that it reads as a view would."""
    out = _op(func, args, kwargs)
    base = args[0]
    outs = out if isinstance(out, (list, tuple)) else (out,)
    for i, r in enumerate(outs):
        if isinstance(r, _Value) and r._v is not base._v and not r._v._is_view():
            r._copy_of_view = str(func)
            r._regen = (func, args, kwargs, i if isinstance(out, (list, tuple)) else None, base._version)
            _COPIED[0] = True
    return out


_COPIED = [False]  # whether a copy-computed view was ever made (else _refresh is skipped)


def _refresh(args, kwargs):
    """Computes again the copy-computed views among an op's arguments whose input changed in
    place since they were computed."""
    for a in tree_leaves((args, kwargs)):
        regen = getattr(a, "_regen", None) if isinstance(a, _Value) else None
        if regen is not None and regen[4] != regen[1][0]._version:
            func, fargs, fkwargs, index, _ = regen
            new = _op(func, fargs, fkwargs)
            a._v = (new if index is None else new[index])._v
            a._regen = (func, fargs, fkwargs, index, fargs[0]._version)


def _kind(func):
    """How func is computed: "foreach", "in_place", "view", "out" or "op"."""
    schema = func._schema
    if func.__name__.startswith("_foreach_"):
        return "foreach"
    if schema.is_mutable and schema.name.endswith("_") and _functional_of(func) is func:
        return "in_place"
    returns = schema.returns
    if returns and returns[0].alias_info is not None and not schema.is_mutable:
        return "view"
    if any(a.is_out for a in schema.arguments) and _out_twin(func) is not None:
        return "out"
    return "op"


@functools.lru_cache(maxsize=None)
def _out_twin(func):
    """The functional form of out= op func (maximum.out: maximum.default), or None."""
    packet = getattr(aten, func._schema.name.split("::")[1], None)
    names = [a.name for a in func._schema.arguments if not a.is_out]
    for overload in packet.overloads() if packet is not None else ():
        candidate = getattr(packet, overload)
        if candidate is not func and [a.name for a in candidate._schema.arguments] == names:
            return candidate
    return None


def _out(func, args, kwargs):
    """An out= op: its functional form's results written into the out tensors (resized first
    where their shape differs, as PyTorch does)."""
    outs = [a.name for a in func._schema.arguments if a.is_out]
    kwargs = dict(kwargs)
    targets = [kwargs.pop(name) for name in outs]
    result = _dispatch(_out_twin(func), args, kwargs)
    results = result if isinstance(result, (list, tuple)) else (result,)
    for target, r in zip(targets, results):
        if tuple(target.shape) != tuple(r.shape):
            _resize(target, r.shape)
        _assign(target, r._v)
    return tuple(targets) if len(targets) > 1 else targets[0]


# Ops whose index tensors may be on the CPU while the indexed tensor is on a device.
_INDEXING = {aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten._unsafe_index_put.default,
             aten.index_put_.default, aten._index_put_impl_.default}


def _in_place(func, args, kwargs, f):
    """An in-place op on a device tensor: its functional twin computes the value the first
    argument's lazyrt tensor takes in place."""
    functional = f.twin
    if functional is not None and f.reshapes:
        return _reshaped(functional, args, kwargs)
    if (functional is None or not f.one_alias
            or _plan(_func(functional).op, args, kwargs) is None and _decomposition(functional) is None):
        return _on_cpu(func, args, kwargs)  # (a fused optimizer step: its lists written back)
    out = _dispatch(functional, args, kwargs)
    target = args[0]
    _assign(target, out._v)
    return target


@functools.lru_cache(maxsize=None)
def _twin(func):
    """The functional form of in-place op func (add_.Tensor: add.Tensor; transpose_: transpose.int),
    or None."""
    packet = getattr(aten, func._schema.name.split("::")[1][:-1], None)
    if packet is None:
        return None
    same = getattr(packet, func._overloadname, None)
    if same is not None:
        return same
    names = [a.name for a in func._schema.arguments]
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        if [a.name for a in candidate._schema.arguments] == names:
            return candidate
    return None


def _assign(target, v):
    """Device tensor target takes lazyrt value v (cast to its dtype, broadcast to its shape) in
    place: its lazyrt tensor keeps its identity, and its views and aliases see the new value."""
    if "_copy_of_view" in target.__dict__:
        raise RuntimeError(f"lazyrt.torch: a tensor made by {target._copy_of_view} on the lazyrt device is a copy, not "
                           f"a view of its input, so writing to it in place would not reach that input; write to "
                           f"the input (or a clone()) instead")
    dtype = _lower.lazy_dtype(target.dtype)
    if v.dtype is not dtype:
        v = _C.cast(v, dtype)
    if v.shape != target.shape:
        v = _C.expand(v, list(target.shape))
    target._v.copy_(v)
    if _STEPPED:
        _WRITTEN.add(target._v)


def _reshaped(functional, args, kwargs):
    """An in-place op that changes its tensor's shape (t_, unsqueeze_, squeeze_, transpose_):
    the tensor takes the view its functional form makes, and that view's shape."""
    from lazyrt import _torch_C
    out = _dispatch(functional, args, kwargs)
    target = args[0]
    _torch_C.set_device_shape(target, list(out.shape))
    target._v = out._v
    return target


@functools.lru_cache(maxsize=None)
def _decomposition(op):
    """PyTorch's decomposition of op (the capture's choices first; an op PyTorch composes of
    others, such as aten.to or flatten, which decompositions call), or None."""
    from lazyrt.torch import _capture
    from torch._decomp import decomposition_table
    found = _capture._decompositions().get(op) or decomposition_table.get(op)
    if found is None and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        found = op.decompose
    return found


def tree_map(fn, x):
    """fn applied to the leaves of x (nested tuples, lists and dicts: an op's arguments)."""
    if isinstance(x, (tuple, list)):
        items = [tree_map(fn, a) for a in x]
        return type(x)(*items) if hasattr(type(x), "_fields") else type(x)(items)
    if isinstance(x, dict):
        return {k: tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def tree_leaves(x, out=None):
    """The leaves of x, in order."""
    out = [] if out is None else out
    if isinstance(x, (tuple, list)):
        for a in x:
            tree_leaves(a, out)
    elif isinstance(x, dict):
        for a in x.values():
            tree_leaves(a, out)
    else:
        out.append(x)
    return out


def _functional_of(func):
    """The op whose lowering computes func: a view op's copying twin (``t_copy``, which
    functionalization calls) is computed as the view op."""
    op = _TWINS.get(func)
    if op is None:
        op = func
        name = func._schema.name  # aten::t_copy
        if func not in LOWERINGS and name.endswith("_copy"):
            packet = getattr(aten, name.split("::")[1][:-len("_copy")], None)
            overload = getattr(packet, func._overloadname, None) if packet is not None else None
            if overload is not None and overload in LOWERINGS:
                op = overload
        _TWINS[func] = op
    return op


_TWINS = {}


def _lazy_arg(a):
    if isinstance(a, _Value):
        return a._v
    if isinstance(a, (list, tuple)):
        return tree_map(_lazy_arg, a)
    if isinstance(a, torch.Tensor):
        if a.device.type == "cpu" and a.dim() == 0:
            return _cpu_to_lazy(a)  # a CPU scalar mixes with any device's tensors, as in PyTorch
        if a.device.type == NAME:  # a capture's fake tensor met a real device tensor
            raise RuntimeError("the step reads a device tensor found in none of the places a capture looks: "
                               "its arguments, the parameters, buffers and optimizer state, and the globals, "
                               "closure cells and attributes the step reaches (not a default argument's value, "
                               "nor what a library function keeps); pass it as an argument of the step")
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{NAME}:0 and {a.device}")
    return a


def _meta(a):
    if isinstance(a, torch.Tensor):
        return torch.empty(a.shape, dtype=a.dtype, device="meta")
    return a


def _key(a):
    """The part of an argument that PyTorch's answer for the result depends on."""
    t = type(a)
    if t is _Value:
        return (a.dtype, a.shape)
    if t is float:
        return float
    if t is tuple or t is list:
        return (t, tuple([_key(x) for x in a]))
    if t is bool:
        return (bool, a)  # (True == 1: a bool keys apart from an int)
    if isinstance(a, torch.Tensor):
        return (a.dtype, tuple(a.shape), a.device.type)
    if isinstance(a, float):
        return float
    if isinstance(a, (list, tuple)):
        return (t, tuple([_key(x) for x in a]))
    if isinstance(a, dict):
        return tuple((k, _key(v)) for k, v in a.items())
    return a


_PLANS = {}
_NO_PLAN = object()


def _plan(op, args, kwargs):
    """(node, Expect) for lowering op on these argument types, or None where it is run on the
    CPU (no lowering, refused for these attributes, or no meta kernel); made once per op and
    argument types. The node is a one-op FX graph carrying PyTorch's answers (meta tensors), so
    that the lowering table's expectations and refusals read it as they read a captured graph."""
    try:
        key = (id(op), _key(args), _key(kwargs) if kwargs else None)
        plan = _PLANS.get(key, _NO_PLAN)
    except TypeError:  # an unhashable argument
        key, plan = None, _NO_PLAN
    if plan is not _NO_PLAN:
        return plan
    plan = None
    if op in LOWERINGS:
        try:
            margs, mkwargs = tree_map(_meta, (args, kwargs))
            mkwargs = {k: ("meta" if k == "device" else v) for k, v in mkwargs.items()}
            out = op(*margs, **mkwargs)
        except Exception:  # noqa: BLE001  (no meta kernel: the CPU computes it)
            out = None
        if out is not None or op._schema.returns == []:
            graph = torch.fx.Graph()
            count = [0]

            def placeholder(m):
                if not isinstance(m, torch.Tensor):
                    return m
                count[0] += 1
                p = graph.placeholder(f"arg{count[0]}")
                p.meta["val"] = m
                return p
            nargs, nkwargs = tree_map(placeholder, (margs, mkwargs))
            node = graph.call_function(op, tuple(nargs), nkwargs)
            node.meta["val"] = out
            refusal = REFUSALS.get(op)
            if refusal is None or refusal(node) is None:
                plan = (node, _lower.Expect(node))
    if key is not None:
        _PLANS[key] = plan
    return plan


def _results(node, e, result):
    val = node.meta["val"]
    if isinstance(val, (tuple, list)):
        outs = []
        for r, m in zip(result, val):
            if isinstance(r, _C.Tensor):
                r = _lower._cast(r, _lower.lazy_dtype(m.dtype)) if isinstance(m, torch.Tensor) else r
                outs.append(_Value(r))
            else:
                outs.append(r)
        return type(val)(outs) if isinstance(val, tuple) else outs
    result = _lower._checked(node, e, result)
    return _Value(result) if isinstance(result, _C.Tensor) else result


def _torch_arg(a):
    if isinstance(a, _Value):
        return lazyrt.to_torch(a._v)
    if isinstance(a, torch.device) and a.type == NAME:
        return torch.device("cpu")
    return a


def _from_cpu(out):
    return tree_map(lambda o: _Value(lazyrt.from_torch(o.contiguous())) if isinstance(o, torch.Tensor) else o, out)


def _on_cpu(func, args, kwargs):
    """Runs func in PyTorch on the CPU on the computed values of its inputs (a graph break)."""
    name = str(func)
    if name not in _lower.interpreter._WARNED_BREAKS:
        _lower.interpreter._WARNED_BREAKS.add(name)
        warnings.warn(f"lazyrt.torch: graph break: {name} has no lowering to lazyrt; on the lazyrt device it runs "
                      f"in PyTorch on the CPU, after its inputs are computed", GraphBreakWarning, stacklevel=4)
    _C._metrics._increment("GraphBreak", 1)
    _HOST.setdefault("ran", set()).add(name)
    values = [a._v for a in tree_leaves((args, kwargs)) if isinstance(a, _Value)]
    if values:
        _C.sync(values)
    targs, tkwargs = tree_map(_torch_arg, (args, kwargs))
    if func._schema.is_mutable:  # lazyrt's memory is not written: copies are, and the values take them
        targs, tkwargs = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (targs, tkwargs))
    with torch.no_grad():
        out = func(*targs, **tkwargs)
    if func._schema.is_mutable:
        for arg, (given, copied) in zip(func._schema.arguments, _bound(func, (args, kwargs), (targs, tkwargs))):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            if isinstance(given, _Value):
                _assign(given, lazyrt.from_torch(copied.contiguous()))
                if out is copied:
                    return given
            elif isinstance(given, (list, tuple)):  # a list written in place (a fused optimizer's)
                for g, c in zip(given, copied):
                    if isinstance(g, _Value):
                        _assign(g, lazyrt.from_torch(c.contiguous()))
    return _from_cpu(out)


def _bound(func, given, copied):
    """(given, copied) argument pairs in the schema's order."""
    (args, kwargs), (targs, tkwargs) = given, copied
    pairs = []
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args):
            pairs.append((args[i], targs[i]))
        else:
            pairs.append((kwargs.get(arg.name), tkwargs.get(arg.name)))
    return pairs


def _foreach(func, args, kwargs):
    """A _foreach_ op (torch.optim's default on a device): its single-tensor op, with overloads
    resolved by PyTorch, at each position of its lists."""
    name = func.__name__.split(".")[0][len("_foreach_"):]
    in_place = name.endswith("_")  # the functional op, and the first list takes its values
    name = name.rstrip("_")
    packet = aten.linalg_vector_norm if name == "norm" else getattr(aten, name)
    n = len(next(a for a in args if isinstance(a, (list, tuple))))
    outs = []
    for i in range(n):
        item = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
        kw = kwargs
        if name in ("addcmul", "addcdiv") and len(item) > 3:  # the scalar (or scalars) is `value`
            value = item.pop(3)
            kw = dict(kwargs, value=value.tolist()[i] if isinstance(value, torch.Tensor) else value)
        out = packet(*item, **kw)
        if in_place:
            _assign(item[0], out._v)
        else:
            outs.append(out)
    return None if in_place else outs


# Ops with the device's own meaning.

def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    target = torch.device(device) if device is not None else None
    if target is not None and target.type != NAME:
        _HOST.setdefault("read", set()).add(f"a copy to {target.type}")
        t = _to_cpu(x._v)
        return t.to(device=target, dtype=dtype or t.dtype)
    v = x._v.clone()  # a tensor of its own, as a copy is
    if dtype is not None:
        v = _lower._cast(v, _lower.lazy_dtype(dtype))
    return _Value(v)


def _copy(x, src, non_blocking=False):
    if isinstance(src, _Value):
        v = src._v
    elif isinstance(src, torch.Tensor):
        v = _cpu_to_lazy(src.to(x.dtype))
    else:
        raise TypeError(f"copy: expected a tensor, got {type(src).__name__}")
    v = _lower._cast(v, _lower.lazy_dtype(x.dtype))
    if tuple(v.shape) != tuple(x.shape):
        v = _C.expand(v, list(x.shape))
    return _Value(v)


def _copy_from(src, dst, non_blocking=False):
    """PyTorch's copy between devices, called by copy_ when the Python key is off (torch.tensor
    on the device): dst takes src's values."""
    if isinstance(dst, _Value):
        _assign(dst, _copy(dst, src)._v)
        return dst
    dst.copy_(_to_cpu(src._v) if isinstance(src, _Value) else src)  # to the CPU
    return dst


def _resize(x, size, memory_format=None):
    """resize_: a new shape keeps the elements that fit, in order (growth adds zeros, where
    PyTorch leaves memory uninitialized)."""
    from lazyrt import _torch_C
    size = tuple(size)
    if size == tuple(x.shape):
        return x
    n, flat = math.prod(size), _C.reshape(x._v, (x.numel(),))
    if n <= x.numel():
        flat = _C.slice(flat, 0, 0, n, 1)
    else:
        flat = _C.cat([flat, _C.full((n - x.numel(),), 0, dtype=flat.dtype)], 0)
    _torch_C.set_device_shape(x, list(size))
    x._v = _C.reshape(flat, size).clone()
    return x


def _set(x, source):
    """set_(source): x becomes another name for source's lazyrt tensor, with its shape."""
    from lazyrt import _torch_C
    if x.dtype != source.dtype:
        raise RuntimeError(f"set_: expected a source of dtype {x.dtype}, got {source.dtype}")
    _torch_C.set_device_shape(x, list(source.shape))
    x._v = _value_of(source)._v
    return x


def _item(x):
    _HOST.setdefault("read", set()).add(".item()")
    return lazyrt.to_torch(x._v).item()


def _alias(x, *args, **kwargs):
    """detach, alias: another device tensor over the same lazyrt tensor (an alias of a
    copy-computed view is one too)."""
    r = _Value(x._v, dtype=x.dtype)
    for mark in ("_copy_of_view", "_regen"):
        if mark in x.__dict__:
            setattr(r, mark, x.__dict__[mark])
    return r


def _copied(x, *args, **kwargs):
    """clone and the copying forms: a lazyrt tensor of its own (values are immutable: no data
    is copied)."""
    return _Value(x._v.clone(), dtype=x.dtype)


_SPECIAL = {
    aten._to_copy.default: _to_copy,
    aten.copy.default: _copy, aten._copy_from.default: _copy_from,
    aten._local_scalar_dense.default: _item,
    aten.detach.default: _alias, aten.alias.default: _alias, aten.lift_fresh.default: _alias,
    aten.detach_copy.default: _copied, aten.alias_copy.default: _copied, aten.clone.default: _copied,
    aten.lift_fresh_copy.default: _copied,
    aten.resize_.default: _resize, aten.set_.source_Tensor: _set,
}


def _boxed(name, args, kwargs):
    """The ops that reach the device's C++ kernel (lazyrt._torch_C; `name` is "aten::add.Tensor"):
    factories, and ops on device values while PyTorch has the Python key turned off."""
    op = _OPS.get(name)
    if op is None:
        namespace, _, rest = name.partition("::")
        packet, _, overload = rest.partition(".")
        op = _OPS[name] = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
    flat = tree_leaves((args, kwargs))
    if any(isinstance(a, _Value) for a in flat):
        return _dispatch(op, args, kwargs)
    if op is aten._copy_from.default:
        return _copy_from(*args, **kwargs)
    return _factory(op, *args, **kwargs)


_OPS = {}


def _factory(op, *args, **kwargs):
    """Ops with no device tensor among their arguments but the device as their target
    (factories: empty, zeros, arange, ...), run on the CPU and moved over."""
    targs, tkwargs = tree_map(_torch_arg, (args, kwargs))
    with torch.no_grad():
        out = op(*targs, **tkwargs)
    if torch.Tag.nondeterministic_seeded in op.tags:  # values a replay would repeat
        _HOST.setdefault("drew", set()).add(str(op))
    return tree_map(lambda o: _moved(o) if isinstance(o, torch.Tensor) else o, out)


def _moved(t):
    if t.dtype not in _lower._DTYPES and t.numel() == 0:
        return _Value(_C.full(tuple(t.shape), 0, dtype=_C.int32), dtype=t.dtype)
    return _Value(_cpu_to_lazy(t))


# ---- recurrent cells --------------------------------------------------------------------------
#
# On a device PyTorch's LSTM and GRU layers compute each step with fused cell ops that only
# CUDA implements; here they are written with the ops their math is made of. The workspace a
# forward leaves for the backward is the fused kernels': the LSTM's activated gates (i, f, g,
# o), the GRU's reset and update gates, the candidate, the previous hidden state and the
# hidden side of the candidate's pre-activation.

def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def _lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = grad_cy if grad_cy is not None else torch.zeros_like(cy)
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy * o * (1 - o)
    else:
        grad_o = torch.zeros_like(o)
    grad_gates = torch.cat([grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f), grad_c * i * (1 - g * g), grad_o], 1)
    return grad_gates, grad_c * f, grad_gates.sum(0) if has_bias else None


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


def _gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden = torch.cat([grad_r, grad_z, grad_n * r], 1)
    bias = (grad_input.sum(0), grad_hidden.sum(0)) if has_bias else (None, None)
    return grad_input, grad_hidden, grad_hy * z, *bias


RECURRENT_CELLS = {aten._thnn_fused_lstm_cell.default: _lstm_cell,
              aten._thnn_fused_lstm_cell_backward_impl.default: _lstm_cell_backward,
              aten._thnn_fused_gru_cell.default: _gru_cell,
              aten._thnn_fused_gru_cell_backward.default: _gru_cell_backward}


# ---- Python numbers as graph inputs ------------------------------------------------------------
#
# A number that changes from step to step (Adam's bias corrections, a scheduled learning rate)
# would be a constant of each step's graph, and every step a new graph to compile. As on
# PyTorch/XLA, such numbers enter the graph as data: the ops that scale a float32 or float64
# tensor by a Python float take it as a 0-dim tensor of the tensor's dtype (a graph input, the
# number rounded to that dtype as PyTorch's kernels round it; the result dtype is PyTorch's).

def _number(x):
    return isinstance(x, float) and not isinstance(x, bool)


def _data(x, like):
    return _Value(_C._scalar_data(x, like._v.dtype))


def _floating(t):
    """A float32/float64 device value: its ops round a Python float to its own dtype (half
    types compute with the number in float32, so their numbers stay constants)."""
    return isinstance(t, _Value) and t.dtype in (torch.float32, torch.float64)


def _call(op, *args, **kwargs):
    """op on device values, dispatched here directly (a lift's ops: below autograd, as the
    call that reached the lift is)."""
    return _dispatch(op, args, kwargs)


def _scaled(op):
    """mul/div of a floating tensor by a number: the Tensor overload with the number as data."""
    def lift(t, other, *rest, **kwargs):
        if not (_floating(t) and _number(other)):
            return NotImplemented
        return _call(op, t, _data(other, t), *rest, **kwargs)
    return lift


def _with_alpha(op):
    """add/sub with a number for alpha: b scaled by alpha as data, then the op without it."""
    def lift(a, b, alpha=1):
        if _number(b) and _floating(a):
            return _call(op, a, _data(b * alpha, a))
        if not (_number(alpha) and _floating(a) and _floating(b) and a.dtype == b.dtype):
            return NotImplemented
        return _call(op, a, _call(aten.mul.Tensor, b, _data(alpha, b)))
    return lift


def _addc(inner):
    """addcmul/addcdiv: self + value * t1 (inner) t2, PyTorch's order, with value as data."""
    def lift(s, t1, t2, value=1):
        if not (_number(value) and _floating(s) and s.dtype == t1.dtype == t2.dtype):
            return NotImplemented
        return _call(aten.add.Tensor, s, _call(inner, _call(aten.mul.Tensor, t1, _data(value, t1)), t2))
    return lift


def _lerp(a, b, weight):
    if not (_number(weight) and _floating(a)):
        return NotImplemented
    return _call(aten.lerp.Tensor, a, b, _data(weight, a))


_LIFTS = {
    aten.mul.Scalar: _scaled(aten.mul.Tensor), aten.mul.Tensor: _scaled(aten.mul.Tensor),
    aten.div.Scalar: _scaled(aten.div.Tensor), aten.div.Tensor: _scaled(aten.div.Tensor),
    aten.add.Tensor: _with_alpha(aten.add.Tensor), aten.add.Scalar: _with_alpha(aten.add.Tensor),
    aten.sub.Tensor: _with_alpha(aten.sub.Tensor), aten.sub.Scalar: _with_alpha(aten.sub.Tensor),
    aten.addcmul.default: _addc(aten.mul.Tensor), aten.addcdiv.default: _addc(aten.div.Tensor),
    aten.lerp.Scalar: _lerp,
}


# ---- structured loops ------------------------------------------------------------------------

def _register_loops():
    """torch._higher_order_ops.while_loop called on device tensors becomes one lazyrt
    while_loop node, whose body is the user's body run on device tensors over the loop's traced
    carries: traced and compiled once, whatever the trip count. PyTorch's while_loop checks its
    arguments and then traces the loop with Dynamo, which cannot trace tensors that are not
    PyTorch's own; on device tensors it calls PyTorch's while_loop operator directly instead,
    after the same checks (`_while_loop_call`), and the operator reaches the device below."""
    import importlib
    module = importlib.import_module("torch._higher_order_ops.while_loop")
    while_loop_op = module.while_loop_op

    function = module.while_loop
    if not getattr(function, "_lazyrt", False):
        # Every name for PyTorch's while_loop (torch.while_loop, and those imported before
        # lazyrt.torch) is the same function object: its code is replaced by a call of
        # _while_loop_call, with PyTorch's own code kept as a function of its own.
        pytorch = type(function)(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                                 function.__closure__)
        module.__dict__["_lazyrt_while_loop_call"] = _while_loop_call
        module.__dict__["_lazyrt_pytorch_while_loop"] = pytorch

        def while_loop(cond_fn, body_fn, carried_inputs):
            return _lazyrt_while_loop_call(cond_fn, body_fn, carried_inputs, _lazyrt_pytorch_while_loop)  # noqa: F821
        function.__code__ = while_loop.__code__
        function._lazyrt = True

    @while_loop_op.py_impl(_Value)
    def _while_loop(cond_fn, body_fn, carried_inputs, additional_inputs):
        extra = tuple(additional_inputs)

        def values(outs):
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            return tuple(o._v if isinstance(o, _Value) else o for o in outs)

        def cond(*carry):
            return values(cond_fn(*(_Value(v) for v in carry), *extra))[0]

        def body(*carry):
            return values(body_fn(*(_Value(v) for v in carry), *extra))

        out = lazyrt.while_loop(cond, body, tuple(a._v if isinstance(a, _Value) else a for a in carried_inputs))
        return tuple(_Value(v) if isinstance(v, _C.Tensor) else v for v in out)


def _while_loop_call(cond_fn, body_fn, carried_inputs, pytorch):
    """PyTorch's while_loop(cond_fn, body_fn, carried_inputs): on device tensors its operator,
    called as PyTorch's while_loop calls it (carries flattened), after PyTorch's checks."""
    from torch._higher_order_ops.while_loop import while_loop_op
    from torch.utils import _pytree as pytree
    flat, spec = pytree.tree_flatten((carried_inputs, ()))
    if not any(isinstance(t, _Value) for t in flat):
        return pytorch(cond_fn, body_fn, carried_inputs)
    if not callable(cond_fn) or not callable(body_fn):
        raise RuntimeError("Expect cond_fn and body_fn to be callable.")
    if not all(isinstance(t, (torch.Tensor, torch.SymInt, int)) for t in flat):
        raise RuntimeError(f"Expect carried_inputs to be a tuple of possibly nested dict/list/tuple that only "
                           f"consists of tensor or int leaves, but got {carried_inputs}.")

    def flat_fn(fn):
        def call(*args):
            carried, additional = pytree.tree_unflatten(list(args), spec)
            return fn(*carried, *additional)
        return call
    return while_loop_op(flat_fn(cond_fn), flat_fn(body_fn), tuple(flat), ())


# ---- cached-graph replay ----------------------------------------------------------------------
#
# PyTorch/XLA's low-level calls (torch_xla._XLAC's, which its dynamo bridge makes) over device
# tensors, as lazyrt's own (lazyrt.graph_hash and the rest) over their lazyrt tensors: the
# traced step is what was recorded since the last sync(), and every tensor it updated in place
# (parameters, optimizer state, listed or not) takes its new value on every replay. What the
# step read from the host is guarded: an optimizer that stepped in it keeps its hyperparameters
# (a replay with another learning rate raises), and one that keeps state on the CPU (a
# capturable=False step count, whose bias corrections the graph holds as numbers) is refused.

# For each optimizer stepped since the last sync(): (optimizer, its groups' numbers, the ids of
# the state tensors it had before).
class _Identities:
    """A set of objects by identity, holding none alive (tensors compare by value, so Python's
    sets and weak sets cannot hold them; a bare id() may be reused by a later object)."""

    def __init__(self):
        self._refs = {}

    def add(self, obj):
        self._refs[id(obj)] = weakref.ref(obj, lambda _, i=id(obj): self._refs.pop(i, None))

    def __contains__(self, obj):
        ref = self._refs.get(id(obj))
        return ref is not None and ref() is obj

    def __bool__(self):
        return bool(self._refs)

    def clear(self):
        self._refs.clear()


_STEPPED = []
_WRITTEN = _Identities()  # the lazyrt tensors written in place while _STEPPED is not empty
# What the device did on the host since the last sync(), by kind: "drew" (random factories, from
# PyTorch's generator), "ran" (ops run on the CPU at a graph break), "read" (values read).
_HOST = {}
_GUARDS = {}  # graph hash -> what its step read from optimizers


# ---- modules moved to and from the device ---------------------------------------------------

# Module._apply (behind model.to(device), .double(), ...) gives every parameter of a module a new
# Parameter object when the old one cannot take the new tensor in place (a device tensor, as on
# PyTorch/XLA). Two modules sharing one Parameter (a tied embedding and head) would get a copy
# each, and an optimizer made before the move would keep stepping the old tensors: both silent.
_MOVED = _Identities()  # the parameters and buffers a move left behind
_APPLYING = threading.local()


def _keep_ties_on_moves():
    """Wraps torch.nn.Module._apply once: after a move to or from the device, the positions that
    held one Parameter (or buffer) hold one again, and the tensors left behind are remembered so
    that an optimizer still holding them is refused (`_optimizer_stepped`)."""
    original = torch.nn.Module._apply
    if getattr(original, "_lazyrt_keeps_ties", False):
        return

    @functools.wraps(original)
    def _apply(self, fn, recurse=True):
        if getattr(_APPLYING, "active", False):  # a child's _apply inside the outermost one
            return original(self, fn, recurse)
        modules = list(self.modules()) if recurse else [self]
        before = [(m, table, key, t) for m in modules for table in (m._parameters, m._buffers)
                  for key, t in table.items() if t is not None]
        _APPLYING.active = True
        try:
            result = original(self, fn, recurse)
        finally:
            _APPLYING.active = False
        firsts, retied = {}, set()
        for m, table, key, old in before:
            new = table.get(key)
            if new is None or new is old or not (isinstance(old, _Value) or isinstance(new, _Value)):
                continue
            _MOVED.add(old)
            first = firsts.setdefault(id(old), new)
            if first is not new:
                table[key] = first  # one tensor for every position that shared one before the move
                retied.add(m)
        for m in retied:
            if isinstance(m, torch.nn.RNNBase):
                m._init_flat_weights()  # its list of weights, made in _apply, named the copies
        return result

    _apply._lazyrt_keeps_ties = True
    torch.nn.Module._apply = _apply


def _optimizer_stepped(optimizer, args, kwargs):
    """torch.optim's global pre-step hook: remembers the device's optimizers stepped in this step,
    and refuses an optimizer holding parameters that a move to or from the device left behind."""
    if _MOVED:
        stale = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"] if p in _MOVED]
        if stale:
            raise RuntimeError(
                f"lazyrt.torch: {type(optimizer).__name__}.step(): {len(stale)} of its parameters (shapes "
                f"{stale[:4]}{' ...' if len(stale) > 4 else ''}) belong to a module that has since moved to or "
                f"from the lazyrt device, which gave the module new tensors: stepping these would train nothing "
                f"the module uses. Make the optimizer after moving the model (as on PyTorch/XLA), or give it the "
                f"module's parameters again.")
    for group in optimizer.param_groups:
        if any(isinstance(p, _Value) for p in group["params"]):
            if not any(entry[0] is optimizer for entry in _STEPPED):
                had = {id(t) for state in optimizer.state.values() for t in state.values()}
                _STEPPED.append((optimizer, _numbers(optimizer), had))
            return


def _numbers(optimizer):
    return [{k: v for k, v in group.items() if isinstance(v, (bool, int, float, str)) or v is None}
            for group in optimizer.param_groups]


def _step_read(call):
    """What the traced step read from the host, checked: refuses random values drawn by
    PyTorch's generator and optimizer state a replay could not keep up to date."""
    if "drew" in _HOST:
        raise RuntimeError(
            f"lazyrt.torch.{call}: since the last sync() the traced step drew random values on the host "
            f"({', '.join(sorted(_HOST['drew']))}, PyTorch's generator, as torch.randn(..., device=) does): "
            f"a replay would repeat them. Make them before a sync() and pass them in, or draw them from "
            f"device tensors (torch.randn_like, dropout), which lazyrt's generator draws anew every replay.")
    if "ran" in _HOST:
        raise RuntimeError(
            f"lazyrt.torch.{call}: since the last sync() the traced step ran {', '.join(sorted(_HOST['ran']))} on "
            f"the CPU (no lowering to lazyrt: a graph break), whose results a replay would repeat rather than "
            f"compute: it cannot be replayed. Trace it every step (sync()), or leave those ops out of the step.")
    if "read" in _HOST:
        raise RuntimeError(
            f"lazyrt.torch.{call}: since the last sync() the traced step read device values "
            f"({', '.join(sorted(_HOST['read']))}), which computed part of it and may have steered its Python: "
            f"a replay could not do the same. Read them after the replays, or sync() before the step.")
    for optimizer, _, had in _STEPPED:
        name = type(optimizer).__name__
        for p, state in optimizer.state.items():
            if not isinstance(p, _Value):
                continue
            host = [k for k, v in state.items() if isinstance(v, torch.Tensor) and not isinstance(v, _Value)]
            if host:
                raise RuntimeError(
                    f"lazyrt.torch.{call}: the traced step ran {name}.step(), which keeps "
                    f"{', '.join(repr(k) for k in host)} of the lazyrt device's parameters on the CPU "
                    f"(capturable=False): a replay would reuse the traced step's values of what it computes "
                    f"from them (the bias corrections), so it cannot replay exactly. Create the optimizer "
                    f"with capturable=True, which keeps that state on the device, where replays update it.")
            made = [k for k, v in state.items()
                    if isinstance(v, _Value) and id(v) not in had and v._v not in _WRITTEN]
            if made:
                raise RuntimeError(
                    f"lazyrt.torch.{call}: the traced step is {name}'s first: it made "
                    f"{', '.join(repr(k) for k in made)} from the step's values, where later steps update it "
                    f"in place, so replaying this step would make it afresh every time. Run one step and "
                    f"sync() before the step to trace.")
    return [(weakref.ref(entry[0]), entry[1]) for entry in _STEPPED]


def _values(tensors, call):
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return [_value_of(t)._v for t in tensors]


def _get_graph_hash(tensors):
    """The hash of the graph of these device tensors and of every in-place update since the
    last sync() (torch_xla._XLAC._get_graph_hash); computes nothing."""
    return lazyrt.graph_hash(_values(tensors, "_get_graph_hash"))


def _xla_warm_up_cache(tensors, devices=()):
    """Compiles and caches that graph without running it (torch_xla._XLAC._xla_warm_up_cache).
    Raises for a step that could not be replayed exactly (see `_step_read`)."""
    values = _values(tensors, "_xla_warm_up_cache")
    guards = _step_read("_xla_warm_up_cache")
    lazyrt.warm_up_cache(values)
    _GUARDS[lazyrt.graph_hash(values)] = guards


def _get_tensors_xla_device_data_node(tensors):
    """(tensor ids, device tensors): the graph's inputs in order
    (torch_xla._XLAC._get_tensors_xla_device_data_node). A tensor the step updated in place is
    given as itself, holding its value from before the step."""
    ids, values = lazyrt.graph_inputs(_values(tensors, "_get_tensors_xla_device_data_node"))
    return list(ids), [_Value(v) for v in values]


def _run_cached_graph(graph_hash, inputs):
    """Runs the graph warmed up under graph_hash on inputs (in graph-input order:
    a GraphInputMatcher's call), writing every tensor the step updated in place back, and
    returns the graph's outputs as device tensors (torch_xla._XLAC._run_cached_graph). Raises
    where an optimizer the step ran has changed a hyperparameter since (trace the step again)."""
    for ref, numbers in _GUARDS.get(graph_hash, ()):
        optimizer = ref()
        if optimizer is not None and _numbers(optimizer) != numbers:
            changed = sorted({k for now, then in zip(_numbers(optimizer), numbers) for k in now
                              if now.get(k) != then.get(k)} or {"param_groups"})
            raise RuntimeError(f"lazyrt.torch._run_cached_graph: {type(optimizer).__name__}'s {', '.join(changed)} "
                               f"changed since the step was traced, and the graph holds the traced values; trace "
                               f"the step again (after sync()) for the new ones")
    outs = lazyrt.run_cached_graph(graph_hash, [_value_of(t)._v for t in inputs])
    return [_Value(v) for v in outs]


def _xla_get_tensor_id(t):
    """A device tensor's id, kept by in-place ops (torch_xla._XLAC._xla_get_tensor_id)."""
    return lazyrt.tensor_id(_value_of(t)._v)


# ---- printing --------------------------------------------------------------------------------

def _patch_printing():
    """Device tensors print as PyTorch/XLA's do: their values (computed), then the device."""
    original = torch._tensor_str._str
    if getattr(original, "_lazyrt", False):
        return

    def _str(self, *, tensor_contents=None):
        if self.device.type != NAME or tensor_contents is not None:
            return original(self, tensor_contents=tensor_contents)
        with torch.no_grad():
            text = original(self.detach().cpu())
        extra = f", device='{self.device}'"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return text[:-1] + extra + ")"
    _str._lazyrt = True
    torch._tensor_str._str = _str
