"""A GPT training step and inference step in nanoGPT's architecture, unmodified PyTorch code,
through lazyrt.torch.compile against PyTorch eager.

Workload: a decoder-only transformer as nanoGPT builds it (6 blocks, 6 heads, 384 wide,
context 256, a 65-token vocabulary as its character-level Shakespeare model): token and
position embeddings; per block a pre-LayerNorm causal self-attention (one Linear for q, k and
v, scores scaled by 1/sqrt(head size), a lower-triangular mask buffer, softmax, an output
projection) and a pre-LayerNorm MLP (4x wide, exact GELU), each added to the residual stream;
a final LayerNorm and a bias-free head that shares the token embedding's weight. Weights drawn
N(0, 0.02) (the output projections N(0, 0.02 / sqrt(2 * layers))), biases zero, after
torch.manual_seed(0); dropout 0. A batch of 8 sequences of 256 tokens and their next tokens,
from torch.Generator seed 1. Training step: cross_entropy over every position, backward,
AdamW(lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on the matrices and embeddings, 0 on
biases and LayerNorm weights).step(), zero_grad(). Inference step: the logits of every
position under no_grad, in eval mode.

lazyrt.torch.compile captures each step once and replays it, writing parameters and AdamW's
state back into the torch tensors every call. Both peers start from the same state_dict.

On a device, PyTorch/XLA-style: the same model moved to the lazyrt device (which keeps the head
tied to the token embedding; PyTorch/XLA's users tie them again after the move), trained with lazyrt.torch.sync() every
step, and traced once and replayed by PyTorch/XLA's low-level calls (AdamW capturable); and
torch_xla 2.9 (PJRT_DEVICE=CPU) training it with torch_xla.sync() every step, in a child
process, where `make bench` installed it.
"""

import copy
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from harness import (INDUCTOR_NOTE, INDUCTOR_STEP_HEADER, MODEL_MEMORY_NOTE, MODEL_STEP_HEADER, BenchmarkError,
                     FirstCallTimed, ModelWorkload, check_same_training, compiled_inference, device_replay,
                     inductor_model_steps, inductor_step_rows, model_peak_memory, model_step_rows, table,
                     time_side_by_side,
                     torch_lazy_model_steps, torch_lazy_note, training_step)

LAYERS, HEADS, WIDTH, CONTEXT, VOCAB, BATCH = 6, 6, 384, 256, 65, 8
LR = 1e-3
STEPS_CHECKED = 3


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT)).view(1, 1, CONTEXT, CONTEXT))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        scores = scores.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tokens.weight  # tied, as nanoGPT does
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * LAYERS))
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def models():
    torch.manual_seed(0)
    m = GPT()
    return m, copy.deepcopy(m)


def optimizer(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.99))


def data():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_fn(logits, targets):
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def infer_step_of(model):
    def infer_step(idx):
        with torch.no_grad():
            return model(idx)
    return infer_step


LABELS = {"train": "training step (AdamW)", "infer": "inference step (eval, no_grad)"}


def workload():
    """The training and inference steps as harness.ModelWorkload, for the child processes."""
    idx, targets = data()

    def make_model():
        torch.manual_seed(0)
        return GPT()
    return ModelWorkload(make_model, lambda m: training_step(m, optimizer(m), loss_fn), infer_step_of,
                         (idx, targets), (idx,))


def state(model, opt):
    out = {k: v.detach().numpy().copy() for k, v in model.state_dict().items() if v.dtype.is_floating_point}
    for i, p in enumerate(model.parameters()):
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and v.dtype.is_floating_point and v.dim() > 0:
                out[f"adamw.{i}.{k}"] = v.detach().numpy().copy()
    return out


DEVICE_TRACED = "lazyrt device: traced every step, lazyrt.torch.sync()"
DEVICE_REPLAYED = "lazyrt device: replayed (_run_cached_graph, AdamW capturable)"
XLA_TRACED = "torch_xla: traced every step, torch_xla.sync() (child process)"


def on_device(dev, capturable=False):
    """(model, optimizer) of the start state on a device. PyTorch/XLA unties the head from the
    embedding when the model moves (its users tie them again after the move); lazyrt keeps it."""
    model = models()[0].to(dev)
    if model.head.weight is not model.tokens.weight:
        model.head.weight = model.tokens.weight
    opt = optimizer(model)
    if capturable:
        for group in opt.param_groups:
            group["capturable"] = True
    return model, opt


def device_steps():
    """{name: one training step returning its loss} of the lazyrt device's two paths."""
    import lazyrt.torch as L
    dev = L.device()
    idx, targets = (t.to(dev) for t in data())
    model, opt = on_device(dev)
    traced = training_step(model, opt, loss_fn)

    def traced_step():
        loss = traced(idx, targets)
        L.sync()
        return loss
    model, opt = on_device(dev, capturable=True)
    return {DEVICE_TRACED: traced_step,
            DEVICE_REPLAYED: device_replay(training_step(model, opt, loss_fn), (idx, targets), model.parameters())}


def child_xla(reps):
    """In a child process (bench/suite.py --child gpt-xla REPS): the training step on torch_xla's
    device, torch_xla.sync() and wait_device_ops() every step. Prints the first losses (checked
    by the parent) and the seconds of each timed step."""
    import json
    import time
    import torch_xla
    import torch_xla.core.xla_model as xm
    dev = torch_xla.device()
    idx, targets = (t.to(dev) for t in data())
    model, opt = on_device(dev)
    step = training_step(model, opt, loss_fn)

    def one():
        loss = step(idx, targets)
        torch_xla.sync()
        xm.wait_device_ops()
        return loss
    losses = [float(one().cpu()) for _ in range(STEPS_CHECKED)]
    seconds = []
    for _ in range(reps):
        t = time.perf_counter()
        one()
        seconds.append(time.perf_counter() - t)
    print(json.dumps({"losses": losses, "seconds": seconds}))


def on_devices(opts, ref_losses, eager, args, reps):
    """(markdown, summary rows) of the training step on devices: the lazyrt device's paths and
    torch_xla's, each checked against eager's first losses, timed beside eager."""
    import sys
    from harness import Samples, check_close, ratio, run_child_or_why
    from peers import CHILD_TIMEOUT_S, install_failure, xla_env, xla_installed
    fns = device_steps()
    for name, fn in fns.items():
        check_close(f"GPT step, {name}: losses", [float(fn().item()) for _ in range(STEPS_CHECKED)], ref_losses,
                    rtol=1e-4, atol=1e-5)
    fns["PyTorch eager"] = lambda: eager(*args)
    ms = {n: s.scaled(1e3) for n, s in time_side_by_side(fns, 1, reps, warmup=1).items()}
    why = install_failure(sys.prefix) or "torch_xla is not installed (`make bench` installs it)"
    if xla_installed():
        out, why = run_child_or_why(opts, "gpt-xla", reps, env=xla_env(opts.threads), timeout=4 * CHILD_TIMEOUT_S)
        if out is not None:
            check_close(f"GPT step, {XLA_TRACED}: losses", out["losses"], ref_losses, rtol=1e-4, atol=1e-5)
            ms[XLA_TRACED] = Samples(out["seconds"]).scaled(1e3)
    rows = [(name, s.cell(), ratio(s.median / ms[DEVICE_TRACED].median)) for name, s in ms.items()]
    if XLA_TRACED not in ms:
        rows.append((XLA_TRACED, f"failed: {why}", "-"))
    md = ["### The training step on a device, PyTorch/XLA-style\n",
          f"The model moved to the device (head tied: re-tied on PyTorch/XLA), AdamW as above; each path's {STEPS_CHECKED} first losses "
          f"checked against eager's (rtol 1e-4) before timing; {reps} steps each after 1 warm-up (torch_xla: in its "
          "child, in a row).\n",
          table(["path", "ms per step, median [min, max]", "vs lazyrt device traced"], rows), ""]
    summary = []
    for peer in (XLA_TRACED, "PyTorch eager"):
        if peer in ms:
            for path in (DEVICE_TRACED, DEVICE_REPLAYED):
                summary.append((f"GPT ({LAYERS} layers, {WIDTH} wide), batch {BATCH}: training step on a device",
                                path, ms[path].cell(), "ms", peer, ms[peer].cell(),
                                ratio(ms[peer].median / ms[path].median)))
    return "\n".join(md), summary


def run(opts):
    import lazyrt.torch

    idx, targets = data()
    m_eager, m_lazy = models()
    o_eager, o_lazy = optimizer(m_eager), optimizer(m_lazy)
    eager = training_step(m_eager, o_eager, loss_fn)
    compiled = FirstCallTimed(lazyrt.torch.compile(training_step(m_lazy, o_lazy, loss_fn)))

    # Matrix products sum in other orders in each library: the losses agree to ~1e-6 relative.
    # AdamW moves every weight by about lr a step whatever its gradient's size, so where a
    # gradient is rounding noise the two runs may step apart: a weight may differ by up to
    # 2 lr per step (the hard bound checked), and all but a few per million agree to 1e-3
    # relative, 1e-4 absolute.
    ref_losses, ref, got = check_same_training("GPT step, lazyrt.torch.compile", eager, compiled, (idx, targets),
                                      lambda: state(m_eager, o_eager), lambda: state(m_lazy, o_lazy),
                                      STEPS_CHECKED, rtol=1e-3, atol=2 * LR * STEPS_CHECKED)
    for k in ref:
        far = np.abs(got[k] - ref[k]) > 1e-4 + 1e-3 * np.abs(ref[k])
        if far.mean() > 1e-5:
            raise BenchmarkError(f"GPT step: {k}: {int(far.sum())} of {far.size} values differ beyond rtol 1e-3, "
                                 "atol 1e-4")

    infer_eager, infer_lazy = compiled_inference("GPT inference", m_eager, m_lazy, infer_step_of, (idx,))

    m_eager.train()
    m_lazy.train()
    m_ind, train_ind, infer_ind = inductor_model_steps(
        workload(), "GPT step", lambda m: {k: v.detach().numpy().copy() for k, v in m.state_dict().items()},
        STEPS_CHECKED, rtol=1e-3, atol=2 * LR * STEPS_CHECKED)
    firsts = {("lazyrt", "train"): compiled.first_seconds, ("lazyrt", "infer"): infer_lazy.first_seconds,
              ("inductor", "train"): train_ind.first_seconds, ("inductor", "infer"): infer_ind.first_seconds}

    reps = 3 if opts.quick else 5
    for m in (m_eager, m_lazy, m_ind):
        m.eval()
    ms = {n: s.scaled(1e3) for n, s in time_side_by_side(
        {"infer lazyrt": lambda: infer_lazy(idx), "infer eager": lambda: infer_eager(idx),
         "infer inductor": lambda: infer_ind(idx)}, 1, reps, warmup=1).items()}
    for m in (m_eager, m_lazy, m_ind):
        m.train()
    ms.update({n: s.scaled(1e3) for n, s in time_side_by_side(
        {"train lazyrt": lambda: compiled(idx, targets), "train eager": lambda: eager(idx, targets),
         "train inductor": lambda: train_ind(idx, targets)}, 1, reps, warmup=1).items()})

    device_md, device_summary = on_devices(opts, ref_losses, eager, (idx, targets), reps)
    mem_steps = 2
    mem = model_peak_memory(opts, "gpt_step", mem_steps)
    lazy_reps = 2 if opts.quick else 3
    lazy_ms, lazy_why = torch_lazy_model_steps(opts, "gpt_step", STEPS_CHECKED, lazy_reps)
    rows, summary = model_step_rows(f"GPT ({LAYERS} layers, {WIDTH} wide, context {CONTEXT}), batch {BATCH},", LABELS,
                                    ms, mem, lazy_ms)
    ind_rows, ind_summary = inductor_step_rows(f"GPT ({LAYERS} layers, {WIDTH} wide, context {CONTEXT}), batch {BATCH},",
                                               LABELS, ms, mem, firsts)
    n_params = sum(p.numel() for p in m_lazy.parameters())
    md = [f"## GPT (nanoGPT's architecture), batch {BATCH} x {CONTEXT} tokens: unmodified PyTorch through "
          "lazyrt.torch.compile\n",
          f"{LAYERS} blocks, {HEADS} heads, {WIDTH} wide, context {CONTEXT}, vocabulary {VOCAB}, tied head "
          f"({n_params / 1e6:.2f}M parameters): masked softmax attention, exact GELU, LayerNorm, cross-entropy over "
          "every position, AdamW with weight decay on matrices only, written once in torch.nn and run by both "
          "peers from the same state_dict. The compiled step writes parameters and AdamW state back into the "
          f"torch tensors every call. Before timing: the losses of {STEPS_CHECKED} training steps (rtol 1e-4), "
          "every parameter and AdamW moment after them (all within 2 lr per step, AdamW's bound where a gradient "
          "is rounding noise; all but 1e-5 of them within rtol 1e-3, atol 1e-4) and the eval-mode logits (rtol "
          f"1e-3, atol 1e-4) are checked against eager's. {reps} steps per peer after 1 warm-up, alternating.\n",
          table(MODEL_STEP_HEADER, rows), "", MODEL_MEMORY_NOTE.format(steps=mem_steps), "",
          torch_lazy_note(lazy_why, STEPS_CHECKED, lazy_reps), "",
          table(INDUCTOR_STEP_HEADER, ind_rows), "", INDUCTOR_NOTE.format(steps=STEPS_CHECKED), "", device_md]
    return {"markdown": "\n".join(md), "summary": summary + ind_summary + device_summary}
