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
    lib.lazyrt_limits_triad.argtypes = [fptr, fptr, fptr, ctypes.c_float, size_t]
    lib.lazyrt_limits_triad.restype = None
    lib.lazyrt_limits_adamw.argtypes = [size_t, fptr, fptr, fptr, fptr, fptr] + [ctypes.c_double] * 5 + [
        ctypes.c_int64]
    lib.lazyrt_limits_adamw.restype = None
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
