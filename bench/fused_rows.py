"""Reductions fused with the elementwise work around them, row by row: a layer norm, a softmax
written out of its parts, and a mean squared error per row, each over the rows of a GPT
step's activations (batch 8 x 256 tokens), against PyTorch eager and the machine's limit.

Workloads (f32, numpy default_rng(3)):
  layer norm   F.layer_norm(x, [384], w, b) over x f32[2048, 384] (lazyrt: mean, variance,
               normalization, weight and bias as one kernel);
  softmax      exp(x - amax(x, -1)) / sum(exp(...), -1) over x f32[2048, 256], written out as
               a user would (PyTorch eager: the same ops, and torch.softmax, its library kernel);
  row MSE      ((x - t) ** 2).mean(-1) over x, t f32[2048, 384].
lazyrt runs each as a replayed step (compile_step) on the same input each call.

The limit (bench/limits.c, gcc -O3 -march=native, one thread): the bytes a pass must move (read
every input once, write every output once) at the rate of a C copy of as many bytes (STREAM's
copy over arrays of that size, timed in turn with the peers). These arrays stay in the
last-level cache, as the workloads' do, so the limit is the cache's rate, not DRAM's.
"""

import numpy as np
import torch

import lazyrt as lr
import limits
from harness import BenchmarkError, Samples, check_close, ratio, table, time_side_by_side

ROWS = 2048
C_PEER = "lazyrt's arithmetic in C (f64 sums, its exp)"
QUICK_ROWS = 256
STEPS_CHECKED = 2


def arithmetic(lib, name, arrays):
    """The workload's arithmetic in C (limits.c), as lazyrt defines it: (one pass, its output)."""
    x = arrays[0]
    rows, n = x.shape
    if name == "layer norm":
        w, b, out = arrays[1], arrays[2], np.empty_like(x)
        return (lambda: lib.lazyrt_limits_layer_norm(x.ctypes.data, w.ctypes.data, b.ctypes.data, out.ctypes.data,
                                                     rows, n, 1e-5)), out
    if name == "softmax, written out":
        out = np.empty_like(x)
        return (lambda: lib.lazyrt_limits_softmax(x.ctypes.data, out.ctypes.data, rows, n)), out
    t, out = arrays[1], np.empty(rows, dtype=np.float32)
    return (lambda: lib.lazyrt_limits_row_mse(x.ctypes.data, t.ctypes.data, out.ctypes.data, rows, n)), out


def workloads(rows):
    rng = np.random.default_rng(3)
    x384 = (rng.standard_normal((rows, 384)) * 2 + 0.5).astype(np.float32)
    t384 = rng.standard_normal((rows, 384)).astype(np.float32)
    x256 = (rng.standard_normal((rows, 256)) * 3).astype(np.float32)
    w = rng.standard_normal(384).astype(np.float32)
    b = rng.standard_normal(384).astype(np.float32)

    def softmax_parts(mod):
        def f(x):
            e = mod.exp(x - x.amax(-1, keepdim=True))
            return e / e.sum(-1, keepdim=True)
        return f
    lw, lb, tw, tb = lr.tensor(w), lr.tensor(b), torch.from_numpy(w), torch.from_numpy(b)
    return [
        ("layer norm", f"f32[{rows}, 384]", (x384,),
         lambda x: lr.nn.functional.layer_norm(x, [384], lw, lb, 1e-5),
         {"PyTorch eager (F.layer_norm)": lambda x: torch.nn.functional.layer_norm(x, [384], tw, tb, 1e-5)},
         2 * x384.nbytes, (x384, w, b)),
        ("softmax, written out", f"f32[{rows}, 256]", (x256,), softmax_parts(lr),
         {"PyTorch eager (the same ops)": softmax_parts(torch),
          "PyTorch eager (torch.softmax)": lambda x: torch.softmax(x, -1)},
         2 * x256.nbytes, (x256,)),
        ("row MSE", f"f32[{rows}, 384] x2", (x384, t384), lambda x, t: ((x - t) * (x - t)).mean(-1),
         {"PyTorch eager (the same ops)": lambda x, t: ((x - t) * (x - t)).mean(-1)},
         x384.nbytes + t384.nbytes + rows * 4, (x384, t384)),
    ]


def jit_totals():
    """Generated modules and kernels so far, and the milliseconds spent compiling them."""
    m = lr.metrics
    return m.counter("JitModules"), m.counter("JitKernels"), m.timing_total_ns("JitCompileTime") / 1e6


def run(opts):
    rows = QUICK_ROWS if opts.quick else ROWS
    lib = limits.library(opts.build)
    reps = 3 if opts.quick else 9
    out_rows, summary, compiled = [], [], []
    for name, shape, arrays, lazy_fn, torch_fns, must_move, c_arrays in workloads(rows):
        jit0 = jit_totals()
        lx = [lr.tensor(a) for a in arrays]
        tx = [torch.from_numpy(a) for a in arrays]
        ref = next(iter(torch_fns.values()))(*tx).numpy()
        replayed = lr.compile_step(lazy_fn, tuple(lx))
        for _ in range(STEPS_CHECKED):
            check_close(f"{name}: lazyrt replayed", replayed(*lx).numpy(), ref, rtol=1e-5, atol=1e-5)
        for peer, fn in torch_fns.items():
            check_close(f"{name}: {peer}", fn(*tx).numpy(), ref, rtol=1e-5, atol=1e-5)
        copy = limits.Stream(lib, must_move // limits.COPY_BYTES)
        c_pass, c_out = arithmetic(lib, name, c_arrays)
        c_pass()
        check_close(f"{name}: {C_PEER}", c_out, ref, rtol=1e-5, atol=1e-5)
        fns = {"lazyrt replayed (compile_step)": lambda: replayed(*lx)}
        fns.update({peer: (lambda fn=fn: fn(*tx)) for peer, fn in torch_fns.items()})
        fns[C_PEER] = c_pass
        fns["copy"] = copy.copy
        ms = {k: s.scaled(1e3) for k, s in time_side_by_side(fns, 20, reps, warmup=2).items()}
        if replayed.traces != 1:
            raise BenchmarkError(f"{name}: compile_step retraced")
        copy_ms = ms.pop("copy")
        modules, kernels, compile_ms = (b - a for a, b in zip(jit0, jit_totals()))
        compiled.append((name, modules, kernels, f"{compile_ms:.1f}",
                         f"{compile_ms / kernels:.1f}" if kernels else "-"))
        limit = Samples(t * must_move / copy.copy_bytes for t in copy_ms.values)
        base = ms["lazyrt replayed (compile_step)"]
        for peer, s in ms.items():
            out_rows.append((name, shape, peer, s.cell(), f"{must_move / (s.median * 1e-3) / 1e9:.1f}",
                             f"{limit.median / s.median:.0%}", ratio(s.median / base.median)))
        out_rows.append((name, shape, "the limit: a C copy of the same bytes", limit.cell(),
                         f"{must_move / (limit.median * 1e-3) / 1e9:.1f}", "100%", ratio(limit.median / base.median)))
        for peer in torch_fns:
            summary.append((f"{name}, {shape}", "lazyrt replayed", base.cell(), "ms", peer, ms[peer].cell(),
                            ratio(ms[peer].median / base.median)))
        summary.append((f"{name}: bandwidth limit", "lazyrt replayed", base.cell(), "ms",
                        "a C copy of the same bytes", limit.cell(), ratio(limit.median / base.median)))
        summary.append((f"{name}: arithmetic limit", "lazyrt replayed", base.cell(), "ms", C_PEER,
                        ms[C_PEER].cell(), ratio(ms[C_PEER].median / base.median)))
    md = ["## Fused reductions: a layer norm, a softmax written out, a mean squared error per row\n",
          f"Each over the rows of a GPT step's activations ({rows} rows), f32, inputs from numpy "
          f"`default_rng(3)`; every peer's result checked against PyTorch's (rtol 1e-5, atol 1e-5) before "
          f"timing. lazyrt runs each as one replayed step whose reductions and elementwise ops are one fused "
          f"kernel, row by row. After 2 warm-up batches (and lazyrt's generated kernels compiled), {reps} "
          "batches of 20 calls per peer, alternating. The limit: the bytes a pass must move (each input read "
          "once, each output written once) at the rate of a C copy (bench/limits.c, -O3 -march=native) of "
          "as many bytes, timed in turn with the peers; the arrays stay in the last-level cache, as the "
          "workloads' do. share of the limit = the limit's time over the peer's (medians).\n\n"
          f"{C_PEER}: the same work written once in C (bench/limits.c, -O3 -march=native, one thread) with "
          "lazyrt's arithmetic: each row's sums in double as sixteen interleaved partial sums added in order "
          "(a layer norm's mean, then its squared deviations), the elementwise work in f32, exp from lazyrt's "
          "polynomial. A limit of the arithmetic, not of the bytes: its row is how far the kernel's own "
          "driving (passes, chunks, calls into generated loops) stands from the work itself, and its gap to "
          "the copy is what those exact sums and that exp cost.\n",
          table(["workload", "input", "peer", "ms per call, median [min, max]", "GB/s moved", "share of the limit",
                 "vs lazyrt replayed"], out_rows, "lllrrrr"), "",
          "lazyrt's generated code for each workload (its step's module: every pass of a fused reduction is a "
          "kernel of its own), compiled on the background thread while the first calls ran interpreted "
          "(`JitModules`, `JitKernels`, `JitCompileTime`):\n",
          table(["workload", "modules", "kernels", "compile ms", "ms per kernel"], compiled, "lrrrr"), ""]
    return {"markdown": "\n".join(md), "summary": summary}
