"""A small transformer's training step, unmodified PyTorch code, through lazyrt.torch.compile and
through torch.compile(backend="lazyrt") against PyTorch eager, torch.compile with its default
backend (Inductor) and PyTorch's own lazy tensors (torch._lazy, TorchScript backend).

Workload: torch.nn.TransformerEncoderLayer(d_model 64, nhead 4, dim_feedforward 256, dropout
0, batch_first) after torch.manual_seed(0), x and target f32[8, 16, 64] standard normal from
torch.Generator seed 1, loss = mse_loss(layer(x), target), backward, AdamW(lr 1e-3, PyTorch's
defaults).step(), zero_grad(). Both peers start from the same state_dict. Dropout is 0 so that
both compute the same values (lazyrt draws dropout masks from its own generator).

The compiled step writes every parameter, gradient and AdamW state tensor back into the torch
tensors after each call; its values are read from the torch model itself.

PyTorch eager is the oracle: every compiled path runs its first steps from the same state as an
eager model, and its losses and parameters must agree with eager's before it is timed, or the
run fails. torch.compile's paths (lazyrt's Dynamo backend, Inductor) have their first call, where
Dynamo captures and the backend compiles, timed on its own. Inductor compiles C++ with g++ at run
time; where it cannot run, its row says why and the rest goes on.

torch._lazy runs the same step on device "lazy" with torch._lazy.mark_step() after each step.
It can abort the whole process (a failed check in its C++), so its first steps run in a child
process first; when they fail, or its results differ from eager's, its row says so and the
rest of the benchmark goes on.
"""

import copy
import json
import sys

import numpy as np
import torch

from harness import (DYNAMO_LAZYRT, INDUCTOR, BenchmarkError, FirstCallTimed, calls_for, check_close,
                     check_same_training, compiled_graphs, dynamo_unique_graphs, ltc_live_tensors, ratio,
                     run_child_or_why, table, time_side_by_side, torch_compile, torch_lazy_available, training_step,
                     why_failed)

D_MODEL, HEADS, FF, BATCH, SEQ = 64, 4, 256, 8, 16
STEPS_CHECKED = 3
FRONTEND = "lazyrt.torch.compile (written back)"
DYNAMO = DYNAMO_LAZYRT
INDUCTOR_ROW = INDUCTOR
EAGER = "PyTorch eager"
LAZY = "PyTorch lazy tensors (torch._lazy, TorchScript backend)"


def models():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, dropout=0.0, batch_first=True)
    return layer, copy.deepcopy(layer)


def fresh_model():
    """One more model in the same initial state as models()'s."""
    return models()[0]


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, SEQ, D_MODEL, generator=g), torch.randn(BATCH, SEQ, D_MODEL, generator=g)


def step_of(model, opt):
    return training_step(model, opt, torch.nn.functional.mse_loss)


def check_within_lr(what, ref_state, got, steps):
    """Each value within lr a step of eager's, 99% within 1e-4 (see run())."""
    for k in ref_state:
        check_close(f"{what}: {k} after {steps} steps", got[k], ref_state[k], rtol=0, atol=1.01e-3 * steps)
        off = np.mean(np.abs(got[k] - ref_state[k]) > 1e-4)
        if off > 0.01:
            raise BenchmarkError(f"{what}: {k} after {steps} steps: {off:.1%} of the values differ by more than 1e-4")


def dynamo_peer(backend, x, y, ref_losses, ref_state):
    """torch.compile(step, backend=backend) (None: Inductor) of the step on a fresh model from the
    same state, checked against eager's first STEPS_CHECKED losses and the parameters after them.
    Returns (the harness.FirstCallTimed step, graphs Dynamo captured); its first call raises what
    the backend raised."""
    model = fresh_model()
    compiled = torch_compile(step_of(model, torch.optim.AdamW(model.parameters(), lr=1e-3)), backend)
    graphs = dynamo_unique_graphs()
    name = DYNAMO_LAZYRT if backend else INDUCTOR
    first = compiled(x, y)
    losses = [float(first.item())] + [float(compiled(x, y).item()) for _ in range(STEPS_CHECKED - 1)]
    graphs = dynamo_unique_graphs() - graphs
    check_close(f"transformer step, {name}: losses against eager's", losses, ref_losses, rtol=1e-4, atol=1e-5)
    check_within_lr(f"transformer step, {name}", ref_state, state(model), STEPS_CHECKED)
    return compiled, graphs


def state(model):
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def lazy_peer(x, y):
    """The step on torch._lazy, from the same state: a copy of the model moved to device "lazy"
    before its AdamW is made, x and target moved too, mark_step() after every step. Returns
    (step, model); raises RuntimeError when torch._lazy cannot be initialized."""
    if not torch_lazy_available():
        raise RuntimeError("torch._lazy cannot be imported or initialized in this PyTorch build")
    import torch._lazy

    model = models()[0].to("lazy")
    step = step_of(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    lx, ly = x.to("lazy"), y.to("lazy")

    def lazy_step():
        loss = step(lx, ly)
        torch._lazy.mark_step()
        return loss
    return lazy_step, model


def child_lazy_probe():
    """bench/suite.py --child torch-frontend-lazy: torch._lazy's first STEPS_CHECKED steps, in a
    process of their own; prints {"losses": [...]} or {"error": "..."} as its last line."""
    try:
        step, _ = lazy_peer(*data())
        print(json.dumps({"losses": [float(step().item()) for _ in range(STEPS_CHECKED)]}))
    except Exception as e:  # noqa: BLE001 - reported in the parent's row
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))


def probe_lazy(opts, ref_losses):
    """None when torch._lazy's first steps run in a child process and give eager's losses; else
    why not."""
    probe, why = run_child_or_why(opts, "torch-frontend-lazy")
    if why is not None:
        return why
    if "error" in probe:
        return probe["error"]
    try:
        check_close("torch._lazy: first losses", probe["losses"], ref_losses, rtol=1e-4, atol=1e-5)
    except BenchmarkError as e:
        return str(e)
    return None


class _LazyFailed(Exception):
    pass


def run(opts):
    import lazyrt.torch

    x, y = data()
    m_eager, m_lazy = models()
    o_eager = torch.optim.AdamW(m_eager.parameters(), lr=1e-3)
    o_lazy = torch.optim.AdamW(m_lazy.parameters(), lr=1e-3)
    eager = step_of(m_eager, o_eager)
    compiled = FirstCallTimed(lazyrt.torch.compile(step_of(m_lazy, o_lazy)))

    # PyTorch eager is the reference. Matrix products sum in another order in each library
    # (losses agree to ~1e-6 relative); AdamW divides each gradient element by its own
    # magnitude, so a last-bit difference of a near-zero gradient can move that weight by up
    # to lr a step: every value within lr a step, 99% within 1e-4.
    ref_losses, ref_state, got = check_same_training(
        "transformer step, lazyrt.torch.compile", eager, compiled, (x, y), lambda: state(m_eager),
        lambda: state(m_lazy), STEPS_CHECKED, rtol=0, atol=1.01e-3 * STEPS_CHECKED)
    check_within_lr("transformer step, lazyrt.torch.compile", ref_state, got, STEPS_CHECKED)
    compiled, first_ms = compiled.fn, {FRONTEND: compiled.first_seconds * 1e3}
    if compiled.captures != 1 or compiled.traces != 1:
        raise BenchmarkError("transformer step: lazyrt.torch.compile captured or traced more than once")

    # torch.compile's paths, each from the same state, checked against eager's first steps.
    dynamo, graphs = dynamo_peer("lazyrt", x, y, ref_losses, ref_state)
    first_ms[DYNAMO] = dynamo.first_seconds * 1e3
    dynamo_graphs = {DYNAMO: graphs}
    inductor_failed = None
    try:
        inductor, graphs = dynamo_peer(None, x, y, ref_losses, ref_state)
        first_ms[INDUCTOR_ROW] = inductor.first_seconds * 1e3
        dynamo_graphs[INDUCTOR_ROW] = graphs
    except BenchmarkError:
        raise
    except Exception as e:  # noqa: BLE001 - the machine cannot run Inductor: its row says why
        inductor_failed = why_failed(e)
        print(f"torch_frontend: {INDUCTOR}: failed, no figures: {inductor_failed}", file=sys.stderr, flush=True)

    fns = {FRONTEND: lambda: compiled(x, y), DYNAMO: lambda: dynamo.fn(x, y), EAGER: lambda: eager(x, y)}
    if inductor_failed is None:
        fns[INDUCTOR_ROW] = lambda: inductor.fn(x, y)
    lazy_failed = probe_lazy(opts, ref_losses)
    lazy_losses = []  # every step torch._lazy runs in this process, its loss
    if lazy_failed is None:
        try:
            lazy_step, lazy_model = lazy_peer(x, y)
        except Exception as e:  # noqa: BLE001 - reported in its row
            lazy_failed = f"{type(e).__name__}: {e}"

    if lazy_failed is None:
        def timed_lazy():
            try:
                lazy_losses.append(lazy_step())
            except Exception as e:
                raise _LazyFailed(f"{type(e).__name__}: {e}") from e
        fns[LAZY] = timed_lazy
        live_before = ltc_live_tensors()
    reps = 5 if opts.quick else 15
    graphs_before = compiled_graphs()
    try:
        calls = {name: calls_for(fn, 0.01 if opts.quick else 0.05, most=1000) for name, fn in fns.items()}
        samples = time_side_by_side(fns, calls, reps, warmup=2)
    except _LazyFailed as e:
        lazy_failed = f"while timed: {e}"
        del fns[LAZY]
        calls = {name: calls_for(fn, 0.01 if opts.quick else 0.05, most=1000) for name, fn in fns.items()}
        samples = time_side_by_side(fns, calls, reps, warmup=2)
    us = {name: s.scaled(1e6) for name, s in samples.items()}
    if compiled.captures != 1 or compiled.traces != 1:
        raise BenchmarkError("transformer step: the timed calls of lazyrt.torch.compile captured or traced again")
    if compiled_graphs() != graphs_before:
        raise BenchmarkError("transformer step: torch.compile captured new graphs (recompiled) during the timed calls")

    lazy_note = ""
    if LAZY in us:
        # After the timed steps: every loss torch._lazy gave and its parameters after them against an
        # eager model run as many steps from the same state (each parameter within lr a step, as above).
        n = len(lazy_losses)
        growth = (ltc_live_tensors() - live_before) / n
        m_ref, _ = models()
        ref_step = step_of(m_ref, torch.optim.AdamW(m_ref.parameters(), lr=1e-3))
        try:
            ref = [float(ref_step(x, y).item()) for _ in range(n)]
            check_close(f"torch._lazy: losses of its {n} steps", [float(v.item()) for v in lazy_losses], ref,
                        rtol=1e-4, atol=1e-5)
            ref_state, got = state(m_ref), state(lazy_model)
            for k in ref_state:
                check_close(f"torch._lazy: {k} after {n} steps", got[k], ref_state[k], rtol=0, atol=1.01e-3 * n)
            lazy_note = (f"{LAZY}: a copy of the model from the same state moved to device \"lazy\" before its "
                         "AdamW is made, x and target moved too, `torch._lazy.mark_step()` after every step. Its "
                         f"{STEPS_CHECKED} first losses are checked against eager's in a child process first (torch."
                         "_lazy can abort the process); after the timed steps, the losses of all its "
                         f"{n} steps (rtol 1e-4) and its parameters (each within lr a step) are checked against an "
                         f"eager model run {n} steps from the same state. By its own counters, {growth:.1f} more lazy "
                         "tensors are created than destroyed per step (CreateLtcTensor - DestroyLtcTensor).\n")
        except BenchmarkError as e:
            lazy_failed = f"its results after the timed steps differ from eager's: {e}"
            del us[LAZY]
    if lazy_failed is not None:
        print(f"torch_frontend: {LAZY}: failed, no figures: {lazy_failed}", file=sys.stderr, flush=True)
        lazy_note = (f"{LAZY}: no figures, it failed on this step in this PyTorch build ({torch.__version__}): "
                     f"{lazy_failed}\n")

    rows = [(name, s.cell(), ratio(s.median / us[FRONTEND].median), ratio(us[EAGER].median / s.median))
            for name, s in us.items()]
    if inductor_failed is not None:
        rows.append((INDUCTOR_ROW, "failed (see below)", "-", "-"))
    if lazy_failed is not None:
        rows.append((LAZY, "failed (see above)", "-", "-"))
    first_calls = [(name, f"{ms:.0f}", str(dynamo_graphs.get(name, "-"))) for name, ms in first_ms.items()]
    compile_note = (
        f"{DYNAMO} and {INDUCTOR_ROW}: the same unmodified step on a model of their own from the same state, "
        "through `torch.compile(step, backend=...)`: Dynamo captures the step (breaking the graph where it cannot "
        "trace, e.g. at `loss.backward()`), AOTAutograd makes forward and backward graphs, the backend compiles "
        "them; PyTorch's autograd and AdamW update the torch tensors. Before timing, each one's "
        f"{STEPS_CHECKED} first losses (rtol 1e-4) and its parameters after them (each within lr a step, 99% "
        "within 1e-4) are checked against eager's from the same state; the timed calls must not recompile "
        "(Dynamo's graph count is checked after timing). First calls (capture and compile; Inductor writes and "
        "compiles C++ with g++, into a fresh cache folder) are timed alone, not in the table above:\n\n"
        + table(["path", "first call, ms", "graphs Dynamo captured"], first_calls) + "\n")
    if inductor_failed is not None:
        compile_note += (f"\n{INDUCTOR_ROW}: no figures, it cannot run here ({torch.__version__}): "
                         f"{inductor_failed}\n")
    md = [
        "## Transformer encoder layer training step through lazyrt.torch.compile\n",
        f"`torch.nn.TransformerEncoderLayer({D_MODEL}, {HEADS}, dim_feedforward={FF}, dropout=0, batch_first=True)` "
        f"after `torch.manual_seed(0)`, x and target f32[{BATCH}, {SEQ}, {D_MODEL}] (standard normal, "
        "`torch.Generator` seed 1), `mse_loss`, backward, `torch.optim.AdamW(lr=1e-3)`, `zero_grad()`: the "
        "unmodified PyTorch step in eager, through `lazyrt.torch.compile` (captured and traced once, checked "
        "after timing), through `torch.compile` with lazyrt's backend and with Inductor (below) and on torch._lazy, "
        "all from the same state. Every call of the compiled step writes the "
        "parameters, gradients and AdamW state back into the torch tensors. Before timing, the compiled step's "
        f"{STEPS_CHECKED} first losses (rtol 1e-4) and the torch model's parameters after them (each within lr a "
        "step, 99% within 1e-4) are checked against eager's. After 2 warm-up batches (not counted), "
        f"{reps} batches per peer, alternating ({', '.join(str(c) for c in calls.values())} steps a batch).\n",
        lazy_note,
        table(["path", "us per step, median [min, max]", "vs lazyrt.torch.compile", "PyTorch eager / this"], rows),
        "",
        compile_note,
    ]
    workload = f"transformer layer step d{D_MODEL} h{HEADS}, batch {BATCH}x{SEQ}"
    summary = [(workload, "lazyrt.torch.compile", us[FRONTEND].cell(), "us", peer, us[peer].cell(),
                ratio(us[peer].median / us[FRONTEND].median)) for peer in (EAGER, LAZY) if peer in us]
    summary += [(workload, DYNAMO_LAZYRT, us[DYNAMO].cell(), "us", peer, us[peer].cell(),
                 ratio(us[peer].median / us[DYNAMO].median)) for peer in (EAGER, INDUCTOR_ROW) if peer in us]
    return {"markdown": "\n".join(md), "summary": summary}
