"""Shape-polymorphic compiled steps: how often a GPT training step compiles over a sweep of
batch sizes and of sequence lengths, and what a shared (padded) executable costs per step.

Workload: bench/gpt_step.py's GPT (nanoGPT's architecture: 6 blocks, 6 heads, 384 wide, context
256, AdamW) and its training step, unmodified PyTorch, through lazyrt.torch.compile, with the
tokens and targets marked dynamic the way a torch.compile user marks them
(torch._dynamo.mark_dynamic) along the batch dim (batch sizes 1..64 at 32 tokens: the largest
step holds as many tokens as gpt_step's 8 x 256) or along the sequence dim (lengths 8..256 at
batch 8, a sample of them). Every step's loss is checked against PyTorch eager's (a second
copy of the model trained alongside) before anything is counted.

Counted: lazyrt's compiles (metrics UncachedCompile) and captures over each sweep, the
sweep's wall time, and the same for Inductor with torch.compile(dynamic=True) where it runs
(its compiled graphs from torch._dynamo's counters, from a fresh Inductor cache) and torch_xla on a
sample of the sizes (its CompileTime count). Timed: at a few sizes, lazyrt's step replayed
on the bucket's shared executable against the step compiled for exactly that shape (no mark),
side by side; a size inside a bucket pays for the padding up to the bucket's size.
"""

import time

import torch
import torch.nn.functional as F

import gpt_step
import lazyrt as lr
import lazyrt.torch  # noqa: F401  (lr.torch)
from harness import (INDUCTOR, BenchmarkError, check_close, fresh_inductor_cache, num, ratio, table,
                     time_side_by_side)

BATCH_SWEEP = list(range(1, 65))  # at BATCH_TOKENS tokens
BATCH_TOKENS = 32
SEQ_SWEEP = [8, 9, 12, 16, 17, 24, 32, 33, 48, 64, 65, 100, 128, 129, 200, 256]  # at SEQ_BATCH sequences
SEQ_BATCH = 8
TIMED = [("batch", 33), ("batch", 48), ("batch", 64), ("sequence", 100), ("sequence", 128)]
QUICK_BATCH, QUICK_SEQ, QUICK_TIMED = [1, 2, 3, 4], [8, 9, 16], [("batch", 3)]


def shape_of(kind, n):
    return (n, BATCH_TOKENS) if kind == "batch" else (SEQ_BATCH, n)


def batch_of(kind, n, seed):
    g = torch.Generator().manual_seed(seed)
    b, t = shape_of(kind, n)
    tokens = torch.randint(0, gpt_step.VOCAB, (b, t + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def marked(kind, idx, targets):
    dim = 0 if kind == "batch" else 1
    torch._dynamo.mark_dynamic(idx, dim)
    torch._dynamo.mark_dynamic(targets, dim)
    return idx, targets


def step_of(model, opt):
    def step(idx, targets):
        loss = gpt_step.loss_fn(model(idx), targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def lazyrt_sweep(kind, sizes):
    """(compiles, captures, seconds, refusals) of lazyrt.torch.compile over the sizes, every loss
    checked against eager's; refusals: [(size, why)] of the sizes compiled as traced."""
    model, ref = gpt_step.models()
    step = lr.torch.compile(step_of(model, gpt_step.optimizer(model)))
    eager = step_of(ref, gpt_step.optimizer(ref))
    lr.cache.clear_memory()
    lr.metrics.reset()
    seconds = 0.0
    refusals = []
    for i, n in enumerate(sizes):
        idx, targets = marked(kind, *batch_of(kind, n, i))
        refused = lr.metrics.counter("PolymorphicRefused")
        t0 = time.perf_counter()
        loss = step(idx, targets).item()
        seconds += time.perf_counter() - t0
        if lr.metrics.counter("PolymorphicRefused") > refused:
            refusals.append((n, lr.debug.last_polymorphic_refusal()))
        want = eager(idx, targets).item()
        check_close(f"GPT, {kind} {n}: lazyrt's loss", loss, want, rtol=1e-4, atol=1e-5)
    return lr.metrics.counter("UncachedCompile"), step.captures, seconds, refusals


def inductor_sweep(kind, sizes):
    """(graphs compiled, seconds) of torch.compile(dynamic=True) over the sizes, every loss
    checked against eager's; or a string saying why it did not run."""
    import torch._dynamo
    model, ref = gpt_step.models()
    torch._dynamo.reset()
    fresh_inductor_cache()  # compiled, not loaded from an earlier run's cache
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    try:
        step = torch.compile(step_of(model, gpt_step.optimizer(model)), dynamic=True)
        eager = step_of(ref, gpt_step.optimizer(ref))
        torch._dynamo.utils.counters.clear()
        seconds = 0.0
        for i, n in enumerate(sizes):
            idx, targets = batch_of(kind, n, i)
            t0 = time.perf_counter()
            loss = step(idx, targets).item()
            seconds += time.perf_counter() - t0
            check_close(f"GPT, {kind} {n}: Inductor's loss", loss, eager(idx, targets).item(), rtol=1e-4, atol=1e-5)
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"]), seconds
    except BenchmarkError:
        raise
    except Exception as e:  # noqa: BLE001 - a peer that cannot run here gets a row saying why
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"


XLA_SAMPLE = {"batch": [33, 40, 48, 56, 64], "sequence": [100, 128, 129, 200]}
XLA = "torch_xla, torch_xla.sync() every step (child process)"


def eager_losses(kind, sizes):
    """The losses of eager training over these sizes, from the start state."""
    model, _ = gpt_step.models()
    eager = step_of(model, gpt_step.optimizer(model))
    return [eager(*batch_of(kind, n, i)).item() for i, n in enumerate(sizes)]


def child_xla(kind, sizes):
    """In a child process (bench/suite.py --child dynamic-xla KIND SIZES): the training step on
    torch_xla's device over the sizes, one sync a step, the tokens as they come (torch_xla traces
    and compiles a graph per new shape). Prints the losses, the compiles torch_xla counted (its CompileTime metric) and the
    seconds of the sweep."""
    import json
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    dev = torch_xla.device()
    model, opt = gpt_step.on_device(dev)
    step = step_of(model, opt)
    losses = []
    t0 = time.perf_counter()
    for i, n in enumerate(sizes):
        idx, targets = (t.to(dev) for t in batch_of(kind, n, i))
        loss = step(idx, targets)
        torch_xla.sync()
        xm.wait_device_ops()
        losses.append(float(loss.cpu()))
    seconds = time.perf_counter() - t0
    compile_time = met.metric_data("CompileTime")
    print(json.dumps({"losses": losses, "compiles": compile_time[0] if compile_time else 0, "seconds": seconds}))


def xla_sweep(opts, kind):
    """(compiles, seconds, sizes) of torch_xla over a sample of the sizes, its losses checked
    against eager's; or a string saying why it did not run."""
    import sys
    from harness import run_child_or_why
    from peers import CHILD_TIMEOUT_S, install_failure, xla_env, xla_installed
    if not xla_installed():
        return "failed: " + (install_failure(sys.prefix) or "torch_xla is not installed (`make bench` installs it)")
    sizes = XLA_SAMPLE[kind]
    out, why = run_child_or_why(opts, "dynamic-xla", kind, ",".join(map(str, sizes)), env=xla_env(opts.threads),
                                timeout=4 * CHILD_TIMEOUT_S)
    if out is None:
        return f"failed: {why}"
    check_close(f"GPT, {kind} {sizes}: torch_xla's losses", out["losses"], eager_losses(kind, sizes),
                rtol=1e-3, atol=1e-4)
    return out["compiles"], out["seconds"], sizes


def timed(kind, n, reps):
    """(polymorphic ms, fixed-shape ms) per step at size n, side by side: one model per path."""
    fns = {}
    for name, mark in (("bucket", True), ("fixed", False)):
        model, _ = gpt_step.models()
        step = lr.torch.compile(step_of(model, gpt_step.optimizer(model)))
        idx, targets = batch_of(kind, n, 0)
        if mark:
            idx, targets = marked(kind, idx, targets)
        step(idx, targets)
        fns[name] = (lambda s, a, b: lambda: s(a, b).item())(step, idx, targets)
    ms = {k: s.scaled(1e3) for k, s in time_side_by_side(fns, 1, reps, warmup=1).items()}
    return ms["bucket"], ms["fixed"]


def refused_note(counted):
    """A paragraph naming the sizes lazyrt compiled as traced (not padded), and why."""
    said = [f"{kind} {n} ({why})" for kind, (_, _, _, refusals) in counted.items() for n, why in refusals]
    if not said:
        return "Every size ran on its bucket's executable.\n"
    return "Compiled as traced (one more compile each), with lazyrt's reason: " + "; ".join(said) + ".\n"


def lr_bucket(n):
    b = 1
    while b < n:
        b *= 2
    return b


def run(opts):
    batch_sizes = QUICK_BATCH if opts.quick else BATCH_SWEEP
    seq_sizes = QUICK_SEQ if opts.quick else SEQ_SWEEP
    sweeps = {"batch": batch_sizes, "sequence": seq_sizes}
    buckets = {k: len({lr_bucket(n) for n in v if n > 1}) + (1 in v) for k, v in sweeps.items()}
    counted = {k: lazyrt_sweep(k, v) for k, v in sweeps.items()}
    inductor = {} if opts.quick else {k: inductor_sweep(k, v) for k, v in sweeps.items()}
    xla = {} if opts.quick else {k: xla_sweep(opts, k) for k in sweeps}
    reps = 3 if opts.quick else 5
    times = [(kind, n) + timed(kind, n, reps) for kind, n in (QUICK_TIMED if opts.quick else TIMED)]

    def label(kind):
        sizes = sweeps[kind]
        what = f"batch {sizes[0]}..{sizes[-1]} at {BATCH_TOKENS} tokens" if kind == "batch" else \
            f"sequence {sizes[0]}..{sizes[-1]} ({len(sizes)} lengths) at batch {SEQ_BATCH}"
        return what
    rows = []
    for kind, (compiles, captures, seconds, _) in counted.items():
        rows.append((label(kind), f"{len(sweeps[kind])}", "lazyrt.torch.compile, mark_dynamic", f"{compiles}",
                     f"{captures}", f"{buckets[kind]}", num(seconds)))
        ind = inductor.get(kind)
        if isinstance(ind, tuple):
            rows.append((label(kind), f"{len(sweeps[kind])}", f"{INDUCTOR}, dynamic=True", f"{ind[0]}", "-", "-",
                         num(ind[1])))
        elif ind is not None:
            rows.append((label(kind), f"{len(sweeps[kind])}", f"{INDUCTOR}, dynamic=True", ind, "-", "-", "-"))
        x = xla.get(kind)
        if isinstance(x, tuple):
            rows.append((f"{kind} {', '.join(map(str, x[2]))} (a sample)", f"{len(x[2])}", XLA, f"{x[0]}", "-", "-",
                         num(x[1])))
        elif x is not None:
            rows.append((label(kind), "-", XLA, x, "-", "-", "-"))
    time_rows = [(f"{kind} {n}" + (f" (x{BATCH_TOKENS} tokens)" if kind == "batch" else f" (batch {SEQ_BATCH})"),
                  f"{lr_bucket(n)}", bucket.cell(), fixed.cell(), ratio(bucket.median / fixed.median))
                 for kind, n, bucket, fixed in times]
    md = ["## Shape-polymorphic steps: GPT over batch sizes and sequence lengths\n",
          f"bench/gpt_step.py's GPT training step (AdamW) through `lazyrt.torch.compile`, tokens and targets "
          "marked with `torch._dynamo.mark_dynamic` along the swept dim; lazyrt pads each marked size to its bucket "
          "(the next power of two) and compiles one executable per bucket (a capture is still made per shape). "
          "Every loss is checked against PyTorch eager's (rtol 1e-4) before it counts. compiles: lazyrt's "
          "UncachedCompile (Inductor: graphs Dynamo compiled, from a fresh cache; torch_xla: its CompileTime count); buckets: the power-of-two buckets the sizes fall "
          "in; seconds: the sweep's calls, first calls (capture, compile) included.\n",
          table(["sizes", "steps", "path", "compiles", "captures", "buckets", "seconds"], rows, "lrlrrrr") + "\n",
          refused_note(counted),
          f"Time per step on the bucket's shared executable against the step compiled for exactly that shape, "
          f"side by side (ms, {reps} steps each after one warm-up; a size below its bucket pays for the padding):\n",
          table(["size", "bucket", "shared (padded), ms", "exact shape, ms", "shared / exact"], time_rows, "lrrrr")
          + "\n"]
    summary = []
    for kind, (compiles, captures, seconds, _) in counted.items():
        summary.append((f"GPT step, {label(kind)}: compiles", "lazyrt.torch.compile + mark_dynamic", f"{compiles}",
                        "compiles", "one per size (a static compile each)", f"{len(sweeps[kind])}",
                        ratio(len(sweeps[kind]) / max(compiles, 1))))
    for kind, n, bucket, fixed in times:
        summary.append((f"GPT step, {kind} {n}: shared executable", "lazyrt, bucket " + str(lr_bucket(n)),
                        bucket.cell(), "ms", "lazyrt, exact shape", fixed.cell(), ratio(fixed.median / bucket.median)))
    return {"markdown": "\n".join(md), "summary": summary}
