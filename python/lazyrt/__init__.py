"""lazyrt: a lazy-tensor runtime with PyTorch's look and feel.

Ops do not run when called: each records a node in a graph. Reading a value (``item()``,
``numpy()``, ``print``) or ``mark_step()`` compiles the pending graph once per graph hash and
runs it. Structured loops (``while_loop``, ``fori_loop``) trace their body once, and
``compile_step`` / the replay calls run a traced training step again without tracing.

    import lazyrt as lr
    x = lr.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    print(loss.item(), x.grad)

Errors from lazyrt raise ``lazyrt.Error``, a ``RuntimeError``.
"""

from lazyrt import _C
from lazyrt._C import (  # noqa: F401  (the public API)
    Error,
    Tensor,
    dtype,
    float32, float64, float16, bfloat16, int32, int64, bool,
    float, double, half, int, long,
    # elementwise
    neg, negative, abs, exp, log, sqrt, rsqrt, relu, sigmoid, tanh, isnan, logical_not, cast,
    add, sub, subtract, mul, multiply, div, divide, true_divide, pow, maximum, minimum,
    eq, ne, lt, le, gt, ge, logical_and, logical_or, where,
    # reductions, linear algebra
    sum, mean, amax, amin, max, min, matmul, mm, log_softmax,
    # shape
    reshape, transpose, swapaxes, permute, expand, broadcast_to, unsqueeze, squeeze, flatten, t,
    # creation and random numbers
    zeros, ones, full, zeros_like, ones_like, full_like, scalar_tensor,
    manual_seed, random_state, rand, randn, randint, bernoulli, dropout_mask, dropout,
    # data from and to NumPy / DLPack
    from_numpy, from_dlpack,
    # sync, loops, replay
    mark_step, sync, while_loop, fori_loop,
    GraphHash, CompiledStep, tensor_id, graph_hash, warm_up_cache, graph_inputs, run_cached_graph,
    compile_step,
    is_grad_enabled,
)
from lazyrt._tensor import tensor, as_tensor, arange, from_torch, to_torch  # noqa: F401
from lazyrt._autograd import no_grad, enable_grad, set_grad_enabled  # noqa: F401
from lazyrt._replay import GraphInputMatcher  # noqa: F401
from lazyrt import nn, optim, metrics, cache, debug  # noqa: F401

__version__ = "0.1.0"
