"""PyTorch's structured loops (torch._higher_order_ops): while_loop and scan, each one lazyrt
loop node whose body is its traced graph, lowered by the interpreter."""

import torch

import lazyrt
from lazyrt.torch._lower.interpreter import LoweredGraph
from lazyrt.torch._lower.table import lowering


def _body_function(gm, outer):
    """A traced body (a graph module whose placeholders are the carries, then `outer`: the
    values the loop passes in from outside) as a function of the carries' lazyrt values."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0]
    single = not isinstance(results, (tuple, list))
    lowered = LoweredGraph(gm, [results] if single else list(results))
    constants = [lazyrt.from_torch(c) for c in lowered.constants]

    def run(*carries):
        out = lowered(*carries, *outer, *constants)
        return out[0] if single else tuple(out)
    return run


@lowering(torch.ops.higher_order.while_loop)
def _while_loop(e, cond_gm, body_gm, carried, additional=()):
    # torch._higher_order_ops.while_loop: one lazyrt loop node, compiled once for any trip count.
    outer = list(additional)
    return list(lazyrt.while_loop(_body_function(cond_gm, outer), _body_function(body_gm, outer), tuple(carried)))


@lowering(torch.ops.higher_order.scan)
def _scan(e, combine_gm, init, xs, additional=()):
    # torch._higher_order_ops.scan: one lazyrt scan node. The combine graph takes the carries,
    # one row of each stacked input, then the outer values; it gives the next carries, then
    # the rows of the stacked outputs.
    step, n = _body_function(combine_gm, list(additional)), len(init)

    def body(carry, x):
        out = step(*carry, *x)
        out = out if isinstance(out, tuple) else (out,)
        return tuple(out[:n]), tuple(out[n:])
    carry, ys = lazyrt.scan(body, tuple(init), tuple(xs))
    return list(carry) + list(ys)
