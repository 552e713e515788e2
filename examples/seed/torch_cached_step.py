"""Seed program: an unmodified PyTorch training step captured once and replayed by lazyrt.

Linear(5, 3) trained with torch.optim.AdamW. lazyrt.torch.compile captures the step (forward,
backward, optimizer step, zero_grad) on its first call, lowers the aten graph to lazyrt ops and
compiles it; the next three calls replay the compiled graph, and after each call the model's
weights, gradients and the optimizer's state (PyTorch tensors) hold the new values. The losses
change from replay to replay and equal those of plain PyTorch steps from the same start.

    PYTHONPATH=build/python .venv/bin/python examples/seed/torch_cached_step.py
"""

import copy
import time

import numpy as np
import torch

import lazyrt.torch

torch.manual_seed(0)
model = torch.nn.Linear(5, 3)
eager_model = copy.deepcopy(model)  # the same start, for plain PyTorch
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
eager_optimizer = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
x = torch.randn(10, 5)


def train_step(x):
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


step = lazyrt.torch.compile(train_step)  # model and optimizer are found in train_step's globals

start = time.perf_counter()
first = step(x).item()
print(f"capture: loss {first:.6f} ({(time.perf_counter() - start) * 1e3:.0f} ms to capture, compile and run)")
replayed = []
for i in range(3):
    replayed.append(step(x).item())
    print(f"replay {i + 1}: loss {replayed[-1]:.6f}")
print(f"captures: {step.captures}")


def eager_step(x):
    loss = eager_model(x).sum()
    loss.backward()
    eager_optimizer.step()
    eager_optimizer.zero_grad()
    return loss


eager = [eager_step(x).item() for _ in range(4)]
print(f"eager 0: loss {eager[0]:.6f}")
for i in range(3):
    print(f"eager {i + 1}: loss {eager[i + 1]:.6f}")

# float32 with a different order of rounding than PyTorch's kernels: equal to rtol 1e-5.
print(f"losses change: {len(set(replayed)) == 3}")
print(f"losses equal eager's: {np.allclose([first] + replayed, eager, rtol=1e-5, atol=1e-6)}")
print(f"weights equal eager's: {torch.allclose(model.weight, eager_model.weight, rtol=1e-5, atol=1e-6)}")
