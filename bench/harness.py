"""What every Python benchmark of bench/ shares: timing, statistics, equality checks, memory
measurement and markdown cells. Nothing here knows a workload.

Method, once for all: a measurement is a list of samples, each the mean time per call over one
batch of calls; warm-up batches run first and are not kept, and timing starts once lazyrt's
background compilation of generated kernels (src/jit) started by them is done (settle()), so
lazyrt is timed in its steady state and no compiler thread takes CPU from the samples; peers
compared side by side run their batches in turn (a, b, a, b, ...) so that both see the same
machine load. A cell shows the median and the spread [min, max] of the samples.
"""

import ctypes
import gc
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time


class BenchmarkError(AssertionError):
    """A peer computed something else than lazyrt, or a measurement is impossible: the
    benchmark is wrong, and no number of it may be reported."""


class Samples:
    """Repeated measurements of one quantity (seconds, bytes, ...)."""

    def __init__(self, values):
        self.in_order = [float(v) for v in values]
        self.values = sorted(self.in_order)
        if not self.values:
            raise BenchmarkError("no samples")

    @property
    def median(self):
        return statistics.median(self.values)

    @property
    def min(self):
        return self.values[0]

    @property
    def max(self):
        return self.values[-1]

    def scaled(self, factor):
        return Samples(v * factor for v in self.values)

    def cell(self, factor=1.0):
        """'median [min, max]' of the values times factor; one number when they do not vary."""
        med, lo, hi = self.median * factor, self.min * factor, self.max * factor
        if lo == hi:
            return num(med)
        return f"{num(med)} [{num(lo)}, {num(hi)}]"


def num(v):
    """Three significant digits or more, without exponents: 0.0512, 1.23, 45.6, 1234."""
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def ratio(v):
    return f"{v:.2f}x" if v < 10 else f"{v:.1f}x"


def _batch_seconds(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def settle():
    """Waits until lazyrt's generated kernels handed to its compiler thread so far are compiled
    (nothing to wait for when lazyrt is not loaded, or has no generated kernels)."""
    lazyrt = sys.modules.get("lazyrt")
    wait = getattr(getattr(getattr(lazyrt, "_C", None), "_jit", None), "wait_idle", None)
    if wait is not None:
        wait()


def time_side_by_side(fns, calls, reps, warmup=1):
    """{name: Samples of seconds per call} for each callable of the dict fns, batches of
    `calls` calls (a number, or {name: number}) alternating between them; `warmup` batches of
    each first, not kept, then settle(). The garbage collector is off while timing (Python
    peers would otherwise pay for lazyrt's garbage, and the other way round)."""
    if not isinstance(calls, dict):
        calls = {name: calls for name in fns}
    for _ in range(warmup):
        for name, fn in fns.items():
            _batch_seconds(fn, calls[name])
    settle()
    seconds = {name: [] for name in fns}
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            for name, fn in fns.items():
                seconds[name].append(_batch_seconds(fn, calls[name]))
    finally:
        gc.enable()
    return {name: Samples(v) for name, v in seconds.items()}


def calls_for(fn, target_seconds=0.02, most=100000):
    """How many calls of fn make a batch of about target_seconds (fn is called to find out)."""
    once = max(_batch_seconds(fn, 3), 1e-9)
    return max(1, min(most, int(target_seconds / once)))


def first_and_warm(run):
    """(seconds of run()'s first call, seconds of a second call, the second call's result): the
    first pays for tracing and compiling, the second is warm."""
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = run()
    return first, time.perf_counter() - t0, result


def check_close(what, got, expected, rtol, atol):
    """Raises BenchmarkError unless every element of got is within atol + rtol * |expected|."""
    import numpy as np
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        raise BenchmarkError(f"{what}: shapes {got.shape} and {expected.shape} differ")
    err = np.abs(got - expected)
    bad = err > atol + rtol * np.abs(expected)
    if bad.any():
        i = np.unravel_index(int(np.argmax(err - rtol * np.abs(expected))), got.shape)
        raise BenchmarkError(f"{what}: {int(bad.sum())} of {got.size} values differ beyond rtol {rtol}, "
                             f"atol {atol}; worst at {tuple(int(k) for k in i)}: {got[i]!r} against {expected[i]!r}")


def training_step(model, opt, loss_fn):
    """step(x, y): loss_fn(model(x), y), backward, opt.step(), opt.zero_grad(); returns the loss.
    Plain PyTorch: the same function serves eager and lazyrt.torch.compile."""
    def step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def device_replay(step, args, params):
    """Traces step(*args) (lazyrt device tensors) once, after a sync(), and prepares its replay by
    PyTorch/XLA's low-level calls, lazyrt.torch's of the same names, on the graph of its loss and
    `params`, as examples/seed/device_cached_step.py does. Returns a function running one replay
    and returning the loss."""
    import lazyrt.torch as L
    L.sync()
    outputs = [step(*args)] + list(params)
    graph_hash = L._get_graph_hash(outputs)
    L._xla_warm_up_cache(outputs, [])
    ids, values = L._get_tensors_xla_device_data_node(outputs)
    arg_ids = {L._xla_get_tensor_id(a): i for i, a in enumerate(args)}
    matcher = L.GraphInputMatcher(arg_ids, ids, values, set(arg_ids))
    return lambda: L._run_cached_graph(graph_hash, matcher(list(args)))[0]


def check_same_training(what, eager, compiled, args, eager_state, compiled_state, steps, rtol, atol, loss_rtol=1e-4):
    """Runs `steps` training steps of both peers on args; raises BenchmarkError unless their
    losses agree (loss_rtol, atol 1e-5) and change from step to step, and every state tensor
    (name -> array, from eager_state() and compiled_state()) agrees within rtol and atol.
    Returns eager's losses and both states."""
    ref_losses = [float(eager(*args).item()) for _ in range(steps)]
    losses = [float(compiled(*args).item()) for _ in range(steps)]
    check_close(f"{what}: losses", losses, ref_losses, rtol=loss_rtol, atol=1e-5)
    if len(set(losses)) != len(losses):
        raise BenchmarkError(f"{what}: the losses do not change from step to step")
    ref, got = eager_state(), compiled_state()
    for k in ref:
        check_close(f"{what}: {k} after {steps} steps", got[k], ref[k], rtol=rtol, atol=atol)
    return ref_losses, ref, got


def compiled_inference(what, m_eager, m_lazy, infer_step_of, args, rtol=1e-3, atol=1e-4):
    """Puts both models in eval mode and returns (eager, compiled) inference steps,
    infer_step_of(model) as is and through lazyrt.torch.compile, after checking that their
    outputs on args agree (BenchmarkError otherwise). The compiled step is a FirstCallTimed."""
    import lazyrt.torch
    m_eager.eval()
    m_lazy.eval()
    eager, compiled = infer_step_of(m_eager), FirstCallTimed(lazyrt.torch.compile(infer_step_of(m_lazy)))
    check_close(f"{what}, lazyrt.torch.compile: outputs", compiled(*args).numpy(), eager(*args).numpy(),
                rtol=rtol, atol=atol)
    return eager, compiled


# ---- torch.compile -----------------------------------------------------------------------------

DYNAMO_LAZYRT = 'torch.compile(backend="lazyrt")'
INDUCTOR = "torch.compile (Inductor, its default backend)"
INDUCTOR_MAX_AUTOTUNE = 'torch.compile(mode="max-autotune-no-cudagraphs") (Inductor)'


def dynamo_unique_graphs():
    """The graphs Dynamo has captured in this process so far (its own counter)."""
    import torch._dynamo.utils
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def compiled_graphs():
    """(graphs Dynamo captured, graphs lazyrt's torch.compile backend compiled) in this process so far:
    unchanged over timed calls when nothing recompiled."""
    from lazyrt import metrics
    return dynamo_unique_graphs(), metrics.counter("DynamoGraph")


def fresh_inductor_cache():
    """Points Inductor at a fresh on-disk cache folder (TORCHINDUCTOR_CACHE_DIR, removed at exit),
    so that what it compiles next is compiled, not loaded from an earlier run's cache."""
    import atexit
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="lazyrt-bench-inductor-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder


class FirstCallTimed:
    """A compiled step whose first call (where it is captured and compiled) is timed on its own:
    first_seconds, None before that call. Steady-state timings call .fn, the step itself, after
    it. fresh_inductor_cache: before the first call, point Inductor at a fresh on-disk cache
    folder (TORCHINDUCTOR_CACHE_DIR, removed at exit), so that it compiles its C++ kernels with g++
    instead of loading an earlier run's; this process's in-memory state (Inductor imported, the
    kernels of earlier workloads) is kept."""

    def __init__(self, fn, fresh_inductor_cache=False):
        self.fn, self.fresh_inductor_cache, self.first_seconds = fn, fresh_inductor_cache, None

    def __call__(self, *args):
        if self.first_seconds is not None:
            return self.fn(*args)
        if self.fresh_inductor_cache:
            fresh_inductor_cache()
        start = time.perf_counter()
        out = self.fn(*args)
        self.first_seconds = time.perf_counter() - start
        return out


def torch_compile(step, backend=None, mode=None):
    """torch.compile(step, backend=backend, mode=mode) (backend None: its default, Inductor, from a
    fresh cache), as a FirstCallTimed: Dynamo captures the step and the backend compiles its graphs
    in the first call."""
    import torch
    import torch._dynamo
    # Dynamo counts recompiles of a frame over the process, and every benchmark compiles
    # optimizer.step() again for its own optimizer: past its default limit (8) it would run the
    # later benchmarks' optimizer steps in eager.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)
    options = {k: v for k, v in (("backend", backend), ("mode", mode)) if v is not None}
    return FirstCallTimed(torch.compile(step, **options), fresh_inductor_cache=backend is None)


def why_failed(e):
    """One line naming an exception: its type and the first two lines of its message (without Dynamo's
    advice on logging)."""
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not line.strip().startswith(("Set TORCHDYNAMO_VERBOSE", "For even more developer"))]
    text = " ".join(lines[:2]) if lines else "no message"
    return f"{type(e).__name__}: {text if len(text) <= 300 else text[:297] + '...'}"


# ---- PyTorch's lazy tensors -------------------------------------------------------------------

def torch_lazy_available():
    """PyTorch's lazy tensors on its TorchScript backend, initialized once per process."""
    try:
        import torch._lazy
        import torch._lazy.ts_backend
        if not getattr(torch_lazy_available, "done", False):
            torch._lazy.ts_backend.init()
            torch_lazy_available.done = True
        return True
    except (ImportError, RuntimeError):
        return False


def ltc_live_tensors():
    """torch._lazy's lazy tensors created and not yet destroyed, by its own counters."""
    import torch._lazy.metrics as m
    return (m.counter_value("CreateLtcTensor") or 0) - (m.counter_value("DestroyLtcTensor") or 0)


# ---- memory of the process ------------------------------------------------------------------

def run_child(opts, *child_args, env=None, timeout=None):
    """Runs bench/suite.py --child CHILD_ARGS... in a process of its own (same build, same thread
    count) and returns the JSON object its last output line holds. env: variables to add to the
    child's environment."""
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "suite.py"), "--build", opts.build, "--threads", str(opts.threads),
           "--child", *[str(a) for a in child_args]]
    return run_command(cmd, env=env, timeout=timeout)


def run_command(cmd, env=None, timeout=None):
    """Runs cmd (a child process, any interpreter) with env added to this process's environment,
    for at most timeout seconds; returns the JSON object its last output line holds."""
    full_env = dict(os.environ, **(env or {}))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=full_env, timeout=timeout).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_child_or_why(opts, *child_args, env=None, timeout=None):
    """(run_child's JSON object, None), or (None, why) where the child process ended with an error
    or a signal: the last line of its standard error, without glog's prefix."""
    return _or_why(lambda: run_child(opts, *child_args, env=env, timeout=timeout))


def run_command_or_why(cmd, env=None, timeout=None):
    """(run_command's JSON object, None), or (None, why), as run_child_or_why."""
    return _or_why(lambda: run_command(cmd, env=env, timeout=timeout))


def _or_why(run):
    try:
        return run(), None
    except subprocess.TimeoutExpired as e:
        return None, f"a child process running it did not end within {e.timeout:.0f} s and was killed"
    except subprocess.CalledProcessError as e:
        how = (f"killed by {signal.Signals(-e.returncode).name}" if e.returncode < 0
               else f"exit status {e.returncode}")
        lines = [line.strip() for line in (e.stderr or "").splitlines()
                 if line.strip() and not line.startswith(("WARNING: Logging", "*** Check failure"))]
        last = re.sub(r"^[FEW]\d{8} [\d:.]+ +\d+ ", "", lines[-1]) if lines else "no message"  # glog's prefix
        return None, f"a child process running it ended ({how}): {last}"


def child_model_peak_memory(make_step, steps):
    """Runs in a child process: make_step() builds a model and whatever its step needs and
    returns the step (a callable without arguments); prints JSON with the process's peak
    resident bytes above the start, from before make_step() to the end of `steps` steps."""
    import lazyrt as lr
    lr.mark_step()
    gc.collect()
    before = reset_peak_rss()
    step = make_step()
    for _ in range(steps):
        step()
    print(json.dumps({"peak_rss": peak_rss() - before}))


class ModelWorkload:
    """A whole-model benchmark's workload, as its module's workload() gives it: make_model() (a
    fresh model, always from the same seed), train_step_of(model) (the training step, making the
    model's optimizer), infer_step_of(model) (the inference step) and their arguments."""

    def __init__(self, make_model, train_step_of, infer_step_of, train_args, infer_args):
        self.make_model, self.train_step_of, self.infer_step_of = make_model, train_step_of, infer_step_of
        self.train_args, self.infer_args = train_args, infer_args

    def step(self, model, mode):
        """(step, args) of `model` in `mode` ("train", or "infer", which puts the model in eval mode)."""
        if mode == "train":
            return self.train_step_of(model), self.train_args
        model.eval()
        return self.infer_step_of(model), self.infer_args


def child_model_memory(workload, peer, mode, steps):
    """In a child process: child_model_peak_memory of `steps` steps of `peer` ("lazyrt", through
    lazyrt.torch.compile, INDUCTOR, through torch.compile, or "PyTorch eager") in `mode` ("train"
    or "infer") of a ModelWorkload."""
    def make():
        import lazyrt.torch
        step, args = workload.step(workload.make_model(), mode)
        if peer == "lazyrt":
            step = lazyrt.torch.compile(step)
        elif peer == INDUCTOR:
            step = torch_compile(step)
        return lambda: step(*args)
    child_model_peak_memory(make, steps)


def model_peak_memory(opts, module, steps):
    """{(peer, mode): peak MiB} of module's steps ("lazyrt" through lazyrt.torch.compile, "PyTorch
    eager", INDUCTOR; "train" and "infer"), each peer and mode in a child process of its own
    (child_model_memory of module.workload())."""
    return {(peer, mode): run_child(opts, "model-memory", module, peer, mode, steps)["peak_rss"] / 2**20
            for peer in ("lazyrt", "PyTorch eager", INDUCTOR) for mode in ("train", "infer")}


# ---- PyTorch's lazy tensors on a whole model ----------------------------------------------------

TORCH_LAZY = "torch._lazy (TorchScript backend)"


def child_torch_lazy(workload, steps_checked, reps):
    """In a child process (torch._lazy can abort a process): a ModelWorkload's steps on torch._lazy,
    each model moved to device "lazy" before its optimizer is made, the arguments moved too,
    torch._lazy.mark_step() and wait_device_ops() after every step. First checked against an
    eager model from the same make_model(): the losses of steps_checked training steps (rtol 1e-4,
    atol 1e-5), then the eval-mode outputs (rtol 1e-3, atol 1e-4); then timed, 1 warm-up and reps
    steps per mode. Prints {"train": [seconds...], "infer": [...]} or {"error": "..."} last."""
    try:
        if not torch_lazy_available():
            raise RuntimeError("torch._lazy cannot be imported or initialized in this PyTorch build")
        import torch._lazy
        lazy_model, eager_model = workload.make_model().to("lazy"), workload.make_model()

        def lazy_step(mode):
            step, args = workload.step(lazy_model, mode)
            args = tuple(a.to("lazy") for a in args)

            def run():
                out = step(*args)
                torch._lazy.mark_step()
                torch._lazy.wait_device_ops()
                return out
            return run
        train, eager = lazy_step("train"), workload.step(eager_model, "train")
        check_close("torch._lazy: losses", [float(train().item()) for _ in range(steps_checked)],
                    [float(eager[0](*eager[1]).item()) for _ in range(steps_checked)], rtol=1e-4, atol=1e-5)
        infer, eager = lazy_step("infer"), workload.step(eager_model, "infer")
        check_close("torch._lazy: eval-mode outputs", infer().cpu().numpy(), eager[0](*eager[1]).numpy(),
                    rtol=1e-3, atol=1e-4)
        seconds = {}
        for mode, run in (("infer", infer), ("train", None)):
            if run is None:
                lazy_model.train()
                run = lazy_step("train")
            run()
            seconds[mode] = []
            for _ in range(reps):
                t = time.perf_counter()
                run()
                seconds[mode].append(time.perf_counter() - t)
        print(json.dumps(seconds))
    except Exception as e:  # noqa: BLE001 - reported in the parent's table
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))


def torch_lazy_model_steps(opts, module, steps_checked, reps):
    """({"train": Samples, "infer": Samples} in ms, None) of child_torch_lazy on module.workload(),
    or (None, why not) where torch._lazy failed, refused or ended its process."""
    out, why = run_child_or_why(opts, "model-torch-lazy", module, steps_checked, reps)
    if why is None and "error" in out:
        why = out["error"]
    if why is not None:
        print(f"{module}: {TORCH_LAZY}: failed, no figures: {why}", file=sys.stderr, flush=True)
        return None, why
    return {mode: Samples(v).scaled(1e3) for mode, v in out.items()}, None


MODEL_STEP_HEADER = ["step", "lazyrt.torch.compile ms", "PyTorch eager ms", "eager / lazyrt", f"{TORCH_LAZY} ms",
                     "torch._lazy / lazyrt", "lazyrt peak MiB", "PyTorch eager peak MiB", "eager / lazyrt peak"]


def model_step_rows(model, labels, ms, mem, lazy_ms):
    """(table rows under MODEL_STEP_HEADER, summary rows) of a whole-model benchmark: per mode
    ("train", "infer", named by labels[mode]), the step's time (ms["<mode> lazyrt"], ms["<mode>
    eager"], Samples) and peak memory (mem, as model_peak_memory gives it) of lazyrt.torch.compile
    against PyTorch eager, and against torch._lazy (lazy_ms, as torch_lazy_model_steps gives it,
    None where it failed)."""
    rows, summary = [], []
    for mode in ("train", "infer"):
        lazy, peer = ms[f"{mode} lazyrt"], ms[f"{mode} eager"]
        lazy_mib, peer_mib = mem[("lazyrt", mode)], mem[("PyTorch eager", mode)]
        ltc = lazy_ms[mode] if lazy_ms else None
        rows.append((labels[mode], lazy.cell(), peer.cell(), ratio(peer.median / lazy.median),
                     ltc.cell() if ltc else "failed (below)", ratio(ltc.median / lazy.median) if ltc else "-",
                     f"{lazy_mib:.1f}", f"{peer_mib:.1f}", ratio(peer_mib / max(lazy_mib, 1e-9))))
        summary.append((f"{model} {labels[mode]}", "lazyrt.torch.compile", lazy.cell(), "ms", "PyTorch eager",
                        peer.cell(), ratio(peer.median / lazy.median)))
        if ltc:
            summary.append((f"{model} {labels[mode]}", "lazyrt.torch.compile", lazy.cell(), "ms", TORCH_LAZY,
                            ltc.cell(), ratio(ltc.median / lazy.median)))
        summary.append((f"{model} {labels[mode]}: peak memory", "lazyrt.torch.compile", f"{lazy_mib:.1f}", "MiB",
                        "PyTorch eager", f"{peer_mib:.1f}", ratio(peer_mib / max(lazy_mib, 1e-9))))
    return rows, summary


def inductor_model_steps(workload, what, state_of, steps, rtol, atol):
    """(model, train step, infer step) of Inductor on a ModelWorkload: the unmodified steps through
    torch.compile (FirstCallTimed, from a fresh Inductor cache), checked first against eager steps
    of a model from the same make_model(): check_same_training's losses (INDUCTOR_LOSS_RTOL) and
    state (state_of(model), within rtol and atol) over `steps` training steps, then the eval-mode
    outputs (as the state, or rtol 1e-3, atol 1e-4 if tighter). The model is left in train mode."""
    m_ref, m_ind = workload.make_model(), workload.make_model()
    ref, args = workload.step(m_ref, "train")
    step, _ = workload.step(m_ind, "train")
    train = torch_compile(step)
    check_same_training(f"{what}, {INDUCTOR}", ref, train, args, lambda: state_of(m_ref), lambda: state_of(m_ind),
                        steps, rtol=rtol, atol=atol, loss_rtol=INDUCTOR_LOSS_RTOL)
    ref, args = workload.step(m_ref, "infer")
    step, _ = workload.step(m_ind, "infer")
    infer = torch_compile(step)
    check_close(f"{what} inference, {INDUCTOR}: outputs", infer(*args).detach().numpy(), ref(*args).detach().numpy(),
                rtol=max(rtol, 1e-3), atol=max(atol, 1e-4))
    m_ind.train()
    return m_ind, train, infer


# Inductor rewrites reductions and batch norm (ResNet-18's third loss: 3e-4 from eager's, where
# lazyrt's is within 1e-4), so its losses are held to 1e-3.
INDUCTOR_LOSS_RTOL = 1e-3
INDUCTOR_STEP_HEADER = ["step", "lazyrt.torch.compile ms", f"{INDUCTOR} ms", "Inductor / lazyrt",
                        "first call s: lazyrt", "first call s: Inductor", "Inductor / lazyrt (first call)",
                        "lazyrt peak MiB", "Inductor peak MiB", "Inductor / lazyrt peak"]


def inductor_step_rows(model, labels, ms, mem, firsts):
    """(table rows under INDUCTOR_STEP_HEADER, summary rows): per mode, lazyrt.torch.compile
    (ms["<mode> lazyrt"]) against Inductor (ms["<mode> inductor"]): steady-state time, first call
    (firsts[(peer, mode)] seconds, peer "lazyrt" or "inductor") and peak memory (mem)."""
    rows, summary = [], []
    for mode in ("train", "infer"):
        lazy, peer = ms[f"{mode} lazyrt"], ms[f"{mode} inductor"]
        first_lazy, first_peer = firsts[("lazyrt", mode)], firsts[("inductor", mode)]
        lazy_mib, peer_mib = mem[("lazyrt", mode)], mem[(INDUCTOR, mode)]
        rows.append((labels[mode], lazy.cell(), peer.cell(), ratio(peer.median / lazy.median), f"{first_lazy:.2f}",
                     f"{first_peer:.2f}", ratio(first_peer / first_lazy), f"{lazy_mib:.1f}", f"{peer_mib:.1f}",
                     ratio(peer_mib / max(lazy_mib, 1e-9))))
        summary.append((f"{model} {labels[mode]}", "lazyrt.torch.compile", lazy.cell(), "ms", INDUCTOR, peer.cell(),
                        ratio(peer.median / lazy.median)))
        summary.append((f"{model} {labels[mode]}: first call", "lazyrt.torch.compile", f"{first_lazy:.2f}", "s",
                        INDUCTOR, f"{first_peer:.2f}", ratio(first_peer / first_lazy)))
    return rows, summary


INDUCTOR_NOTE = (f"{INDUCTOR}: the same unmodified steps through `torch.compile(step)` on a model of its own from "
                 "the same state, checked against eager steps of another (the losses of {steps} training steps, "
                 f"rtol {INDUCTOR_LOSS_RTOL:g}, as Inductor reorders reductions; the state after them as for "
                 "lazyrt; the eval-mode outputs as the state, at least rtol 1e-3, atol 1e-4), "
                 "then timed alternating with the others. First call: the step's first call (Dynamo's capture and "
                 "Inductor's compile from an emptied on-disk cache; lazyrt's capture and compile), timed alone. "
                 "Inductor's peak memory is measured as the others' (its compile in the same process).")


def torch_lazy_note(lazy_why, steps_checked, reps):
    """The paragraph under a whole-model table on its torch._lazy column."""
    import torch
    how = (f"{TORCH_LAZY}: the model moved to device \"lazy\" before its optimizer is made, the inputs moved too, "
           "`torch._lazy.mark_step()` and `wait_device_ops()` after every step, in a child process of its own "
           f"(torch._lazy can abort a process): the losses of {steps_checked} training steps (rtol 1e-4) and then "
           "the eval-mode outputs (rtol 1e-3, atol 1e-4) are checked against an eager model from the same state "
           f"first, then {reps} steps of each after 1 warm-up are timed in a row (not alternating with the other "
           "peers).")
    if lazy_why is None:
        return how
    return f"{how} It failed on this model in this PyTorch build ({torch.__version__}), no figures: {lazy_why}"


MODEL_MEMORY_NOTE = ("Peak memory: each peer and step in a child process of its own; the process's peak resident "
                     "size grows from just before the model, optimizer and compiled step are built (input data "
                     "made) to the end of {steps} steps (Linux VmHWM, reset through /proc/self/clear_refs).")


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchmarkError(f"/proc/self/status has no {field}")


def reset_peak_rss():
    """Sets the process's peak resident size back to its current size (Linux: clear_refs 5).
    Returns that size, the base of later peak_rss() readings."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak_rss()


def peak_rss():
    """The most resident bytes since the last reset_peak_rss() (or the process start)."""
    return _status_kib("VmHWM") * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use():
    """Bytes the C heap (glibc malloc: C++ objects, graphs, buffers) has handed out and not
    taken back now. Unlike the resident size it does not hide memory reused from earlier frees.
    Python's own small objects live in its arenas, outside it."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def thread_settings():
    """The thread counts every peer was told to use, as 'NAME=value' pairs."""
    names = ("LAZYRT_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    return ", ".join(f"{n}={os.environ.get(n, 'unset')}" for n in names)


def table(header, rows, align=None):
    """A markdown table; align is a string of 'l'/'r' per column (default: first left, rest
    right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
