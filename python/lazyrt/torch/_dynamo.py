"""``torch.compile(fn, backend="lazyrt")``: a Dynamo backend that runs the graphs Dynamo captures
as compiled lazyrt steps.

Dynamo captures the Python function into FX graphs (with its own guards, recompiles and graph
breaks); AOTAutograd (`torch._dynamo.backends.common.aot_autograd`) turns each into functional
aten graphs: a forward and a backward graph where autograd is needed, one inference graph
otherwise. Every such graph is handed to `_Compiled`, which lowers it with lazyrt.torch's
interpreter (`lazyrt.torch._lower.LoweredGraph`: each aten op as lazyrt ops, an op without a
lowering run in PyTorch eager between compiled pieces), compiles it once with
``lazyrt.compile_step`` and replays it on every call.

AOT configuration: ``keep_inference_input_mutations=True``, so a graph that changes its inputs
in place (an optimizer step: parameters and optimizer state; batch norm's running statistics)
keeps those updates as ``aten.copy_(input, new value)`` nodes at its end rather than returning
them for AOT's runtime wrapper to copy. The lazyrt step computes every new value and writes it
into the caller's tensor (lent to it, see `_Static`) or the call copies it there after the step
ran (lazyrt.torch.compile's executor, `_torch_C.Call`), so every update lands in the user's
tensors (same tensors, version counters bumped as by eager's in-place update). Where AOT still
returns a mutation as an extra output (an input that requires grad in a training graph), its
runtime wrapper applies it as usual.

Decompositions (`decompositions`): PyTorch's own (core aten) decompositions of the ops without a
lowering in lazyrt.torch, and its batch norm and dropout ones, so that such ops reach the
interpreter as ops it lowers (ops lazyrt lowers itself are kept whole); CPU flash attention,
forward and backward, as plain ops with the logsumexp its backward reads; foreach ops as their
per-tensor ops. Random ops (dropout) draw from lazyrt's generator, not from torch's stream.

Results: every result is a tensor of its own (a result whose memory lazyrt shares with an input
is cloned), not attached to autograd (AOT attaches the forward's results to the backward).

Shapes: a graph with static shapes is lowered and compiled when AOT hands it over. A graph with
symbolic shapes (Dynamo's automatic dynamic shapes, after a call with other shapes) is retraced
per concrete shapes met (``make_fx`` over fake tensors; nothing runs) and each specialization
compiled once.

Counters (`lazyrt.metrics.counter`): ``DynamoGraph`` counts the lazyrt graphs compiled (one per
aten graph and per specialization of a dynamic one), ``DynamoCall`` the calls of compiled
graphs (replays included), and ``GraphBreak`` the aten ops that ran in PyTorch eager; a graph
lazyrt cannot take as a whole (a dtype it does not have: uint8, complex; tensors on another
device than the CPU) runs in PyTorch eager,
warned about (`GraphBreakWarning`) and counted by ``DynamoEagerGraph``.
"""

import importlib.abc
import importlib.util
import math
import operator
import sys
import warnings

import torch
import torch.fx

import lazyrt
from lazyrt import _C, _torch_C
from lazyrt.torch._lower import GraphBreakWarning, LOWERINGS, LoweredGraph, UnsupportedOperatorError, _computed
from lazyrt.torch._step import _PACKABLE, _AliasedMemory, _How, _Leaf, _Source, _Target, Result, Value, Write

aten = torch.ops.aten

__all__ = ["lazyrt_backend", "BACKEND_NAME"]

BACKEND_NAME = "lazyrt"


def _is_symbolic(v):
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in v.shape)
    if isinstance(v, (tuple, list)):
        return any(_is_symbolic(x) for x in v)
    return False


def _has_symbolic_shapes(gm):
    return any(_is_symbolic(n.meta.get("val")) for n in gm.graph.nodes if n.op in ("placeholder", "call_function"))


class _Static:
    """A graph with static shapes, lowered, compiled by lazyrt.compile_step on its first call
    (piece by piece where it has graph breaks) and run by a `_torch_C.Call` of its plan: the
    executor of lazyrt.torch.compile's steps, here with the graph's inputs as its arguments.

    Its outputs are Result items: an input returned as it is, a root of the lowered graph, a
    value that is no node. Its in-place updates (``aten.copy_(placeholder, value)``) are written
    by the compiled step into the input's memory, lent to it, where the new value has the
    input's shape and dtype (`_torch_C.Handover`: no copy in, none back), else copied after the
    step (Write items). `lend=False`: none lent (a call whose inputs overlap in memory)."""

    def __init__(self, gm, what, lend=True):
        self.what = what
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        index = {n: k for k, n in enumerate(placeholders)}
        output = next(n for n in gm.graph.nodes if n.op == "output")
        outs = output.args[0]
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        roots, root_of = [], {}

        def source(v):
            if isinstance(v, torch.fx.Node):
                if v.op == "placeholder":
                    return Value(False, index[v])
                if v not in root_of:
                    root_of[v] = len(roots)
                    roots.append(v)
                return Value(True, root_of[v])
            return v

        outputs = [source(v) for v in outs]
        copies = []
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is aten.copy_.default:
                dst = n.args[0]
                if not (isinstance(dst, torch.fx.Node) and dst.op == "placeholder"):
                    raise UnsupportedOperatorError(f"lazyrt.torch: the {what} graph changes a tensor in place that "
                                                   f"is not one of its inputs (node '{n.name}')")
                copies.append((index[dst], source(n.args[1])))
        self.tensor_inputs = [isinstance(p.meta.get("val"), torch.Tensor) for p in placeholders]
        devices = {str(p.meta["val"].device) for p, t in zip(placeholders, self.tensor_inputs) if t}
        if devices - {"cpu"}:
            raise UnsupportedOperatorError(f"lazyrt.torch: the graph's inputs are on {', '.join(sorted(devices))}; "
                                           "lazyrt runs on the CPU")
        if not all(isinstance(r.meta.get("val"), torch.Tensor) for r in roots):
            raise UnsupportedOperatorError(f"lazyrt.torch: the {what} graph computes values that are no tensors")
        self._gm, self._lend = gm, lend
        self.lowered = LoweredGraph(gm, roots, graph_breaks=True) if roots else None
        pieces = self.lowered is not None and self.lowered.pieces is not None
        # An update of an input of its own shape and dtype is written into that input's memory
        # (not with graph breaks: their pieces run one by one through lazyrt's own buffers).
        self.inplace, late = [], []
        for k, src in copies:
            old, new = placeholders[k].meta.get("val"), roots[src.index].meta.get("val") if src.output else None
            if lend and not pieces and isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and \
                    old.dtype == new.dtype and old.shape == new.shape and old.dtype in _PACKABLE and \
                    k not in {i for i, _ in self.inplace}:
                self.inplace.append((k, src.index))
            else:
                late.append((k, src))
        # An input a returned value passes on (a clone of it, a view: lazyrt may return the
        # input's own memory for it) is not lent: the step's write into that memory would show
        # through the returned value (SGD's nesterov foreach step clones a gradient and then
        # updates the gradient in place).
        returned = {v.index for v in outputs if isinstance(v, Value) and v.output}
        passed_on = {_passed_on(roots[j], index) for j in returned | {src.index for _, src in late if src.output}}
        late = [(k, Value(True, j)) for k, j in self.inplace if k in passed_on] + late
        self.inplace = [(k, j) for k, j in self.inplace if k not in passed_on]
        self.needed = list(range(len(roots))) if pieces else \
            sorted(returned | {src.index for _, src in late if src.output})
        results = [Result(_Leaf.CONST, constant=v) if not isinstance(v, Value) else
                   Result(_Leaf.OUTPUT if v.output else _Leaf.INPUT, v) for v in outputs]
        constants = self.lowered.constants if self.lowered is not None else []
        self.handover = _torch_C.Handover(len(placeholders) + len(constants), [k for k, _ in self.inplace],
                                          _AliasedMemory)
        plan = _torch_C.Plan({
            "writes": [Write(_Target.SLOT, k, _How.UPDATE, src) for k, src in late], "results": results,
            "roots": len(roots), "direct": self.needed, "groups": [],
            "snapshots": sorted({src.index for _, src in late if not src.output}),
            "inplace_grads": [-1] * len(self.inplace), "spec": torch.utils._pytree.tree_flatten([0] * len(outputs))[1],
            "single": False, "side_attrs": []})
        dummy = torch.zeros((), dtype=torch.int64)  # for a number the static graph does not read
        self.compiled = None  # the compiled step; True where pieces compile themselves
        self.call = _torch_C.Call({
            "plan": plan, "guard": None, "handover": self.handover, "step": None, "runner": self._run_step,
            "inputs": [(_Source.ARG, k) if t else (_Source.TENSOR, dummy) for k, t in enumerate(self.tensor_inputs)] +
                      [(_Source.TENSOR, c) for c in constants],
            "params": [], "optimizers": [], "moved": None, "device_result": None, "miss": None, "other": None})
        self._aliased = None  # this graph with no memory lent (see __call__)
        self._marks = None
        # Outputs that are views of an input: AOT makes such an output again from the input with
        # the strides and offset of the one the graph returns, which must then be eager's.
        written = {src_node: k for k, src_node in ((index[n.args[0]], n.args[1]) for n in gm.graph.nodes
                                                   if n.op == "call_function" and n.target is aten.copy_.default)}
        self.input_views = [(i, view[0], view[1]) for i, view in
                            enumerate(_view_of_input(v, index, written) for v in outs) if view is not None]

    def mark_dynamic(self, dims):
        """Marks these dims of each input dynamic (soft: lazyrt.maybe_mark_dynamic) in the views
        the step is handed."""
        self._marks = dims
        for k, ds in enumerate(dims):
            if ds:
                self.handover.mark(k, 0, sum(1 << d for d in ds))

    def _run_step(self, lazy):
        """The step's outputs for the lazyrt views of the inputs: compiled on the first call."""
        if self.compiled is None:
            _C._metrics._increment("DynamoGraph", 1)
            if self.lowered is None:
                self.compiled = True
            elif self.lowered.pieces is not None:
                self.compiled = True  # pieces compile themselves on first run
            else:
                lowered, inplace, needed = self.lowered, self.inplace, self.needed

                def step(*xs):
                    vals = lowered(*xs)
                    for k, j in inplace:
                        xs[k].copy_(vals[j])  # an update of the input: replays write it in its memory
                    # A compiled step returns what it computes: a root that only passes an input
                    # on leaves through an identity op.
                    return [_computed(vals[j]) for j in needed]

                self.compiled = lazyrt.compile_step(step, list(lazy), guard_reads=False)
                self.call.set_step(self.compiled)
        if self.lowered is None:
            return []
        if self.compiled is True:
            return list(self.lowered.run(lazy))
        outs = self.compiled(*lazy)
        return [outs] if isinstance(outs, lazyrt.Tensor) else list(outs)

    def __call__(self, args):
        _C._metrics._increment("DynamoCall", 1)
        try:
            results = self.call.run(tuple(args))
        except _AliasedMemory:
            # An input the step updates in place overlaps another input in memory: this call
            # runs the graph compiled with no memory lent, which copies every update after it.
            if self._aliased is None:
                self._aliased = _Static(self._gm, self.what, lend=False)
                if self._marks is not None:
                    self._aliased.mark_dynamic(self._marks)
            return self._aliased(args)
        # The views of inputs, made by torch from the inputs (updated in place by now), as eager
        # makes them (lazyrt's value may be a copy: an input of a shape bucket, say).
        for i, k, chain in self.input_views:
            t = args[k]
            for n, item in chain:
                t = n.target(t, *n.args[1:], **n.kwargs)
                if item is not None:
                    t = t[item]
            results[i] = t
        return results


_PASSING_ON = {aten.clone.default, aten.alias.default, aten.detach.default, aten.view.default,
               aten._unsafe_view.default, aten.reshape.default, aten.t.default, aten.transpose.int,
               aten.permute.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
               aten.expand.default, aten.slice.Tensor, aten.select.int, aten._to_copy.default, aten.lift_fresh.default,
               aten.lift_fresh_copy.default, aten._reshape_alias.default, aten.expand_copy.default,
               aten.squeeze.default, torch.ops.prims.convert_element_type.default}


def _passed_on(node, index):
    """The input (placeholder position) whose values `node` only passes on, through clones and
    views, else None."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _PASSING_ON:
        node = node.args[0]
    return index.get(node) if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None


def _view_of_input(node, index, written):
    """(input position, the chain of views from it to `node`: (view node, the item taken of its
    results or None)) where `node` is a chain of views (ops whose results alias their first
    argument, with no other node among their arguments; split's and unbind's items too) of an
    input, or of the value the graph writes into an input (`written`: that value's node -> the
    input's position; the chain is made after the write), else None."""
    chain = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        item = None
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            node, item = node.args[0], node.args[1]
        if not (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and
                node.target.is_view and not any(isinstance(a, torch.fx.Node) for a in
                                                torch.utils._pytree.tree_leaves((node.args[1:], node.kwargs)))):
            if item is not None:
                return None
            break
        chain.append((node, item))
        node = node.args[0]
    if not chain or not isinstance(node, torch.fx.Node):
        return None
    k = index.get(node) if node.op == "placeholder" else written.get(node)
    return None if k is None else (k, chain[::-1])


class _Eager:
    """A graph lazyrt cannot take as a whole (a dtype lazyrt does not have, such as uint8 or
    complex): run in PyTorch eager, counted by the DynamoEagerGraph counter."""

    def __init__(self, gm):
        self.gm = gm

    def __call__(self, args):
        _C._metrics._increment("DynamoEagerGraph", 1)
        return list(self.gm(*args))


class _Compiled:
    """What the backend's compiler returns for one aten graph: a boxed callable (AOT's calling
    convention: one list of the graph's inputs, which the call empties, in; the list of its
    outputs out) running it as a compiled lazyrt step."""

    def __init__(self, gm, what):
        # An attribute of the object, not the class: Dynamo's disable() wrapper around the
        # backward keeps the wrapped callable's __dict__, where AOT looks for it.
        self._boxed_call = True
        self.gm = gm
        self.what = what
        self.dynamic = _has_symbolic_shapes(gm)
        self.static = None if self.dynamic else self._lower(gm)
        self.variants = {}  # dynamic graphs: concrete shapes -> _Static

    def _specialize(self, args):
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else (type(a), a) for a in args)
        s = self.variants.get(key)
        if s is None:
            from torch.fx.experimental.proxy_tensor import make_fx
            interpreter = torch.fx.Interpreter(self.gm)

            def run(*xs):
                return interpreter.run(*xs)

            static_gm = make_fx(run, tracing_mode="fake")(*args)
            s = self.variants[key] = self._lower(static_gm)
            if isinstance(s, _Static):
                s.mark_dynamic(self._symbolic_dims())
        return s

    def _symbolic_dims(self):
        """Per input of the symbolic graph, the dims Dynamo made symbolic: lazyrt marks them
        (maybe_mark_dynamic) in each specialization, whose compiled steps then share one
        executable per bucket of sizes."""
        dims = []
        for p in self.gm.graph.nodes:
            if p.op != "placeholder":
                continue
            v = p.meta.get("val")
            dims.append([d for d, n in enumerate(v.shape) if isinstance(n, torch.SymInt)]
                        if isinstance(v, torch.Tensor) else [])
        return dims

    def _lower(self, gm):
        try:
            return _Static(gm, self.what)
        except UnsupportedOperatorError as e:
            warnings.warn(f"lazyrt.torch: torch.compile's {self.what} graph runs in PyTorch eager: {e}",
                          GraphBreakWarning, stacklevel=2)
            return _Eager(gm)

    def __call__(self, args):
        s = self.static if not self.dynamic else self._specialize(args)
        results = s(args)
        args.clear()
        return results


def _compiler(what):
    def compile_graph(gm, example_inputs):
        return _Compiled(gm, what)
    compile_graph.__name__ = f"lazyrt_{what}_compiler"
    return compile_graph


# ---- decompositions ---------------------------------------------------------------------------

def _attention_scores(query, key, is_causal, attn_mask, scale):
    """The scaled, masked attention scores of the CPU flash-attention op, in float32 or wider
    (the op's logsumexp is float32)."""
    dtype = torch.promote_types(query.dtype, torch.float32)
    q, k = query.to(dtype), key.to(dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        L, S = scores.shape[-2], scores.shape[-1]
        keep = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask.to(dtype)
    return scores, scale


def _flash_attention_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """aten._scaled_dot_product_flash_attention_for_cpu as attention in plain ops: (output,
    logsumexp over the keys). PyTorch's own decomposition of it returns the attention weights
    in logsumexp's place, meant for inference; its backward reads the real logsumexp."""
    if dropout_p != 0.0:
        return NotImplemented
    scores, _ = _attention_scores(query, key, is_causal, attn_mask, scale)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    out = torch.matmul(probs.to(value.dtype), value)
    # The op's layout: (N, L, H, E) memory seen as (N, H, L, E).
    out = out.transpose(1, 2).contiguous().transpose(1, 2)
    # logsumexp in the kernel's accumulation type: float32 for half types and float32, float64
    # for float64 (rounded to float32, a float64 step's backward lost half its digits)
    return out, lse.to(torch.promote_types(query.dtype, torch.float32))


def _flash_attention_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                                  attn_mask=None, scale=None):
    """Its backward from the saved output and logsumexp: P = exp(S - lse); dV = P^T dO;
    dS = P * (dO V^T - rowsum(dO * O)); dQ = scale dS K; dK = scale dS^T Q."""
    if dropout_p != 0.0:
        return NotImplemented
    scores, scale = _attention_scores(query, key, is_causal, attn_mask, scale)
    dtype = scores.dtype
    probs = torch.exp(scores - logsumexp.to(dtype).unsqueeze(-1))
    g, v, o = grad_out.to(dtype), value.to(dtype), out.to(dtype)
    grad_value = torch.matmul(probs.transpose(-2, -1), g)
    grad_probs = torch.matmul(g, v.transpose(-2, -1))
    grad_scores = probs * (grad_probs - (g * o).sum(dim=-1, keepdim=True))
    grad_query = torch.matmul(grad_scores, key.to(dtype)) * scale
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), query.to(dtype)) * scale
    return grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype)


def _squeeze_dims(x, dims):
    """aten.squeeze.dims as a view (the dims of size 1 among `dims` dropped)."""
    drop = {d % max(x.dim(), 1) for d in dims}
    return aten.view.default(x, [s for d, s in enumerate(x.shape) if not (d in drop and s == 1)])


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """aten.var_mean.correction as its var and mean."""
    dims = list(range(x.dim())) if dim is None else dim
    return (aten.var.correction(x, dim, correction=correction, keepdim=keepdim),
            aten.mean.dim(x, dims, keepdim))


# The per-tensor function of each foreach op (torch.optim's foreach=True implementations), by
# the op's name without "_foreach_"; maximum and minimum with a number take clamp's form.
_FOREACH = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "addcdiv": lambda x, a, b, value=1: torch.addcdiv(x, a, b, value=value),
    "addcmul": lambda x, a, b, value=1: torch.addcmul(x, a, b, value=value), "lerp": torch.lerp,
    "maximum": lambda a, b: torch.clamp_min(a, b) if not isinstance(b, torch.Tensor) else torch.maximum(a, b),
    "minimum": lambda a, b: torch.clamp_max(a, b) if not isinstance(b, torch.Tensor) else torch.minimum(a, b),
    "clamp_min": torch.clamp_min, "clamp_max": torch.clamp_max,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "neg": torch.neg, "abs": torch.abs, "exp": torch.exp,
    "log": torch.log, "reciprocal": torch.reciprocal, "sign": torch.sign, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "zero": torch.zeros_like,
    "norm": lambda x, ord=2, dtype=None: torch.linalg.vector_norm(x, ord, dtype=dtype),
}


def _foreach(fn):
    """A foreach op as its per-tensor op on each element: its list arguments (of tensors or of
    numbers) taken element by element, the others as they are."""
    def decompose(*args, **kwargs):
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        return [fn(*[a[i] if isinstance(a, (list, tuple)) else a for a in args], **kwargs) for i in range(n)]
    return decompose


def _foreach_decompositions():
    table = {}
    for name, fn in _FOREACH.items():
        packet = getattr(aten, "_foreach_" + name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            # Not the out= forms, nor a tensor of per-element scalars (addcdiv.Tensor).
            if overload.endswith("out") or (overload == "Tensor" and name in ("addcdiv", "addcmul")):
                continue
            table[getattr(packet, overload)] = _foreach(fn)
    return table


def _isnan(x):
    """aten.isnan (max's and min's backward) as x != x."""
    return aten.ne.Tensor(x, x)


_DECOMPOSITIONS = None


def decompositions():
    """The decomposition table given to AOTAutograd: PyTorch's core aten decompositions of the
    ops lazyrt.torch does not lower itself, its batch norm and dropout decompositions (the
    running statistics as plain in-place updates, dropout as a mask), CPU flash attention,
    forward and backward, as plain ops (`_flash_attention_cpu`), and the ops batch norm's
    decomposition uses as ops lazyrt.torch lowers (``squeeze.dims``, ``var_mean``), ``isnan``
    (in max's backward) as ``x != x``; foreach ops
    (torch.optim's ``foreach=True``) as their per-tensor ops (`_foreach`)."""
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        from torch._decomp import core_aten_decompositions, get_decompositions
        table = dict(core_aten_decompositions())
        table.update(get_decompositions([
            aten.native_batch_norm, aten.native_batch_norm_backward, aten._native_batch_norm_legit,
            aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
            aten.native_dropout, aten.native_dropout_backward]))
        table[aten._scaled_dot_product_flash_attention_for_cpu.default] = _flash_attention_cpu
        table[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = _flash_attention_cpu_backward
        table[aten.squeeze.dims] = _squeeze_dims
        table[aten.var_mean.correction] = _var_mean
        table[aten.isnan.default] = _isnan
        table.update(_foreach_decompositions())
        _DECOMPOSITIONS = {op: fn for op, fn in table.items() if op not in LOWERINGS}
    return _DECOMPOSITIONS


def lazyrt_backend(gm, example_inputs, **kwargs):
    """The ``"lazyrt"`` Dynamo backend: AOTAutograd with lazyrt forward, backward and inference
    compilers (see the module docstring)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    # The partitioner Inductor and aot_eager use: AOT's default one fails on a joint graph that
    # computes with a symbolic float (a Python float Dynamo made an input after it changed).
    backend = aot_autograd(fw_compiler=_compiler("forward"), bw_compiler=_compiler("backward"),
                           inference_compiler=_compiler("inference"), decompositions=decompositions(),
                           partition_fn=min_cut_rematerialization_partition, keep_inference_input_mutations=True)
    return backend(gm, example_inputs, **kwargs)


def register():
    """Registers the backend with Dynamo under the name ``"lazyrt"`` (once). Where Dynamo already
    found the installed package's ``torch_dynamo_backends`` entry point, it registers the backend
    itself when it loads it (this import may be that load): nothing is registered here then."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend
    if BACKEND_NAME not in _COMPILER_FNS and _BACKENDS.get(BACKEND_NAME) is None:
        register_backend(lazyrt_backend, name=BACKEND_NAME)


_REGISTRY = "torch._dynamo.backends.registry"


class _RegisterWhenImported(importlib.abc.MetaPathFinder):
    """Registers the backend right after Dynamo's backend registry is imported. Importing
    torch._dynamo costs about a second, which ``import lazyrt.torch`` does not pay: torch.compile
    imports it on its first call, and the backend is registered then."""

    def find_spec(self, name, path, target=None):
        if name != _REGISTRY:
            return None
        sys.meta_path.remove(self)  # once; the other finders find the module itself
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            register()

        spec.loader.exec_module = exec_and_register
        return spec


if _REGISTRY in sys.modules:
    register()
elif not any(isinstance(f, _RegisterWhenImported) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenImported())
