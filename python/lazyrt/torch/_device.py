"""The lazyrt device: torch tensors whose values are lazyrt tensors, as on PyTorch/XLA's device.

``torch.device("lazyrt")`` is PyTorch's PrivateUse1 device type, renamed (its device guard and
hooks are registered in C++ by lazyrt._torch_C). A tensor on it is two tensors:

* the one the user holds: PyTorch's functionalization wrapper (``torch._to_functional_tensor``).
  PyTorch's own functionalization turns every in-place op and view on it into functional ops and
  keeps views and their bases in step (a write through ``y[0]`` shows in ``y``), and PyTorch's
  own autograd records on it: ``backward()``, hooks and ``torch.optim`` work as on any device;
* under it, a `_Value`: a tensor subclass holding one lazyrt tensor (``_v``), whose
  ``__torch_dispatch__`` receives the functional aten ops and records each as lazyrt ops through
  the lowering table every captured step uses (``_lower.LOWERINGS``, with PyTorch's answer for
  the result's shape and dtype from its meta kernel, computed once per op and argument types).

Nothing runs until a value is read (``.cpu()``, ``.item()``, printing) or `sync()` cuts the
graph: every live device tensor's pending value is computed as one lazyrt graph, compiled once
per graph hash and cached. Factories (``torch.zeros(..., device="lazyrt")``) reach the device
through its C++ kernel (lazyrt._torch_C), which hands them to `_boxed`. An op without a lowering computes its inputs, runs on the CPU
in PyTorch and comes back as a device tensor: counted as ``GraphBreak`` in `lazyrt.metrics` and
warned once per op with `GraphBreakWarning`. Tensors on the device report contiguous strides, as
PyTorch/XLA's do.
"""

import functools
import itertools
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
_LIVE = weakref.WeakSet()  # every _Value alive: sync() computes the pending ones
_SEQ = itertools.count()  # _Value._seq: the order values were made in
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
        from lazyrt import _torch_C
        _torch_C.set_device_dispatcher(_boxed)
        _patch_printing()
        _register_loops()
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
    lazyrt graph: PyTorch/XLA's ``mark_step()``. Compiled once per graph hash and cached."""
    if tensors is None:  # in the order they were made: the same step gives the same graph
        values = sorted(list(_LIVE), key=lambda t: t._seq)
    else:
        values = [_value_of(t) for t in tensors]
    pending = [t._v for t in values if t._v.is_pending]
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
    """A lazyrt tensor with PyTorch's tensor metadata: the value under a device tensor's
    functionalization wrapper. Its aten ops go to `_dispatch`."""

    @staticmethod
    def __new__(cls, v, dtype=None):
        # dtype: for an empty tensor of a dtype lazyrt has not (batch norm's uint8 reserve)
        r = torch.Tensor._make_wrapper_subclass(cls, tuple(v.shape), dtype=dtype or _lower._TORCH_DTYPES[v.dtype],
                                                device=_DEVICE[0])
        r._v = v
        r._seq = next(_SEQ)
        _LIVE.add(r)
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"lazyrt value {list(self.shape)} {self.dtype}"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


_DEVICE = [None]


def _wrap(v):
    """A device tensor (the functional wrapper the user holds) over lazyrt tensor v."""
    return torch._to_functional_tensor(_Value(v))


def _value_of(t):
    """The _Value under device tensor t."""
    if isinstance(t, _Value):
        return t
    if not isinstance(t, torch.Tensor) or t.device.type != NAME:
        raise TypeError(f"lazyrt.torch: expected a tensor on the lazyrt device, got "
                        f"{type(t).__name__}{' on ' + str(t.device) if isinstance(t, torch.Tensor) else ''}")
    torch._sync(t)
    return torch._from_functional_tensor(t)


def from_device(t):
    """The lazyrt tensor holding device tensor t's value (no copy, nothing computed)."""
    return _value_of(t)._v


def to_device(v):
    """A device tensor whose value is lazyrt tensor v (no copy, nothing computed)."""
    _ensure()
    return _wrap(v)


def _cpu_to_lazy(t):
    """A lazyrt tensor with the values of CPU tensor t, copied (the caller may change t later)."""
    _lower.lazy_dtype(t.dtype, "a tensor on the lazyrt device")
    return lazyrt.from_torch(t.detach().clone(memory_format=torch.contiguous_format))


def _to_cpu(v):
    """CPU tensor with lazyrt tensor v's values (computing v), owning its memory."""
    return lazyrt.to_torch(v).clone()


# ---- dispatch --------------------------------------------------------------------------------

def _dispatch(func, args, kwargs):
    special = _SPECIAL.get(func)
    if special is not None:
        return special(*args, **kwargs)
    if func in _INDEXING and isinstance(args[1], (list, tuple)):  # CPU indices, as PyTorch takes them
        args = (args[0], [_Value(_cpu_to_lazy(i)) if isinstance(i, torch.Tensor) and not isinstance(i, _Value)
                          else i for i in args[1]], *args[2:])
    lift = _LIFTS.get(func)
    if lift is not None:
        lifted = lift(*args, **kwargs)
        if lifted is not NotImplemented:
            return lifted
    kind = _KINDS.get(func)
    if kind is None:
        kind = _KINDS[func] = ("foreach" if func.__name__.startswith("_foreach_") else
                               "in_place" if func._schema.is_mutable and func._schema.name.endswith("_")
                               and _functional_of(func) is func else "op")
    if kind == "foreach":
        return _foreach(func, args, kwargs)
    if kind == "in_place":
        return _in_place(func, args, kwargs)
    op = _functional_of(func)
    plan = _plan(op, args, kwargs)
    if plan is None:
        decomposition = _decomposition(op)
        if decomposition is not None:
            return decomposition(*args, **kwargs)
        return _on_cpu(func, args, kwargs)
    node, e = plan
    largs, lkwargs = tree_map(_lazy_arg, (args, kwargs))
    lkwargs.pop("device", None)
    try:
        result = LOWERINGS[op](e, *largs, **lkwargs)
    except UnsupportedOperatorError:
        return _on_cpu(func, args, kwargs)
    return _results(node, e, result)


_KINDS = {}  # op -> "foreach", "in_place" or "op"


# Ops whose index tensors may be on the CPU while the indexed tensor is on a device.
_INDEXING = {aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten._unsafe_index_put.default,
             aten.index_put_.default, aten._index_put_impl_.default}


def _in_place(func, args, kwargs):
    """An in-place op on a device value (a decomposition's, below functionalization): its
    functional twin computes the value the first argument takes."""
    packet = getattr(aten, func._schema.name.split("::")[1][:-1], None)
    functional = getattr(packet, func._overloadname, None) if packet is not None else None
    returns = func._schema.returns
    if (functional is None or len(returns) != 1 or returns[0].alias_info is None
            or _plan(_functional_of(functional), args, kwargs) is None and _decomposition(functional) is None):
        return _on_cpu(func, args, kwargs)  # (a fused optimizer step: its lists written back)
    out = _dispatch(functional, args, kwargs)
    target = args[0]
    target._v = _lower._cast(_value_of(out)._v if _is_wrapper(out) else out._v, _lower.lazy_dtype(target.dtype))
    return target


@functools.lru_cache(maxsize=None)
def _decomposition(op):
    """PyTorch's decomposition of op (the capture's choices first; an op PyTorch composes of
    others, such as aten.to or flatten, which decompositions call), or None."""
    from lazyrt.torch import _capture
    from torch._decomp import decomposition_table
    found = _RECURRENT.get(op) or _capture._decompositions().get(op) or decomposition_table.get(op)
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
    if isinstance(a, torch.Tensor):
        if a.device.type == "cpu" and a.dim() == 0:
            return _cpu_to_lazy(a)  # a CPU scalar mixes with any device's tensors, as in PyTorch
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{NAME}:0 and {a.device}")
    return a


def _meta(a):
    if isinstance(a, torch.Tensor):
        return torch.empty(a.shape, dtype=a.dtype, device="meta")
    return a


def _key(a):
    """The part of an argument that PyTorch's answer for the result depends on."""
    if type(a) is _Value:
        return (a.dtype, a.shape)
    if isinstance(a, torch.Tensor):
        return (a.dtype, tuple(a.shape), a.device.type)
    if isinstance(a, float):
        return float
    if isinstance(a, (list, tuple)):
        return (type(a), tuple(_key(x) for x in a))
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
        key = (op, _key(args), _key(kwargs))
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
    if name not in _lower._WARNED_BREAKS:
        _lower._WARNED_BREAKS.add(name)
        warnings.warn(f"lazyrt.torch: graph break: {name} has no lowering to lazyrt; on the lazyrt device it runs "
                      f"in PyTorch on the CPU, after its inputs are computed", GraphBreakWarning, stacklevel=4)
    _C._metrics._increment("GraphBreak", 1)
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
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(given, _Value):
                given._v = lazyrt.from_torch(copied.contiguous())
                if out is copied:
                    return given
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
    packet = aten.linalg_vector_norm if name == "norm" else getattr(aten, name)
    n = len(next(a for a in args if isinstance(a, (list, tuple))))
    outs = []
    for i in range(n):
        item = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
        kw = kwargs
        if name in ("addcmul", "addcdiv") and len(item) > 3:  # the scalar (or scalars) is `value`
            value = item.pop(3)
            kw = dict(kwargs, value=value.tolist()[i] if isinstance(value, torch.Tensor) else value)
        outs.append(packet(*item, **kw))
    return outs


# Ops with the device's own meaning.

def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    target = torch.device(device) if device is not None else None
    if target is not None and target.type != NAME:
        t = _to_cpu(x._v)
        return t.to(device=target, dtype=dtype or t.dtype)
    v = x._v
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
    on the device): dst, a device value, takes src's values."""
    if isinstance(dst, _Value):
        dst._v = _copy(dst, _value_of(src) if _is_wrapper(src) else src)._v
        return dst
    if _is_wrapper(dst):  # functionalization is off: the wrapper's value is replaced, as copy_ would
        torch._functionalize_replace(dst, _copy(_value_of(dst), _value_of(src) if _is_wrapper(src) else src))
        torch._functionalize_commit_update(dst)
        return dst
    dst.copy_(_to_cpu(src._v) if isinstance(src, _Value) else src)  # to the CPU
    return dst


def _item(x):
    return lazyrt.to_torch(x._v).item()


def _same(x, *args, **kwargs):
    return _Value(x._v)


_SPECIAL = {
    aten._to_copy.default: _to_copy,
    aten.copy.default: _copy, aten._copy_from.default: _copy_from,
    aten._local_scalar_dense.default: _item,
    aten.detach.default: _same, aten.detach_copy.default: _same, aten.alias.default: _same,
    aten.alias_copy.default: _same, aten.clone.default: _same, aten.lift_fresh.default: _same,
    aten.lift_fresh_copy.default: _same,
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
    if any(_is_wrapper(a) for a in flat):  # functionalization is off: the op sees the values, the user wrappers
        args, kwargs = tree_map(lambda a: _value_of(a) if _is_wrapper(a) else a, (args, kwargs))
        return tree_map(lambda o: torch._to_functional_tensor(o) if isinstance(o, _Value) else o,
                        _dispatch(op, args, kwargs))
    return _factory(op, *args, **kwargs)


def _is_wrapper(a):
    return isinstance(a, torch.Tensor) and not isinstance(a, _Value) and a.device.type == NAME


_OPS = {}


def _factory(op, *args, **kwargs):
    """Ops with no device tensor among their arguments but the device as their target
    (factories: empty, zeros, arange, ...), run on the CPU and moved over; wrapped for the user
    unless functionalization called them (it wraps their results itself)."""
    targs, tkwargs = tree_map(_torch_arg, (args, kwargs))
    with torch.no_grad():
        out = op(*targs, **tkwargs)
    # Functionalization calls factories with its own key off (and wraps their results); torch.tensor
    # calls them with every key above the backend off, the Python key too (and returns the result).
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    wrap = not excluded(torch._C.DispatchKey.Functionalize) or excluded(torch._C.DispatchKey.Python)
    return tree_map(lambda o: _moved(o, wrap) if isinstance(o, torch.Tensor) else o, out)


def _moved(t, wrap):
    if t.dtype not in _lower._DTYPES and t.numel() == 0:
        value = _Value(_C.full(tuple(t.shape), 0, dtype=_C.int32), dtype=t.dtype)
    else:
        value = _Value(_cpu_to_lazy(t))
    return torch._to_functional_tensor(value) if wrap else value


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


_RECURRENT = {aten._thnn_fused_lstm_cell.default: _lstm_cell,
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
    return _Value(lazyrt.from_torch(torch.tensor(x, dtype=like.dtype)))


def _floating(t):
    """A float32/float64 device value: its ops round a Python float to its own dtype (half
    types compute with the number in float32, so their numbers stay constants)."""
    return isinstance(t, _Value) and t.dtype in (torch.float32, torch.float64)


def _scaled(op):
    """mul/div of a floating tensor by a number: the Tensor overload with the number as data."""
    def lift(t, other, *rest, **kwargs):
        if not (_floating(t) and _number(other)):
            return NotImplemented
        return op(t, _data(other, t), *rest, **kwargs)
    return lift


def _with_alpha(op):
    """add/sub with a number for alpha: b scaled by alpha as data, then the op without it."""
    def lift(a, b, alpha=1):
        if _number(b) and _floating(a):
            return op(a, _data(b * alpha, a))
        if not (_number(alpha) and _floating(a) and _floating(b) and a.dtype == b.dtype):
            return NotImplemented
        return op(a, aten.mul.Tensor(b, _data(alpha, b)))
    return lift


def _addc(inner):
    """addcmul/addcdiv: self + value * t1 (inner) t2, PyTorch's order, with value as data."""
    def lift(s, t1, t2, value=1):
        if not (_number(value) and _floating(s) and s.dtype == t1.dtype == t2.dtype):
            return NotImplemented
        return aten.add.Tensor(s, inner(aten.mul.Tensor(t1, _data(value, t1)), t2))
    return lift


def _lerp(a, b, weight):
    if not (_number(weight) and _floating(a)):
        return NotImplemented
    return aten.lerp.Tensor(a, b, _data(weight, a))


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
    """torch._higher_order_ops.while_loop called on device tensors: after PyTorch's own checks
    (it traces the body with Dynamo) and functionalization, the loop reaches the device's values
    and becomes one lazyrt while_loop node, whose body is the user's body run on device tensors
    over the loop's traced carries: traced and compiled once, whatever the trip count."""
    from torch._higher_order_ops.while_loop import while_loop_op

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
