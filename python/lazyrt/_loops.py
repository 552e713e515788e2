"""while_loop, fori_loop and scan over pytrees: nested tuples (namedtuples included), lists and
dicts of tensors (None is an empty tree), with Python numbers as carries too.

The compiled loops (lazyrt._C.while_loop / fori_loop / scan) carry flat lists of tensors. These
wrappers flatten the caller's structure into it and rebuild the structure for the body, the
condition and the result. A Python number becomes a 0-d tensor (int -> int64, float ->
float32, bool -> bool), as torch's while_loop makes its carries tensors.

A body result has the carry's structure and kinds, as in JAX and torch's while_loop: a tuple
where the carry has a tuple (a namedtuple where it has that namedtuple, a list where it has a
list), a dict with the same keys, a tensor of the same shape and dtype, or a Python number of
the carry's kind (a bool for a bool carry, an int for an integer one, a float for a floating
one; it takes the carry's dtype). Anything else is a lazyrt.Error naming the leaf, raised while
the body is traced, so nothing has changed: ``carry[1]['h']: f32[4, 1] vs f32[4] (the
carry's)``, ``carry[0]: a Python float vs i64[] (the carry's)``. A float is not rounded into
an integer carry, nor an int into a bool one, and an int outside an integer carry's range is
refused rather than wrapped. (while_loop's carries are its arguments: at the top its body may
return them as a tuple or a list.)
"""

from lazyrt import _C
from lazyrt._C import Tensor

__all__ = ["while_loop", "fori_loop", "scan", "scan_layers"]

_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
          "int64": "i64", "bool": "b8"}


def _type_str(t):
    name = str(t.dtype).split(".")[-1]
    return f"{_SHORT.get(name, name)}[{', '.join(str(d) for d in t.shape)}]"


_INT_RANGE = {"int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 63, 2 ** 63 - 1)}


def _number_kind(value):
    return "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"


def _dtype_kind(dtype):
    return "bool" if dtype == _C.bool else "float" if dtype.is_floating_point else "int"


def _check_int_range(value, dtype, path, op):
    low, high = _INT_RANGE.get(str(dtype).split(".")[-1], (None, None))
    if low is not None and not low <= value <= high:
        raise _C.Error(f"{op}: {path}: the Python int {value} does not fit in {_SHORT[str(dtype).split('.')[-1]]}")


def _leaf_tensor(value, path, op):
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (bool, int, float)):
        if _number_kind(value) == "int":
            _check_int_range(value, _C.int64, path, op)
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


def _is_namedtuple(kind):
    return issubclass(kind, tuple) and hasattr(kind, "_fields")


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
    items = [_unflatten(s, leaves, pos) for s in children]
    # A namedtuple takes its fields as arguments; tuple, list and other sequences an iterable.
    return kind(*items) if _is_namedtuple(kind) else kind(items)


def _flatten_like(spec, tree, init, path, op, out):
    """The leaves of a body result, checked against the carry's structure, kinds, shapes and
    dtypes (see the module docstring); a mismatch is a lazyrt.Error naming the leaf."""
    if spec is None:
        want = init[len(out)]
        if isinstance(tree, (bool, int, float)) and not isinstance(tree, Tensor):
            if want.dim() != 0:
                raise _C.Error(f"{op}: {path}: a number vs {_type_str(want)} (the carry's)")
            kind = _number_kind(tree)
            if kind != _dtype_kind(want.dtype):
                raise _C.Error(f"{op}: {path}: a Python {kind} vs {_type_str(want)} (the carry's)")
            if kind == "int":
                _check_int_range(tree, want.dtype, path, op)
            out.append(_C.scalar_tensor(tree, dtype=want.dtype))
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
    if type(tree) is not kind:
        raise _C.Error(f"{op}: {path}: a {type(tree).__name__} vs a {kind.__name__} of {len(children)} "
                       "(the carry's)")
    if len(tree) != len(children):
        raise _C.Error(f"{op}: {path}: {len(tree)} values vs {len(children)} values (the carry's)")
    for i, s in enumerate(children):
        _flatten_like(s, tree[i], init, f"{path}[{i}]", op, out)


def _carries_returned(r, args, spec):
    """while_loop's body result as the tuple of its carries: the body returns its arguments'
    new values as a tuple or a list, or the lone value when there is one carry."""
    if len(args) == 1:
        # One carry: r is that carry, or a 1-tuple (1-list) of it. A carry that is itself a plain
        # 1-tuple or 1-list is told apart by what r holds.
        one = spec[1][0]
        wrapped = type(r) in (tuple, list) and len(r) == 1
        if wrapped and one is not None and one[0] is type(r) and len(one[1]) == 1 and type(r[0]) is not type(r):
            wrapped = False
        return tuple(r) if wrapped else (r,)
    return tuple(r) if isinstance(r, (tuple, list)) else r


def while_loop(cond_fn, body_fn, carried_inputs, snapshots=0):
    """Runs ``body_fn(*carry)`` while ``cond_fn(*carry)`` is true, as one loop node: the body is
    traced and compiled once, whatever the trip count (torch's and PyTorch/XLA's signature).

    carried_inputs: a tuple (or list) whose items are passed as separate arguments, each a
    tensor, a Python number, or a nested tuple (namedtuple), list or dict of them; a lone tensor
    or number is one carry. body_fn returns the new carries, as a tuple or a list (a lone value
    when there is one carry), each of its carry's structure and kinds (see the module
    docstring). Returns the final carries as a tuple.

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
        r = _carries_returned(body_fn(*_unflatten(spec, flat)), args, spec)
        out = []
        _flatten_like(spec, r, init, "carry", "while_loop: body_fn result", out)
        return tuple(out)

    return _unflatten(spec, _C.while_loop(cond, body, tuple(init), snapshots))


def fori_loop(lower, upper, body_fn, init_val, snapshots=0):
    """``carry = body_fn(i, carry)`` for i in range(lower, upper), as one loop node (JAX's
    signature); i is an int64 0-d tensor. init_val is a tensor, a Python number, or a nested
    tuple (namedtuple), list or dict of them; body_fn gets and returns the carry in that
    structure and its kinds (see the module docstring), and so does the result (numbers come
    back as 0-d tensors). Differentiable; `snapshots` is the gradient's memory policy, as for
    scan."""
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

    init: the first carry, a tensor, Python number or nested tuple (namedtuple), list or dict of
    them. xs: a tensor or pytree of tensors, each with its rows along dim 0 (all the same number
    of rows); fn gets one row of each, in xs's structure. fn returns the new carry (init's
    structure, kinds, shapes and dtypes: see the module docstring) and y, a pytree of tensors
    (or None); the ys come back stacked on a new dim 0, in y's structure. reverse=True visits the rows from last to first (ys stay in row
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
