"""while_loop, fori_loop and scan over pytrees: nested tuples, lists and dicts of tensors (None
is an empty tree), with Python numbers as carries too.

The compiled loops (lazyrt._C.while_loop / fori_loop / scan) carry flat lists of tensors. These
wrappers flatten the caller's structure into it and rebuild the structure for the body, the
condition and the result. A Python number becomes a 0-d tensor (int -> int64, float ->
float32, bool -> bool), as torch's while_loop makes its carries tensors; a number the body
returns takes the dtype of the carry it stands for. A body result whose structure, shape or
dtype differs from the carry's is a lazyrt.Error naming the leaf: ``carry[1]['h']: f32[4] vs
f32[4, 1]``.
"""

from lazyrt import _C
from lazyrt._C import Tensor

__all__ = ["while_loop", "fori_loop", "scan", "scan_layers"]

_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
          "int64": "i64", "bool": "b8"}


def _type_str(t):
    name = str(t.dtype).split(".")[-1]
    return f"{_SHORT.get(name, name)}[{', '.join(str(d) for d in t.shape)}]"


def _leaf_tensor(value, path, op):
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (bool, int, float)):
        return _C.scalar_tensor(value, dtype=_C.bool if isinstance(value, bool)
                                else _C.int64 if isinstance(value, int) else _C.float32)
    raise _C.Error(f"{op}: {path} is a {type(value).__name__}; carries are tensors, Python numbers, "
                   "or tuples, lists and dicts of them")


def _flatten(tree, path, op, out):
    """Appends the leaves of `tree` to `out` (as tensors); returns its structure."""
    if tree is None:
        return (type(None), [])
    if isinstance(tree, (tuple, list)):
        return (type(tree), [_flatten(v, f"{path}[{i}]", op, out) for i, v in enumerate(tree)])
    if isinstance(tree, dict):
        return (dict, [(k, _flatten(tree[k], f"{path}[{k!r}]", op, out)) for k in tree])
    out.append(_leaf_tensor(tree, path, op))
    return None


def _unflatten(spec, leaves, pos=None):
    pos = pos if pos is not None else [0]
    if spec is None:
        leaf = leaves[pos[0]]
        pos[0] += 1
        return leaf
    kind, children = spec
    if kind is type(None):
        return None
    if kind is dict:
        return {k: _unflatten(s, leaves, pos) for k, s in children}
    return kind(_unflatten(s, leaves, pos) for s in children)


def _flatten_like(spec, tree, init, path, op, out):
    """The leaves of a body result, checked against the carry's structure, shapes and dtypes."""
    if spec is None:
        want = init[len(out)]
        if isinstance(tree, (bool, int, float)) and not isinstance(tree, Tensor):
            out.append(_C.scalar_tensor(tree, dtype=want.dtype))
            if want.dim() != 0:
                raise _C.Error(f"{op}: {path}: a number vs {_type_str(want)}")
            return
        got = _leaf_tensor(tree, path, op)
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            raise _C.Error(f"{op}: {path}: {_type_str(got)} vs {_type_str(want)} (the carry's)")
        out.append(got)
        return
    kind, children = spec
    if kind is type(None):
        if tree is not None:
            raise _C.Error(f"{op}: {path}: a {type(tree).__name__} vs None (the carry's)")
        return
    if kind is dict:
        if not isinstance(tree, dict) or set(tree) != {k for k, _ in children}:
            raise _C.Error(f"{op}: {path}: a {type(tree).__name__} with keys "
                           f"{sorted(tree) if isinstance(tree, dict) else '-'} vs a dict with keys "
                           f"{sorted(k for k, _ in children)} (the carry's)")
        for k, s in children:
            _flatten_like(s, tree[k], init, f"{path}[{k!r}]", op, out)
        return
    if not isinstance(tree, (tuple, list)) or len(tree) != len(children):
        n = len(tree) if isinstance(tree, (tuple, list)) else None
        raise _C.Error(f"{op}: {path}: {'a ' + type(tree).__name__ if n is None else f'{n} values'} vs "
                       f"{len(children)} values (the carry's)")
    for i, s in enumerate(children):
        _flatten_like(s, tree[i], init, f"{path}[{i}]", op, out)


def while_loop(cond_fn, body_fn, carried_inputs, snapshots=0):
    """Runs ``body_fn(*carry)`` while ``cond_fn(*carry)`` is true, as one loop node: the body is
    traced and compiled once, whatever the trip count (torch's and PyTorch/XLA's signature).

    carried_inputs: a tuple (or list) whose items are passed as separate arguments, each a
    tensor, a Python number, or a nested tuple, list or dict of them; a lone tensor or number
    is one carry. body_fn returns the new carry in the same structure (a lone value when there
    is one carry). Returns the final carry as a tuple of that structure.

    Differentiable, whatever the trip count: the loop counts its trips as it runs and the
    backward runs over them, so one compiled graph serves every count. ``snapshots`` is the
    gradient's memory policy, as for scan: 0 keeps the carry each trip starts from (held while
    the backward runs), s >= 1 keeps at most s and rebuilds the others.
    """
    args = tuple(carried_inputs) if isinstance(carried_inputs, (tuple, list)) else (carried_inputs,)
    init = []
    spec = _flatten(args, "carry", "while_loop", init)

    def cond(*flat):
        return cond_fn(*_unflatten(spec, flat))

    def body(*flat):
        r = body_fn(*_unflatten(spec, flat))
        if len(args) == 1 and not (isinstance(r, (tuple, list)) and len(r) == 1):
            r = (r,)
        out = []
        _flatten_like(spec, tuple(r) if isinstance(r, list) else r, init, "carry", "while_loop: body_fn result",
                      out)
        return tuple(out)

    return _unflatten(spec, _C.while_loop(cond, body, tuple(init), snapshots))


def fori_loop(lower, upper, body_fn, init_val, snapshots=0):
    """``carry = body_fn(i, carry)`` for i in range(lower, upper), as one loop node (JAX's
    signature); i is an int64 0-d tensor. init_val is a tensor, a Python number, or a nested
    tuple, list or dict of them; body_fn gets and returns the carry in that structure, and so
    does the result (numbers come back as 0-d tensors). Differentiable; `snapshots` is the
    gradient's memory policy, as for scan."""
    init = []
    spec = _flatten(init_val, "carry", "fori_loop", init)

    def body(i, flat):
        flat = (flat,) if isinstance(flat, Tensor) else flat
        r = body_fn(i, _unflatten(spec, flat))
        out = []
        _flatten_like(spec, r, init, "carry", "fori_loop: body_fn result", out)
        return tuple(out)

    return _unflatten(spec, _C.fori_loop(lower, upper, body, tuple(init), snapshots))


def scan(fn, init, xs, reverse=False, length=None, snapshots=0):
    """``(carry, ys) = scan(fn, init, xs)``: ``carry, y = fn(carry, x)`` for each row x of xs,
    as one scan node traced and compiled once (PyTorch/XLA's and JAX's scan).

    init: the first carry, a tensor, Python number or nested tuple, list or dict of them. xs: a
    tensor or pytree of tensors, each with its rows along dim 0 (all the same number of rows);
    fn gets one row of each, in xs's structure. fn returns the new carry (init's structure,
    shapes and dtypes) and y, a pytree of tensors (or None); the ys come back stacked on a new
    dim 0, in y's structure. reverse=True visits the rows from last to first (ys stay in row
    order). xs may be None when `length` gives the number of calls (fn then gets None).

    Differentiable with respect to init, xs and the tensors fn reads from outside. snapshots is
    the gradient's memory policy: 0 keeps the carry each row starts from (fastest; memory grows
    with the length); s >= 1 keeps at most s carries and rebuilds the others by binomial
    checkpointing (memory independent of the length, r*N - C(s+r, s+1) extra evaluations of fn's
    graph, r the least with C(s+r, s) >= N; lazyrt.metrics counts them as
    CheckpointForwardSteps).
    """
    init_flat, xs_flat = [], []
    carry_spec = _flatten(init, "carry", "scan", init_flat)
    xs_spec = _flatten(xs, "xs", "scan", xs_flat)
    if xs is None and length is None:
        raise _C.Error("scan: xs is None, so length must be given")
    y_spec = [None]

    def body(carry, x):
        r = fn(_unflatten(carry_spec, carry), _unflatten(xs_spec, x))
        if not isinstance(r, (tuple, list)) or len(r) != 2:
            raise _C.Error(f"scan: fn must return a pair (carry, y), got a {type(r).__name__}")
        out, ys = [], []
        _flatten_like(carry_spec, r[0], init_flat, "carry", "scan: fn result", out)
        y_spec[0] = _flatten(r[1], "y", "scan: fn result", ys)
        return tuple(out), tuple(ys)

    carry, ys = _C.scan(body, tuple(init_flat), tuple(xs_flat), reverse, -1 if length is None else length,
                        snapshots)
    return _unflatten(carry_spec, carry), _unflatten(y_spec[0], ys)


def scan_layers(layers, input):
    """Runs ``input`` through ``layers`` in order, as one scan over their stacked parameters
    and buffers (PyTorch/XLA's scan_layers): the layer is traced and compiled once, whatever
    the depth. The layers must be modules of one class with the same parameter and buffer
    names, shapes and dtypes. Each layer takes the input and returns a value of its structure,
    shapes and dtypes: a tensor, or a tuple whose items it takes as separate arguments.
    """
    from lazyrt.nn.utils import functional_call
    layers = list(layers)
    if not layers:
        return input
    first = layers[0]
    names = [n for n, _ in first.named_parameters()] + [n for n, _ in first.named_buffers()]

    def state(layer):
        return dict(layer.named_parameters()) | dict(layer.named_buffers())

    states = [state(layer) for layer in layers]
    for i, (layer, st) in enumerate(zip(layers, states)):
        if type(layer) is not type(first) or sorted(st) != sorted(names):
            raise _C.Error(f"scan_layers: layer {i} is a {type(layer).__name__} with state "
                           f"{list(st)}, layer 0 a {type(first).__name__} with {names}")
        for n in names:
            if st[n].dtype != states[0][n].dtype or tuple(st[n].shape) != tuple(states[0][n].shape):
                raise _C.Error(f"scan_layers: layer {i}'s {n} is {_type_str(st[n])}, layer 0's "
                               f"{_type_str(states[0][n])}")
    stacked = {n: _C.stack([st[n] for st in states], 0) for n in names}

    def step(h, row):
        return functional_call(first, row, h if isinstance(h, tuple) else (h,)), None

    h, _ = scan(step, input, stacked)
    return h
