"""The interpreter: `LoweredGraph` walks the live nodes of an FX graph and runs each through
its lowering (table.LOWERINGS), checking the result against PyTorch's; an op without one (or
refused, table.REFUSALS) raises UnsupportedOperatorError or, where graph breaks are allowed,
runs in PyTorch eager between compiled pieces of the graph."""

import operator
import warnings

import torch
import torch.fx

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import (FRESH_IN_PLACE, LOWERINGS, REFUSALS, Expect, GraphBreakWarning, _KeepDtype,
                                       UnsupportedOperatorError, _cast, _is_tensor, lazy_dtype, op_name)

aten = torch.ops.aten

# The ops named by a GraphBreakWarning so far (each is warned once per process).
_WARNED_BREAKS = set()


def _view_copies():
    """functionalize writes views inside loop bodies as their copying forms (t_copy,
    view_copy, select_copy, ...): the same values, lowered as the views are."""
    for op in list(LOWERINGS):
        if not isinstance(op, torch._ops.OpOverload):
            continue
        packet = getattr(aten, op._schema.name.split("::")[1] + "_copy", None)
        overload = getattr(packet, op._overloadname, None) if packet is not None else None
        if overload is not None and overload not in LOWERINGS and torch.Tag.view_copy in overload.tags:
            LOWERINGS[overload] = LOWERINGS[op]


def live_nodes(graph, roots):
    """The nodes `roots` depend on, in graph order."""
    live = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    return [n for n in graph.nodes if n in live]


class LoweredGraph:
    """The part of an FX graph module that computes `roots`, ready to run on lazyrt tensors.

    Its inputs are one lazyrt tensor per placeholder (in graph order) followed by one per
    constant (`constants`: the torch tensors the graph's get_attr nodes hold — tensors the
    step read from outside its inputs, or made itself); calling it returns the lazyrt values of
    the roots. Constants are inputs rather than values frozen at capture, so a tensor the step
    reads from a closure and that changes in place between calls is read anew. Raises
    UnsupportedOperatorError at construction for an op without a lowering, unless
    `graph_breaks`: then such ops (`eager`) run in PyTorch eager, and `run` compiles the lowered
    pieces between them with lazyrt.compile_step.
    """

    def __init__(self, graph_module, roots, graph_breaks=False):
        self.graph_module = graph_module
        self.roots = list(roots)
        self.placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        self.nodes = live_nodes(graph_module.graph, self.roots)
        self.constants, self.constant_index = [], {}  # unique torch tensors; get_attr node -> index
        seen = {}
        missing = []
        why = {}  # op name -> why its node is not lowered, for ops lowered for some attributes only
        for n in self.nodes:
            if n.op == "call_function" and n.target not in LOWERINGS:
                missing.append(n)
            elif n.op == "call_function" and n.target in REFUSALS and REFUSALS[n.target](n):
                missing.append(n)
                why.setdefault(op_name(n.target), REFUSALS[n.target](n))
            elif n.op == "call_function" and n.target in FRESH_IN_PLACE:
                target = n.args[0]
                if not (isinstance(target, torch.fx.Node) and len(target.users) == 1 and
                        target.target in (aten.empty_like.default, aten.empty.memory_format)):
                    raise UnsupportedOperatorError(f"lazyrt.torch: {op_name(n.target)} (node '{n.name}') changes a "
                                                   "tensor that other ops read; only its functional form is lowered")
            elif n.op == "get_attr":
                value = getattr(graph_module, n.target)
                if isinstance(value, torch.fx.GraphModule):
                    continue  # a loop's body, read by its higher-order op's lowering
                if not isinstance(value, torch.Tensor):
                    raise UnsupportedOperatorError(f"lazyrt.torch: the graph reads a constant of type "
                                                   f"{type(value).__name__} ({n.target})")
                if value.dtype not in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bool):
                    raise UnsupportedOperatorError(f"lazyrt.torch: the step reads a tensor of dtype {value.dtype} "
                                                   f"from outside its inputs ({n.target})")
                if id(value) not in seen:
                    seen[id(value)] = len(self.constants)
                    self.constants.append(value)
                self.constant_index[n] = seen[id(value)]
            elif n.op in ("call_method", "call_module"):
                missing.append(n)
        if missing and (not graph_breaks or any(n.op != "call_function" for n in missing)):
            names = sorted({op_name(n.target) for n in missing})
            first = missing[0]
            raise UnsupportedOperatorError(
                f"lazyrt.torch: no lowering to lazyrt for "
                f"{', '.join(name + (f' ({why[name]})' if name in why else '') for name in names)} "
                f"(first use: node '{first.name}'"
                f"{_stack_hint(first)}); a graph break cannot run it here, so this cannot be compiled")
        self.expect = {n: Expect(n) for n in self.nodes if n.op == "call_function"}
        # Ops run by PyTorch eager: those without a lowering, and the items taken of their results.
        self.eager = set()
        missing_set = set(missing)
        for n in self.nodes:
            if n in missing_set or (n.target is operator.getitem and n.args[0] in self.eager):
                self.eager.add(n)
        for name in sorted({op_name(n.target) for n in missing} - _WARNED_BREAKS):
            _WARNED_BREAKS.add(name)
            first = next(n for n in missing if op_name(n.target) == name)
            reason = f" ({why[name]})" if name in why else ""
            warnings.warn(f"lazyrt.torch: graph break: {name}{reason} has no lowering to lazyrt and runs in PyTorch "
                          f"eager between compiled pieces of the step (node '{first.name}'{_stack_hint(first)})",
                          GraphBreakWarning, stacklevel=2)
        self.pieces = _pieces(self.nodes, self.eager, self.roots) if self.eager else None
        self.compiled = []  # per lowered piece: its lazyrt.compile_step, made by the first run

    def _inputs_env(self, inputs):
        count = len(self.placeholders) + len(self.constants)
        if len(inputs) != count:
            raise TypeError(f"LoweredGraph: expected {count} inputs, got {len(inputs)}")
        env = dict(zip(self.placeholders, inputs))
        for n, k in self.constant_index.items():
            env[n] = inputs[len(self.placeholders) + k]
        for n in self.nodes:
            if _subgraph(n) is not None:
                env[n] = _subgraph(n)
        return env

    def __call__(self, *inputs):
        """The roots' values, every op interpreted now (eager ones through torch)."""
        env = self._inputs_env(inputs)
        torch_env = {}
        for n in self.nodes:
            if n in env:
                continue
            if n in self.eager:
                _run_eager(n, self.expect[n], env, torch_env)
            else:
                _lower_node(n, self.expect[n], env)
        return [env[r] for r in self.roots]

    def run(self, inputs):
        """The roots' values: the whole graph as one lazyrt.compile_step or, with graph breaks,
        each lowered piece as its own compile_step and the eager ops between them in torch."""
        if self.pieces is None:
            if not self.compiled:
                self.compiled.append(lazyrt.compile_step(self, list(inputs), guard_reads=False))
            outs = self.compiled[0](*inputs)
            return [outs] if isinstance(outs, lazyrt.Tensor) else list(outs)
        env = self._inputs_env(inputs)
        torch_env = {}
        k = 0

        def lazy_value(n):  # an eager op's result is made a lazyrt tensor where a piece reads it
            v = env.get(n, _MISSING)
            if v is _MISSING:
                v = env[n] = lazyrt.from_torch(torch_env[n].contiguous())
            return v
        for kind, nodes, needs, gives in self.pieces:
            if kind == "eager":
                for n in nodes:
                    _run_eager(n, self.expect[n], env, torch_env, convert=False)
                _C._metrics._increment("GraphBreak", sum(n.target is not operator.getitem for n in nodes))
                continue
            args = [lazy_value(n) for n in needs]
            if k == len(self.compiled):
                self.compiled.append(lazyrt.compile_step(_Piece(nodes, needs, gives, self.expect), args, guard_reads=False))
            outs = self.compiled[k](*args)
            k += 1
            env.update(zip(gives, [outs] if isinstance(outs, lazyrt.Tensor) else outs))
        return [lazy_value(r) if isinstance(r, torch.fx.Node) else r for r in self.roots]

    @property
    def traces(self):
        """How many times lazyrt traced the compiled pieces."""
        return sum(c.traces for c in self.compiled)


def _subgraph(node):
    """The graph module a get_attr node names (a higher-order op's body), else None."""
    if node.op != "get_attr":
        return None
    value = getattr(node.graph.owning_module, node.target, None)
    return value if isinstance(value, torch.fx.GraphModule) else None


def _lower_node(n, e, env):
    def value(a):
        return env[a] if a in env or _subgraph(a) is None else _subgraph(a)
    args = torch.fx.node.map_arg(n.args, value)
    kwargs = dict(torch.fx.node.map_arg(n.kwargs, value))
    kwargs.pop("device", None)
    try:
        result = LOWERINGS[n.target](e, *args, **kwargs)
    except UnsupportedOperatorError:
        raise
    except Exception as exc:
        raise lazyrt.Error(f"lazyrt.torch: lowering {op_name(n.target)} (node '{n.name}') failed: "
                           f"{type(exc).__name__}: {exc}") from exc
    env[n] = _checked(n, e, result)


_MISSING = object()


def _run_eager(n, e, env, torch_env, convert=True):
    """Runs node n in PyTorch eager on the torch values of its inputs (a graph break). Its
    result goes to torch_env and, with convert, to env as a lazyrt tensor (else the caller
    converts it where a lowered op reads it)."""
    def torch_value(a):
        v = torch_env.get(a, _MISSING)
        if v is _MISSING:
            v = env[a]
            v = torch_env[a] = _traced_layout(lazyrt.to_torch(v), a) if _is_tensor(v) else v
        return v

    args = torch.fx.node.map_arg(n.args, torch_value)
    kwargs = torch.fx.node.map_arg(n.kwargs, torch_value)
    try:
        with torch.no_grad():
            result = n.target(*args, **kwargs)
    except Exception as exc:
        raise lazyrt.Error(f"lazyrt.torch: {op_name(n.target)} (node '{n.name}'), run in PyTorch eager at a graph "
                           f"break, failed: {type(exc).__name__}: {exc}") from exc
    torch_env[n] = result
    if isinstance(result, torch.Tensor):
        if e.shape is not None and (tuple(result.shape) != e.shape or lazy_dtype(result.dtype) is not e.dtype):
            raise lazyrt.Error(f"lazyrt.torch: {op_name(n.target)} (node '{n.name}') gave {result.dtype}"
                               f"{list(result.shape)} in eager, the captured graph has {list(e.shape)}")
        if convert:
            env[n] = lazyrt.from_torch(result.contiguous())
    else:
        env[n] = result  # a tuple: its items are taken by eager getitem nodes


def _traced_layout(t, node):
    """`t` laid out in memory as the traced value of `node` was: an op run at a graph break sees the
    strides it saw while the step was traced. Some ops' results depend on them, not only on the
    values (linalg_det factors the transpose of a contiguous matrix, and the captured backward
    solves with that factorization), so an input that arrives contiguous where the trace had a
    view would make the eager op disagree with the rest of the graph."""
    stride = node.meta.get("lazyrt_stride", _MISSING)
    if stride is _MISSING:  # the traced value's shape and strides, read once per node
        val = node.meta.get("val")
        stride = node.meta["lazyrt_stride"] = (
            (tuple(val.shape), tuple(int(s) for s in val.stride())) if isinstance(val, torch.Tensor) else None)
    if stride is None or t.shape != stride[0] or t.numel() <= 1:
        return t
    stride = stride[1]
    if t.stride() == stride:
        return t
    shape = tuple(int(s) for s in t.shape)
    # Expanded dims (stride 0) are filled once and expanded again.
    small = [1 if st == 0 else s for s, st in zip(shape, stride)]
    src = t
    for d, (s, st) in enumerate(zip(shape, stride)):
        if st == 0 and s > 1:
            src = src.narrow(d, 0, 1)
    reach = 0  # the furthest element the dims of smaller strides reach
    for st, s in sorted((st, s) for s, st in zip(small, stride) if s > 1):
        if st <= reach:
            return t  # overlapping windows (unfold) cannot be written one element per place
        reach += (s - 1) * st
    out = torch.empty(reach + 1, dtype=t.dtype).as_strided(small, stride)
    out.copy_(src)
    return out.expand(shape)


class _Piece:
    """Lowered nodes between graph breaks, as a function of the values they read from outside
    (`needs`) returning those that later pieces or the roots read (`gives`)."""

    def __init__(self, nodes, needs, gives, expect):
        self.nodes, self.needs, self.gives, self.expect = nodes, needs, gives, expect

    def __call__(self, *values):
        env = dict(zip(self.needs, values))
        for n in self.nodes:
            _lower_node(n, self.expect[n], env)
        # A compiled step returns what it computes: a value the piece only passes on (an input,
        # or the detach of one, such as statistics an eager op saved for its backward) leaves
        # through an identity op (x * 1 keeps every value's bits; x | x for bool).
        return [_computed(env[n]) for n in self.gives]


def _computed(v):
    if not _is_tensor(v) or v.is_pending():
        return v
    return v | v if v.dtype == _C.bool else v * 1


def _pieces(nodes, eager, roots):
    """The live call nodes in runs of lowered and eager ones: [(kind, nodes, needs, gives)].
    Items taken of a multi-result op (getitem) go right after it, so no list crosses pieces."""
    items = {}
    for n in nodes:
        if n.target is operator.getitem and n.op == "call_function":
            items.setdefault(n.args[0], []).append(n)
    order = []
    for n in nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        order.append(n)
        order.extend(items.get(n, []))
    runs = []
    for n in order:
        kind = "eager" if n in eager else "lazy"
        if not runs or runs[-1][0] != kind:
            runs.append((kind, []))
        runs[-1][1].append(n)
    piece_of = {n: k for k, (_, run) in enumerate(runs) for n in run}
    root_set = set(roots)
    pieces = []
    for k, (kind, run) in enumerate(runs):
        inside = set(run)
        needs = []
        for n in run:
            for a in n.all_input_nodes:
                if a not in inside and a not in needs and _subgraph(a) is None:
                    needs.append(a)
        gives = [n for n in run if n in root_set or any(piece_of.get(u, k) != k for u in n.users)]
        pieces.append((kind, run, needs, gives))
    return pieces


def _checked(node, e, result):
    """The result in PyTorch's dtype (or its own, see _KeepDtype), after checking its shape
    against PyTorch's."""
    keep = isinstance(result, _KeepDtype)
    if keep:
        result = result.value
    if not _is_tensor(result) or e.shape is None:
        return result
    if tuple(result.shape) != e.shape:
        raise lazyrt.Error(f"lazyrt.torch: lowering {op_name(node.target)} (node '{node.name}') gave shape "
                           f"{list(result.shape)}, PyTorch's is {list(e.shape)}")
    return result if keep else _cast(result, e.dtype)


def _stack_hint(node):
    trace = node.meta.get("stack_trace")
    if not trace:
        return ""
    last = [line.strip() for line in trace.strip().splitlines() if line.strip()][-2:]
    return "; from " + " / ".join(last)
