"""The programs suite (tests/python/programs/: public PyTorch example programs, ported) timed as
their users run them: each program's training step in PyTorch eager against the same step
through lazyrt.torch.compile, one row per program, with the graph breaks and captures the
compiled step took.

Each program is built twice from one seed (its models, optimizers and schedulers), and both
copies run the same batches. Before timing, the first CHECKED calls are compared: programs
without random draws inside the step must agree with eager (results, parameters, gradients,
buffers, optimizer state: the programs suite's tolerance, see tests/python/programs/_compare.py);
programs whose step draws dropout masks or noise cannot match eager bit for bit (lazyrt draws
from its own generator) and are checked here for finite losses only: their masks and values
are checked by the programs suite itself (the eager oracle replays lazyrt's masks).

Timing: batches of calls alternating between eager and compiled (harness.time_side_by_side),
each call on the next batch of a fixed list, so both keep training. The first call (the
capture and compile) is timed on its own. The ratio is eager's median time over compiled's:
above 1, lazyrt is faster.
"""

import math
import os
import sys
import time

import torch

from harness import BenchmarkError, calls_for, ratio, table, time_side_by_side

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS_DIR = os.path.join(HERE, "..", "tests", "python", "programs")
CHECKED = 2
# Each value within 1e-4 of its own magnitude plus 1e-4 of its tensor's largest: float32 sums in
# another order, which an optimizer dividing by a gradient's size (Adam's first steps) can turn
# into 1e-4 of lr (the accuracy against float64 is tests/python/programs/test_accuracy.py's).
RTOL = 1e-4


def _modules():
    """The programs suite's _compare and _suite modules."""
    if PROGRAMS_DIR not in sys.path:
        sys.path.insert(0, PROGRAMS_DIR)
    import _compare
    import _suite
    return _compare, _suite


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _check(p, cmp, eager, e_state, lazy, l_state, batches):
    for k in range(CHECKED):
        args = batches[k % len(batches)]
        a_lazy, a_eager = (_clone(args), _clone(args)) if p.clone else (args, args)
        got, want = lazy(*a_lazy), eager(*a_eager)
        if p.random:
            losses = [v for v in torch.utils._pytree.tree_leaves(got) if isinstance(v, torch.Tensor) and v.dim() == 0]
            if not losses or not all(math.isfinite(float(v)) for v in losses):
                raise BenchmarkError(f"programs: {p.name}: the compiled step's results are not finite: {got}")
            continue
        try:  # looser than the programs suite (which checks at the thread count of its machine)
            cmp.same_results(got, want, f"{p.name} call {k}", rtol=RTOL)
            cmp.same_state(l_state, e_state, f"{p.name} after call {k}:", rtol=RTOL,
                           noise={"transformer": _style_noise()} if "transformer" in e_state else None,
                           noise_atol=1e-2)
        except AssertionError as e:
            raise BenchmarkError(f"programs: {p.name}: compiled differs from eager: {e}") from e


def _style_noise():
    import test_fast_neural_style as fns
    return fns.NOISE


def measure(p, cmp, reps):
    import lazyrt.metrics
    import lazyrt.torch
    eager, e_state = cmp.seeded(p.make)
    lazy_fn, l_state = cmp.seeded(p.make)
    lazy = lazyrt.torch.compile(lazy_fn)
    batches = p.batches()
    breaks0 = lazyrt.metrics.counter("GraphBreak")
    t0 = time.perf_counter()
    _check(p, cmp, eager, e_state, lazy, l_state, batches)  # the first call captures and compiles
    first = time.perf_counter() - t0
    breaks_per_call = (lazyrt.metrics.counter("GraphBreak") - breaks0) / CHECKED
    it = {"eager": 0, "lazy": 0}

    def runner(name, fn):
        def call():
            args = batches[it[name] % len(batches)]
            it[name] += 1
            return fn(*(_clone(args) if p.clone else args))
        return call
    fns = {"eager": runner("eager", eager), "lazy": runner("lazy", lazy)}
    calls = max(calls_for(fns["eager"], 0.05), calls_for(fns["lazy"], 0.05))
    s = time_side_by_side(fns, calls, reps)
    return {"eager": s["eager"], "lazy": s["lazy"], "first": first, "breaks": breaks_per_call,
            "captures": lazy.captures}


def run(opts):
    import warnings
    cmp, suite = _modules()
    import lazyrt.torch
    rows, summary = [], []
    reps = 5 if getattr(opts, "quick", False) else 9
    for p in suite.programs():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", lazyrt.torch.GraphBreakWarning)
            m = measure(p, cmp, reps)
        r = m["eager"].median / m["lazy"].median
        rows.append([p.name, m["eager"].cell(1e3), m["lazy"].cell(1e3), ratio(r), f"{m['first']:.2f}",
                     f"{m['breaks']:g}", m["captures"], "finite only" if p.random else "as eager"])
        summary.append((f"program: {p.name}", "lazyrt.torch.compile", m["lazy"].cell(1e3), "ms", "PyTorch eager",
                        m["eager"].cell(1e3), ratio(r)))
        print(f"  {p.name}: eager {m['eager'].median * 1e3:.2f} ms, compiled {m['lazy'].median * 1e3:.2f} ms, "
              f"{ratio(r)}, {m['breaks']:g} breaks", file=sys.stderr, flush=True)
    ratios = [float(row[3].rstrip("x")) for row in rows]
    geo = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
    md = ["## programs: the programs suite, eager against lazyrt.torch.compile", "",
          __doc__.split("\n\n")[0].replace("\n", " "), "",
          table(["program", "eager ms/step", "compiled ms/step", "speed vs eager", "first call s",
                 "breaks/call", "captures", "values checked"], rows, "lrrrrrrl"), "",
          f"Geometric mean of the ratios: {ratio(geo)}; slowest: {min(ratios):.2f}x. Breaks/call: graph breaks "
          "(ops run in PyTorch eager between compiled pieces) per call; captures: distinct captures the compiled "
          "step made over its calls (a learning rate is a graph input; a changed hyperparameter is a new capture)."]
    return {"summary": summary, "markdown": "\n".join(md) + "\n"}
