"""The Python values a step reads: found by a walk over its code and what that code reaches,
guarded so that a replay never runs on a value that changed since its capture.

A replay runs no Python, so every Python value the step's code reads while it is captured (a
global learning rate in ``p.data.add_(p.grad, alpha=-lr)``, a loss weight in a closure,
``args.clip``, ``self.scale`` of a module) is a constant of the capture. `python_reads` lists
them, with the value each holds now, as *reads*: ``(what, kind, holder, key, value, identity)``
where kind is ``"c"`` (a closure cell: holder the cell, key None), ``"g"`` (a globals dict:
holder the dict, key the name) or ``"a"`` (an attribute in an object's own ``__dict__``, a
class's included: holder the object, key the name), value is what the place holds (`ABSENT`
where it holds nothing) and identity says whether it is compared by identity (an object the walk
went on through: a namespace, a called function) or by value (a plain number, string, bool,
None or tuple of them: same type and ``==``; a ``torch.dtype`` or NumPy scalar, see `_by_value`). The values are part of the call's signature and
quick key and the identities of its quick key; the C++ guard checks both.

What the walk reads, by the bytecode of each function it meets (`code_reads`: the global names
a code object loads or binds, and the attribute names it loads, nested code included):

- the functions: the step (a bound method's function, a partial's function), the user functions
  (code outside torch, lazyrt, NumPy and the standard library) among the values it reaches,
  and the methods, properties and ``forward`` of the classes of the objects it reaches,
  recursively; a user function's closure cells and the globals its code names are read, a
  library method's attribute names only;
- the objects: the step's bound self and a partial's arguments, objects with a ``__dict__``
  among the values read (not tensors, modules, optimizers, classes or library Python modules;
  up to `DEPTH` attributes deep), and every submodule of the modules the step uses: each
  attribute of theirs whose name some walked code loads as an attribute, in the instance's
  ``__dict__`` or, where it has none there, in its class's.

Not seen: values read through ``getattr`` with a computed name, subscripts (``cfg["clip"]``),
``__slots__``, values that are none of plain values, ``torch.dtype``, NumPy scalars and objects
with a ``__dict__`` (a list's contents), and the globals of library code.
"""

import dis
import functools
import inspect
import sys

import numpy as np
import torch

ABSENT = object()  # what a read finds where its place holds nothing

DEPTH = 3  # attributes followed from a root (``args.opt.clip``)

_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"})
_LIBRARIES = frozenset(getattr(sys, "stdlib_module_names", ())) | {
    "torch", "lazyrt", "numpy", "functorch", "sympy", "typing_extensions", "builtins"}

_PLAIN_VALUES = (int, float, bool, str, type(None))


def plain(v):
    """Whether v compares by value without surprises (as _capture._plain)."""
    return v.__class__ in _PLAIN_VALUES or (v.__class__ is tuple and all(x.__class__ in _PLAIN_VALUES for x in v))


def _by_value(v):
    """Whether a read of v compares values: a plain value, a torch.dtype or a NumPy scalar (the
    last two by value in the signature and the quick key, by identity in the C++ guard: another
    object of an equal value takes the Python path, which finds the same capture)."""
    return plain(v) or v.__class__ is torch.dtype or isinstance(v, np.generic)


@functools.lru_cache(maxsize=1024)
def code_reads(code):
    """(global names, attribute names) a code object and the code nested in it load (globals:
    also bind), each sorted."""
    globs, attrs = set(), set()
    for ins in dis.get_instructions(code):
        if ins.opname in _GLOBAL_OPS:
            globs.add(ins.argval)
        elif ins.opname in _ATTR_OPS:
            attrs.add(ins.argval)
    for const in code.co_consts:
        if inspect.iscode(const):
            g, a = code_reads(const)
            globs.update(g)
            attrs.update(a)
    return tuple(sorted(globs)), tuple(sorted(attrs))


def _library(module_name):
    return (module_name or "").partition(".")[0] in _LIBRARIES


def _user_function(f):
    return inspect.isfunction(f) and not _library(f.__globals__.get("__name__"))


def _dict_of(obj):
    """obj's own attribute dict (a class's mapping proxy), or None."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__ (slots, builtins)
        return None
    return d


def _holder(v):
    """Whether the walk goes on through v's attributes."""
    if inspect.ismodule(v):
        return not _library(v.__name__)
    if isinstance(v, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)) or inspect.isclass(v) or \
            inspect.isroutine(v) or isinstance(v, functools.partial):
        return False
    return _dict_of(v).__class__ is dict


def _class_attr(cls, name):
    """(the class whose own dict holds name, the value there) along cls's MRO, stopping at
    torch.nn.Module and object (their attributes are the machinery, not the step's values);
    (None, ABSENT) where none does."""
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object:
            break
        d = klass.__dict__
        if name in d:
            return klass, d[name]
    return None, ABSENT


def read_now(kind, holder, key):
    """What the place of a read holds now (ABSENT: nothing)."""
    if kind == "c":
        try:
            return holder.cell_contents
        except ValueError:
            return ABSENT
    d = holder if kind == "g" else _dict_of(holder)
    if d is None:
        return ABSENT
    return d.get(key, ABSENT)


def python_reads(fn, modules=()):
    """The reads (see the module docstring) of step fn on the torch modules `modules`, in a
    fixed order for a given state."""
    reads, seen_reads = [], set()
    holders, seen_holders = [], set()
    functions, seen_functions = [], set()
    names = set()  # attribute names the walked code loads

    def read(what, kind, holder, key, value, identity):
        k = (kind, id(holder), key)
        if k not in seen_reads:
            seen_reads.add(k)
            reads.append((what, kind, holder, key, value, identity))

    def add_function(what, f, full):
        if (id(f), full) not in seen_functions:
            seen_functions.add((id(f), full))
            functions.append((what, f, full))

    def add_holder(what, obj, depth):
        if id(obj) in seen_holders:
            return
        seen_holders.add(id(obj))
        d = _dict_of(obj)
        if d.__class__ is not dict:  # a bound self with __slots__
            return
        done = set()
        if isinstance(obj, torch.nn.Module):
            done.add("training")  # every submodule's flag is guarded already (World.training)
        holders.append((what, obj, depth, done))
        if not inspect.ismodule(obj):
            cls = type(obj)
            for special in ("forward", "__call__"):  # what calling the object runs
                _, f = _class_attr(cls, special)
                if f is not ABSENT:
                    walk_class_function(f"{what}.{special}", cls, f)

    def found(what, kind, holder, key, v, depth):
        if v is ABSENT:
            return
        try:
            v.__class__
        except Exception:  # noqa: BLE001 - a value that cannot be looked at (a dead weakref proxy)
            return
        if _by_value(v):
            read(what, kind, holder, key, v, False)
        elif _user_function(v):
            read(what, kind, holder, key, v, True)
            add_function(what, v, True)
        elif depth < DEPTH and _holder(v):
            read(what, kind, holder, key, v, True)
            add_holder(what, v, depth + 1)

    def walk_function(what, f, full):
        code = getattr(f, "__code__", None)
        if code is None:
            return
        global_names, attr_names = code_reads(code)
        names.update(attr_names)
        if not full:
            return
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            found(f"closure variable '{name}' of {what}", "c", cell, None, v, 0)
        g = f.__globals__
        for name in global_names:
            found(f"global '{name}' of {what}", "g", g, name, g.get(name, ABSENT), 0)

    def walk_class_function(what, owner, f):
        if isinstance(f, (staticmethod, classmethod)):
            f = f.__func__
        if isinstance(f, property):
            f = f.fget
        if inspect.isfunction(f):
            add_function(what, f, _user_function(f))

    def walk_holder(h):
        what, obj, depth, done = h
        d = _dict_of(obj)
        pymodule = inspect.ismodule(obj)
        cls = type(obj)
        for name in sorted(names - done):
            done.add(name)
            v = d.get(name, ABSENT)
            if v is not ABSENT:
                found(f"{what}.{name}", "a", obj, name, v, depth)
                continue
            if pymodule:
                continue
            try:
                if not hasattr(cls, name):  # (through the type's attribute cache: most names)
                    continue
            except Exception:  # noqa: BLE001 - a metaclass's __getattr__
                continue
            klass, a = _class_attr(cls, name)
            if klass is None:
                continue
            if _by_value(a):  # the class's value, while the instance has none of its own
                read(f"{what}.{name}", "a", obj, name, ABSENT, False)
                read(f"{klass.__name__}.{name}", "a", klass, name, a, False)
            else:
                walk_class_function(f"{what}.{name}", cls, a)

    f = fn
    if inspect.ismethod(f):
        add_holder("the step's self", f.__self__, 1)
        f = f.__func__
    if isinstance(f, functools.partial):
        for k, v in enumerate(list(f.args) + list(f.keywords.values())):
            if _holder(v):
                add_holder(f"argument {k} of the step's partial", v, 1)
        f = f.func
    if inspect.isfunction(f):
        add_function("the step", f, True)
    for mi, m in enumerate(modules):
        for name, sub in m.named_modules():
            add_holder(f"model {mi}" + (f".{name}" if name else ""), sub, 1)

    done_functions = 0
    while True:
        while done_functions < len(functions):
            walk_function(*functions[done_functions])
            done_functions += 1
        pending = [h for h in holders if not h[3] >= names]
        if not pending:
            return reads
        for h in pending:
            walk_holder(h)
