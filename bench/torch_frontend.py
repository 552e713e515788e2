"""A small transformer's training step, unmodified PyTorch code, through lazyrt.torch.compile
against PyTorch eager.

Workload: torch.nn.TransformerEncoderLayer(d_model 64, nhead 4, dim_feedforward 256, dropout
0, batch_first) after torch.manual_seed(0), x and target f32[8, 16, 64] standard normal from
torch.Generator seed 1, loss = mse_loss(layer(x), target), backward, AdamW(lr 1e-3, PyTorch's
defaults).step(), zero_grad(). Both peers start from the same state_dict. Dropout is 0 so that
both compute the same values (lazyrt draws dropout masks from its own generator).

The compiled step writes every parameter, gradient and AdamW state tensor back into the torch
tensors after each call; its values are read from the torch model itself.
"""

import copy

import numpy as np
import torch

from harness import BenchmarkError, calls_for, check_close, ratio, table, time_side_by_side

D_MODEL, HEADS, FF, BATCH, SEQ = 64, 4, 256, 8, 16
STEPS_CHECKED = 3
FRONTEND = "lazyrt.torch.compile (written back)"
EAGER = "PyTorch eager"


def models():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, dropout=0.0, batch_first=True)
    return layer, copy.deepcopy(layer)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, SEQ, D_MODEL, generator=g), torch.randn(BATCH, SEQ, D_MODEL, generator=g)


def step_of(model, opt):
    def train_step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return train_step


def state(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


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
    ref_losses = [float(eager(x, y).item()) for _ in range(STEPS_CHECKED)]
    losses = [float(compiled(x, y).item()) for _ in range(STEPS_CHECKED)]
    check_close("transformer step, lazyrt.torch.compile: losses", losses, ref_losses, rtol=1e-4, atol=1e-5)
    if len(set(losses)) != len(losses):
        raise BenchmarkError("transformer step: the losses do not change from step to step")
    ref_state, got = state(m_eager), state(m_lazy)
    for k in ref_state:
        what = f"transformer step, lazyrt.torch.compile: {k} after {STEPS_CHECKED} steps"
        check_close(what, got[k], ref_state[k], rtol=0, atol=1.01e-3 * STEPS_CHECKED)
        off = np.mean(np.abs(got[k] - ref_state[k]) > 1e-4)
        if off > 0.01:
            raise BenchmarkError(f"{what}: {off:.1%} of the values differ by more than 1e-4")
    if compiled.captures != 1 or compiled.traces != 1:
        raise BenchmarkError("transformer step: lazyrt.torch.compile captured or traced more than once")

    fns = {FRONTEND: lambda: compiled(x, y), EAGER: lambda: eager(x, y)}
    reps = 5 if opts.quick else 15
    calls = {name: calls_for(fn, 0.01 if opts.quick else 0.05, most=1000) for name, fn in fns.items()}
    us = {name: s.scaled(1e6) for name, s in time_side_by_side(fns, calls, reps, warmup=2).items()}
    if compiled.captures != 1 or compiled.traces != 1:
        raise BenchmarkError("transformer step: the timed calls of lazyrt.torch.compile captured or traced again")

    rows = [(name, s.cell(), ratio(s.median / us[FRONTEND].median)) for name, s in us.items()]
    md = [
        "## Transformer encoder layer training step through lazyrt.torch.compile\n",
        f"`torch.nn.TransformerEncoderLayer({D_MODEL}, {HEADS}, dim_feedforward={FF}, dropout=0, batch_first=True)` "
        f"after `torch.manual_seed(0)`, x and target f32[{BATCH}, {SEQ}, {D_MODEL}] (standard normal, "
        "`torch.Generator` seed 1), `mse_loss`, backward, `torch.optim.AdamW(lr=1e-3)`, `zero_grad()`: the "
        "unmodified PyTorch step, once in eager and once through `lazyrt.torch.compile` (captured and traced "
        "once, checked after timing), both from the same state. Every call of the compiled step writes the "
        "parameters, gradients and AdamW state back into the torch tensors. Before timing, the compiled step's "
        f"{STEPS_CHECKED} first losses (rtol 1e-4) and the torch model's parameters after them (each within lr a "
        "step, 99% within 1e-4) are checked against eager's. After 2 warm-up batches (not counted), "
        f"{reps} batches per peer, alternating ({', '.join(str(c) for c in calls.values())} steps a batch).\n",
        table(["path", "us per step, median [min, max]", "vs lazyrt.torch.compile"], rows),
        "",
    ]
    summary = [(f"transformer layer step d{D_MODEL} h{HEADS}, batch {BATCH}x{SEQ}", "lazyrt.torch.compile",
                us[FRONTEND].cell(), "us", EAGER, us[EAGER].cell(), ratio(us[EAGER].median / us[FRONTEND].median))]
    return {"markdown": "\n".join(md), "summary": summary}
