"""Data-parallel training: lazyrt's collectives against Gloo's own and torch.distributed's, and
what data parallelism adds to a replayed training step.

All processes run on this machine, started by lazyrt's launcher (python3 -m
lazyrt.distributed.run --nproc N bench/distributed.py --worker ...); every group meets in a
fresh directory (FileStore rendezvous) and talks over Gloo's TCP transport on the loopback
interface. One process holds every peer's group at once and runs the peers' batches in turn, so
every peer sees the same machine load.

(a) All-reduce (sum, f32, in place) on 2 processes at several sizes:
- lazyrt: all_reduce inside a replayed compiled step, the result written back into the
  tensor's own buffer (`buf.copy_(all_reduce(buf))`, as gradients are reduced; checked), and
  returned as a new tensor (`all_reduce(x)`);
- Gloo used directly from C++ (bench/gloo_allreduce_bench.cpp, gloo::allreduce with
  gloo::sum<float>, the library lazyrt links), loaded with ctypes: in place (a batch of calls
  in one C++ loop, and one call per Python call, as a replay or torch.distributed makes them),
  and from an input buffer into another;
- torch.distributed.all_reduce with the gloo backend (the same libgloo), on a CPU tensor.
Each is checked once (every element equals the sum of the ranks' values) before timing. The
rate is the tensor's bytes over the time of one all-reduce. lazyrt's own kernel timings, over
one more batch, show where its in-place all-reduce spends the time.

(b) A replayed data-parallel training step of a small MLP, 784-256-256-10, batch 64 per
process, cross-entropy, AdamW(lr 1e-3), at 1, 2 and 4 processes: the same step with
reduce_gradients (one bucket: the mean of the 269,322 gradient values) and without it, both
compiled (lazyrt.compile_step), and the all-reduce of as many floats alone (mean, lazyrt in
place; sum, Gloo directly, in a C++ loop and one call per Python call), in turn. What data parallelism adds to a step is the data-parallel
step's time minus the step's without the all-reduce; the kernels it adds, by lazyrt's kernel
timings, show where that time goes. Before timing, the parameters after 3
data-parallel steps are checked against one process training on all processes' batches
together (the mean of the shards' gradients is the gradient of the whole batch).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GLOO_LIBRARY = "libgloo_allreduce_bench.so"
SIZES, QUICK_SIZES = (100_000, 1_000_000, 10_000_000), (1_000, 100_000)
PROCS, QUICK_PROCS = (1, 2, 4), (1, 2)
MLP_SIZES, LOCAL_BATCH, LR = (784, 256, 256, 10), 64, 1e-3
STEPS_CHECKED = 3
TIMEOUT_S = 120  # of every group: a peer that does not answer fails the run instead of hanging it
GOAL_SHARE = 0.9  # collectives within 10% of Gloo's own rate


def calls_for(numel):
    """All-reduces per timed batch (the same on every rank): about 40 MB moved."""
    return max(1, min(200, 10_000_000 // max(numel, 1)))


# ---- the parent: launches the workers and writes the report ----------------------------------

def launch(opts, nproc, worker, *args):
    """Runs `nproc` workers of this file under lazyrt's launcher; returns rank 0's JSON."""
    import lazyrt
    store = tempfile.mkdtemp(prefix="lazyrt-bench-dist-")
    env = dict(os.environ)
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(lazyrt.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_dir] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every peer on the loopback interface
    cmd = [sys.executable, "-m", "lazyrt.distributed.run", "--nproc", str(nproc), os.path.abspath(__file__),
           "--worker", worker, "--store", store, "--build", os.path.abspath(opts.build),
           "--threads", str(opts.threads)] + [str(a) for a in args]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"distributed: {worker} on {nproc} processes took more than {e.timeout} s")
    finally:
        shutil.rmtree(store, ignore_errors=True)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        sys.stderr.write(r.stdout + r.stderr)
        from harness import BenchmarkError
        if "BenchmarkError" in r.stderr:
            raise BenchmarkError(f"distributed: {worker} on {nproc} processes: a check failed")
        raise SystemExit(f"distributed: {worker} on {nproc} processes failed with status {r.returncode}")
    return json.loads(lines[-1])


def run(opts):
    from harness import Samples, num, ratio, table
    sizes = QUICK_SIZES if opts.quick else SIZES
    reps = 2 if opts.quick else 7
    coll = launch(opts, 2, "collectives", "--sizes", ",".join(map(str, sizes)), "--reps", reps,
                  *(("--calls", 5) if opts.quick else ()))
    dp = {n: launch(opts, n, "dp-step", "--reps", 2 if opts.quick else 15, "--calls", 2 if opts.quick else 10)
          for n in (QUICK_PROCS if opts.quick else PROCS)}

    # (a)
    gloo = "Gloo directly (C++)"
    peers = ("lazyrt, in place (replayed)", "lazyrt, new tensor (replayed)", gloo,
             "Gloo directly, one call per Python call (C++)", "Gloo directly, input into output (C++)",
             "torch.distributed (gloo)")
    rows, summary, goal_a, kernel_rows = [], [], [], []
    for n in sizes:
        ms = {p: Samples(coll["seconds"][str(n)][p]).scaled(1e3) for p in peers}
        nbytes = 4 * n
        for p in peers:
            rows.append((f"{n:,} f32 ({nbytes / 1e6:g} MB)", p, ms[p].cell(), num(nbytes / (ms[p].median * 1e-3) / 1e9),
                         f"{ms[gloo].median / ms[p].median:.0%}"))
        share = ms[gloo].median / ms[peers[0]].median
        goal_a.append(f"{n:,} floats: {share:.0%} ({'met' if share >= GOAL_SHARE else 'missed'})")
        for p in (gloo, "torch.distributed (gloo)"):
            summary.append((f"all-reduce of {n:,} f32, 2 processes", "lazyrt in place (replayed)", ms[peers[0]].cell(),
                            "ms", p, ms[p].cell(), ratio(ms[p].median / ms[peers[0]].median)))
        k = coll["kernels"][str(n)]
        others = sorted(((v, op) for op, v in k.items() if op not in ("all_reduce", "(execute)")), reverse=True)
        kernel_rows.append((f"{n:,} f32", num(ms[peers[0]].median), num(k.get("(execute)", 0.0)),
                            num(k.get("all_reduce", 0.0)), ", ".join(f"{op} {num(v)}" for v, op in others) or "-",
                            num(ms[gloo].median)))

    # (b)
    grad_numel = dp[min(dp)]["grad_numel"]
    grad_mb = 4 * grad_numel / 1e6
    dp_rows, goal_b, dp_kernel_rows = [], [], []
    for n, res in sorted(dp.items()):
        ms = {k: Samples(v).scaled(1e3) for k, v in res["seconds"].items()}
        added = ms["dp"].median - ms["plain"].median
        own = ms["gloo"].median
        dp_rows.append((n, ms["plain"].cell(), ms["dp"].cell(), num(added), ms["lazyrt_ar"].cell(), ms["gloo"].cell(),
                        ms["gloo_1"].cell(), "-" if n == 1 else f"{added / own:.2f}x"))
        kd, kp = res["kernels"]["dp"], res["kernels"]["plain"]
        diff = sorted(((kd.get(op, 0.0) - kp.get(op, 0.0), op) for op in set(kd) | set(kp) if op != "(execute)"),
                      reverse=True)
        dp_kernel_rows.append((n, num(added), num(kd.get("(execute)", 0.0) - kp.get("(execute)", 0.0)),
                               ", ".join(f"{op} {'+' if v >= 0 else ''}{num(v)}" for v, op in diff
                                         if abs(v) >= 0.01) or "-"))
        if n > 1:
            goal_b.append(f"{n} processes: {num(added)} ms added against {num(own)} ms "
                          f"({'met' if added <= own else 'missed'})")
            summary.append((f"data-parallel MLP step, {n} processes: time added", "lazyrt replayed", num(added), "ms",
                            f"Gloo all-reduce of the gradients ({grad_mb:.2f} MB)", ms["gloo"].cell(),
                            ratio(own / added) if added > 0 else "-"))

    md = ["## Data-parallel training: collectives and replayed steps on several processes\n",
          f"Every process of this machine ({os.cpu_count()} hardware threads), started by lazyrt's launcher "
          "(`python3 -m lazyrt.distributed.run`); each group meets in a fresh directory (FileStore) and talks over "
          "Gloo's TCP transport on the loopback interface. One process holds each peer's group and runs their "
          f"batches in turn (after 2 warm-up batches each and lazyrt's generated kernels compiled, {reps} batches "
          f"per peer for the all-reduces, {dp[min(dp)]['reps']} for the steps), so the peers see the same load. Times "
          f"are rank 0's. Threads: each process runs the suite's {opts.threads}, or its share of the host's CPUs where "
          "that is fewer (the launcher's default, as torchrun's: the host's CPUs over its processes, at least one), "
          "for lazyrt, OpenBLAS, OpenMP and torch alike. Goals: collectives within 10% of Gloo's own rate; a replayed data-parallel "
          "step adds no more than the all-reduce's own time.\n",
          "### All-reduce (sum, f32, in place) on 2 processes\n",
          "lazyrt in place: `buf.copy_(all_reduce(buf))` replayed by `compile_step`, written back into the tensor's "
          "own buffer as gradients are (checked; the step returns a one-element copy, not the tensor, which would "
          "make every replay write into a fresh buffer); new tensor: `all_reduce(x)` replayed, a new result each call. Gloo directly: "
          "`gloo::allreduce` with `gloo::sum<float>` from C++ (bench/gloo_allreduce_bench.cpp, the libgloo "
          "lazyrt links), in place (the batch's calls in one C++ loop, and one call per Python call, as a replay "
          "or torch.distributed makes them: on this machine a call that follows other work often waits for an "
          "idle CPU to wake, which back-to-back calls rarely do), and from an input buffer into another. "
          "torch.distributed: `all_reduce` on a CPU tensor, gloo backend (the same libgloo). "
          "Every peer's first result is checked (each element the sum of the ranks' values) before timing. "
          "GB/s: the tensor's bytes over the time of one all-reduce; share: Gloo's time over the peer's. "
          f"Batches of {', '.join(str(coll['calls'][str(n)]) for n in sizes)} all-reduces for the sizes in order.\n",
          table(["all-reduce of", "peer", "ms per all-reduce, median [min, max]", "GB/s", "share of Gloo's rate"],
                rows, "llrrr"), "",
          f"lazyrt in place against Gloo's own rate: {'; '.join(goal_a)}.\n",
          "Where lazyrt's in-place all-reduce spends its time: rank 0's own kernel timings "
          "(`lazyrt.metrics.set_kernel_timings`) over one more batch of replays after the timed ones, ms per "
          "all-reduce. The all_reduce kernel holds the communication (Gloo's, as in the last column) and the copy "
          "of its operand into its result; other kernels are the graph's steps after it.\n",
          table(["all-reduce of", "replay (median above), ms", "executable run, ms", "all_reduce kernel, ms",
                 "other kernels, ms", "Gloo alone (median above), ms"], kernel_rows, "lrrrlr"), "",
          "### Replayed data-parallel training step, 1, 2 and 4 processes\n" if not opts.quick else
          "### Replayed data-parallel training step\n",
          f"MLP {'-'.join(map(str, MLP_SIZES))} (ReLU), batch {LOCAL_BATCH} per process, cross-entropy, "
          f"AdamW(lr {LR:g}); every process starts from the same weights (`broadcast_parameters`). Without "
          "all-reduce: the step alone on each process's batch. Data-parallel: the same step with "
          "`reduce_gradients(opt)` between backward and the optimizer (one bucket: the mean of the "
          f"{grad_numel:,} gradient values, {grad_mb:.2f} MB). Both replayed by `compile_step`. All-reduce "
          "alone: that many floats, lazyrt's `copy_(all_reduce(g, 'mean'))` replayed, and Gloo's sum directly "
          "(C++; the batch's calls in one C++ loop, and one call per Python call). "
          f"Batches of {dp[min(dp)]['calls']} calls. Before timing, the parameters after {STEPS_CHECKED} "
          "data-parallel steps are checked against one process training on all the processes' batches together "
          "(each weight within lr a step, 99% within 1e-4). Added = data-parallel - without all-reduce (medians).\n",
          table(["processes", "step without all-reduce, ms", "data-parallel step, ms", "added, ms",
                 "lazyrt all-reduce alone, ms", "Gloo all-reduce alone, ms",
                 "Gloo alone, one call per Python call, ms", "added / Gloo all-reduce"], dp_rows), "",
          f"Time added against the all-reduce's own time (Gloo's): {'; '.join(goal_b) or 'one process only'}. "
          f"With more processes than the machine's {os.cpu_count()} hardware threads, ranks share cores: every "
          "rank's step and each all-reduce wait for the slowest rank.\n",
          "Where the added time goes: rank 0's kernel timings over one more batch of each step after the timed "
          "ones, the data-parallel step's less the step's without all-reduce, ms per step (kernels that differ by "
          "0.01 ms or more).\n",
          table(["processes", "added (median above), ms", "executable run added, ms", "kernels added, ms"],
                dp_kernel_rows, "rrrl"), ""]
    return {"markdown": "\n".join(md), "summary": summary}


# ---- the workers -----------------------------------------------------------------------------

def gloo_direct(build, store, rank, world):
    """Gloo's own all-reduce (bench/gloo_allreduce_bench.cpp), joined in `store`: a function
    (float32 array, calls[, into]) -> seconds per call."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(build, "bench", GLOO_LIBRARY))
    lib.lazyrt_gloo_bench_init.restype = ctypes.c_void_p
    lib.lazyrt_gloo_bench_init.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                                           ctypes.c_char_p, ctypes.c_size_t]
    lib.lazyrt_gloo_bench_allreduce.restype = ctypes.c_double
    lib.lazyrt_gloo_bench_allreduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                ctypes.c_char_p, ctypes.c_size_t]
    error = ctypes.create_string_buffer(1024)
    group = lib.lazyrt_gloo_bench_init(store.encode(), rank, world, float(TIMEOUT_S), error, len(error))
    if not group:
        raise RuntimeError(f"Gloo's group: {error.value.decode()}")

    lib.lazyrt_gloo_bench_allreduce_into.restype = ctypes.c_double
    lib.lazyrt_gloo_bench_allreduce_into.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                     ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]

    def allreduce(array, calls, into=None):
        """In place, or from array into `into` (an array of its size)."""
        out = array if into is None else into
        s = lib.lazyrt_gloo_bench_allreduce_into(group, array.ctypes.data, out.ctypes.data, array.size, calls, error,
                                                 len(error))
        if s < 0:
            raise RuntimeError(f"Gloo's all-reduce: {error.value.decode()}")
        return s
    lib.lazyrt_gloo_bench_destroy.argtypes = [ctypes.c_void_p]
    lib.lazyrt_gloo_bench_destroy.restype = None
    lib.lazyrt_gloo_bench_barrier.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.lazyrt_gloo_bench_barrier.restype = ctypes.c_int

    def close():  # once every rank is done with the group
        if lib.lazyrt_gloo_bench_barrier(group, error, len(error)) != 0:
            raise RuntimeError(f"Gloo's barrier: {error.value.decode()}")
        lib.lazyrt_gloo_bench_destroy(group)
    allreduce.close = close
    return allreduce


def timed(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def in_turn(fns, calls, reps, warmup=2):
    """{name: [seconds per call]} of batches of `calls` calls, the peers in turn, after `warmup`
    batches of each and lazyrt's generated kernels compiled (harness.settle)."""
    import gc
    from harness import settle
    for _ in range(warmup):
        for fn in fns.values():
            fn(calls)
    settle()
    out = {name: [] for name in fns}
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            for name, fn in fns.items():
                out[name].append(fn(calls))
    finally:
        gc.enable()
    return out


def kernel_ms(fn, calls):
    """{kernel op: ms per call} over `calls` calls of fn (replays), by lazyrt's own kernel timings,
    and '(execute)': the executable's whole run."""
    import re
    import lazyrt as lr
    lr.metrics.set_kernel_timings(True)
    lr.metrics.reset()
    try:
        for _ in range(calls):
            fn()
        text = lr.metrics.report()
    finally:
        lr.metrics.set_kernel_timings(False)
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(Kernel:(\S+)|ExecuteTime): (\d+), ([\d.]+) ms", line)
        if m:
            out[m.group(2) or "(execute)"] = float(m.group(4)) / calls
    return out


def check_sum(what, values, world, base):
    from harness import BenchmarkError
    expected = sum(base(r) for r in range(world))
    values = np.asarray(values)
    if not np.all(values == expected):
        bad = int(np.sum(values != expected))
        raise BenchmarkError(f"{what}: {bad} of {values.size} values differ from the sum {expected}")


def worker_collectives(a, rank, world):
    from harness import BenchmarkError
    import lazyrt as lr
    import lazyrt.distributed as dist
    dist.init_process_group(init_method="file://" + os.path.join(a.store, "lazyrt"), rank=rank, world_size=world,
                            timeout=TIMEOUT_S)
    gloo = gloo_direct(a.build, os.path.join(a.store, "gloo"), rank, world)
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(a.threads)
    tdist.init_process_group("gloo", init_method="file://" + os.path.join(a.store, "torch"), rank=rank,
                             world_size=world)

    def base(r):
        return float(r + 1)

    def measure(n):
        # lazyrt, in place: the tensor's own buffer (lazyrt's memory: a NumPy array's is never written).
        buf = lr.full((n,), base(rank))
        lr.mark_step()

        # It returns a one-element slice, not buf: a replay that returns a state tensor it updates
        # writes the update into a fresh buffer every call.
        def in_place():
            buf.copy_(dist.all_reduce(buf))
            return buf[:1] * 1.0
        step_in_place = lr.compile_step(in_place, ())
        step_in_place()
        check_sum(f"lazyrt all_reduce in place, {n} floats", np.array(buf.numpy()), world, base)
        buf.zero_()  # zeros from here on: repeated sums stay finite
        lr.mark_step()
        step_in_place()
        ptr = buf.data_ptr()
        step_in_place()
        if buf.data_ptr() != ptr:
            raise BenchmarkError(f"lazyrt all_reduce in place, {n} floats: the result is not written into the "
                                 "tensor's own buffer")

        x = lr.full((n,), base(rank))
        lr.mark_step()
        step_new = lr.compile_step(lambda t: dist.all_reduce(t), (x,))
        check_sum(f"lazyrt all_reduce, {n} floats", np.array(step_new(x).numpy()), world, base)

        g = np.full(n, base(rank), dtype=np.float32)
        gloo(g, 1)
        check_sum(f"Gloo's allreduce, {n} floats", g, world, base)
        g[:] = 0
        g_in, g_out = np.full(n, base(rank), dtype=np.float32), np.zeros(n, dtype=np.float32)
        gloo(g_in, 1, into=g_out)
        check_sum(f"Gloo's allreduce into another buffer, {n} floats", g_out, world, base)
        check_sum(f"Gloo's allreduce into another buffer, {n} floats: its input", g_in, 1, lambda r: base(rank))

        t = torch.full((n,), base(rank))
        tdist.all_reduce(t)
        check_sum(f"torch.distributed.all_reduce, {n} floats", t.numpy(), world, base)
        t.zero_()

        fns = {
            "lazyrt, in place (replayed)": lambda calls: timed(step_in_place, calls),
            "lazyrt, new tensor (replayed)": lambda calls: timed(lambda: step_new(x), calls),
            "Gloo directly (C++)": lambda calls: gloo(g, calls),
            "Gloo directly, one call per Python call (C++)": lambda calls: timed(lambda: gloo(g, 1), calls),
            "Gloo directly, input into output (C++)": lambda calls: gloo(g_in, calls, into=g_out),
            "torch.distributed (gloo)": lambda calls: timed(lambda: tdist.all_reduce(t), calls),
        }
        seconds = in_turn(fns, a.calls or calls_for(n), a.reps)
        kernels = kernel_ms(step_in_place, a.calls or calls_for(n))
        if step_in_place.traces != 1 or step_new.traces != 1:
            raise RuntimeError("a compiled all-reduce step retraced")
        return seconds, kernels

    measured = {str(n): measure(n) for n in [int(v) for v in a.sizes.split(",")]}
    seconds = {n: m[0] for n, m in measured.items()}
    gloo.close()
    tdist.destroy_process_group()
    dist.destroy_process_group()
    return {"seconds": seconds, "calls": {n: a.calls or calls_for(int(n)) for n in seconds},
            "kernels": {n: m[1] for n, m in measured.items()}}


def mlp_batch(r):
    rng = np.random.default_rng(100 + r)
    x = rng.uniform(-1, 1, (LOCAL_BATCH, MLP_SIZES[0])).astype(np.float32)
    y = rng.integers(0, MLP_SIZES[-1], LOCAL_BATCH).astype(np.int64)
    return x, y


def worker_dp_step(a, rank, world):
    import lazyrt as lr
    import lazyrt.distributed as dist
    import lazyrt.nn.functional as F
    from harness import BenchmarkError, check_close
    dist.init_process_group(init_method="file://" + os.path.join(a.store, "lazyrt"), rank=rank, world_size=world,
                            timeout=TIMEOUT_S)
    gloo = gloo_direct(a.build, os.path.join(a.store, "gloo"), rank, world)

    class Trainer:
        def __init__(self, reduce, seed):
            lr.manual_seed(seed)  # the data-parallel model takes rank 0's weights from the broadcast
            layers = []
            for i in range(len(MLP_SIZES) - 1):
                layers.append(lr.nn.Linear(MLP_SIZES[i], MLP_SIZES[i + 1]))
                if i < len(MLP_SIZES) - 2:
                    layers.append(lr.nn.ReLU())
            self.model = lr.nn.Sequential(*layers)
            if reduce:
                dist.broadcast_parameters(self.model)
            self.opt = lr.optim.AdamW(self.model.parameters(), lr=LR)
            self.reduce = reduce
            lr.mark_step()

        def step(self, x, y):
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            if self.reduce:
                dist.reduce_gradients(self.opt)
            self.opt.step()
            self.opt.zero_grad()
            return loss

        def state(self):
            return {k: np.array(v.numpy()) for k, v in self.model.state_dict().items()}

    x_np, y_np = mlp_batch(rank)
    x, y = lr.tensor(x_np), lr.tensor(y_np)
    # Every model, optimizer and tensor exists before the first step is compiled.
    dp = Trainer(True, 1000 + rank)
    plain = Trainer(False, 0)
    start = dp.state()
    whole = Trainer(False, 0)  # the check's single process, on all the batches, from rank 0's weights
    whole.model.load_state_dict({k: lr.tensor(v) for k, v in start.items()})
    batches = [mlp_batch(r) for r in range(world)]
    xw, yw = lr.tensor(np.concatenate([b[0] for b in batches])), lr.tensor(np.concatenate([b[1] for b in batches]))
    grad_numel = sum(p.numel() for p in dp.model.parameters())
    g = lr.full((grad_numel,), 1.0)
    lr.mark_step()

    def all_reduce_alone():
        g.copy_(dist.all_reduce(g, "mean"))
        return g[:1] * 1.0  # not g: a replay returning it would write into a fresh buffer every call
    dp_step = lr.compile_step(dp.step, (x, y))
    plain_step = lr.compile_step(plain.step, (x, y))
    ar_step = lr.compile_step(all_reduce_alone, ())

    for _ in range(STEPS_CHECKED):
        dp_step(x, y)
    if rank == 0:
        for _ in range(STEPS_CHECKED):
            whole.step(xw, yw)
            lr.mark_step()
        ref, got = whole.state(), dp.state()
        for k in ref:
            what = f"data-parallel MLP step on {world} processes: {k} after {STEPS_CHECKED} steps"
            check_close(what, got[k], ref[k], rtol=0, atol=1.01 * LR * STEPS_CHECKED)
            off = np.mean(np.abs(got[k] - ref[k]) > 1e-4)
            if off > 0.01:
                raise BenchmarkError(f"{what}: {off:.1%} of the values differ by more than 1e-4")
    del whole, xw, yw
    g_np = np.zeros(grad_numel, dtype=np.float32)
    fns = {
        "plain": lambda calls: timed(lambda: plain_step(x, y), calls),
        "dp": lambda calls: timed(lambda: dp_step(x, y), calls),
        "lazyrt_ar": lambda calls: timed(ar_step, calls),
        "gloo": lambda calls: gloo(g_np, calls),
        "gloo_1": lambda calls: timed(lambda: gloo(g_np, 1), calls),
    }
    calls = a.calls or 10
    seconds = in_turn(fns, calls, a.reps)
    kernels = {"dp": kernel_ms(lambda: dp_step(x, y), calls), "plain": kernel_ms(lambda: plain_step(x, y), calls)}
    if dp_step.traces != 1 or plain_step.traces != 1 or ar_step.traces != 1:
        raise RuntimeError("a compiled step retraced")
    gloo.close()
    dist.destroy_process_group()
    return {"seconds": seconds, "grad_numel": grad_numel, "calls": calls, "reps": a.reps, "kernels": kernels}


def worker_main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True, choices=("collectives", "dp-step"))
    p.add_argument("--store", required=True)
    p.add_argument("--build", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sizes", default="1000000")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=0, help="calls a batch (0: the workers' own choice)")
    a = p.parse_args(argv)
    # The suite's thread count, but no more than this process's share of the host's CPUs (what the
    # launcher gives a process where the environment does not say, as torchrun does): N processes
    # of as many threads as the host has would take turns on its CPUs.
    from lazyrt.distributed.run import threads_per_process
    a.threads = min(a.threads, threads_per_process(int(os.environ["LOCAL_WORLD_SIZE"])))
    for name in ("LAZYRT_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[name] = str(a.threads)
    sys.path.insert(0, HERE)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = (worker_collectives if a.worker == "collectives" else worker_dp_step)(a, rank, world)
    if rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
