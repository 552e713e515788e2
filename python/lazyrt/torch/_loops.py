"""Structured loops over torch tensors: ``while_loop``, ``fori_loop`` and ``scan`` whose bodies
are written with torch ops and ``torch.nn`` modules, run by lazyrt's loops (one loop node,
compiled once whatever the trip count).

A body is captured when lazyrt traces the loop: ``make_fx`` under ``functionalize`` over fake
tensors of the carries' shapes and dtypes (nothing runs), and its aten graph is lowered to
lazyrt ops on the loop's own body values (`_lower`). The tensors a body reads from outside
(a module's weights, a tensor in a closure) become the loop's captured values, read anew on
every call. Every call captures again: a body may read Python values that change between
calls, and lazyrt's graph cache, keyed by the graph itself, still compiles each distinct body
once. The carries and results are torch tensors; results are new tensors, not attached to
autograd (gradients through torch loops are not lowered yet).
"""

import torch
import torch.utils._pytree as pytree

import lazyrt
from lazyrt.torch._capture import CaptureError, _fake_trace
from lazyrt.torch._lower import _DTYPES, LoweredGraph

_TORCH_DTYPES = {lazy: t for t, lazy in _DTYPES.items()}


def _to_lazy(tree, what):
    def convert(x):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                raise lazyrt.Error(f"lazyrt.torch.{what}: carried tensors must be CPU tensors, got device {x.device}")
            return lazyrt.from_torch(x.detach())
        if isinstance(x, (bool, int, float)):
            return x
        raise TypeError(f"lazyrt.torch.{what}: carried values must be torch tensors or Python numbers, "
                        f"got {type(x).__name__}")
    return pytree.tree_map(convert, tree)


def _to_torch(tree):
    # A copy: lazyrt's values are immutable, and the caller may change the results in place.
    return pytree.tree_map(lambda x: lazyrt.to_torch(x).clone() if isinstance(x, lazyrt.Tensor) else x, tree)


def _lazy_body(torch_fn, what):
    """torch_fn (torch pytrees in and out) as a function of lazyrt pytrees of the same structure."""
    def body(*lazy_args):
        flat, spec = pytree.tree_flatten(lazy_args)
        for x in flat:
            if not isinstance(x, lazyrt.Tensor):
                raise TypeError(f"lazyrt.torch.{what}: the body gets tensors, got {type(x).__name__}")
        examples = [torch.empty(tuple(x.shape), dtype=_TORCH_DTYPES[x.dtype]) for x in flat]
        out_spec = [None]

        def flat_fn(xs):
            result = torch_fn(*pytree.tree_unflatten(list(xs), spec))
            leaves, out_spec[0] = pytree.tree_flatten(result)
            for leaf in leaves:
                if not isinstance(leaf, torch.Tensor):
                    raise CaptureError(f"lazyrt.torch.{what}: the body must return tensors, got "
                                       f"{type(leaf).__name__}")
            return leaves

        from functorch import functionalize
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
        constants = [lazyrt.from_torch(c.detach()) for c in lowered.constants]
        results = lowered(*flat, *constants)
        return pytree.tree_unflatten(results, out_spec[0])
    return body


def while_loop(cond_fn, body_fn, carried_inputs):
    """``while cond_fn(*carry): carry = body_fn(*carry)`` as one lazyrt loop, with the signature
    of ``torch._higher_order_ops.while_loop`` (PyTorch/XLA's): carried_inputs is a tuple of
    torch tensors (or Python numbers, or nested tuples, lists and dicts of them); cond_fn returns
    a one-element bool tensor; body_fn returns the new carry in the same structure, shapes and
    dtypes. Returns the final carry as a tuple of torch tensors."""
    args = tuple(carried_inputs) if isinstance(carried_inputs, (tuple, list)) else (carried_inputs,)
    cond = _lazy_body(cond_fn, "while_loop")
    body = _lazy_body(body_fn, "while_loop")

    def lazy_cond(*c):
        r = cond(*c)
        if not isinstance(r, lazyrt.Tensor):
            raise lazyrt.Error(f"lazyrt.torch.while_loop: cond_fn must return one bool tensor, got {type(r).__name__}")
        return r

    return _to_torch(lazyrt.while_loop(lazy_cond, body, _to_lazy(args, "while_loop")))


def fori_loop(lower, upper, body_fn, init_val):
    """``carry = body_fn(i, carry)`` for i in range(lower, upper), as one lazyrt loop (JAX's
    signature); i is an int64 0-d tensor, init_val a torch tensor or a nested tuple, list or dict
    of them. Returns the final carry, in init_val's structure."""
    body = _lazy_body(body_fn, "fori_loop")
    return _to_torch(lazyrt.fori_loop(lower, upper, body, _to_lazy(init_val, "fori_loop")))


def scan(fn, init, xs, reverse=False):
    """``(carry, ys) = scan(fn, init, xs)`` with ``carry, y = fn(carry, x)`` for each row x of
    xs (PyTorch/XLA's scan): one lazyrt scan node. init and xs are torch tensors or pytrees of
    them (xs stacked along dim 0); the ys come back stacked along dim 0."""
    body = _lazy_body(fn, "scan")
    carry, ys = lazyrt.scan(body, _to_lazy(init, "scan"), _to_lazy(xs, "scan"), reverse=reverse)
    return _to_torch(carry), _to_torch(ys)
