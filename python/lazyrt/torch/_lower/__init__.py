"""Lowering: the functionalized aten graph of a captured step, run as lazyrt ops.

`LoweredGraph` interprets the FX graph node by node: each aten op maps to a composition of
lazyrt ops (`LOWERINGS`), so calling it inside ``lazyrt.compile_step`` records one lazyrt graph.
Every node carries PyTorch's answer for its result (``node.meta['val']``, a fake tensor): the
lowering takes the result dtype from it (elementwise operands are cast to PyTorch's promoted
dtype first, as PyTorch computes in it), factories take their shapes from it, and every result
is checked against it — a shape that differs is an error naming the op, never a silent wrong
value.

Only the nodes the outputs and write-backs need are lowered (the graph also holds dead ops,
such as the profiler's ``record_function`` buffers). A live op without a lowering (or one
lowered for some attributes only, `REFUSALS`, given others: a 3-d convolution) raises
`UnsupportedOperatorError` naming it, when the step is captured and before anything runs —
unless graph breaks are allowed (a captured step, not a loop body): then each such op runs in
PyTorch eager between compiled pieces of the graph (`LoweredGraph.run`), counted by the
``GraphBreak`` counter of `lazyrt.metrics` and named by a `GraphBreakWarning` the first time.
"""

# `table` holds the tables (LOWERINGS, REFUSALS, FRESH_IN_PLACE) and what the lowerings share;
# each area module registers its aten ops there (`lowering`, `refusal`) when imported;
# `interpreter` walks the FX graph and looks each node's op up in the tables. Every area is
# imported here, before `_view_copies` adds the copying forms of the view ops to the table.
from lazyrt.torch._lower import (activations, control_flow, elementwise, factories, indexing,  # noqa: F401
                                 losses, nn, norms, random, reductions, shapes)
from lazyrt.torch._lower import interpreter  # noqa: F401  (interpreter._WARNED_BREAKS: the set a test may replace)
from lazyrt.torch._lower.interpreter import (_WARNED_BREAKS, LoweredGraph, _checked, _computed,  # noqa: F401
                                             _traced_layout, _view_copies, live_nodes)
from lazyrt.torch._lower.table import (_DTYPES, _TORCH_DTYPES, FRESH_IN_PLACE, LOWERINGS, REFUSALS,  # noqa: F401
                                       Expect, GraphBreakWarning, UnsupportedOperatorError, _cast, lazy_dtype,
                                       lowering, op_name, refusal)

_view_copies()
