"""while_loop against the unrolled host loop and a TorchScript scripted loop, N = 10 .. 1,000,000,
from Python. (while_loop_bench, in C++, does the same for a matmul-tanh body up to N = 10,000.)

Workload: carries c = 0 (i64 scalar) and x = 0 (f32 scalar); while c < N: c = c + 1, x = x + 1;
N is a tensor input (an i64 scalar), so the looped forms do not change with N. Forms:
- lazyrt while_loop: `lr.while_loop(lambda c, x: c < n, lambda c, x: (c + 1, x + 1), (c0, x0))`, then
  `lr.sync`: the graph is the same for every N.
- lazyrt host loop: a Python `for` over `c = c + 1; x = x + 1`, then `lr.sync`: the graph grows with N.
- TorchScript: the same `while bool(c < n)` loop in a function compiled by `torch.jit.CompilationUnit`.

Measures per (form, N):
- first run: a cold run, from nothing compiled to the result (lazyrt: its compile cache is cleared
  before; TorchScript: the source is compiled anew, then its first call, the profiling run);
- compile: the part of the first run that is not execution (lazyrt: first run minus its ExecuteTime;
  TorchScript: the CompilationUnit's time);
- run: a warm run, after one more untimed run (lazyrt: compile-cache hit, tracing included as every
  host-side run pays it, after waiting for the background compiler the untimed run may have
  handed the loop's generated code; TorchScript: a call after the profiling and the optimizing
  calls);
- memory: C heap in use once the program is built, above the start of the first run (lazyrt:
  the traced graph, before it runs; TorchScript: after the first call, its compiled and profiled
  function alive), and lazyrt's own device-buffer peak.
Results are checked (c = x = N) on every run.
"""

import math
import os
import time

import torch

import lazyrt as lr
from harness import BenchmarkError, Samples, heap_in_use, table

SIZES = (10, 100, 1000, 10_000, 100_000, 1_000_000)
QUICK_SIZES = SIZES[:2]
# Projected seconds of one run up to which a cell gets 3 cold and 3 to 5 warm runs; beyond, up
# to the second figure, one of each (no spread); beyond that the form stops.
RUN_BUDGET_S, SINGLE_RUN_BUDGET_S = 2.0, 12.0
QUICK_RUN_BUDGET_S = 0.05
# The unrolled graph is a chain N deep; past this it is not tried at all.
HOST_LOOP_MAX_N = 100_000

TORCHSCRIPT_SOURCE = """
def scalar_loop(n: Tensor):
    c = torch.zeros((), dtype=torch.long)
    x = torch.zeros((), dtype=torch.float)
    while bool(c < n):
        c = c + 1
        x = x + 1
    return c, x
"""


def check(form, n, c, x):
    if int(c) != n or float(x) != float(n):
        raise BenchmarkError(f"loop scaling, {form} at N = {n}: got c = {c}, x = {x}, expected both {n}")


def instrument(tensors):
    """(graph nodes or None, heap in use now, seconds this took) -- only for cold runs, whose
    times leave these seconds out: mallinfo2 walks the heap's free lists and can take
    milliseconds on a fragmented heap."""
    t0 = time.perf_counter()
    built = heap_in_use()
    nodes = lr.debug.graph_node_count(tensors) if tensors else None
    return nodes, built, time.perf_counter() - t0


def finish(name, n, c, x, cold):
    """Syncs and checks the carries; returns instrument()'s figures for a cold run, else Nones."""
    figures = instrument([c, x]) if cold else (None, None, 0.0)
    lr.sync([c, x])
    check(name, n, c.item(), x.item())
    return figures


class LazyrtForm:
    def forget(self):
        """Drops every compiled program, so that the next run is cold."""
        lr.cache.clear_memory()

    def settle(self):
        """Waits for the code the background compiler was handed (a loop made hot)."""
        lr._C._jit.wait_idle()


class LazyrtWhile(LazyrtForm):
    name = "lazyrt while_loop"

    def run(self, n, cold):
        limit = lr.tensor(n, dtype=lr.int64)
        c0, x0 = lr.tensor(0, dtype=lr.int64), lr.tensor(0.0)
        c, x = lr.while_loop(lambda c, x: c < limit, lambda c, x: (c + 1, x + 1), (c0, x0))
        return finish(self.name, n, c, x, cold)


class LazyrtHostLoop(LazyrtForm):
    name = "lazyrt host loop (unrolled)"

    def run(self, n, cold):
        c, x = lr.tensor(0, dtype=lr.int64), lr.tensor(0.0)
        for _ in range(n):
            c = c + 1
            x = x + 1
        return finish(self.name, n, c, x, cold)


class TorchScriptLoop:
    name = "TorchScript scripted loop"

    def __init__(self):
        self.fn = None

    def forget(self):
        self.fn = None

    def settle(self):
        pass

    def run(self, n, cold):
        if cold:
            t0 = time.perf_counter()
            self.fn = torch.jit.CompilationUnit(TORCHSCRIPT_SOURCE).scalar_loop
            self.compile_s = time.perf_counter() - t0
        with torch.no_grad():
            c, x = self.fn(torch.tensor(n))
        figures = instrument(None) if cold else (None, None, 0.0)
        check(self.name, n, c.item(), x.item())
        return figures


def project(history, n):
    """Seconds a run at N = n should take, from the last two sizes run: time ~ N^k with k
    fitted between them and held within [1, 3] (at small N fixed costs hide the growth)."""
    if not history:
        return 0.0
    n1, t1 = history[-1]
    k = 1.0
    if len(history) > 1:
        n0, t0 = history[-2]
        k = min(3.0, max(1.0, math.log(max(t1, 1e-9) / max(t0, 1e-9)) / math.log(n1 / n0)))
    return t1 * (n / n1) ** k


def measure(form, n, cold_reps, warm_reps):
    """{first, compile, run: Samples of seconds; memory, device: Samples of bytes; nodes}."""
    first, compile_, memory, device, nodes = [], [], [], [], None
    for _ in range(cold_reps):
        form.forget()  # before the heap base: what this frees belongs to earlier runs
        lr.metrics.reset()
        lr.debug.reset_peak_memory()
        device_base = lr.debug.live_memory_bytes()
        base = heap_in_use()
        t0 = time.perf_counter()
        nodes, built, instrumenting = form.run(n, cold=True)
        elapsed = time.perf_counter() - t0 - instrumenting
        memory.append(built - base)
        device.append(lr.debug.peak_memory_bytes() - device_base)
        first.append(elapsed)
        if isinstance(form, TorchScriptLoop):
            compile_.append(form.compile_s)
        else:
            compile_.append(elapsed - lr.metrics.timing_total_ns("ExecuteTime") * 1e-9)
    form.run(n, cold=False)  # not counted: TorchScript optimizes the graph on its second call
    form.settle()
    warm = []
    for _ in range(warm_reps):
        t0 = time.perf_counter()
        form.run(n, cold=False)
        warm.append(time.perf_counter() - t0)
    return {"first": Samples(first), "compile": Samples(compile_), "run": Samples(warm),
            "memory": Samples(memory), "device": Samples(device), "nodes": nodes}


def run(opts):
    budget = QUICK_RUN_BUDGET_S if opts.quick else RUN_BUDGET_S
    single_budget = QUICK_RUN_BUDGET_S if opts.quick else SINGLE_RUN_BUDGET_S
    forms = [LazyrtWhile(), LazyrtHostLoop(), TorchScriptLoop()]
    results = {f.name: {} for f in forms}
    skipped = {}
    for form in forms:
        history = []  # (N, seconds of its slowest run)
        for n in QUICK_SIZES if opts.quick else SIZES:
            if isinstance(form, LazyrtHostLoop) and n > HOST_LOOP_MAX_N:
                skipped[form.name] = (n, None)
                break
            projected = project(history, n)
            if projected > single_budget:
                skipped[form.name] = (n, projected)
                break
            if projected > budget:
                r = measure(form, n, cold_reps=1, warm_reps=1)
            else:
                r = measure(form, n, cold_reps=3, warm_reps=5 if not history or history[-1][1] < 0.05 else 3)
            results[form.name][n] = r
            history.append((n, max(r["first"].median, r["run"].median)))

    rows = []
    for n in SIZES:
        for form in forms:
            r = results[form.name].get(n)
            if r is None:
                continue
            rows.append([f"{n:,}", form.name, "-" if r["nodes"] is None else f"{r['nodes']:,}",
                         r["compile"].cell(1e3), r["first"].cell(1e3), r["run"].cell(1e3),
                         f"{r['run'].median / n * 1e9:.0f}", r["memory"].cell(2 ** -10),
                         "-" if isinstance(form, TorchScriptLoop) else r["device"].cell(2 ** -10)])
    notes = []
    for name, (n, projected) in skipped.items():
        if projected is None:
            notes.append(f"- {name}: not run from N = {n:,} on (a chain of {n:,} nodes is beyond this study).")
        else:
            notes.append(f"- {name}: not run from N = {n:,} on: one run was projected at {projected:.1f} s "
                         f"(budget {single_budget} s a run).")
    plot = plot_scaling(results, opts.plots) if opts.plots else None

    md = ["## while_loop, unrolled host loop and TorchScript loop from Python: N = 10 .. 1,000,000\n",
          "Workload: c = 0 (i64), x = 0 (f32); `while c < N: c = c + 1; x = x + 1`, N an i64 tensor input. "
          "first run = cold (lazyrt: compile cache cleared, then trace, compile, execute; TorchScript: "
          "`torch.jit.CompilationUnit` of the source, then the first call, which profiles); compile = the first "
          "run less lazyrt's ExecuteTime, or TorchScript's source compilation; run = a warm run (lazyrt: cache "
          "hit, tracing included; TorchScript: after the profiling call and the optimizing one). 3 cold runs, "
          "then 1 warm-up run (not counted), then 3 to 5 warm runs; where one run was projected beyond "
          f"{budget} s, one cold run, the warm-up and one warm run (a single figure, no spread). heap KiB: C heap "
          "in use once the program is built, above the start of the cold run (lazyrt: the traced graph before it "
          "runs; TorchScript: after the first call, its compiled, profiled function alive); lazyrt device peak: "
          "the buffers lazyrt itself accounts (tensor data, arenas, constants) above what was live before. ms "
          "cells: median [min, max]. Every run's c and x are checked equal to N.\n",
          table(["N", "form", "graph nodes", "compile ms", "first run ms", "run ms", "run ns / iteration",
                 "heap KiB", "lazyrt device peak KiB"], rows, "rllrrrrrr"), ""]
    md += notes
    if plot:
        md.append(f"\n![while_loop scaling]({plot})\n")
    summary = []
    for name in ("TorchScript scripted loop", "lazyrt host loop (unrolled)"):
        common = [n for n in SIZES if n in results[name] and n in results["lazyrt while_loop"]]
        if common:
            n = common[-1]
            w, r = results["lazyrt while_loop"][n], results[name][n]
            for key, what in (("first", "first (cold) run"), ("run", "warm run")):
                summary.append((f"scalar loop, N = {n:,}: {what}", "lazyrt while_loop", w[key].cell(1e3), "ms", name,
                                r[key].cell(1e3), f"{r[key].median / w[key].median:.1f}x"))
    return {"markdown": "\n".join(md), "summary": summary}


def plot_scaling(results, plots_dir):
    """Writes the three panels as one PNG; returns its path relative to bench/."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plots_dir, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    axes = axes.flatten()
    panels = [("compile", 1e3, "compile (ms)"), ("first", 1e3, "first (cold) run (ms)"),
              ("run", 1e3, "warm run (ms)"), ("memory", 2 ** -10, "C heap held by the built program (KiB)")]
    for ax, (key, scale, label) in zip(axes, panels):
        for name, by_n in results.items():
            ns = sorted(by_n)
            if not ns:
                continue
            med = [by_n[n][key].median * scale for n in ns]
            lo = [by_n[n][key].min * scale for n in ns]
            hi = [by_n[n][key].max * scale for n in ns]
            ax.plot(ns, med, marker="o", label=name)
            ax.fill_between(ns, lo, hi, alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("symlog" if key == "memory" else "log")  # a heap delta can be 0 or below
        ax.set_xlabel("N (iterations)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("c, x = c + 1, x + 1 while c < N: median and [min, max]")
    fig.tight_layout()
    path = os.path.join(plots_dir, "while_loop_scaling.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.path.relpath(path, os.path.dirname(os.path.abspath(__file__)))
