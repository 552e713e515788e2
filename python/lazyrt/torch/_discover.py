"""Discovery: the torch modules and optimizers a step reaches, wherever the program keeps them,
and what that search read, so that a call can check it still holds without searching again.

**Where** (`find`): from the *roots* — the step's arguments (positional and keyword), its bound
self, a ``functools.partial``'s arguments, its closure's cells and the globals its code names —
a walk over what they hold, up to `DEPTH` steps from a root:

- a ``torch.nn.Module`` is found, and the walk goes on through its own attributes (those in its
  ``__dict__`` other than nn.Module's bookkeeping: ``self.opt``, a plain list of other modules);
  its submodules are the module's own business (their tensors are the module's), not walked;
- a ``torch.optim.Optimizer`` is found (its parameters must belong to modules found);
- lists, tuples and dicts: their elements (values, for a dict), where they hold at most
  `MAX_ITEMS`;
- objects with a ``__dict__`` of a class outside torch, NumPy, lazyrt and the standard library
  (a dataclass, a trainer object) and namespaces (``types.SimpleNamespace``,
  ``argparse.Namespace``): their attributes;
- the program's own functions (a helper the step calls): their closure cells and the globals
  their code names; bound methods: their object and function;
- a leaf tensor that requires grad (outside the arguments) is found too (`Reach.free`): a
  parameter of no module, which the step may train by hand (``w -= lr * w.grad``).

Each object is walked once (cycles end there). Library functions, classes, Python modules,
tensors, plain values and library objects (a data loader, a learning-rate scheduler) are not
walked.

**What it read** (`Reach`): every list, dict and ``__dict__`` the walk went through, with the
values it held — by identity, but for values of a plain class (numbers, strings, tensors, ...)
which are recorded by class only (a counter on a module may change; it can hold no module).
`Reach.holds` is true while each still holds the same objects (and values of the same plain
classes) and the positional arguments the walk started from are the same objects: then the
walk would find the same modules and optimizers. The roots themselves (closure cells, named
globals) are the step's guard's to check.

**An optimizer the walk did not find** (`foreign_optimizers`): while a step is captured, the
``step()`` or ``zero_grad()`` of an optimizer that is not among those the capture owns raises
`CaptureError` naming it: its update would not be part of the replay.
"""

import argparse
import contextlib
import functools
import importlib
import inspect
import operator
import sys
import threading
import types

import torch

DEPTH = 3  # steps from a root: trainer.state.nets["G"] is three
MAX_ITEMS = 256  # larger containers (a data set in a list) are not walked

_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__)
_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)
_LIBRARIES = frozenset(("torch", "numpy", "lazyrt", "builtins")) | frozenset(sys.stdlib_module_names)

# Classes whose values are recorded by class only: a value of one can hold nothing discovery finds.
from lazyrt.torch._device import _Value as _DeviceTensor  # noqa: E402  (tensors of the lazyrt device)

_PLAIN = {c: object() for c in (int, float, bool, str, bytes, complex, type(None), torch.Tensor,
                                torch.nn.Parameter, _DeviceTensor, torch.dtype, torch.device, torch.Size,
                                types.BuiltinFunctionType, types.ModuleType, type)}


_is = operator.is_


def _marker(v):
    """What the reach records for a value: its class's marker for a plain one, else the value
    (a tensor that requires grad too: it may be a parameter the step trains, see `find`)."""
    m = _PLAIN.get(v.__class__)
    if m is not None and isinstance(v, torch.Tensor) and v.requires_grad:
        return v
    return v if m is None else m


@functools.lru_cache(maxsize=1024)
def _user_class(cls):
    """Whether objects of cls are walked through their __dict__ (a class of the program's own)."""
    if cls in _NAMESPACES:
        return True
    if issubclass(cls, (torch.nn.Module, torch.optim.Optimizer, type, types.ModuleType, types.FunctionType,
                        types.MethodType, types.BuiltinFunctionType, functools.partial, torch.Tensor)):
        return False
    return (cls.__module__ or "").split(".")[0] not in _LIBRARIES


_EMPTY_CELL = object()


def _cell_values(cells):
    out = []
    for c in cells:
        try:
            out.append(c.cell_contents)
        except ValueError:  # an empty cell
            out.append(_EMPTY_CELL)
    return out


class _NamedGlobals:
    """The globals a function's code names, as a container the reach can read again."""

    __slots__ = ("globals", "names")

    def __init__(self, g, names):
        self.globals, self.names = g, names

    def values(self):
        return [self.globals.get(n, _EMPTY_CELL) for n in self.names]


def _user_function(fn):
    """Whether a Python function is the program's own (walked), not a library's."""
    return (getattr(fn, "__module__", None) or "").split(".")[0] not in _LIBRARIES


class Reach:
    """What `find` read: (argument position, object) for the walked positional arguments, and
    for each list, dict and __dict__ walked (see the module docstring): how to list its values,
    the container, its values then, and their markers (`_marker`). Holds them all, so their
    identities stay unique."""

    __slots__ = ("args", "containers", "free")

    def __init__(self):
        self.args, self.containers = [], []
        self.free = []  # leaf tensors that require grad, found outside modules and arguments

    def __bool__(self):
        return bool(self.args or self.containers)

    def holds(self, args):
        """Whether `find` would read the same now, for a call with positional arguments args."""
        for k, obj in self.args:
            if k >= len(args) or args[k] is not obj:
                return False
        for values, container, exact, was in self.containers:
            now = container if values is None else values(container)
            if len(now) != len(was):
                return False
            if all(map(_is, now, exact)):  # the usual case: nothing rebound (compared in C)
                continue
            for v, r in zip(now, was):
                if v is not r and _marker(v) is not r:
                    return False
        return True

    def add(self, container, values):
        """Records a walked list (values: None) or dict (values: dict.values)."""
        now = container if values is None else values(container)
        self.containers.append((values, container, tuple(now), [_marker(x) for x in now]))


def roots(fn, args=(), kwargs=None):
    """The roots of fn's walk, in order: (argument position or None, value)."""
    for k, a in enumerate(args):
        yield k, a
    for a in (kwargs or {}).values():
        yield None, a
    f = fn
    if inspect.ismethod(f):
        yield None, f.__self__
        f = f.__func__
    if isinstance(f, functools.partial):
        for a in list(f.args) + list(f.keywords.values()):
            yield None, a
        f = f.func
    code = getattr(f, "__code__", None)
    if code is None:
        if not (inspect.isroutine(f) or inspect.isclass(f)) and hasattr(f, "__dict__"):
            yield None, f  # an object called as the step: what its attributes hold
        return
    for cell in getattr(f, "__closure__", None) or ():
        try:
            yield None, cell.cell_contents
        except ValueError:  # an empty cell
            continue
    from lazyrt.torch._step import _code_names
    g = getattr(f, "__globals__", {})
    for name in _code_names(code):
        if name in g:
            yield None, g[name]


def find(fn, args=(), kwargs=None):
    """(modules, optimizers, reach): the modules and optimizers fn reaches from its roots (each
    once, in the order met) and what the walk read (a Reach)."""
    modules, optimizers, reach = [], [], Reach()
    found, walked = set(), set()

    free = reach.free
    free_ids = set()

    def walk(v, depth):
        cls = v.__class__
        if cls in _PLAIN:
            if isinstance(v, torch.Tensor) and v.requires_grad and v.is_leaf and id(v) not in free_ids:
                # A tensor the step may train by hand (w -= lr * w.grad): a parameter of no module.
                free_ids.add(id(v))
                free.append(v)
            return
        if isinstance(v, torch.nn.Module):
            if id(v) not in found:
                found.add(id(v))
                modules.append(v)
            if depth < DEPTH and id(v) not in walked:
                walked.add(id(v))
                d = v.__dict__
                reach.add(d, dict.values)
                for name, x in list(d.items()):
                    if name not in _MODULE_INTERNALS:
                        walk(x, depth + 1)
            return
        if isinstance(v, torch.optim.Optimizer):
            if id(v) not in found:
                found.add(id(v))
                optimizers.append(v)
            return
        if depth >= DEPTH or id(v) in walked:
            return
        if isinstance(v, (list, tuple)):
            if len(v) > MAX_ITEMS:
                return
            walked.add(id(v))
            items = list(v)
            if not isinstance(v, tuple):
                reach.add(v, None)
        elif isinstance(v, dict):
            if len(v) > MAX_ITEMS:
                return
            walked.add(id(v))
            items = list(v.values())
            reach.add(v, dict.values)
        elif cls is types.FunctionType:
            if not _user_function(v):
                return
            # A helper the step calls (a loss function, a forward pass written as a function):
            # what its closure and the globals its code names hold.
            walked.add(id(v))
            items = []
            if v.__closure__:
                reach.add(v.__closure__, _cell_values)
                items += _cell_values(v.__closure__)
            from lazyrt.torch._step import _code_names
            names = tuple(n for n in _code_names(v.__code__) if n in v.__globals__)
            if names:
                named = _NamedGlobals(v.__globals__, names)
                reach.add(named, _NamedGlobals.values)
                items += named.values()
        elif cls is types.MethodType:
            walked.add(id(v))
            items = [v.__self__, v.__func__]
        elif _user_class(cls):
            try:  # the instance's own dict; a class's __getattr__ may answer for a missing one
                d = object.__getattribute__(v, "__dict__")
            except Exception:  # noqa: BLE001 - no __dict__ (__slots__): not walked
                return
            if d.__class__ is not dict or len(d) > MAX_ITEMS:
                return
            walked.add(id(v))
            items = list(d.values())
            reach.add(d, dict.values)
        else:
            return
        for x in items:
            walk(x, depth + 1)

    for k, v in roots(fn, args, kwargs):
        # A tuple, list or dict argument is not held by identity: the signature and the guard
        # compare its structure and its leaves (by identity, shape or value), which is what the
        # walk could find in it (a list the walk went through is recorded as a container).
        if k is not None and v.__class__ not in _PLAIN and not isinstance(v, (tuple, list, dict)):
            reach.args.append((k, v))
        if k is not None and isinstance(v, torch.Tensor):
            continue  # an argument is an input of the step, not a parameter
        walk(v, 0)
    return modules, optimizers, reach


# ---- optimizers the capture does not own -----------------------------------------------------

_local = threading.local()
_lock = threading.Lock()
_installed = [0, None, None]  # captures in flight, the step pre-hook's handle, Optimizer.zero_grad


def _owned():
    stack = getattr(_local, "owned", None)
    return stack[-1] if stack else None


def own(optimizer):
    """An optimizer the step made while being captured (on this thread) is the capture's own:
    its state is made afresh by every call, in eager as in the captured graph."""
    stack = getattr(_local, "owned", None)
    if stack:
        stack[-1].add(id(optimizer))


def _refuse(o, what):
    from lazyrt.torch._capture import CaptureError
    shapes = [list(p.shape) for g in o.param_groups for p in g["params"]][:4]
    raise CaptureError(
        f"lazyrt.torch: the step calls {what}() of a {type(o).__name__} (parameters of shapes {shapes}"
        f"{', ...' if sum(len(g['params']) for g in o.param_groups) > 4 else ''}) that the capture does not own, "
        "so its replays would not run it; lazyrt finds optimizers among the step's arguments, bound self, "
        "closure and named globals and what they hold (attributes, lists, dicts) up to "
        f"{DEPTH} steps deep: pass it as an argument or as compile(..., optimizer=...)")


def _step_pre_hook(o, args, kwargs):
    owned = _owned()
    if owned is not None and id(o) not in owned:
        _refuse(o, "step")


def _zero_grad_of(original):
    @functools.wraps(original)
    def zero_grad(self, *args, **kwargs):
        owned = _owned()
        if owned is not None and id(self) not in owned:
            _refuse(self, "zero_grad")
        return original(self, *args, **kwargs)
    return zero_grad


@contextlib.contextmanager
def foreign_optimizers(optimizers):
    """While the block runs (a step being captured), the step() or zero_grad() of an optimizer
    other than `optimizers` called in this thread raises CaptureError. Other threads are not
    affected."""
    with _lock:
        if _installed[0] == 0:
            hooks = importlib.import_module("torch.optim.optimizer")
            _installed[1] = hooks.register_optimizer_step_pre_hook(_step_pre_hook)
            _installed[2] = torch.optim.Optimizer.zero_grad
            torch.optim.Optimizer.zero_grad = _zero_grad_of(_installed[2])
        _installed[0] += 1
    stack = getattr(_local, "owned", None)
    if stack is None:
        stack = _local.owned = []
    stack.append(set(map(id, optimizers)))
    try:
        yield
    finally:
        stack.pop()
        with _lock:
            _installed[0] -= 1
            if _installed[0] == 0:
                _installed[1].remove()
                torch.optim.Optimizer.zero_grad = _installed[2]
                _installed[1] = _installed[2] = None
