"""The digits MLP of digits_dp.py written in plain PyTorch, trained data-parallel on N processes
by lazyrt.torch:

    python3 -m lazyrt.distributed.run --nproc 2 examples/distributed/digits_torch_dp.py

The step is ordinary PyTorch (torch.nn, torch.optim.AdamW) with one data-parallel line,
PyTorch/XLA's spelling: ``ldist.optimizer_step(opt)`` averages the gradients over the processes
and steps the optimizer. lazyrt.torch.compile captures it once; the gradients' all-reduce is an
op of the compiled graph, and every later call is a replay. Each process draws its own initial
weights: the compiled step gives every rank rank 0's before its first run. The global batch is
64 whatever the number of processes; rank 0 prints the held-out accuracy and the run exits with
1 below the 95% goal. --epochs changes the length (default 25).
"""

import os
import sys
import time

import numpy as np
import torch

import lazyrt
import lazyrt.torch
import lazyrt.torch.distributed as ldist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_dp import arguments_and_group, load_digits  # noqa: E402


def main():
    args, rank, world, local = arguments_and_group(29512)  # lazyrt's process group, as digits_dp.py's
    torch.set_num_threads(1)

    x, y = load_digits()
    order = np.random.default_rng(2024).permutation(len(x))
    n_train = len(x) * 4 // 5
    train, test = order[:n_train], order[n_train:]
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    torch.manual_seed(rank)  # every rank its own weights, until the first step makes them rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sampler = ldist.DistributedSampler(n_train, seed=7)

    @lazyrt.torch.compile
    def step(xb, yb):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        ldist.optimizer_step(opt)
        opt.zero_grad()
        return loss

    times = []
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        mine = train[sampler.indices()]
        steps = len(mine) // local  # the last partial batch is dropped: one step shape
        loss_sum = 0.0
        for s in range(steps):
            idx = torch.from_numpy(mine[s * local:(s + 1) * local])
            t0 = time.perf_counter()
            loss = step(x[idx], y[idx])
            times.append(time.perf_counter() - t0)
            loss_sum += float(loss)
        with torch.no_grad():
            acc = float((model(x[test]).argmax(1) == y[test]).float().mean())
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {loss_sum / steps:.4f}  test accuracy {100 * acc:.2f}%  "
                  f"({world} process{'es' if world > 1 else ''})", flush=True)
    if rank == 0:
        print(f"per step: median {1e6 * float(np.median(times[1:])):.0f} us over {len(times) - 1} replays "
              f"({step.captures} capture, {lazyrt.metrics.counter('TorchFastCall')} fast calls)")
        print(f"\nheld-out accuracy: {100 * acc:.2f}% ({'reached' if acc >= 0.95 else 'below'} the 95% goal)")
    ldist.destroy_process_group()
    return 0 if acc >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
