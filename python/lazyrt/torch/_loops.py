"""Structured loops over torch tensors: ``while_loop``, ``fori_loop`` and ``scan`` whose bodies
are written with torch ops and ``torch.nn`` modules, run by lazyrt's loops (one loop node,
compiled once whatever the trip count).

A body is captured when lazyrt traces the loop: ``make_fx`` under ``functionalize`` over fake
tensors of the carries' shapes and dtypes (nothing runs), and its aten graph is lowered to
lazyrt ops on the loop's own body values (`_lower`). A body that indexes by its integer carry
(``x.clone().select(0, it).copy_(...)``, PyTorch's int_carry program) is captured symbolically:
the position is read when the graph runs (out of range: a lazyrt.Error then). The tensors a body reads from outside
(a module's weights, a tensor in a closure) become the loop's captured values, read anew on
every call. The carries and results are torch tensors; results are new tensors.

A capture is kept with the body function and used again by a later call that would capture the
same graph (`_Bodies`), as a compiled step is: the same function, carry structure, shapes and
dtypes, grad and autocast modes and default dtype, the same modules (discovery's, from the
function's closure and globals) with the same parameter and buffer objects and training flags,
and the same Python values the body reads (`_reads`: values by value, functions by identity;
the tensors it reads from globals, closure cells, attributes and containers are read from their
place on every call and need only their metadata unchanged). Anything else captures again. As
with a compiled step, Python side effects of a body (printing, appending to a list) happen only
when it is captured. ``LoopBodyCapture`` counts the captures.

Gradients: where torch records gradients and a carry, a stacked input or a tensor a body reads
from outside requires grad, that tensor enters the loop as a lazyrt leaf that requires grad, and
lazyrt differentiates the loop (the loops issue's memory policies apply: ``snapshots``). The
results join torch's autograd graph through one ``torch.autograd.Function`` whose backward runs
lazyrt's backward and hands each tensor its gradient.
"""

import inspect
import weakref

import torch
import torch.utils._pytree as pytree

import lazyrt
from lazyrt import _C
from lazyrt.torch import _discover
from lazyrt.torch._capture import CaptureError, _autocast_mode, _fake_trace, place_tensors, tracing
from lazyrt.torch._lower import _TORCH_DTYPES, LoweredGraph
from lazyrt._reads import Same, TensorReads, put, python_reads, read_now, read_signature


class _Inputs:
    """The torch tensors one loop reads (its carries, stacked inputs and the tensors its bodies
    capture) as lazyrt tensors, each once. Where torch records gradients, a floating tensor that
    requires grad becomes a lazyrt leaf that requires grad, holding a copy (the caller may
    change the tensor in place before the backward runs); the others share its memory."""

    def __init__(self, what):
        self.what = what
        self.grad = torch.is_grad_enabled()
        self.lazy = {}      # id(torch tensor) -> lazyrt tensor
        self.kept = []      # the torch tensors, alive while their ids are keys
        self.leaves = []    # (torch tensor, lazyrt leaf) of those differentiated

    def __call__(self, t):
        got = self.lazy.get(id(t))
        if got is not None:
            return got
        if t.device.type != "cpu":
            raise lazyrt.Error(f"lazyrt.torch.{self.what}: tensors must be CPU tensors, got device {t.device}")
        if self.grad and t.requires_grad and t.is_floating_point():
            x = lazyrt.from_torch(t.detach().clone()).requires_grad_(True)
            self.leaves.append((t, x))
        else:
            x = lazyrt.from_torch(t.detach())
        self.lazy[id(t)] = x
        self.kept.append(t)
        return x

    def tree(self, tree):
        def convert(x):
            if isinstance(x, torch.Tensor):
                return self(x)
            if isinstance(x, (bool, int, float)):
                return x
            raise TypeError(f"lazyrt.torch.{self.what}: carried values must be torch tensors or Python numbers, "
                            f"got {type(x).__name__}")
        return pytree.tree_map(convert, tree)

    def results(self, tree):
        """The loop's results as torch tensors (copies: lazyrt's values are immutable, and the
        caller may change the results in place), joined to torch's autograd graph where a
        differentiated input reaches them."""
        flat, spec = pytree.tree_flatten(tree)
        out = [lazyrt.to_torch(x).clone() if isinstance(x, lazyrt.Tensor) else x for x in flat]
        grads = [k for k, x in enumerate(flat) if isinstance(x, lazyrt.Tensor) and x.requires_grad]
        if grads and self.leaves:
            attached = _Attach.apply(self, [flat[k] for k in grads], [out[k] for k in grads],
                                     *[t for t, _ in self.leaves])
            for k, t in zip(grads, attached):
                out[k] = t
        return pytree.tree_unflatten(out, spec)


class _Attach(torch.autograd.Function):
    """The loop's differentiated results, as a function of the torch tensors that entered it as
    lazyrt leaves: the values are computed already; the backward is lazyrt's."""

    @staticmethod
    def forward(ctx, inputs, lazy_outs, values, *tensors):
        ctx.inputs, ctx.lazy_outs = inputs, lazy_outs
        return tuple(values)

    @staticmethod
    def backward(ctx, *grads):
        total = None
        for out, g in zip(ctx.lazy_outs, grads):
            if g is None:
                continue
            term = (out * lazyrt.from_torch(g)).sum()
            total = term if total is None else total + term
        leaves = ctx.inputs.leaves
        if total is None:
            return (None, None, None) + (None,) * len(leaves)
        for _, x in leaves:
            x.grad = None
        total.backward()
        return (None, None, None) + tuple(None if x.grad is None else lazyrt.to_torch(x.grad).clone()
                                          for _, x in leaves)


class _Body:
    """One capture of a body: its lowered graph, the structure of its results, the metadata of
    the tensors it read from places (`TensorReads`) and those places: (name, path) per input
    of the graph after the body's own, each read there on every call."""

    def __init__(self, lowered, out_spec, tensor_reads, places):
        self.lowered, self.out_spec, self.tensor_reads, self.places = lowered, out_spec, tensor_reads, places

    def read(self, reads):
        """The tensors at the body's places in `reads` (the Python reads of a call)."""
        now = TensorReads.places_of(reads)
        return [read_now(*now[name], path) for name, path in self.places]


class _Bodies:
    """The captures of the bodies of lazyrt.torch's loops, per body (held weakly: the code of a
    plain function or method, so that a lambda made anew for every call finds the captures of
    the last; another callable itself) and signature (see the module docstring)."""

    def __init__(self):
        self._by_body = weakref.WeakKeyDictionary()  # code or callable -> {signature: [_Body]}

    @staticmethod
    def _key(fn):
        """(what captures of fn are kept with, what the signature adds for it)."""
        f = fn.__func__ if inspect.ismethod(fn) else fn
        if inspect.isfunction(f) and not f.__defaults__ and not f.__kwdefaults__:
            # Its closure cells and the globals its code names are read (python_reads).
            return f.__code__, (Same(f.__globals__), Same(fn.__self__) if f is not fn else None)
        return fn, ()

    def lookup(self, fn, what, spec, examples):
        """(key, signature, the Python reads now, the capture that holds for them or None)."""
        key, own = self._key(fn)
        modules, _, _ = _discover.find(fn)
        reads = python_reads(fn, modules)
        world = tuple((Same(m), tuple(sub.training for sub in m.modules()),
                       tuple((Same(t), tuple(t.shape), t.dtype, t.requires_grad)
                             for t in list(m.parameters()) + list(m.buffers())))
                      for m in modules)
        signature = (what, own, str(spec), tuple((tuple(e.shape), e.dtype) for e in examples), world,
                     torch.is_grad_enabled(), torch.get_default_dtype(), _autocast_mode(), read_signature(reads))
        try:
            entries = self._by_body.get(key, {}).get(signature, ())
        except TypeError:  # a callable that cannot be held weakly: not kept
            entries = ()
        return key, signature, reads, next((b for b in entries if b.tensor_reads.hold(reads)), None)

    def keep(self, key, signature, body):
        try:
            kept = self._by_body.setdefault(key, {}).setdefault(signature, [])
        except TypeError:
            return
        kept.append(body)
        del kept[:-_KEPT]  # the most recent (a body reading a tensor whose shape changes every call)


_KEPT = 16  # captures kept per body and signature (for other metadata of the tensors it reads)
_bodies = _Bodies()


def _capture_body(torch_fn, what, spec, examples, reads):
    """A _Body of torch_fn over fake tensors of `examples`' metadata. The tensors it reads from
    places (`reads`) are inputs of the graph after the body's own, as a step's are (`capture`)."""
    out_spec = [None]
    places = place_tensors(reads)
    own = len(examples)

    def flat_fn(xs):
        undo = []
        try:
            for x, (_, kind, holder, key, path, _) in zip(xs[own:], places):
                undo.append(put(kind, holder, key, x, path))
            result = torch_fn(*pytree.tree_unflatten(list(xs[:own]), spec))
        finally:
            for u in reversed(undo):
                u()
        leaves, out_spec[0] = pytree.tree_flatten(result)
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                raise CaptureError(f"lazyrt.torch.{what}: the body must return tensors, got "
                                   f"{type(leaf).__name__}")
        return leaves

    functionalize = tracing()[1]
    gm = None
    for positions in (False, True):
        try:
            with torch.no_grad():
                gm = _fake_trace(functionalize(flat_fn), list(examples) + [p[-1].detach() for p in places],
                                 constants_may_require_grad=True, positions=positions)
            break
        except (CaptureError, lazyrt.Error, TypeError):
            raise
        except Exception as e:  # noqa: BLE001 - name what failed, keep the cause
            if not positions and type(e).__name__ == "DataDependentOutputException":
                # The body reads a value (its integer carry as a position, x.select(0, it)):
                # captured again with that value a symbol (_fake_trace's `positions`).
                continue
            if positions and type(e).__name__ == "GuardOnDataDependentSymNode":
                raise CaptureError(f"lazyrt.torch.{what}: the body reads the value of a tensor and uses it as a "
                                   "Python int (int(t), a shape, a slice bound, a condition); a value read from a "
                                   "tensor is lowered only as a position of select (x.select(0, it))") from e
            raise CaptureError(f"lazyrt.torch.{what}: capturing the body failed: {type(e).__name__}: {e}") from e
    _C._metrics._increment("LoopBodyCapture", 1)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in placeholders:
            k = placeholders.index(n.args[0])
            raise CaptureError(f"lazyrt.torch.{what}: the body changes " +
                               ("a carried tensor in place; return the new value instead" if k < own else
                                f"a tensor it reads from {places[k - own][0]} in place; carry it instead"))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    lowered = LoweredGraph(gm, list(output.args[0]))
    return _Body(lowered, out_spec[0], TensorReads(reads), [(p[0], p[4]) for p in places])


def _lazy_body(torch_fn, what, inputs):
    """torch_fn (torch pytrees in and out) as a function of lazyrt pytrees of the same structure."""
    def body(*lazy_args):
        flat, spec = pytree.tree_flatten(lazy_args)
        for x in flat:
            if not isinstance(x, lazyrt.Tensor):
                raise TypeError(f"lazyrt.torch.{what}: the body gets tensors, got {type(x).__name__}")
        examples = [torch.empty(tuple(x.shape), dtype=_TORCH_DTYPES[x.dtype], device="meta") for x in flat]
        key, signature, reads, b = _bodies.lookup(torch_fn, what, spec, examples)
        if b is None:
            b = _capture_body(torch_fn, what, spec, examples, reads)
            _bodies.keep(key, signature, b)
        read = [inputs(t) for t in b.read(reads)]
        results = b.lowered(*flat, *read, *[inputs(c) for c in b.lowered.constants])
        return pytree.tree_unflatten(results, b.out_spec)
    return body


def while_loop(cond_fn, body_fn, carried_inputs, snapshots=0):
    """``while cond_fn(*carry): carry = body_fn(*carry)`` as one lazyrt loop, with the signature
    of ``torch._higher_order_ops.while_loop`` (PyTorch/XLA's): carried_inputs is a tuple of
    torch tensors (or Python numbers, or nested tuples, lists and dicts of them); cond_fn returns
    a one-element bool tensor; body_fn returns the new carry in the same structure, shapes and
    dtypes. Returns the final carry as a tuple of torch tensors.

    Differentiable (see the module's docstring): ``snapshots`` is the gradient's memory policy,
    0 keeping the carry each trip starts from, s >= 1 at most s of them (binomial
    checkpointing)."""
    args = tuple(carried_inputs) if isinstance(carried_inputs, (tuple, list)) else (carried_inputs,)
    inputs = _Inputs("while_loop")
    cond = _lazy_body(cond_fn, "while_loop", inputs)
    body = _lazy_body(body_fn, "while_loop", inputs)

    def lazy_cond(*c):
        r = cond(*c)
        if not isinstance(r, lazyrt.Tensor):
            raise lazyrt.Error(f"lazyrt.torch.while_loop: cond_fn must return one bool tensor, got {type(r).__name__}")
        return r

    return inputs.results(lazyrt.while_loop(lazy_cond, body, inputs.tree(args), snapshots=snapshots))


def fori_loop(lower, upper, body_fn, init_val, snapshots=0):
    """``carry = body_fn(i, carry)`` for i in range(lower, upper), as one lazyrt loop (JAX's
    signature); i is an int64 0-d tensor, init_val a torch tensor or a nested tuple, list or dict
    of them. Returns the final carry, in init_val's structure. Differentiable; ``snapshots``
    as for while_loop."""
    inputs = _Inputs("fori_loop")
    body = _lazy_body(body_fn, "fori_loop", inputs)
    return inputs.results(lazyrt.fori_loop(lower, upper, body, inputs.tree(init_val), snapshots=snapshots))


def scan(fn, init, xs, reverse=False, snapshots=0):
    """``(carry, ys) = scan(fn, init, xs)`` with ``carry, y = fn(carry, x)`` for each row x of
    xs (PyTorch/XLA's scan): one lazyrt scan node. init and xs are torch tensors or pytrees of
    them (xs stacked along dim 0); the ys come back stacked along dim 0. Differentiable with
    respect to init, xs and the tensors fn reads; ``snapshots`` as for while_loop."""
    inputs = _Inputs("scan")
    body = _lazy_body(fn, "scan", inputs)
    return inputs.results(lazyrt.scan(body, inputs.tree(init), inputs.tree(xs), reverse=reverse,
                                      snapshots=snapshots))
