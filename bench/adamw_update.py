"""The AdamW update alone, against PyTorch's two implementations and the machine's limits.

Workload: 10 f32 parameters of 1,000,000 elements each (10M in all), values uniform in [-1, 1)
and fixed gradients standard normal (numpy default_rng(2)), the same in every peer;
AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2).step(), nothing else: no
forward, no backward, no zero_grad (the gradients stay).

The limits (bench/limits.c, gcc -O3 -march=native, one thread; bench/limits.py): the AdamW
update itself written once in C, torch's arithmetic in torch's order on the same 10 tensors
(read parameter, gradient and both moments, write parameter and both moments: 28 bytes per
parameter), checked against torch.optim.AdamW before timing; its time is the least a step can
take, and its time over a peer's is the share of the limit the peer reaches. STREAM's copy and
triad over f32[2^25] arrays (128 MiB each, beyond the last-level cache) give the machine's
plain bandwidth beside it. All three run in turn with the peers' steps, so they see the same
machine load.
"""

import glob
import os

import numpy as np
import torch

import lazyrt as lr
import limits
from harness import INDUCTOR, BenchmarkError, Samples, check_close, num, ratio, table, time_side_by_side, torch_compile

TENSORS, NUMEL = 10, 1_000_000
QUICK_NUMEL = 100_000  # --quick: a smoke run on 10 tensors of 100,000
BYTES_PER_PARAM = limits.ADAMW_BYTES
STEPS_CHECKED = 3
C_ADAMW = "AdamW's update in C (the limit)"
C_ADAMW_RATE = "AdamW's update"
INDUCTOR_STEP = f"{INDUCTOR}: torch.compile(opt.step)"
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)


def llc_bytes():
    """The last-level cache's size (Linux sysfs), or nan."""
    best = float("nan")
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(os.path.join(index, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        best = float(text.rstrip("KMG")) * scale
    return best


def values(numel):
    rng = np.random.default_rng(2)
    params = [rng.uniform(-1, 1, numel).astype(np.float32) for _ in range(TENSORS)]
    grads = [rng.standard_normal(numel, dtype=np.float32) for _ in range(TENSORS)]
    return params, grads


def run(opts):
    numel = QUICK_NUMEL if opts.quick else NUMEL
    params_np, grads_np = values(numel)

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
    # PyTorch's recipe for a compiled optimizer; not in --quick runs (a smoke test, where the
    # seed step's Inductor peer already runs harness.torch_compile and Inductor's compile of
    # this step would be most of the time).
    inductor = None
    if not opts.quick:
        ip, iopt = torch_peer(None)
        inductor = torch_compile(iopt.step)
    peers = {
        "lazyrt replayed (compile_step)": (lambda: replayed(), lambda: [p.numpy() for p in rp]),
        "lazyrt traced (mark_step every step)": (traced, lambda: [p.numpy() for p in tp]),
        "PyTorch AdamW(foreach=True)": (fopt.step, lambda: [p.detach().numpy() for p in fp]),
        "PyTorch AdamW(foreach=False), the for-loop": (lopt.step, lambda: [p.detach().numpy() for p in lp]),
    }
    if inductor is not None:
        peers[INDUCTOR_STEP] = (inductor, lambda: [p.detach().numpy() for p in ip])
    for name, (fn, get) in peers.items():
        for _ in range(STEPS_CHECKED):
            fn()
        check_close(f"AdamW, {name}: parameters after {STEPS_CHECKED} steps", np.concatenate(get()), ref,
                    rtol=1e-5, atol=1e-6)

    # The limits, checked before anything is timed.
    lib = limits.library(opts.build)
    c_adamw = limits.checked_adamw(lib, params_np, grads_np, HYPER, STEPS_CHECKED)
    stream = limits.Stream(lib, 2 ** 22 if opts.quick else limits.STREAM_NUMEL)

    reps = 3 if opts.quick else 9
    fns = {n: fn for n, (fn, _) in peers.items()}
    # In turn with the steps: the limits see the same machine load.
    fns[C_ADAMW] = c_adamw.step
    fns["copy"] = stream.copy
    fns["triad"] = stream.triad
    ms = {name: s.scaled(1e3) for name, s in time_side_by_side(fns, 1, reps, warmup=2).items()}
    if replayed.traces != 1:
        raise BenchmarkError("AdamW: compile_step retraced")
    must_move = BYTES_PER_PARAM * TENSORS * numel
    if c_adamw.bytes != must_move:
        raise BenchmarkError(f"AdamW: the C limit moves {c_adamw.bytes} bytes a step, not {must_move}")

    def gbps(nbytes, samples_ms):
        return Samples(nbytes / (t * 1e-3) / 1e9 for t in samples_ms.values)
    rates = {"copy": (gbps(stream.copy_bytes, ms.pop("copy")), limits.COPY_BYTES, "`a[i] = b[i]`"),
             "triad": (gbps(stream.triad_bytes, ms.pop("triad")), limits.TRIAD_BYTES, "`a[i] = b[i] + s * c[i]`")}
    limit_ms = ms[C_ADAMW]
    rates[C_ADAMW_RATE] = (gbps(must_move, limit_ms), BYTES_PER_PARAM,
                               f"torch's AdamW arithmetic over the {TENSORS} tensors")

    base = "lazyrt replayed (compile_step)"
    rows = [(name, s.cell(), ratio(s.median / ms[base].median), f"{must_move / (s.median * 1e-3) / 1e9:.1f}",
             f"{limit_ms.median / s.median:.0%}", f"{must_move / (s.median * 1e-3) / 1e9 / rates['triad'][0].median:.0%}")
            for name, s in ms.items()]
    size = f"{TENSORS * numel / 1e6:g}M params"
    md = [f"## AdamW update alone: {TENSORS * numel / 1e6:g}M parameters ({TENSORS} tensors of {numel / 1e6:g}M f32)\n",
          "Parameters uniform [-1, 1), fixed gradients standard normal (numpy `default_rng(2)`), the same in every "
          "peer; AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2).step() only. Every peer's "
          f"parameters after {STEPS_CHECKED} steps are checked against lazyrt's traced steps (rtol 1e-5, atol "
          f"1e-6), and the C limit's against `torch.optim.AdamW(foreach=False)` (parameters and second moments), "
          f"before timing. After 2 warm-up steps (not counted) and lazyrt's generated kernels compiled, {reps} single "
          "steps per peer and limit, alternating."
          + (f" {INDUCTOR_STEP}: PyTorch's recipe for a compiled optimizer, the step of `AdamW(...)` (foreach left "
             f"to PyTorch) through `torch.compile`; its first call (capture and compile) took "
             f"{inductor.first_seconds:.1f} s." if inductor is not None else "") + "\n",
          table(["peer", "ms per step, median [min, max]", "vs lazyrt replayed", "effective GB/s",
                 "share of the AdamW limit", "GB/s over the triad's"], rows), "",
          f"Limits: `{os.path.basename(lib.path)}` (bench/limits.c, gcc -O3 -march=native, one thread), each pass "
          f"timed in turn with the steps. The AdamW limit is torch's update (`_single_tensor_adamw`: the same f32 "
          f"operations in the same order) written once as one loop over each of the same {TENSORS} tensors: "
          f"{BYTES_PER_PARAM} bytes per parameter must move (read parameter, gradient, both moments; write "
          f"parameter and both moments), {must_move / 1e6:.0f} MB a step, so it takes at least "
          f"**{limit_ms.median:.1f} ms** (median) here. share of the AdamW limit = its time over the peer's (medians); "
          f"effective GB/s = {must_move / 1e6:.0f} MB / step time; GB/s over the triad's = effective GB/s over "
          f"STREAM's triad rate (AdamW's update, four streams read and three written, need not run at the "
          f"triad's rate). The step's state ({4 * must_move / 7 / 1e6:.0f} MB: parameters, gradients, moments) is "
          f"{4 * must_move / 7 / llc_bytes():.1f} times the last-level cache ({llc_bytes() / 2**20:.0f} MiB). "
          "Rates count the bytes the pattern must move, as STREAM does (not the "
          "read-for-ownership of written lines):\n",
          table(["pattern", "bytes per element", "GB/s, median [min, max]", "what it does"],
                [(name, nbytes, samples.cell(), what) for name, (samples, nbytes, what) in rates.items()], "lrrl"), "",
          f"copy and triad run over f32[{stream.numel}] arrays ({stream.numel * 4 // 2**20} MiB each).\n"]
    summary = []
    for peer in ("PyTorch AdamW(foreach=True)", "PyTorch AdamW(foreach=False), the for-loop", INDUCTOR_STEP):
        if peer not in ms:
            continue
        summary.append((f"AdamW update, {size}", "lazyrt replayed", ms[base].cell(), "ms", peer, ms[peer].cell(),
                        ratio(ms[peer].median / ms[base].median)))
    summary.append(("AdamW update: bandwidth limit", "lazyrt replayed", ms[base].cell(), "ms",
                    f"AdamW's update in C (28 bytes/param, {num(rates[C_ADAMW_RATE][0].median)} GB/s)",
                    limit_ms.cell(), ratio(limit_ms.median / ms[base].median)))
    return {"markdown": "\n".join(md), "summary": summary}
