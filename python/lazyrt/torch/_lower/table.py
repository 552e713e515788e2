"""The lowering tables and what the lowerings share.

LOWERINGS maps an aten op (or a Python callable an FX graph calls, such as operator.getitem)
to its lowering, fn(expect, *args, **kwargs): `expect` is PyTorch's answer for the node's result
(`Expect`), the arguments are the node's with lazyrt tensors for tensors. REFUSALS maps an op
lowered for some of its attributes only to fn(node) giving why that node is not lowered (None
when it is); the interpreter treats such a node as an op without a lowering. FRESH_IN_PLACE
holds the in-place ops lowered as a new value, which the interpreter allows only on a fresh
tensor that nothing else reads. The area modules (elementwise, reductions, ...) fill them with
`lowering` and `refusal` when imported.
"""

import torch
import torch.fx

import lazyrt
from lazyrt import _C

aten = torch.ops.aten


class UnsupportedOperatorError(NotImplementedError):
    """The captured step uses an aten op lazyrt.torch has no lowering for (named in the message)."""


class GraphBreakWarning(UserWarning):
    """An aten op without a lowering runs in PyTorch eager between compiled pieces of a step
    (warned once per op)."""


_DTYPES = {
    torch.float32: _C.float32, torch.float64: _C.float64, torch.float16: _C.float16,
    torch.bfloat16: _C.bfloat16, torch.int32: _C.int32, torch.int64: _C.int64, torch.bool: _C.bool,
}


_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


def lazy_dtype(dtype, what="a tensor"):
    d = _DTYPES.get(dtype)
    if d is None:
        raise UnsupportedOperatorError(f"lazyrt.torch: {what} has dtype {dtype}, which lazyrt does not have")
    return d


class Expect:
    """PyTorch's shape and dtype for a node's (first) result."""

    __slots__ = ("shape", "dtype", "val")

    def __init__(self, node):
        val = node.meta.get("val")
        self.val = val
        first = val[0] if isinstance(val, (tuple, list)) else val
        if isinstance(first, torch.Tensor):
            self.shape = tuple(int(s) for s in first.shape)
            self.dtype = lazy_dtype(first.dtype, f"the result of {node.target}")
        else:
            self.shape = self.dtype = None


LOWERINGS = {}

# Ops lowered for some of their attributes only: op -> fn(node) giving why that node is not
# lowered (None when it is). LoweredGraph treats such a node as an op without a lowering: a
# graph break where breaks are allowed, UnsupportedOperatorError elsewhere.
REFUSALS = {}

# In-place ops lowered as a new value: LoweredGraph accepts them only on a fresh empty tensor
# that nothing else reads (see random.py).
FRESH_IN_PLACE = set()


def _registrar(table):
    """A decorator factory: @name(*ops) enters the decorated function in `table` for each op."""
    def for_ops(*ops):
        def register(fn):
            for op in ops:
                table[op] = fn
            return fn
        return register
    return for_ops


lowering = _registrar(LOWERINGS)  # @lowering(aten.op.overload, ...): the op's lowering
refusal = _registrar(REFUSALS)    # @refusal(aten.op.overload, ...): why a node of the op is not lowered


def _is_tensor(x):
    return isinstance(x, _C.Tensor)


def _cast(x, dtype):
    if _is_tensor(x) and x.dtype is not dtype:
        return _C.cast(x, dtype)
    return x


def _full(shape, value, dtype):
    return _C.full(tuple(shape), value, dtype=dtype)


def _reduce_dims(dim, ndim):
    """aten's dim list for reductions: None or [] means every dim."""
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return [d % max(ndim, 1) for d in dim] if dim else list(range(ndim))


def op_name(target):
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


# ---- results in ATen's CPU kernel's dtypes (see norms.py) ---------------------------------------

class _KernelDtypes(list):
    """The results of a lowering in the dtypes ATen's CPU kernel gives them, where PyTorch's fake
    kernel (the captured graph's dtypes) says others: getitem reads them as they are, not cast
    to the captured dtype."""


class _KeepDtype:
    """A lowered result that `_checked` keeps in its own dtype (see _KernelDtypes)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


# ---- vector-Jacobian products -------------------------------------------------------------------
# Most backward ops of nn layers (padding, resizing, convolution, pooling) and of some views are
# the vector-Jacobian product of their forward by lazyrt's own autograd: the recomputed forward
# is the same graph, which CSE merges with the forward's, so the gradients are lazyrt's
# gradient rules.

def _vjp(forward, inputs, grad, wanted):
    """The gradients of forward(*inputs) for grad, for the inputs `wanted` marks (None else)."""
    with lazyrt.enable_grad():
        leaves = [x.detach() for x in inputs]
        for x, w in zip(leaves, wanted):
            if w:
                x.requires_grad_()
        forward(*leaves).backward(grad)
    return [x.grad if w else None for x, w in zip(leaves, wanted)]
