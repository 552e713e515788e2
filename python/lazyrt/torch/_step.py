"""`lazyrt.torch.compile`: the compiled step — guards, the cache of captures, running a capture
through ``lazyrt.compile_step`` and writing the results back into the user's torch tensors."""

import functools
import inspect

import torch

import lazyrt
from lazyrt.torch import _optim
from lazyrt.torch._capture import CaptureError, World, capture
from lazyrt.torch._lower import LoweredGraph


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

        self.exact_grads = c.exact_grads
        self.exact_states = c.exact_states
        self.grad_none_ok = c.grad_none_ok
        self.state_empty_ok = c.state_empty_ok
        self.state_keys = set(c.state_in)

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
        for oi, o in enumerate(world.optimizers):
            for gi, i in world.opt_params[oi]:
                if (oi, i) in self.state_keys and not world.state_of(oi, i):
                    o.state[world.params[i]] = _optim.initial_state(o, o.param_groups[gi], world.params[i])
                    created.append((o, world.params[i]))
        try:
            return self._run(world)
        except BaseException:
            for o, p in created:  # a step that did not run leaves no state behind
                o.state.pop(p, None)
            raise

    def _run(self, world):
        inputs = []
        for slot in self.slots:
            kind, ref = slot.kind, slot.ref
            if kind == "arg":
                t = world.args_leaves[ref]
            elif kind == "param":
                t = world.params[ref]
            elif kind == "buffer":
                t = world.buffers[ref]
            elif kind == "grad":
                p = world.params[ref]
                t = p.grad if p.grad is not None else torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif kind == "state":
                oi, i, k = ref
                t = world.state_of(oi, i)[k]
            else:  # lr
                oi, gi = ref
                t = torch.tensor(float(world.optimizers[oi].param_groups[gi]["lr"]), dtype=torch.float64)
            inputs.append(t)
        lazy_inputs = [lazyrt.from_torch(t) for t in inputs]
        lazy_inputs += [lazyrt.from_torch(t) for t in self.lowered.constants]
        outs = self.lowered.run(lazy_inputs)

        snapshots = {}

        def value(src):
            if src[0] == "out":
                return lazyrt.to_torch(outs[src[1]])
            s = src[1]
            if s not in snapshots:
                snapshots[s] = inputs[s].detach().clone()
            return snapshots[s]

        # Sources that are inputs are read before anything is written.
        for plan in [w[1] for w in self.writes] + [g[1] for g in self.grads.values() if len(g) == 2] + \
                [v[1] for d in self.states.values() for v in d.values() if v[0] in ("own", "new")]:
            if plan[0] == "in":
                value(plan)

        with torch.no_grad():
            for s, src in self.writes:
                inputs[s].copy_(value(src))
            for i, plan in self.grads.items():
                p = world.params[i]
                if plan[0] == "none":
                    p.grad = None
                elif plan[0] == "own" and p.grad is not None:
                    p.grad.copy_(value(plan[1]))
                elif plan[0] in ("own", "new"):
                    p.grad = value(plan[1]).clone()
            for (oi, i), plan in self.states.items():
                state = world.optimizers[oi].state[world.params[i]]
                for k, how in plan.items():
                    if how[0] == "C":
                        state[k] = how[1]
                    elif how[0] == "own" and isinstance(state.get(k), torch.Tensor):
                        state[k].copy_(value(how[1]))
                    elif how[0] in ("own", "new"):
                        state[k] = value(how[1]).clone()

        leaves = []
        for r in self.result:
            if r[0] == "C":
                leaves.append(r[1])
            elif r[1][0] == "in":
                leaves.append(inputs[r[1][1]])
            else:
                leaves.append(lazyrt.to_torch(outs[r[1][1]]).clone())
        return torch.utils._pytree.tree_unflatten(leaves, self.result_spec)


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
        self.captures = 0
        functools.update_wrapper(self, fn, updated=())

    def _world(self, args, kwargs):
        found_modules, found_optimizers = discover(self.fn)
        modules = _union(self._modules or [], found_modules)
        optimizers = _union(self._optimizers or [], found_optimizers)
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
        return sum(e.lowered.traces for entries in self._entries.values() for e in entries)

    def __call__(self, *args, **kwargs):
        world = self._world(args, kwargs)
        signature = world.signature()
        entries = self._entries.setdefault(signature, [])
        for entry in entries:
            if entry.accepts(world):
                return entry.run(world)
        entry = self._capture(world)
        entries.append(entry)
        self.captures += 1
        return entry.run(world)

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
