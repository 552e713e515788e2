"""The rate of lazyrt's all_reduce against torch.distributed's (Gloo as well), on N processes:

    python3 -m lazyrt.distributed.run --nproc 2 examples/distributed/allreduce_rate.py [--sizes 1e6,1e7]

For each size (f32 elements) rank 0 prints the median time of one all_reduce (sum) and the
rate in GB/s of the tensor's bytes: lazyrt's as a replayed compiled step (the collective inside
the executable) whose result is a new tensor, and one that writes the result back into the
tensor's own buffer (as gradients are reduced); and torch.distributed.all_reduce on a CPU tensor
in place with the gloo backend. It also prints how long joining the group took.
"""

import argparse
import os
import time

import numpy as np

import lazyrt as lr
import lazyrt.distributed as dist


def median_seconds(fn, reps):
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1e6,1e7")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]

    t0 = time.perf_counter()
    dist.init_process_group()
    join_ms = 1e3 * (time.perf_counter() - t0)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for n in sizes:
        x = lr.tensor(np.full(n, rank + 1, dtype=np.float32))
        step = lr.compile_step(lambda t: dist.all_reduce(t), (x,))
        check = step(x)
        assert float(check[0].item()) == world * (world + 1) / 2
        fresh = median_seconds(lambda: step(x), args.reps)
        del step, check
        # In place, as gradients are reduced: the result goes back into the tensor's own buffer.
        buf = lr.full((n,), 1.0 / world)  # lazyrt's own memory (a NumPy array's is never written)
        lr.mark_step()

        # The step returns a one-element slice, not buf itself: a replay that returns a state
        # tensor it updates writes the update into a fresh buffer (of n elements) every call.
        def inplace():
            buf.copy_(dist.all_reduce(buf))
            return buf[:1] * 1.0
        step = lr.compile_step(inplace, ())
        step()
        assert float(buf[0].item()) == 1.0
        ptr = buf.data_ptr()
        step()
        assert buf.data_ptr() == ptr, "the in-place all_reduce did not write into the tensor's own buffer"
        rows.append([n, fresh, median_seconds(step, args.reps)])
        del step, buf

    import torch
    import torch.distributed as tdist
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
    tdist.init_process_group("gloo")
    torch.set_num_threads(1)
    for row in rows:
        t = torch.full((row[0],), 1.0 / world)
        row.append(median_seconds(lambda: tdist.all_reduce(t), args.reps))
    tdist.destroy_process_group()
    dist.destroy_process_group()
    if rank == 0:
        print(f"{world} processes; joining the group took {join_ms:.0f} ms")
        print(f"{'elements':>10} {'lazyrt, new tensor':>22} {'lazyrt, in place':>22} {'torch.distributed':>22}")
        print(f"{'':>10}" + f"{'(ms, GB/s)':>23}" * 3)
        for n, *times in rows:
            gb = 4 * n / 1e9
            print(f"{n:>10}" + "".join(f"{1e3 * t:>10.2f} ms {gb / t:>5.2f} GB/s" for t in times))


if __name__ == "__main__":
    main()
