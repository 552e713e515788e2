"""Capture: one call of a PyTorch training step as a pure aten graph plus the list of what it
writes back.

**What a step touches** (`World`): the tensors of the modules and optimizers the step uses —
parameters, buffers, the parameters' ``.grad``, the optimizers' state — and the tensors among
its arguments. Each becomes an input *slot* of the captured graph, in a fixed order: argument
tensors, parameters, buffers, gradients, optimizer state, then one learning rate per parameter
group (a 0-d float64 tensor; see `_optim`).

**Two passes** (the recipe of PyTorch's distributed ``_spmd`` front end). Pass 1 runs the
user's step under ``make_fx`` over fake tensors (`_fake_trace`: nothing is computed and no real
tensor changes) with the modules'
parameters and buffers, the gradients and the optimizer state swapped for the graph's inputs:
forward, ``backward()``, ``step()`` and ``zero_grad()`` are recorded as aten ops, in-place ones
included. ``functionalize`` cannot wrap ``backward()`` itself, so pass 2 traces pass 1's graph
again under ``functionalize``: the result is a pure graph followed by one
``aten.copy_(input, new_value)`` per input that the step changed in place — the write-back list.
Gradients and state the step *replaced* (``p.grad = new``, a state entry created) are outputs
of the graph, found by comparing what the swapped-in objects hold after pass 1.

**One graph for the first step and the later ones.** A fresh model has ``.grad`` None and a
fresh optimizer has no state; after one step the state exists, and so do the gradients where
``zero_grad(set_to_none=False)`` keeps them as zeros (PyTorch 2's default sets them to None). Eager runs the same arithmetic either way (backward's first
accumulation into a missing gradient *is* the gradient; SGD/Adam/AdamW's state starts at
zeros), so a missing gradient is captured as a zero tensor and missing state as the optimizer's
initial state (`_optim.initial_state`), and one graph serves every step. That stand-in is
checked on the graph of pass 1, per tensor: a stand-in gradient must be left untouched or
first be written by backward's accumulation (``add_``) before anything reads it (zeroing it
first is fine), and stand-in state must belong to a parameter the optimizer actually updated.
Where a check fails, that tensor is captured as it really is (None, or no state) and the graph
only serves calls where it still is.
"""

import collections
import contextlib
import warnings

import torch
import torch.utils._pytree as pytree

from lazyrt.torch import _optim, _patch
from lazyrt.torch import _reads as _torch_reads  # noqa: F401  (registers PyTorch's objects for the walk)
from lazyrt._reads import Same, TensorReads, put, read_signature, tensors_in

aten = torch.ops.aten


class CaptureError(RuntimeError):
    """A step lazyrt.torch cannot capture (the message says why)."""


class EagerOnly(CaptureError):
    """A step no capture can replay, which runs in PyTorch eager instead: one that reads a
    tensor's value or makes a shape from values (`loss.item()`, `x[mask]`), LBFGS's step (how
    many evaluations and line-search steps it runs is decided by values)."""


def tracing():
    """PyTorch's tracing machinery, imported on first use (make_fx imports sympy and the symbolic
    shapes machinery, about a second): (make_fx, functionalize, FakeTensorMode, FakeTensor)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx, functionalize, FakeTensorMode, FakeTensor


def _fake_trace(fn, examples, constants_may_require_grad=False, positions=False):
    """make_fx of fn(examples) over fake tensors: nothing is computed.

    With `positions` (a loop body that indexes by its integer carry: ``x.select(0, it)``), the
    fake mode has a shape environment and make_fx traces symbolically: a value read from a
    0-d integer tensor becomes an unbacked integer symbol (an ``_local_scalar_dense`` node),
    which the lowering takes as a position read when the graph runs. The examples' shapes stay
    static either way.

    Real tensors that the traced code reads from outside its inputs (a loss module's class
    weights, a tensor in a closure, a scalar tensor PyTorch makes inside a composite op) are
    taken as fake tensors of the same metadata; make_fx records each as a constant of the graph
    (a get_attr node holding the real tensor), which the lowering reads anew on every call.
    Such a tensor that requires grad is refused (a parameter of no known module) unless
    `constants_may_require_grad` (loop bodies, which take their weights as values).
    """
    make_fx, _, FakeTensorMode, _ = tracing()

    # PyTorch's own fake mode class: higher-order ops such as while_loop have rules for it only.
    # Without a shape environment, a value read or a data-dependent shape fails the trace.
    shape_env = None
    if positions:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        shape_env = ShapeEnv()
    mode = FakeTensorMode(allow_fallback_kernels=True, allow_non_fake_inputs=True, shape_env=shape_env)
    # An example on the meta device stands for a CPU tensor of its metadata (a stand-in whose
    # values tracing never reads): no memory is made for it.
    cpu = torch.device("cpu")
    fakes = [mode.fake_tensor_converter.from_meta_and_device(mode, e, cpu) if e.is_meta
             else mode.from_tensor(e, static_shapes=True) if positions else mode.from_tensor(e) for e in examples]
    if not constants_may_require_grad:
        # A real tensor read while tracing is converted here: one that requires grad is refused
        # before backward could give it a gradient.
        convert = mode.fake_tensor_converter.from_real_tensor

        def checked(fake_mode, t, *args, **kwargs):
            if t.requires_grad:
                raise CaptureError(
                    f"lazyrt.torch: the step uses a tensor that requires grad (shape {list(t.shape)}) and "
                    "is no parameter of the modules it was given or found; pass its module as model=...")
            return convert(fake_mode, t, *args, **kwargs)
        mode.fake_tensor_converter.from_real_tensor = checked
    # Fused CPU kernels off while tracing, so that the graph holds the ops lazyrt lowers and
    # fuses itself: oneDNN's LSTM layer (mkldnn_rnn_layer, with a uint8 workspace) becomes its
    # cells' products and gates, and scaled_dot_product_attention's flash kernel (forward and
    # backward) its math: products, softmax, dropout.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with _patch.capturing(), mode, _loop_ops_traceable(), _onednn_off(), sdpa_kernel(SDPBackend.MATH), \
            _causal_hint_unread(), _cumulative_batch_norm_in_tensors(), warnings.catch_warnings():
        # torch's scan reads its fake operands' data pointers (PyTorch's own warning, not the step's)
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        return make_fx(fn, decomposition_table=_decompositions(),
                       tracing_mode="symbolic" if positions else "real")(fakes)


@contextlib.contextmanager
def _causal_hint_unread():
    """nn.TransformerEncoder and nn.Transformer compare a mask given without is_causal with a
    causal one (bool() of a tensor: a value read a captured step cannot make) to pick a faster
    kernel. While tracing, such a mask is taken as not known to be causal: the layers apply it
    as the mask it is, which gives the same values (the hint only swaps the mask for the
    attention's own causal masking)."""
    from torch.nn.modules import transformer

    def given_hint_only(mask, is_causal=None, size=None):
        return is_causal is True
    with _patch.patch(transformer, "_detect_is_causal_mask", given_hint_only):
        yield


@contextlib.contextmanager
def _cumulative_batch_norm_in_tensors():
    """Batch norm with momentum=None (a cumulative average of the batches' statistics) takes its
    factor as float(1 / num_batches_tracked): a value read a captured step cannot make, and a
    constant of the capture if it could. While tracing, that update is made with tensor ops
    (factor 1 / num_batches_tracked as a tensor, the batch's mean and unbiased variance), and
    the normalization with the batch's statistics: PyTorch's arithmetic, the counter a graph
    input like every buffer."""
    from torch.nn.modules.batchnorm import _BatchNorm

    forward = _BatchNorm.__dict__["forward"]

    def traced_forward(self, input):
        if self.momentum is not None or not (self.training and self.track_running_stats) or \
                self.num_batches_tracked is None or self.running_mean is None:
            return forward(self, input)
        self._check_input_dim(input)
        self.num_batches_tracked.add_(1)
        dims = [0] + list(range(2, input.dim()))
        with torch.no_grad():
            factor = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
            mean = input.detach().mean(dims)
            var = input.detach().var(dims, unbiased=True)
            self.running_mean.mul_(1 - factor).add_(factor * mean)
            self.running_var.mul_(1 - factor).add_(factor * var)
        return torch.nn.functional.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
    with _patch.patch(_BatchNorm, "forward", traced_forward):
        yield


@contextlib.contextmanager
def _onednn_off():
    """PyTorch's use of oneDNN off, and nothing else of its oneDNN settings changed
    (torch.backends.mkldnn.flags would also set its TF32 and precision options)."""
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


class _loop_ops_traceable:
    """While a step is traced: PyTorch's structured loop ops traced with a shape environment of
    their own (see _with_shape_env). Every other call is PyTorch's own."""

    def __enter__(self):
        self.saved = []
        # PyTorch's structured loops: their fake-tensor rules count trips with a size symbol of
        # a shape environment, which the trace has none of (it refuses data-dependent shapes):
        # each loop op is traced with one of its own.
        from torch._subclasses.fake_tensor import FakeTensorMode
        for hop in _LOOP_OPS:
            rule = hop.python_key_table.get(FakeTensorMode)
            if rule is not None:
                self.saved.append((hop.python_key_table, FakeTensorMode, rule))
                hop.python_key_table[FakeTensorMode] = _with_shape_env(rule)
        return self

    def __exit__(self, *exc):
        for where, name, original in reversed(self.saved):
            if isinstance(where, dict):
                where[name] = original
            else:
                setattr(where, name, original)


_LOOP_OPS = (torch.ops.higher_order.while_loop, torch.ops.higher_order.scan)


def _with_shape_env(rule):
    def traced(mode, *args, **kwargs):
        if mode.shape_env is not None:
            return rule(mode, *args, **kwargs)
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        mode.shape_env = ShapeEnv()
        try:
            return rule(mode, *args, **kwargs)
        finally:
            mode.shape_env = None
    return traced


_DECOMPOSED = None


def _decompositions():
    """PyTorch's own decompositions of the ops lazyrt.torch takes as compositions of the ops it
    lowers (batch norm, forward and backward: its running statistics become plain in-place
    updates, which functionalize turns into write-backs; dropout: a bernoulli mask; the Huber
    loss's backward and the smooth L1 loss's; pixel shuffles: views and a permutation; a
    device's fused LSTM and GRU cells), rather than lowering each."""
    global _DECOMPOSED
    if _DECOMPOSED is None:
        from torch._decomp import get_decompositions
        aten = torch.ops.aten
        _DECOMPOSED = get_decompositions([aten.native_batch_norm, aten.native_batch_norm_backward,
                                          aten.native_dropout, aten.native_dropout_backward,
                                          aten.huber_loss_backward.default, aten.smooth_l1_loss_backward.default,
                                          aten.pixel_shuffle, aten.pixel_unshuffle])
        _DECOMPOSED[aten.native_batch_norm.default] = _batch_norm_saving_float(
            _DECOMPOSED[aten.native_batch_norm.default])
        # LSTM and GRU cells as PyTorch steps them on a device (CUDA's fused cell ops, which the
        # lazyrt device's tensors get too), written with the ops of their math.
        from lazyrt.torch._device import RECURRENT_CELLS
        _DECOMPOSED.update(RECURRENT_CELLS)
    return _DECOMPOSED


_HALF = (torch.bfloat16, torch.float16)


def _batch_norm_saving_float(decomposition):
    """Batch norm of a bfloat16 or float16 input as ATen's CPU kernel computes it: statistics,
    normalization and the saved mean and inverse deviation in float32, the output rounded once.
    (PyTorch's decomposition rounds the saved statistics to the input's dtype, and the backward
    that reads them then no longer sums to zero over the batch: a gradient that is zero in exact
    arithmetic, a bias right before the norm, came out 80x eager's rounding noise under bf16
    autocast.)"""
    def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
        if input.dtype not in _HALF:
            return decomposition(input, weight, bias, running_mean, running_var, training, momentum, eps)

        def up(t):
            return t.float() if t is not None and t.dtype in _HALF else t
        out, save_mean, save_invstd = decomposition(up(input), up(weight), up(bias), running_mean, running_var,
                                                    training, momentum, eps)
        return out.to(input.dtype), save_mean, save_invstd
    return native_batch_norm


# ---- what a step touches -------------------------------------------------------------------

def _hashable(value):
    try:
        hash(value)
        return value
    except TypeError:
        return ("unhashable", type(value).__name__, repr(value))


def _keyed(a):
    """An argument that is no tensor, in a signature: an object that hashes by identity (a
    module, an optimizer) by identity, not held (`Same`); a value that hashes by value, itself."""
    if type(a).__hash__ is object.__hash__:
        return Same(a)
    return _hashable(a)


def _tensor_sig(t):
    return ("T", tuple(t.shape), t.dtype)


def _value_sig(v):
    return _tensor_sig(v) if isinstance(v, torch.Tensor) else ("C", _hashable(v))


class Facts(collections.namedtuple("Facts", "spec args modules submodules params buffers optimizers modes reads")):
    """What a capture made for one world depends on besides tensor values and learning rates
    (World.facts): the arguments' structure (spec) and leaves; the modules, and each submodule
    in walk order with its mode; the parameters (tensor, how many places hold it, its gradient's
    kind: World.grad_kind), the buffers (tensor, places); per optimizer (optimizer, whether its
    learning rates are inputs, its groups (group, its hyperparameters in order: the learning
    rate where it is no input), its states (group index, parameter index, kind: World.state_kind,
    the state dict or None)); the modes (grad, default dtype, CPU autocast: _autocast_mode); the
    Python values the step reads. Tensors' metadata is read from the tensors."""


class World:
    """The tensors one call of a step reads and writes, and the signature the call is guarded on.

    Built anew for every call (cheap: a walk over the modules and the optimizers' groups), so a
    replaced parameter, a changed ``.grad``, a new optimizer state entry or a changed
    hyperparameter shows up in the signature.
    """

    def __init__(self, modules, optimizers, args, kwargs, free=()):
        self.modules = modules
        self.optimizers = optimizers
        self.args_leaves, self.args_spec = pytree.tree_flatten((args, kwargs))
        # Whether the positional arguments are the leaves themselves (no tuple, list or dict
        # among them): then a later call's arguments are its leaves without flattening.
        self.args_flat = not kwargs and len(self.args_leaves) == len(args) and all(
            leaf is a for leaf, a in zip(self.args_leaves, args))

        # Unique parameters and buffers, each with every (submodule, attribute) place holding it
        # (tied weights: one tensor, several places).
        self.params, self.param_places = [], []
        self.buffers, self.buffer_places = [], []
        index_of = {}
        self.submodules = []  # every submodule in walk order (shared ones again where met again)
        for m in modules:
            for _, sub in m.named_modules(remove_duplicate=False):
                self.submodules.append(sub)
                for table, tensors, places, kind in ((sub._parameters, self.params, self.param_places, "p"),
                                                     (sub._buffers, self.buffers, self.buffer_places, "b")):
                    for name, t in table.items():
                        if t is None:
                            continue
                        i = index_of.get(id(t))
                        if i is None:
                            i = index_of[id(t)] = (kind, len(tensors))
                            tensors.append(t)
                            places.append([])
                        elif i[0] != kind:
                            raise CaptureError("lazyrt.torch: a tensor is both a parameter and a buffer")
                        if (sub, name) not in places[i[1]]:
                            places[i[1]].append((sub, name))
        self.param_index = {id(p): i for i, p in enumerate(self.params)}
        self.tensor_ids = frozenset(index_of)
        # The Python values the step reads (_reads.python_reads; set by the compiled function):
        # constants of a capture, so their values are part of the signature.
        self.reads = ()

        for leaf in self.args_leaves:
            if isinstance(leaf, torch.Tensor):
                if id(leaf) in index_of:
                    raise CaptureError("lazyrt.torch: a parameter or buffer of the model is passed as an argument "
                                       "of the step; pass other tensors (the step reads the model's own)")
                if leaf.requires_grad:
                    raise CaptureError("lazyrt.torch: arguments that require grad are not supported yet "
                                       "(their .grad would not be written back)")

        # Leaf tensors that require grad which the step reaches outside modules (discovery's
        # `free`: weights a step trains by hand, w -= lr * w.grad) are parameters of their own,
        # with no place in a module, as are those an optimizer holds that no module does (an
        # image optimized by style transfer): the step reaches them through its closure or
        # globals (see _FreeParameters).
        for t in free:
            if id(t) not in index_of:
                index_of[id(t)] = ("p", len(self.params))
                self.param_index[id(t)] = len(self.params)
                self.params.append(t)
                self.param_places.append([])
        self.tensor_ids = frozenset(index_of)

        # The optimizers' parameters, in group order.
        self.opt_params = []  # per optimizer: [(group index, param index)]
        for o in optimizers:
            seen, entries = set(), []
            for gi, group in enumerate(o.param_groups):
                for p in group["params"]:
                    i = self.param_index.get(id(p))
                    if i is None:
                        if id(p) in index_of:
                            raise CaptureError(f"lazyrt.torch: {type(o).__name__} updates a buffer (shape "
                                               f"{list(p.shape)}) of the model(s)")
                        i = self.param_index[id(p)] = len(self.params)
                        index_of[id(p)] = ("p", i)
                        self.params.append(p)
                        self.param_places.append([])
                        self.tensor_ids = frozenset(index_of)
                    if i not in seen:
                        seen.add(i)
                        entries.append((gi, i))
            self.opt_params.append(entries)

    # -- per-tensor states the signature and the capture use --

    def grad_kind(self, i):
        """'present' (a tensor), 'none_canonical' (None, may stand in as zeros) or 'none' (None,
        parameter does not require grad: stays out of the graph)."""
        p = self.params[i]
        if p.grad is not None:
            return "present"
        return "none_canonical" if p.requires_grad else "none"

    def state_of(self, oi, i):
        return self.optimizers[oi].state.get(self.params[i])  # .get: never create an entry

    def state_kind(self, oi, gi, i):
        """'present', 'empty_canonical' (no state yet; the optimizer's initial state may stand in)
        or 'empty'."""
        if self.state_of(oi, i):
            return "present"
        o = self.optimizers[oi]
        p = self.params[i]
        if (p.requires_grad or p.grad is not None) and \
                _optim.initial_state(o, o.param_groups[gi], p, device="meta") is not None:
            return "empty_canonical"
        return "empty"

    def facts(self):
        """What a capture made for this world depends on besides tensor values and learning
        rates, listed once (`Facts`): the signature that finds the capture is made of them, and
        so is the C++ guard that lets a later call take it without Python (`_step._guard`)."""
        opts = []
        for oi, o in enumerate(self.optimizers):
            lr_in = _optim.lr_is_input(o)
            groups = tuple((g, tuple((k, v) for k, v in g.items()
                                     if k not in ("params", "initial_lr") and not (k == "lr" and lr_in)))
                           for g in o.param_groups)
            states = tuple((gi, i, self.state_kind(oi, gi, i), self.state_of(oi, i)) for gi, i in self.opt_params[oi])
            opts.append((o, lr_in, groups, states))
        return Facts(
            str(self.args_spec), tuple(self.args_leaves), tuple(self.modules),
            tuple((sub, sub.training) for sub in self.submodules),
            tuple((p, len(pl), self.grad_kind(i)) for i, (p, pl) in enumerate(zip(self.params, self.param_places))),
            tuple((b, len(bl)) for b, bl in zip(self.buffers, self.buffer_places)),
            tuple(opts),
            (torch.is_grad_enabled(), torch.get_default_dtype(), _autocast_mode()),
            self.reads)

    def signature(self, facts=None):
        """Everything a captured graph depends on besides tensor values (and learning rates):
        the facts (`facts()`, or those given), each by what the capture depends on. A missing
        gradient or optimizer state the capture can make (see grad_kind, state_kind) is keyed as
        present, so that its call shares the capture; objects are keyed by identity, not held
        (`Same`)."""
        f = facts or self.facts()
        args = tuple(("T", tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor)
                     else ("C", type(a).__name__, _keyed(a)) for a in f.args)
        params = tuple((Same(p), tuple(p.shape), p.dtype, p.requires_grad, places) for p, places, _ in f.params)
        buffers = tuple((Same(b), tuple(b.shape), b.dtype, places) for b, places in f.buffers)
        grads = tuple(_tensor_sig(p.grad) if kind == "present" else _tensor_sig(p) if kind == "none_canonical"
                      else ("N",) for p, _, kind in f.params)
        opts = []
        for o, lr_in, groups, states in f.optimizers:
            keyed_groups = tuple((tuple(sorted((k, _hashable(v)) for k, v in entries if k != "lr")),
                                  ("lr-input",) if lr_in else ("lr", _hashable(g["lr"])),
                                  tuple(Same(p) for p in g["params"]))
                                 for g, entries in groups)
            keyed_states = []
            for gi, i, kind, d in states:
                if kind == "empty_canonical":
                    d = _optim.initial_state(o, o.param_groups[gi], self.params[i], device="meta")
                elif kind != "present":
                    d = {}
                keyed_states.append(tuple(sorted((k, _value_sig(v)) for k, v in d.items())))
            opts.append((type(o), lr_in, keyed_groups, tuple(keyed_states)))
        return (f.spec, args, tuple(Same(m) for m in f.modules), params, buffers,
                tuple(training for _, training in f.submodules), grads, tuple(opts), *f.modes,
                read_signature(f.reads))  # (last: the Python values read, see _warn_value_captures)


_PLAIN_VALUES = (int, float, bool, str, type(None))


def _plain(v):
    """Whether v compares by value without surprises (no tensors, arrays or other objects
    whose == is elementwise or unusual)."""
    return v.__class__ in _PLAIN_VALUES or (v.__class__ is tuple and all(x.__class__ in _PLAIN_VALUES for x in v))


def key_object(a):
    """Whether argument `a` (not a tensor) may enter the call guard: by value if plain (a number,
    a string), else by identity (a module, an optimizer, another object). It must be an argument
    leaf itself (pytree; unlike a list, tuple, dict or None), so that the arguments are the
    step's argument leaves, in order. What the step reads through an object is guarded apart
    (discovery's reach, the Python values read). Whoever keeps the guard keeps `a` alive, so
    its id stays its."""
    return pytree.tree_leaves(a) == [a]


def call_leaves(world, args):
    """The argument leaves of a call with positional arguments `args` (the guard's and the
    fast call's arguments): args itself where `world`'s were flat, else their
    pytree leaves where they have `world`'s structure (a hidden state passed as a tuple of
    tensors), else None."""
    if world.args_flat:
        return args
    leaves, spec = pytree.tree_flatten((args, {}))
    return tuple(leaves) if spec == world.args_spec else None


def _autocast_mode():
    """The CPU autocast mode a call runs under (a step called inside ``torch.autocast`` is
    captured with its ops in the autocast dtype, so it is part of the signature)."""
    enabled = torch.is_autocast_enabled("cpu")
    return ("autocast", enabled, torch.get_autocast_dtype("cpu") if enabled else None)


# ---- slots: the graph's inputs ---------------------------------------------------------------

class Slot:
    """One input of the captured graph: kind is 'arg' (ref: leaf index), 'param' / 'buffer'
    (ref: index), 'grad' (ref: param index), 'state' (ref: (optimizer, param index, key)),
    'lr' (ref: (optimizer, group index)) or 'read' (a tensor read from a place; ref: (its
    name in TensorReads.named, path))."""

    __slots__ = ("kind", "ref")

    def __init__(self, kind, ref):
        self.kind, self.ref = kind, ref

    def __repr__(self):
        return f"Slot({self.kind}, {self.ref})"


def place_tensors(reads):
    """(name, kind, holder, key, path, tensor) of the strided torch tensors read from places
    (`TensorReads.named`; `path` into the tuples, lists and dicts there: `tensors_in`), which a
    capture takes as inputs read from those places on every call."""
    return [(name, kind, holder, key, path, t) for name, (kind, holder, key, value) in TensorReads.named(reads).items()
            for path, t in tensors_in(value) if isinstance(t, torch.Tensor) and t.layout is torch.strided]


class Captured:
    """The result of a capture: the functionalized graph, its input slots, and what to do with
    its outputs. Built by `capture`; used by `lazyrt.torch._step`."""


class _FreeParameters(torch.overrides.TorchFunctionMode):
    """While a step is captured, its parameters that no module holds (`free`: id of the tensor
    -> its stand-in) are their stand-ins wherever the step's code reaches them (its closure,
    its globals): every torch function, method and attribute (``.grad``) given one gets the
    stand-in, as a module's table holds the stand-in of its parameters."""

    def __init__(self, free):
        super().__init__()
        self.free = free

    def __enter__(self):
        return super().__enter__() if self.free else self

    def __exit__(self, *exc):
        return super().__exit__(*exc) if self.free else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        swap = lambda v: self.free.get(id(v), v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        given = args
        args = pytree.tree_map(swap, args)
        kwargs = pytree.tree_map(swap, kwargs or {})
        result = func(*args, **kwargs)
        if args and result is args[0] and args[0] is not given[0]:
            # An in-place op on a parameter (w -= lr * w.grad, which rebinds w to what -= gives)
            # gives back the parameter itself, as eager's does: the step's variables keep it.
            return given[0]
        return result


def _first_use(graph_order, node):
    """How the value of a stand-in gradient placeholder is first used in pass 1's graph:
    'untouched' (never), 'accumulated' (backward's add_ writes it before anything reads it,
    zeroing it first allowed) or 'read' (anything else, zeroing it and nothing more included:
    eager's zero_grad leaves a missing gradient missing)."""
    current = node
    while True:
        users = sorted(current.users, key=graph_order.__getitem__)
        if not users:
            return "untouched" if current is node else "read"
        first = users[0]
        if first.op == "call_function" and first.args and first.args[0] is current:
            if first.target is aten.zero_.default:
                current = first
                continue
            if first.target is aten.add_.Tensor and len(first.args) == 2 and not first.kwargs:
                return "accumulated"
        return "read"


def _check_groups_unchanged(o, before):
    """Raises CaptureError where the step changed o's param groups: their number, or a value of
    one of them (what it holds, compared by identity, or by value for plain numbers)."""
    name = type(o).__name__
    if len(o.param_groups) != len(before):
        raise CaptureError(f"lazyrt.torch: the step changes the number of {name}'s param groups; its replays would "
                           "not (add groups outside the step)")
    for gi, (g, was) in enumerate(zip(o.param_groups, before)):
        for k in sorted(set(g) | set(was), key=str):
            a, b = g.get(k, _ABSENT), was.get(k, _ABSENT)
            if a is b or (_plain(a) and _plain(b) and a == b):
                continue
            raise CaptureError(
                f"lazyrt.torch: the step changes '{k}' of {name}'s param group {gi}, which its replays would not "
                "change (they run no Python); step learning-rate schedulers and change hyperparameters outside the "
                "step (a changed learning rate needs no new capture)")


_ABSENT = object()


def capture(world, fn, exact_grads=frozenset(), exact_states=frozenset()):
    """Captures one call of fn in `world`. Gradients (param indices) in exact_grads and states
    ((optimizer, param index)) in exact_states that are missing are captured as missing instead of
    through a stand-in. Returns a Captured."""
    functionalize = tracing()[1]

    slots, examples = [], []

    def add_slot(kind, ref, example):
        slots.append(Slot(kind, ref))
        examples.append(example)
        return len(slots) - 1

    arg_slot = {}
    for li, leaf in enumerate(world.args_leaves):
        if isinstance(leaf, torch.Tensor):
            arg_slot[li] = add_slot("arg", li, leaf.detach())
    param_slot = [add_slot("param", i, p.detach().requires_grad_(p.requires_grad))
                  for i, p in enumerate(world.params)]
    buffer_slot = [add_slot("buffer", i, b.detach()) for i, b in enumerate(world.buffers)]

    grad_slot, grad_canonical = {}, set()
    for i, p in enumerate(world.params):
        kind = world.grad_kind(i)
        if kind == "present":
            grad_slot[i] = add_slot("grad", i, p.grad.detach())
        elif kind == "none_canonical" and i not in exact_grads:
            stand_in = torch.empty_like(p, memory_format=torch.contiguous_format, device="meta")
            grad_slot[i] = add_slot("grad", i, stand_in)
            grad_canonical.add(i)

    state_in = {}  # (oi, i) -> {key: slot or ("C", value)}
    state_canonical = set()
    for oi, o in enumerate(world.optimizers):
        for gi, i in world.opt_params[oi]:
            kind = world.state_kind(oi, gi, i)
            if kind == "present":
                d = world.state_of(oi, i)
            elif kind == "empty_canonical" and (oi, i) not in exact_states:
                d = _optim.initial_state(o, o.param_groups[gi], world.params[i], device="meta")
                state_canonical.add((oi, i))
            else:
                continue
            state_in[(oi, i)] = {k: add_slot("state", (oi, i, k), v.detach()) if isinstance(v, torch.Tensor)
                                 else ("C", v) for k, v in d.items()}

    lr_slot = {}
    for oi, o in enumerate(world.optimizers):
        if _optim.lr_is_input(o):
            for gi, g in enumerate(o.param_groups):
                lr_slot[(oi, gi)] = add_slot("lr", (oi, gi), torch.tensor(float(g["lr"]), dtype=torch.float64))

    # Tensors the step reads from places (a global, a closure cell, an attribute, an item of a
    # dict, list or tuple there: `_reads.TensorReads`; not the world's own, which are read by
    # identity): inputs of their own, read from their place on every call, as Dynamo reads a
    # global tensor, and written back into where the step changes them in place (their
    # metadata is the capture's to check). A device tensor could be no constant of the graph.
    # One that requires grad is no input: where the step reads it, tracing refuses it.
    read_slot = [(add_slot("read", (name, path), t.detach()), kind, holder, key, path)
                 for name, kind, holder, key, path, t in place_tensors(world.reads) if not t.requires_grad]

    # Filled in by pass 1.
    info = {}

    def step_on_inputs(flat):
        inputs = list(flat)
        leaves = list(world.args_leaves)
        for li, s in arg_slot.items():
            leaves[li] = inputs[s]
        args, kwargs = pytree.tree_unflatten(leaves, world.args_spec)
        proxies = [inputs[s] for s in param_slot]
        proxy_index = {id(t): i for i, t in enumerate(proxies)}
        restore = []
        foreach = set()  # the parameters of groups that asked for for-each steps (see _optim)
        try:
            for s, kind, holder, key, path in read_slot:
                restore.append(("place", put(kind, holder, key, inputs[s], path)))
            for places, s in ((world.param_places, param_slot), (world.buffer_places, buffer_slot)):
                for i, where in enumerate(places):
                    for sub, name in where:
                        table = sub._parameters if places is world.param_places else sub._buffers
                        restore.append((table, name, table[name]))
                        table[name] = inputs[s[i]]
            # A recurrent module (nn.RNN, LSTM, GRU) runs on its list of its weights, which
            # setattr keeps up to date but the tables above bypass: rebuilt from the tables.
            for sub in {id(sub): sub for where in world.param_places for sub, _ in where}.values():
                names = getattr(sub, "_flat_weights_names", None)
                if names is not None and hasattr(sub, "_flat_weights"):
                    restore.append(("flat_weights", sub, sub._flat_weights))
                    sub._flat_weights = [getattr(sub, wn) if hasattr(sub, wn) else None for wn in names]
            for i, p in enumerate(proxies):
                p.grad = inputs[grad_slot[i]] if i in grad_slot else None
            for oi, o in enumerate(world.optimizers):
                saved_groups = [(g, dict(g)) for g in o.param_groups]
                saved_state = o.state
                restore.append(("optimizer", o, list(o.param_groups), saved_groups, saved_state))
                for gi, g in enumerate(o.param_groups):
                    g["params"] = [proxies[world.param_index[id(p)]] for p in g["params"]]
                    if g.get("foreach"):
                        foreach.update(id(p) for p in g["params"])
                    if (oi, gi) in lr_slot:
                        g["lr"] = inputs[lr_slot[(oi, gi)]]
                        # The update runs as lazyrt's replacement whatever the implementation
                        # asked for (for-each, fused or capturable compute the same update; the
                        # optimizer's own checks refuse a tensor lr for-each, and capturable
                        # steps on the CPU).
                        for impl in _optim.IMPLEMENTATION_OPTIONS:
                            if g.get(impl):
                                g[impl] = False
                state = collections.defaultdict(dict)
                for (soi, i), d in state_in.items():
                    if soi == oi:
                        state[proxies[i]] = {k: (v[1] if isinstance(v, tuple) else inputs[v]) for k, v in d.items()}
                o.state = state
            processed = set()

            def record(param):
                i = proxy_index.get(id(param))
                if i is not None:
                    processed.add(i)

            # The groups as the graph reads them: a step that changes them (a learning-rate
            # scheduler stepped inside it) would change them when captured only.
            groups_in = [[dict(g) for g in o.param_groups] for o in world.optimizers]
            free = {id(world.params[i]): proxies[i] for i, places in enumerate(world.param_places) if not places}
            with _optim.patched_updates(world.optimizers, record, frozenset(foreach)), _FreeParameters(free):
                result = fn(*args, **kwargs)
            for o, before in zip(world.optimizers, groups_in):
                _check_groups_unchanged(o, before)

            # Collect the outputs: the step's result, then the final gradients and state.
            outputs = []

            def out(t):
                outputs.append(t)
                return len(outputs) - 1

            res_leaves, res_spec = pytree.tree_flatten(result)
            info["result_spec"] = res_spec
            info["result"] = [("T", out(v)) if isinstance(v, torch.Tensor) else ("C", v) for v in res_leaves]
            grads = {}
            for i, p in enumerate(proxies):
                g = p.grad
                own = grad_slot.get(i)
                if g is None:
                    grads[i] = ("N",)
                else:
                    grads[i] = ("T", out(g), own is not None and g is inputs[own])
            info["grads"] = grads
            states = {}
            for oi, o in enumerate(world.optimizers):
                for gi, i in world.opt_params[oi]:
                    d = o.state.get(proxies[i])
                    before = state_in.get((oi, i), {})
                    if not d and not before:
                        continue
                    final = {}
                    for k, v in (d or {}).items():
                        s = before.get(k)
                        if isinstance(v, torch.Tensor):
                            final[k] = ("T", out(v), isinstance(s, int) and v is inputs[s])
                        else:
                            final[k] = ("C", v)
                    states[(oi, i)] = final
            info["states"] = states
            info["processed"] = processed
            # Parameters and buffers must still be the tensors swapped in (updated in place).
            for places, s, what in ((world.param_places, param_slot, "parameter"),
                                    (world.buffer_places, buffer_slot, "buffer")):
                for i, where in enumerate(places):
                    for sub, name in where:
                        table = sub._parameters if what == "parameter" else sub._buffers
                        if table.get(name) is not inputs[s[i]]:
                            raise CaptureError(f"lazyrt.torch: the step replaces the {what} '{name}' of a "
                                               f"{type(sub).__name__} (change values in place instead)")
            return outputs
        finally:
            for entry in reversed(restore):
                if entry[0] == "optimizer":
                    _, o, groups, saved_groups, saved_state = entry
                    o.param_groups[:] = groups
                    for g, saved in saved_groups:
                        g.clear()
                        g.update(saved)
                    o.state = saved_state
                elif entry[0] == "flat_weights":
                    entry[1]._flat_weights = entry[2]
                elif entry[0] == "place":
                    entry[1]()
                else:
                    table, name, value = entry
                    table[name] = value

    try:
        pass1 = _fake_trace(step_on_inputs, examples)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - name what failed, keep the cause
        hint = ""
        if "value out of a tracing tensor" in str(e) or type(e).__name__ in ("DataDependentOutputException",
                                                                            "DynamicOutputShapeException"):
            raise EagerOnly(
                "lazyrt.torch: the step reads a tensor's value (.item(), float(), bool() or an `if` on a tensor) or "
                f"makes a shape only values give (x[mask], nonzero): {type(e).__name__}: {e}; no capture can replay "
                "that, so its calls run in PyTorch eager (return the tensor and read it after the call, or use "
                "torch.where, to compile the step)") from e
        if "ProcessGroup" in str(e) or "process group" in str(e):
            hint = (" (torch.distributed's collectives over its own backends run outside the graph and cannot be "
                    "captured: initialize torch.distributed with backend 'lazyrt' (import lazyrt.torch.distributed), "
                    "or call lazyrt.torch.distributed.all_reduce, reduce_gradients or optimizer_step, which are ops "
                    "of the compiled graph)")
        raise CaptureError(f"lazyrt.torch: capturing the step failed{hint}: {type(e).__name__}: {e}") from e

    # Stand-in checks on pass 1 (in-place ops still visible there).
    order = {n: k for k, n in enumerate(pass1.graph.nodes)}
    placeholders1 = [n for n in pass1.graph.nodes if n.op == "placeholder"]
    grad_none_ok = set()
    for i, s in grad_slot.items():
        if _first_use(order, placeholders1[s]) in ("untouched", "accumulated"):
            grad_none_ok.add(i)
    state_empty_ok = {key for key in state_in if key[1] in info["processed"]}

    plain = [e.detach() for e in examples]  # pass 2 sees no autograd: the backward is ops already
    try:
        pass2 = _fake_trace(functionalize(pass1), plain)
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"lazyrt.torch: functionalizing the captured step failed: {type(e).__name__}: {e}") from e

    for n in pass2.graph.nodes:
        value = getattr(pass2, n.target, None) if n.op == "get_attr" else None
        if isinstance(value, torch.Tensor) and value.layout is not torch.strided:
            raise EagerOnly(f"lazyrt.torch: the step reads a tensor of layout {value.layout} (shape "
                            f"{list(value.shape)}) from outside its arguments, which lazyrt has no form of; its calls "
                            "run in PyTorch eager (keep it dense, to_dense(), to compile the step)")

    c = Captured()
    c.graph_module = pass2
    c.slots = slots
    c.grad_slot = grad_slot
    c.grad_canonical = grad_canonical
    c.state_in = state_in
    c.state_canonical = state_canonical
    c.exact_grads = frozenset(exact_grads)
    c.exact_states = frozenset(exact_states)
    c.grad_none_ok = grad_none_ok
    c.state_empty_ok = state_empty_ok
    c.result_spec = info["result_spec"]
    c.result = info["result"]
    c.grads = info["grads"]
    c.states = info["states"]
    c.processed = info["processed"]
    c.pass1_nodes = len(pass1.graph.nodes)
    return c
