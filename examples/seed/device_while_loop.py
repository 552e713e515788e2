"""Seed program, PyTorch/XLA-style, with only the device changed: torch tensors on the lazyrt
device, and PyTorch's own while_loop called on them directly.

The counter loop (count down from 10 while adding 1 to 3) becomes one lazyrt loop node, compiled
once: counting from 1,000 and from 100,000 runs the same executable. The host loop beside it
adds 1 to 1 fifty times on device tensors (51), recording fifty ops that sync() computes as one
graph.

    PYTHONPATH=build/python .venv/bin/python examples/seed/device_while_loop.py
"""

import torch
from torch._higher_order_ops.while_loop import while_loop

import lazyrt
import lazyrt.torch

device = lazyrt.torch.device()  # torch.device("lazyrt", 0): where torch_xla has xm.xla_device()


def cond_fn(iteri, x):
    return iteri > 0


def body_fn(iteri, x):
    return iteri - 1, torch.add(x, 1)


init_val = torch.tensor(3, dtype=torch.int32, device=device)
iteri = torch.tensor(10, device=device)
_, res = while_loop(cond_fn, body_fn, (iteri, init_val))
print(f"result: {res.item()}")
lazyrt.metrics.reset()
for n in (1000, 100000):
    _, res = while_loop(cond_fn, body_fn, (torch.tensor(n, device=device), init_val))
    print(f"counting from {n}: {res.item()}")
print(f"compiles for the other trip counts: {lazyrt.metrics.counter('UncachedCompile')}")

x = torch.tensor(1, device=device)
for _ in range(50):
    x = x + 1
lazyrt.torch.sync()  # PyTorch/XLA's mark_step(): the fifty adds as one graph
print(f"host loop result: {x.item()}")
