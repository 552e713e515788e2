"""Structured loops over torch tensors: ``while_loop``, ``fori_loop`` and ``scan`` whose bodies
are written with torch ops and ``torch.nn`` modules, run by lazyrt's loops (one loop node,
compiled once whatever the trip count).

A body is captured when lazyrt traces the loop: ``make_fx`` under ``functionalize`` over fake
tensors of the carries' shapes and dtypes (nothing runs), and its aten graph is lowered to
lazyrt ops on the loop's own body values (`_lower`). The tensors a body reads from outside
(a module's weights, a tensor in a closure) become the loop's captured values, read anew on
every call. Every call captures again: a body may read Python values that change between
calls, and lazyrt's graph cache, keyed by the graph itself, still compiles each distinct body
once. The carries and results are torch tensors; results are new tensors.

Gradients: where torch records gradients and a carry, a stacked input or a tensor a body reads
from outside requires grad, that tensor enters the loop as a lazyrt leaf that requires grad, and
lazyrt differentiates the loop (the loops issue's memory policies apply: ``snapshots``). The
results join torch's autograd graph through one ``torch.autograd.Function`` whose backward runs
lazyrt's backward and hands each tensor its gradient.
"""

import torch
import torch.utils._pytree as pytree

import lazyrt
from lazyrt.torch._capture import CaptureError, _fake_trace, tracing
from lazyrt.torch._lower import _TORCH_DTYPES, LoweredGraph


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


def _lazy_body(torch_fn, what, inputs):
    """torch_fn (torch pytrees in and out) as a function of lazyrt pytrees of the same structure."""
    def body(*lazy_args):
        flat, spec = pytree.tree_flatten(lazy_args)
        for x in flat:
            if not isinstance(x, lazyrt.Tensor):
                raise TypeError(f"lazyrt.torch.{what}: the body gets tensors, got {type(x).__name__}")
        examples = [torch.empty(tuple(x.shape), dtype=_TORCH_DTYPES[x.dtype], device="meta") for x in flat]
        out_spec = [None]

        def flat_fn(xs):
            result = torch_fn(*pytree.tree_unflatten(list(xs), spec))
            leaves, out_spec[0] = pytree.tree_flatten(result)
            for leaf in leaves:
                if not isinstance(leaf, torch.Tensor):
                    raise CaptureError(f"lazyrt.torch.{what}: the body must return tensors, got "
                                       f"{type(leaf).__name__}")
            return leaves

        functionalize = tracing()[1]
        try:
            with torch.no_grad():
                gm = _fake_trace(functionalize(flat_fn), examples, constants_may_require_grad=True)
        except (CaptureError, lazyrt.Error, TypeError):
            raise
        except Exception as e:  # noqa: BLE001 - name what failed, keep the cause
            raise CaptureError(f"lazyrt.torch.{what}: capturing the body failed: {type(e).__name__}: {e}") from e
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in placeholders:
                raise CaptureError(f"lazyrt.torch.{what}: the body changes a carried tensor in place; "
                                   "return the new value instead")
        output = next(n for n in gm.graph.nodes if n.op == "output")
        lowered = LoweredGraph(gm, list(output.args[0]))
        constants = [inputs(c) for c in lowered.constants]
        results = lowered(*flat, *constants)
        return pytree.tree_unflatten(results, out_spec[0])
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
