"""Seed program, in PyTorch: a counter in a structured loop, and the host loop it replaces.

PyTorch's own while_loop (torch._higher_order_ops.while_loop), called inside a function given
to lazyrt.torch.compile, becomes one lazyrt loop node, compiled once: counting down from 10
while adding 1 to 3 gives 13, and counting from 1,000 reuses the same executable.
lazyrt.torch.while_loop, with the same signature, runs such a loop directly on torch tensors. The control group is the same counting as a plain Python loop in a step given to
lazyrt.torch.compile: the capture unrolls it, so 50 iterations and 60 are two graphs to compile.
Adding 1 to 1 fifty times gives 51.

    PYTHONPATH=build/python .venv/bin/python examples/seed/torch_while_loop.py
"""

import torch
from torch._higher_order_ops.while_loop import while_loop

import lazyrt
import lazyrt.torch


def cond_fn(iteri, x):
    return iteri > 0


def body_fn(iteri, x):
    return iteri - 1, torch.add(x, 1)


@lazyrt.torch.compile
def count(iteri, init_val):
    return while_loop(cond_fn, body_fn, (iteri, init_val))


lazyrt.metrics.reset()
_, res = count(torch.tensor(10), torch.tensor(3, dtype=torch.int32))
print(f"result: {res.item()}")
_, big = count(torch.tensor(1000), torch.tensor(3, dtype=torch.int32))
print(f"counting from 1000: {big.item()}")
print(f"while_loop compiles: {lazyrt.metrics.counter('UncachedCompile')}")
_, direct = lazyrt.torch.while_loop(cond_fn, body_fn, (torch.tensor(10), torch.tensor(3, dtype=torch.int32)))
print(f"lazyrt.torch.while_loop result: {direct.item()}")


def host_loop(x, n):
    for _ in range(n):
        x = x + 1
    return x


lazyrt.metrics.reset()
fifty = lazyrt.torch.compile(lambda x: host_loop(x, 50))
sixty = lazyrt.torch.compile(lambda x: host_loop(x, 60))
print(f"host loop result: {fifty(torch.tensor(1.0)).item():g}")
print(f"host loop of 60: {sixty(torch.tensor(1.0)).item():g}")
print(f"host loop compiles: {lazyrt.metrics.counter('UncachedCompile')}")
