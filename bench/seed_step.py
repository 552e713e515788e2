"""The seed training step in every form: lazyrt replayed and traced (Python and C++), the
unmodified PyTorch step through lazyrt.torch.compile and through torch.compile(backend="lazyrt"),
PyTorch eager (Python and C++), torch.compile with its default backend (Inductor) and PyTorch's
own lazy tensors (torch._lazy, TorchScript backend).

Workload: Linear(5, 3) with the initial weight and bias of lazyrt's nn::Linear after
manual_seed(0) (all peers start from those values), x f32[10, 5] with x[i] = sin(0.37 i) in
row-major order, loss = model(x).sum(), backward, AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 1e-2).step(), zero_grad(). One call = one step; the C++ figures come from
`replay_bench --json`, which uses the same values and checks its own paths against libtorch.

Correctness: every Python path's first losses and final weight and bias are checked against
PyTorch eager's from the same start (the oracle), and against lazyrt's traced steps, before
anything is timed; a path that disagrees fails the run. Inductor, which compiles C++ with g++ at
run time, may be unable to run on a machine: then its row says why and the rest goes on.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

import lazyrt as lr
import limits
from harness import (DYNAMO_LAZYRT, INDUCTOR, BenchmarkError, Samples, calls_for, check_close, compiled_graphs,
                     dynamo_unique_graphs, ltc_live_tensors, ratio, table, time_side_by_side, torch_compile,
                     torch_lazy_available, why_failed)

STEPS_CHECKED = 5
FRONTEND = "lazyrt.torch.compile (torch Linear and AdamW, written back)"
DYNAMO = f"{DYNAMO_LAZYRT} (torch Linear and AdamW)"
INDUCTOR_ROW = f"{INDUCTOR} (torch Linear and AdamW)"
EAGER = "PyTorch eager (Python)"
LTC = "PyTorch lazy tensors (torch._lazy, TorchScript backend)"


def seed_values():
    x = np.sin(0.37 * np.arange(50, dtype=np.float32)).astype(np.float32).reshape(10, 5)
    lr.manual_seed(0)
    ref = lr.nn.Linear(5, 3)
    return ref.weight.numpy().copy(), ref.bias.numpy().copy(), x


class LazyrtSeed:
    def __init__(self, w, b):
        self.model = lr.nn.Linear(5, 3)
        self.model.load_state_dict({"weight": lr.tensor(w), "bias": lr.tensor(b)})
        self.opt = lr.optim.AdamW(self.model.parameters(), lr=1e-3)
        lr.mark_step()

    def step(self, x):
        loss = self.model(x).sum()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss


class TorchSeed:
    def __init__(self, w, b, device="cpu", capturable=False):
        self.device = device
        model = torch.nn.Linear(5, 3)
        model.load_state_dict({"weight": torch.from_numpy(w.copy()), "bias": torch.from_numpy(b.copy())})
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, capturable=capturable)

    def step(self, x):
        loss = self.model(x).sum()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        if self.device == "lazy":
            torch._lazy.mark_step()
        elif torch.device(self.device).type == "lazyrt":  # the lazyrt device, PyTorch/XLA-style
            import lazyrt.torch
            lazyrt.torch.sync()
        return loss


def torch_compiled(w, b):
    """The seed step on an unmodified torch.nn.Linear and torch.optim.AdamW, compiled by
    lazyrt.torch.compile (model and optimizer found in the step's closure). Every call writes
    the new weight, bias, gradients and AdamW state into the torch tensors' own memory.
    Returns (the compiled step, the torch model)."""
    import lazyrt.torch

    model = TorchSeed(w, b)
    torch_model, torch_opt = model.model, model.opt

    def train_step(x):
        loss = torch_model(x).sum()
        loss.backward()
        torch_opt.step()
        torch_opt.zero_grad()
        return loss
    compiled = lazyrt.torch.compile(train_step)
    return compiled, torch_model


def torch_dot_compiled(w, b, backend):
    """The same unmodified step on its own torch.nn.Linear and torch.optim.AdamW, through
    torch.compile(step, backend=backend) (None: Inductor). Returns (the compiled step, a
    harness.FirstCallTimed, and the torch model)."""
    model = TorchSeed(w, b)
    return torch_compile(model.step, backend), model.model


def params_of(model):
    """(weight, bias) of a torch or lazyrt Linear, as NumPy arrays."""
    def arr(t):
        return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t.numpy()
    return arr(model.weight), arr(model.bias)


def cpp_figures(build_dir):
    """replay_bench's JSON, or None when the binary is not built."""
    exe = os.path.join(build_dir, "bench", "replay_bench")
    if not os.access(exe, os.X_OK):
        return None
    out = subprocess.run([exe, "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def run(opts):
    w, b, x_np = seed_values()
    lx = lr.tensor(x_np)
    tx = torch.from_numpy(x_np.copy())

    # Every peer runs STEPS_CHECKED steps from the same values; losses and final weights must
    # agree with lazyrt's traced steps before anything is timed.
    ref = LazyrtSeed(w, b)
    ref_losses = []
    for _ in range(STEPS_CHECKED):
        loss = ref.step(lx)
        lr.mark_step()
        ref_losses.append(loss.item())
    ref_weight = ref.model.weight.numpy()
    # PyTorch eager, the oracle of every Python path.
    oracle = TorchSeed(w, b)
    oracle_losses = [float(oracle.step(tx).item()) for _ in range(STEPS_CHECKED)]
    oracle_params = params_of(oracle.model)

    # Every lazyrt model and optimizer exists before the step is compiled: a new optimizer
    # makes compiled steps retrace once (it may take over their parameters).
    replay = LazyrtSeed(w, b)
    traced = LazyrtSeed(w, b)
    replayed = lr.compile_step(replay.step, (lx,))
    peers = {"lazyrt replayed (Python, compile_step)": (lambda: replayed(lx), lambda: params_of(replay.model))}

    def traced_step():
        loss = traced.step(lx)
        lr.mark_step()
        return loss
    peers["lazyrt traced (Python, mark_step every step)"] = (traced_step, lambda: params_of(traced.model))
    frontend, frontend_model = torch_compiled(w, b)
    peers[FRONTEND] = (lambda: frontend(tx), lambda: params_of(frontend_model))
    dynamo, dynamo_model = torch_dot_compiled(w, b, "lazyrt")
    peers[DYNAMO] = (lambda: dynamo(tx), lambda: params_of(dynamo_model))
    inductor, inductor_model = torch_dot_compiled(w, b, None)
    peers[INDUCTOR_ROW] = (lambda: inductor(tx), lambda: params_of(inductor_model))
    eager = TorchSeed(w, b)
    peers["PyTorch eager (Python)"] = (lambda: eager.step(tx), lambda: params_of(eager.model))
    lazy_note = ""
    # Peers that may be unable to run in this PyTorch build or on this machine: {name: why}, their
    # rows say so and the rest goes on. Wrong values still fail the run.
    failed = {}
    if torch_lazy_available():
        try:
            ltc = TorchSeed(w, b, "lazy")
            lazy_x = tx.to("lazy")
            peers[LTC] = (lambda: ltc.step(lazy_x), lambda: params_of(ltc.model))
        except Exception as e:  # noqa: BLE001 - reported in its row
            failed[LTC] = why_failed(e)
    else:
        failed[LTC] = "torch._lazy cannot be imported or initialized in this PyTorch build"

    dynamo_graphs = {}
    for name, (fn, params) in list(peers.items()):
        graphs_before = dynamo_unique_graphs()
        started = time.perf_counter()
        try:
            first = fn()
            if name == FRONTEND:
                frontend_first = time.perf_counter() - started
            losses = [float(first.item())] + [float(fn().item()) for _ in range(STEPS_CHECKED - 1)]
            weight, bias = params()
        except Exception as e:  # noqa: BLE001 - torch._lazy or Inductor cannot run: its row says why
            if name not in (INDUCTOR_ROW, LTC):
                raise
            failed[name] = why_failed(e)
            del peers[name]
            continue
        if name in (DYNAMO, INDUCTOR_ROW):
            dynamo_graphs[name] = dynamo_unique_graphs() - graphs_before
        check_close(f"seed step, {name}: losses against PyTorch eager's", losses, oracle_losses, rtol=1e-5,
                    atol=1e-6)
        for what, got, want in (("weight", weight, oracle_params[0]), ("bias", bias, oracle_params[1])):
            check_close(f"seed step, {name}: {what} after {STEPS_CHECKED} steps against PyTorch eager's", got, want,
                        rtol=1e-5, atol=1e-6)
        check_close(f"seed step, {name}: losses", losses, ref_losses, rtol=1e-5, atol=1e-6)
        check_close(f"seed step, {name}: weight after {STEPS_CHECKED} steps", weight, ref_weight,
                    rtol=1e-5, atol=1e-6)
    if replayed.traces != 1:
        raise BenchmarkError("seed step: compile_step traced more than once")
    if frontend.captures != 1 or frontend.traces != 1:
        raise BenchmarkError("seed step: lazyrt.torch.compile captured or traced more than once")

    fns = {name: fn for name, (fn, _) in peers.items()}
    for name, compiled in ((DYNAMO, dynamo), (INDUCTOR_ROW, inductor)):
        if name in fns:  # the compiled step itself, without FirstCallTimed's call
            fns[name] = (lambda f: lambda: f(tx))(compiled.fn)
    reps = 5 if opts.quick else 21
    ltc_name = LTC
    for name, why in failed.items():
        print(f"seed_step: {name}: failed, no figures: {why}", file=sys.stderr, flush=True)
        if name == LTC:
            lazy_note = (f"{LTC}: no figures, it failed on this step in this PyTorch build ({torch.__version__}): "
                         f"{why}\n\n")
    # torch._lazy's step time grows with the steps run (see below): a fixed count of steps, the
    # same every run. The others: batches of about equal duration.
    calls = {name: 10 if name == ltc_name else calls_for(fn, 0.005 if opts.quick else 0.03)
             for name, fn in fns.items()}
    if ltc_name in fns:
        ltc_live_before = ltc_live_tensors()
    graphs_before = compiled_graphs()
    samples = time_side_by_side(fns, calls, reps, warmup=2)
    if compiled_graphs() != graphs_before:
        raise BenchmarkError("seed step: torch.compile captured new graphs (recompiled) during the timed calls")
    if ltc_name in fns:
        ltc_steps = calls[ltc_name] * (reps + 2)
        ltc_growth = (ltc_live_tensors() - ltc_live_before) / ltc_steps
        first, last = samples[ltc_name].in_order[0], samples[ltc_name].in_order[-1]
        lazy_note += (f"torch._lazy: its rows time steps {STEPS_CHECKED + 1} to {STEPS_CHECKED + ltc_steps} of a fresh "
                      f"model in batches of {calls[ltc_name]}; its step time grows with the steps run (first timed "
                      f"batch {first * 1e6:.0f} us a step, last {last * 1e6:.0f} us): by its own counters, "
                      f"{ltc_growth:.1f} more lazy tensors are created than destroyed per step "
                      "(CreateLtcTensor - DestroyLtcTensor) in this PyTorch build.\n\n")
    if replayed.traces != 1:
        raise BenchmarkError("seed step: the timed calls of compile_step retraced")
    if frontend.captures != 1 or frontend.traces != 1:
        raise BenchmarkError("seed step: the timed calls of lazyrt.torch.compile captured or traced again")
    us = {name: s.scaled(1e6) for name, s in samples.items()}

    cpp = None if opts.quick else cpp_figures(opts.build)
    cpp_note = ""
    if cpp is not None:
        check_close("seed step, C++ initial weight", np.float32(cpp["weight"]).reshape(3, 5), w, rtol=0, atol=0)
        check_close("seed step, C++ traced losses", cpp["traced_losses"], ref_losses[:3], rtol=1e-6, atol=1e-7)
        check_close("seed step, C++ replayed losses", cpp["replayed_losses"], ref_losses[:3], rtol=1e-6, atol=1e-7)
        us["lazyrt replayed (C++, CompiledStep::run)"] = Samples(cpp["us"]["replayed"])
        us["lazyrt traced (C++, mark_step every step)"] = Samples(cpp["us"]["traced"])
        if cpp["us"]["libtorch"]:
            check_close("seed step, libtorch C++ losses", cpp["torch_losses"], ref_losses[:3], rtol=1e-5, atol=1e-6)
            us["PyTorch eager (C++, libtorch)"] = Samples(cpp["us"]["libtorch"])
        else:
            cpp_note = "replay_bench was built without libtorch: no libtorch C++ row.\n\n"
        cpp_note += (f"C++ rows: `replay_bench --json`, {cpp['reps']} repetitions of {cpp['iters']} steps "
                     f"({cpp['replay_iters']} replayed steps), the paths interleaved, after {cpp['warmup']} "
                     f"warm-up steps; its losses and initial weights are checked equal to the Python rows'.\n\n")
    elif not opts.quick:
        cpp_note = f"No replay_bench in {opts.build}/bench: the C++ rows are missing.\n\n"

    base = "lazyrt replayed (Python, compile_step)"
    rows = [(name, s.cell(), ratio(s.median / us[base].median),
             ratio(us[EAGER].median / s.median) if name in fns else "-")
            for name, s in us.items()]
    rows += [(name, "failed (see above)" if name == LTC else "failed (see below)", "-", "-") for name in failed]
    first_calls = [(FRONTEND, f"{frontend_first * 1e3:.0f}", "-")]
    first_calls += [(name, f"{compiled.first_seconds * 1e3:.0f}", str(dynamo_graphs[name]))
                    for name, compiled in ((DYNAMO, dynamo), (INDUCTOR_ROW, inductor)) if name in us]
    compile_note = (
        f"{DYNAMO} and {INDUCTOR_ROW}: the same unmodified step function on a torch model and AdamW of their own "
        "(same initial values), each through `torch.compile(step, backend=...)`: Dynamo captures the step (it breaks "
        "the graph at `loss.backward()` and `zero_grad()`), AOTAutograd makes the forward and backward graphs, the "
        "backend compiles them; PyTorch's own optimizer and autograd update the torch tensors. "
        "Checked like every path before timing: their 5 first losses and the weight and bias after them against "
        "PyTorch eager's from the same start (rtol 1e-5); the timed calls must not recompile (Dynamo's graph count "
        "is checked after timing). Their first call (Dynamo's capture and the backend's compile; Inductor writes "
        "and compiles C++ with g++, into a fresh cache folder) is timed alone, not in the rows above:\n\n"
        + table(["path", "first call, ms", "graphs Dynamo captured"], first_calls) + "\n")
    if INDUCTOR_ROW in failed:
        compile_note += (f"\n{INDUCTOR_ROW}: no figures, it cannot run here ({torch.__version__}): "
                         f"{failed[INDUCTOR_ROW]}\n")
    md = [
        "## Seed step: Linear(5, 3), 10x5 input, sum, backward, AdamW, zero_grad\n",
        "Initial weight and bias: lazyrt's `nn.Linear(5, 3)` after `manual_seed(0)`, copied to every peer; "
        "x[i] = sin(0.37 i), f32[10, 5]; AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2). "
        f"Every Python peer's {STEPS_CHECKED} first losses and final weight and bias are checked against PyTorch "
        "eager's from the same start, and its losses and weight against lazyrt's traced steps (rtol 1e-5), before "
        "timing. Python rows: after 2 warm-up batches (not counted), "
        f"{reps} batches per peer, the peers' batches alternating; a batch is about "
        f"{'5' if opts.quick else '30'} ms of steps ({', '.join(f'{c}' for c in calls.values())} steps).\n",
        f"{FRONTEND}: PyTorch's own `nn.Linear` and `optim.AdamW` with the same initial values, the step "
        "function unchanged; each call replays the captured graph, which writes the new weight, bias, gradients and "
        "AdamW state into the torch tensors' own memory (its weight row checks the torch model's own weight); "
        "captured and traced once, checked after timing.\n",
        lazy_note + cpp_note,
        table(["path", "us per step, median [min, max]", "vs lazyrt replayed (Python)",
               "PyTorch eager (Python) / this"],
              rows),
        "",
        compile_note,
        "",
    ]
    if os.path.exists(os.path.join(opts.build, "bench", limits.LIBRARY)):
        kernel_calls = 3 if opts.quick else 200
        kernels = limits.step_kernels(limits.library(opts.build), lambda: replayed(lx), kernel_calls)
        md.append(limits.step_kernels_markdown(*kernels, kernel_calls))
    else:
        md.append(f"No {limits.LIBRARY} in {opts.build}/bench: the step's kernels are not measured.\n")
    ops = {}
    if cpp is not None and "ns_per_op" in cpp:
        ops = {"lazyrt: a + b, f32[4], recorded": Samples(cpp["ns_per_op"]["add"]),
               "lazyrt: a * w, f32[4], w requires grad (its autograd node too), recorded":
                   Samples(cpp["ns_per_op"]["mul_grad"])}
        if cpp["ns_per_op"]["libtorch_add"]:
            ops["libtorch eager: a + b, f32[4], computed (no grad)"] = Samples(cpp["ns_per_op"]["libtorch_add"])
        md += [
            "### Recording one op (C++)\n",
            f"`replay_bench --json`: {cpp['reps']} batches of {cpp['op_iters']} ops per path, the paths interleaved; "
            "lazyrt records each op (infers its type, makes its node and its result tensor) and drops it unsynced, "
            "libtorch computes it. Target: at most 250 ns per recorded op.\n",
            table(["op", "ns per op, median [min, max]"], [(name, s.cell()) for name, s in ops.items()]),
            "",
        ]
    summary = []
    for peer in ("PyTorch eager (Python)", "PyTorch lazy tensors (torch._lazy, TorchScript backend)",
                 "lazyrt traced (Python, mark_step every step)"):
        if peer in us:
            summary.append(("seed step (Python)", "lazyrt replayed", us[base].cell(), "us", peer, us[peer].cell(),
                            ratio(us[peer].median / us[base].median)))
    summary.append(("seed step (Python, torch model)", "lazyrt.torch.compile", us[FRONTEND].cell(), "us", EAGER,
                    us[EAGER].cell(), ratio(us[EAGER].median / us[FRONTEND].median)))
    for peer in (EAGER, INDUCTOR_ROW):
        if peer in us:
            summary.append(("seed step (Python, torch model)", DYNAMO_LAZYRT, us[DYNAMO].cell(), "us", peer,
                            us[peer].cell(), ratio(us[peer].median / us[DYNAMO].median)))
    cbase = "lazyrt replayed (C++, CompiledStep::run)"
    if "PyTorch eager (C++, libtorch)" in us:
        summary.append(("seed step (C++)", "lazyrt replayed", us[cbase].cell(), "us", "PyTorch eager (C++)",
                        us["PyTorch eager (C++, libtorch)"].cell(),
                        ratio(us["PyTorch eager (C++, libtorch)"].median / us[cbase].median)))
    if "PyTorch eager (C++, libtorch)" in us:
        traced = us["lazyrt traced (C++, mark_step every step)"]
        summary.append(("seed step traced every step (C++)", "lazyrt traced", traced.cell(), "us",
                        "PyTorch eager (C++)", us["PyTorch eager (C++, libtorch)"].cell(),
                        ratio(us["PyTorch eager (C++, libtorch)"].median / traced.median)))
    if ops:
        add = ops["lazyrt: a + b, f32[4], recorded"]
        torch_add = ops.get("libtorch eager: a + b, f32[4], computed (no grad)")
        summary.append(("one op, a + b on f32[4] (C++)", "lazyrt recorded", add.cell(), "ns",
                        "libtorch eager (computed)" if torch_add else "-", torch_add.cell() if torch_add else "-",
                        ratio(torch_add.median / add.median) if torch_add else "-"))
    return {"markdown": "\n".join(md), "summary": summary}
