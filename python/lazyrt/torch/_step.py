"""`lazyrt.torch.compile`: the compiled step — guards, the cache of captures, running a capture
through ``lazyrt.compile_step`` and writing the results back into the user's torch tensors."""

import bisect
import functools
import inspect
import math
import warnings

import torch

import lazyrt
from lazyrt.torch import _optim
from lazyrt.torch._capture import CaptureError, World, capture, quick_key
from lazyrt import _C, _torch_C
from lazyrt.torch._lower import GraphBreakWarning, LoweredGraph

# dtypes whose write-backs travel packed in one flat output per dtype.
_PACKABLE = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


def _as_tensor(t):
    """An input as a torch tensor (a learning rate is handed over as a Python float)."""
    return torch.tensor(t, dtype=torch.float64) if t.__class__ is float else t


def _source(node, placeholder_index, roots):
    """Where a graph value comes from after a call: ('in', slot) for an input left as it was,
    else ('out', position among the lowered graph's outputs)."""
    if node.op == "placeholder":
        return ("in", placeholder_index[node])
    roots.append(node)
    return ("out", len(roots) - 1)


class _Entry:
    """One capture: its lowered graph (compiled by lazyrt.compile_step on first use, piece by
    piece where it has graph breaks), the world it is valid for beyond its signature, and the
    write-back plan."""

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
        self.writes = []  # (slot, source): args, parameters, buffers changed in place
        for s, value in copies.items():
            if c.slots[s].kind in ("arg", "param", "buffer"):
                self.writes.append((s, _source(value, placeholder_index, roots)))
            elif c.slots[s].kind == "lr":
                raise CaptureError("lazyrt.torch: the step changes a learning rate in place")

        self.result_spec = c.result_spec
        self.result = [("T", _source(outputs[v[1]], placeholder_index, roots)) if v[0] == "T" else v
                       for v in c.result]

        def final(kind_entry, own_slot):
            _, k, own = kind_entry
            src = _source(outputs[k], placeholder_index, roots)
            if own and src == ("in", own_slot):
                return ("keep",)  # the step left it as it was
            return ("own", src) if own else ("new", src)

        self.grads = {}
        for i, g in c.grads.items():
            self.grads[i] = ("none",) if g[0] == "N" else final(g, c.grad_slot.get(i))
        self.states = {}
        for key, d in c.states.items():
            plan = {}
            for k, v in d.items():
                slot = c.state_in.get(key, {}).get(k)
                plan[k] = ("C", v[1]) if v[0] == "C" else final(v, slot if isinstance(slot, int) else None)
            self.states[key] = plan
        if not roots:
            raise CaptureError("lazyrt.torch: the step computes nothing lazyrt could run")
        self.lowered = LoweredGraph(gm, roots, graph_breaks=True)
        self._roots = len(roots)
        self._in_sources = [w[1] for w in self.writes if w[1][0] == "in"] + \
            [g[1] for g in self.grads.values() if len(g) == 2 and g[1][0] == "in"] + \
            [v[1] for d in self.states.values() for v in d.values() if v[0] in ("own", "new") and v[1][0] == "in"]
        self._slot_refs = [(slot.kind, slot.ref) for slot in c.slots]
        self._grad_slot = dict(c.grad_slot)
        self._state_slot = {key: dict(d) for key, d in c.state_in.items()}
        self._plan_writes(placeholders, roots)
        self._plan_calls(roots)
        # Results returned as the torch view of their own output: each once among the results,
        # and an output of its own (no write-back reads it).
        counts = {}
        for r in self.result:
            if r[0] == "T" and r[1][0] == "out":
                counts[r[1][1]] = counts.get(r[1][1], 0) + 1
        self._result_roots = {k for k, n in counts.items() if n == 1 and k in self._direct and
                              not any(_item_source(kind, plan) == ("out", k) for kind, _, plan in self._items)}
        self._single_result = len(self.result) == 1 and torch.utils._pytree.tree_unflatten(
            [None], self.result_spec) is None
        # Per input (slots, then the graph's constants): the torch tensor last handed over, its
        # address, its lazyrt view, and whether that view is lent for writing.
        n = len(c.slots) + len(self.lowered.constants)
        self._held, self._ptrs, self._views, self._lent = [None] * n, [0] * n, [None] * n, [False] * n
        self._expect = None  # per in-place item, the address its view must still hold after a call
        self._written_spans, self._written_starts = [], []  # written slots' memory, sorted: (start, stop, slot)
        self._wanted = frozenset(self._inplace_slots)
        self._zeros = {}

        self.exact_grads = c.exact_grads
        self.exact_states = c.exact_states
        self.grad_none_ok = c.grad_none_ok
        self.state_empty_ok = c.state_empty_ok
        self.state_keys = set(c.state_in)
        self._state_creates = None  # (optimizer, group, param index) of state_keys, in order

    def accepts(self, world):
        """Whether this capture is right for `world` (which has this capture's signature): the
        missing gradients and state it captured as missing are still missing, and those it
        captured through a stand-in are missing only where the stand-in was checked."""
        for i in range(len(world.params)):
            kind = world.grad_kind(i)
            if i in self.exact_grads:
                if kind != "none_canonical":
                    return False
            elif kind == "none_canonical" and i not in self.grad_none_ok:
                return False
        for oi, entries in enumerate(world.opt_params):
            for gi, i in entries:
                kind = world.state_kind(oi, gi, i)
                if (oi, i) in self.exact_states:
                    if kind != "empty_canonical":
                        return False
                elif kind == "empty_canonical" and (oi, i) not in self.state_empty_ok:
                    return False
        return True

    def run(self, world):
        # Missing state this capture stands in for: create the optimizer's initial state now (the
        # step updates it in place below, as eager's first step creates and updates it).
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
            return self._run(world)
        except BaseException:
            for o, p in created:  # a step that did not run leaves no state behind
                o.state.pop(p, None)
            raise

    @property
    def traces(self):
        return self.lowered.traces if self._packed is None else self._packed.traces

    def _plan_writes(self, placeholders, roots):
        """The write-backs as one list of (kind, key, plan): 'w' (slot, source), 'g' (param
        index, plan), 's' ((optimizer, param index), state key, plan); split into those the
        compiled step writes into the tensor of the slot that held the old value, in its own
        memory (`_inplace`: (item, slot, root), a new value of the slot's shape and dtype), and
        those written after the call (`_items`). Not with graph breaks (their pieces run one by
        one through lazyrt's own buffers)."""
        items = [("w", s, src) for s, src in self.writes]
        items += [("g", i, plan) for i, plan in self.grads.items() if plan[0] != "keep"]
        items += [("s", key, (k, how)) for key, d in self.states.items() for k, how in d.items() if how[0] != "keep"]
        self._items, self._inplace = [], []
        for item in items:
            kind, key, plan = item
            slot, src = None, None
            if kind == "w":
                slot, src = key, plan
            elif kind == "g" and plan[0] == "own":
                slot, src = self._grad_slot.get(key), plan[1]
            elif kind == "s" and plan[1][0] == "own":
                s = self._state_slot.get(key, {}).get(plan[0])
                slot, src = (s if isinstance(s, int) else None), plan[1][1]
            if self.lowered.pieces is None and slot is not None and src[0] == "out":
                old, new = placeholders[slot].meta.get("val"), roots[src[1]].meta.get("val")
                if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and \
                        old.dtype == new.dtype and old.shape == new.shape and old.dtype in _PACKABLE:
                    self._inplace.append((item, slot, src[1]))
                    continue
            self._items.append(item)
        self._inplace_slots = [slot for _, slot, _ in self._inplace]

    def _plan_calls(self, roots):
        """The compiled step's outputs: the roots a result or a write-back after the call reads
        (roots only written in place are not outputs). Those only written back are grouped by
        dtype: the compiled step returns each group as one flat tensor (one hand-over per group
        and call instead of one per output); the results stay outputs of their own. With graph
        breaks, every root, one output each (their pieces run one by one)."""
        self._packed = None
        self._direct = list(range(len(roots)))
        self._groups = []
        self._where = {}
        if self.lowered.pieces is not None:
            return
        in_result = {r[1][1] for r in self.result if r[0] == "T" and r[1][0] == "out"}
        needed = set(in_result)
        for kind, _, plan in self._items:
            src = _item_source(kind, plan)
            if src is not None and src[0] == "out":
                needed.add(src[1])
        groups = {}
        self._direct = []
        for k in sorted(needed):
            val = roots[k].meta.get("val")
            if k in in_result or not isinstance(val, torch.Tensor) or val.dtype not in _PACKABLE:
                self._direct.append(k)
            else:
                groups.setdefault(val.dtype, []).append(k)
        for dtype, ks in groups.items():
            shapes = [tuple(int(d) for d in roots[k].meta["val"].shape) for k in ks]
            sizes = [math.prod(shape) for shape in shapes]
            for j, k in enumerate(ks):
                self._where[k] = (len(self._groups), j, shapes[j])
            self._groups.append((ks, sizes))

    def _packed_fn(self, *inputs):
        vals = self.lowered(*inputs)
        for _, slot, k in self._inplace:
            inputs[slot].copy_(vals[k])  # an update of the argument: replays write it in place
        out = [vals[k] for k in self._direct]
        for ks, sizes in self._groups:
            out.append(_C.cat([_C.reshape(vals[k], (n,)) for k, n in zip(ks, sizes)], 0))
        return tuple(out)

    def _outputs(self, lazy_inputs):
        """(direct, flat): per root the compiled step returned, its lazyrt value (direct) or a
        flat torch view of its values inside its group's output (flat); the other entry None."""
        direct = [None] * self._roots
        flat = [None] * self._roots
        if self.lowered.pieces is not None:
            for k, v in enumerate(self.lowered.run(lazy_inputs)):
                direct[k] = v
            return direct, flat
        if self._packed is None:
            self._packed = lazyrt.compile_step(self._packed_fn, lazy_inputs)
        outs = self._packed(*lazy_inputs)
        if isinstance(outs, lazyrt.Tensor):
            outs = (outs,)
        for pos, k in enumerate(self._direct):
            direct[k] = outs[pos]
        base = len(self._direct)
        for g, (ks, sizes) in enumerate(self._groups):
            for k, piece in zip(ks, lazyrt.to_torch(outs[base + g]).split_with_sizes(sizes)):
                flat[k] = piece
        return direct, flat

    def _torch_inputs(self, world):
        inputs = []
        for s, (kind, ref) in enumerate(self._slot_refs):
            if kind == "arg":
                t = world.args_leaves[ref]
            elif kind == "param":
                t = world.params[ref]
            elif kind == "buffer":
                t = world.buffers[ref]
            elif kind == "grad":
                t = world.params[ref].grad
                if t is None:  # the stand-in zeros, made once: lazyrt never writes into them
                    t = self._zeros.get(s)
                    if t is None:
                        p = world.params[ref]
                        t = self._zeros[s] = torch.zeros_like(p, memory_format=torch.contiguous_format).detach()
            elif kind == "state":
                oi, i, k = ref
                t = world.state_of(oi, i)[k]
            else:  # lr: a Python number
                oi, gi = ref
                t = float(world.optimizers[oi].param_groups[gi]["lr"])
            inputs.append(t)
        return inputs + self.lowered.constants

    def _lazy_inputs(self, inputs):
        """lazyrt tensors viewing the inputs' memory. A slot's view is kept from call to call
        while the slot holds the same tensor at the same address, contiguous: its memory, hence
        its values, are then those the view reads (shapes and dtypes are guarded by the
        signature, and the view keeps that memory alive, so no other tensor can take its
        address). Learning rates: a 0-d float64 tensor per value.

        The memory of each slot the compiled step updates in place is lent for writing, so that
        its new value lands in the torch tensor itself, where that is safe: a contiguous CPU
        tensor of the caller's (not a stand-in for a missing gradient) whose memory no other
        input overlaps (the step reads those while it writes). Other views only read their
        tensor's memory, or a contiguous copy of it."""
        held, ptrs, views = self._held, self._ptrs, self._views
        lazy = []
        for s, t in enumerate(inputs):
            if t.__class__ is float:
                lazy.append(self._number(s, t))
            elif t is held[s] and t.data_ptr() == ptrs[s] and t.is_contiguous():
                lazy.append(views[s])
            else:
                lazy.append(self._view(s, t, inputs))
        if self._expect is None:
            self._lent_changed(inputs)
        return lazy

    def _number(self, s, t):
        """The view of a learning rate: a 0-d float64 tensor, made anew when the value changes."""
        held, views = self._held, self._views
        v = views[s]
        if v is None or held[s] != t or (t == 0.0 and math.copysign(1.0, t) != math.copysign(1.0, held[s])):
            v = views[s] = lazyrt.from_torch(torch.tensor(t, dtype=torch.float64))
            held[s] = t
        return v

    def _view(self, s, t, inputs):
        """A new view for slot s, lent or not (see _lazy_inputs), kept for the next calls when t
        is a contiguous CPU tensor. Raises _AliasedMemory when t's memory overlaps another
        input's and one of the two is written by the step: the capture treats its inputs as
        separate values, which they are not then."""
        held, ptrs, views, lent = self._held, self._ptrs, self._views, self._lent
        contiguous = t.device.type == "cpu" and t.is_contiguous()
        span = _span(t) if contiguous else _storage_span(t)
        written = s in self._wanted
        if span[0] < span[1] and (self._overlaps_any(span, s, inputs) if written else self._written_overlapping(span, s)):
            raise _AliasedMemory(s)
        if not contiguous:
            held[s] = views[s] = None
            if lent[s] or written:
                lent[s] = False
                self._expect = None
            return lazyrt.from_torch(t)  # a contiguous copy
        lend = written and t.dtype in _PACKABLE and span[0] < span[1] and \
            not any(z is t for z in self._zeros.values())
        if written:
            self._expect = None
        v = lazyrt.from_torch(t, _lend=lend)
        held[s], ptrs[s], views[s], lent[s] = t, t.data_ptr(), v, lend
        return v

    def _overlaps_any(self, span, s, inputs):
        for r, t in enumerate(inputs):
            if r != s and t.__class__ is not float:
                other = _span(t) if t.device.type == "cpu" and t.is_contiguous() else _storage_span(t)
                if other[0] < span[1] and span[0] < other[1]:
                    return True
        return False

    def _written_overlapping(self, span, s):
        """Whether the memory of a written slot other than s, as last handed over, overlaps
        span. Written slots' spans are disjoint (else the call ran eagerly) and sorted: only the
        last one starting before span's end can overlap."""
        starts, spans = self._written_starts, self._written_spans
        i = bisect.bisect_left(starts, span[1]) - 1
        while i >= 0 and spans[i][2] == s:
            i -= 1
        return i >= 0 and spans[i][1] > span[0]

    def _lent_changed(self, inputs):
        """Rebuilds, after a written slot got a new view: the sorted spans of the written slots'
        memory, and per in-place item the address its view must still hold after a call (0
        where not lent: the new value is then copied after the call)."""
        spans = []
        for s in self._wanted:
            t = inputs[s]
            if t.device.type == "cpu" and t.is_contiguous():
                spans.append(_span(t) + (s,))
            else:
                spans.append(_storage_span(t) + (s,))
        spans.sort()
        self._written_spans = spans
        self._written_starts = [sp[0] for sp in spans]
        self._expect = [self._ptrs[s] if self._lent[s] else 0 for s in self._inplace_slots]

    def _run(self, world):
        inputs = self._torch_inputs(world)
        lazy = self._lazy_inputs(inputs)
        params = world.params

        # Sources that are inputs are read before anything is written (the compiled step
        # writes some inputs in place).
        snapshots = {}
        for src in self._in_sources:
            s = src[1]
            if s not in snapshots:
                snapshots[s] = _as_tensor(inputs[s]).detach().clone()

        direct, flat = self._outputs(lazy)
        where = self._where

        def value(src):
            if src[0] == "in":
                return snapshots[src[1]]
            k = src[1]
            f = flat[k]
            return lazyrt.to_torch(direct[k]) if f is None else f.view(where[k][2])

        late = self._items
        with _no_grad_if(late or self._inplace):
            if self._inplace:
                # Written in place: the slot's view still holds the lent memory. Else (not lent,
                # or the replay could not write into it) the new value is in the view: copied
                # after the call like any write-back, and the view is made anew next call.
                moved = _C._lent_moved(lazy, self._inplace_slots, self._expect)
                _torch_C.bump_versions(inputs, self._inplace_slots, moved)
                if moved:
                    late = list(late)
                    for j in moved:
                        item, s, _ = self._inplace[j]
                        new = lazyrt.to_torch(lazy[s])
                        self._held[s] = self._views[s] = None
                        self._expect = None
                        kind, key, plan = item
                        late.append(("w", key, ("value", new)) if kind == "w" else
                                    ("g", key, ("own", ("value", new))) if kind == "g" else
                                    ("s", key, (plan[0], ("own", ("value", new)))))
            for kind, key, plan in late:
                if kind == "w":
                    inputs[key].copy_(_value(value, plan))
                elif kind == "g":
                    p = params[key]
                    if plan[0] == "none":
                        p.grad = None
                    elif plan[0] == "own" and p.grad is not None:
                        p.grad.copy_(_value(value, plan[1]))
                    else:
                        p.grad = _value(value, plan[1]).clone()
                else:
                    oi, i = key
                    state = world.optimizers[oi].state[params[i]]
                    k, how = plan
                    if how[0] == "C":
                        state[k] = how[1]
                    elif how[0] == "own" and isinstance(state.get(k), torch.Tensor):
                        state[k].copy_(_value(value, how[1]))
                    else:
                        state[k] = _value(value, how[1]).clone()

        # A returned value is a torch view of the lazyrt buffer the replay wrote it into: the
        # view holds that buffer, so lazyrt never writes into it again (the next call's result
        # goes to another buffer), and it is the caller's alone.
        leaves = []
        for r in self.result:
            if r[0] == "C":
                leaves.append(r[1])
            elif r[1][0] == "in":
                leaves.append(_as_tensor(inputs[r[1][1]]))
            elif r[1][1] in self._result_roots:
                leaves.append(lazyrt.to_torch(direct[r[1][1]]))
            else:
                leaves.append(value(r[1]).clone())
        if self._single_result:
            return leaves[0]
        return torch.utils._pytree.tree_unflatten(leaves, self.result_spec)


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_CONTEXT = _NoContext()


def _no_grad_if(needed):
    """torch.no_grad() where torch ops will run, else nothing (it costs a microsecond)."""
    return torch.no_grad() if needed else _NO_CONTEXT


def _span(t):
    """The bytes a contiguous CPU tensor occupies: (first, one past the last)."""
    start = t.data_ptr()
    return (start, start + t.numel() * t.element_size())


def _storage_span(t):
    """The bytes of a tensor's whole storage (for tensors that are not contiguous: a bound on
    what they occupy)."""
    if t.device.type != "cpu":
        return (0, 0)
    storage = t.storage()
    start = storage.data_ptr()
    return (start, start + storage.nbytes())


class _AliasedMemory(Exception):
    """An input of the step shares memory with another, and the step writes one of them."""


def _item_source(kind, plan):
    """Where a write-back item's new value comes from (see _source), or None (a constant, or
    no value: a gradient set to None)."""
    if kind == "w":
        return plan
    how = plan if kind == "g" else plan[1]
    return how[1] if how[0] in ("own", "new") else None


def _value(value, src):
    """A write-back's new value: from the call's outputs or inputs, or given (a value an in-place
    write could not land in place)."""
    return src[1] if src[0] == "value" else value(src)


@functools.lru_cache(maxsize=256)
def _code_names(code):
    """The global names a code object (and the code nested in it) may read, sorted."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names.update(_code_names(const))
    return tuple(sorted(names))


def discover(fn):
    """The torch modules and optimizers fn reaches directly: its bound self, its closure's cells
    and the globals its code names (in that order, each once)."""
    found, seen = [], set()

    def consider(v):
        if isinstance(v, (torch.nn.Module, torch.optim.Optimizer)) and id(v) not in seen:
            seen.add(id(v))
            found.append(v)

    f = fn
    if inspect.ismethod(f):
        consider(f.__self__)
        f = f.__func__
    if isinstance(f, functools.partial):
        for v in list(f.args) + list(f.keywords.values()):
            consider(v)
        f = f.func
    code = getattr(f, "__code__", None)
    for cell in getattr(f, "__closure__", None) or ():
        try:
            consider(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    if code is not None:
        g = getattr(f, "__globals__", {})
        for name in _code_names(code):
            if name in g:
                consider(g[name])
    modules = [v for v in found if isinstance(v, torch.nn.Module)]
    optimizers = [v for v in found if isinstance(v, torch.optim.Optimizer)]
    return modules, optimizers


def _guard(fn, world, modules, optimizers, args):
    """A _torch_C.Guard of the facts quick_key(world, modules, optimizers, args) compares, and of
    what discover(fn) reads (fn's code, closure cells and named globals, by identity); None
    where fn is not a plain function or a method of one (then the Python path decides)."""
    f = fn.__func__ if inspect.ismethod(fn) else fn
    if not inspect.isfunction(f):
        return None
    cells = []
    for cell in f.__closure__ or ():
        try:
            cells.append((cell, cell.cell_contents, True))
        except ValueError:  # an empty cell
            cells.append((cell, None, False))
    g = f.__globals__
    params = world.params
    spec = {
        "function": f, "code": f.__code__, "cells": cells, "globals": g,
        "names": [(n, g.get(n), n in g) for n in _code_names(f.__code__)],
        "args": list(args), "world_tensors": list(world.params) + list(world.buffers),
        "submodules": [(sub, sub.training, list(sub._parameters.values()), list(sub._buffers.values()),
                        list(sub._modules.values())) for sub in world.submodules],
        "params": list(params), "buffers": list(world.buffers),
        "modes": (torch.is_grad_enabled(), torch.get_default_dtype(), torch.is_autocast_cpu_enabled(),
                  torch.get_autocast_cpu_dtype()),
    }
    opts = []
    for oi, o in enumerate(optimizers):
        lr_in = _optim.lr_is_input(o)
        groups = [(list(group["params"]), [(k, v) for k, v in group.items()
                                           if k not in ("params", "initial_lr") and not (k == "lr" and lr_in)])
                  for group in o.param_groups]
        states = []
        for _, i in world.opt_params[oi]:
            d = o.state.get(params[i])
            states.append((params[i], list(d.items()) if d else None))
        opts.append((o, lr_in, groups, states))
    spec["optimizers"] = opts
    return _torch_C.Guard(spec)


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

    def __init__(self, fn, model=None, optimizer=None):
        self.fn = fn
        self._modules = _as_list(model)
        self._optimizers = _as_list(optimizer)
        self._entries = {}
        self._last = None  # (world, entry, quick key, guard) of the last call that had a quick key
        self.captures = 0
        self._warned_aliasing = False
        functools.update_wrapper(self, fn, updated=())

    def _found(self):
        found_modules, found_optimizers = discover(self.fn)
        return _union(self._modules or [], found_modules), _union(self._optimizers or [], found_optimizers)

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
        return World(modules, optimizers, args, kwargs)

    @property
    def traces(self):
        """How many times lazyrt traced the lowered graphs (one per capture unless lazyrt retraced)."""
        return sum(e.traces for entries in self._entries.values() for e in entries)

    def __call__(self, *args, **kwargs):
        last = self._last
        if last is not None and not kwargs:
            # Same modules, optimizers, structure, shapes, dtypes, flags, hyperparameters, state
            # layout and modes as the last call: its signature and its entry (see quick_key;
            # the guard checks the same facts in C++, the function's reach included).
            world, entry, key, guard = last
            if guard is not None:
                same = guard.check(args)
            else:
                modules, optimizers = self._found()
                same = quick_key(world, modules, optimizers, args) == key
            if same:
                world.args_leaves = list(args)
                try:
                    return entry.run(world)
                except _AliasedMemory as e:
                    return self._eager(world, entry, e, args, kwargs)
                finally:
                    world.args_leaves = None  # the world is kept; the arguments are not
        self._last = None
        modules, optimizers = found = self._found()
        world = self._world(args, kwargs, found)
        signature = world.signature()
        entries = self._entries.setdefault(signature, [])
        for entry in entries:
            if entry.accepts(world):
                break
        else:
            entry = self._capture(world)
            entries.append(entry)
            self.captures += 1
        key = None if kwargs else quick_key(world, modules, optimizers, args)
        guard = None if key is None else _guard(self.fn, world, modules, optimizers, args)
        try:
            return entry.run(world)
        except _AliasedMemory as e:
            return self._eager(world, entry, e, args, kwargs)
        finally:
            if key is not None:
                world.args_leaves = None
                self._last = (world, entry, key, guard)

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

    def _capture(self, world):
        exact_grads, exact_states = set(), set()
        for _ in range(3):
            c = capture(world, self.fn, frozenset(exact_grads), frozenset(exact_states))
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
        return _Entry(capture(world, self.fn, frozenset(exact_grads), frozenset(exact_states)))


def compile(fn=None, *, model=None, optimizer=None):
    """Compiles a PyTorch training step for lazyrt: ``step = lazyrt.torch.compile(fn)``.

    fn: a function of tensors (and Python values) that runs one training step on torch modules
    and optimizers — forward, ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad()``
    in any order — and returns what the caller wants back (a loss, a tuple of tensors, ...).
    model, optimizer: the torch.nn.Module(s) and torch.optim optimizer(s) the step uses (one or a
    list each), in addition to those found among fn's bound self, closure and the globals its
    code names (found anew on every call: rebinding a global to another model is seen). Pass
    them when the step reaches them otherwise (``self.model`` in a method of a plain object).
    A module found but not used costs only its tensors' hand-over per call.

    Used as a decorator too: ``@lazyrt.torch.compile`` or ``@lazyrt.torch.compile(model=m)``.
    See the package docstring (``help(lazyrt.torch)``) for what is captured and guarded.
    """
    if fn is None:
        return lambda f: CompiledFunction(f, model=model, optimizer=optimizer)
    return CompiledFunction(fn, model=model, optimizer=optimizer)
