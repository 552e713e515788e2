"""`lazyrt.torch.compile`: the compiled step — guards, the cache of captures, running a capture
through ``lazyrt.compile_step`` and writing the results back into the user's torch tensors."""

import functools
import inspect
import math
import warnings
from typing import NamedTuple, Optional

import torch

import lazyrt
from lazyrt.torch import _optim, distributed as _distributed
from lazyrt.torch._capture import CaptureError, EagerOnly, World, _plain, call_leaves, capture, key_object
from lazyrt._reads import DEPTH as _READS_DEPTH, MAX_ITEMS as _READS_MAX_ITEMS, \
    KINDS as _READ_KINDS, META as _META, TensorReads, all_alive, code_reads, guard_spec, \
    inputs_by_identity, python_reads
from lazyrt import _C, _torch_C
from lazyrt.torch._lower import GraphBreakWarning, LoweredGraph, _computed
from lazyrt.torch import _device, _discover

# dtypes whose write-backs travel packed in one flat output per dtype.
_PACKABLE = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


# The typed call plan of a capture (made once, at capture; run by _torch_C.Call).
_Source, _Target, _How, _Leaf = _torch_C.Source, _torch_C.Target, _torch_C.How, _torch_C.Leaf


class Value(NamedTuple):
    """Where a value comes from after a call: an input slot as it was before the call (output
    False), or a root of the lowered graph (output True)."""
    output: bool
    index: int


class Write(NamedTuple):
    """A write-back after the call: target (_torch_C.Target) SLOT (key: the slot), GRAD (key: the
    parameter's index) or STATE (key: (optimizer index, parameter index, state key)); how
    (_torch_C.How) UPDATE (into the tensor there, else a new one), NEW, CLEAR (a gradient set to
    None) or CONST (a plain state value, `constant`)."""
    target: object
    key: object
    how: object
    value: Optional[Value] = None
    constant: object = None


class Result(NamedTuple):
    """A result leaf: kind (_torch_C.Leaf) CONST (`constant`), INPUT (the input slot `value.index`
    as it is after the call), OUTPUT (root `value.index`'s value: the torch view of its output
    where nothing else reads that output, else a copy) or DEVICE (a lazyrt device tensor of
    `value`)."""
    kind: object
    value: Optional[Value] = None
    constant: object = None


def _source(node, placeholder_index, roots):
    """Where a graph value comes from after a call (see Value)."""
    if node.op == "placeholder":
        return Value(False, placeholder_index[node])
    roots.append(node)
    return Value(True, len(roots) - 1)


def _device_result(v):
    """A result on the lazyrt device: a device tensor of its own with the values of v (a lazyrt
    output, or a torch view of one)."""
    return _device.to_device(v.clone() if isinstance(v, lazyrt.Tensor) else lazyrt.from_torch(v.clone()))


class _Entry:
    """One capture: its lowered graph (compiled by lazyrt.compile_step on first use, piece by
    piece where it has graph breaks), the world it is valid for beyond its signature, and its
    call plan (write-backs and results), which a _torch_C.Call runs."""

    def __init__(self, captured):
        c = captured
        gm = c.graph_module
        self.slots = c.slots
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(c.slots):
            raise CaptureError(f"lazyrt.torch: the captured graph has {len(placeholders)} inputs, "
                               f"expected {len(c.slots)}")
        placeholder_index = {n: k for k, n in enumerate(placeholders)}
        output_node = next(n for n in gm.graph.nodes if n.op == "output")
        outputs = list(output_node.args[0])
        roots = []

        # Inputs changed in place: aten.copy_(placeholder, value) after functionalization.
        copies = {}
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is torch.ops.aten.copy_.default:
                dst = n.args[0]
                if not (isinstance(dst, torch.fx.Node) and dst.op == "placeholder"):
                    raise CaptureError("lazyrt.torch: the step changes a tensor in place that is none of the "
                                       "arguments, parameters, buffers, gradients or optimizer state (a tensor "
                                       "from a closure or a global?); register it as a buffer of the model")
                copies[placeholder_index[dst]] = n.args[1]
        # The write-backs, in order: inputs changed in place, gradients, optimizer state.
        writes = []
        for s, value in copies.items():
            if c.slots[s].kind in ("arg", "param", "buffer", "read"):
                writes.append(Write(_Target.SLOT, s, _How.UPDATE, _source(value, placeholder_index, roots)))
            elif c.slots[s].kind == "lr":
                raise CaptureError("lazyrt.torch: the step changes a learning rate in place")

        self.result_spec = c.result_spec
        results = [_source(outputs[v[1]], placeholder_index, roots) if v[0] == "T" else v for v in c.result]
        # Results on the lazyrt device (a step of device tensors) are returned there.
        on_device = [v[0] == "T" and _on_device(outputs[v[1]]) for v in c.result]

        def final(target, key, kind_entry, own_slot):
            """The write of a final value (("T", output, whether it is the tensor of own_slot)),
            or None where the step left it as it was."""
            _, k, own = kind_entry
            src = _source(outputs[k], placeholder_index, roots)
            if own and src == Value(False, own_slot):
                return None
            return Write(target, key, _How.UPDATE if own else _How.NEW, src)

        for i, g in c.grads.items():
            writes.append(Write(_Target.GRAD, i, _How.CLEAR) if g[0] == "N" else
                          final(_Target.GRAD, i, g, c.grad_slot.get(i)))
        for (oi, i), d in c.states.items():
            for k, v in d.items():
                slot = c.state_in.get((oi, i), {}).get(k)
                writes.append(Write(_Target.STATE, (oi, i, k), _How.CONST, constant=v[1]) if v[0] == "C" else
                              final(_Target.STATE, (oi, i, k), v, slot if isinstance(slot, int) else None))
        writes = [w for w in writes if w is not None]
        if not roots:
            raise CaptureError("lazyrt.torch: the step computes nothing lazyrt could run")
        self.lowered = LoweredGraph(gm, roots, graph_breaks=True)
        # Whether the step communicates (lazyrt.torch.distributed): the ranks start it from rank
        # 0's weights.
        self.collectives = any(n.op == "call_function" and n.target in _distributed.COLLECTIVE_OPS
                               for n in self.lowered.nodes)
        self._roots = len(roots)
        self._slot_refs = [(slot.kind, slot.ref) for slot in c.slots]
        self._grad_slot = dict(c.grad_slot)
        self._state_slot = {key: dict(d) for key, d in c.state_in.items()}
        self._plan_writes(writes, placeholders, roots)
        self._plan_calls(results, roots)
        self._results = self._plan_results(results, on_device, c.result)
        # The hand-over of the inputs to the compiled step (views kept from call to call, memory
        # lent to the step's in-place updates, version counters bumped after it).
        self._handover = _torch_C.Handover(len(c.slots) + len(self.lowered.constants), self._inplace_slots,
                                           _AliasedMemory)
        self._plan = None  # the _torch_C.Plan, made on the first call (side_attrs are set by then)
        self._ran = False

        self.exact_grads = c.exact_grads
        self.exact_states = c.exact_states
        self.grad_none_ok = c.grad_none_ok
        self.state_empty_ok = c.state_empty_ok
        self.state_keys = set(c.state_in)
        self._state_creates = None  # (optimizer, group, param index) of state_keys, in order
        self.side_attrs = ()  # (module, attribute name) the step sets to tensors, in result order
        self.tensor_reads = TensorReads(())  # see keep_reads

    def accepts(self, facts):
        """Whether this capture is right for a world of these facts (World.facts; the world has
        this capture's signature): the missing gradients and state it captured as missing are
        still missing, and those it captured through a stand-in are missing only where the
        stand-in was checked, and the tensors it read from places are still of their metadata
        (keep_reads)."""
        if not self.tensor_reads.hold(facts.reads):
            return False
        for i, (_, _, kind) in enumerate(facts.params):
            if i in self.exact_grads:
                if kind != "none_canonical":
                    return False
            elif kind == "none_canonical" and i not in self.grad_none_ok:
                return False
        for oi, (_, _, _, states) in enumerate(facts.optimizers):
            for _, i, kind, _ in states:
                if (oi, i) in self.exact_states:
                    if kind != "empty_canonical":
                        return False
                elif kind == "empty_canonical" and (oi, i) not in self.state_empty_ok:
                    return False
        return True

    def run(self, world, call=None):
        """The call of `world` (its args_leaves set), run by `call` (this capture's Call in
        `world`; made here if None), after making what the capture stands in for: the
        optimizer's initial state where missing, and zeros for missing gradients."""
        # Missing state this capture stands in for: create the optimizer's initial state now (the
        # step updates it in place, as eager's first step creates and updates it).
        created = []
        if self._state_creates is None:
            self._state_creates = [(oi, gi, i) for oi in range(len(world.optimizers))
                                   for gi, i in world.opt_params[oi] if (oi, i) in self.state_keys]
        for oi, gi, i in self._state_creates:
            if not world.state_of(oi, i):
                o = world.optimizers[oi]
                o.state[world.params[i]] = _optim.initial_state(o, o.param_groups[gi], world.params[i])
                created.append((o, world.params[i]))
        try:
            self._stand_in(world)
            if call is None:
                call = self.call(world, None)
            result = call.run(tuple(world.args_leaves))
        except BaseException:
            for o, p in created:  # a step that did not run leaves no state behind
                o.state.pop(p, None)
            raise
        if self._packed is not None:
            call.set_step(self._packed)  # (compiled by the first call)
        if not self._ran:
            # The first call's capture, compile and copies are freed: hand their memory back.
            self._ran = True
            _C._debug.release_free_heap()
        return result

    @property
    def traces(self):
        return self.lowered.traces if self._packed is None else self._packed.traces

    def call(self, world, guard):
        """This capture's _torch_C.Call in `world`: guarded by `guard` (whose facts are world's;
        None: only run() by Python, which found this capture)."""
        if self._plan is None:
            self._plan = _torch_C.Plan({
                "writes": self._items, "results": self._results, "roots": self._roots, "direct": self._direct,
                "groups": self._groups, "snapshots": self._snapshots,
                "inplace_grads": [w.key if w.target == _Target.GRAD else -1 for w, _, _ in self._inplace],
                "spec": self.result_spec, "single": self._single_result,
                "side_attrs": list(self.side_attrs)})
        inputs, now = [], None
        for kind, ref in self._slot_refs:
            if kind == "arg":
                inputs.append((_Source.ARG, ref))
            elif kind == "param":
                inputs.append((_Source.TENSOR, world.params[ref]))
            elif kind == "buffer":
                inputs.append((_Source.TENSOR, world.buffers[ref]))
            elif kind == "grad":
                inputs.append((_Source.GRAD, world.params[ref]))
            elif kind == "state":
                oi, i, k = ref
                inputs.append((_Source.STATE, world.optimizers[oi], world.params[i], k))
            elif kind == "read":
                name, path = ref
                if now is None:
                    now = TensorReads.places_of(world.reads)
                place_kind, holder, key = now[name]
                inputs.append((_Source.PLACE, _READ_KINDS[place_kind], holder, key, path))
            else:
                oi, gi = ref
                inputs.append((_Source.LR, world.optimizers[oi], gi))
        inputs += [(_Source.TENSOR, t) for t in self.lowered.constants]
        return _torch_C.Call({
            "plan": self._plan, "guard": guard, "handover": self._handover, "step": self._packed,
            "runner": self._run_step, "inputs": inputs, "params": list(world.params),
            "optimizers": list(world.optimizers), "moved": _device._moved, "device_result": _device_result,
            "miss": _MISS, "other": _OTHER})

    def _plan_writes(self, writes, placeholders, roots):
        """Splits the write-backs into those the compiled step writes into the tensor of the slot
        that held the old value, in its own memory (`_inplace`: (write, slot, root), a new value
        of the slot's shape and dtype), and those written after the call (`_items`). Not with
        graph breaks (their pieces run one by one through lazyrt's own buffers)."""
        self._items, self._inplace = [], []
        for w in writes:
            slot = None
            if w.target == _Target.SLOT:
                slot = w.key
            elif w.target == _Target.GRAD and w.how == _How.UPDATE:
                slot = self._grad_slot.get(w.key)
            elif w.target == _Target.STATE and w.how == _How.UPDATE:
                s = self._state_slot.get(w.key[:2], {}).get(w.key[2])
                slot = s if isinstance(s, int) else None
            if self.lowered.pieces is None and slot is not None and w.value.output:
                old, new = placeholders[slot].meta.get("val"), roots[w.value.index].meta.get("val")
                if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and \
                        old.dtype == new.dtype and old.shape == new.shape and old.dtype in _PACKABLE:
                    self._inplace.append((w, slot, w.value.index))
                    continue
            self._items.append(w)
        self._inplace_slots = [slot for _, slot, _ in self._inplace]
        # Input slots a write-back after the call reads: copied before the step writes any input.
        self._snapshots = sorted({w.value.index for w in self._items if w.value is not None and not w.value.output})

    def _plan_calls(self, results, roots):
        """The compiled step's outputs: the roots a result or a write-back after the call reads
        (roots only written in place are not outputs). Those only written back are grouped by
        dtype: the compiled step returns each group as one flat tensor (one hand-over per group
        and call instead of one per output); the results stay outputs of their own. With graph
        breaks, every root, one output each (their pieces run one by one)."""
        self._packed = None
        self._direct = list(range(len(roots)))
        self._groups = []
        if self.lowered.pieces is not None:
            return
        in_result = {v.index for v in results if isinstance(v, Value) and v.output}
        needed = set(in_result)
        own = set(in_result)  # outputs of their own: results, and gradients made anew
        for w in self._items:
            if w.value is not None and w.value.output:
                needed.add(w.value.index)
                if w.target == _Target.GRAD and w.how == _How.NEW:
                    own.add(w.value.index)
        groups = {}
        self._direct = []
        for k in sorted(needed):
            val = roots[k].meta.get("val")
            if k in own or not isinstance(val, torch.Tensor) or val.dtype not in _PACKABLE:
                self._direct.append(k)
            else:
                groups.setdefault(val.dtype, []).append(k)
        for dtype, ks in groups.items():
            shapes = [tuple(int(d) for d in roots[k].meta["val"].shape) for k in ks]
            self._groups.append((ks, [math.prod(shape) for shape in shapes], shapes))

    def _plan_results(self, results, on_device, captured):
        """The result leaves (see Result)."""
        self._single_result = len(results) == 1 and torch.utils._pytree.tree_unflatten(
            [None], self.result_spec) is None
        return [Result(_Leaf.CONST, constant=c[1]) if c[0] == "C" else
                Result(_Leaf.INPUT if not v.output else _Leaf.DEVICE if device else _Leaf.OUTPUT, v)
                for v, device, c in zip(results, on_device, captured)]

    def _packed_fn(self, *inputs):
        vals = self.lowered(*inputs)
        for _, slot, k in self._inplace:
            inputs[slot].copy_(vals[k])  # an update of the argument: replays write it in place
        # A compiled step returns what it computes: a root that only passes an input on (a
        # clone of an argument) leaves through an identity op.
        out = [_computed(vals[k]) for k in self._direct]
        for ks, sizes, _ in self._groups:
            out.append(_C.cat([_C.reshape(vals[k], (n,)) for k, n in zip(ks, sizes)], 0))
        return tuple(out)

    def _run_step(self, lazy_inputs):
        """The step's outputs for the lazyrt views of a call's inputs: compiled by
        lazyrt.compile_step on the first call; piece by piece with graph breaks."""
        if self.lowered.pieces is not None:
            return list(self.lowered.run(lazy_inputs))
        if self._packed is None:
            self._packed = lazyrt.compile_step(self._packed_fn, lazy_inputs, guard_reads=False)
        outs = self._packed(*lazy_inputs)
        return [outs] if isinstance(outs, lazyrt.Tensor) else list(outs)

    def mark_dynamic(self, world, dynamic):
        """Marks the argument slots' dims dynamic as torch would treat them: torch._dynamo's
        mark_dynamic (hard) and maybe_mark_dynamic (soft) on the tensors of this capture's call,
        every dim soft with dynamic=True, none with dynamic=False. Sizes of one bucket then share
        one compiled executable (lazyrt.mark_dynamic)."""
        if dynamic is False:
            return
        for s, (kind, ref) in enumerate(self._slot_refs):
            if kind != "arg":
                continue
            t = world.args_leaves[ref]
            hard = set(getattr(t, "_dynamo_dynamic_indices", None) or ())
            soft = set(getattr(t, "_dynamo_weak_dynamic_indices", None) or ()) - hard
            if dynamic:
                soft |= set(range(t.dim())) - hard
            if hard or soft:
                self._handover.mark(s, sum(1 << d for d in hard), sum(1 << d for d in soft))

    def keep_reads(self, world):
        """Keeps the metadata of the tensors the step read from places (world.reads of tensors:
        `_reads.META`; the capture's 'read' slots, read from those places on every call): the
        capture accepts a call while they hold (`_reads.TensorReads`)."""
        self.tensor_reads = TensorReads(world.reads)

    def _stand_in(self, world):
        """Zeros standing in for the parameters' missing gradients the step reads (lazyrt never
        writes into them): views of one zeroed buffer per dtype, as large as the largest of
        them (they are only read)."""
        missing = [(s, world.params[ref]) for s, (kind, ref) in enumerate(self._slot_refs)
                   if kind == "grad" and world.params[ref].grad is None and not self._handover.has_standin(s)]
        shared = {}
        for _, p in missing:
            shared[p.dtype] = max(shared.get(p.dtype, 0), p.numel())
        shared = {dtype: torch.zeros(n, dtype=dtype) for dtype, n in shared.items()}
        for s, p in missing:
            self._handover.standin(s, shared[p.dtype][:p.numel()].view(p.shape))


# What a Call returns where the guard fails (_MISS) or an input is not where it was (_OTHER).
_MISS, _OTHER = object(), object()


class _StateChanged(CaptureError):
    """A capture changed Python state the step reaches (put back as it was)."""


class _AliasedMemory(Exception):
    """An input of the step shares memory with another, and the step writes one of them."""


def _on_device(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type == _device.NAME


def _code_names(code):
    """The global names a code object (and the code nested in it) loads or binds, sorted (by its
    bytecode: attribute names are not global names)."""
    return code_reads(code)[0]


class _Place:
    """A piece of Python state a step reaches (a closure cell, a named global, an attribute of
    its bound self), snapshotted shallowly: the object there and, for a list, dict or set, its
    elements (held, so identities stay unique)."""

    def __init__(self, what, get, put, by_items=False):
        self.what, self.get, self.put = what, get, put
        self.by_items = by_items  # get() makes a new dict each time: compare its items only
        self.obj = get()
        self.items = self._items(self.obj)

    @staticmethod
    def _items(obj):
        if obj.__class__ is list:
            return list(obj)
        if obj.__class__ is dict:
            return list(obj.items())
        if obj.__class__ is set:
            return list(obj)
        return None

    def changed(self):
        obj = self.get()
        if obj is not self.obj and not self.by_items:
            return True
        now = self._items(obj)
        if now is None:
            return False
        if len(now) != len(self.items):
            return True
        if obj.__class__ is dict:
            return any(a[0] is not b[0] and a[0] != b[0] or a[1] is not b[1] for a, b in zip(now, self.items))
        if obj.__class__ is set:
            return set(map(id, now)) != set(map(id, self.items))
        return any(a is not b for a, b in zip(now, self.items))

    def restore(self):
        self.put(self.obj)
        if self.by_items:
            return
        if self.obj.__class__ is list:
            self.obj[:] = self.items
        elif self.obj.__class__ is dict:
            self.obj.clear()
            self.obj.update(self.items)
        elif self.obj.__class__ is set:
            self.obj.clear()
            self.obj.update(self.items)


_MISSING = object()


def _reached(fn):
    """What fn reaches directly, in order: its bound self, the arguments of a functools.partial,
    its closure's cells and the globals its code names. Yields (what, value, get, put): get and
    put read and rebind the place (None for the bound self and a partial's arguments, which
    cannot be rebound)."""
    f = fn
    if inspect.ismethod(f):
        yield f"the step's {type(f.__self__).__name__}", f.__self__, None, None
        f = f.__func__
    if isinstance(f, functools.partial):
        for k, v in enumerate(list(f.args) + list(f.keywords.values())):
            yield f"argument {k} of the step's partial", v, None, None
        f = f.func
    code = getattr(f, "__code__", None)
    for name, cell in zip(code.co_freevars if code is not None else (), getattr(f, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue

        def put(v, c=cell):
            c.cell_contents = v
        yield f"closure variable '{name}'", value, lambda c=cell: c.cell_contents, put
    if code is not None:
        g = getattr(f, "__globals__", {})
        for name in _code_names(code):  # also a name not bound yet (_MISSING), which the step may bind
            yield (f"global '{name}'", g.get(name, _MISSING), lambda n=name: g.get(n, _MISSING),
                   lambda v, n=name: g.__setitem__(n, v) if v is not _MISSING else g.pop(n, None))


_TRACKED_ATTRS = ("_parameters", "_buffers", "_modules", "_flat_weights", "_flat_weight_refs")


class _ModulePlace(_Place):
    """The attributes of a module other than what the capture tracks itself (parameters,
    buffers, submodules, a recurrent module's weight list): a forward that caches a tensor on
    its module (a mask made on the first call, what a layer saw) changes them."""

    def __init__(self, module):
        self.module = module
        attrs = module.__dict__

        def get():
            return {k: v for k, v in attrs.items() if k not in _TRACKED_ATTRS}

        def put(v):
            for k in [k for k in attrs if k not in _TRACKED_ATTRS and k not in v]:
                del attrs[k]
            attrs.update(v)
        super().__init__(f"attributes of a {type(module).__name__}", get, put, by_items=True)

    def changed_names(self):
        before = dict(self.items)
        now = self.get()
        return [k for k in sorted(set(before) | set(now), key=str) if now.get(k, _MISSING) is not before.get(k, _MISSING)]

    def tensors_set(self):
        """The attributes the step set to tensors (or tuples, lists, dicts of them), if every
        change is such a setting; else None."""
        now = self.get()
        names = self.changed_names()
        for k in names:
            if k not in now:
                return None
            leaves = torch.utils._pytree.tree_leaves(now[k])
            if not leaves or not all(isinstance(v, torch.Tensor) for v in leaves):
                return None
        return [(self.module, k) for k in names]


def _module_places(modules):
    """A _ModulePlace per module reached (submodules included, each once)."""
    places, seen = [], set()
    for m in modules:
        for sub in m.modules():
            if id(sub) not in seen:
                seen.add(id(sub))
                places.append(_ModulePlace(sub))
    return places


def _python_places(fn):
    """The Python state fn reaches (_reached; a bound self's attributes instead of the object)
    but for modules and optimizers, whose state the capture tracks itself, and for modules,
    functions, classes and builtins named by its code."""
    places = []
    skip = (torch.nn.Module, torch.optim.Optimizer)
    for what, value, get, put in _reached(fn):
        if isinstance(value, skip) or inspect.ismodule(value) or inspect.isfunction(value) or \
                inspect.isclass(value) or inspect.isbuiltin(value):
            continue
        if get is not None:
            places.append(_Place(what, get, put))
        elif inspect.ismethod(fn) and value is fn.__self__ and isinstance(getattr(value, "__dict__", None), dict):
            attrs = value.__dict__
            for name in list(attrs):
                places.append(_Place(f"attribute '{name}' of {what}", lambda n=name: attrs.get(n, _MISSING),
                                     lambda v, n=name: attrs.__setitem__(n, v) if v is not _MISSING else None))
    return places


def discover(fn, *args, **kwargs):
    """The torch modules and optimizers fn reaches, each once, for a call fn(*args, **kwargs):
    found in its arguments, bound self, closure and the globals its code names, and in the
    attributes, lists and dicts they hold (`_discover.find`)."""
    modules, optimizers, _ = _discover.find(fn, args, kwargs)
    return modules, optimizers


def _guard(fn, world, args):
    """A _torch_C.Guard of the facts a call must share with the one `world` was built from for
    the capture made for `world` to run it: `world.facts()`, each compared exactly (the
    signature made of them keys some by what a capture depends on only), and what discover(fn)
    reads (fn's code, closure cells and named globals, by identity). `args`: the call's argument
    leaves (tensors by metadata, modules and optimizers by identity, plain values by value).
    The Python values the step reads are compared as read (a tensor by its metadata: a capture
    reads it from its place, see _Entry.keep_reads). It needs no capture: the same facts for
    every capture of the world. A call the guard passes has the capture's signature. None where
    a fact cannot be compared without Python (an argument leaf that is no key object, a
    hyperparameter or state entry that is not a plain value): such calls take the signature."""
    if not all(isinstance(a, torch.Tensor) or key_object(a) for a in args):
        return None
    facts = world.facts()
    f = fn.__func__ if inspect.ismethod(fn) else fn
    plain_function = inspect.isfunction(f)
    # The places of tensors, compared by their metadata.
    by_meta = {(kind, id(holder), key) for _, kind, holder, key, _, how in facts.reads if how is _META}
    cells = []
    for cell in (f.__closure__ or ()) if plain_function else ():
        try:
            cells.append((cell, cell.cell_contents, True, ("c", id(cell), None) in by_meta))
        except ValueError:  # an empty cell
            cells.append((cell, None, False, False))
    # A callable that is no function (a module, an object with __call__): its reach is checked
    # by _reach_holds, the values it reads as the reads.
    g = f.__globals__ if plain_function else {}
    own_names = _code_names(f.__code__) if plain_function else []
    params = [p for p, _, _ in facts.params]
    buffers = [b for b, _ in facts.buffers]
    grad_enabled, default_dtype, (_, autocast, autocast_dtype) = facts.modes
    spec = {
        "function": f, "code": f.__code__ if plain_function else None, "cells": cells, "globals": g,
        "names": [(n, g.get(n), n in g, ("g", id(g), n) in by_meta) for n in own_names],
        "args": list(args), "world_tensors": params + buffers,
        "submodules": [(sub, training, list(sub._parameters.values()), list(sub._buffers.values()),
                        list(sub._modules.values())) for sub, training in facts.submodules],
        "params": params, "buffers": buffers,
        # The Python values the step reads but those the checks of cells and named globals
        # above already compare by identity.
        "reads": guard_spec([r for r in facts.reads
                             if not (r[1] == "c" and any(r[2] is c[0] for c in cells) or
                                     r[1] == "g" and r[2] is g and r[3] in own_names)], by_meta),
        "limits": (_READS_DEPTH, _READS_MAX_ITEMS),
        "modes": (grad_enabled, default_dtype, autocast, autocast_dtype),
    }
    opts = []
    for o, lr_in, groups, states in facts.optimizers:
        states = [(params[i], list(d.items()) if d else None) for _, i, _, d in states]
        if not all(_plain(v) for _, entries in groups for _, v in entries) or \
                not all(isinstance(v, torch.Tensor) or _plain(v) for _, d in states if d for _, v in d):
            return None  # (compared by identity, an object changed in place would pass)
        opts.append((o, lr_in, [(list(group["params"]), list(entries)) for group, entries in groups], states))
    spec["optimizers"] = opts
    return _torch_C.Guard(spec)


# Calls whose guards a call tries before it finds its capture by discovery and signature (each
# a world of facts: argument shapes, gradients present or not, modes, ...).
_RECENT = 16

# Captures for other values of the Python values a step reads (and nothing else) before a
# warning says so.
_VALUE_CAPTURES = 8



def _same_objects(a, b):
    """Whether worlds a and b hold the same modules, optimizers, parameters and buffers."""
    return all(len(x) == len(y) and all(p is q for p, q in zip(x, y))
               for x, y in ((a.modules, b.modules), (a.optimizers, b.optimizers), (a.params, b.params),
                            (a.buffers, b.buffers)))


def _reach_holds(world, args):
    """Whether discovery would read what it read for `world` (the attributes, lists and dicts it
    went through, the positional arguments it started from): else the call is discovered
    again. The roots in the function's cells and named globals are the guard's to check."""
    reach = getattr(world, "reach", None)
    return reach is None or reach.holds(args)


def _union(given, found):
    seen = {id(v) for v in given}
    return list(given) + [v for v in found if id(v) not in seen]


def _as_list(x):
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


class CompiledFunction:
    """A PyTorch training step, captured on its first call per signature and replayed by lazyrt.

    Calling it runs one step: the same results as calling `fn`, and afterwards the modules'
    parameters and buffers, the parameters' ``.grad`` and the optimizers' state hold what eager
    would have left there. ``captures`` counts the captures made so far.
    """

    def __init__(self, fn, model=None, optimizer=None, dynamic=None):
        self.fn = fn
        self._dynamic = dynamic
        self._modules = _as_list(model)
        self._optimizers = _as_list(optimizer)
        self._entries = {}
        # (world, entry, guard, its Call) of the last calls that had a guard, one per world,
        # the most recent first: a call tries their guards in this order (_RECENT at most).
        self._recent = []
        self.captures = 0
        self._warned_aliasing = False
        self._warned_grad_arguments = False
        self._warned_values = False
        self._state_changed = set()  # signatures whose capture changed Python state once (run in eager)
        self._eager_only = {}  # signature but the Python values read -> why it runs in eager (EagerOnly)
        self._warned_eager_only = False
        self._warned_layout = False
        self._free = []  # the last discovery's leaf tensors that require grad (see _discover.find)
        functools.update_wrapper(self, fn, updated=())

    def _found(self, args=(), kwargs=None):
        return self._discovery(args, kwargs)[:2]

    def _discovery(self, args, kwargs):
        """(modules, optimizers, reach): those given and those found for a call with args and
        kwargs, and what finding them read (a _discover.Reach; None where it read nothing the
        guard of the function's cells and named globals does not check)."""
        found_modules, found_optimizers, reach = _discover.find(self.fn, args, kwargs)
        self._free = reach.free
        return (_union(self._modules or [], found_modules), _union(self._optimizers or [], found_optimizers),
                reach if reach or reach.free else None)

    def _world(self, args, kwargs, found=None):
        modules, optimizers = found or self._found()
        for o in optimizers:
            if not isinstance(o, torch.optim.Optimizer):
                raise TypeError(f"lazyrt.torch.compile: optimizer= takes torch.optim optimizers, got {type(o).__name__}")
        for m in modules:
            if not isinstance(m, torch.nn.Module):
                raise TypeError(f"lazyrt.torch.compile: model= takes torch.nn modules, got {type(m).__name__}")
        # No module is fine (a function of its arguments); a parameter of a module not found
        # is refused when captured, naming model=.
        world = World(modules, optimizers, args, kwargs, free=self._free)
        # The Python values the step reads are constants of a capture: part of the signature.
        # A tensor the world holds (a parameter, a buffer, a weight trained by hand) is an input
        # of the capture in its own right: a read of one (or of a tuple, list or dict holding
        # one) is by identity.
        world.reads = inputs_by_identity(python_reads(self.fn, modules), world.tensor_ids)
        return world

    @property
    def traces(self):
        """How many times lazyrt traced the lowered graphs (one per capture unless lazyrt retraced)."""
        return sum(e.traces for entries in self._entries.values() for e in entries)

    def __call__(self, *args, **kwargs):
        # (The list is replaced, never changed in place: a call in another thread may be
        # going through it.)
        recents = self._recent if not kwargs else ()
        for k, recent in enumerate(recents):
            world, entry, _, call = recent
            leaves = call_leaves(world, args) if _reach_holds(world, args) else None
            if leaves is None:
                continue
            # A recent call's Call checks in C++ that this call shares its facts (_guard): its
            # signature and its entry; and runs the whole call there.
            try:
                r = call(leaves)
                if r is _OTHER:  # an input is not where it was: made where the capture can
                    world.args_leaves = list(leaves)
                    try:
                        r = entry.run(world, call)
                    finally:
                        world.args_leaves = None  # the world is kept; the arguments are not
            except _AliasedMemory as e:
                return self._eager(world, entry, e, args, kwargs)
            if r is not _MISS:
                if k:
                    self._recent = [recent] + [other for other in self._recent if other is not recent]
                return r
        tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(t.requires_grad for t in tensors):
            return self._eager_for_grad_arguments(args, kwargs)
        if any(t.layout is not torch.strided for t in tensors):
            return self._eager_for_layout(args, kwargs)
        modules, optimizers, reach = self._discovery(args, kwargs)
        world = self._world(args, kwargs, (modules, optimizers))
        world.reach = reach  # checked before its guard is (_reach_holds)
        facts = world.facts()
        signature = world.signature(facts)
        entries = self._entries.setdefault(signature, [])
        if signature[:-1] in self._eager_only:  # no capture can replay it (see EagerOnly)
            self._warn_eager_only(signature[:-1])
            return self.fn(*args, **kwargs)
        for entry in entries:
            if entry.accepts(facts):
                break
        else:
            self._forget_the_dead()
            entry = self._capture_or_eager(world, signature, args, kwargs)
            if entry is None:
                return self.fn(*args, **kwargs)
            # The capture ran the step in torch and freed what it made: hand those pages back
            # before the first run allocates its own (the first step's peak would hold both).
            _C._debug.release_free_heap()
            entries.append(entry)
            self.captures += 1
            self._warn_value_captures(signature)
            if entry.collectives:
                _distributed._before_first_run(world)
        leaves = None if kwargs else call_leaves(world, args)
        guard = None if leaves is None else _guard(self.fn, world, leaves)
        if guard is not None:
            # The objects the guard holds by identity, alive while it is (their ids stay theirs).
            world.key_objects = [a for a in leaves if not isinstance(a, torch.Tensor)]
        call = entry.call(world, guard)
        try:
            return entry.run(world, call)
        except _AliasedMemory as e:
            return self._eager(world, entry, e, args, kwargs)
        finally:
            if guard is not None:
                world.args_leaves = None
                # Only calls on the same objects stay (a world holds its modules, optimizers and
                # tensors alive: those of a model the program dropped are not kept).
                kept = [r for r in self._recent if _same_objects(r[0], world)]
                self._recent = [(world, entry, guard, call)] + kept[:_RECENT - 1]

    def _forget_the_dead(self):
        """Drops the captures (and eager-only verdicts) for worlds whose modules, optimizers,
        parameters or objects read by identity are gone: no call can have their signature again,
        and a capture holds compiled code and views of its tensors' memory."""
        self._entries = {s: e for s, e in self._entries.items() if all_alive(s)}
        self._eager_only = {s: why for s, why in self._eager_only.items() if all_alive(s)}
        self._state_changed = {s for s in self._state_changed if all_alive(s)}

    def _warn_value_captures(self, signature):
        """Warns once where the step has been captured _VALUE_CAPTURES times for nothing but
        other Python values it reads (the signature's last part): each is a compile of its own."""
        if self._warned_values or not signature[-1]:
            return
        others = [s for s in self._entries if s[:-1] == signature[:-1] and s != signature]
        if len(others) + 1 < _VALUE_CAPTURES:
            return
        self._warned_values = True
        before = dict((what, value) for what, _, value in others[-1][-1])
        changed = [what for what, _, value in signature[-1] if what not in before or before[what] != value]
        warnings.warn(f"lazyrt.torch: the step has been captured {len(others) + 1} times for other values of "
                      f"Python values it reads ({', '.join(changed) or 'its reads'}); a replay cannot read them, "
                      "so each value is a capture and compile of its own: pass a value that changes often as a "
                      "tensor argument (a learning rate: the optimizer's, which is a graph input)",
                      RuntimeWarning, stacklevel=3)

    def _eager(self, world, entry, aliased, args, kwargs):
        """Runs the step in PyTorch eager: its inputs share memory in a way the capture cannot
        express (see _Entry._view). Counted as EagerStep; warned about once per function."""
        _C._metrics._increment("EagerStep", 1)
        if not self._warned_aliasing:
            self._warned_aliasing = True
            kind, ref = entry._slot_refs[aliased.args[0]] if aliased.args[0] < len(entry._slot_refs) else ("constant", "")
            warnings.warn(f"lazyrt.torch: the step's inputs share memory and the step writes one of them ({kind} "
                          f"{ref} overlaps another input); lazyrt's capture treats inputs as separate values, so "
                          "this call runs in PyTorch eager (and every call while they share memory)",
                          GraphBreakWarning, stacklevel=3)
        return self.fn(*args, **kwargs)

    def _eager_for_layout(self, args, kwargs):
        """Runs the step in PyTorch eager: an argument is a sparse (or other storage-less)
        tensor, which lazyrt has no form of. Counted as EagerStep; warned about once per
        function."""
        _C._metrics._increment("EagerStep", 1)
        if not self._warned_layout:
            self._warned_layout = True
            layouts = sorted({str(t.layout) for t in torch.utils._pytree.tree_leaves((args, kwargs))
                              if isinstance(t, torch.Tensor) and t.layout is not torch.strided})
            warnings.warn(f"lazyrt.torch: an argument of the step is a tensor of layout {', '.join(layouts)}, which "
                          "lazyrt has no form of; this call (and every call with such an argument) runs in PyTorch "
                          "eager (pass it dense, to_dense(), to compile the step)", GraphBreakWarning, stacklevel=3)
        return self.fn(*args, **kwargs)

    def _eager_for_grad_arguments(self, args, kwargs):
        """Runs the step in PyTorch eager: an argument requires grad, and the capture writes back
        the gradients of the modules' parameters only, so its .grad is made as eager makes it.
        Counted as EagerStep; warned about once per function."""
        _C._metrics._increment("EagerStep", 1)
        if not self._warned_grad_arguments:
            self._warned_grad_arguments = True
            warnings.warn("lazyrt.torch: an argument of the step requires grad; its gradient is written back only by "
                          "PyTorch eager, so this call (and every call with such an argument) runs in eager; make it a "
                          "parameter of a module the step uses to compile the step",
                          GraphBreakWarning, stacklevel=3)
        return self.fn(*args, **kwargs)

    def _capture(self, world):
        # A replay runs no Python: a step that changes Python state it reaches (a counter in a
        # closure, a list it appends to) would change it when captured only, and leave the
        # capture's stand-in tensors there. That state is put back as it was, and _StateChanged
        # raised (see _capture_or_eager). Tensors the step sets on modules (a mask it caches,
        # what a layer saw) are the exception: captured as results of the step, and set again
        # after every run (Entry.side_attrs).
        side_attrs = []
        while True:
            places = _python_places(self.fn) + _module_places(world.modules)
            try:
                # An optimizer the step runs that discovery did not find is refused, naming it.
                with _discover.foreign_optimizers(world.optimizers):
                    entry = self._capture_entry(world, side_attrs, places)
                entry.mark_dynamic(world, self._dynamic)
            finally:
                changed = [p for p in places if p.changed()]
                sets = [p.tensors_set() if isinstance(p, _ModulePlace) else None for p in changed]
                for p in changed:
                    p.restore()
            found = [a for names in sets if names for a in names]
            declared = {(id(m), k) for m, k in side_attrs}
            if not changed or (side_attrs and all(sets) and all((id(m), k) in declared for m, k in found)):
                entry.side_attrs = tuple(side_attrs)
                entry.keep_reads(world)
                return entry
            if side_attrs or not all(sets):
                raise _StateChanged(
                    "lazyrt.torch: the step changes Python state that its replays would not change ("
                    + ", ".join(p.what for p in changed) + ") on every call; keep such state outside the "
                    "step (pass what the step needs as an argument) or in tensors")
            side_attrs = found  # captured again, with them as results
    def _warn_eager_only(self, structure):
        _C._metrics._increment("EagerStep", 1)
        if not self._warned_eager_only:
            self._warned_eager_only = True
            warnings.warn(self._eager_only[structure], GraphBreakWarning, stacklevel=4)

    def _capture_or_eager(self, world, signature, args, kwargs):
        """The capture for `world`, or None where this call ran in eager: a capture that changes
        Python state (state a first call sets up: a cached mask, a lazily made attribute) is
        undone and the call runs in PyTorch eager, which sets that state up for real; the next
        call captures again. A step whose capture changes Python state again is refused."""
        structure = signature[:-1]  # the Python values it reads aside: the state may be one of them
        try:
            return self._capture(world)
        except EagerOnly as e:
            self._eager_only[structure] = str(e)
            self._warn_eager_only(structure)
            return None
        except _StateChanged:
            if structure in self._state_changed:
                raise
            self._state_changed.add(structure)
        _C._metrics._increment("EagerStep", 1)
        warnings.warn("lazyrt.torch: capturing the step changed Python state it reaches (an attribute a module "
                      "sets on its first call, say); this call runs in PyTorch eager and the next one is captured",
                      GraphBreakWarning, stacklevel=3)
        return None

    def _capture_entry(self, world, side_attrs=(), places=()):
        """The capture of the step in `world`, captured again (up to four times) where a missing
        gradient or optimizer state cannot stand in as zeros; each capture from the Python state
        `places` held before the first (a capture that sets a module's attribute would have the
        next one read its stand-in)."""
        fn = self.fn

        def capture_again(*args):
            for p in places:
                if p.changed():
                    p.restore()
            return capture(*args)
        if side_attrs:
            def fn(*args, **kwargs):
                result = self.fn(*args, **kwargs)
                return result, [getattr(m, k) for m, k in side_attrs]
        exact_grads, exact_states = set(), set()
        for _ in range(3):
            c = capture_again(world, fn, frozenset(exact_grads), frozenset(exact_states))
            bad_grads = {i for i in c.grad_canonical if i not in c.grad_none_ok}
            bad_states = {k for k in c.state_canonical if k not in c.state_empty_ok}
            if not bad_grads and not bad_states:
                return _Entry(c)
            exact_grads |= bad_grads
            exact_states |= bad_states
        # Everything missing captured as missing.
        for i in range(len(world.params)):
            if world.grad_kind(i) == "none_canonical":
                exact_grads.add(i)
        for oi, entries in enumerate(world.opt_params):
            for gi, i in entries:
                if world.state_kind(oi, gi, i) == "empty_canonical":
                    exact_states.add((oi, i))
        return _Entry(capture_again(world, fn, frozenset(exact_grads), frozenset(exact_states)))


def compile(fn=None, *, model=None, optimizer=None, dynamic=None):
    """Compiles a PyTorch training step for lazyrt: ``step = lazyrt.torch.compile(fn)``.

    fn: a function of tensors (and Python values) that runs one training step on torch modules
    and optimizers — forward, ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad()``
    in any order — and returns what the caller wants back (a loss, a tuple of tensors, ...).
    model, optimizer: the torch.nn.Module(s) and torch.optim optimizer(s) the step uses (one or a
    list each), in addition to those found among fn's arguments, bound self, closure and the
    globals its code names, and in what those hold (attributes of modules and of the program's
    own objects, dataclasses, namespaces, lists, dicts; up to three steps deep), found anew
    whenever what the search read changed (rebinding ``self.opt``, passing another model).
    Pass them when the step reaches them otherwise (a default argument, deeper); an optimizer
    the step runs that is neither given nor found is refused when captured, naming it.
    A module found but not used costs only its tensors' hand-over per call.

    dynamic: as torch.compile's. None: the dims torch._dynamo.mark_dynamic (or maybe_mark_dynamic)
    marked on the arguments are dynamic; True: every dim of every tensor argument may be (those
    that meet a static dim, a weight's, stay static); False: none. A capture is still made per
    shape, but sizes of one bucket (up to the next power of two) share one compiled executable.

    Used as a decorator too: ``@lazyrt.torch.compile`` or ``@lazyrt.torch.compile(model=m)``.
    See the package docstring (``help(lazyrt.torch)``) for what is captured and guarded.
    """
    if fn is None:
        return lambda f: CompiledFunction(f, model=model, optimizer=optimizer, dynamic=dynamic)
    return CompiledFunction(fn, model=model, optimizer=optimizer, dynamic=dynamic)
