"""Seed program, control group: the same kind of counting as a plain Python loop.

Each iteration records another op, so the pending graph grows with the trip count (50 adds
here) and every different count is a different graph to compile. Adding 1 to 1 fifty times
gives 51.

    PYTHONPATH=build/python .venv/bin/python examples/seed/host_loop_control.py
"""

import lazyrt as lr

x = lr.tensor(1.0)
for _ in range(50):
    x = x + 1
print(f"graph nodes: {lr.debug.graph_node_count([x])}")
print(f"result: {x.item():g}")
