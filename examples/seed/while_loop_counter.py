"""Seed program: a counter in a structured loop.

The loop body is traced once into one `while` node and compiled once: 10 iterations or 10
million share one executable, and the graph does not grow with the trip count. Counting down
from 10 while adding 1 to 3 gives 13.

    PYTHONPATH=build/python .venv/bin/python examples/seed/while_loop_counter.py
"""

import lazyrt as lr


def cond_fn(iteri, x):
    return iteri > 0


def body_fn(iteri, x):
    return iteri - 1, lr.add(x, 1)


init_val = lr.tensor(3, dtype=lr.int32)
iteri = lr.tensor(10)
_, res = lr.while_loop(cond_fn, body_fn, (iteri, init_val))
print(f"graph nodes: {lr.debug.graph_node_count([res])}")
print(f"result: {res.item()}")
