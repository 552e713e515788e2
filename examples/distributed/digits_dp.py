"""Data-parallel training of the digits MLP (the one examples/demo.cpp trains) on N processes:

    python3 -m lazyrt.distributed.run --nproc 2 examples/distributed/digits_dp.py

Every rank starts from rank 0's weights, trains on its share of each batch (DistributedSampler),
and averages the gradients with reduce_gradients inside the compiled step; after the first
epoch the step is replayed (lazyrt.compile_step). The global batch is 64 whatever the number
of processes, so every run follows the same schedule; rank 0 prints the held-out accuracy and
the run exits with 1 below the 95% goal. --epochs changes the length (default 25).
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np

import lazyrt as lr
import lazyrt.distributed as dist
import lazyrt.nn.functional as F


def load_digits():
    import sklearn.datasets
    path = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "digits.csv.gz")
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return data[:, :64] / 16.0, data[:, 64].astype(np.int64)


def arguments_and_group(port):
    """The command line (--epochs, --batch), and the process group joined (a group of one, its
    store on `port`, when no launcher started this process): (args, rank, world size, this
    rank's share of the batch)."""
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--batch", type=int, default=64, help="the global batch (all ranks together)")
    args = p.parse_args()
    if "RANK" not in os.environ:  # a plain run: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise SystemExit(f"the global batch {args.batch} must divide into {world} processes")
    return args, rank, world, args.batch // world


def main():
    args, rank, world, local = arguments_and_group(29511)

    x, y = load_digits()
    order = np.random.default_rng(2024).permutation(len(x))
    n_train = len(x) * 4 // 5
    train, test = order[:n_train], order[n_train:]
    x_test, y_test = lr.tensor(x[test]), lr.tensor(y[test])

    lr.manual_seed(rank)  # every rank draws its own weights; the broadcast makes them rank 0's
    model = lr.nn.Sequential(lr.nn.Linear(64, 128), lr.nn.ReLU(), lr.nn.Linear(128, 10))
    dist.broadcast_parameters(model)
    opt = lr.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sampler = dist.DistributedSampler(n_train, seed=7)

    def step(xb, yb):
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        dist.reduce_gradients(opt)
        opt.step()
        opt.zero_grad()
        return loss

    compiled = None
    step_times = {"traced": [], "replayed": []}
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        mine = train[sampler.indices()]
        steps = len(mine) // local  # the last partial batch is dropped: one step shape
        if epoch == 2:
            compiled = lr.compile_step(step, (lr.tensor(x[mine[:local]]), lr.tensor(y[mine[:local]])))
        loss_sum = 0.0
        for s in range(steps):
            idx = mine[s * local:(s + 1) * local]
            xb, yb = lr.tensor(x[idx]), lr.tensor(y[idx])
            t0 = time.perf_counter()
            if compiled is None:
                loss = step(xb, yb)
                lr.mark_step()
            else:
                loss = compiled(xb, yb)
            step_times["replayed" if compiled else "traced"].append(time.perf_counter() - t0)
            loss_sum += loss.item()
        with lr.no_grad():  # no dropout or batch norm: no eval() needed (it would retrace the step)
            acc = float((model(x_test).argmax(1) == y_test).float().mean().item())
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {loss_sum / steps:.4f}  test accuracy {100 * acc:.2f}%  "
                  f"({'replayed' if compiled else 'traced'}, {world} process{'es' if world > 1 else ''})", flush=True)
    if rank == 0:
        for kind, ts in step_times.items():
            if ts:
                print(f"per step ({kind}): median {1e6 * float(np.median(ts)):.0f} us over {len(ts)} steps")
        print(f"\nheld-out accuracy: {100 * acc:.2f}% ({'reached' if acc >= 0.95 else 'below'} the 95% goal)")
    dist.destroy_process_group()
    return 0 if acc >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
