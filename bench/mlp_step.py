"""An MLP training step against PyTorch eager, and against the machine's GEMM limit.

Workload: Sequential(Linear(784, 1024), ReLU, Linear(1024, 1024), ReLU, Linear(1024, 10)) with
lazyrt's initial weights after manual_seed(1), copied to PyTorch; x f32[256, 784] uniform in
[-1, 1) and labels i64[256] uniform in [0, 10) from numpy's default_rng(1); loss =
cross_entropy(model(x), labels) (mean); backward; AdamW(lr 1e-3, PyTorch's defaults).step();
zero_grad().

The GEMM limit: the step's eight matrix products (three forward, three weight gradients, two
input gradients: the first layer's input needs none), on the same shapes and operand layouts,
each computed alone through the faster for it of the two GEMM libraries lazyrt calls
(OpenBLAS's cblas_sgemm and oneDNN's dnnl_sgemm), timed in turn with the steps. Their time is
the least a step can take in GEMMs; that time over a step's time is the share of the limit the
step reaches.

On the lazyrt device: the torch model moved to torch.device("lazyrt"), PyTorch/XLA-style,
traced every step with lazyrt.torch.sync(), and replayed by PyTorch/XLA's low-level calls
(lazyrt.torch._run_cached_graph; AdamW capturable, as replay on the device needs); beside them,
PyTorch/XLA itself (torch_xla 2.9, PJRT_DEVICE=CPU) training the same torch model with
torch_xla.sync() every step, in a child process, where it is installed (`make bench`).

The same torch step, unmodified, through lazyrt.torch.compile and through torch.compile's
default backend (Inductor), default mode and mode="max-autotune-no-cudagraphs", beside the
others: steady state, and the first call (capture and compile) on its own.

Peak memory: each peer runs in a child process of its own; the process's peak resident size
grows from just before the model is built to the end of the measured steps (Linux VmHWM, reset
through /proc/self/clear_refs). For lazyrt the device memory it accounts itself is given too.
"""

import ctypes
import ctypes.util
import json
import time

import numpy as np
import torch

import lazyrt as lr
import limits
from harness import (INDUCTOR, INDUCTOR_MAX_AUTOTUNE, BenchmarkError, FirstCallTimed, calls_for, check_close,
                     device_replay, peak_rss, ratio, reset_peak_rss, run_child, table, time_side_by_side,
                     torch_compile)

BATCH, SIZES = 256, (784, 1024, 1024, 10)
LIMIT = "the step's 8 GEMMs alone (the faster GEMM library for each)"
STEPS_CHECKED = 3


def data():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH).astype(np.int64)
    return x, y


def mlp(nn):
    """The model from nn = lazyrt.nn or torch.nn (the same interface)."""
    layers = []
    for i in range(len(SIZES) - 1):
        layers.append(nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def lazyrt_model():
    lr.manual_seed(1)
    model = mlp(lr.nn)
    lr.mark_step()
    return model


class TrainingStep:
    """model, AdamW(lr 1e-3), cross-entropy: written once for both libraries, whose APIs agree."""

    def __init__(self, model, optim, nn):
        self.model = model
        self.opt = optim.AdamW(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss

    def state(self):
        def arr(t):
            return np.array(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t.detach().numpy())
        return {k: arr(v) for k, v in self.model.state_dict().items()}


class LazyrtMlp(TrainingStep):
    def __init__(self, state=None):
        model = lazyrt_model()
        if state is not None:
            model.load_state_dict({k: lr.tensor(v) for k, v in state.items()})
        super().__init__(model, lr.optim, lr.nn)
        lr.mark_step()


class TorchMlp(TrainingStep):
    def __init__(self, state, device="cpu", capturable=False):
        model = mlp(torch.nn)
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, capturable=capturable)
        self.loss_fn = torch.nn.CrossEntropyLoss()


def device_paths(state, x_np, y_np):
    """{name: (step function, state function)} of the torch MLP on the lazyrt device: traced
    every step, and traced once and replayed by PyTorch/XLA's low-level calls."""
    import lazyrt.torch as L
    dev = L.device()
    dx, dy = torch.from_numpy(x_np).to(dev), torch.from_numpy(y_np).to(dev)
    traced = TorchMlp(state, dev)

    def traced_step():
        loss = traced.step(dx, dy)
        L.sync()
        return loss
    replayed = TorchMlp(state, dev, capturable=True)
    return {DEVICE_TRACED: (traced_step, traced.state),
            DEVICE_REPLAYED: (device_replay(replayed.step, (dx, dy), replayed.model.parameters()), replayed.state)}


TORCH_COMPILED = "lazyrt.torch.compile: torch MLP"
INDUCTOR_PATH = f"{INDUCTOR}: torch MLP"
INDUCTOR_MAX_PATH = f"{INDUCTOR_MAX_AUTOTUNE}: torch MLP"
DEVICE_TRACED = "lazyrt device: torch MLP traced every step, lazyrt.torch.sync()"
DEVICE_REPLAYED = "lazyrt device: torch MLP replayed (_run_cached_graph, AdamW capturable)"
XLA_TRACED = "torch_xla: torch MLP traced every step, torch_xla.sync() (child process)"


def child_xla(reps):
    """In a child process (bench/suite.py --child mlp-xla REPS): the torch MLP trained on
    torch_xla's device, torch_xla.sync() and wait_device_ops() every step. Prints the first
    losses and state (checked by the parent) and the seconds per step of each batch."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    from harness import time_side_by_side as timed_batches
    x_np, y_np = data()
    dev = torch_xla.device()
    m = TorchMlp(initial_state(), dev)
    tx, ty = torch.from_numpy(x_np).to(dev), torch.from_numpy(y_np).to(dev)

    def step():
        loss = m.step(tx, ty)
        torch_xla.sync()
        xm.wait_device_ops()
        return loss
    losses = [float(step().cpu()) for _ in range(STEPS_CHECKED)]
    state = {k: v.tolist() for k, v in m.state().items()}
    samples = timed_batches({"xla": step}, {"xla": calls_for(step, 0.1, most=20)}, reps, warmup=2)
    print(json.dumps({"losses": losses, "state": state, "seconds": samples["xla"].in_order}))


def initial_state():
    return {k: v.numpy().copy() for k, v in lazyrt_model().state_dict().items()}


# ---- the GEMM limit ---------------------------------------------------------------------------

def gemm_shapes():
    """(M, K, N, A transposed, B transposed) of every product of one step (row-major
    C[M, N] = op(A) op(B)), each with the operand layouts the step has: the forward reads the
    weights [out, in] transposed, a weight gradient the gradient [batch, out] transposed."""
    fwd = [(BATCH, SIZES[i], SIZES[i + 1], False, True) for i in range(len(SIZES) - 1)]
    weight_grads = [(SIZES[i + 1], BATCH, SIZES[i], True, False) for i in range(len(SIZES) - 1)]
    input_grads = [(BATCH, SIZES[i + 1], SIZES[i], False, False) for i in range(1, len(SIZES) - 1)]
    return fwd + weight_grads + input_grads


def sgemm_libraries():
    """{name: sgemm(transa, transb, m, n, k, a, lda, b, ldb, c, ldc)} for OpenBLAS's cblas_sgemm and
    oneDNN's dnnl_sgemm (the two libraries lazyrt calls), those that load."""
    c_int, c_float, c_char, c_int64, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_char, ctypes.c_int64, ctypes.c_void_p
    found = {}
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        try:
            fn = ctypes.CDLL(name).cblas_sgemm if name else None
        except (OSError, AttributeError):
            fn = None
        if fn is not None:
            fn.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, c_float, ptr, c_int, ptr, c_int, c_float, ptr, c_int]
            fn.restype = None
            found[f"OpenBLAS cblas_sgemm ({name})"] = (
                lambda ta, tb, m, n, k, a, lda, b, ldb, c, ldc, fn=fn:
                fn(101, 112 if ta else 111, 112 if tb else 111, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc))
            break
    for name in ("libdnnl.so.2", ctypes.util.find_library("dnnl")):
        try:
            fn = ctypes.CDLL(name).dnnl_sgemm if name else None
        except (OSError, AttributeError):
            fn = None
        if fn is not None:
            fn.argtypes = [c_char, c_char, c_int64, c_int64, c_int64, c_float, ptr, c_int64, ptr, c_int64, c_float,
                           ptr, c_int64]
            fn.restype = c_int
            found[f"oneDNN dnnl_sgemm ({name})"] = (
                lambda ta, tb, m, n, k, a, lda, b, ldb, c, ldc, fn=fn:
                fn(b"T" if ta else b"N", b"T" if tb else b"N", m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc))
            break
    return found


def gemm_products():
    """(libraries, GEMM FLOPs of a step, a function computing the step's products once, each
    through the faster library for it), or None without a GEMM library. Each product is checked
    against numpy first, and each library timed on it alone (best of 5) to pick the faster."""
    libs = sgemm_libraries()
    if not libs:
        return None
    rng = np.random.default_rng(0)
    calls, keep, flops, chosen = [], [], 0, set()
    for m, k, n, ta, tb in gemm_shapes():
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        c = np.empty((m, n), dtype=np.float32)
        keep += [a, b, c]
        args = (ta, tb, m, n, k, a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], c.ctypes.data, n)
        best = None
        for name, sgemm in libs.items():
            sgemm(*args)
            check_close(f"{name} {m}x{k}x{n}", c, (a.T if ta else a) @ (b.T if tb else b), rtol=1e-3,
                        atol=1e-3 * np.sqrt(k))
            t = min(timed(lambda: sgemm(*args)) for _ in range(5))
            if best is None or t < best[0]:
                best = (t, name, sgemm)
        calls.append((best[2], args))
        chosen.add(best[1])
        flops += 2 * m * k * n

    def products():
        for sgemm, args in calls:
            sgemm(*args)
    products.buffers = keep  # alive as long as the function
    return ", ".join(sorted(chosen)), flops, products


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ---- peak memory, in a child process per peer --------------------------------------------------

def child_peak_memory(peer, steps):
    """Runs in a child: prints JSON with the peak resident bytes above the start."""
    x, y = data()
    state = initial_state() if peer == "PyTorch eager" else None
    lr.mark_step()
    before = reset_peak_rss()
    lr.debug.reset_peak_memory()
    device_before = lr.debug.live_memory_bytes()
    if peer == "PyTorch eager":
        m = TorchMlp(state)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        for _ in range(steps):
            m.step(tx, ty)
        loss = float(m.step(tx, ty).item())
    else:
        m = LazyrtMlp()
        lx, ly = lr.tensor(x), lr.tensor(y)
        step = lr.compile_step(m.step, (lx, ly))
        for _ in range(steps):
            step(lx, ly)
        loss = float(step(lx, ly).item())
    out = {"peak_rss": peak_rss() - before, "loss": loss,
           "device_peak": lr.debug.peak_memory_bytes() - device_before}
    print(json.dumps(out))


def peak_memory(opts, peer, steps):
    return run_child(opts, "mlp-memory", peer, steps)


# ---- the benchmark ---------------------------------------------------------------------------

def run(opts):
    x_np, y_np = data()
    state = initial_state()
    lx, ly = lr.tensor(x_np), lr.tensor(y_np)
    tx, ty = torch.from_numpy(x_np), torch.from_numpy(y_np)

    ref = LazyrtMlp(state)
    ref_losses = []
    for _ in range(STEPS_CHECKED):
        loss = ref.step(lx, ly)
        lr.mark_step()
        ref_losses.append(loss.item())
    ref_state = ref.state()

    replay = LazyrtMlp(state)
    traced = LazyrtMlp(state)  # before compiling: a new optimizer makes compiled steps retrace
    replayed = lr.compile_step(replay.step, (lx, ly))

    def traced_step():
        loss = traced.step(lx, ly)
        lr.mark_step()
        return loss
    eager = TorchMlp(state)
    # The same torch step, unmodified, through lazyrt.torch.compile and through Inductor: the
    # first call of each (capture and compile) is timed on its own.
    import lazyrt.torch
    frontend, inductor_mlp, autotuned_mlp = TorchMlp(state), TorchMlp(state), TorchMlp(state)
    compiled = FirstCallTimed(lazyrt.torch.compile(frontend.step))
    inductor = torch_compile(inductor_mlp.step)
    autotuned = torch_compile(autotuned_mlp.step, mode="max-autotune-no-cudagraphs")
    peers = {
        "lazyrt replayed (compile_step)": (lambda: replayed(lx, ly), replay.state),
        "lazyrt traced (mark_step every step)": (traced_step, traced.state),
        TORCH_COMPILED: (lambda: compiled(tx, ty), frontend.state),
        INDUCTOR_PATH: (lambda: inductor(tx, ty), inductor_mlp.state),
        INDUCTOR_MAX_PATH: (lambda: autotuned(tx, ty), autotuned_mlp.state),
        **device_paths(state, x_np, y_np),
        "PyTorch eager": (lambda: eager.step(tx, ty), eager.state),
    }
    # GEMMs sum in another order in each library: losses agree to ~1e-6 relative. AdamW divides
    # each gradient element by its own magnitude, so where a gradient element is near zero a
    # last-bit difference can move that weight by up to lr a step: every weight must be within
    # lr per step, and all but 1% within 1e-4.
    for name, (fn, get_state) in peers.items():
        losses = [float(fn().item()) for _ in range(STEPS_CHECKED)]
        check_close(f"MLP step, {name}: losses", losses, ref_losses, rtol=1e-4, atol=1e-5)
        got = get_state()
        for k in ref_state:
            what = f"MLP step, {name}: {k} after {STEPS_CHECKED} steps"
            check_close(what, got[k], ref_state[k], rtol=0, atol=1.01e-3 * STEPS_CHECKED)
            off = np.mean(np.abs(got[k] - ref_state[k]) > 1e-4)
            if off > 0.01:
                raise BenchmarkError(f"{what}: {off:.1%} of the values differ by more than 1e-4")

    reps = 3 if opts.quick else 11
    fns = {name: fn for name, (fn, _) in peers.items()}
    gemm = gemm_products()
    if gemm is not None:
        # Timed in turn with the steps, so that the limit sees the same machine load.
        fns[LIMIT] = gemm[2]
    calls = 1 if opts.quick else {name: calls_for(fn, 0.1, most=20) for name, fn in fns.items()}
    ms = {name: s.scaled(1e3) for name, s in time_side_by_side(fns, calls, reps, warmup=2).items()}
    if replayed.traces != 1:
        raise BenchmarkError("MLP step: compile_step retraced")
    limit = None if gemm is None else (gemm[0], gemm[1], ms.pop(LIMIT))
    xla_why = xla_mlp(opts, reps, ref_losses, ref_state, ms)

    # The step's kernels other than its products, against their byte limits.
    lib = limits.library(opts.build)
    kernel_calls = 3 if opts.quick else 20
    kernels, kernels_ns, kernels_limit_ns = limits.step_kernels(lib, lambda: replayed(lx, ly), kernel_calls)

    mem_steps = 2 if opts.quick else 5
    mem = {peer: peak_memory(opts, peer, mem_steps) for peer in ("lazyrt replayed", "PyTorch eager")}
    check_close("MLP step, memory children's losses", [mem["lazyrt replayed"]["loss"]],
                [mem["PyTorch eager"]["loss"]], rtol=1e-4, atol=1e-5)

    base = "lazyrt replayed (compile_step)"
    mib = 1 / 2**20
    rows = []
    for name, s in ms.items():
        row = [name, s.cell(), ratio(s.median / ms[base].median)]
        if limit is not None:
            _, flops, gemm_ms = limit
            row.append(f"{flops / (s.median * 1e-3) / 1e9:.1f}")
            row.append(f"{gemm_ms.median / s.median:.0%}")
        rows.append(row)
    header = ["path", "ms per step, median [min, max]", "vs lazyrt replayed"]
    if limit is not None:
        header += ["GEMM GFLOP/s", "share of the GEMM limit"]

    md = ["## MLP training step: 784-1024-1024-10, batch 256, cross-entropy, AdamW\n",
          "Initial weights: lazyrt's `nn.Linear` layers after `manual_seed(1)`, copied to PyTorch; x f32[256, 784] "
          "uniform [-1, 1), labels i64[256] in [0, 10) (numpy `default_rng(1)`); AdamW(lr 1e-3, PyTorch's "
          f"defaults). Every path's {STEPS_CHECKED} first losses (rtol 1e-4) and weights (each within lr a step, "
          "99% within 1e-4: AdamW turns last-bit differences of near-zero gradients into steps of up to lr) are "
          "checked against lazyrt's traced steps before timing. "
          f"After 2 warm-up batches (not counted), {reps} batches per path, alternating.\n",
          table(header, rows), "",
          f"First call (capture and compile, fresh caches): {TORCH_COMPILED} {compiled.first_seconds:.2f} s, "
          f"{INDUCTOR_PATH} {inductor.first_seconds:.2f} s, {INDUCTOR_MAX_PATH} {autotuned.first_seconds:.2f} s "
          f"(Inductor's on-disk cache emptied before each).\n"]
    if limit is not None:
        lib, flops, gemm_ms = limit
        shapes = ', '.join(f"{m}x{k}x{n}{' (A^T)' if ta else ''}{' (B^T)' if tb else ''}"
                           for m, k, n, ta, tb in gemm_shapes())
        md.append(f"GEMM limit: the step's 8 products ({shapes}, M x K x N) hold {flops / 1e9:.3f} GFLOP; "
                  f"computed alone, each through the faster library for it (used: {lib}), in turn "
                  f"with the steps' batches, they take {gemm_ms.cell()} ms in all, i.e. "
                  f"{flops / (gemm_ms.median * 1e-3) / 1e9:.1f} GFLOP/s: the least a step "
                  f"can take. The share is that time over the step's time (medians).\n")
    else:
        md.append("GEMM limit: no GEMM library could be loaded; the limit is not measured.\n")
    md.append(limits.step_kernels_markdown(kernels, kernels_ns, kernels_limit_ns, kernel_calls))
    md.append(table(["peak memory of a step (child process)", "lazyrt replayed", "PyTorch eager"], [
        ["process peak resident size above the start, MiB", f"{mem['lazyrt replayed']['peak_rss'] * mib:.1f}",
         f"{mem['PyTorch eager']['peak_rss'] * mib:.1f}"],
        ["lazyrt device memory peak (its own accounting), MiB", f"{mem['lazyrt replayed']['device_peak'] * mib:.1f}",
         "-"],
    ]))
    md.append(f"\nStart: before the model, optimizer and compiled step exist (input data excluded); end: after "
              f"{mem_steps + 1} steps. Parameters, gradients and the two AdamW moments are "
              f"{16 * n_params() / 2**20:.1f} "
              "MiB of that.\n")

    if xla_why is not None:
        md.append(f"{XLA_TRACED}: not measured: {xla_why}\n")
    summary = [("MLP step 784-1024-1024-10", "lazyrt replayed", ms[base].cell(), "ms", "PyTorch eager",
                ms["PyTorch eager"].cell(), ratio(ms["PyTorch eager"].median / ms[base].median))]
    summary.append(("MLP step 784-1024-1024-10, torch model", TORCH_COMPILED, ms[TORCH_COMPILED].cell(), "ms",
                    INDUCTOR_PATH, ms[INDUCTOR_PATH].cell(),
                    ratio(ms[INDUCTOR_PATH].median / ms[TORCH_COMPILED].median)))
    summary.append(("MLP step 784-1024-1024-10, torch model", TORCH_COMPILED, ms[TORCH_COMPILED].cell(), "ms",
                    INDUCTOR_MAX_PATH, ms[INDUCTOR_MAX_PATH].cell(),
                    ratio(ms[INDUCTOR_MAX_PATH].median / ms[TORCH_COMPILED].median)))
    summary.append(("MLP step 784-1024-1024-10, torch model: first call", TORCH_COMPILED,
                    f"{compiled.first_seconds:.2f}", "s", INDUCTOR_PATH, f"{inductor.first_seconds:.2f}",
                    ratio(inductor.first_seconds / compiled.first_seconds)))
    for peer in (XLA_TRACED, "PyTorch eager"):  # PyTorch/XLA-style training on each device
        if peer in ms:
            for path in (DEVICE_TRACED, DEVICE_REPLAYED):
                summary.append(("MLP step 784-1024-1024-10, torch model on a device", path, ms[path].cell(), "ms",
                                peer, ms[peer].cell(), ratio(ms[peer].median / ms[path].median)))
    if limit is not None:
        summary.append(("MLP step: GEMM limit", "lazyrt replayed", ms[base].cell(), "ms",
                        "the faster GEMM library per product, on the step's shapes", limit[2].cell(),
                        ratio(limit[2].median / ms[base].median)))
    summary.append(("MLP step: kernels besides products, byte limit", "lazyrt replayed",
                    f"{kernels_ns / 1e3:.0f}", "us", "a C copy of each kernel's bytes",
                    f"{kernels_limit_ns / 1e3:.0f}", ratio(kernels_limit_ns / kernels_ns)))
    summary.append(("MLP step: peak memory", "lazyrt replayed", f"{mem['lazyrt replayed']['peak_rss'] * mib:.1f}",
                    "MiB", "PyTorch eager", f"{mem['PyTorch eager']['peak_rss'] * mib:.1f}",
                    ratio(mem["PyTorch eager"]["peak_rss"] / max(mem["lazyrt replayed"]["peak_rss"], 1))))
    return {"markdown": "\n".join(md), "summary": summary}


def xla_mlp(opts, reps, ref_losses, ref_state, ms):
    """Runs the torch_xla child, checks its steps as the other paths' and adds its times to ms;
    returns why it was not measured, or None."""
    from harness import Samples, run_child_or_why
    from peers import CHILD_TIMEOUT_S, install_failure, xla_env, xla_installed
    import sys
    if not xla_installed():
        return install_failure(sys.prefix) or "torch_xla is not installed (`make bench` installs it)"
    out, why = run_child_or_why(opts, "mlp-xla", reps, env=xla_env(opts.threads), timeout=CHILD_TIMEOUT_S)
    if out is None:
        return why
    check_close(f"MLP step, {XLA_TRACED}: losses", out["losses"], ref_losses, rtol=1e-4, atol=1e-5)
    for k in ref_state:
        check_close(f"MLP step, {XLA_TRACED}: {k} after {STEPS_CHECKED} steps", np.array(out["state"][k]),
                    ref_state[k], rtol=0, atol=1.01e-3 * STEPS_CHECKED)
    ms[XLA_TRACED] = Samples(out["seconds"]).scaled(1e3)
    return None


def n_params():
    return sum(SIZES[i] * SIZES[i + 1] + SIZES[i + 1] for i in range(len(SIZES) - 1))
