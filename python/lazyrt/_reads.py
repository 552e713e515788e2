"""The Python values a step reads: found by a walk over its code and what that code reaches,
guarded so that a replay never runs on a value that changed since its capture. One walk for
lazyrt's own compiled steps (`lazyrt.compile_step`) and for lazyrt.torch's captures, which
registers what PyTorch's objects are (`register`: its tensors, modules and optimizers).

A replay runs no Python, so every Python value the step's code reads while it is captured (a
global learning rate in ``p.data.add_(p.grad, alpha=-lr)``, a loss weight in a closure,
``args.clip``, ``self.scale`` of a module) is a constant of the capture. `python_reads` lists
them, with the value each holds now, as *reads*: ``(what, kind, holder, key, value, identity)``
where kind is ``"c"`` (a closure cell: holder the cell, key None), ``"g"`` (a globals dict:
holder the dict, key the name) or ``"a"`` (an attribute in an object's own ``__dict__``, a
class's included: holder the object, key the name), value is what the place holds (`ABSENT`
where it holds nothing) and identity says how it is compared: ``False`` by value (a plain
number, string, bool, None or tuple of them: same type and ``==``; a registered dtype class
or a NumPy scalar, see `_by_value`), ``True`` by identity (an object the walk went on
through, a function, a library function such as ``torch.relu``, a class, another object: a
lazyrt tensor, which lazyrt's own replay binds by identity), `META` by its metadata (`meta`):
a registered tensor (a torch tensor), or a tuple, list or dict (of tensors, numbers, other
objects). A torch tensor a step reads from a place is a constant of its capture that is read
from that place (and its path in the tuples, lists and dicts there: `tensors_in`) anew on
every call, as Dynamo reads a global tensor (a mask in a global, a module's state kept in a
plain attribute): so its metadata is what the capture depends on. (lazyrt.torch's world makes
a read of one of the modules' parameters and buffers, or of the step's other parameters,
``True``: those are inputs of their own.) Registered modules and optimizers are discovery's
(`lazyrt.torch._discover`). In lazyrt.torch the values and identities are part of the call's
signature, the metadata part of a capture's acceptance; its C++ guard checks all three. lazyrt's compiled steps check all three in C++ before every
call and trace again where one changed.

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

Not seen: values read through ``getattr`` with a computed name, ``__slots__``, the contents of
lists and dicts of more than `MAX_ITEMS` items (compared by identity) and of containers other
than tuples, lists and dicts, and the globals of library code.
"""

import dis
import functools
import inspect
import sys
import weakref

import numpy as np

ABSENT = object()  # what a read finds where its place holds nothing

META = "meta"  # a read of a tensor: compared by its metadata (see the module docstring)

DEPTH = 3  # attributes and items followed from a root (``args.opt.clip``, ``cfg["clip"]``)
MAX_ITEMS = 256  # larger lists and dicts are read by identity only (a data set in a list)

_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"})
_LIBRARIES = frozenset(getattr(sys, "stdlib_module_names", ())) | {
    "torch", "lazyrt", "numpy", "functorch", "sympy", "typing_extensions", "builtins"}

_PLAIN_VALUES = (int, float, bool, str, type(None))


class _Kinds:
    """What the front ends make of the objects the walk meets (`register`, each adding its own):
    lazyrt's own modules, optimizers and schedulers guard themselves (their tensors are read by
    identity, as any object); lazyrt.torch registers PyTorch's."""
    tensors = ()  # classes read by their metadata (tensor_meta)
    tensor_meta = None  # tensor -> the metadata a capture depends on
    owned = ()  # classes of objects another part guards (modules, optimizers): not read
    modules = ()  # module classes: the walk stops at them along an MRO, and their own attributes
    module_internals = frozenset()  # that are bookkeeping (a fresh module's) are not read
    by_value = ()  # more classes compared by value (a dtype)


def register(tensors=(), tensor_meta=None, owned=(), modules=(), module_internals=(), by_value=()):
    """Adds a front end's kinds of objects (see _Kinds)."""
    _Kinds.tensors += tuple(tensors)
    _Kinds.tensor_meta = tensor_meta or _Kinds.tensor_meta
    _Kinds.owned += tuple(owned)
    _Kinds.modules += tuple(modules)
    _Kinds.module_internals |= frozenset(module_internals)
    _Kinds.by_value += tuple(by_value)


def plain(v):
    """Whether v compares by value without surprises (as _capture._plain)."""
    return v.__class__ in _PLAIN_VALUES or (v.__class__ is tuple and all(x.__class__ in _PLAIN_VALUES for x in v))


def _by_value(v):
    """Whether a read of v compares values: a plain value, a torch.dtype or a NumPy scalar (the
    last two by value in the signature, by identity in the C++ guard: another object of an
    equal value takes the signature, which finds the same capture)."""
    return plain(v) or v.__class__ in _Kinds.by_value or isinstance(v, np.generic)


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
    if isinstance(v, _Kinds.tensors + _Kinds.owned) or inspect.isclass(v) or \
            inspect.isroutine(v) or isinstance(v, functools.partial):
        return False
    return _dict_of(v).__class__ is dict


def _class_attr(cls, name):
    """(the class whose own dict holds name, the value there) along cls's MRO, stopping at
    torch.nn.Module and object (their attributes are the machinery, not the step's values);
    (None, ABSENT) where none does."""
    for klass in cls.__mro__:
        if klass in _Kinds.modules or klass is object:
            break
        d = klass.__dict__
        if name in d:
            return klass, d[name]
    return None, ABSENT


def items_of(v):
    """The (key, item) pairs of an exact tuple, list or dict of at most `MAX_ITEMS` items, in
    order; None for any other value."""
    c = v.__class__
    if c is dict:
        return list(v.items()) if len(v) <= MAX_ITEMS else None
    if c is tuple or c is list:
        return list(enumerate(v)) if len(v) <= MAX_ITEMS else None
    return None


def meta(v, depth=0):
    """What a capture depends on of a value it reads from a place by its metadata (`META`): of
    a tensor, its class, shape, dtype, device and layout (not requires_grad: a capture takes no
    such tensor as a constant, and one that a step trains is the world's, read by identity:
    `inputs_by_identity`); of a tuple, list or
    dict (`items_of`, nested up to `DEPTH`), its class and its items' keys and metadata, in
    order; of a plain value (`_by_value`), the value; of any other object, its identity (whoever
    compares keeps it alive)."""
    if isinstance(v, _Kinds.tensors):
        return ("T",) + _Kinds.tensor_meta(v)
    items = items_of(v) if depth < DEPTH else None
    if items is not None:
        return (v.__class__, tuple((k, meta(x, depth + 1)) for k, x in items))
    if _by_value(v):
        return ("P", v.__class__, v)
    return ("O", id(v))


def tensors_in(v, depth=0, path=()):
    """(path, tensor) of the tensors in v as `meta` sees them: v itself (path ()), or the items
    of its tuples, lists and dicts (a path of keys)."""
    if isinstance(v, _Kinds.tensors):
        yield path, v
        return
    items = items_of(v) if depth < DEPTH else None
    for k, x in items or ():
        yield from tensors_in(x, depth + 1, path + (k,))


def put(kind, holder, key, value, path=()):
    """Puts `value` where read_now(kind, holder, key, path) reads: into the innermost list or
    dict on the path (the tuples below it rebuilt), else at the place itself. Returns the
    function that puts back what was there, unless something else was put there since."""
    chain = [read_now(kind, holder, key)]
    for k in path:
        chain.append(chain[-1][k])
    for depth in range(len(path) - 1, -1, -1):
        container, k = chain[depth], path[depth]
        if container.__class__ is tuple:
            items = list(container)
            items[k] = value
            value = tuple(items)
            continue
        old = container[k]
        container[k] = value

        def undo_item():
            if container[k] is value:
                container[k] = old
        return undo_item
    _put_place(kind, holder, key, value)

    def undo():
        if read_now(kind, holder, key) is value:
            _put_place(kind, holder, key, chain[0])
    return undo


def _put_place(kind, holder, key, value):
    if kind == "c":
        holder.cell_contents = value
    elif kind == "g":
        holder[key] = value
    else:
        d = _dict_of(holder)
        if d.__class__ is dict:
            d[key] = value
        else:
            setattr(holder, key, value)


def read_now(kind, holder, key, path=()):
    """What the place of a read holds now (ABSENT: nothing), or the item at `path` in it (see
    tensors_in)."""
    if kind == "c":
        try:
            v = holder.cell_contents
        except ValueError:
            return ABSENT
    else:
        d = holder if kind == "g" else _dict_of(holder)
        if d is None:
            return ABSENT
        v = d.get(key, ABSENT)
    for k in path:
        c = v.__class__
        if c is dict:
            v = v.get(k, ABSENT)
        elif (c is tuple or c is list) and k < len(v):
            v = v[k]
        else:
            return ABSENT
    return v


def python_reads(fn, modules=()):
    """The reads (see the module docstring) of step fn on the (registered) modules `modules`,
    in a fixed order for a given state."""
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
        if isinstance(obj, _Kinds.modules):
            # Every submodule's flag is guarded already (World.training); its parameters,
            # buffers, children and hooks are nn.Module's bookkeeping (the world's).
            done.update(_Kinds.module_internals)
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
        elif isinstance(v, _Kinds.tensors) or items_of(v) is not None:
            # A tensor, or a tuple, list or dict (cfg["clip"], masks[0]): by its metadata, and
            # the functions and objects among its items walked on.
            read(what, kind, holder, key, v, META)
            walk_items(what, v, depth)
        elif not isinstance(v, _Kinds.owned):
            # A library function (act = torch.relu), a class, a large container, another
            # object: the capture ran what it held, so another object there is another capture.
            read(what, kind, holder, key, v, True)

    def walk_items(what, v, depth):
        for k, x in items_of(v) or ():
            if _user_function(x):
                add_function(f"{what}[{k!r}]", x, True)
            elif depth + 1 < DEPTH and _holder(x):
                add_holder(f"{what}[{k!r}]", x, depth + 2)
            elif depth + 1 < DEPTH:
                walk_items(f"{what}[{k!r}]", x, depth + 1)

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
        # A library module's private attributes other than plain values are its bookkeeping
        # (an LSTM's list of weak references to its weights, made anew when they move).
        library_module = isinstance(obj, _Kinds.modules) and _library(cls.__module__)
        for name in sorted(names - done):
            done.add(name)
            v = d.get(name, ABSENT)
            if v is not ABSENT:
                if not (library_module and name.startswith("_") and not _by_value(v)):
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
    elif _holder(f):  # an object called as the step: its attributes, and what its __call__ reads
        add_holder("the step", f, 1)
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


def inputs_by_identity(reads, tensor_ids):
    """`reads` with each read of a tensor whose id is in `tensor_ids` (a parameter, a buffer: an
    input of the capture in its own right), or of a tuple, list or dict holding one, by identity
    instead of by its metadata."""
    return [r[:5] + (True,) if r[5] is META and any(id(t) in tensor_ids for _, t in tensors_in(r[4])) else r
            for r in reads]


KINDS = {"c": 0, "g": 1, "a": 2}  # a read's place for the C++ checks (reads.h): cell, dict item, attribute


def guard_spec(reads, by_meta=None):
    """The reads as the C++ checks take them (python/src/reads.h): (kind, holder, key, present,
    value, how: 0 by value, 1 by identity, 2 by metadata). by_meta: the places (kind,
    id(holder), key) compared by metadata, if not every `META` read's (the others by identity)."""
    def how(kind, holder, key, identity):
        if by_meta is not None:
            return 2 if (kind, id(holder), key) in by_meta else int(bool(identity))
        return 2 if identity is META else int(bool(identity))
    return [(KINDS[kind], holder, key, value is not ABSENT, value, how(kind, holder, key, identity))
            for _, kind, holder, key, value, identity in reads]


def read_signature(reads):
    """The part of a call's signature that `reads` make: each value read by value, with where it
    was read and its type, and each object read by identity (a function, a library function,
    a class), with where it was read. (The tensors read are a capture's to check: TensorReads.)"""
    return tuple((what, value.__class__, value) if identity is False else (what, "is", Same(value))
                 for what, _, _, _, value, identity in reads if identity is not META)


class Same:
    """An object compared by identity (==, hash), not held alive where it can be referred to
    weakly (a module, an optimizer, a tensor, a function): equal only while it lives, so its id,
    once a later object's, equals nothing; a signature holding it keeps no dropped model alive,
    and says it is dead (`alive`). An object with no weak references is held."""

    __slots__ = ("_get", "_id")

    def __init__(self, obj):
        self._id = id(obj)
        try:
            self._get = weakref.ref(obj)
        except TypeError:
            self._get = lambda: obj

    @property
    def obj(self):
        """The object, or None once it is gone."""
        return self._get()

    @property
    def alive(self):
        return self._get() is not None

    def __eq__(self, other):
        if not isinstance(other, Same) or other._id != self._id:
            return False
        obj = self._get()
        return obj is not None and other._get() is obj

    def __hash__(self):
        return self._id

    def __repr__(self):
        obj = self._get()
        return f"<{type(obj).__name__ if obj is not None else 'dead object'} at {self._id:#x}>"


def all_alive(key):
    """Whether every object a key (nested tuples) holds by identity (Same) is still alive."""
    if isinstance(key, Same):
        return key.alive
    if isinstance(key, tuple):
        return all(all_alive(k) for k in key)
    return True


class TensorReads:
    """The tensors a capture read from places (`META` reads), by the walk's names of their
    places, and their metadata then.

    A capture takes each such tensor (or each tensor in the tuples, lists and dicts there:
    `tensors_in`) as an input of its graph, read from its place on every call, as Dynamo reads
    a global tensor: a mask rebound in a global, or a module's state kept in a plain attribute
    and set by the step itself, is what the next call reads (`named`, `places_of`, `put`,
    `read_now`). The capture holds for a call whose reads (`python_reads` now: the same places,
    or the places of another function of the same code) have the places of the tensors it read,
    each of the metadata it held then (`meta`; `hold`). (A place that holds a tensor now and
    held nothing then, such as an attribute the step sets, was not read by it.)
    """

    def __init__(self, reads):
        self.metas = {}  # name -> (the value then (kept alive: meta holds ids), its metadata)
        for what, (_, _, _, value) in self.named(reads).items():
            self.metas[what] = (value, meta(value))

    @staticmethod
    def named(reads):
        """{name: (kind, holder, key, value)} of the reads of tensors: the walk's name of the
        place (numbered where two places share one)."""
        out = {}
        for what, kind, holder, key, value, identity in reads:
            if identity is META:
                name, n = what, 1
                while name in out:
                    n += 1
                    name = f"{what} #{n}"
                out[name] = (kind, holder, key, value)
        return out

    @classmethod
    def places_of(cls, reads):
        """{name: (kind, holder, key)} of the reads of tensors (see `named`)."""
        return {name: r[:3] for name, r in cls.named(reads).items()}

    def hold(self, reads):
        """Whether the capture holds for a call with these reads (see the class docstring)."""
        now = self.places_of(reads)
        for what, (_, m) in self.metas.items():
            if what not in now or meta(read_now(*now[what])) != m:
                return False
        return True
