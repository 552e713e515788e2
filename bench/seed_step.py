"""The seed training step in every form: lazyrt replayed and traced (Python and C++), the
unmodified PyTorch step through lazyrt.torch.compile, PyTorch eager (Python and C++) and
PyTorch's own lazy tensors (torch._lazy, TorchScript backend).

Workload: Linear(5, 3) with the initial weight and bias of lazyrt's nn::Linear after
manual_seed(0) (all peers start from those values), x f32[10, 5] with x[i] = sin(0.37 i) in
row-major order, loss = model(x).sum(), backward, AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 1e-2).step(), zero_grad(). One call = one step; the C++ figures come from
`replay_bench --json`, which uses the same values and checks its own paths against libtorch.
"""

import json
import os
import subprocess

import numpy as np
import torch

import lazyrt as lr
import limits
from harness import (BenchmarkError, Samples, calls_for, check_close, ltc_live_tensors, ratio, table,
                     time_side_by_side, torch_lazy_available)

STEPS_CHECKED = 5
FRONTEND = "lazyrt.torch.compile (torch Linear and AdamW, written back)"
EAGER = "PyTorch eager (Python)"


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
    def __init__(self, w, b, device="cpu"):
        self.device = device
        model = torch.nn.Linear(5, 3)
        model.load_state_dict({"weight": torch.from_numpy(w.copy()), "bias": torch.from_numpy(b.copy())})
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self, x):
        loss = self.model(x).sum()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        if self.device == "lazy":
            torch._lazy.mark_step()
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

    # Every lazyrt model and optimizer exists before the step is compiled: a new optimizer
    # makes compiled steps retrace once (it may take over their parameters).
    replay = LazyrtSeed(w, b)
    traced = LazyrtSeed(w, b)
    replayed = lr.compile_step(replay.step, (lx,))
    peers = {"lazyrt replayed (Python, compile_step)": (lambda: replayed(lx), replay.model.weight.numpy)}

    def traced_step():
        loss = traced.step(lx)
        lr.mark_step()
        return loss
    peers["lazyrt traced (Python, mark_step every step)"] = (traced_step, traced.model.weight.numpy)
    frontend, frontend_model = torch_compiled(w, b)
    peers[FRONTEND] = (lambda: frontend(tx), lambda: frontend_model.weight.detach().numpy())
    eager = TorchSeed(w, b)
    peers["PyTorch eager (Python)"] = (lambda: eager.step(tx), lambda: eager.model.weight.detach().numpy())
    lazy_note = ""
    if torch_lazy_available():
        ltc = TorchSeed(w, b, "lazy")
        lazy_x = tx.to("lazy")
        peers["PyTorch lazy tensors (torch._lazy, TorchScript backend)"] = (
            lambda: ltc.step(lazy_x), lambda: ltc.model.weight.detach().cpu().numpy())
    else:
        lazy_note = "torch._lazy could not be initialized in this PyTorch build; its row is missing.\n\n"

    for name, (fn, weight) in peers.items():
        losses = [float(fn().item()) for _ in range(STEPS_CHECKED)]
        check_close(f"seed step, {name}: losses", losses, ref_losses, rtol=1e-5, atol=1e-6)
        check_close(f"seed step, {name}: weight after {STEPS_CHECKED} steps", weight(), ref_weight,
                    rtol=1e-5, atol=1e-6)
    if replayed.traces != 1:
        raise BenchmarkError("seed step: compile_step traced more than once")
    if frontend.captures != 1 or frontend.traces != 1:
        raise BenchmarkError("seed step: lazyrt.torch.compile captured or traced more than once")

    fns = {name: fn for name, (fn, _) in peers.items()}
    reps = 5 if opts.quick else 21
    ltc_name = "PyTorch lazy tensors (torch._lazy, TorchScript backend)"
    # torch._lazy's step time grows with the steps run (see below): a fixed count of steps, the
    # same every run. The others: batches of about equal duration.
    calls = {name: 10 if name == ltc_name else calls_for(fn, 0.005 if opts.quick else 0.03)
             for name, fn in fns.items()}
    if ltc_name in fns:
        ltc_live_before = ltc_live_tensors()
    samples = time_side_by_side(fns, calls, reps, warmup=2)
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
    rows = [(name, s.cell(), ratio(s.median / us[base].median)) for name, s in us.items()]
    md = [
        "## Seed step: Linear(5, 3), 10x5 input, sum, backward, AdamW, zero_grad\n",
        "Initial weight and bias: lazyrt's `nn.Linear(5, 3)` after `manual_seed(0)`, copied to every peer; "
        "x[i] = sin(0.37 i), f32[10, 5]; AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2). "
        f"Every peer's {STEPS_CHECKED} first losses and final weight are checked against lazyrt's traced steps "
        "(rtol 1e-5) before timing. Python rows: after 2 warm-up batches (not counted), "
        f"{reps} batches per peer, the peers' batches alternating; a batch is about "
        f"{'5' if opts.quick else '30'} ms of steps ({', '.join(f'{c}' for c in calls.values())} steps).\n",
        f"{FRONTEND}: PyTorch's own `nn.Linear` and `optim.AdamW` with the same initial values, the step "
        "function unchanged; each call replays the captured graph, which writes the new weight, bias, gradients and "
        "AdamW state into the torch tensors' own memory (its weight row checks the torch model's own weight); "
        "captured and traced once, checked after timing.\n",
        lazy_note + cpp_note,
        table(["path", "us per step, median [min, max]", "vs lazyrt replayed (Python)"], rows),
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
