"""A small transformer's training step, unmodified PyTorch code, through lazyrt.torch.compile
against PyTorch eager and PyTorch's own lazy tensors (torch._lazy, TorchScript backend).

Workload: torch.nn.TransformerEncoderLayer(d_model 64, nhead 4, dim_feedforward 256, dropout
0, batch_first) after torch.manual_seed(0), x and target f32[8, 16, 64] standard normal from
torch.Generator seed 1, loss = mse_loss(layer(x), target), backward, AdamW(lr 1e-3, PyTorch's
defaults).step(), zero_grad(). Both peers start from the same state_dict. Dropout is 0 so that
both compute the same values (lazyrt draws dropout masks from its own generator).

The compiled step writes every parameter, gradient and AdamW state tensor back into the torch
tensors after each call; its values are read from the torch model itself.

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

from harness import (BenchmarkError, calls_for, check_close, check_same_training, ltc_live_tensors, ratio,
                     run_child_or_why, table, time_side_by_side, torch_lazy_available, training_step)

D_MODEL, HEADS, FF, BATCH, SEQ = 64, 4, 256, 8, 16
STEPS_CHECKED = 3
FRONTEND = "lazyrt.torch.compile (written back)"
EAGER = "PyTorch eager"
LAZY = "PyTorch lazy tensors (torch._lazy, TorchScript backend)"


def models():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, dropout=0.0, batch_first=True)
    return layer, copy.deepcopy(layer)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, SEQ, D_MODEL, generator=g), torch.randn(BATCH, SEQ, D_MODEL, generator=g)


def step_of(model, opt):
    return training_step(model, opt, torch.nn.functional.mse_loss)


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
    compiled = lazyrt.torch.compile(step_of(m_lazy, o_lazy))

    # PyTorch eager is the reference. Matrix products sum in another order in each library
    # (losses agree to ~1e-6 relative); AdamW divides each gradient element by its own
    # magnitude, so a last-bit difference of a near-zero gradient can move that weight by up
    # to lr a step: every value within lr a step, 99% within 1e-4.
    ref_losses, ref_state, got = check_same_training(
        "transformer step, lazyrt.torch.compile", eager, compiled, (x, y), lambda: state(m_eager),
        lambda: state(m_lazy), STEPS_CHECKED, rtol=0, atol=1.01e-3 * STEPS_CHECKED)
    for k in ref_state:
        what = f"transformer step, lazyrt.torch.compile: {k} after {STEPS_CHECKED} steps"
        off = np.mean(np.abs(got[k] - ref_state[k]) > 1e-4)
        if off > 0.01:
            raise BenchmarkError(f"{what}: {off:.1%} of the values differ by more than 1e-4")
    if compiled.captures != 1 or compiled.traces != 1:
        raise BenchmarkError("transformer step: lazyrt.torch.compile captured or traced more than once")

    fns = {FRONTEND: lambda: compiled(x, y), EAGER: lambda: eager(x, y)}
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

    rows = [(name, s.cell(), ratio(s.median / us[FRONTEND].median)) for name, s in us.items()]
    if lazy_failed is not None:
        rows.append((LAZY, "failed (see above)", "-"))
    md = [
        "## Transformer encoder layer training step through lazyrt.torch.compile\n",
        f"`torch.nn.TransformerEncoderLayer({D_MODEL}, {HEADS}, dim_feedforward={FF}, dropout=0, batch_first=True)` "
        f"after `torch.manual_seed(0)`, x and target f32[{BATCH}, {SEQ}, {D_MODEL}] (standard normal, "
        "`torch.Generator` seed 1), `mse_loss`, backward, `torch.optim.AdamW(lr=1e-3)`, `zero_grad()`: the "
        "unmodified PyTorch step in eager, through `lazyrt.torch.compile` (captured and traced once, checked "
        "after timing) and on torch._lazy, all from the same state. Every call of the compiled step writes the "
        "parameters, gradients and AdamW state back into the torch tensors. Before timing, the compiled step's "
        f"{STEPS_CHECKED} first losses (rtol 1e-4) and the torch model's parameters after them (each within lr a "
        "step, 99% within 1e-4) are checked against eager's. After 2 warm-up batches (not counted), "
        f"{reps} batches per peer, alternating ({', '.join(str(c) for c in calls.values())} steps a batch).\n",
        lazy_note,
        table(["path", "us per step, median [min, max]", "vs lazyrt.torch.compile"], rows),
        "",
    ]
    workload = f"transformer layer step d{D_MODEL} h{HEADS}, batch {BATCH}x{SEQ}"
    summary = [(workload, "lazyrt.torch.compile", us[FRONTEND].cell(), "us", peer, us[peer].cell(),
                ratio(us[peer].median / us[FRONTEND].median)) for peer in (EAGER, LAZY) if peer in us]
    return {"markdown": "\n".join(md), "summary": summary}
