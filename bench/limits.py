"""The machine's limits for elementwise and optimizer work: bench/limits.c (STREAM's copy and
triad, torch's AdamW update), built by bench/CMakeLists.txt as build/bench/liblazyrt_limits.so
(gcc -O3 -march=native), loaded here with ctypes. Each function returned does one pass, so a
benchmark times it in turn with its steps (harness.time_side_by_side): the limit sees the same
machine load as the steps it is compared with.

Rates count the bytes the pattern must move, as STREAM does (the read-for-ownership of a
written line is not counted): copy 8 bytes per element, triad 12, AdamW 28 per parameter
(read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq).
"""

import ctypes
import os

import numpy as np

from harness import BenchmarkError, check_close

LIBRARY = "liblazyrt_limits.so"
COPY_BYTES, TRIAD_BYTES, ADAMW_BYTES = 8, 12, 28
# STREAM's rule: each array at least 4 times the last-level cache. 2^25 f32 = 128 MiB an array.
STREAM_NUMEL = 2 ** 25


def library(build):
    """The limits library of the build tree (BenchmarkError when it is not built)."""
    path = os.path.join(build, "bench", LIBRARY)
    if not os.path.exists(path):
        raise BenchmarkError(f"{path} is not built: cmake --build {build} --target lazyrt_benchmarks")
    lib = ctypes.CDLL(path)
    size_t, fptr = ctypes.c_size_t, ctypes.c_void_p
    lib.lazyrt_limits_copy.argtypes = [fptr, fptr, size_t]
    lib.lazyrt_limits_copy.restype = None
    lib.lazyrt_limits_copy_timed_ns.argtypes = [fptr, fptr, size_t, size_t]
    lib.lazyrt_limits_copy_timed_ns.restype = ctypes.c_double
    lib.lazyrt_limits_counter_loop.argtypes = [fptr, fptr, fptr]
    lib.lazyrt_limits_counter_loop.restype = None
    lib.lazyrt_limits_triad.argtypes = [fptr, fptr, fptr, ctypes.c_float, size_t]
    lib.lazyrt_limits_triad.restype = None
    lib.lazyrt_limits_adamw.argtypes = [size_t, fptr, fptr, fptr, fptr, fptr] + [ctypes.c_double] * 5 + [
        ctypes.c_int64]
    lib.lazyrt_limits_adamw.restype = None
    lib.lazyrt_limits_layer_norm.argtypes = [fptr, fptr, fptr, fptr, size_t, size_t, ctypes.c_float]
    lib.lazyrt_limits_softmax.argtypes = [fptr, fptr, size_t, size_t]
    lib.lazyrt_limits_row_mse.argtypes = [fptr, fptr, fptr, size_t, size_t]
    for f in (lib.lazyrt_limits_layer_norm, lib.lazyrt_limits_softmax, lib.lazyrt_limits_row_mse):
        f.restype = None
    lib.path = path
    return lib


class Stream:
    """STREAM's copy and triad over f32[numel] arrays, checked once. copy() and triad() do one
    pass each; bytes per pass in copy_bytes, triad_bytes."""

    def __init__(self, lib, numel=STREAM_NUMEL):
        rng = np.random.default_rng(0)
        self.a = np.zeros(numel, dtype=np.float32)
        self.b = rng.random(numel, dtype=np.float32)
        self.c = rng.random(numel, dtype=np.float32)
        self.numel, self.scalar = numel, 3.0
        a, b, c = (x.ctypes.data for x in (self.a, self.b, self.c))
        self.copy = lambda: lib.lazyrt_limits_copy(a, b, numel)
        self.triad = lambda: lib.lazyrt_limits_triad(a, b, c, self.scalar, numel)
        self.copy()
        if not np.array_equal(self.a, self.b):
            raise BenchmarkError("the copy limit does not copy")
        self.triad()
        check_close("the triad limit", self.a, self.b + np.float32(self.scalar) * self.c, rtol=1e-6, atol=1e-6)
        self.copy_bytes, self.triad_bytes = COPY_BYTES * numel, TRIAD_BYTES * numel


class AdamW:
    """torch.optim.AdamW's update in C over copies of the given parameters and gradients (f32
    arrays), with fresh state. step() does one update (the step count advances); params are the
    updated parameters. bytes: what a step must move."""

    def __init__(self, lib, params, grads, lr, betas, eps, weight_decay):
        self.params = [np.array(p, dtype=np.float32) for p in params]
        self.grads = [np.array(g, dtype=np.float32) for g in grads]
        self.exp_avgs = [np.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [np.zeros_like(p) for p in self.params]
        n = len(self.params)

        def pointers(arrays):
            return (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
        self._args = [n, pointers(self.params), pointers(self.grads), pointers(self.exp_avgs),
                      pointers(self.exp_avg_sqs), (ctypes.c_size_t * n)(*[p.size for p in self.params])]
        self._hyper = [lr, betas[0], betas[1], eps, weight_decay]
        self._lib, self.steps = lib, 0
        self.bytes = ADAMW_BYTES * sum(p.size for p in self.params)

    def step(self):
        self.steps += 1
        self._lib.lazyrt_limits_adamw(*self._args, *self._hyper, self.steps)


def checked_adamw(lib, params, grads, hyper, steps=3):
    """An AdamW of the C library whose parameters after `steps` updates were checked against
    torch.optim.AdamW(foreach=False)'s on the same data (rtol 1e-5, atol 1e-6; BenchmarkError
    otherwise), then reset to their initial values and fresh state."""
    import torch
    ps = [torch.nn.Parameter(torch.from_numpy(np.array(p, dtype=np.float32))) for p in params]
    for p, g in zip(ps, grads):
        p.grad = torch.from_numpy(np.array(g, dtype=np.float32))
    opt = torch.optim.AdamW(ps, foreach=False, **hyper)
    c = AdamW(lib, params, grads, **hyper)
    for _ in range(steps):
        opt.step()
        c.step()
    check_close(f"the AdamW limit (C) against torch.optim.AdamW: parameters after {steps} steps",
                np.concatenate(c.params), np.concatenate([p.detach().numpy() for p in ps]), rtol=1e-5, atol=1e-6)
    check_close(f"the AdamW limit (C) against torch.optim.AdamW: exp_avg_sq after {steps} steps",
                np.concatenate(c.exp_avg_sqs),
                np.concatenate([opt.state[p]["exp_avg_sq"].numpy() for p in ps]), rtol=1e-5, atol=1e-12)
    return AdamW(lib, params, grads, **hyper)


def copy_timed_ns(lib, nbytes, reps):
    """The mean time (ns) of a C copy of nbytes (at least 8), each of reps copies timed on its own
    with the monotonic clock, as lazyrt's step timings time each step; the arrays stay in cache
    when they fit, as a step's operands do."""
    numel = max(nbytes // COPY_BYTES, 1)
    a, b = np.zeros(numel, dtype=np.float32), np.ones(numel, dtype=np.float32)
    ns = lib.lazyrt_limits_copy_timed_ns(a.ctypes.data, b.ctypes.data, numel, reps)
    if not np.array_equal(a, b):
        raise BenchmarkError("the timed copy does not copy")
    return ns


# Kernels whose limit is arithmetic, not bytes (the GEMM limit and the convolution rows cover them).
COMPUTE_BOUND_OPS = ("matmul", "gemm", "conv2d", "conv2d_backward_input", "conv2d_backward_weight")


def step_kernels(lib, run, calls, reps=200):
    """The kernels of a replayed step against their byte limits: `run` (one step) runs `calls`
    times with lazyrt's kernel timings on; the executable that ran as often, and longest, is the
    step's. For each of its steps whose op is not compute-bound: its mean time per run, the bytes
    it must move (its operands and results once), and a C copy of as many bytes timed the same
    way (copy_timed_ns). Then `calls` more runs with the timings' alone runs on (each step run
    again, its operands now in cache, as the copy's are): its mean time alone (alone_ns). Returns
    (rows, total kernel ns, total limit ns), rows as dicts sorted by time, longest first."""
    import lazyrt as lr

    def timed(alone):
        lr.metrics.reset()
        lr.metrics.set_kernel_timings(True, alone=alone)
        try:
            for _ in range(calls):
                run()
        finally:
            lr.metrics.set_kernel_timings(False)
        return lr.metrics.step_timings()
    steps = timed(False)
    alone = {(s["executable"], s["step"]): s["alone_ns"] / s["alone_runs"] for s in timed(True) if s["alone_runs"]}
    per_exe = {}
    for s in steps:
        if s["runs"] == calls:
            per_exe[s["executable"]] = per_exe.get(s["executable"], 0) + s["total_ns"]
    if not per_exe:
        raise BenchmarkError("step kernels: no executable ran once per call")
    exe = max(per_exe, key=per_exe.get)
    rows, limits_ns = [], {}
    for s in steps:
        if s["executable"] != exe or s["op"] in COMPUTE_BOUND_OPS:
            continue
        if s["bytes"] not in limits_ns:
            limits_ns[s["bytes"]] = copy_timed_ns(lib, s["bytes"], reps)
        ns = s["total_ns"] / s["runs"]
        rows.append(dict(step=s["step"], op=s["op"], bytes=s["bytes"], ns=ns, limit_ns=limits_ns[s["bytes"]],
                         alone_ns=alone.get((exe, s["step"]))))
    rows.sort(key=lambda r: -r["ns"])
    return rows, sum(r["ns"] for r in rows), sum(r["limit_ns"] for r in rows)


def step_kernels_markdown(kernels, kernels_ns, limit_ns, calls):
    """step_kernels' rows as a section of the report."""
    from harness import table

    def share(limit, ns):
        return f"{limit / ns:.0%}" if ns else "-"
    below = [k for k in kernels if k["limit_ns"] / k["ns"] < 0.7]
    alone = [k for k in kernels if k["alone_ns"]]
    below_alone = [k for k in alone if k["limit_ns"] / k["alone_ns"] < 0.7]
    alone_ns = sum(k["alone_ns"] for k in alone)
    rows = [[k["step"], k["op"], f"{k['bytes']:,}", f"{k['ns'] / 1e3:.2f}", f"{k['limit_ns'] / 1e3:.2f}",
             share(k["limit_ns"], k["ns"]), f"{k['alone_ns'] / 1e3:.2f}" if k["alone_ns"] else "-",
             share(k["limit_ns"], k["alone_ns"])] for k in kernels]
    rows.append(["all", "", f"{sum(k['bytes'] for k in kernels):,}", f"{kernels_ns / 1e3:.2f}",
                 f"{limit_ns / 1e3:.2f}", f"{limit_ns / kernels_ns:.0%}", f"{alone_ns / 1e3:.2f}",
                 share(sum(k["limit_ns"] for k in alone), alone_ns)])
    return "\n".join([
        "### The step's kernels besides its products, against their byte limits\n",
        f"With kernel timings on, the replayed step ran {calls} more times; each step of its executable was timed "
        "on its own (two clock reads around it). bytes: its operands and results, each once (what it must read and "
        "write at least). limit: a C copy of as many bytes (bench/limits.c, -O3 -march=native), each copy timed on "
        "its own the same way, its arrays in cache where they fit. share = limit / time. alone: in "
        f"{calls} further runs, each step ran three times more right after its timed run, on the same operands "
        "(those its results overwrite put back first), so with its operands and code in cache as the copy has "
        "them; the mean of those runs. Between a step's operands' producer and the step, the kernels of the step "
        "in between (products streaming megabytes, an optimizer update streaming tens) evict them: the gap between "
        "the two columns is that, the gap between alone and the limit the kernel's own. Products (gemm) are left "
        "to the GEMM limit. Mean times per run, longest first.\n",
        table(["step", "op", "bytes", "us per run", "limit us", "share of the limit", "alone us", "share alone"], rows),
        f"\n{len(kernels) - len(below)} of {len(kernels)} kernels reach 70% of their limit in the step, "
        f"{len(alone) - len(below_alone)} of {len(alone)} alone; together they reach {limit_ns / kernels_ns:.0%} in the "
        f"step. Those below 70% take {sum(k['ns'] for k in below) / 1e3:.1f} us per step "
        f"({sum(k['ns'] for k in below) / kernels_ns:.0%} of these kernels' time).\n",
    ])


def counter_loop(lib, n):
    """A function running bench/limits.c's counter loop to N = n and returning (c, x) as Python
    numbers (as bench/loop_timing.measure_loop calls the peers' loops)."""
    limit, c, x = ctypes.c_int64(n), ctypes.c_int64(), ctypes.c_float()

    def call():
        lib.lazyrt_limits_counter_loop(ctypes.byref(limit), ctypes.byref(c), ctypes.byref(x))
        return c.value, float(x.value)
    return call
