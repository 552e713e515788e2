"""The AdamW update alone, against PyTorch's two implementations and the memory bandwidth.

Workload: 10 f32 parameters of 1,000,000 elements each (10M in all), values uniform in [-1, 1)
and fixed gradients standard normal (numpy default_rng(2)), the same in every peer;
AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2).step(), nothing else: no
forward, no backward, no zero_grad (the gradients stay).

The bandwidth limit: a STREAM-style triad a[i] = b[i] + s * c[i] on f32 arrays of 2^25
elements (128 MiB each, far beyond any cache), through torch.add(b, c, alpha=s, out=a), one
pass. It moves 12 bytes per element (two reads, one write; as STREAM, the write's
read-for-ownership is not counted). AdamW must read parameter, gradient and both moments and
write parameter and both moments: 28 bytes per parameter, counted the same way; at the triad's
rate that is its least possible time.
"""

import numpy as np
import torch

import lazyrt as lr
from harness import BenchmarkError, Samples, check_close, ratio, table, time_side_by_side

TENSORS, NUMEL = 10, 1_000_000
BYTES_PER_PARAM = 7 * 4
TRIAD_NUMEL = 2 ** 25
STEPS_CHECKED = 3
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)


def values():
    rng = np.random.default_rng(2)
    params = [rng.uniform(-1, 1, NUMEL).astype(np.float32) for _ in range(TENSORS)]
    grads = [rng.standard_normal(NUMEL, dtype=np.float32) for _ in range(TENSORS)]
    return params, grads


def triad():
    """A function doing one triad pass, checked once."""
    b = torch.rand(TRIAD_NUMEL)
    c = torch.rand(TRIAD_NUMEL)
    a = torch.empty(TRIAD_NUMEL)
    s = 3.0
    torch.add(b, c, alpha=s, out=a)
    idx = torch.randint(0, TRIAD_NUMEL, (1000,))
    check_close("triad", a[idx].numpy(), (b[idx] + s * c[idx]).numpy(), rtol=1e-6, atol=1e-6)
    return lambda: torch.add(b, c, alpha=s, out=a)


def run(opts):
    params_np, grads_np = values()

    def lazyrt_peer():
        ps = [lr.tensor(p, requires_grad=True) for p in params_np]
        for p, g in zip(ps, grads_np):
            p.grad = lr.tensor(g)
        opt = lr.optim.AdamW(ps, **HYPER)
        lr.mark_step()
        return ps, opt

    def torch_peer(foreach):
        ps = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params_np]
        for p, g in zip(ps, grads_np):
            p.grad = torch.from_numpy(g.copy())
        return ps, torch.optim.AdamW(ps, foreach=foreach, **HYPER)

    ref_params, ref_opt = lazyrt_peer()
    for _ in range(STEPS_CHECKED):
        ref_opt.step()
        lr.mark_step()
    ref = np.concatenate([p.numpy() for p in ref_params])

    rp, ropt = lazyrt_peer()
    tp, topt = lazyrt_peer()  # before compiling: a new optimizer makes compiled steps retrace

    def replay_fn():
        ropt.step()
        return ropt.step_count
    replayed = lr.compile_step(replay_fn, ())

    def traced():
        topt.step()
        lr.mark_step()
    fp, fopt = torch_peer(True)
    lp, lopt = torch_peer(False)
    peers = {
        "lazyrt replayed (compile_step)": (lambda: replayed(), lambda: [p.numpy() for p in rp]),
        "lazyrt traced (mark_step every step)": (traced, lambda: [p.numpy() for p in tp]),
        "PyTorch AdamW(foreach=True)": (fopt.step, lambda: [p.detach().numpy() for p in fp]),
        "PyTorch AdamW(foreach=False), the for-loop": (lopt.step, lambda: [p.detach().numpy() for p in lp]),
    }
    for name, (fn, get) in peers.items():
        for _ in range(STEPS_CHECKED):
            fn()
        check_close(f"AdamW, {name}: parameters after {STEPS_CHECKED} steps", np.concatenate(get()), ref,
                    rtol=1e-5, atol=1e-6)

    reps = 3 if opts.quick else 9
    fns = {n: fn for n, (fn, _) in peers.items()}
    fns["triad"] = triad()  # in turn with the steps: the limit sees the same machine load
    ms = {name: s.scaled(1e3) for name, s in time_side_by_side(fns, 1, reps, warmup=2).items()}
    if replayed.traces != 1:
        raise BenchmarkError("AdamW: compile_step retraced")
    bandwidth = Samples(3 * 4 * TRIAD_NUMEL / (t * 1e-3) / 1e9 for t in ms.pop("triad").values)
    must_move = BYTES_PER_PARAM * TENSORS * NUMEL
    best_ms = must_move / (bandwidth.median * 1e9) * 1e3

    base = "lazyrt replayed (compile_step)"
    rows = [(name, s.cell(), ratio(s.median / ms[base].median), f"{must_move / (s.median * 1e-3) / 1e9:.1f}",
             f"{best_ms / s.median:.0%}") for name, s in ms.items()]
    md = ["## AdamW update alone: 10M parameters (10 tensors of 1M f32)\n",
          "Parameters uniform [-1, 1), fixed gradients standard normal (numpy `default_rng(2)`), the same in every "
          "peer; AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2).step() only. Every peer's "
          f"parameters after {STEPS_CHECKED} steps are checked against lazyrt's traced steps (rtol 1e-5, atol "
          f"1e-6) before timing. After 2 warm-up steps (not counted), {reps} single steps per peer, alternating.\n",
          table(["peer", "ms per step, median [min, max]", "vs lazyrt replayed", "effective GB/s",
                 "share of the bandwidth limit"], rows), "",
          f"Bandwidth limit: triad `a = b + s * c` over f32[2^25] arrays (`torch.add(b, c, alpha=s, out=a)`), "
          f"{reps} passes after 2 warm-up, in turn with the steps: {bandwidth.cell()} GB/s (12 bytes per element). AdamW must move "
          f"{BYTES_PER_PARAM} bytes per parameter = {must_move / 1e6:.0f} MB per step, hence at least "
          f"**{best_ms:.1f} ms** per step at the median triad rate. effective GB/s = {must_move / 1e6:.0f} MB / "
          "step time.\n"]
    summary = []
    for peer in ("PyTorch AdamW(foreach=True)", "PyTorch AdamW(foreach=False), the for-loop"):
        summary.append(("AdamW update, 10M params", "lazyrt replayed", ms[base].cell(), "ms", peer, ms[peer].cell(),
                        ratio(ms[peer].median / ms[base].median)))
    summary.append(("AdamW update: bandwidth limit", "lazyrt replayed", ms[base].cell(), "ms",
                    "28 bytes/param at the triad's GB/s", f"{best_ms:.1f}", ratio(best_ms / ms[base].median)))
    return {"markdown": "\n".join(md), "summary": summary}
